"""A worker of another environment that misbehaves (tests/subjects/hostile_worker.py) costs its caller at
most its deadline, a bounded amount of memory and one clear error naming the worker; nothing is left
behind, and nothing it sent is taken for a result."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bert_multi import CONFIGS, UserCodeError, errors, random_weights
from bert_multi.backend import channel, remote
from bert_multi.backend.registry import load_backend, not_in_process
from bert_multi.backend.remote import RemoteBackend, RemoteFailure
from bert_multi.engine.cases import CASES
from conftest import runs_here

ROOT = Path(__file__).resolve().parent.parent
SUBJECT = Path(__file__).parent / "subjects" / "hostile_worker.py"
CONFIG = CONFIGS["tiny"]
WEIGHTS = random_weights(CONFIG, seed=3, dtype="float64")
BATCH = CASES[0].batch(CONFIG, seed=1)
# The channel and its worker are the core's, and the worker here runs this Python: the same in every environment.
pytestmark = pytest.mark.once


@pytest.fixture
def hostile_python(tmp_path):
    """The "Python" of a backend whose worker is the hostile one."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SUBJECT}"\n')
    python.chmod(0o755)
    return python


def hostile(monkeypatch, hostile_python, mode, timeout="60"):
    """A backend whose worker misbehaves as ``mode`` says, with a model built there."""
    monkeypatch.setenv("HOSTILE_WORKER", mode)
    monkeypatch.setenv(channel.TIMEOUT_VARIABLE, timeout)
    backend = RemoteBackend("numpy", hostile_python)
    return backend, backend.build(CONFIG, WEIGHTS)


# What a bound of time here proves is an order of magnitude (seconds, not the 600 s deadline), so it keeps
# a margin that a machine busy with other work (a second test run beside this one) does not use up.
BUSY = 60


def assert_stopped(backend):
    """The worker is gone, with its directory, and refuses any further request at once."""
    assert backend.worker.process.poll() is not None
    assert not Path(backend.worker.directory.name).exists()
    started = time.monotonic()
    with pytest.raises(RemoteFailure, match="was stopped"):
        backend.kernel_eps(1e-5)
    assert time.monotonic() - started < BUSY  # at once: no worker is started or waited for


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("replies with garbage", r"its reply to 'forward' is damaged: .*not a readable .npz file"),
        ("replies with a FIFO", r"its reply to 'forward' is damaged: .*not a regular file"),
        ("replies compressed", r"its reply to 'forward' is damaged: .*compression method 8; expected stored"),
        (
            "replies misshapen",
            r"its reply to 'forward' holds encoded as float64 \(4, 1, 12\); expected float64 \(4, 12, 12\)",
        ),
        ("replies with no output", r"its reply to 'forward' holds no encoded output"),
    ],
)
def test_a_reply_that_does_not_check_out_is_an_error_naming_the_worker(monkeypatch, hostile_python, mode, expected):
    backend, model = hostile(monkeypatch, hostile_python, mode)
    started = time.monotonic()
    with pytest.raises(RemoteFailure, match=rf"the worker \({hostile_python}\) failed: {expected}"):
        model(**BATCH)
    assert time.monotonic() - started < BUSY  # far from the deadline (600 s): the damage ended it
    assert_stopped(backend)


def test_a_reply_field_of_the_wrong_type_is_an_error_naming_the_worker(monkeypatch, hostile_python):
    """Every field of a reply is checked for its type and range before it is used: a worker describing its
    devices as one string, or a LayerNorm epsilon of NaN, is a damaged worker, stopped."""
    monkeypatch.setenv("HOSTILE_WORKER", "describes itself with the wrong types")
    with pytest.raises(RemoteFailure, match=r"its reply to 'load' holds devices cpu; expected a list of device names"):
        RemoteBackend("numpy", hostile_python)
    backend, _ = hostile(monkeypatch, hostile_python, "answers with the wrong types")
    with pytest.raises(RemoteFailure, match=r"its reply to 'kernel_eps' holds eps nan; expected a LayerNorm epsilon"):
        backend.kernel_eps(1e-5)
    assert_stopped(backend)


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_worker_that_replaces_its_directory_is_stopped_and_nothing_outside_it_is_touched(
    monkeypatch, hostile_python, tmp_path, kind
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("not the worker's")
    monkeypatch.setenv("HOSTILE_ELSEWHERE", str(elsewhere))
    backend, model = hostile(monkeypatch, hostile_python, f"replaces its directory with a {kind}")
    with pytest.raises(RemoteFailure, match="its reply to 'forward'"):
        model(**BATCH)
    assert_stopped(backend)  # its directory gone: the link or the file, never what a link led to
    assert (elsewhere / "kept").read_text() == "not the worker's"


def test_a_reply_sent_ahead_of_its_request_is_never_taken_for_its_reply(monkeypatch, hostile_python):
    monkeypatch.setenv("HOSTILE_WORKER", "replies ahead")
    backend = RemoteBackend("numpy", hostile_python)
    with pytest.raises(RemoteFailure, match=r"its reply to 'supports' \(request 2\) answers another: "):
        backend.supports(CONFIG)
    assert_stopped(backend)


def test_a_reply_describing_no_model_is_an_error_naming_the_worker(monkeypatch, hostile_python):
    backend, model = hostile(monkeypatch, hostile_python, "")
    assert model.cut(8) is None  # the oracle's models do not cut themselves
    backend, model = hostile(monkeypatch, hostile_python, "describes a model it does not hold")
    expected = r"its reply to 'cut' describes no model: \{'ok': True, 'id': 3, 'model': '7', "
    with pytest.raises(RemoteFailure, match=expected):
        model.cut(8)
    assert_stopped(backend)


def test_a_worker_that_hangs_costs_its_deadline_and_no_more(monkeypatch, hostile_python):
    backend, model = hostile(monkeypatch, hostile_python, "hangs")
    backend.worker.timeout = 2.0  # for the forward: the worker's start is not what is timed
    started = time.monotonic()
    with pytest.raises(RemoteFailure, match=rf"took over 2 s to run 'forward' \({channel.TIMEOUT_VARIABLE}\)"):
        model(**BATCH)
    assert 2 <= time.monotonic() - started < 2 + BUSY  # its deadline, not the default 600 s
    assert_stopped(backend)


def test_a_worker_that_stops_answering_is_stopped_before_its_deadline(monkeypatch, hostile_python):
    """A frozen worker sends no heartbeat: SILENCE_S (shortened here) ends the wait, not the long deadline."""
    monkeypatch.setattr(channel, "HEARTBEAT_S", 0.5)
    backend, model = hostile(monkeypatch, hostile_python, "freezes", timeout="600")
    monkeypatch.setattr(channel, "SILENCE_S", 2.0)  # for the forward: the worker's start is not what is timed
    started = time.monotonic()
    with pytest.raises(RemoteFailure, match=r"said nothing for 2 s while running 'forward'; it was stopped"):
        model(**BATCH)
    assert time.monotonic() - started < 2 + BUSY  # the silence, not the 600 s deadline
    assert_stopped(backend)


def test_a_long_request_that_says_it_is_alive_is_waited_for(monkeypatch, hostile_python):
    """The heartbeat tells work from a hang: a request twice SILENCE_S long (3 s), beating, completes. A beat
    every 0.1 s: fifteen in a row would have to be late, on a busy machine, for the silence to end it."""
    monkeypatch.setattr(channel, "HEARTBEAT_S", 0.1)
    backend, model = hostile(monkeypatch, hostile_python, "works slowly")
    monkeypatch.setattr(channel, "SILENCE_S", 1.5)  # for the forward: the worker's start is not what is timed
    expected = load_backend("numpy").build(CONFIG, WEIGHTS)(**BATCH)
    assert np.array_equal(model(**BATCH).encoded, expected.encoded)
    backend.worker.close()


def test_a_worker_that_dies_is_one_error_quoting_the_end_of_what_it_said(monkeypatch, hostile_python):
    backend, model = hostile(monkeypatch, hostile_python, "dies")
    with pytest.raises(RemoteFailure, match=r"ended: the worker's last words"):
        model(**BATCH)
    assert_stopped(backend)


def test_a_worker_that_dies_leaving_a_child_holding_its_pipes_is_ended_and_so_is_the_child(
    monkeypatch, hostile_python, tmp_path
):
    """The child keeps the worker's stdout and stderr open, so no end of file comes: the worker is found
    dead as it is (not overdue after the silence or the deadline), and its child is stopped with it."""
    monkeypatch.setenv("HOSTILE_MARK", str(tmp_path / "child.pid"))
    backend, model = hostile(monkeypatch, hostile_python, "dies leaving a child", timeout="600")
    with pytest.raises(RemoteFailure, match=r"ended: exit code 3"):
        model(**BATCH)
    assert_stopped(backend)
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + BUSY
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(child), "the worker's child was left running"


def running(pid):
    """Whether process ``pid`` runs (a zombie waiting for its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def test_a_worker_that_floods_stderr_costs_a_bounded_tail(monkeypatch, hostile_python):
    """200 MB on stderr: the caller keeps the last STDERR_TAIL_BYTES, and the message quotes a short line."""
    backend, model = hostile(monkeypatch, hostile_python, "floods stderr")
    kept = sum(len(chunk) for chunk in backend.worker.stderr_tail)
    assert kept <= channel.STDERR_TAIL_BYTES + (1 << 16)
    backend.worker.process.kill()
    with pytest.raises(RemoteFailure) as caught:
        model(**BATCH)
    assert len(str(caught.value)) < 1000 and "the last line before the reply" in str(caught.value)


def test_the_users_error_in_a_worker_is_the_users_error_here(monkeypatch, hostile_python):
    _, model = hostile(monkeypatch, hostile_python, "raises the user's error")
    with pytest.raises(UserCodeError, match="your forward raised ZeroDivisionError") as caught:
        model(**BATCH)
    assert caught.value.error is None  # the original exception stayed in the worker


@runs_here("torch")
def test_an_optimizer_state_the_worker_forgot_is_refused_where_it_arrives_and_where_it_would_be_saved(
    monkeypatch, hostile_python, tmp_path
):
    from bert_multi.training import TrainingState, save_training_state

    monkeypatch.setenv("HOSTILE_BACKEND", "torch")
    backend, model = hostile(monkeypatch, hostile_python, "forgets the optimizer state")
    trainer = backend.Pretrainer(model, optimizer="adam", lr=0.01)
    batch = {**BATCH, "mlm_labels": np.ones_like(BATCH["pred_positions"]), "nsp_labels": np.array([0, 1, 0, 1])}
    trainer.step({**batch, "mlm_weights": np.ones(BATCH["pred_positions"].shape)})
    with pytest.raises(
        RemoteFailure, match=r"reply to 'state' is no state of this trainer: .*no Adam moments for 45 of"
    ):
        trainer.state()
    state = TrainingState(1, CONFIG, WEIGHTS, {}, {"optimizer": "adam"})
    with pytest.raises(ValueError, match="no Adam moments for 45 of the 45 parameters"):
        save_training_state(tmp_path, state)
    assert not (tmp_path / "state.npz").exists()
    save_training_state(tmp_path, state._replace(settings={"optimizer": "sgd"}))  # SGD keeps none


def test_ctrl_c_ends_the_command_and_its_worker_and_leaves_nothing_behind(tmp_path, hostile_python):
    """``conform`` with a backend in a worker that hangs: Ctrl-C ends the command at once (exit 130), the
    worker with it, and removes the worker's directory."""
    missing = "jax" if not_in_process("jax") else "mxnet"
    mark, temporary = tmp_path / "worker.pid", tmp_path / "tmp"
    temporary.mkdir()
    environment = {**os.environ, "HOSTILE_WORKER": "hangs", "HOSTILE_MARK": str(mark), "TMPDIR": str(temporary)}
    environment["PYTHONFAULTHANDLER"] = "1"  # so that a command that does not end can say where it is
    command = [sys.executable, "-m", "bert_multi.cli", "conform", "--backends", f"numpy,{missing}"]
    command += ["--python", f"{missing}={hostile_python}", "--cases", "batch_one", "--dtypes", "float64"]
    # A child inherits an ignored SIGINT (a shell's background job ignores it, and so does all it starts) and
    # Python leaves it ignored; a handler of this process's is the default in the child, as at a terminal.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, handler)
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.1)
    assert mark.exists(), process.communicate()
    worker = int(mark.read_text())
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    try:
        _, stderr = process.communicate(timeout=2 * BUSY)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # its threads' stacks, written by faulthandler
        _, stderr = process.communicate()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker, signal.SIGKILL)
        pytest.fail(f"the command went on for {2 * BUSY} s after Ctrl-C; where it was:\n{stderr[-6000:]}")
    assert time.monotonic() - started < BUSY
    assert process.returncode == 130 and "interrupted" in stderr, stderr
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)
    assert not list(temporary.glob("bert_multi-worker-*"))


@runs_here("torch")
def test_a_trainer_in_a_worker_given_a_shard_and_the_batchs_totals_computes_as_here():
    """Each field of the totals travels as itself: a shard's losses and gradients with the whole batch's
    totals are the same, bit for bit, through a worker of this interpreter as here, and the test is not
    vacuous (the totals with two fields swapped give other numbers)."""
    from bert_multi import BERTConfig
    from bert_multi.spec.loss import BatchTotals
    from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines
    from bert_multi.training.data import shard

    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(100)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 12, 20, 3, 1, max_len=16)
    weights = random_weights(config, seed=6, dtype="float64")
    batch = next(data.batches(8, seed=1))
    part, totals = shard(batch, 1, 2), BatchTotals.of(batch)
    swapped = totals._replace(examples=totals.slots, slots=totals.examples)
    remote_torch = RemoteBackend("torch", Path(sys.executable))
    try:
        for normalization in ("real_slots", "all_slots"):
            here, there = (
                backend.Pretrainer(
                    backend.build(config, weights, dtype="float64"), optimizer="sgd", mlm_normalization=normalization
                )
                for backend in (load_backend("torch"), remote_torch)
            )
            (losses, expected), (their_losses, got) = here.gradients(part, totals), there.gradients(part, totals)
            assert their_losses == losses and all(np.array_equal(got[n], expected[n]) for n in expected)
            other_losses, other = here.gradients(part, swapped)
            assert other_losses != losses and not all(np.array_equal(other[n], expected[n]) for n in expected)
    finally:
        remote_torch.worker.close()


def elsewhere():
    """A built-in backend whose framework this environment lacks, so that it runs in a worker."""
    return "jax" if not_in_process("jax") else "mxnet"


def command_line(hostile_python, mode, *args, backend="numpy"):
    """``bert-multi ARGS`` with the backend of the other environment in a worker that misbehaves."""
    name = elsewhere()
    environment = {**os.environ, "HOSTILE_WORKER": mode, "HOSTILE_BACKEND": backend}
    environment[remote.variable(name)] = str(hostile_python)
    command = [sys.executable, "-m", "bert_multi.cli", *(arg.format(backend=name) for arg in args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)


@runs_here("torch")
def test_pretraining_whose_worker_dies_ends_in_one_line(hostile_python):
    done = command_line(hostile_python, "dies", "pretrain", "--backend", "{backend}", "--steps", "2", backend="torch")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line == f"bert-multi: error: the worker ({hostile_python}) ended: the worker's last words"
    assert "Traceback" not in done.stderr


@runs_here("torch")
def test_a_bug_in_a_worker_is_reported_as_a_bug_here_in_one_line_with_its_traceback_kept(hostile_python):
    done = command_line(
        hostile_python, "raises a bug", "pretrain", "--backend", "{backend}", "--steps", "2", backend="torch"
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert "Traceback" not in done.stderr and line.startswith("bert-multi: error: an internal error, a bug"), line
    assert f"the worker ({hostile_python}) raised KeyError: 'no such optimizer slot'" in line
    report = Path(re.search(r"its traceback is in (\S+):", line)[1])
    kept = report.read_text()
    report.unlink()
    assert "in the worker:\nTraceback" in kept and "raise KeyError" in kept


@runs_here("torch")
def test_an_error_carried_from_a_worker_is_one_bounded_line(hostile_python):
    command = ("pretrain", "--backend", "{backend}", "--steps", "2")
    done = command_line(hostile_python, "raises a long error", *command, backend="torch")
    assert done.returncode == 2, done.stderr[-500:]
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("bert-multi: error: the first line / and another line / and another line")
    assert len(done.stderr) < errors.MAX_CARRIED_CHARACTERS + 1000 and line.endswith("more characters)")


def test_a_conversion_check_whose_worker_replies_damaged_proves_nothing_either_way(hostile_python, tmp_path):
    from bert_multi import save_weights

    if elsewhere() != "jax":  # the stand-in worker runs the oracle: it writes no .params, which MXNet writes
        pytest.skip("needs JAX in the other environment: a Flax file is written here, whoever runs it")
    save_weights(tmp_path / "w.npz", CONFIG, WEIGHTS)
    out = tmp_path / "out.msgpack"
    done = command_line(hostile_python, "replies with garbage", "convert", str(tmp_path / "w.npz"), str(out), "--check")
    assert done.returncode == 2, done.stdout + done.stderr
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith(f"{out} was not checked in full: ") and "is damaged" in verdict, done.stdout
    assert "does NOT compute" not in done.stdout


# A SIGINT that another thread takes (a worker's reader, a framework's own threads): the main thread, whose
# mask blocks it here so that the kernel must deliver it elsewhere, learns of it only when it next runs
# Python. Each wait of the main thread then ends at once with KeyboardInterrupt, or never.
ELSEWHERE = """
import os, signal, sys, threading, time
from bert_multi import waiting

signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, though this one's parent ignores it
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

def interrupt():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
event, condition, endless = threading.Event(), threading.Condition(), threading.Thread(target=time.sleep, args=(60,))
endless.start()

def until():
    with condition:
        waiting.wait_until(condition, event.is_set)

waits = {"wait": lambda: waiting.wait(event), "join": lambda: waiting.join(endless), "wait_until": until,
         "plain wait": event.wait}
try:
    waits[sys.argv[1]]()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    os._exit(0)
"""


@pytest.mark.parametrize("how", ["wait", "join", "wait_until", "plain wait"])
def test_a_wait_on_the_main_thread_ends_at_ctrl_c_whichever_thread_takes_the_signal(how):
    command = [sys.executable, "-c", ELSEWHERE, how]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, env=environment)
    except subprocess.TimeoutExpired:
        assert how.startswith("plain"), f"waiting.{how} went on after Ctrl-C"
        return  # Python's own waits do not end: the case these are for
    assert not how.startswith("plain"), "Python's own wait ended: this test no longer shows the case"
    assert done.stdout == "interrupted\n", done.stderr
