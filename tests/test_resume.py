"""Checkpoints of the whole training state: a run killed at any moment (SIGKILL, even while it writes a
checkpoint) and resumed ends with the weights of a run never interrupted."""

import dataclasses
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bert_multi import BERTConfig, WeightsError, load_checkpoint
from bert_multi.backend.registry import not_in_process
from bert_multi.safe_files import unnamed_file
from bert_multi.training import STATE_FILE, load_training_state, run_pretraining

pytestmark = pytest.mark.needs("Pretrainer")  # training: each framework's own Pretrainer

SETUP = """
from bert_multi import BERTConfig, init_weights
from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

DATA = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=32, seed=0)
CONFIG = BERTConfig(len(DATA.vocab), 16, 24, 2, 2, max_len=32)
WEIGHTS = init_weights(CONFIG, seed=1, dtype="float64")
"""
_setup: dict = {}
exec(SETUP, _setup)  # the same model and data here and in the process that is killed
DATA, CONFIG, WEIGHTS = _setup["DATA"], _setup["CONFIG"], _setup["WEIGHTS"]
STEPS = 6


def arguments(framework, optimizer):
    return {"config": CONFIG, "weights": WEIGHTS, "data": DATA, "steps": STEPS, "batch_size": 8, "seed": 0,
            "dtype": "float64", "optimizer": optimizer, "lr": 0.05, "backend_name": framework}  # fmt: skip


def killed_run(framework, optimizer, directory, kill):
    """A run with a checkpoint every step, in a process that SIGKILLs itself as ``kill`` says."""
    script = SETUP + textwrap.dedent(f"""
        import os, signal
        import numpy as np
        from bert_multi.training import run_pretraining
        def die(*_):
            os.kill(os.getpid(), signal.SIGKILL)
        kill = {kill!r}
        if kill[0] == "after step":
            on_step = lambda step, losses: die() if step == kill[1] else None
        else:  # "writing checkpoint": the kill-th checkpoint dies halfway through its file
            import bert_multi.spec.weight_file as weights_module
            on_step, written, write_archive = None, [], weights_module.write_archive
            def half_then_die(file, arrays):
                written.append(1)
                if len(written) == kill[1]:
                    file.write(b"PK" * 1000)
                    die()
                write_archive(file, arrays)
            weights_module.write_archive = half_then_die
        run_pretraining({framework!r}, CONFIG, WEIGHTS, DATA, {STEPS}, 8, seed=0, dtype="float64",
                        optimizer={optimizer!r}, lr=0.05, checkpoint_every=1, checkpoint_dir={str(directory)!r},
                        on_step=on_step)
    """)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert finished.returncode == -signal.SIGKILL, finished.stderr


@pytest.mark.parametrize(("optimizer", "kill"), [("adam", ("after step", 4)), ("sgd", ("writing checkpoint", 3))])
def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(framework, tmp_path, optimizer, kill):
    killed_run(framework.NAME, optimizer, tmp_path, kill)
    saved = load_training_state(tmp_path)
    # Killed after step 4's checkpoint, or while writing the third: the last whole state stays.
    assert saved.step == (4 if kill[0] == "after step" else 2)
    if kill[0] == "writing checkpoint":
        # The half-written file: none at all where the filesystem has unnamed files (O_TMPFILE), else a
        # named one that the next save removes.
        leftover = any(path.name.endswith(".tmp") for path in tmp_path.iterdir())
        assert leftover == (unnamed_file(tmp_path) is None)
    options = arguments(framework.NAME, optimizer)
    resumed = run_pretraining(**options, checkpoint_every=1, checkpoint_dir=tmp_path, resume=True)
    uninterrupted = run_pretraining(**options)
    assert len(resumed.losses) == STEPS - saved.step
    later = uninterrupted.losses[saved.step :]
    assert np.abs(np.subtract(resumed.losses, later)).max() <= 1e-12
    moved = max(np.abs(uninterrupted.weights[name] - WEIGHTS[name]).max() for name in WEIGHTS)
    assert moved > 0.05
    gap = max(np.abs(resumed.weights[name] - uninterrupted.weights[name]).max() for name in WEIGHTS)
    assert gap <= 1e-12  # measured: 0.0, the same operations on the same numbers
    assert load_training_state(tmp_path).step == STEPS


def test_a_resume_with_other_settings_or_a_damaged_state_is_refused(tmp_path):
    options = arguments("torch", "sgd")
    pytest.importorskip("torch")
    run_pretraining(**{**options, "steps": 2}, checkpoint_every=1, checkpoint_dir=tmp_path)
    with pytest.raises(
        ValueError, match="saved by a run with lr 0.05 where this run has 0.1; resume with the same settings"
    ):
        run_pretraining(**{**options, "lr": 0.1}, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(ValueError, match="with num_blks 2 where this run has 1, mixed_precision 'unset' where this"):
        config = BERTConfig(**{**options["config"].to_dict(), "num_blks": 1})
        run_pretraining(
            **{**options, "config": config}, mixed_precision="bfloat16", checkpoint_dir=tmp_path, resume=True
        )
    state = tmp_path / STATE_FILE
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=STATE_FILE):
        run_pretraining(**options, checkpoint_dir=tmp_path, resume=True)
    np.savez(state, a=np.zeros(3))
    with pytest.raises(WeightsError, match="this is not a bert_multi training state"):
        load_training_state(tmp_path)
    with pytest.raises(ValueError, match="need a checkpoint directory"):
        run_pretraining(**options, checkpoint_every=1)


def test_the_command_line_saves_and_resumes(tmp_path, capsys):
    pytest.importorskip("torch")
    from bert_multi.cli import main

    model = ["--num-hiddens", "16", "--ffn-num-hiddens", "24", "--max-len", "32", "--batch-size", "8"]
    state = tmp_path / "state"
    assert main(["pretrain", *model, "--steps", "2", "--checkpoint-every", "1", "--checkpoint-dir", str(state),
                 "--out", str(tmp_path / "a.npz")]) == 0  # fmt: skip
    saved = load_training_state(state)
    assert saved.step == 2
    for path in (state, state / STATE_FILE):  # the run's directory, or its file, read as a checkpoint
        checkpoint = load_checkpoint(path)
        assert checkpoint.config == saved.config and checkpoint.info.notes == [
            f"read the weights of bert-multi pretrain's training state at step 2; its optimizer's state "
            f"({len(saved.optimizer)} arrays) left out"
        ]
        assert all(np.array_equal(checkpoint.weights[name], array) for name, array in saved.weights.items())
    again = ["--steps", "3", "--resume", str(state), "--checkpoint-every", "1"]
    assert main(["pretrain", *model, *again, "--out", str(tmp_path / "b.npz")]) == 0
    printed = capsys.readouterr().out
    assert "step    3/3" in printed and "step    1/3" not in printed.split("step    2/2")[-1]
    assert f"resuming from {state}: step 2 of 3 was done there" in printed
    assert main(["pretrain", *model, *again, "--out", str(tmp_path / "c.npz")]) == 0
    printed = capsys.readouterr().out
    assert f"nothing to train: {state} already holds step 3 of 3" in printed and "tokens/s" not in printed
    assert main(["pretrain", "--checkpoint-every", "2"]) == 2
    assert "--checkpoint-every needs --checkpoint-dir" in capsys.readouterr().err


def test_an_interrupted_run_says_where_its_last_checkpoint_is_and_the_command_that_goes_on(
    tmp_path, capsys, monkeypatch
):
    pytest.importorskip("torch")
    from bert_multi.cli import main, pretrain

    real = pretrain.run_pretraining

    def ctrl_c_after_step_2(*args, on_step, **kwargs):
        def step(number, losses):
            on_step(number, losses)
            if number == 2:
                raise KeyboardInterrupt

        return real(*args, on_step=step, **kwargs)

    monkeypatch.setattr(pretrain, "run_pretraining", ctrl_c_after_step_2)
    model = ["--num-hiddens", "16", "--ffn-num-hiddens", "24", "--max-len", "32", "--batch-size", "8"]
    state = tmp_path / "my run"
    assert main(["pretrain", *model, "--steps", "5", "--checkpoint-every", "2", "--checkpoint-dir", str(state)]) == 130
    said = capsys.readouterr().err
    command = f"bert-multi pretrain {' '.join(model)} --steps 5 --checkpoint-every 2 --checkpoint-dir '{state}'"
    command += f" --resume '{state}'"
    assert f"the last checkpoint is step 2 of 5, in {state}: go on with {command}" in said
    assert main(["pretrain", *model, "--steps", "5"]) == 130  # no checkpoint: said so, and how to keep one
    assert "interrupted with no checkpoint saved; --checkpoint-every K --checkpoint-dir DIR" in capsys.readouterr().err


def test_a_data_parallel_run_resumes_from_its_workers_checkpoint(framework, tmp_path):
    """Worker 0 saves the state; every worker of the resumed run takes it up."""
    options = arguments(framework.NAME, "adam")
    del options["backend_name"]
    framework.train_data_parallel(2, **{**options, "steps": 3}, checkpoint_every=1, checkpoint_dir=tmp_path)
    assert load_training_state(tmp_path).step == 3
    resumed = framework.train_data_parallel(2, **options, checkpoint_every=1, checkpoint_dir=tmp_path, resume=True)
    uninterrupted = run_pretraining(framework.NAME, **options)
    gap = max(np.abs(resumed.weights[name] - uninterrupted.weights[name]).max() for name in WEIGHTS)
    # As for any data-parallel run against one process (tests/test_distributed.py): measured 1.7e-12 for
    # torch, 7.7e-7 for MXNet, whose key-value store sums in float32, 2.2e-12 for JAX.
    assert gap <= {"torch": 1e-10, "mxnet": 1e-4, "jax": 1e-10}[framework.NAME]
    assert load_training_state(tmp_path).step == STEPS


def test_with_dropout_a_resumed_run_draws_the_masks_the_uninterrupted_one_would(framework, tmp_path):
    config = dataclasses.replace(CONFIG, dropout=0.2)
    options = {**arguments(framework.NAME, "adam"), "config": config}
    run_pretraining(**{**options, "steps": 3}, checkpoint_every=3, checkpoint_dir=tmp_path)
    resumed = run_pretraining(**options, checkpoint_dir=tmp_path, resume=True)
    uninterrupted = run_pretraining(**options)
    assert max(np.abs(resumed.weights[name] - uninterrupted.weights[name]).max() for name in WEIGHTS) == 0
    without = run_pretraining(**{**options, "config": CONFIG})  # dropout really acted: other weights
    assert max(np.abs(without.weights[name] - uninterrupted.weights[name]).max() for name in WEIGHTS) > 1e-3


# --- Hostile training states (issue 26) ------------------------------------------------------------------


def saved_state(tmp_path, optimizer="adam"):
    """A real state after two steps of the torch backend (skipped where torch is absent)."""

    if not_in_process("torch"):
        pytest.skip(not_in_process("torch"))
    run_pretraining(**{**arguments("torch", optimizer), "steps": 2}, checkpoint_every=2, checkpoint_dir=tmp_path)
    return load_training_state(tmp_path)


def rewritten(tmp_path, state, **changes):
    """``state`` with ``changes`` saved as a damaged file is: past the check that refuses to save one."""
    from unittest import mock

    from bert_multi.training import TrainingState, save_training_state

    with mock.patch("bert_multi.spec.training_state.check_optimizer_state"):
        save_training_state(tmp_path, TrainingState(**{**state._asdict(), **changes}))
    return tmp_path


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda s: {"optimizer": {**s.optimizer, "v.encoder.pos_embedding": np.zeros((2, 2))}}, r"\(2, 2\); its"),
        (lambda s: {"optimizer": {k: v for k, v in s.optimizer.items() if not k.startswith("v.")}}, "has no partner"),
        (lambda s: {"optimizer": {k: v.astype(np.int8) for k, v in s.optimizer.items()}}, "is int8"),
        (lambda s: {"optimizer": {**s.optimizer, "m.nothing": np.zeros(1), "v.nothing": np.zeros(1)}}, "no moment"),
        (lambda s: {"optimizer": {k: -abs(v) - 1 for k, v in s.optimizer.items()}}, "negative"),
        (lambda s: {"optimizer": {}}, "no Adam moments for 45 of the 45 parameters"),
    ],
)
def test_a_state_whose_optimizer_arrays_do_not_fit_is_refused_naming_the_file(tmp_path, change, problem):
    state = saved_state(tmp_path)
    rewritten(tmp_path, state, **change(state))
    with pytest.raises(WeightsError, match=problem) as caught:
        load_training_state(tmp_path)
    assert str(tmp_path / STATE_FILE) in str(caught.value)


def test_a_state_of_a_billion_blocks_or_a_step_of_true_is_refused_at_once(tmp_path):
    import time

    state = saved_state(tmp_path)
    started = time.perf_counter()
    rewritten(tmp_path, state, config=dataclasses.replace(CONFIG, num_blks=10**9))
    with pytest.raises(WeightsError, match="missing tensor"):
        load_training_state(tmp_path)
    rewritten(tmp_path, state, step=True)
    with pytest.raises(WeightsError, match="its step is True, not a whole number"):
        load_training_state(tmp_path)
    assert time.perf_counter() - started < 60  # a loop over 10**9 blocks would take hours; a busy machine, not a minute


def test_a_state_past_the_steps_asked_for_is_refused_instead_of_replayed(tmp_path):
    from bert_multi import UsageError

    state = saved_state(tmp_path)
    rewritten(tmp_path, state, step=10**7)
    with pytest.raises(UsageError, match="at step 10000000, past the 6 steps asked for"):
        run_pretraining(**arguments("torch", "adam"), checkpoint_dir=tmp_path, resume=True)


def test_a_dangling_state_link_is_refused_not_taken_for_no_state(tmp_path):
    (tmp_path / STATE_FILE).symlink_to(tmp_path / "gone.npz")
    with pytest.raises(WeightsError):
        load_training_state(tmp_path)


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_skipped_are_the_batches_drawn_and_dropped(shuffle):
    per_epoch = len(DATA) // 8
    for skip in (0, 1, per_epoch - 1, per_epoch, 2 * per_epoch + 3):
        drawn = DATA.batches(8, seed=5, shuffle=shuffle)
        for _ in range(skip):
            next(drawn)
        skipped = DATA.batches(8, seed=5, shuffle=shuffle, skip=skip)
        for _ in range(per_epoch + 2):
            expected, got = next(drawn), next(skipped)
            assert all(np.array_equal(expected[k], got[k]) for k in expected), skip


def test_resuming_a_run_that_already_took_every_step_takes_none_and_returns_its_weights(framework, tmp_path):
    options = {**arguments(framework.NAME, "sgd"), "steps": 2}
    finished = run_pretraining(**options, checkpoint_every=1, checkpoint_dir=tmp_path)
    again = run_pretraining(**options, checkpoint_every=1, checkpoint_dir=tmp_path, resume=True)
    assert again.losses == [] and again.first_step_seconds == 0.0
    assert all(np.array_equal(again.weights[name], finished.weights[name]) for name in WEIGHTS)
