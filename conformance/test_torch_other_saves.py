"""What PyTorch saves besides a state_dict, written here by torch's own code from transformers' BERTs: a
distributed checkpoint (``torch.distributed.checkpoint``, as FSDP and accelerate's sharded state save one) and
an ExportedProgram's archive (``torch.export.save``). bert_multi reads neither (a distributed checkpoint's plan
is a pickle of torch's classes; an archive is a traced graph) and names each, with torch's lines that save its
state_dict as one ``torch.save`` file; those lines, run as given, write a file that reads to the model's very
weights."""

import re
import warnings

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


def test_an_exported_programs_archive_is_named_with_torchs_line_that_saves_its_state_dict(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers is the independent reference")
    import torch

    config = transformers.BertConfig(vocab_size=13, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=12, max_position_embeddings=16)  # fmt: skip
    model = transformers.BertModel(config).eval()
    torch.export.save(torch.export.export(model, (torch.ones(1, 5, dtype=torch.long),)), tmp_path / "bert.pt2")
    with pytest.raises(
        WeightsError, match=re.escape("an ExportedProgram's archive (torch.export.save, .pt2)")
    ) as caught:
        load_checkpoint(tmp_path / "bert.pt2", num_heads=2)
    monkeypatch.chdir(tmp_path)  # the line, run as given, writes bert.pt here
    exec("import torch; " + str(caught.value).split("which bert_multi reads: ", 1)[1], {})
    torch.save(model.state_dict(), tmp_path / "direct.pt")
    read, direct = (load_checkpoint(tmp_path / name, num_heads=2) for name in ("bert.pt", "direct.pt"))
    assert read.config == direct.config and read.weights.keys() == direct.weights.keys()
    for name, array in direct.weights.items():
        np.testing.assert_array_equal(read.weights[name], array, err_msg=name)
