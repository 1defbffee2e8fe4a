"""The backend registry: backends registered in code, each optional capability's default, and the rules
for names and options. (Backends installed through the ``bert_multi.backends`` entry-point group:
``conformance/test_contract.py``.)"""

import dataclasses
import os
import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from bert_multi import (
    BUILD_OPTIONS,
    CONFIGS,
    BackendContractError,
    CannotRunHere,
    load_backend,
    random_weights,
    register_backend,
    unregister_backend,
)

CONFIG = CONFIGS["tiny"]


@pytest.fixture
def registered():
    names = []

    def add(backend):
        names.append(backend.NAME)
        return register_backend(backend)

    yield add
    for name in names:
        unregister_backend(name)


def oracle_build(config, weights, device="cpu", dtype="float64", gradients=True):
    return load_backend("numpy").build(config, weights, device, dtype)


def test_a_backend_of_a_name_and_a_build_gets_every_default(registered):
    backend = registered(SimpleNamespace(NAME="minimal", build=oracle_build))
    assert (backend.role, backend.label, backend.supports(CONFIG), backend.devices()) == (
        "framework",
        "minimal",
        None,
        ["cpu"],
    )
    assert backend.kernel_eps(1e-5) == 1e-5 and backend.name_rules == [] and not backend.can_train
    assert backend.end_worker(3) == 3 and backend.synchronize() is None
    assert np.array_equal(backend.gemm("float32", 4, 3, 2)(), np.full((4, 2), 3.0))
    weights = random_weights(CONFIG)
    for call, missing in (
        (lambda: backend.trainer(backend.build(CONFIG, weights)), "cannot train"),
        (lambda: backend.train_data_parallel(2), "has no data-parallel workers"),
        (lambda: backend.join_data_parallel(), "has no data-parallel workers"),
        (lambda: backend.save_checkpoint("x.pt", CONFIG, weights), "writes no checkpoint format of its own"),
        (lambda: backend.read_checkpoint("x.pt"), "reads no checkpoint format of its own"),
    ):
        with pytest.raises(ValueError, match=f"backend 'minimal' {missing}"):
            call()


def test_standard_options_are_taken_dropped_or_refused_by_one_rule(registered):
    seen = []

    def build(config, weights, device="cpu", dtype="float64", gradients=True, **options):
        seen.append(options)
        return oracle_build(config, weights, device, dtype)

    narrow = registered(SimpleNamespace(NAME="narrow", build=oracle_build))
    wide = registered(SimpleNamespace(NAME="wide", build=build))
    weights = random_weights(CONFIG)
    # Permissions ("may share", "need not keep gradients") and defaults are dropped where not taken ...
    narrow.build(CONFIG, weights, share=True, gradients=False, tf32=False, compile=True, optimize=True)
    # ... a demand a backend cannot meet is "cannot run here", and a name no backend knows is an error.
    with pytest.raises(CannotRunHere, match="backend 'narrow' has no 'tf32' option"):
        narrow.build(CONFIG, weights, tf32=True)
    with pytest.raises(
        ValueError,
        match=rf"unknown build option 'hybridize'.*{re.escape(str(list(BUILD_OPTIONS)))}",
    ):
        narrow.build(CONFIG, weights, hybridize=True)
    with pytest.raises(CannotRunHere, match="backend 'narrow' has no 'mixed_precision' option"):
        narrow.build(CONFIG, weights, mixed_precision="bfloat16")
    wide.build(CONFIG, weights, share=True, tf32=True)
    # A value every backend would refuse is refused for all, before the backend sees it.
    with pytest.raises(ValueError, match=r"mixed precision \(bfloat16\) is for float32 weights, not float64 ones"):
        wide.build(CONFIG, weights, dtype="float64", mixed_precision="bfloat16")
    assert seen == [{"share": True, "tf32": True}]


def test_a_build_is_asked_whether_it_supports_the_model_and_must_return_a_model(registered):
    calls = []

    def build(config, weights, device="cpu", dtype="float32"):
        calls.append(config)
        return {"encoded": None}

    picky = registered(SimpleNamespace(NAME="picky", build=build, supports=lambda config, device: "d2l only"))
    with pytest.raises(CannotRunHere, match="backend 'picky': d2l only"):
        picky.build(CONFIG, random_weights(CONFIG))
    assert calls == []
    sloppy = registered(SimpleNamespace(NAME="sloppy", build=build))
    with pytest.raises(
        BackendContractError, match="backend 'sloppy'.s build returned dict, not a bert_multi BackendModel"
    ):
        sloppy.build(CONFIG, random_weights(CONFIG))


def test_registering_refuses_a_taken_name_and_a_nameless_object(registered):
    with pytest.raises(ValueError, match="a backend named 'torch' is already registered"):
        register_backend(SimpleNamespace(NAME="torch", build=oracle_build))
    with pytest.raises(ValueError, match="has no NAME"):
        register_backend(SimpleNamespace(build=oracle_build))
    registered(SimpleNamespace(NAME="twice", build=oracle_build))
    with pytest.raises(ValueError, match="already registered"):
        register_backend(SimpleNamespace(NAME="twice", build=oracle_build))
    with pytest.raises(ValueError, match="'numpy' was not registered in code"):
        unregister_backend("numpy")


def test_an_unknown_name_lists_the_known_ones_and_the_nearest():
    with pytest.raises(ValueError, match=r"unknown backend 'tourch' \(did you mean 'torch'\?\): expected one of"):
        load_backend("tourch")


def test_the_frameworks_are_told_to_share_the_process_unless_the_user_said_otherwise(monkeypatch):
    """JAX would take three quarters of a GPU's memory at its first use, leaving PyTorch in the same
    process a quarter: its registration asks it to allocate as it goes, where the user has not said."""
    from bert_multi.backend.registry import registrations, share_the_process

    assert ("XLA_PYTHON_CLIENT_PREALLOCATE", "false") in registrations()["jax"].process_defaults
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    share_the_process()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    share_the_process()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_a_backend_that_a_worker_runs_starts_loading_while_this_process_imports_its_own(monkeypatch):
    """``load_backends`` starts another environment's worker first, on a thread of its own: a framework
    imported here finds it already starting. Loaded one after the other, in the order asked, the import
    here would wait for it in vain."""
    from bert_multi.backend import registry, remote
    from bert_multi.backend.registrations import Registration

    starting = threading.Event()

    def started_elsewhere(name, environment, unavailable):
        starting.set()
        raise unavailable  # no worker is really started: only the order is looked at

    def imported_here():
        raise ImportError("no such framework" if starting.wait(10) else "the worker was not starting")

    def not_here():
        raise ImportError("no module named 'no_such_framework'")

    monkeypatch.setattr(remote, "load_elsewhere", started_elsewhere)
    known = registry._REGISTRY.all()
    monkeypatch.setitem(known, "here", Registration("here", imported_here, "a test", "code"))
    elsewhere = Registration(
        "there", not_here, "a test", "bert_multi", environment=".venv-other", packages=("no_such_framework",)
    )
    monkeypatch.setitem(known, "there", elsewhere)
    loaded = registry.load_backends(["here", "there"])
    assert "(no such framework)" in str(loaded["here"])
    assert "no_such_framework" in str(loaded["there"]) and starting.is_set()


class EndOfRun(BaseException):
    """What a caller's progress callback raises to end a run early (as gpu-check's budget does)."""


def test_compiling_ahead_starts_as_its_backend_is_loaded_before_the_others_are(registered, monkeypatch):
    """A backend that compiles ahead is asked to as soon as it is loaded: a worker's first work need not
    wait for this process to import its own frameworks (here: one that loads only once it has been asked)."""
    from bert_multi import Target, run_conformance
    from bert_multi.backend import registry
    from bert_multi.backend.registrations import Registration
    from bert_multi.engine.cases import CASES

    asked = threading.Event()
    backend = registered(SimpleNamespace(NAME="prepares", build=oracle_build, prepare=lambda *_: asked.set()))

    def load_once_asked():
        assert asked.wait(10), "compiling ahead was not asked for while the other backends loaded"
        return SimpleNamespace(NAME="loads-late", build=oracle_build)

    late = Registration("loads-late", load_once_asked, "a test", "code")
    monkeypatch.setitem(registry._REGISTRY.all(), "loads-late", late)
    cases = [case.input(CONFIG) for case in CASES[:2]]
    targets = [Target(backend.name, "float64"), Target("loads-late", "float64")]
    report = run_conformance(CONFIG, random_weights(CONFIG), targets, cases, False)
    assert report.passed and not report.errors and not report.skipped


def test_a_dtypes_shapes_are_not_compiled_ahead_while_its_lane_runs_the_dtype_before(registered):
    """Compiling ahead fills a backend's idle time: float32's shapes are asked for before the backend's lane
    begins float64, or once it is done with it, never in between (a worker serves one request at a time,
    so each would hold up one of the run's)."""
    from bert_multi import Target, run_conformance
    from bert_multi.engine.cases import CASES

    events, first_forward, float32_again = [], threading.Event(), threading.Event()

    def prepare(config, groups, dtypes, device):
        if dtypes == ["float32"]:
            if ("prepare", "float32") in events:
                float32_again.set()
            events.append(("prepare", "float32"))
            first_forward.wait(10)  # the next is asked once float64 runs, unless it is held back
        else:
            events.append(("prepare", *dtypes))

    def build(config, weights, device="cpu", dtype="float64", gradients=True):
        model = oracle_build(config, weights, device, dtype)
        forward = model._forward

        def recorded(inputs, intermediates):
            if dtype == "float64" and first_forward.is_set() and events.count(("forward", "float64")) == 1:
                float32_again.wait(0.5)  # time for float32's to be asked, were they not held back
            events.append(("forward", dtype))
            first_forward.set()
            return forward(inputs, intermediates)

        model._forward = recorded
        return model

    backend = registered(SimpleNamespace(NAME="prepares", build=build, prepare=prepare))
    cases = [case.input(CONFIG) for case in CASES]
    targets = [Target(backend.name, dtype) for dtype in ("float32", "float64")]
    assert run_conformance(CONFIG, random_weights(CONFIG), targets, cases, False).passed
    float64 = [at for at, event in enumerate(events) if event == ("forward", "float64")]
    float32_asked = [at for at, event in enumerate(events) if event == ("prepare", "float32")]
    assert len(float32_asked) >= 2, events
    assert not [at for at in float32_asked if float64[0] < at < float64[-1]], events


@pytest.mark.parametrize("ended", ["finished", "stopped"])
def test_compiling_ahead_is_asked_a_group_at_a_time_and_ends_with_the_run(registered, ended, monkeypatch):
    """A backend's ``prepare`` runs on a thread beside the run, one dtype and max_len group per call; once
    the run ends, finished or stopped by an exception, it is asked nothing more, and its thread is over
    before the run returns (a thread still compiling as the process exits can crash it)."""
    from bert_multi import Target, run_conformance
    from bert_multi.engine.cases import CASES
    from bert_multi.engine.lanes import LaneSteps

    config = dataclasses.replace(CONFIG, max_len=128)  # longer than the cases cut to: two groups
    calls, asked, over = [], threading.Event(), threading.Event()
    stop = LaneSteps.stop

    def stop_and_say(self):
        stop(self)
        over.set()

    monkeypatch.setattr(LaneSteps, "stop", stop_and_say)

    def prepare(config, groups, dtypes, device):
        calls.append((len(groups), len(dtypes)))
        asked.set()
        if ended == "stopped":  # at work on its first group until the run is over, however slow the machine
            over.wait(60)

    def progress(*_):
        assert asked.wait(60)  # the run goes on once compiling ahead has begun
        if ended == "stopped":
            raise EndOfRun

    backend = registered(SimpleNamespace(NAME="slow-to-prepare", build=oracle_build, prepare=prepare))
    assert backend.prepares
    cases = [case.input(config) for case in CASES]
    targets = [Target(backend.name, dtype) for dtype in ("float32", "float64")]
    groups = {case.max_len or config.max_len for case in cases}
    assert len(groups) == 2
    before = set(threading.enumerate())
    if ended == "stopped":
        with pytest.raises(EndOfRun):
            run_conformance(config, random_weights(config), targets, cases, False, progress=progress)
        assert len(calls) == 1  # stopped during the first: nothing is asked once the run is over
    else:
        assert run_conformance(config, random_weights(config), targets, cases, False, progress=progress).passed
        assert 1 <= len(calls) <= len(cases) * len(targets)  # a case's group and a dtype each, at most once
    assert set(threading.enumerate()) <= before
    assert set(calls) == {(1, 1)}
