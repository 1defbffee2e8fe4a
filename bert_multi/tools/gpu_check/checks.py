"""The checks of a gpu-check run, in the order of what they prove (``CHECKS``), each making its parts on
the backends and GPU it is given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...backend.registry import LoadedBackend, load_backend
from ...engine.cases import CASES, KERNEL_PATHS, CaseInput
from ...engine.compare import compare_arrays, tolerance_for
from ...engine.conform import run_conformance
from ...engine.report import failure_details
from ...engine.results import Report, Target, compare_outputs
from ...spec.config import CONFIGS, BERTConfig
from ...spec.schema import SUPPORTED_DTYPES, random_weights
from ...training import PretrainingData, builtin_corpus, paragraphs_from_lines
from .. import bench
from ..fixtures import DEFAULT_DIRECTORY, fixture_failures, read_fixtures
from .report import FAIL, NOT_RUN, PASS, SKIP, Part, finite

FIXTURES = Path(__file__).resolve().parents[3] / DEFAULT_DIRECTORY  # in a source tree
TRAINING_STEPS = 3
# TF32's effect shows on any input: two cases (one with 2-D valid_lens) say it at a fraction of the cost.
TF32_CASES = ("mixed_valid_lens", "valid_lens_2d")


class BudgetSpent(BaseException):
    """Raised between two steps of a check once the run's budget is spent. A ``BaseException``, as
    ``KeyboardInterrupt`` is, so that no check's own error handling takes it for a backend's failure."""


@dataclass(frozen=True)
class Setting:
    """What every check is given: the run's model and rounds, and ``step(done, planned, label)``, called
    between the steps of a check (it moves a progress bar, and stops the check once the budget is spent)."""

    quick: bool
    config: BERTConfig
    bench_rounds: int
    step: Callable[[int, int, str], None]
    note: Callable[[str], None] = lambda line: None  # a line for the log: a bench row as it is timed


# A check runs on the backends it is given (one, or for a check of them ``together``, every one on the
# GPU) and that GPU, and makes its parts.
CheckRun = Callable[[Setting, list[LoadedBackend], str], Iterable[Part]]


@dataclass(frozen=True)
class Check:
    name: str
    proves: str  # one line: what a PASS establishes
    run: CheckRun
    quick: bool = True  # part of a --quick run
    together: bool = False  # run once per GPU on every backend there (side by side), not once per backend


def _cases(config: BERTConfig, names: Iterable[str] | None = None) -> list[CaseInput]:
    wanted = set(names) if names is not None else None
    return [case.input(config) for case in CASES if wanted is None or case.name in wanted]


def conformance_summary(report: Report) -> dict[str, Any]:
    """What a part keeps of a conformance report: the worst of each target, reference and output, what
    failed or raised, and what each model ran on (not every comparison: the report is rewritten after
    every part)."""
    worst = [
        {
            "target": str(target),
            "reference": reference,
            "output": output,
            "max_abs": finite(c.max_abs),
            "ratio": finite(c.ratio),
        }  # fmt: skip
        for target, reference, output, c in report.worst()
    ]
    failures = failure_details(report).splitlines()
    return {
        "checks": len(report.checks),
        "passed": report.passed,
        "worst": worst,
        "failures": failures[:20] + ([f"... and {len(failures) - 20} more lines"] if len(failures) > 20 else []),
        "skipped": {str(target): reason for target, reason in report.skipped.items()},
        "runtime": report.runtime,
    }


def attentions(backend: LoadedBackend, pairs: bool) -> list[str]:
    """How the check runs ``backend``'s attention: d2l's way, and for d2l 1.0's check (the one with pairs)
    also its fused kernel, where it has one (``bench`` and ``pretrain`` use it on a GPU)."""
    return ["d2l", "sdpa"] if pairs and backend.takes("attention") else ["d2l"]


def conformance(preset: str, pairs: bool) -> CheckRun:
    """The check of ``preset`` against the oracle on the GPU, in both dtypes; with ``pairs``, on the CPU too
    and GPU against CPU (the weights moved both ways)."""

    def run(setting: Setting, backends: list[LoadedBackend], device: str) -> Iterator[Part]:
        (backend,) = backends
        config = setting.config.with_semantics(preset)
        reason = backend.supports(config, device)
        if reason is not None:
            yield Part(f"conformance {preset}", backend.name, device, SKIP, reason)
            return
        weights = random_weights(config, seed=0, dtype="float64")
        places = ("cpu", device) if pairs else (device,)
        targets = [
            Target(backend.name, dtype, where, attention)
            for attention in attentions(backend, pairs)
            for where in places
            for dtype in SUPPORTED_DTYPES
        ]
        # A generation's rules are each a branch of the model, whose kernels its three paths cover; where a
        # program is compiled for every shape, the other cases would only compile more.
        cases = _cases(config, None if pairs or not backend.prepares else KERNEL_PATHS)
        report = run_conformance(config, weights, targets, cases, pairs=pairs, progress=setting.step)
        worst = max((c.ratio for *_, c in report.worst()), default=float("inf"))
        detail = f"{len(report.checks)} checks, worst uses {worst:.2g}x its tolerance" + (
            f"; {len(report.failures())} failing, {len(report.errors)} errors" if not report.passed else ""
        )
        status = PASS if report.passed else FAIL
        yield Part(f"conformance {preset}", backend.name, device, status, detail, conformance_summary(report))

    return run


def check_fixtures(setting: Setting, backends: list[LoadedBackend], device: str) -> Iterator[Part]:
    """The golden fixtures (every generation's tiny model), on the GPU, in both dtypes."""
    (backend,) = backends
    if not FIXTURES.is_dir():
        yield Part("fixtures", backend.name, device, SKIP, f"no fixtures at {FIXTURES} (not a source tree)")
        return
    fixtures = read_fixtures(FIXTURES)
    cases = KERNEL_PATHS if backend.prepares else tuple(fixtures[0].cases)  # as for the generations
    failures = []
    for dtype in SUPPORTED_DTYPES:
        failures += fixture_failures(backend, fixtures, device, dtype, setting.step, cases)
    detail = f"{len(fixtures)} fixtures x {len(cases)} cases x 2 dtypes" + (
        f"; {len(failures)} out of tolerance, first: {failures[0]}" if failures else ", all within the policy"
    )
    yield Part("fixtures", backend.name, device, FAIL if failures else PASS, detail, {"failures": failures[:20]})


def check_tf32(setting: Setting, backends: list[LoadedBackend], device: str) -> Iterator[Part]:
    """The float32 run with TF32 off (held to the policy) and on (reported beside it), and that each model
    states which: its TF32 setting and the precision of its products."""
    (backend,) = backends
    config = setting.config
    weights = random_weights(config, seed=0, dtype="float64")
    oracle = load_backend("numpy").build(config, weights)
    cases = _cases(config, TF32_CASES)
    tolerance = tolerance_for("float32", "gpu")
    found: dict[str, Any] = {}
    for tf32 in (False, True):
        model = backend.build(config, weights, device=device, dtype="float32", gradients=False, tf32=tf32)
        worst = 0.0
        passed = True
        for index, case in enumerate(cases):
            setting.step(index + len(cases) * tf32, 2 * len(cases), f"TF32 {'on' if tf32 else 'off'}: {case.name}")
            outputs, intermediates = compare_outputs(
                model(**case.batch, intermediates=True), oracle(**case.batch, intermediates=True), tolerance
            )
            worst = max([worst, *(c.max_abs for c in outputs + intermediates)])
            passed = passed and all(c.passed for c in outputs + intermediates)
        found["on" if tf32 else "off"] = {"max_abs": worst, "within_policy": passed, "runtime": model.runtime_info()}
    stated = [(found[key]["runtime"].get("tf32"), found[key]["runtime"].get("matmul precision")) for key in found]
    recorded = stated == [(False, "float32"), (True, "tf32")]
    off, on = found["off"], found["on"]
    detail = (
        f"TF32 off: max abs error {off['max_abs']:.2e} ("
        + ("within" if off["within_policy"] else "OUTSIDE")
        + f" the float32 policy); TF32 on: {on['max_abs']:.2e}"
        + ("" if recorded else f"; the models do not state the setting they were built with: {stated}")
    )
    yield Part("tf32", backend.name, device, PASS if off["within_policy"] and recorded else FAIL, detail, found)


def _training_set_up(quick: bool) -> tuple[BERTConfig, list[dict[str, np.ndarray]]]:
    """The model and batches the training check uses: the chapter's widths (the tiny model's in a quick
    run) on d2l's corpus, ``TRAINING_STEPS`` batches of 8."""
    max_len = 16 if quick else 64
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=max_len)
    base = CONFIGS["tiny" if quick else "chapter"]
    config = dataclasses.replace(base, vocab_size=len(data.vocab), max_len=data.max_len, dropout=0.0)
    stream = data.batches(8, seed=0)
    return config, [next(stream) for _ in range(TRAINING_STEPS)]


def check_training(setting: Setting, backends: list[LoadedBackend], device: str) -> Iterator[Part]:
    """Gradients and a few pretraining steps on the GPU against the CPU, from the same weights and
    batches: float64 to the pair bound, float32 to the float32 pair policy."""
    (backend,) = backends
    if not backend.can_train:
        yield Part("training", backend.name, device, SKIP, f"backend {backend.name!r} cannot train")
        return
    config, batches = _training_set_up(setting.quick)
    for number, dtype in enumerate(SUPPORTED_DTYPES):
        setting.step(number, len(SUPPORTED_DTYPES), f"training {dtype}")
        tolerance = tolerance_for(dtype, "gpu", pair=True)
        weights = random_weights(config, seed=0, dtype=dtype)
        # SGD: Adam divides by the root of each gradient's running square, so it turns rounding-level
        # differences in near-zero gradients into whole steps of lr (docs/gpu.md).
        trainers = {where: backend.trainer(backend.build(config, weights, device=where, dtype=dtype), optimizer="sgd")
                    for where in ("cpu", device)}  # fmt: skip
        comparisons = []
        (_, cpu_grads), (_, gpu_grads) = (trainers[where].gradients(batches[0]) for where in ("cpu", device))
        comparisons += [compare_arrays(f"gradient {n}", gpu_grads[n], cpu_grads[n], tolerance) for n in cpu_grads]
        losses = {where: [trainer.step(batch).total for batch in batches] for where, trainer in trainers.items()}
        comparisons.append(compare_arrays("losses", np.array(losses[device]), np.array(losses["cpu"]), tolerance))
        after = {where: trainer.model.export_weights() for where, trainer in trainers.items()}
        comparisons += [compare_arrays(n, after[device][n], after["cpu"][n], tolerance) for n in after["cpu"]]
        failing = [c for c in comparisons if not c.passed]
        worst = max(comparisons, key=lambda c: c.ratio)
        detail = (
            f"gradients, {TRAINING_STEPS} steps' losses and weights, {len(comparisons)} comparisons against the "
            f"CPU; worst {worst.name} uses {worst.ratio:.2g}x its tolerance"
            + (f"; first failing: {failing[0].describe()}" if failing else "")
        )
        yield Part(f"training {dtype}", backend.name, device, FAIL if failing else PASS, detail,
                   {"losses": losses, "worst": worst.describe()})  # fmt: skip


def check_bench(setting: Setting, backends: list[LoadedBackend], device: str) -> Iterator[Part]:
    """``bench`` on the GPU, every backend there side by side (``bench.workloads``), each row told as its
    workload ends. Stopped by the budget between two workloads, it keeps the rows it has and lists the rest
    as NOT RUN."""
    names = [backend.name for backend in backends]
    label = "+".join(names)
    shapes = bench.QUICK_SHAPES if setting.quick else None
    # Without torch.compile's variants (tens of seconds a graph, and a graph for each precision): bench
    # --devices cuda times them.
    workloads = bench.workloads(device, shapes, None, setting.bench_rounds, True, names, False,
                                lambda text: setting.step(0, 0, text))  # fmt: skip
    rows: list[bench.Row] = []
    stopped = None
    for number, (what, timed) in enumerate(workloads):
        try:
            setting.step(number, len(workloads), what)
            made = timed()
        except BudgetSpent:
            stopped = [what for what, _ in workloads[number:]]
            break
        for row in made:
            setting.note(f"bench: {bench.describe_row(row)}")
        rows += made
    rows = bench.against_fastest(rows)
    timed_rows = [row for row in rows if row.tokens]
    if timed_rows:
        fastest = max(timed_rows, key=lambda row: row.tokens / row.median)
        detail = (
            f"{len(rows)} rows; fastest {fastest.backend} on {fastest.workload} {fastest.dtype}: "
            f"{fastest.tokens / fastest.median:,.0f} tokens/s"
        )
        table = bench.format_rows(rows)
        yield Part("bench", label, device, PASS, detail, {"rows": [row.to_json() for row in rows], "table": table})
    elif not stopped:
        yield Part("bench", label, device, SKIP, "nothing to time")
    if stopped:
        yield Part("bench", label, device, NOT_RUN, f"stopped at the budget before {', '.join(stopped)}")


# In the order of what they prove: a run stopped by its budget has done the first ones everywhere.
CHECKS: tuple[Check, ...] = (
    Check(
        "conformance d2l",
        "d2l 1.0's BERT computes the oracle's numbers on the GPU in float32 and float64, and the CPU's",
        conformance("d2l", pairs=True),
    ),
    Check("tf32", "float32 products are full float32 unless TF32 is asked for, and each model says which", check_tf32),
    Check("training", "gradients and training steps on the GPU are the CPU's, in float32 and float64", check_training),
    *(
        Check(
            f"conformance {preset}",
            f"the {preset} generation computes the oracle's numbers on the GPU",
            conformance(preset, pairs=False),
            quick=False,
        )
        for preset in ("d2l-0.12", "d2l-0.11", "bert")
    ),
    # The stored outputs, which pytest -m cuda checks too: of the checks, the most compiling per result.
    Check("fixtures", "every generation's stored tiny model is reproduced on the GPU", check_fixtures, quick=False),
    Check("bench", "speed on the GPU, every framework side by side (reported, not held)", check_bench, together=True),
)
