"""The whole conformance run, as `bert-multi conform` makes it, on several configurations: every
backend against the oracle and every pair against each other, weights moved both ways."""

import pytest

from bert_multi import BERTConfig, frameworks, load_backend, random_weights
from bert_multi.backend.registry import not_in_process
from bert_multi.engine import lanes
from bert_multi.engine.cases import CASES
from bert_multi.engine.conform import run_conformance
from bert_multi.engine.report import failure_details
from bert_multi.engine.results import Target
from bert_multi.spec.semantics import PRESETS

CONFIGS = {
    "one_head_one_block": BERTConfig(
        vocab_size=17, num_hiddens=10, ffn_num_hiddens=6, num_heads=1, num_blks=1, max_len=12
    ),
    "many_heads_three_blocks": BERTConfig(
        vocab_size=40, num_hiddens=24, ffn_num_hiddens=40, num_heads=8, num_blks=3, max_len=20
    ),
    "odd_width": BERTConfig(vocab_size=33, num_hiddens=21, ffn_num_hiddens=9, num_heads=3, num_blks=2, max_len=13),
}
# The frameworks of this environment; one run by another environment's worker is checked in its own
# environment's run, and across the two by tests/test_environments.py.
AVAILABLE = [name for name in frameworks() if not not_in_process(name)]


def gpu_targets():
    """Each framework on each GPU it sees here, in both dtypes."""
    return [
        Target(name, dtype, device)
        for name in AVAILABLE
        for device in load_backend(name).devices()
        if device != "cpu"
        for dtype in ("float32", "float64")
    ]


# Every generation on every configuration it can take (sinusoidal positions need an even width).
RUNS = [
    (name, preset)
    for name, config in sorted(CONFIGS.items())
    for preset in PRESETS
    if PRESETS[preset].positions == "learned" or config.num_hiddens % 2 == 0
]


@pytest.mark.skipif(not AVAILABLE, reason="no framework backend is installed")
@pytest.mark.parametrize("config_name, preset", RUNS)
def test_every_backend_conforms_on_every_case(config_name, preset):
    config = CONFIGS[config_name].with_semantics(preset)
    targets = [Target(name, dtype) for name in AVAILABLE for dtype in ("float32", "float64")] + gpu_targets()
    cases = [(case.name, case.batch(config, seed=4)) for case in CASES]
    report = run_conformance(config, random_weights(config, seed=4, dtype="float64"), targets, cases)
    assert report.passed, failure_details(report)
    assert not report.skipped
    oracle_checks = {(str(c.target), c.case) for c in report.checks if c.against_oracle}
    assert oracle_checks == {(str(t), case.name) for t in targets for case in CASES}
    if {"torch", "mxnet"} <= set(AVAILABLE):  # both directions, both ways of moving weights, for each dtype
        references = {(str(c.target), c.reference) for c in report.checks if not c.against_oracle}
        # Every framework exports exactly the weights it was given; the two frameworks' LayerNorm eps
        # differ (MXNet keeps it as a C float): pairs say both.
        corrected = "bit-exact, LayerNorm eps corrected)"
        assert ("mxnet float64 cpu", f"torch float64 cpu (weights via memory, {corrected}") in references
        assert ("torch float64 cpu", f"mxnet float64 cpu (weights via file, {corrected}") in references
        assert ("mxnet float32 cpu", f"torch float32 cpu (weights via memory, {corrected}") in references


@pytest.mark.skipif(len(AVAILABLE) < 2, reason="needs two frameworks in this environment")
def test_a_pair_reports_what_a_model_rebuilt_from_the_weights_computes(monkeypatch):
    """A pair whose weights arrive bit-exact is compared with the outputs of its target's own run, not of
    a model rebuilt from them: right only if each framework's model rebuilt from the same bits computes
    the same bits. Made to rebuild every time, the run reports the same numbers, check for check."""
    config = CONFIGS["many_heads_three_blocks"]
    targets = [Target(name, dtype) for name in AVAILABLE for dtype in ("float32", "float64")] + gpu_targets()
    cases = [(case.name, case.batch(config, seed=4)) for case in CASES]
    weights = random_weights(config, seed=4, dtype="float64")
    exact = run_conformance(config, weights, targets, cases)
    monkeypatch.setattr(lanes, "same_bits", lambda given, expected: False)
    rebuilt = run_conformance(config, weights, targets, cases)
    pairs = [check for check in exact.checks if not check.against_oracle]
    assert pairs and all(", bit-exact" in check.reference for check in pairs)
    assert not any("bit-exact" in check.reference for check in rebuilt.checks)
    assert [(c.target, c.case, c.reference.replace(", bit-exact", "")) for c in exact.checks] == [
        (c.target, c.case, c.reference) for c in rebuilt.checks
    ]
    assert [c.outputs + c.intermediates for c in exact.checks] == [c.outputs + c.intermediates for c in rebuilt.checks]


def test_missing_devices_are_skipped_with_their_reason():
    config = CONFIGS["odd_width"]
    targets = [Target("numpy", "float32", "cuda")]
    report = run_conformance(config, random_weights(config), targets, [("batch_one", CASES[7].batch(config))])
    assert report.skipped == {targets[0]: "backend 'numpy': it runs on the CPU only, not 'cuda'"}
    assert report.checks == []


def test_the_oracle_in_float32_is_a_target_too():
    config = CONFIGS["odd_width"]
    cases = [(case.name, case.batch(config)) for case in CASES]
    report = run_conformance(config, random_weights(config), [Target("numpy", "float32")], cases)
    assert report.passed, failure_details(report)
    assert len(report.checks) == len(CASES)
