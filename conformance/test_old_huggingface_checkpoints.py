"""BERTs saved by HuggingFace's earlier software, in directories transformers 5 no longer reads: transformers
4's TensorFlow and Flax classes (``conformance/original_bert/hf_tf.py`` and ``hf_flax.py`` wrote them with
transformers 4.57), and pytorch-pretrained-bert, transformers' first name (``pytorch_pretrained_bert.py``
wrote it with its release 0.3.0); this suite only reads them. Each is held to what that software computed
from it: the TensorFlow or Flax model's own outputs in float32, and in float64 those of the PyTorch model
transformers' own TensorFlow-to-PyTorch or Flax-to-PyTorch loader builds from the same file, or
pytorch-pretrained-bert's own.

bert_multi reads them all, without TensorFlow, h5py or JAX, and converts them to a directory transformers
5 loads.
"""

import contextlib
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, convert, load_checkpoint
from bert_multi.backend.registry import load_backend
from bert_multi.engine.compare import compare_arrays, tolerance_for
from bert_multi.files.formats.flax import nested, pack_tree, read_tree
from conftest import pretraining_outputs, runs_here

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
PRETRAINING, UNTIED = HERE / "flax-pretraining", HERE / "flax-untied-bfloat16"
TF_PRETRAINING = HERE / "tf-pretraining"
SAVED = {}
for generator in ("flax", "tf", "pytorch-pretrained-bert"):
    with np.load(HERE / f"{generator}.npz", allow_pickle=False) as archive:
        SAVED[generator] = {name: archive[name] for name in archive.files}


def expected(generator: str, case: str) -> dict[str, np.ndarray]:
    """The arrays ``generator`` (``hf_flax.py``, ``hf_tf.py``) saved under ``case``: ``inputs``, a
    directory's outputs, the framework's own (``flax``, ``keras``) or transformers' PyTorch model's (``torch``)."""
    saved = SAVED[generator]
    return {name.removeprefix(f"{case}/"): array for name, array in saved.items() if name.startswith(f"{case}/")}


INPUTS = expected("flax", "inputs")


def assert_computes(config, weights, outputs: dict[str, np.ndarray], dtype: str) -> None:
    """The oracle, in float64 on ``weights``, computes ``outputs`` within ``dtype``'s tolerance."""
    weights = {name: array.astype(np.float64) for name, array in weights.items()}
    out = load_backend("numpy").build(config, weights, dtype="float64")(**INPUTS)
    assert outputs, "no outputs saved to compare with"
    for name, theirs in outputs.items():
        comparison = compare_arrays(name, getattr(out, name), theirs, tolerance_for(dtype, "cpu"))
        assert comparison.passed, comparison.describe()


def test_a_flax_bert_for_pretraining_computes_what_flax_and_its_pytorch_twin_compute():
    checkpoint = load_checkpoint(PRETRAINING)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.num_heads == 2 and config.heads == ("pooler", "mlm", "nsp")
    assert config.semantics.mlm_decoder == "tied"  # Flax saves no decoder where it is tied
    assert checkpoint.info.notes == ["read flax_model.msgpack and config.json (Flax's kernels transposed)"]
    assert set(expected("flax", "flax")) == set(expected("flax", "flax-pretraining")) == {"encoded", "mlm", "nsp"}
    assert_computes(config, checkpoint.weights, expected("flax", "flax-pretraining"), "float64")
    assert_computes(config, checkpoint.weights, expected("flax", "flax"), "float32")


def test_a_flax_bert_model_has_no_bert_level_and_only_the_pooler():
    checkpoint = load_checkpoint(HERE / "flax-model")
    assert checkpoint.config.heads == ("pooler",)
    assert_computes(checkpoint.config, checkpoint.weights, expected("flax", "flax-model"), "float64")
    pretrained = load_checkpoint(PRETRAINING).weights
    assert all(np.array_equal(array, pretrained[name]) for name, array in checkpoint.weights.items())


def test_a_flax_classifier_is_read_as_its_bert_without_its_head():
    checkpoint = load_checkpoint(HERE / "flax-classifier")
    assert checkpoint.config.heads == ("pooler",)
    assert checkpoint.info.notes[1].startswith(
        "left out ['classifier.bias', 'classifier.weight'], the task head of 'BertForSequenceClassification'"
    )
    pretrained = load_checkpoint(PRETRAINING).weights
    assert all(np.array_equal(array, pretrained[name]) for name, array in checkpoint.weights.items())


def test_a_bfloat16_flax_bert_with_its_own_decoder_reads_exactly_when_a_cast_is_asked():
    with pytest.raises(WeightsError, match="is bfloat16; bert_multi computes in float32 or float64, and casts"):
        load_checkpoint(UNTIED)
    checkpoint = load_checkpoint(UNTIED, dtype="float64")
    assert checkpoint.config.semantics.mlm_decoder == "own" and "mlm.mlp.3.weight" in checkpoint.weights
    # transformers widened the bfloat16 numbers to float32, exactly, as bert_multi does: float64 agrees.
    assert_computes(checkpoint.config, checkpoint.weights, expected("flax", "flax-untied-bfloat16"), "float64")


@runs_here("transformers")
@pytest.mark.parametrize("generator, case", [("flax", "flax-pretraining"), ("tf", "tf-pretraining")])
def test_converted_to_safetensors_it_loads_in_transformers_5_and_computes_the_same(tmp_path, generator, case):
    import transformers

    convert(HERE / case, tmp_path / "hf", framework="huggingface")
    model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    computed = pretraining_outputs(model.double().eval(), INPUTS)
    outputs = expected(generator, "flax-pretraining" if generator == "flax" else "torch")  # PyTorch's, in float64
    assert outputs.keys() == computed.keys()
    for name, theirs in outputs.items():
        comparison = compare_arrays(name, computed[name], theirs, tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["transformers_version"] == "4.57.6"  # the source's fields, kept


def test_a_directory_with_safetensors_beside_flax_reads_safetensors_as_transformers_does(tmp_path):
    convert(HERE / "flax-model", tmp_path / "converted", framework="huggingface")
    directory = tmp_path / "both"
    shutil.copytree(PRETRAINING, directory)
    shutil.copyfile(tmp_path / "converted" / "model.safetensors", directory / "model.safetensors")
    checkpoint = load_checkpoint(directory)
    assert checkpoint.info.notes[0] == "read model.safetensors and config.json"
    assert checkpoint.config.heads == ("pooler",)  # flax-model's, not flax_model.msgpack's three


def test_the_file_names_its_directory_and_out_of_it_reads_as_the_same_model(tmp_path):
    """In its directory, flax_model.msgpack names the directory. Out of it (copied alone, the params a Flax
    script saved with to_bytes, or a TrainState holding them beside Adam's moments), its names are read as
    transformers' PyTorch classes', with transformers' defaults for what config.json says, which this model has."""
    with pytest.raises(WeightsError, match="in the directory of their config: name the directory"):
        load_checkpoint(PRETRAINING / "flax_model.msgpack", num_heads=2)
    same = load_checkpoint(PRETRAINING)
    shutil.copyfile(PRETRAINING / "flax_model.msgpack", tmp_path / "params.msgpack")
    tree = nested(read_tree(PRETRAINING / "flax_model.msgpack")[0])
    zeros = nested(
        {name: np.zeros_like(array) for name, array in read_tree(PRETRAINING / "flax_model.msgpack")[0].items()}
    )
    (tmp_path / "checkpoint_3").write_bytes(
        pack_tree({"step": np.array(3), "params": tree, "opt_state": {"mu": zeros}})
    )
    for name in ("params.msgpack", "checkpoint_3"):
        checkpoint = load_checkpoint(tmp_path / name, num_heads=2)
        assert "read transformers' Flax names as its PyTorch classes'" in checkpoint.info.notes
        assert checkpoint.config == dataclasses.replace(same.config, dropout=checkpoint.config.dropout)
        assert checkpoint.weights.keys() == same.weights.keys()
        assert all(np.array_equal(array, same.weights[name]) for name, array in checkpoint.weights.items())
    assert_computes(checkpoint.config, checkpoint.weights, expected("flax", "flax-pretraining"), "float64")
    # Its tree flattened to paths (flax.traverse_util.flatten_dict's) and saved by np.savez, joined by "/", or by
    # safetensors' own writer, joined by "." (its safetensors.flax.save_file takes a flat dict so).
    flat = read_tree(PRETRAINING / "flax_model.msgpack")[0]
    np.savez(tmp_path / "params.npz", **{name.replace(".", "/"): array for name, array in flat.items()})
    names = ["params.npz"]
    with contextlib.suppress(ImportError):  # safetensors is in the first environment only
        from safetensors.numpy import save_file

        save_file(flat, str(tmp_path / "params.safetensors"))
        names.append("params.safetensors")
    for name in names:
        checkpoint = load_checkpoint(tmp_path / name, num_heads=2)
        assert "read the names as a Flax tree's paths (flatten_dict's)" in checkpoint.info.notes
        assert "read transformers' Flax names as its PyTorch classes'" in checkpoint.info.notes
        assert all(np.array_equal(array, same.weights[name]) for name, array in checkpoint.weights.items())
        assert checkpoint.weights.keys() == same.weights.keys()


def test_a_flax_tree_naming_one_tensor_twice_with_other_numbers_is_refused(tmp_path):
    shutil.copytree(HERE / "flax-model", tmp_path / "twice")
    kernel = np.eye(8, dtype=np.float32)
    tree = {"pooler": {"dense": {"kernel": kernel, "weight": 2 * kernel}}}
    (tmp_path / "twice" / "flax_model.msgpack").write_bytes(pack_tree(tree))
    with pytest.raises(WeightsError, match=r"'pooler.dense.kernel' and 'pooler.dense.weight' are both pooler.dense"):
        load_checkpoint(tmp_path / "twice")


# --- TensorFlow (Keras's HDF5 weights) ---------------------------------------------------------------------


def test_the_inputs_of_both_generators_are_the_same():
    assert INPUTS.keys() == expected("tf", "inputs").keys()
    assert all(np.array_equal(array, expected("tf", "inputs")[name]) for name, array in INPUTS.items())


def test_a_tf_bert_for_pretraining_computes_what_tensorflow_and_its_pytorch_twin_compute():
    checkpoint = load_checkpoint(TF_PRETRAINING)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.num_heads == 2 and config.heads == ("pooler", "mlm", "nsp")
    assert config.semantics.mlm_decoder == "tied"
    assert checkpoint.info.notes == ["read tf_model.h5 and config.json (TensorFlow's kernels transposed)"]
    assert set(expected("tf", "keras")) == set(expected("tf", "torch")) == {"encoded", "mlm", "nsp"}
    assert_computes(config, checkpoint.weights, expected("tf", "torch"), "float64")
    assert_computes(config, checkpoint.weights, expected("tf", "keras"), "float32")


def test_keras_saves_the_shared_embeddings_twice_and_they_are_read_once():
    from bert_multi.files.formats.hdf5 import read_hdf5

    datasets, _ = read_hdf5(TF_PRETRAINING / "tf_model.h5")
    word = [name for name in datasets if name.endswith("/bert/embeddings/word_embeddings/weight:0")]
    assert sorted(name.split("/")[0] for name in word) == ["bert", "mlm___cls"]
    assert np.array_equal(datasets[word[0]], datasets[word[1]])
    assert np.array_equal(load_checkpoint(TF_PRETRAINING).weights["encoder.token_embedding.weight"], datasets[word[0]])


def test_a_tf_classifier_is_read_as_its_bert_without_its_head():
    checkpoint = load_checkpoint(HERE / "tf-classifier")
    assert checkpoint.config.heads == ("pooler",) and checkpoint.config.num_blks == 1
    assert checkpoint.info.notes[1].startswith(
        "left out ['classifier.bias', 'classifier.weight'], the task head of 'BertForSequenceClassification'"
    )
    assert_computes(checkpoint.config, checkpoint.weights, expected("tf", "classifier"), "float64")


def test_the_h5_file_names_its_directory_and_out_of_it_reads_as_the_same_model(tmp_path):
    """In its directory, tf_model.h5 names the directory. Out of it (save_weights' file alone), its names are read
    as transformers' PyTorch classes', with transformers' defaults for what config.json says, which this model has;
    a Keras file of other names says where bert_multi reads it."""
    with pytest.raises(WeightsError, match="in the directory of their config: name the directory"):
        load_checkpoint(TF_PRETRAINING / "tf_model.h5", num_heads=2)
    same = load_checkpoint(TF_PRETRAINING)
    shutil.copyfile(TF_PRETRAINING / "tf_model.h5", tmp_path / "bert.h5")
    checkpoint = load_checkpoint(tmp_path / "bert.h5", num_heads=2)
    assert checkpoint.info.format == "keras-h5"
    assert checkpoint.config == dataclasses.replace(same.config, dropout=checkpoint.config.dropout)
    assert checkpoint.weights.keys() == same.weights.keys()
    assert all(np.array_equal(array, same.weights[name]) for name, array in checkpoint.weights.items())
    shutil.copyfile(HERE / "keras-hub-backbone" / "model.weights.h5", tmp_path / "backbone.h5")
    with pytest.raises(WeightsError, match=r"a KerasHub preset's model.weights.h5 in its directory\), its names no"):
        load_checkpoint(tmp_path / "backbone.h5", num_heads=2)


def test_a_shared_weight_saved_twice_with_other_numbers_is_refused(tmp_path):
    """Keras's two copies of the word embeddings, one of them changed in the file: which is meant?"""
    from bert_multi.files.formats.hdf5 import read_hdf5

    directory = tmp_path / "changed"
    shutil.copytree(TF_PRETRAINING, directory)
    data = bytearray((directory / "tf_model.h5").read_bytes())
    table = read_hdf5(directory / "tf_model.h5")[0][
        "mlm___cls/tf_bert_for_pre_training/bert/embeddings/word_embeddings/weight:0"
    ]
    at = bytes(data).find(table.astype("<f4").tobytes())
    assert at > 0 and bytes(data).count(table.astype("<f4").tobytes()) == 2
    data[at : at + 4] = np.float32(7.0).tobytes()
    (directory / "tf_model.h5").write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=r"are both bert.embeddings.word_embeddings.weight, with other numbers"):
        load_checkpoint(directory)


# --- model.safetensors written by the TensorFlow and Flax classes: their own names and kernels --------------


@pytest.mark.parametrize("framework, twin", [("tf", TF_PRETRAINING), ("flax", PRETRAINING)], ids=["tf", "flax"])
def test_a_safetensors_file_of_tensorflow_or_flax_names_reads_as_the_same_model(framework, twin):
    """``save_pretrained(safe_serialization=True)`` of the same model as ``twin``: its metadata says whose names
    (TensorFlow's without Keras's layer group and model scope; Flax's dotted tree) and (in, out) kernels."""
    from bert_multi.files.formats.safetensors import read_metadata

    directory = HERE / f"{framework}-safetensors"
    assert read_metadata(directory / "model.safetensors") == {"format": framework}
    checkpoint = load_checkpoint(directory)
    whose = {"tf": "TensorFlow", "flax": "Flax"}[framework]
    assert checkpoint.info.notes == [f"read model.safetensors and config.json ({whose}'s kernels transposed)"]
    assert checkpoint.config == load_checkpoint(twin).config
    same = load_checkpoint(twin).weights
    assert checkpoint.weights.keys() == same.keys()
    assert all(np.array_equal(array, same[name]) for name, array in checkpoint.weights.items())
    assert_computes(
        checkpoint.config,
        checkpoint.weights,
        expected(framework, "torch" if framework == "tf" else "flax-pretraining"),
        "float64",
    )


@pytest.mark.parametrize("framework, twin", [("tf", TF_PRETRAINING), ("flax", PRETRAINING)], ids=["tf", "flax"])
def test_such_a_safetensors_file_alone_reads_as_the_same_model_once_its_heads_are_stated(tmp_path, framework, twin):
    """Out of its directory, the metadata still says whose names; what only config.json says is transformers'
    defaults, which this model has. In its directory, the file names the directory instead."""
    (tmp_path / "bert.safetensors").write_bytes((HERE / f"{framework}-safetensors" / "model.safetensors").read_bytes())
    checkpoint = load_checkpoint(tmp_path / "bert.safetensors", num_heads=2)
    whose = {"tf": "TensorFlow", "flax": "Flax"}[framework]
    assert (
        checkpoint.info.notes[0]
        == f"read {whose}'s names as transformers' PyTorch classes' ({whose}'s kernels transposed)"
    )
    same = load_checkpoint(twin)
    assert checkpoint.config == dataclasses.replace(same.config, dropout=checkpoint.config.dropout)
    assert all(np.array_equal(array, same.weights[name]) for name, array in checkpoint.weights.items())
    assert checkpoint.weights.keys() == same.weights.keys()
    with pytest.raises(WeightsError, match="in the directory of their config: name the directory"):
        load_checkpoint(HERE / f"{framework}-safetensors" / "model.safetensors", num_heads=2)


# --- pytorch-pretrained-bert (2018): bert_config.json, torch.save's legacy format, gamma and beta -----------------


def test_a_pytorch_pretrained_bert_directory_computes_what_that_package_computed():
    checkpoint = load_checkpoint(HERE / "pytorch-pretrained-bert")
    assert checkpoint.info.notes == ["read pytorch_model.bin and bert_config.json"]
    config = checkpoint.config
    assert config.heads == ("pooler", "mlm", "nsp") and config.semantics.mlm_decoder == "tied"
    assert expected("pytorch-pretrained-bert", "inputs").keys() == INPUTS.keys()
    assert_computes(config, checkpoint.weights, expected("pytorch-pretrained-bert", "outputs"), "float64")


def test_its_layer_norms_are_named_gamma_and_beta_in_a_legacy_torch_file():
    """What makes the directory this release's: read past, not guessed at."""
    import torch

    from bert_multi.files.formats.torch_legacy import is_legacy

    path = HERE / "pytorch-pretrained-bert" / "pytorch_model.bin"
    assert is_legacy(path.read_bytes()[:8])
    names = torch.load(path, weights_only=True).keys()
    assert "bert.embeddings.LayerNorm.gamma" in names and not any(name.endswith("LayerNorm.weight") for name in names)
