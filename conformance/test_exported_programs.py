"""An ExportedProgram's archive as torch writes it: transformers' ``BertForPreTraining`` exported with
``torch.export`` and saved by ``torch.export.save`` (``conformance/original_bert/torch_export.py`` wrote it; this
suite only reads it, without torch). Its state_dict is read from the archive's table of weights and their
bytes, the graph never; from it, the float64 oracle computes what the exported program itself computed."""

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, load_checkpoint
from bert_multi.backend.registry import load_backend
from bert_multi.engine.compare import compare_arrays, tolerance_for

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
with np.load(HERE / "exported.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}


def test_an_exported_bert_computes_what_its_exported_program_computed():
    checkpoint = load_checkpoint(HERE / "exported.pt2", num_heads=2)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 1)
    assert config.heads == ("pooler", "mlm", "nsp")
    assert checkpoint.info.format == "pt2"
    assert checkpoint.info.notes[0] == "read the ExportedProgram's state_dict, not its graph"
    inputs = {name.removeprefix("inputs/"): array for name, array in SAVED.items() if name.startswith("inputs/")}
    out = load_backend("numpy").build(config, checkpoint.weights, dtype="float64")(**inputs)
    for name in ("encoded", "mlm", "nsp"):
        comparison = compare_arrays(
            name, getattr(out, name), SAVED[f"exported/{name}"], tolerance_for("float64", "cpu")
        )
        assert comparison.passed, comparison.describe()


def test_the_tied_decoder_is_one_storage_in_the_archive_and_the_word_embeddings_in_the_model():
    """torch.export.save writes a storage once for every name that views it: the decoder's weight and the word
    embeddings name one file, which bert_multi reads as the original BERT's tie (the decoder no tensor of its
    own), as from the state_dict torch.save writes."""
    with zipfile.ZipFile(HERE / "exported.pt2") as archive:
        table = json.loads(archive.read("exported/data/weights/model_weights_config.json"))["config"]
    files = {name: entry["path_name"] for name, entry in table.items()}
    assert files["cls.predictions.decoder.weight"] == files["bert.embeddings.word_embeddings.weight"]
    checkpoint = load_checkpoint(HERE / "exported.pt2", num_heads=2)
    assert checkpoint.config.semantics.mlm_decoder == "tied" and "mlm.mlp.3.weight" not in checkpoint.weights


# What torch 2.13's aoti_compile_and_package wrote for d2l's BERTModel (the torch backend's module), its member
# names as they were and their bytes left out: compiling it takes 25 s here, too long for the suite.
AOTI_PACKAGE = [
    *(f"bert/data/aotinductor/model/cjpw2feecpm7i73kult7vasuic6goixcx7owmlapxvmhescnm6at.{part}"
      for part in ("wrapper.cpp", "wrapper_metadata.json", "wrapper.so")),
    *(f"bert/data/aotinductor/model/ck5oyxxlijzbfb6pvvkz6wxiiheqejpe24eiqv3yqyy2ey5njt27.{part}"
      for part in ("kernel.cpp", "kernel_metadata.json")),
    *(f"bert/{part}" for part in ("archive_format", "archive_version", ".data/version", "byteorder",
                                  ".data/serialization_id")),
]  # fmt: skip


def test_an_aotinductor_package_is_named_with_what_to_save_instead(tmp_path):
    """An AOTInductor package is a .pt2 too, of compiled code with the weights inside its shared library: it is
    named, with torch's lines that save what bert_multi reads, not taken for an ExportedProgram's archive."""
    with zipfile.ZipFile(tmp_path / "bert.pt2", "w") as archive:
        for name in AOTI_PACKAGE:
            archive.writestr(name, b"pt2" if name.endswith("archive_format") else b"")
    with pytest.raises(
        WeightsError, match=re.escape("an AOTInductor package (torch._inductor.aoti_compile_and_package")
    ) as caught:
        load_checkpoint(tmp_path / "bert.pt2", num_heads=2)
    assert "torch.save(model.state_dict(), 'bert.pt')" in str(caught.value)
    assert "torch.export.save(torch.export.export(model, args), 'bert.pt2')" in str(caught.value)
