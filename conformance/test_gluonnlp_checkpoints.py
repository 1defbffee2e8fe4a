"""A BERT saved by GluonNLP's own ``BERTModel``, as its model zoo's BERTs were (``conformance/original_bert/
gluonnlp_bert.py`` wrote it with GluonNLP 0.10.0; this suite only reads it), and what GluonNLP computed
with it.

bert_multi reads GluonNLP's names as the original BERT: the oracle on them computes GluonNLP's outputs
within float32's tolerance (GluonNLP's fused attention computes in float32 only), except where GluonNLP
departs from the original BERT: it zeroes the encoding past each sequence's valid length.
"""

from pathlib import Path

import numpy as np
import pytest

from bert_multi import inspect_checkpoint, load_checkpoint
from bert_multi.backend.registry import load_backend
from bert_multi.engine.compare import compare_arrays, tolerance_for
from bert_multi.errors import StatementsMissing, WeightsError

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
PARAMS = HERE / "gluonnlp-bert.params"
with np.load(HERE / "gluonnlp-bert.npz", allow_pickle=False) as archive:
    INPUTS = {name.removeprefix("inputs/"): archive[name] for name in archive.files if name.startswith("inputs/")}
    GLUONNLP = {name.removeprefix("outputs/"): archive[name] for name in archive.files if name.startswith("outputs/")}
PRETRAINING = ("encoded", "pooled", "nsp", "mlm")


def test_gluonnlps_bert_is_the_original_bert_under_its_own_names():
    checkpoint = load_checkpoint(PARAMS, num_heads=2, preset="bert")
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.heads == ("pooler", "mlm", "nsp") and config.semantics.mlm_decoder == "tied"
    assert checkpoint.info.notes[0].startswith("GluonNLP's BERTModel names, read as the original BERT")
    weights = {name: array.astype(np.float64) for name, array in checkpoint.weights.items()}
    out = load_backend("numpy").build(config, weights, dtype="float64")(**INPUTS, intermediates=True)
    tolerance = tolerance_for("float32", "cpu")
    valid = np.arange(INPUTS["tokens"].shape[1])[None, :] < INPUTS["valid_lens"][:, None]
    ours = {"encoded": out.encoded[valid], "pooled": out.intermediates["pooler"], "nsp": out.nsp, "mlm": out.mlm}
    theirs = {**{name: GLUONNLP[name] for name in PRETRAINING}, "encoded": GLUONNLP["encoded"][valid]}
    for name, expected in theirs.items():
        comparison = compare_arrays(name, ours[name], expected, tolerance)
        assert comparison.passed, comparison.describe()
    # Past the valid length, GluonNLP's encoding is zeros; the original BERT's is not.
    assert not GLUONNLP["encoded"][~valid].any() and np.abs(out.encoded[~valid]).min() > 0


def test_a_gluonnlp_classifier_is_read_as_its_bert_without_its_head():
    """What GluonNLP's fine-tuning scripts save: a BERTClassifier holding a BERTModel as ``bert``."""
    checkpoint = load_checkpoint(HERE / "gluonnlp-classifier.params", num_heads=2, preset="bert")
    assert checkpoint.config.heads == ("pooler",)
    assert checkpoint.info.notes[1] == (
        "left out ['classifier.1.bias', 'classifier.1.weight'], the head of GluonNLP's BERTClassifier: not part of "
        "BERT (bert_multi computes the encoder and the pretraining heads), so neither compared nor converted"
    )
    weights = {name: array.astype(np.float64) for name, array in checkpoint.weights.items()}
    out = load_backend("numpy").build(checkpoint.config, weights, dtype="float64")(
        INPUTS["tokens"], INPUTS["segments"], INPUTS["valid_lens"], intermediates=True
    )
    valid = np.arange(INPUTS["tokens"].shape[1])[None, :] < INPUTS["valid_lens"][:, None]
    tolerance = tolerance_for("float32", "cpu")
    for name, ours, theirs in [
        ("encoded", out.encoded[valid], GLUONNLP["classifier/encoded"][valid]),
        ("pooled", out.intermediates["pooler"], GLUONNLP["classifier/pooled"]),
    ]:
        comparison = compare_arrays(name, ours, theirs, tolerance)
        assert comparison.passed, comparison.describe()


def test_mxnets_own_loader_reads_gluonnlps_files_as_gluon_files():
    stated = {"num_heads": 2, "preset": "bert"}
    assert load_checkpoint(PARAMS, framework="mxnet", **stated).config == load_checkpoint(PARAMS, **stated).config
    refused = "this is a Gluon parameter file .save_parameters., written by MXNet.Gluon, not a PyTorch checkpoint"
    with pytest.raises(WeightsError, match=refused):
        load_checkpoint(PARAMS, framework="torch", **stated)


def test_inspect_says_what_a_gluonnlp_file_cannot_tell():
    info = inspect_checkpoint(PARAMS)
    assert info.presets == ("bert",) and info.heads == ("pooler", "mlm", "nsp")
    with pytest.raises(StatementsMissing, match="num_heads"):
        load_checkpoint(PARAMS, preset="bert")
