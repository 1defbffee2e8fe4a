"""What PyTorch saves besides a state_dict, written here by torch's own code: a distributed checkpoint
(``torch.distributed.checkpoint``, as FSDP and accelerate's sharded state save one) of transformers' BERT, which
bert_multi does not read (its plan is a pickle of torch's classes), and an ExportedProgram's archive
(``torch.export.save``) of d2l's, which it reads (``conformance/test_exported_programs.py`` holds one saved by
transformers' BERT to what the exported program computes). What it does not read it names, with torch's lines
that save its state_dict as one ``torch.save`` file; those lines, run as given, write a file that reads to the
model's very weights."""

import re
import warnings
import zipfile

import numpy as np
import pytest

from bert_multi import WeightsError, load_checkpoint
from conftest import runs_here

pytestmark = runs_here("torch")


def test_a_distributed_checkpoint_is_named_with_torchs_lines_that_make_it_one_file(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers is the independent reference")
    import torch
    import torch.distributed.checkpoint as dcp

    config = transformers.BertConfig(vocab_size=13, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=12, max_position_embeddings=16)  # fmt: skip
    model = transformers.BertForPreTraining(config)
    with warnings.catch_warnings():  # one process: torch says it assumes so
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "run")
    said = "is a PyTorch distributed checkpoint (torch.distributed.checkpoint: FSDP's"
    for path in (tmp_path / "run", tmp_path / "run" / ".metadata", tmp_path / "run" / "__0_0.distcp"):
        with pytest.raises(WeightsError, match=re.escape(f"{tmp_path / 'run'}: {said}")) as caught:
            load_checkpoint(path, num_heads=2)
    with pytest.raises(WeightsError, match=r"holds PyTorch distributed checkpoints, \['run/'\]"):
        load_checkpoint(tmp_path, num_heads=2)

    monkeypatch.chdir(tmp_path)  # the lines, run as given, imports included, write bert.pt here
    exec(str(caught.value).split("the key the run saved it with): ", 1)[1], {})
    torch.save(model.state_dict(), tmp_path / "direct.pt")
    read = load_checkpoint(tmp_path / "bert.pt", key="model", num_heads=2)
    direct = load_checkpoint(tmp_path / "direct.pt", num_heads=2)
    assert read.config == direct.config and read.weights.keys() == direct.weights.keys()
    for name, array in direct.weights.items():
        np.testing.assert_array_equal(read.weights[name], array, err_msg=name)


def export_d2l(directory, seed, num_blks, dtype=None):
    """d2l's BERTModel (the torch backend's module, d2l's names and module order), exported and saved by torch as
    ``directory/bert.pt2``, its state_dict by torch.save as ``directory/direct.pt``."""
    import torch

    import bert_multi.torch.backend as bt
    from bert_multi import BERTConfig, random_weights

    config = BERTConfig(vocab_size=13, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=num_blks, max_len=16)
    model = bt.build(config, random_weights(config, seed=seed)).module.eval().to(dtype)
    inputs = (torch.ones(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long), torch.tensor([5.0, 3.0]))
    with warnings.catch_warnings():  # d2l keeps its attention weights as an attribute, which torch warns of
        warnings.simplefilter("ignore", UserWarning)
        torch.export.save(torch.export.export(model, inputs), directory / "bert.pt2")
    torch.save(model.state_dict(), directory / "direct.pt")


def test_an_exported_program_of_d2ls_model_reads_as_its_state_dict_and_an_older_archive_is_named(tmp_path, monkeypatch):
    """d2l's BERTModel (the torch backend's module, d2l's names and module order), exported and saved by torch: its
    archive reads to the weights its state_dict holds. Without torch.export's table of its weights (an older torch
    pickled them) it is named, with torch's line that saves its state_dict, which reads to the same weights."""
    export_d2l(tmp_path, seed=4, num_blks=2)
    read, direct = (load_checkpoint(tmp_path / name, num_heads=2, preset="d2l") for name in ("bert.pt2", "direct.pt"))
    assert read.info.format == "pt2" and read.info.notes[0] == "read the ExportedProgram's state_dict, not its graph"
    assert read.config == direct.config and read.weights.keys() == direct.weights.keys()
    for name, array in direct.weights.items():
        np.testing.assert_array_equal(read.weights[name], array, err_msg=name)

    with zipfile.ZipFile(tmp_path / "bert.pt2") as archive, zipfile.ZipFile(tmp_path / "older.pt2", "w") as older:
        for member in archive.infolist():
            if not member.filename.endswith("_weights_config.json"):
                older.writestr(member, archive.read(member))
    with pytest.raises(
        WeightsError, match=re.escape("ExportedProgram's archive (torch.export.save, .pt2) without")
    ) as caught:
        load_checkpoint(tmp_path / "older.pt2", num_heads=2)
    line = str(caught.value).split("which bert_multi reads: ", 1)[1]
    monkeypatch.chdir(tmp_path)  # the line, run as given on an archive torch loads, writes bert.pt here
    exec("import torch; " + line.replace(str(tmp_path / "older.pt2"), str(tmp_path / "bert.pt2")), {})
    saved = load_checkpoint(tmp_path / "bert.pt", num_heads=2, preset="d2l")
    for name, array in direct.weights.items():
        np.testing.assert_array_equal(saved.weights[name], array, err_msg=name)


def test_an_exported_program_in_bfloat16_reads_as_its_state_dict_cast_to_float32(tmp_path):
    """torch saves bfloat16 as its raw bits (NumPy has no bfloat16): read, they widen exactly to what the
    state_dict saved by torch.save reads to, once the cast is asked for."""
    import torch

    export_d2l(tmp_path, seed=5, num_blks=1, dtype=torch.bfloat16)
    with pytest.raises(WeightsError, match="bfloat16"):
        load_checkpoint(tmp_path / "bert.pt2", num_heads=2, preset="d2l")
    read, direct = (
        load_checkpoint(tmp_path / name, num_heads=2, preset="d2l", dtype="float32")
        for name in ("bert.pt2", "direct.pt")
    )
    assert {tensor.dtype for tensor in read.info.tensors} == {"bfloat16"}
    assert read.weights.keys() == direct.weights.keys()
    for name, array in direct.weights.items():
        np.testing.assert_array_equal(read.weights[name], array, err_msg=name)
