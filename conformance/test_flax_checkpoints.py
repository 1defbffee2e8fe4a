"""A Flax BERT trained in a ``TrainState`` and saved by Flax's and Orbax's own checkpointing
(``conformance/original_bert/flax_training.py`` wrote them; this suite only reads them). Flax's file from
before Orbax is read: its parameters compute what the trained model computed in float64, its step and
Adam state left out. Orbax's directories are named for what they are, with the code that makes each Flax's
own file; that code, run as the message gives it, makes a file that reads to the same weights."""

import contextlib
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, inspect_checkpoint, load_checkpoint
from bert_multi.backend.registry import load_backend
from bert_multi.cli import main
from bert_multi.engine.compare import compare_arrays, tolerance_for
from conftest import runs_here

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
LEGACY = HERE / "flax-train-state" / "checkpoint_2"
ORBAX_STATE = HERE / "orbax-train-state" / "checkpoint_2"
ORBAX_STEP = HERE / "orbax-manager" / "2"
with np.load(HERE / "flax-train-state.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}
STATEMENTS = {"num_heads": 2, "preset": "d2l"}


def test_flax_checkpoint_file_from_before_orbax_computes_what_the_trained_model_computed():
    checkpoint = load_checkpoint(LEGACY, **STATEMENTS)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert checkpoint.info.format == "flax"
    assert (
        checkpoint.info.notes[0]
        == "read the tree under 'params' and left out the entries beside it: ['step', 'opt_state']"
    )
    inputs = {name: SAVED[name] for name in ("tokens", "segments", "valid_lens", "pred_positions")}
    out = load_backend("numpy").build(config, checkpoint.weights, dtype="float64")(**inputs)
    for name in ("encoded", "mlm", "nsp"):
        comparison = compare_arrays(name, getattr(out, name), SAVED[name], tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()


@pytest.mark.parametrize("separator, variables", [("/", False), ("/", True), (".", False)])
def test_flax_parameters_saved_by_numpy_compute_what_the_trained_model_computed(tmp_path, separator, variables):
    """``np.savez(path, **flax.traverse_util.flatten_dict(params, sep="/"))`` (the parameters, or the variables
    dict around them), as a JAX user carries weights without Flax's own file: read as its tree."""
    serialization = pytest.importorskip("flax.serialization", reason="Flax flattens the tree")
    traverse_util = pytest.importorskip("flax.traverse_util", reason="Flax flattens the tree")
    params = serialization.msgpack_restore(LEGACY.read_bytes())["params"]
    tree = traverse_util.flatten_dict({"params": params} if variables else params, sep=separator)
    np.savez(tmp_path / "bert.npz", **tree)
    checkpoint = load_checkpoint(tmp_path / "bert.npz", **STATEMENTS)
    assert checkpoint.info.format == "npz-arrays"
    assert "Flax's (in, out) kernels read as (out, in) weights" in checkpoint.info.notes
    inputs = {name: SAVED[name] for name in ("tokens", "segments", "valid_lens", "pred_positions")}
    out = load_backend("numpy").build(checkpoint.config, checkpoint.weights, dtype="float64")(**inputs)
    for name in ("encoded", "mlm", "nsp"):
        comparison = compare_arrays(name, getattr(out, name), SAVED[name], tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()


def test_a_run_directory_of_flax_checkpoint_files_names_them():
    with pytest.raises(
        WeightsError, match=r"holds \['checkpoint_2'\], which bert_multi reads, or names with what to do: name one"
    ):
        inspect_checkpoint(LEGACY.parent)


# (what is named, what the message says it is, the checkpoint the code it gives restores)
ORBAX = {
    "flax.training's checkpoint": (
        ORBAX_STATE,
        r"is an Orbax checkpoint of 138 leaves, its parameters \[",
        ORBAX_STATE,
    ),
    "a file in it": (ORBAX_STATE / "_METADATA", r"is an Orbax checkpoint of 138 leaves", ORBAX_STATE),
    "its run's directory": (ORBAX_STATE.parent, r"holds Orbax checkpoints, \['checkpoint_2/'\]", None),
    "a manager's step": (
        ORBAX_STEP,
        r"is an Orbax CheckpointManager's step; its items \['default/'\] are each an Orbax checkpoint, and "
        r"default/ is an Orbax checkpoint of 45 leaves",
        ORBAX_STEP / "default",
    ),
    "a manager's item": (ORBAX_STEP / "default", r"is an Orbax checkpoint of 45 leaves", ORBAX_STEP / "default"),
    "a manager's directory": (ORBAX_STEP.parent, r"holds Orbax checkpoints, \['2/'\]", None),
}


@pytest.mark.parametrize("case", ORBAX)
def test_an_orbax_directory_is_named_with_the_code_that_makes_it_a_flax_file(case):
    path, says, restored = ORBAX[case]
    with pytest.raises(WeightsError) as raised:
        load_checkpoint(path, **STATEMENTS)
    message = str(raised.value)
    named = path.parent if path.is_file() else path  # a file of a checkpoint is said to be of its directory
    assert message.startswith(f"{named}: ") and re.search(says, message), message
    if restored is None:
        assert "name one" in message
    else:
        assert "'params.encoder.blks_0.addnorm1.ln.bias'" in message
        assert f"checkpointer.restore({os.path.abspath(restored)!r}, restore_args=" in message


def test_inspect_names_an_orbax_checkpoint_in_one_line(capsys):
    assert main(["inspect", str(ORBAX_STATE)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is an Orbax checkpoint" in err and "to_bytes(state)" in err


def _code_in(message: str) -> str:
    """The Python the message gives: all it says after its last colon."""
    return message.rsplit("which bert_multi reads: ", 1)[1]


def _saved_on_a_gpu(checkpoint: Path, copy: Path) -> Path:
    """A copy of ``checkpoint`` whose arrays say, as a run on a GPU writes them, that they were on one."""
    shutil.copytree(checkpoint, copy)
    sharding = (copy / "_sharding").read_text()
    assert '\\"device_str\\": \\"cpu:0\\"' in sharding
    (copy / "_sharding").write_text(sharding.replace("cpu:0", "cuda:0"))
    return copy


@runs_here("jax")
@pytest.mark.parametrize("which", ["flax.training's", "a manager's", "saved on a GPU"])
def test_the_code_the_message_gives_makes_a_flax_file_of_the_same_weights(which, tmp_path):
    path = {"flax.training's": ORBAX_STATE, "a manager's": ORBAX_STEP / "default"}.get(which)
    path = path or _saved_on_a_gpu(ORBAX_STEP / "default", tmp_path / "gpu")
    with pytest.raises(WeightsError) as raised:
        load_checkpoint(path, **STATEMENTS)
    with contextlib.chdir(tmp_path):
        exec(_code_in(str(raised.value)), {})  # noqa: S102 - the message's own code, imports and all
    restored = load_checkpoint(tmp_path / "bert.msgpack", **STATEMENTS)
    legacy = load_checkpoint(LEGACY, **STATEMENTS)
    assert restored.config == legacy.config
    assert list(restored.weights) == list(legacy.weights)
    assert all(np.array_equal(restored.weights[name], array) for name, array in legacy.weights.items())


def test_the_parameters_are_read_wherever_they_are_among_the_states_entries(tmp_path):
    from bert_multi.files.formats.flax import flax_tree, pack_tree

    legacy = load_checkpoint(LEGACY, **STATEMENTS)
    tree = flax_tree(legacy.config, legacy.weights)
    zeros = flax_tree(legacy.config, {name: np.zeros_like(array) for name, array in legacy.weights.items()})
    # As Orbax restores a TrainState (its keys sorted), Adam's moments first, under the parameters' names.
    state = {"opt_state": {"0": {"mu": zeros, "nu": zeros}}, "params": tree, "step": np.array(2)}
    (tmp_path / "state.msgpack").write_bytes(pack_tree(state))
    read = load_checkpoint(tmp_path / "state.msgpack", **STATEMENTS)
    assert (
        read.info.notes[0] == "read the tree under 'params' and left out the entries beside it: ['opt_state', 'step']"
    )
    assert all(np.array_equal(read.weights[name], array) for name, array in legacy.weights.items())
    (tmp_path / "variables.msgpack").write_bytes(pack_tree({"params": tree}))  # the variables dict: nothing beside
    assert not any(
        "left out" in note for note in load_checkpoint(tmp_path / "variables.msgpack", **STATEMENTS).info.notes
    )


def test_a_pickled_tree_of_arrays_is_named_with_the_line_that_makes_it_a_flax_file(tmp_path):
    """pickle.dump(jax.device_get(params)): NumPy's arrays in nested dicts, parsed and never unpickled."""
    import pickle

    from bert_multi.files.formats.flax import flax_tree

    legacy = load_checkpoint(LEGACY, **STATEMENTS)
    (tmp_path / "params.pkl").write_bytes(pickle.dumps({"params": flax_tree(legacy.config, legacy.weights)}))
    with pytest.raises(WeightsError, match=r"it holds arrays in nested dicts, as a Flax model's parameters are"):
        load_checkpoint(tmp_path / "params.pkl", **STATEMENTS)


@runs_here("jax")
def test_a_pickle_of_jaxs_arrays_or_flaxs_frozen_dict_is_named_for_what_it_is(tmp_path):
    import pickle

    import jax.numpy as jnp
    from flax.core import freeze

    params = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}}
    for name, tree, whose in [("arrays", params, "JAX"), ("frozen", freeze(params), "Flax")]:
        (tmp_path / f"{name}.pkl").write_bytes(pickle.dumps(tree))
        with pytest.raises(WeightsError, match=rf"a pickle of {whose}'s objects \(.*\): pickle.dump of a Flax"):
            inspect_checkpoint(tmp_path / f"{name}.pkl")
