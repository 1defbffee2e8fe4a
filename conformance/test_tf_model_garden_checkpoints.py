"""BERTs saved by TensorFlow 2 from the TF Model Garden's ``BertEncoder`` (``conformance/original_bert/
tf_model_garden.py`` wrote them with tf-models-official 2.20 and TensorFlow 2.20): a SavedModel's variables,
as TF Hub's BERTs are, and a training run's checkpoint with Adam's state. This suite only reads them.

The Model Garden computes its LayerNorms in float32 whatever the model's dtype, so TensorFlow's outputs are
float32's. They are held to within float32's tolerance, and, since float32's tolerance cannot tell GELU's two
forms apart, the form the files are read with is shown to compute them a thousand times more closely than
the other.
"""

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, load_checkpoint
from bert_multi.engine.compare import compare_arrays, tolerance_for
from conftest import encoder_outputs

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
SAVED_MODEL, TRAINING = HERE / "tf2-savedmodel", HERE / "tf2-training"
with np.load(HERE / "tf2.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}
INPUTS = {name.removeprefix("inputs/"): array for name, array in SAVED.items() if name.startswith("inputs/")}


def outputs(config, weights) -> dict[str, np.ndarray]:
    return encoder_outputs(config, weights, INPUTS)


def largest_difference(computed: dict[str, np.ndarray], whose: str) -> float:
    """The largest difference from TensorFlow's outputs saved under ``whose``, each within float32's tolerance."""
    saved = {name.removeprefix(f"{whose}/"): array for name, array in SAVED.items() if name.startswith(f"{whose}/")}
    assert saved.keys() == {"encoded", "pooled"}
    for name, theirs in saved.items():
        comparison = compare_arrays(name, computed[name], theirs, tolerance_for("float32", "cpu"))
        assert comparison.passed, comparison.describe()
    return max(float(np.abs(computed[name] - theirs).max()) for name, theirs in saved.items())


@pytest.mark.parametrize(
    "path, whose", [(SAVED_MODEL, "float32"), (TRAINING, "trained")], ids=["savedmodel", "training"]
)
def test_a_model_garden_bert_computes_what_tensorflow_computes(path, whose):
    checkpoint = load_checkpoint(path)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.num_heads == 2 and config.max_len == 16 and config.heads == ("pooler",)
    assert config.semantics.activation == "gelu_tanh" and config.semantics.layer_norm_eps == 1e-12
    assert checkpoint.info.notes[1].startswith("its config is not in the file: the sizes are the tensors'")
    tanh = largest_difference(outputs(config, checkpoint.weights), whose)
    erf = dataclasses.replace(config, semantics=dataclasses.replace(config.semantics, activation="gelu"))
    computed = outputs(erf, checkpoint.weights)
    other = max(float(np.abs(computed[name] - SAVED[f"{whose}/{name}"]).max()) for name in ("encoded", "pooled"))
    assert 1000 * tanh < other  # measured: 1.5e-7 against 2.7e-4 (the SavedModel)


def test_a_training_checkpoint_leaves_adams_state_out_and_says_so():
    checkpoint = load_checkpoint(TRAINING)
    assert checkpoint.info.notes[0].startswith("read ckpt-1.index: TensorFlow 2's object graph")
    assert (
        checkpoint.info.notes[2] == "left out 81 tensors of training state (the optimizer's, the checkpoint's counter)"
    )
    # Named as TensorFlow names a checkpoint, by its prefix or its .index, it reads the same.
    for named in (TRAINING / "ckpt-1", TRAINING / "ckpt-1.index"):
        assert load_checkpoint(named).weights.keys() == checkpoint.weights.keys()


def test_one_step_of_adam_moved_the_weights_the_savedmodel_holds():
    """The two fixtures are the same encoder before and after one step on the sum of its encoding: every
    weight moved but the pooler's, which the loss does not reach. What makes them two tests, not one."""
    before, after = load_checkpoint(SAVED_MODEL).weights, load_checkpoint(TRAINING).weights
    assert before.keys() == after.keys()
    unmoved = [name for name in before if np.array_equal(before[name], after[name])]
    assert unmoved == ["hidden.0.weight", "hidden.0.bias"]


def test_the_savedmodel_is_read_beside_its_graph_which_is_not_read(tmp_path):
    """The fixture keeps the SavedModel's variables only; its saved_model.pb (the graph) is never read."""
    directory = tmp_path / "savedmodel"
    shutil.copytree(SAVED_MODEL, directory)
    (directory / "saved_model.pb").write_bytes(b"not read")
    checkpoint = load_checkpoint(directory)
    assert checkpoint.info.notes[0].startswith("read variables.index (a SavedModel's variables)")


def test_a_tensorflow_1_checkpoint_is_still_googles():
    checkpoint = load_checkpoint(HERE / "pretrained")
    assert checkpoint.info.format == "tf-dir"


def test_a_variable_of_another_model_is_refused_naming_it(tmp_path):
    directory = tmp_path / "savedmodel"
    shutil.copytree(SAVED_MODEL, directory)
    data = (directory / "variables" / "variables.data-00000-of-00001").read_bytes()
    assert data.count(b"pooler_transform/kernel") == 1  # in the object graph, a string tensor of the data
    changed = data.replace(b"pooler_transform/kernel", b"pooler_transfoRm/kernel")
    (directory / "variables" / "variables.data-00000-of-00001").write_bytes(changed)
    with pytest.raises(
        WeightsError, match=r"variables of no BertEncoder layer bert_multi knows: \['pooler_transfoRm/kernel'\]"
    ):
        load_checkpoint(directory)


def test_a_pretrainers_encoder_is_read_and_its_mlm_head_left_out_saying_why():
    """BertPretrainerV2's MLM head computes the activation its constructor was given (none by default, GELU in
    TF Hub's pretraining), which no file records: the head is left out, and the encoder computes TensorFlow's."""
    checkpoint = load_checkpoint(HERE / "tf2-pretrainer")
    assert checkpoint.config.num_blks == 1 and checkpoint.config.heads == ("pooler",)
    assert checkpoint.info.notes[2].startswith("left out the MLM head of BertPretrainerV2 (['bert/cls/predictions/")
    assert "mlm_activation" in checkpoint.info.notes[2]
    largest_difference(outputs(checkpoint.config, checkpoint.weights), "pretrainer")


def test_a_fine_tuned_classifier_is_read_as_its_encoder_its_head_and_its_adam_state_left_out():
    checkpoint = load_checkpoint(HERE / "tf2-classifier")
    assert checkpoint.config.num_blks == 1 and checkpoint.config.heads == ("pooler",)
    assert checkpoint.info.notes[2].startswith(
        "left out ['sentence_prediction/logits/bias', 'sentence_prediction/logits/kernel'], the task head of a "
        "Model Garden BertClassifier"
    )
    # Adam's moments of every weight, the head's included, its step and learning rate, the checkpoint's counter.
    assert (
        checkpoint.info.notes[3] == "left out 53 tensors of training state (the optimizer's, the checkpoint's counter)"
    )
    largest_difference(outputs(checkpoint.config, checkpoint.weights), "classifier")
