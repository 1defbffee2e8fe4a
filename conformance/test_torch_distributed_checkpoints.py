"""A PyTorch distributed checkpoint (``torch.distributed.checkpoint``, as FSDP and accelerate's sharded state
save one), written here by torch's own ``dcp.save`` of transformers' ``BertForPreTraining``: bert_multi does
not read it (its plan is a pickle of torch's classes) and names it, with torch's lines that write it as one
``torch.save`` file; those lines, run as given, write a file that reads to the model's very weights."""

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
