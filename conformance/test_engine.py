"""The machinery that decides PASS must be able to say FAIL: pairing, weight transfer, the oracle at
each backend's own LayerNorm eps, and missing activations, each checked with fake backends.

A fake backend is the NumPy oracle with one known defect (an output nudged, weights exported wrong, a
different eps, an activation not recorded). Each test states what the engine must conclude about it;
a one-line slip in the engine (comparing a backend with itself, rebuilding from the original weights
instead of the exported ones, caching the oracle without its eps) makes one of them fail.
"""

import dataclasses
import re
import threading
import tracemalloc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from bert_multi import BERTConfig, BERTOutput, CannotRunHere, load_backend, random_weights
from bert_multi.backend import registry
from bert_multi.backend.oracle import LAYER_NORM_EPS, NumpyBERT
from bert_multi.engine import lanes as engine_lanes
from bert_multi.engine.cases import CASES, CaseInput, get_case
from bert_multi.engine.conform import run_conformance
from bert_multi.engine.report import failure_details, summary_table
from bert_multi.engine.results import Target, assert_conforms
from bert_multi.errors import InputError

CONFIG = BERTConfig(vocab_size=23, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=2, max_len=12)
WEIGHTS = random_weights(CONFIG, seed=11, dtype="float64")
CASE_LIST = [(case.name, case.batch(CONFIG, seed=11)) for case in CASES[:4]]


def fake_backend(name, eps=LAYER_NORM_EPS, nudge_nsp=0.0, nudge_export=0.0, forget=None, silent=False, fail=None):
    """The oracle at LayerNorm ``eps``, with NSP logits moved by ``nudge_nsp``, ``nudge_export`` added to
    one exported tensor, the activation ``forget`` never recorded (with ``silent``, none at all), and
    ``fail`` raised by a forward on 2-D valid_lens."""

    class Fake(NumpyBERT):
        backend = name

        def _forward(self, inputs, intermediates):
            if fail is not None and inputs.valid_lens is not None and inputs.valid_lens.ndim == 2:
                raise fail
            out = super()._forward(inputs, intermediates)
            if forget and out.intermediates is not None:
                out.intermediates[forget] = None
            recorded = None if silent else out.intermediates
            return BERTOutput(out.encoded, out.mlm, out.nsp + nudge_nsp, recorded)

        def export_weights(self, share=False):
            weights = super().export_weights(share)
            weights["nsp.output.bias"] = weights["nsp.output.bias"] + nudge_export
            return weights

    def build(config, weights, device="cpu", dtype="float64", gradients=True, share=False):
        oracle = load_backend("numpy").build(config, weights, device, dtype, layer_norm_eps=eps, share=share)
        return Fake(config, oracle.weights, oracle.dtype, eps)

    return SimpleNamespace(NAME=name, kernel_eps=lambda stated: eps, build=build)


@pytest.fixture
def register(monkeypatch):
    """Register fake backends as any package registers its own (``register_backend``), for the test's
    duration; a built-in name (the oracle's) is swapped for the fake meanwhile."""
    added = []

    def add(backend):
        if backend.NAME in registry.registrations() and backend.NAME not in added:
            builtin = registry.registrations()[backend.NAME]
            monkeypatch.setitem(registry._REGISTRY.loaded, backend.NAME, registry.LoadedBackend(builtin, backend))
        else:
            registry.register_backend(backend)
            added.append(backend.NAME)

    yield add
    for name in added:
        registry.unregister_backend(name)


def run(*backends):
    return run_conformance(CONFIG, WEIGHTS, [Target(b, "float64") for b in backends], CASE_LIST)


def checks(report, target, against_oracle):
    return [c for c in report.checks if c.target.backend == target and c.against_oracle == against_oracle]


def test_a_pair_is_compared_with_the_other_backend_not_with_itself(register):
    register(fake_backend("nudged", nudge_nsp=1e-7))  # 100x the float64 tolerance
    report = run("numpy", "nudged")
    assert all(c.passed for c in checks(report, "numpy", against_oracle=True))
    assert not any(c.passed for c in checks(report, "nudged", against_oracle=True))
    pair_checks = [c for c in report.checks if not c.against_oracle]
    assert len(pair_checks) == 2 * len(CASE_LIST)
    for check in pair_checks:  # both directions see the other side's nudge
        assert not check.passed and check.first_divergence.name == "nsp", check.reference
        assert check.reference.startswith("nudged" if check.target.backend == "numpy" else "numpy")


@pytest.mark.parametrize("order", ["leaky first", "leaky second"])
def test_pairs_rebuild_from_the_weights_the_other_backend_exported(register, order):
    """A backend whose forward is right but whose export is wrong passes against the oracle; only a
    pair that really moves its exported weights into the other backend can see it."""
    register(fake_backend("leaky", nudge_export=1e-3))
    names = ("leaky", "numpy") if order == "leaky first" else ("numpy", "leaky")
    report = run(*names)
    assert all(c.passed for c in report.checks if c.against_oracle)
    rebuilt_from_leaky = [c for c in report.checks if not c.against_oracle and c.reference.startswith("leaky")]
    assert rebuilt_from_leaky and not any(c.passed for c in rebuilt_from_leaky)
    how = "memory" if order == "leaky first" else "file"  # the first target's weights move in memory
    assert all(f"(weights via {how}" in c.reference for c in rebuilt_from_leaky)
    assert all(c.first_divergence.name == "nsp" for c in rebuilt_from_leaky)


def test_a_file_two_pairs_are_rebuilt_from_is_read_once_when_it_holds_the_runs_weights(register, monkeypatch):
    """Three targets: the second's file is read for one pair, the third's for two. Read once and found
    bit-exact, a file stands for the run's weights for its next pair; one that is not is read again."""
    read = []
    load = engine_lanes.load_weights
    monkeypatch.setattr(engine_lanes, "load_weights", lambda path: read.append(path) or load(path))
    register(fake_backend("second"))
    register(fake_backend("third"))
    report = run("numpy", "second", "third")
    assert report.passed and len(read) == 2 and len(set(read)) == 2
    pairs = [c for c in report.checks if not c.against_oracle]
    assert len(pairs) == 6 * len(CASE_LIST) and all(", bit-exact" in c.reference for c in pairs)
    register(fake_backend("leaky", nudge_export=1e-3))  # its file is not the run's weights: each pair reads it
    read.clear()
    report = run("numpy", "second", "leaky")
    assert len(read) == 3 and len(set(read)) == 2
    from_leaky = [c for c in report.checks if c.reference.startswith("leaky float64 cpu (weights via file)")]
    assert len(from_leaky) == 2 * len(CASE_LIST) and not any(c.passed for c in from_leaky)


@pytest.mark.parametrize("exact", [True, False])
def test_a_workers_file_is_read_back_here_as_it_is_written_and_its_pairs_read_it_only_if_not_exact(
    register, monkeypatch, exact
):
    """A worker's model holds no memory here, so its file is read back at once, on a thread beside the run:
    found bit-exact, it stands for the run's weights for both pairs rebuilt from it, which read nothing;
    one that is not is read again by each of them (and its pairs fail)."""
    read = []
    load = engine_lanes.load_weights

    def recorded(path):
        read.append((path.name, threading.current_thread() is threading.main_thread()))
        return load(path)

    monkeypatch.setattr(engine_lanes, "load_weights", recorded)
    register(fake_backend("second"))
    worker_like = fake_backend("worker-like", nudge_export=0.0 if exact else 1e-3)
    worker_like.ENVIRONMENT = "/elsewhere/bin/python"  # run by a worker: on a lane of its own
    register(worker_like)
    report = run("numpy", "second", "worker-like")
    from_worker = [c for c in report.checks if c.reference.startswith("worker-like float64 cpu (weights via file")]
    assert len(from_worker) == 2 * len(CASE_LIST)
    its_reads = [here for name, here in read if name.startswith("worker-like")]
    if exact:
        assert report.passed and its_reads == [False] and all(", bit-exact" in c.reference for c in from_worker)
    else:
        assert its_reads == [False, True, True] and not any(c.passed for c in from_worker)


def test_each_backend_is_held_to_the_oracle_at_its_own_layer_norm_eps(register):
    register(fake_backend("eps-1e-3", eps=1e-3))
    report = run("numpy", "eps-1e-3")
    oracle_checks = [c for c in report.checks if c.against_oracle]
    assert oracle_checks and all(c.passed for c in oracle_checks)
    assert {c.reference for c in checks(report, "eps-1e-3", against_oracle=True)} == {"oracle (LayerNorm eps 0.001)"}
    # The two oracles really differ, by far more than the tolerance: the labels are not decoration.
    at_own, at_default = (
        load_backend("numpy").build(CONFIG, WEIGHTS, layer_norm_eps=eps)(**CASE_LIST[0][1]) for eps in (1e-3, 1e-5)
    )
    assert np.abs(at_own.encoded - at_default.encoded).max() > 1e-6
    # Pairs remove that known difference, and so pass, and say so.
    pair_checks = [c for c in report.checks if not c.against_oracle]
    assert pair_checks and all(c.passed for c in pair_checks)
    assert all(c.reference.endswith(", LayerNorm eps corrected)") for c in pair_checks)


def test_the_eps_correction_cannot_hide_a_real_difference(register):
    register(fake_backend("eps-and-nudge", eps=1e-3, nudge_nsp=1e-7))
    report = run("numpy", "eps-and-nudge")
    pair_checks = [c for c in report.checks if not c.against_oracle]
    assert pair_checks and not any(c.passed for c in pair_checks)
    assert {c.first_divergence.name for c in pair_checks} == {"nsp"}


def test_an_activation_a_backend_never_recorded_is_a_failure_naming_it(register):
    register(fake_backend("forgetful", forget="blks.1.ffn"))
    report = run("forgetful")
    assert not report.passed
    for check in report.checks:
        assert check.first_divergence.name == "blks.1.ffn"
        assert "has no value" in check.first_divergence.describe()
    row = [c for _, _, output, c in report.worst() if output == "intermediates"]
    assert row and not row[0].passed


def test_checks_keep_the_order_asked_for_although_each_dtype_runs_alone(register):
    """The engine runs one dtype at a time to hold fewer models at once; the report must not show it."""
    register(fake_backend("other"))
    targets = [Target("numpy", "float32"), Target("numpy", "float64"), Target("other", "float32")]
    targets.append(Target("other", "float64"))
    cases = CASE_LIST[:2]
    report = run_conformance(CONFIG, WEIGHTS, targets, cases)
    expected = [(str(target), "oracle", name) for target in targets for name, _ in cases]
    for a, b in ((targets[0], targets[2]), (targets[1], targets[3])):  # same-dtype pairs, in target order
        expected += [(str(b), f"{a} (weights via memory, bit-exact)", name) for name, _ in cases]
        expected += [(str(a), f"{b} (weights via file, bit-exact)", name) for name, _ in cases]
    assert [(str(c.target), c.reference, c.case) for c in report.checks] == expected
    without_pairs = run_conformance(CONFIG, WEIGHTS, targets, cases, pairs=False)
    assert [(str(c.target), c.case) for c in without_pairs.checks] == [(e[0], e[2]) for e in expected[:8]]


def test_a_backend_in_a_worker_runs_beside_this_process_and_the_report_is_the_same(register):
    """A backend run by another environment's worker takes its part of the run on a thread of its own,
    from the start: with lanes, this process's first forward here waits for the worker's backend to be
    running one (one after the other, it would wait in vain). The checks, their order and their numbers
    are those of the run made on one thread, and a pair still sees an export that is wrong."""
    running, lanes, seen = threading.Event(), [], set()

    def backend(name, nudge_export=0.0, waits=False):
        fake = fake_backend(name, nudge_export=nudge_export)

        def build(*args, _build=fake.build, **kwargs):
            model = _build(*args, **kwargs)
            forward = model._forward

            def _forward(inputs, intermediates):
                seen.add((name, threading.current_thread() is threading.main_thread()))
                if waits and lanes and not running.wait(timeout=30):
                    raise TimeoutError("the worker's lane never ran beside this one")
                running.set()
                return forward(inputs, intermediates)

            model._forward = _forward
            return model

        fake.build = build
        return fake

    register(backend("leaky", nudge_export=1e-3, waits=True))
    worker_like = backend("other")
    register(worker_like)
    targets = [Target(name, "float64") for name in ("numpy", "leaky", "other")]
    one_thread = run_conformance(CONFIG, WEIGHTS, targets, CASE_LIST)
    assert seen == {("leaky", True), ("other", True)}
    worker_like.ENVIRONMENT = "/elsewhere/bin/python"  # the Python a backend run by a worker states
    lanes.append("on"), running.clear(), seen.clear()
    beside = run_conformance(CONFIG, WEIGHTS, targets, CASE_LIST)
    assert not beside.errors, beside.errors
    assert seen == {("leaky", True), ("other", False)}

    def shown(report):
        return [(str(c.target), c.reference, c.case, c.passed, [x.max_abs for x in c.outputs]) for c in report.checks]

    assert shown(beside) == shown(one_thread) and len(beside.checks) == 3 * 4 + 6 * 4
    assert [c.passed for c in beside.checks if c.reference.startswith("leaky")] == [False] * 8


def test_a_lane_that_breaks_ends_the_run_with_its_error_and_no_lane_waits_for_it(register, monkeypatch):
    """The engine's own failure on a worker's lane (not a backend's, which is reported) is raised where
    the run was called, once this process's lane is done: the pairs waiting on the broken lane's target
    go on without it, rather than wait for ever."""

    class Broken(BaseException):
        pass

    worker_like = fake_backend("other")
    worker_like.ENVIRONMENT = "/elsewhere/bin/python"
    register(worker_like)
    run_alone = engine_lanes.Lanes.run_alone

    def breaking(self, target):
        if target.backend == "other":
            raise Broken("the engine's own mistake")
        run_alone(self, target)

    monkeypatch.setattr(engine_lanes.Lanes, "run_alone", breaking)
    with pytest.raises(Broken, match="the engine's own mistake"):
        run("numpy", "other")


def recording_backend(name, seen):
    """The oracle, noting (backend, the model's max_len, T) for each forward, and each model in a
    reference cycle, as every Gluon block is (so only the cycle collector can free it)."""
    real = load_backend("numpy")

    class Recording(NumpyBERT):
        backend = name

        def _forward(self, inputs, intermediates):
            seen.append((name, self.config.max_len, inputs.tokens.shape[1]))
            return super()._forward(inputs, intermediates)

    def build(
        config, weights, device="cpu", dtype="float64", gradients=True, share=False, layer_norm_eps=LAYER_NORM_EPS
    ):
        oracle = real.build(config, weights, device, dtype, layer_norm_eps=layer_norm_eps, share=share)
        model = Recording(config, oracle.weights, oracle.dtype, layer_norm_eps)
        model.itself = model
        return model

    return SimpleNamespace(NAME=name, kernel_eps=lambda stated: stated, build=build)


def test_a_case_with_its_own_max_len_runs_on_the_model_cut_to_it_oracle_included(register):
    """T = max_len is proven on a model cut to a short table, so it costs little at any max_len; every
    model that runs the case, the oracle's too, must really have the case's length as its max_len."""
    seen = []
    for name in ("numpy", "a", "b"):
        register(recording_backend(name, seen))
    cut = dataclasses.replace(CONFIG, max_len=5)
    cases = [*CASE_LIST[:2], CaseInput("max_len", get_case("max_len").batch(cut, seed=11), 5)]
    report = run_conformance(CONFIG, WEIGHTS, [Target("a", "float64"), Target("b", "float64")], cases)
    assert report.passed and len(report.checks) == 3 * 4  # each target alone, then both directions of the pair
    assert report.cut == {"max_len": 5} and report.to_json()["cut_max_len"] == {"max_len": 5}
    assert {(max_len, T) for _, max_len, T in seen} == {(CONFIG.max_len, CASE_LIST[0][1]["tokens"].shape[1]), (5, 5)}
    assert {name for name, max_len, _ in seen if max_len == 5} == {"numpy", "a", "b"}


@pytest.mark.parametrize("exact, builds", [(True, 8), (False, 16)])
def test_each_model_is_freed_before_the_next_is_built(register, monkeypatch, exact, builds):
    """One model at a time, even one the cycle collector alone can free: the chapter's float64 model
    is 196 MB. A pair whose weights arrive bit-exact builds no model; made to rebuild, each pair builds
    its own."""
    if not exact:
        monkeypatch.setattr(engine_lanes, "same_bits", lambda given, expected: False)
    alive, most = weakref.WeakSet(), []
    seen = []
    for name in ("a", "b"):
        backend = recording_backend(name, seen)

        def build(*args, _build=backend.build, **kwargs):
            most.append(len(alive))  # models still alive as this one is built
            model = _build(*args, **kwargs)
            alive.add(model)
            return model

        backend.build = build
        register(backend)
    cut = dataclasses.replace(CONFIG, max_len=5)
    cases = [*CASE_LIST[:2], CaseInput("max_len", get_case("max_len").batch(cut, seed=11), 5)]
    targets = [Target(name, dtype) for dtype in ("float32", "float64") for name in ("a", "b")]
    assert run_conformance(CONFIG, WEIGHTS, targets, cases).passed
    assert len(most) == builds and max(most) == 0


def test_a_target_that_cannot_build_here_is_skipped_and_its_neighbours_still_pair(register):
    """Targets are built in order, each pair's b rebuilt from a's export before b runs alone: a target
    in the middle that cannot be built here is a SKIP with its reason, and the two around it still pair."""

    def unbuildable(*args, **kwargs):
        raise CannotRunHere("device cuda:0 asked for, but there is none here")

    register(SimpleNamespace(NAME="absent", kernel_eps=lambda stated: stated, build=unbuildable))
    register(fake_backend("other"))
    targets = [Target("numpy", "float64"), Target("absent", "float64"), Target("other", "float64")]
    report = run_conformance(CONFIG, WEIGHTS, targets, CASE_LIST[:2])
    assert report.skipped == {targets[1]: "device cuda:0 asked for, but there is none here"}
    names = [name for name, _ in CASE_LIST[:2]]
    expected = [(str(t), "oracle", name) for t in (targets[0], targets[2]) for name in names]
    expected += [(str(targets[2]), f"{targets[0]} (weights via memory, bit-exact)", name) for name in names]
    expected += [(str(targets[0]), f"{targets[2]} (weights via file, bit-exact)", name) for name in names]
    assert [(str(c.target), c.reference, c.case) for c in report.checks] == expected and report.passed


def test_the_run_leaves_the_garbage_collector_as_it_found_it(register):
    """The engine freezes the objects that exist before it runs, to collect each dropped model quickly,
    and must hand the collector back as it was: nothing frozen after a run that found nothing frozen,
    and a caller's frozen objects still frozen (here, garbage that only unfreezing would let go)."""
    import gc

    class Node:
        pass

    register(fake_backend("other"))
    run("numpy", "other")
    assert gc.get_freeze_count() == 0
    node = Node()
    node.itself = node  # a cycle: only the collector can free it, and not while it is frozen
    alive = weakref.ref(node)
    gc.freeze()
    try:
        del node
        run("numpy", "other")
        gc.collect()
        assert alive() is not None and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    gc.collect()
    assert alive() is None  # the check above could fail: unfrozen, the node is collected


def traced(*args, **kwargs):
    """``run_conformance``'s report, and the peak of the memory allocated while it ran, as far as
    ``tracemalloc`` sees: every NumPy array, so every copy a run of NumPy-array models makes."""
    tracemalloc.start()
    try:
        return run_conformance(*args, **kwargs), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("exact", [True, False])
def test_a_run_holds_as_few_copies_of_the_weights_as_the_frameworks_allow(register, monkeypatch, exact):
    """Built with ``share`` and exporting with it, a model that can keep the weights it is given (torch)
    costs no copy and one that cannot (Gluon) costs one: in the default order (torch first) a pair holds
    one set of weights beyond the caller's, not three (the chapter's float64 model is 196 MB a set). In
    the other order the Gluon-like model's file is read, one set: it is rebuilt from it, a copy, only
    where the weights do not arrive bit-exact (made so here), two sets. NumPy's allocations are traced,
    so with models of NumPy arrays the peak counts every copy the engine makes; a positional table of
    100,000 rows makes the weights dwarf the cases' activations."""
    if not exact:
        monkeypatch.setattr(engine_lanes, "same_bits", lambda given, expected: False)
    real = load_backend("numpy")

    def numpy_backend(name, copies, kernel_eps):
        def build(config, weights, device="cpu", dtype="float64", gradients=True, share=False):
            eps = kernel_eps(config.semantics.layer_norm_eps)
            shared = share and not copies
            return real.build(config, weights, device, dtype, layer_norm_eps=eps, gradients=gradients, share=shared)

        return SimpleNamespace(NAME=name, kernel_eps=kernel_eps, build=build)

    register(numpy_backend("lender", copies=False, kernel_eps=lambda stated: stated))
    # As Gluon's: parameters always copied, and LayerNorm's eps a C float, so the oracle runs at two.
    register(numpy_backend("copier", copies=True, kernel_eps=lambda stated: float(np.float32(stated))))
    config = dataclasses.replace(CONFIG, max_len=100_000)
    weights = random_weights(config, seed=11, dtype="float64")
    size = sum(array.nbytes for array in weights.values())
    cases = [(case.name, case.batch(CONFIG, seed=11)) for case in CASES[:4]]
    for order, sets in ((("lender", "copier"), 1), (("copier", "lender"), 1 if exact else 2)):
        report, peak = traced(config, weights, [Target(name, "float64") for name in order], cases)
        assert report.passed and len(report.checks) == 4 * 4
        assert sets * size < peak < (sets + 0.5) * size, order  # the copies, and little else


def test_weights_from_a_source_are_asked_for_per_dtype_and_held_one_dtype_at_a_time(register):
    """Given a function of the dtype instead of a dict, the run asks for the float64 weights once (the
    oracle's outputs, then the float64 targets) and casts them for float32, letting each tensor go once
    cast, so that it never holds the float64 weights while float32 runs: as the float32 model is built
    it holds the float32 set (0.5 of a float64 set here; with both it would be 1.5), and its peak is a
    float64 set and the cast of its largest tensor, the positional table (nearly all of it here). The
    report is the one the dict gives, in the order asked for."""
    real = load_backend("numpy")
    held = {}  # the memory traced as each dtype's model is built

    def build(config, weights, device="cpu", dtype="float64", gradients=True, share=False):
        held.setdefault(dtype, tracemalloc.get_traced_memory()[0])
        return real.build(config, weights, device, dtype, gradients=gradients, share=share)

    register(SimpleNamespace(NAME="lender", build=build))
    config = dataclasses.replace(CONFIG, max_len=100_000)
    drawn = random_weights(config, seed=11, dtype="float64")  # before tracing: each call's copy is traced
    size = sum(array.nbytes for array in drawn.values())
    asked = []

    def source(dtype):
        asked.append(dtype)
        return {name: array.astype(dtype) for name, array in drawn.items()}

    targets = [Target("lender", "float32"), Target("lender", "float64")]
    cases = [(case.name, case.batch(CONFIG, seed=11)) for case in CASES[:4]]
    streamed, peak = traced(config, source, targets, cases)
    assert asked == ["float64"]
    largest = max(array.nbytes for array in drawn.values())
    assert size < held["float64"] < 1.25 * size and 0.5 * size < held["float32"] < 0.75 * size
    assert peak < size + 0.5 * largest + 0.25 * size
    given = run_conformance(config, source("float64"), targets, cases)
    assert streamed.passed and len(streamed.checks) == len(given.checks) == 2 * 4
    assert [(row[:3], row[3].max_abs) for row in streamed.worst()] == [
        (row[:3], row[3].max_abs) for row in given.worst()
    ]


def test_outputs_are_kept_only_for_a_pair_to_compare_with(register):
    """A target's outputs, intermediates included, are as large as the oracle's: they are kept only
    while a pair of it is still to be compared (with them, or with the other side's where the weights
    arrive bit-exact and they stand for the rebuilt model's). With MLM logits over a
    50,000-token vocabulary the outputs dwarf the weights, 24 cases dwarf what one case needs while it
    runs, and NumPy's allocations are traced."""
    register(fake_backend("other"))
    config = dataclasses.replace(CONFIG, vocab_size=50_000)
    weights = random_weights(config, seed=11, dtype="float64")
    cases = [(f"{case.name}_{seed}", case.batch(config, seed=seed)) for case in CASES[:4] for seed in range(6)]
    oracle = load_backend("numpy").build(config, weights)
    outputs = [oracle(**batch, intermediates=True) for _, batch in cases]
    size = sum(a.nbytes for out in outputs for a in (out.encoded, out.mlm, out.nsp, *out.intermediates.values()))
    both = [Target(name, dtype) for dtype in ("float32", "float64") for name in ("numpy", "other")]
    # (targets, pairs, how many sets of float64 outputs are held at the peak: the oracle's, and those of
    # the targets of a pair still to be compared: a target's go once the last pair of it is done)
    for targets, pairs, sets in (([both[2]], True, 1), (both[2:], False, 1), (both, True, 3)):
        report, peak = traced(config, weights, targets, cases, pairs=pairs)
        assert report.passed
        assert sets * size < peak < (sets + 0.5) * size, (targets, pairs)  # and what one case needs


# --- What a run reports, clause by clause: each test fails if its clause is loosened ------------------


def test_an_unknown_name_or_a_bad_input_is_an_error_before_anything_runs(register):
    built = []
    backend = fake_backend("counted")
    backend.build = lambda *args, _build=backend.build, **kwargs: built.append(1) or _build(*args, **kwargs)
    register(backend)
    for targets, message in (
        (
            [Target("counted", "float64"), Target("tourch", "float64")],
            "unknown backend 'tourch' (did you mean 'torch'?)",
        ),
        ([Target("counted", "float16")], "unknown dtype 'float16'"),
        ([Target("counted", "float64", "tpu")], "unknown device 'tpu'"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            run_conformance(CONFIG, WEIGHTS, targets, CASE_LIST)
    bad = {**CASE_LIST[0][1], "tokens": CASE_LIST[0][1]["tokens"] + CONFIG.vocab_size}
    with pytest.raises(InputError, match="case 'bad': tokens.* is out of range"):
        run_conformance(CONFIG, WEIGHTS, [Target("counted", "float64")], [CASE_LIST[1], ("bad", bad)])
    assert built == []


def test_a_backend_that_raises_is_a_failure_showing_it_and_the_others_still_run(register):
    def broken(config, weights, device="cpu", dtype="float64", gradients=True, share=False):
        raise ValueError("a bug in the backend")  # not CannotRunHere: a failure, never a SKIP

    register(SimpleNamespace(NAME="broken", build=broken))
    register(fake_backend("other"))
    report = run("numpy", "broken", "other")
    assert not report.passed and not report.skipped
    (error,) = report.errors
    assert error.target == Target("broken", "float64") and error.during.startswith("building its model")
    assert error.error.startswith("ValueError: a bug in the backend (raised at test_engine.py:")
    assert {c.target.backend for c in report.checks} == {"numpy", "other"} and all(c.passed for c in report.checks)
    assert "ERROR: ValueError: a bug in the backend" in summary_table(report)
    assert failure_details(report).startswith("ERROR broken float64 cpu, building its model")
    assert report.to_json()["errors"][0]["target"] == "broken float64 cpu" and not report.to_json()["passed"]


def test_a_forward_that_raises_is_a_failure_naming_its_case(register):
    register(fake_backend("flaky", fail=RuntimeError("kernel crashed")))
    report = run("flaky")
    assert not report.passed
    (error,) = report.errors
    assert error.during == "running case valid_lens_2d" and "RuntimeError: kernel crashed" in error.error


def test_activations_asked_for_and_never_recorded_are_a_failure(register):
    register(fake_backend("silent", silent=True))
    report = run("silent")
    assert report.checks and not report.passed
    for check in report.checks:
        (comparison,) = check.intermediates
        assert comparison.name == "intermediates" and not comparison.passed
        assert "the compared side recorded no activations" in comparison.describe()
    oracle = load_backend("numpy").build(CONFIG, WEIGHTS)
    with_them, without = oracle(**CASE_LIST[0][1], intermediates=True), oracle(**CASE_LIST[0][1])
    with pytest.raises(AssertionError, match="recorded no activations"):
        assert_conforms(without, with_them, "float64")
    with pytest.raises(AssertionError, match="the reference recorded no activations"):
        assert_conforms(with_them, without, "float64")
    assert_conforms(without, without, "float64")  # asked for on neither side: the outputs alone


def test_a_run_that_checked_nothing_has_not_passed(register):
    def absent(config, weights, device="cpu", dtype="float64", gradients=True, share=False):
        raise CannotRunHere("its framework is not installed here")

    register(SimpleNamespace(NAME="absent", build=absent))
    report = run("absent")
    assert report.checks == [] and not report.errors
    assert report.skipped == {Target("absent", "float64"): "its framework is not installed here"}
    assert not report.passed and not report.to_json()["passed"]


def _compared(name, actual, expected, dtype="float64"):
    from bert_multi.engine.compare import compare_arrays, tolerance_for

    return compare_arrays(name, np.asarray(actual, float), np.asarray(expected, float), tolerance_for(dtype))


def test_the_summary_shows_each_outputs_worst_case_and_the_verdict_its_largest_absolute_difference():
    """Two cases of one target: the row (and the verdict's largest difference) is the worse case's, and the
    largest difference is absolute (a relative one of 0.5 here would read as 5.0e-01)."""
    from bert_multi.engine.report import largest_by_dtype, summary_table, verdict
    from bert_multi.engine.results import Check, Report, Target

    target = Target("numpy", "float64")
    small = _compared("encoded", [2e-12, 1.0], [0.0, 1.0])  # max abs 2e-12, max rel 0 (its 0 reference skipped)
    large = _compared("encoded", [1.0 + 4e-10, 2.0], [1.0, 2.0])  # max abs 4e-10, max rel 4e-10
    half = _compared("encoded", [1.5e-10, 1.0], [1e-10, 1.0])  # max abs 5e-11, max rel 0.5
    report = Report(CONFIG, ["a", "b", "c"], [Check(c, target, "oracle", (x,), ()) for c, x in
                                               (("a", small), ("b", large), ("c", half))])  # fmt: skip
    ((_, _, _, worst),) = report.worst()
    assert worst is large and "4.00e-10" in summary_table(report)
    assert largest_by_dtype(report) == "4.0e-10 in float64"
    assert "largest difference 4.0e-10 in float64" in verdict(report, "it")


def test_a_run_where_one_target_raised_and_the_rest_passed_is_not_checked_in_full():
    from bert_multi.engine.report import verdict
    from bert_multi.engine.results import Check, Report, RunError, Target

    passing = Check("a", Target("numpy", "float64"), "oracle", (_compared("encoded", [1.0], [1.0]),), ())
    report = Report(CONFIG, ["a"], [passing], errors=[RunError(Target("torch", "float32"), "running case a", "boom")])
    assert not report.passed
    said = verdict(report, "it")
    assert said.startswith("it was not checked in full: 1 target(s) raised (") and "boom" in said
    assert said.endswith("the 1 comparisons that ran are within tolerance")
