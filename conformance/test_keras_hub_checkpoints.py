"""BERTs saved by KerasHub as its presets (``conformance/original_bert/keras_hub_bert.py`` wrote them with
KerasHub 0.32 and Keras 3.15); this suite only reads them. The backbone is held to what transformers
computes in float64 from the model KerasHub's own converter turned into it, and to what KerasHub itself
computes (in float32: Keras computes LayerNorms in float32 whatever the model's dtype).

bert_multi reads them without Keras, h5py or TensorFlow, and converts them to a directory transformers loads.
"""

import dataclasses
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, convert, inspect_checkpoint, load_checkpoint
from conftest import encoder_outputs, runs_here, saved_mismatches

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
BACKBONE = HERE / "keras-hub-backbone"
with np.load(HERE / "keras-hub.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}
INPUTS = {name.removeprefix("inputs/"): array for name, array in SAVED.items() if name.startswith("inputs/")}


def outputs(config, weights) -> dict[str, np.ndarray]:
    return encoder_outputs(config, weights, INPUTS)


def mismatches(computed: dict[str, np.ndarray], whose: str, dtype: str) -> list[str]:
    """What of ``computed`` differs from the outputs saved under ``whose`` beyond ``dtype``'s tolerance."""
    return saved_mismatches(SAVED, computed, whose, dtype)


def test_a_keras_hub_backbone_computes_what_transformers_and_keras_hub_compute():
    checkpoint = load_checkpoint(BACKBONE)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.num_heads == 2 and config.heads == ("pooler",) and config.max_len == 16
    assert config.semantics.activation == "gelu_tanh" and config.semantics.layer_norm_eps == 1e-12
    assert checkpoint.info.notes == [
        "read model.weights.h5 and config.json (KerasHub's BertBackbone; Keras's kernels transposed, its "
        "attention's heads folded)"
    ]
    computed = outputs(config, checkpoint.weights)
    assert mismatches(computed, "transformers", "float64") == []
    assert mismatches(computed, "keras", "float32") == []


@pytest.mark.parametrize("change", [{"activation": "gelu"}, {"layer_norm_eps": 1e-5}], ids=["erf GELU", "eps 1e-5"])
def test_the_float64_reference_tells_each_difference_of_semantics(change):
    """What keeps the first test from passing on the wrong model: transformers' float64 outputs are precise
    enough to tell GELU's forms and LayerNorm's eps apart (Keras's own, in float32, are not)."""
    checkpoint = load_checkpoint(BACKBONE)
    semantics = dataclasses.replace(checkpoint.config.semantics, **change)
    computed = outputs(dataclasses.replace(checkpoint.config, semantics=semantics), checkpoint.weights)
    assert mismatches(computed, "transformers", "float64") != []


def test_the_attention_heads_are_folded_as_keras_splits_them():
    """Keras's query kernel is (hidden, heads, head size): head h is columns h * size ... of the weight's
    transpose, as d2l's transpose_qkv splits them. A kernel folded the other way (size, heads) fails."""
    from bert_multi.files.formats.hdf5 import read_hdf5

    kernel = read_hdf5(BACKBONE / "model.weights.h5")[0][
        "layers/transformer_encoder/_self_attention_layer/query_dense/vars/0"
    ]
    assert kernel.shape == (8, 2, 4)
    weight = load_checkpoint(BACKBONE).weights["encoder.blks.0.attention.W_q.weight"]
    assert np.array_equal(weight[4:8], kernel[:, 1, :].T)  # the second head's four outputs


def test_a_masked_lm_preset_is_read_as_its_backbone_its_head_left_out_and_why():
    checkpoint = load_checkpoint(HERE / "keras-hub-masked-lm")
    assert checkpoint.config.heads == ("pooler",) and checkpoint.config.num_blks == 1
    assert checkpoint.info.notes[1].startswith("left out the MLM head of KerasHub's 'BertMaskedLM' (task.weights.h5)")
    assert "GELU's erf form and LayerNorm eps 1e-5" in checkpoint.info.notes[1]
    assert {tensor.dtype for tensor in checkpoint.info.tensors} == {"float64"}  # a backbone of dtype="float64"
    computed = outputs(checkpoint.config, checkpoint.weights)
    assert mismatches({"encoded": computed["encoded"]}, "masked-lm", "float32") == []


def test_a_classifier_preset_is_read_as_its_backbone_without_its_head():
    checkpoint = load_checkpoint(HERE / "keras-hub-classifier")
    assert checkpoint.config.heads == ("pooler",)
    assert checkpoint.info.notes[1] == (
        "left out ['task.weights.h5'], the head of KerasHub's 'BertTextClassifier': not part of BERT (bert_multi "
        "computes the encoder and the pretraining heads), so neither compared nor converted"
    )


def test_inspect_names_the_preset_and_what_it_computes():
    described = inspect_checkpoint(BACKBONE).describe()
    assert described.splitlines()[0].endswith(
        "KerasHub BERT preset (config.json + model.weights.h5, as save_to_preset writes it)"
    )
    assert "with activation='gelu_tanh'" in described


@runs_here("transformers")
def test_converted_it_loads_in_transformers_and_computes_the_same(tmp_path):
    import torch
    import transformers

    convert(BACKBONE, tmp_path / "hf", framework="huggingface")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["hidden_act"] == "gelu_pytorch_tanh" and written["hidden_dropout_prob"] == 0.1
    model = transformers.BertModel.from_pretrained(tmp_path / "hf", attn_implementation="eager").double().eval()
    mask = (np.arange(INPUTS["tokens"].shape[1]) < INPUTS["valid_lens"][:, None]).astype(np.int64)
    with torch.no_grad():
        out = model(torch.from_numpy(INPUTS["tokens"]), attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.from_numpy(INPUTS["segments"]))  # fmt: skip
    computed = {"encoded": out.last_hidden_state.numpy(), "pooled": out.pooler_output.numpy()}
    assert mismatches(computed, "transformers", "float64") == []


# --- What is refused, before any tensor is read where the config tells ------------------------------------------


def edited_config(tmp_path: Path, **changes) -> Path:
    """A copy of the backbone preset whose config.json has ``changes`` (``class_name``, or arguments)."""
    directory = tmp_path / "preset"
    shutil.copytree(BACKBONE, directory)
    saved = json.loads((directory / "config.json").read_text())
    if "class_name" in changes:
        saved["class_name"] = changes.pop("class_name")
    saved["config"].update(changes)
    (directory / "config.json").write_text(json.dumps(saved))
    return directory


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"class_name": "RobertaBackbone"},
            "its class_name is 'RobertaBackbone'; bert_multi reads KerasHub's BertBackbone",
        ),
        ({"num_segments": 3}, "num_segments is 3; bert_multi computes BERT with 2 segments"),
        (
            {"num_heads": 4},
            r"'layers/transformer_encoder/_self_attention_layer/\w+_dense/vars/[01]' "
            r"\(encoder.blks.0.attention.W_\w.\w+\): it holds 2 heads, where config.json's num_heads is 4",
        ),
        ({"hidden_dim": 8.0}, "hidden_dim is 8.0, not a whole number"),
        ({"dropout": 1.5}, r"dropout is 1.5; expected a number in \[0, 1\)"),
        ({"num_layers": 3}, r"it holds the blocks \[0, 1\], where its config's num_layers is 3"),
    ],
    ids=["another model", "3 segments", "other heads", "a float size", "dropout", "a block missing"],
)
def test_a_config_that_is_not_this_bert_is_refused_saying_what(tmp_path, changes, message):
    with pytest.raises(WeightsError, match=message):
        load_checkpoint(edited_config(tmp_path, **changes))


def test_a_weight_of_no_layer_it_knows_is_refused_by_its_path(tmp_path):
    directory = tmp_path / "preset"
    shutil.copytree(BACKBONE, directory)
    data = (directory / "model.weights.h5").read_bytes()
    assert data.count(b"reversible_embedding\0") == 1  # the layer's name in its group's heap
    (directory / "model.weights.h5").write_bytes(data.replace(b"reversible_embedding\0", b"reversible_embeddinX\0"))
    with pytest.raises(
        WeightsError,
        match=r"weights of no BertBackbone layer bert_multi knows: \['layers/reversible_embeddinX/vars/0'\]",
    ):
        load_checkpoint(directory)


def test_the_weights_file_alone_says_it_is_read_in_its_directory():
    with pytest.raises(WeightsError, match="a KerasHub preset's model.weights.h5 in its directory"):
        load_checkpoint(BACKBONE / "model.weights.h5", num_heads=2)


def test_a_preset_saved_in_shards_is_refused_by_name(tmp_path):
    directory = tmp_path / "sharded"
    directory.mkdir()
    shutil.copyfile(BACKBONE / "config.json", directory / "config.json")
    (directory / "model.weights.json").write_text("{}")
    with pytest.raises(WeightsError, match=r"a preset saved in shards \(model.weights.json\)"):
        load_checkpoint(directory)


# --- .keras files (model.save): one zip of the config and the weights --------------------------------------------


def test_a_task_saved_as_a_keras_file_is_read_as_its_backbone(tmp_path):
    """model.save of the BertMaskedLM whose preset is keras-hub-masked-lm/: its backbone is a layer of the task,
    beside the head and the optimizer's integer scalars (which bert_multi's HDF5 reader refuses, and never
    reads)."""
    from bert_multi.files.formats.hdf5 import read_hdf5

    path = HERE / "keras-hub-masked-lm.keras"
    checkpoint = load_checkpoint(path)
    assert checkpoint.info.format == "keras-file"
    assert checkpoint.info.notes[1].startswith(
        "left out the MLM head of KerasHub's 'BertMaskedLM' (model.weights.h5, beside its backbone)"
    )
    preset = load_checkpoint(HERE / "keras-hub-masked-lm")
    assert checkpoint.config == preset.config and checkpoint.weights.keys() == preset.weights.keys()
    assert all(np.array_equal(array, preset.weights[name]) for name, array in checkpoint.weights.items())
    with zipfile.ZipFile(path) as archive:
        (tmp_path / "model.weights.h5").write_bytes(archive.read("model.weights.h5"))
    with pytest.raises(WeightsError, match="dataset 'optimizer/vars/0' holds HDF5 type class 0"):
        read_hdf5(tmp_path / "model.weights.h5")


def keras_file(tmp_path: Path, config: dict, compression: int = zipfile.ZIP_STORED) -> Path:
    """A .keras file as model.save writes one of a BertBackbone: the preset's weights, ``config`` as its config."""
    path = tmp_path / "backbone.keras"
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("metadata.json", (BACKBONE / "metadata.json").read_text())
        archive.writestr("config.json", json.dumps(config))
        archive.write(BACKBONE / "model.weights.h5", "model.weights.h5")
    return path


def test_a_backbone_saved_as_a_keras_file_is_the_preset(tmp_path):
    config = json.loads((BACKBONE / "config.json").read_text())
    checkpoint = load_checkpoint(keras_file(tmp_path, config))
    preset = load_checkpoint(BACKBONE)
    assert checkpoint.config == preset.config and len(checkpoint.info.notes) == 1
    assert all(np.array_equal(array, preset.weights[name]) for name, array in checkpoint.weights.items())


def test_a_keras_file_of_another_model_is_refused_naming_it_and_the_file(tmp_path):
    config = json.loads((BACKBONE / "config.json").read_text())
    path = keras_file(tmp_path, {**config, "class_name": "DistilBertBackbone"})
    with pytest.raises(WeightsError, match=rf"^{path}/config.json: its class_name is 'DistilBertBackbone'"):
        load_checkpoint(path)


def test_a_keras_files_weights_are_read_in_place_and_a_compressed_ones_copied_out(tmp_path, monkeypatch):
    """Keras stores a .keras file's members uncompressed: its model.weights.h5 is read where it lies in the zip
    (checked against the zip's checksum), only its config copied out; a zip compressed by another tool is
    extracted first, and reads the same."""
    from bert_multi.files.formats import keras_hub

    copied = []
    extract = keras_hub.extract
    monkeypatch.setattr(
        keras_hub,
        "extract",
        lambda archive, member, *rest: copied.append(member.filename) or extract(archive, member, *rest),
    )
    in_place = load_checkpoint(HERE / "keras-hub-masked-lm.keras")
    assert copied == ["config.json"]
    config = json.loads((BACKBONE / "config.json").read_text())
    compressed = load_checkpoint(keras_file(tmp_path, config, zipfile.ZIP_DEFLATED))
    assert copied == ["config.json", "config.json", "model.weights.h5"]
    preset = load_checkpoint(BACKBONE)
    assert all(np.array_equal(array, preset.weights[name]) for name, array in compressed.weights.items())
    assert in_place.config.num_blks == 1 and compressed.config == preset.config
