"""Backends in another Python environment: a worker process of that interpreter runs the backend, so one
run compares MXNet (NumPy < 1.24) with JAX (NumPy 2). The mechanism is tested with the oracle run by this
very interpreter, which every machine has; the real pairing where both environments exist."""

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bert_multi import CONFIGS, BERTConfig, CannotRunHere, Target, UsageError, backends, random_weights, run_conformance
from bert_multi.arrays import same_bits
from bert_multi.backend.channel import RemoteBug, Worker
from bert_multi.backend.registry import load_backend, registrations
from bert_multi.backend.remote import RemoteBackend, RemoteFailure
from bert_multi.engine.cases import CASES
from bert_multi.spec.weight_file import load_weights


@pytest.fixture(scope="module")
def remote_oracle():
    """The NumPy oracle, run by a worker of this interpreter."""
    backend = RemoteBackend("numpy", Path(sys.executable))
    yield backend
    backend.worker.close()


def test_a_model_in_a_worker_computes_exactly_what_it_computes_here(remote_oracle):
    config = CONFIGS["tiny"].with_semantics("bert")
    weights = random_weights(config, seed=3, dtype="float64")
    here = load_backend("numpy").build(config, weights)
    there = remote_oracle.build(config, weights)
    assert (there.backend, there.dtype, str(there.device)) == ("numpy", "float64", "cpu")
    for case in CASES:
        batch = case.batch(config, seed=1)
        expected, got = here(**batch, intermediates=True), there(**batch, intermediates=True)
        for name in ("encoded", "mlm", "nsp"):
            if getattr(expected, name) is None:
                assert getattr(got, name) is None, (case.name, name)
            else:
                assert np.array_equal(getattr(got, name), getattr(expected, name)), (case.name, name)
        assert list(got.intermediates) == list(expected.intermediates)
        assert all(np.array_equal(got.intermediates[n], a) for n, a in expected.intermediates.items())
    exported = there.export_weights(share=True)
    assert list(exported) == list(weights) and all(np.array_equal(exported[n], weights[n]) for n in weights)
    assert not any(array.flags.writeable for array in exported.values())
    assert there.runtime_info()["python"] == sys.executable
    assert there.cut(5) is None  # the oracle's models do not cut themselves: the caller builds the shorter one


def test_a_workers_model_writes_its_weight_file_there(remote_oracle, tmp_path, monkeypatch):
    """``save`` on a worker's model: the worker writes the canonical file, so no weights cross between the
    processes, and it reads back here bit for bit."""
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=3, dtype="float32")
    there = remote_oracle.build(config, weights, dtype="float32")
    sent = []
    exchange = Worker.exchange
    monkeypatch.setattr(
        Worker, "exchange", lambda worker, op, *args, **kwargs: sent.append(op) or exchange(worker, op, *args, **kwargs)
    )
    there.save(tmp_path / "weights.npz")
    assert sent == []
    read_config, read = load_weights(tmp_path / "weights.npz")
    assert read_config == config and same_bits(read, weights)


def test_compiling_ahead_lets_the_runs_own_requests_go_first(remote_oracle, monkeypatch):
    """A request made in the background (``prepare``) waits while another is waiting for the worker, so
    that compiling ahead fills the worker's idle time and never holds up the run's own work."""
    worker, asked = remote_oracle.worker, []
    request = Worker._request
    monkeypatch.setattr(Worker, "_request", lambda self, op, line: asked.append(op) or request(self, op, line))
    background = threading.Thread(target=worker.call, args=("kernel_eps",), kwargs={"eps": 1.0, "background": True})
    with worker.turn_for(background=False):  # a request under way
        background.start()
        with worker.turn:
            worker.waiting += 1  # and one of the run's own waiting for it
    time.sleep(0.2)
    assert asked == []  # the worker is free, but a request is waiting: the background one lets it go first
    with worker.turn:
        worker.waiting -= 1
        worker.turn.notify_all()
    background.join()
    assert asked == ["kernel_eps"]


def test_the_worker_raises_bert_multis_own_exceptions_and_shows_others_with_their_traceback(remote_oracle):
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=3, dtype="float64")
    with pytest.raises(CannotRunHere, match="cuda:0"):
        remote_oracle.build(config, weights, device="cuda:0")
    with pytest.raises(UsageError, match="unsupported dtype 'float16'"):
        remote_oracle.build(config, weights, dtype="float16")
    with pytest.raises(RemoteBug, match=r"^the worker \(.*\) raised KeyError: 12345$") as caught:
        remote_oracle.worker.call("forward", model=12345, inputs="none", out="none", intermediates=False)
    assert caught.value.remote_traceback.startswith("Traceback") and "KeyError: 12345" in caught.value.remote_traceback


def test_inputs_are_checked_before_the_worker_sees_them(remote_oracle):
    config = CONFIGS["tiny"]
    model = remote_oracle.build(config, random_weights(config, seed=3, dtype="float64"))
    model.worker = None  # any request would fail with AttributeError
    with pytest.raises(ValueError, match="out of range"):
        model(np.full((1, 3), config.vocab_size), np.zeros((1, 3), int))


def test_a_worker_that_dies_is_an_error_quoting_what_it_said():
    backend = RemoteBackend("numpy", Path(sys.executable))
    backend.worker.process.kill()
    backend.worker.process.wait()
    with pytest.raises(RemoteFailure, match=r"the worker \(.*\) ended: exit code -9"):
        backend.kernel_eps(1e-5)
    backend.worker.close()


def test_the_worker_process_ends_with_its_caller():
    code = (
        "import sys; from pathlib import Path; from bert_multi.backend.remote import RemoteBackend\n"
        "backend = RemoteBackend('numpy', Path(sys.executable)); print(backend.worker.process.pid)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    pid = int(done.stdout.strip())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def run(*args, **environment):
    return subprocess.run(
        [sys.executable, "-m", "bert_multi.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **environment},
    )


def test_a_backend_with_no_environment_is_a_skip_naming_the_command_that_provides_it():
    hidden = "import sys; sys.modules['jax'] = None; from bert_multi.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", hidden, "conform", "--backends", "numpy,jax", "--cases", "batch_one"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BERT_MULTI_PYTHON_JAX": "none"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIP" in done.stdout and registrations()["jax"].install in done.stdout
    assert "BERT_MULTI_PYTHON_JAX" in done.stdout


def test_an_interpreter_that_is_not_there_is_refused_in_one_line():
    done = run("conform", "--backends", "jax", "--python", "jax=/nowhere/python")
    assert done.returncode == 2
    assert "no Python interpreter at /nowhere/python (for backend 'jax')" in done.stderr
    done = run("conform", "--backends", "jax", "--python", "jaxx=/nowhere/python")
    assert done.returncode == 2 and "unknown backend 'jaxx' (did you mean 'jax'?)" in done.stderr


def test_a_configured_interpreter_is_used_where_the_framework_is_missing(tmp_path):
    """BERT_MULTI_PYTHON_<NAME> names the interpreter; here this one, with the framework hidden from the
    caller only, so the worker has it and the caller does not."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import bert_multi as bm\n"
        "backend = bm.load_backend('torch')\n"
        "print(backend.where)\n"
        "config = bm.CONFIGS['tiny']\n"
        "from bert_multi.engine.cases import CASES\n"
        "cases = [case.input(config) for case in CASES]\n"
        "report = bm.run_conformance(config, bm.random_weights(config), [bm.Target('torch', 'float64')], cases)\n"
        "print(report.passed, len(report.checks))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BERT_MULTI_PYTHON_TORCH": sys.executable},
    )
    assert done.returncode == 0, done.stderr
    where, result = done.stdout.splitlines()
    assert (
        where.startswith("bert_multi.torch in ")
        and Path(where.split(" in ")[1]).resolve() == Path(sys.executable).resolve()
    )
    assert result == f"True {len(CASES)}"


def test_mxnet_and_jax_pair_across_their_environments():
    """Whichever environment this is, one of the two runs in the other one's worker, both ways round."""
    status = backends()
    for name in ("mxnet", "jax"):
        if not status[name].available:
            pytest.skip(status[name].reason)
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=5, dtype="float64")
    targets = [Target(name, dtype) for name in ("mxnet", "jax") for dtype in ("float32", "float64")]
    report = run_conformance(config, weights, targets, [case.input(config) for case in CASES])
    assert report.passed, report.failures()
    pairs = {(c.target.backend, c.reference.split()[0]) for c in report.checks if not c.against_oracle}
    assert pairs == {("mxnet", "jax"), ("jax", "mxnet")}
    # Each side's file, written in its own environment's NumPy, reads in the other's bit for bit.
    assert all(", bit-exact" in c.reference for c in report.checks if not c.against_oracle)
    assert any(" in " in load_backend(name).where for name in ("mxnet", "jax"))  # one ran elsewhere


def test_a_workers_model_takes_its_weights_once_and_cuts_the_shorter_model_itself(monkeypatch):
    """A case on a model cut to 64 positions (``max_len``): a worker whose models cut themselves (JAX's) is
    sent each target's weights once, and makes the shorter model from the one it holds."""
    if backends()["jax"].available and load_backend("jax").elsewhere is None:
        pytest.skip("JAX runs in this process here: its models' cut is tested in tests/test_jax_backend.py")
    if not backends()["jax"].available:
        pytest.skip(backends()["jax"].reason)
    asked = []
    call = Worker.call

    def counted(worker, op, **arguments):
        asked.append(op)
        return call(worker, op, **arguments)

    monkeypatch.setattr(Worker, "call", counted)
    config = BERTConfig(vocab_size=23, num_hiddens=12, ffn_num_hiddens=7, num_heads=3, num_blks=1, max_len=70)
    cases = [case.input(config, seed=2) for case in CASES]
    assert len({case.max_len for case in cases}) == 2  # the max_len case runs on a model cut to 64 positions
    weights = random_weights(config, seed=2, dtype="float64")
    report = run_conformance(config, weights, [Target("jax", "float64")], cases, pairs=False)
    assert report.passed and len(report.checks) == len(CASES), report.failures()
    assert (asked.count("build"), asked.count("cut")) == (1, 1)


def test_bad_input_is_refused_the_same_wherever_the_backend_runs(remote_oracle):
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=3, dtype="float64")
    batch = {**CASES[0].batch(config), "valid_lens": np.array([99] * len(CASES[0].batch(config)["tokens"]))}
    errors = []
    for model in (load_backend("numpy").build(config, weights), remote_oracle.build(config, weights)):
        with pytest.raises(ValueError) as caught:
            model(**batch)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


def test_a_trainer_in_a_worker_trains_exactly_as_it_does_here():
    """PyTorch's Pretrainer through a worker of this very interpreter, against the one here: the same
    losses, gradients, optimizer state and weights, bit for bit, and a state taken up there as here."""
    import itertools

    from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

    if not backends()["torch"].available:
        pytest.skip(backends()["torch"].reason)
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(100)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 12, 20, 3, 2, max_len=16, dropout=0.2)
    weights = random_weights(config, seed=6, dtype="float64")
    remote = RemoteBackend("torch", Path(sys.executable))
    assert remote.Pretrainer.MIXED_PRECISION == load_backend("torch").mixed_precisions == ("bfloat16",)
    here, there = (
        backend.Pretrainer(backend.build(config, weights, dtype="float64"), optimizer="adam", lr=0.01)
        for backend in (load_backend("torch"), remote)
    )
    for step, batch in enumerate(itertools.islice(data.batches(8, seed=1), 3), start=1):
        for trainer in (here, there):
            trainer.seed(step)  # dropout is on: the same seed must give the same masks there
        assert here.step(batch) == there.step(batch)
    assert here.loss(batch) == there.loss(batch)
    expected, got = here.gradients(batch)[1], there.gradients(batch)[1]
    assert list(got) == list(weights) and all(np.array_equal(got[n], expected[n]) for n in expected)
    state, their_state = here.state(), there.state()
    assert list(their_state) == list(state) and all(np.array_equal(their_state[k], state[k]) for k in state)
    resumed = remote.Pretrainer(remote.build(config, here.model.export_weights(), dtype="float64"), optimizer="adam")
    resumed.load_state(state, 3)
    assert all(np.array_equal(a, b) for a, b in zip(resumed.state().values(), state.values()))
    final = there.model.export_weights()
    assert all(np.array_equal(final[n], a) for n, a in here.model.export_weights().items())
    with pytest.raises(UsageError, match="start from its own environment: run .*bert-multi pretrain --backend torch"):
        remote.train_data_parallel(2)
    with pytest.raises(UsageError, match="start from its own environment: run .*pretrain --backend torch --join"):
        remote.join_data_parallel(steps=3)
    remote.worker.close()


def test_pretrain_compare_trains_the_frameworks_of_both_environments(capsys):
    """``pretrain --compare`` from either environment trains PyTorch, MXNet and JAX, one of them in the
    other environment's worker, from the same weights and batches: float64 SGD, at a learning rate a C
    float holds (MXNet passes it as one), ends with the same weights to 1e-9."""
    from bert_multi.cli import main

    status = backends()
    for name in ("torch", "mxnet", "jax"):
        if not status[name].available:
            pytest.skip(status[name].reason)
    model = "--num-hiddens 16 --ffn-num-hiddens 24 --max-len 32".split()
    command = "pretrain --compare --steps 3 --batch-size 16 --dtype float64 --optimizer sgd --lr 0.125".split()
    assert main(command + model) == 0
    printed = capsys.readouterr().out
    assert "step  torch loss  mxnet loss  jax loss  largest difference" in printed
    gaps = [float(gap) for gap in re.findall(r"their weights after 3 steps differ by (\S+), ", printed)]
    assert len(gaps) == 2 and max(gaps) <= 1e-9, printed  # measured 1.7e-11 (.venv-numpy2), 3.0e-10 (.venv)


def test_mxnet_and_jax_gradients_agree_across_their_environments():
    """float64 gradients of d2l's pretraining loss, MXNet's autograd against JAX's, one of them in the other
    environment's worker; each also against the gradient oracle (tests/test_backward.py)."""
    from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

    status = backends()
    for name in ("mxnet", "jax"):
        if not status[name].available:
            pytest.skip(status[name].reason)
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(100)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 12, 20, 3, 2, max_len=16)
    weights = random_weights(config, seed=7, dtype="float64")
    batch = next(data.batches(8, seed=2))
    found = {
        name: load_backend(name).trainer(load_backend(name).build(config, weights, dtype="float64")).gradients(batch)
        for name in ("mxnet", "jax")
    }
    (mxnet_losses, from_mxnet), (jax_losses, from_jax) = found["mxnet"], found["jax"]
    assert np.allclose(mxnet_losses, jax_losses, rtol=0, atol=1e-12)
    assert list(from_mxnet) == list(from_jax) == list(weights)
    worst = max(float(np.abs(from_mxnet[name] - from_jax[name]).max()) for name in weights)
    # measured 4.2e-13: MXNet normalises with a C-float epsilon (PyTorch and JAX agree to 3.3e-16)
    assert 0 < max(float(np.abs(g).max()) for g in from_jax.values()) and worst <= 1e-9, worst


# --- Which environment runs which tests (conftest.py) ------------------------------------------------------


class Collected:
    """What conftest's collection hook reads of a test: its id, its parameters and the marks it is given."""

    def __init__(self, nodeid, once=False, subject=None, **params):
        self.nodeid, self.marks, self.once, self.subject = nodeid, [], once, subject
        if params:
            self.callspec = type("CallSpec", (), {"params": params})()

    def add_marker(self, mark):
        self.marks.append(mark)

    def get_closest_marker(self, name):
        return pytest.mark.once if name == "once" and self.once else None

    def iter_markers(self, name):
        return [pytest.mark.subject(self.subject)] if name == "subject" and self.subject else []


def test_a_run_told_that_pytorchs_tests_run_elsewhere_skips_those_alone(monkeypatch):
    import conftest

    def skipped_when_told(setting: str) -> dict[str, list[str]]:
        items = {
            "alone": Collected("tests/test_a.py::test[torch]", framework="torch", dtype="float32"),
            "paired": Collected("tests/test_a.py::test[torch-jax]", first="torch", second="jax"),
            "its file": Collected("tests/test_torch_backend.py::test"),
            "a users model of it": Collected("tests/test_b.py::test_port", subject="torch"),
            "a users model of another": Collected("tests/test_b.py::test_flax_port", subject="jax"),
            "the core": Collected("tests/test_a.py::test"),
            "another": Collected("tests/test_a.py::test[jax]", framework="jax"),
            "the same everywhere": Collected("tests/test_b.py::test", once=True),
        }
        monkeypatch.setenv(conftest.TESTED_ELSEWHERE, setting)
        conftest.pytest_collection_modifyitems(config, list(items.values()))
        return {name: [mark.kwargs["reason"] for mark in item.marks] for name, item in items.items() if item.marks}

    config = type("Config", (), {"getoption": staticmethod(lambda name: "")})()
    torchs = {name: ["torch: run in .venv (make test)"] for name in ("alone", "its file", "a users model of it")}
    assert skipped_when_told("torch=.venv") == torchs
    once = {"the same everywhere": ["once: run in .venv (make test)"]}
    assert skipped_when_told("torch=.venv,once=.venv") == {**torchs, **once}
    assert skipped_when_told("") == {}
    monkeypatch.setenv(conftest.TESTED_ELSEWHERE, "torchh=.venv")
    with pytest.raises(pytest.UsageError, match="expected NAME=ENVIRONMENT"):
        conftest.pytest_collection_modifyitems(config, [])
