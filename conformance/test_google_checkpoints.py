"""Checkpoints of Google's original BERT, saved by TensorFlow itself (``conformance/original_bert/
tf_checkpoints.py`` wrote them; this suite only reads them), and what transformers' own TensorFlow loader
computes from them.

bert_multi parses TensorFlow's tensor bundle without TensorFlow, and maps Google's names by transformers'
table, so a file read right computes, in the oracle, transformers' outputs to float64's rounding.
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, convert, inspect_checkpoint, load_checkpoint, load_weights
from bert_multi.backend.registry import load_backend
from bert_multi.engine.compare import compare_arrays, tolerance_for
from bert_multi.files.formats.tensorflow import TRAINING_STATE
from conftest import pretraining_outputs, runs_here

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
PRETRAINED, CLASSIFIER = HERE / "pretrained", HERE / "classifier"
with np.load(HERE / "expected.npz", allow_pickle=False) as archive:
    INPUTS = {name.removeprefix("inputs/"): archive[name] for name in archive.files if name.startswith("inputs/")}
    EXPECTED = {name.removeprefix("outputs/"): archive[name] for name in archive.files if name.startswith("outputs/")}
GOOGLE_CONFIG = json.loads((PRETRAINED / "bert_config.json").read_text())


def test_googles_checkpoint_computes_what_transformers_computes_from_it():
    checkpoint = load_checkpoint(PRETRAINED)
    config = checkpoint.config
    sizes = (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks)
    assert sizes == (13, 8, 12, 2, 2) and config.max_len == 16 and config.dropout == 0.1
    assert config.heads == ("pooler", "mlm", "nsp")
    semantics = config.semantics
    assert (semantics.activation, semantics.layer_norm_eps, semantics.mlm_decoder) == ("gelu", 1e-12, "tied")
    assert checkpoint.info.notes == ["read bert_model.ckpt and bert_config.json (TensorFlow's kernels transposed)"]
    weights = {name: array.astype(np.float64) for name, array in checkpoint.weights.items()}
    out = load_backend("numpy").build(config, weights, dtype="float64")(**INPUTS)
    tolerance = tolerance_for("float64", "cpu")
    for name, expected in EXPECTED.items():
        comparison = compare_arrays(name, getattr(out, name), expected, tolerance)
        assert comparison.passed, comparison.describe()


def test_inspect_names_googles_directory_and_the_config_it_records():
    described = inspect_checkpoint(PRETRAINED).describe()
    assert "Google's TensorFlow BERT directory" in described
    assert "config (recorded in the file): BERTConfig(vocab_size=13, num_hiddens=8" in described
    assert "46 tensors, 1,519 numbers" in described


def test_a_fine_tuned_directory_is_read_at_its_latest_checkpoint_without_its_training_state_or_head():
    """``run_classifier.py``'s output: two checkpoints with Adam's moments, global_step and a classifier."""
    checkpoint = load_checkpoint(CLASSIFIER)
    assert checkpoint.config.heads == ("pooler",)
    read, state, head = checkpoint.info.notes
    assert read.startswith("read model.ckpt-2 (the latest of 2 checkpoints, as its checkpoint file says)")
    assert state.startswith("left out 83 tensors of training state (Adam's moments, global_step): ")
    assert head.startswith("left out ['output_bias', 'output_weights'], a head fine-tuned for a task")
    # The classifier was saved from the pretrained encoder and pooler: the same numbers, not a moment's.
    pretrained = load_checkpoint(PRETRAINED).weights
    assert all(np.array_equal(array, pretrained[name]) for name, array in checkpoint.weights.items())


@pytest.mark.parametrize("named", ["model.ckpt-1", "model.ckpt-1.index"])
def test_a_checkpoint_is_read_by_its_prefix_as_tensorflow_names_it_or_by_its_index(named):
    checkpoint = load_checkpoint(CLASSIFIER / named)
    assert checkpoint.info.notes[0] == "read model.ckpt-1 and bert_config.json (TensorFlow's kernels transposed)"
    assert inspect_checkpoint(CLASSIFIER / named).format == "tf-dir"


def test_several_checkpoints_and_none_named_the_latest_is_refused(tmp_path):
    directory = tmp_path / "run"
    shutil.copytree(CLASSIFIER, directory)
    (directory / "checkpoint").unlink()
    with pytest.raises(WeightsError, match=r"holds 2 checkpoints \(\['model.ckpt-1', 'model.ckpt-2'\]\) and no "
                       "checkpoint file naming one of them as the latest"):  # fmt: skip
        load_checkpoint(directory)


@pytest.mark.parametrize("named", ["", "model.ckpt-2", "model.ckpt-2.index"])
def test_a_checkpoint_without_bert_config_json_says_where_its_sizes_are(tmp_path, named):
    """A training run's directory holds no bert_config.json: the model's it started from gives the sizes."""
    directory = tmp_path / "run"
    shutil.copytree(CLASSIFIER, directory)
    (directory / "bert_config.json").unlink()
    said = (
        "a TensorFlow checkpoint without bert_config.json beside it, which gives its sizes: copy in the "
        "bert_config.json of the model it was trained or fine-tuned from"
    )
    with pytest.raises(WeightsError, match=said):
        load_checkpoint(directory / named)


def test_a_directory_of_no_format_says_what_each_directory_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    google = r"Google's TensorFlow BERT directory \(bert_config.json \+ bert_model.ckpt.index and .data files\)"
    with pytest.raises(WeightsError, match=rf"is a directory, but none bert_multi reads, which are: .*{google}"):
        load_checkpoint(tmp_path)


def test_googles_checkpoint_converts_to_a_huggingface_directory_keeping_its_config(tmp_path):
    convert(PRETRAINED, tmp_path / "bert.npz")
    config, weights = load_weights(tmp_path / "bert.npz")
    assert config == load_checkpoint(PRETRAINED).config
    assert all(np.array_equal(weights[name], array) for name, array in load_checkpoint(PRETRAINED).weights.items())
    convert(PRETRAINED, tmp_path / "hf", framework="huggingface")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {key: written[key] for key in GOOGLE_CONFIG} == GOOGLE_CONFIG  # initializer_range, dropouts too
    assert load_checkpoint(tmp_path / "hf").config == config


@runs_here("transformers")
def test_the_huggingface_directory_converted_from_it_computes_what_transformers_read_from_tensorflow(tmp_path):
    import transformers

    convert(PRETRAINED, tmp_path / "hf", framework="huggingface")
    model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    computed = pretraining_outputs(model.double().eval(), INPUTS)
    tolerance = tolerance_for("float64", "cpu")
    for name, expected in EXPECTED.items():
        comparison = compare_arrays(name, computed[name], expected, tolerance)
        assert comparison.passed, comparison.describe()


@pytest.mark.parametrize(
    "name, state",
    [
        ("bert/encoder/layer_3/output/dense/kernel/AdamWeightDecayOptimizer", True),
        ("bert/encoder/layer_3/output/dense/kernel/AdamWeightDecayOptimizer_1", True),
        ("bert/pooler/dense/bias/Adam_1", True),
        ("beta1_power", True),
        ("global_step", True),
        ("bert/encoder/layer_3/output/dense/kernel", False),
        ("cls/predictions/output_bias", False),
    ],
)
def test_the_optimizer_slots_transformers_read_past_are_training_state_and_no_weight_is(name, state):
    # The names transformers' own TensorFlow loader skipped, as the optimizers of Google's scripts name them.
    assert bool(re.fullmatch(TRAINING_STATE, name)) == state


def test_a_bfloat16_tensor_reads_exactly_as_float32_and_says_it_was_bfloat16(tmp_path):
    # bfloat16 is the top half of a float32: numbers a bfloat16 holds exactly come back exactly.
    from bert_multi.files.formats.tensorflow import Entry, read_tensors

    values = np.array([[1.5, -2.0], [0.15625, 2.0**127]], np.float32)
    (tmp_path / "t.data-00000-of-00001").write_bytes(b"\0" * 3 + (values.view("<u4") >> 16).astype("<u2").tobytes())
    arrays, dtypes = read_tensors(tmp_path / "t", 1, {"w": Entry("bfloat16", (2, 2), 0, 3, 8)})
    assert dtypes == {"w": "bfloat16"} and arrays["w"].dtype == np.float32
    np.testing.assert_array_equal(arrays["w"], values)


def test_tensors_are_read_from_the_data_shard_their_entry_names(tmp_path):
    # A checkpoint saved from several devices has one data file per shard, named k-of-n.
    from bert_multi.files.formats.tensorflow import Entry, read_tensors

    for shard, value in enumerate((1.0, 2.0)):
        (tmp_path / f"t.data-0000{shard}-of-00002").write_bytes(np.full(3, value, "<f4").tobytes())
    entries = {"a": Entry("float32", (3,), 1, 0, 12), "b": Entry("float32", (3,), 0, 0, 12)}
    arrays, _ = read_tensors(tmp_path / "t", 2, entries)
    assert arrays["a"].tolist() == [2.0] * 3 and arrays["b"].tolist() == [1.0] * 3
