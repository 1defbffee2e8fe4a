"""BERTs trained with DeepSpeed 0.19 and saved by its engine's ``save_checkpoint`` (``conformance/original_bert/
deepspeed_bert.py`` wrote them; this suite only reads them): transformers' ``BertForPreTraining`` after two
Adam steps at ZeRO stage 2, whose model's states hold the model, and at stage 3, whose do not. The first
computes, through the float64 oracle, what the trained model computed; the second is named, with DeepSpeed's
command that gathers its weights (which the generator ran, from the message, and checked)."""

import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, load_checkpoint
from bert_multi.backend.registry import load_backend
from bert_multi.engine.compare import compare_arrays, tolerance_for
from conftest import runs_here

pytestmark = runs_here("torch")  # the model's states are PyTorch's file

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
ZERO2, ZERO3 = HERE / "deepspeed-zero2", HERE / "deepspeed-zero3"
with np.load(HERE / "deepspeed.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}
NOTE = (
    "read DeepSpeed's save 'global_step2': the model's state_dict under 'module' in its mp_rank_00_model_states.pt, "
    "the optimizer's states left out"
)


def saved(part: str) -> dict[str, np.ndarray]:
    return {name.removeprefix(f"{part}/"): array for name, array in SAVED.items() if name.startswith(f"{part}/")}


def zipped(directory: Path, target: Path) -> Path:
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(directory.rglob("*")):
            archive.write(path, Path(directory.name) / path.relative_to(directory))
    return target


@pytest.mark.parametrize("named", ["run", "save", "zip"])
def test_a_zero_stage_2_checkpoint_computes_what_the_trained_model_computed(tmp_path, named):
    """The run's directory (its latest save), the save's folder, or the run zipped: each reads the model's
    states of the save and computes what transformers' trained model computed."""
    path = {"run": ZERO2, "save": ZERO2 / "global_step2", "zip": zipped(ZERO2, tmp_path / "run.zip")}[named]
    checkpoint = load_checkpoint(path, num_heads=2)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.heads == ("pooler", "mlm", "nsp") and config.semantics.name == "bert"
    assert NOTE in checkpoint.info.notes
    out = load_backend("numpy").build(config, checkpoint.weights, dtype="float64")(**saved("inputs"))
    outputs = saved("zero2")
    assert set(outputs) == {"encoded", "mlm", "nsp"}
    for name, theirs in outputs.items():
        comparison = compare_arrays(name, getattr(out, name), theirs, tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()


def test_the_model_states_file_named_alone_says_its_key_and_its_directory():
    """The save's mp_rank_00_model_states.pt named itself: a dict around the state_dict, whose key reads it (as
    its directory does), and which says it is DeepSpeed's."""
    states = ZERO2 / "global_step2" / "mp_rank_00_model_states.pt"
    expected = (
        "pass key='module' (--key module); it is DeepSpeed's model states: name its save's directory, "
        f"{ZERO2 / 'global_step2'}, as DeepSpeed's checkpoint"
    )
    with pytest.raises(WeightsError, match=re.escape(expected)):
        load_checkpoint(states, num_heads=2)
    read, whole = load_checkpoint(states, key="module", num_heads=2), load_checkpoint(ZERO2, num_heads=2)
    assert read.weights.keys() == whole.weights.keys()
    assert all(np.array_equal(array, whole.weights[name]) for name, array in read.weights.items())


def test_a_zero_stage_3_checkpoint_is_named_with_deepspeeds_command_that_gathers_it(tmp_path):
    """Its model's states hold empty tensors: refused before they are read, with DeepSpeed's module, or the
    script DeepSpeed copies beside latest where it is there."""
    expected = (
        f"DeepSpeed's save 'global_step2' is of ZeRO stage 3: each rank keeps its part of the weights among its "
        f"optimizer's states, and the model's states (zero_pp_rank_0_mp_rank_00_model_states.pt) hold none. "
        f"DeepSpeed gathers them: python -m deepspeed.utils.zero_to_fp32 {ZERO3} OUT --tag global_step2, then "
        f"read OUT/pytorch_model.bin"
    )
    for path in (ZERO3, ZERO3 / "global_step2"):
        with pytest.raises(WeightsError, match=re.escape(f"{path}: {expected}")):
            load_checkpoint(path, num_heads=2)
    copy = tmp_path / "run"
    shutil.copytree(ZERO3, copy)
    (copy / "zero_to_fp32.py").write_text("")
    with pytest.raises(WeightsError, match=re.escape(f"gathers them: python {copy}/zero_to_fp32.py {copy} OUT")):
        load_checkpoint(copy, num_heads=2)


@pytest.mark.parametrize(
    "latest, message",
    [
        (b"global_step9", "names the save 'global_step9', but .* holds no folder of that name"),
        (b"../deepspeed-zero2", "expected the tag of DeepSpeed's last save"),
        (b"", "expected the tag of DeepSpeed's last save"),
        (b"global\x1bstep2", "expected the tag of DeepSpeed's last save"),
    ],
)
def test_a_latest_that_names_no_save_of_the_run_is_refused(tmp_path, latest, message):
    copy = tmp_path / "run"
    shutil.copytree(ZERO2, copy)
    (copy / "latest").write_bytes(latest)
    with pytest.raises(WeightsError, match=message):
        load_checkpoint(copy, num_heads=2)


def test_a_model_split_among_model_parallel_ranks_is_refused(tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(ZERO2, copy)
    shutil.copy(
        copy / "global_step2" / "mp_rank_00_model_states.pt", copy / "global_step2" / "mp_rank_01_model_states.pt"
    )
    with pytest.raises(WeightsError, match="splits its model among ranks of model parallelism"):
        load_checkpoint(copy, num_heads=2)
