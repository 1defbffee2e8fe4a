"""The conformance engine: run cases through backends, compare with the float64 oracle and with each
other, find where a failing run first diverges, and report.

Everything compares NumPy arrays, so the same functions serve the command line, this project's
tests and a user's own test suite.
"""

from __future__ import annotations

import itertools
import os
import platform
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .backend import BackendModel, BERTOutput, load_backend, parse_device
from .cases import Batch
from .compare import Comparison, Tolerance, compare_arrays, tolerance_for
from .config import BERTConfig
from .errors import BackendUnavailable
from .schema import validate_weights
from .weights import load_weights, save_weights

OUTPUT_NAMES = ("encoded", "mlm", "nsp")


@dataclass(frozen=True)
class Target:
    """One way of running the model: a backend at a dtype on a device."""

    backend: str
    dtype: str
    device: str = "cpu"

    @property
    def device_kind(self) -> str:
        return parse_device(self.device).kind

    def __str__(self) -> str:
        return f"{self.backend} {self.dtype} {self.device}"


@dataclass(frozen=True)
class Check:
    """One case run on ``target`` and compared with ``reference`` (the oracle, or another target)."""

    case: str
    target: Target
    reference: str  # "oracle" (with the LayerNorm eps if not 1e-5), or another target and how weights moved

    @property
    def against_oracle(self) -> bool:
        return self.reference.startswith("oracle")

    outputs: tuple[Comparison, ...]
    intermediates: tuple[Comparison, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.outputs + self.intermediates)

    @property
    def first_divergence(self) -> Comparison | None:
        """The first activation, in computation order, outside its tolerance; then the first output."""
        for comparison in self.intermediates + self.outputs:
            if not comparison.passed:
                return comparison
        return None


def compare_outputs(
    out: BERTOutput, ref: BERTOutput, tolerance: Tolerance
) -> tuple[tuple[Comparison, ...], tuple[Comparison, ...]]:
    """Compare every output and, when ``out`` recorded intermediates, each of the reference's. An
    output or activation that one side lacks is a failing comparison naming it, never an exception."""
    outputs = tuple(
        compare_arrays(name, getattr(out, name), getattr(ref, name), tolerance)
        for name in OUTPUT_NAMES
        if getattr(out, name) is not None or getattr(ref, name) is not None
    )
    intermediates: tuple[Comparison, ...] = ()
    if out.intermediates is not None and ref.intermediates is not None:
        intermediates = tuple(
            compare_arrays(name, out.intermediates.get(name), value, tolerance)
            for name, value in ref.intermediates.items()
        )
    return outputs, intermediates


def assert_conforms(out: BERTOutput, ref: BERTOutput, dtype: str, device: str = "cpu", pair: bool = False) -> None:
    """Raise ``AssertionError`` unless ``out`` was computed in ``dtype`` and every output and intermediate
    is within the policy's tolerance of ``ref`` (doubled with ``pair``, for backend against backend)."""
    if out.encoded.dtype.name != dtype:
        raise AssertionError(f"outputs are {out.encoded.dtype.name}, expected {dtype}")
    outputs, intermediates = compare_outputs(out, ref, tolerance_for(dtype, parse_device(device).kind, pair))
    failing = [c.describe() for c in intermediates + outputs if not c.passed]
    if failing:
        raise AssertionError("outputs differ beyond tolerance:\n  " + "\n  ".join(failing))


@dataclass
class Report:
    """Every check of one run, what was skipped and why, and what the run ran on."""

    config: BERTConfig
    cases: list[str]
    checks: list[Check] = field(default_factory=list)
    skipped: dict[Target, str] = field(default_factory=dict)  # target -> why it could not run here
    runtime: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> runtime_info()
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def worst(self) -> list[tuple[Target, str, str, Comparison]]:
        """(target, reference, output, worst comparison over cases) for each output and for the
        intermediates together, in the order the checks were made."""
        rows: dict[tuple[Target, str, str], Comparison] = {}
        for check in self.checks:
            named = [(c.name, c) for c in check.outputs]
            if check.intermediates:
                named.append(("intermediates", max(check.intermediates, key=lambda c: c.ratio)))
            for name, comparison in named:
                key = (check.target, check.reference, name)
                if key not in rows or comparison.ratio > rows[key].ratio:  # NaN/Inf: ratio is inf
                    rows[key] = comparison
        return [(*key, comparison) for key, comparison in rows.items()]

    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "config": self.config.to_dict(),
            "cases": self.cases,
            "environment": environment(),
            "runtime": self.runtime,
            "skipped": {str(target): reason for target, reason in self.skipped.items()},
            "checks": [
                {
                    "case": check.case,
                    "target": str(check.target),
                    "reference": check.reference,
                    "passed": check.passed,
                    "first_divergence": check.first_divergence.name if check.first_divergence else None,
                    "outputs": [_comparison_json(c) for c in check.outputs],
                    "intermediates": [_comparison_json(c) for c in check.intermediates],
                }
                for check in self.checks
            ],
        }


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None  # JSON has no NaN or Infinity


def _comparison_json(c: Comparison) -> dict[str, Any]:
    return {
        "name": c.name,
        "passed": c.passed,
        "max_abs": _finite(c.max_abs),
        "max_rel": _finite(c.max_rel),
        "mean_abs": _finite(c.mean_abs),
        "worst_index": list(c.worst_index),
        "ratio": _finite(c.ratio),
        "nonfinite": c.nonfinite,
        "problem": c.problem,
        "atol": c.tolerance.atol,
        "rtol": c.tolerance.rtol,
    }


def environment() -> dict[str, Any]:
    """Versions and settings that a result depends on."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "cpu_count": len(os.sched_getaffinity(0)),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


Progress = Callable[[int, int, str], None]  # (steps done, steps planned, what runs now)


def _planned_steps(targets: Sequence[Target], num_cases: int, pairs: bool) -> int:
    """Case runs for these targets: each against the oracle, then both directions of each same-dtype pair."""
    num_pairs = sum(1 for a, b in itertools.combinations(targets, 2) if a.dtype == b.dtype) if pairs else 0
    return num_cases * (len(targets) + 2 * num_pairs)


def run_conformance(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    targets: Sequence[Target],
    cases: Sequence[tuple[str, Batch]],
    pairs: bool = True,
    progress: Progress | None = None,
) -> Report:
    """Run every case on every target and compare each with the float64 oracle.

    With ``pairs``, targets of the same dtype are also compared with each other, after moving the
    weights between them: for each pair (a, b), b is rebuilt from a's exported weights in memory, and
    a from b's exported weights through a canonical weight file, so both directions and both ways of
    moving weights are exercised. A target whose backend or device is missing here is skipped, with
    the reason, not failed.
    """
    # Weights that do not fit the config are the caller's mistake, not a target that cannot run here.
    validate_weights(config, weights)
    started = time.perf_counter()
    report = Report(config, [name for name, _ in cases])
    done = 0

    def step(label: str) -> None:
        nonlocal done
        if progress:
            alive = [t for t in targets if t not in report.skipped]
            progress(done, _planned_steps(alive, len(cases), pairs), label)
        done += 1

    oracle_backend = load_backend("numpy")
    references: dict[float, dict[str, BERTOutput]] = {}  # LayerNorm eps -> case -> float64 oracle outputs

    def reference(eps: float) -> dict[str, BERTOutput]:
        if eps not in references:
            oracle = oracle_backend.build(config, weights, dtype="float64", layer_norm_eps=eps)
            references[eps] = {name: oracle(**batch, intermediates=True) for name, batch in cases}
        return references[eps]

    # One dtype at a time: each model is dropped once it has run every case and lent its weights to its
    # pairs, so memory holds the weights of about three models, not of every target and pair at once.
    # Checks are keyed so that the report keeps the order of the targets and pairs asked for.
    keyed_checks: list[tuple[tuple[int, ...], Check]] = []
    layer_norm_eps: dict[Target, float] = {}
    for dtype in dict.fromkeys(target.dtype for target in targets):
        results: dict[Target, dict[str, BERTOutput]] = {}
        exported: dict[Target, dict[str, np.ndarray]] = {}  # weights each target's model holds, for its pairs
        for target in targets:
            if target.dtype != dtype:
                continue
            try:
                backend = load_backend(target.backend)
                model = backend.build(config, weights, device=target.device, dtype=dtype, gradients=False)
            except (BackendUnavailable, ValueError) as error:
                report.skipped[target] = str(error)
                continue
            report.runtime[str(target)] = model.runtime_info()
            tolerance = tolerance_for(dtype, target.device_kind)
            # A framework that stores LayerNorm's eps differently (MXNet: as a C float) is held to the
            # oracle computed with the eps it really uses, and the report says so.
            stated = config.semantics.layer_norm_eps
            eps = layer_norm_eps[target] = backend.kernel_eps(stated)
            label = "oracle" if eps == stated else f"oracle (LayerNorm eps {eps:.9g})"
            results[target] = {}
            for index, (name, batch) in enumerate(cases):
                step(f"{target}: {name}")
                out = results[target][name] = model(**batch, intermediates=True)
                check = Check(name, target, label, *compare_outputs(out, reference(eps)[name], tolerance))
                keyed_checks.append(((0, targets.index(target), index), check))
            if pairs:
                exported[target] = model.export_weights()
            del model
        for a, b in itertools.combinations([target for target in targets if target in exported], 2):
            kind = "gpu" if "gpu" in (a.device_kind, b.device_kind) else "cpu"
            tolerance = tolerance_for(dtype, kind, pair=True)
            directions = ((b, a, _rebuild_in_memory, "memory"), (a, b, _rebuild_through_file, "file"))
            for direction, (target, source, rebuild, how) in enumerate(directions):
                model = rebuild(config, exported[source], target)
                # Each side agrees with the oracle at its own LayerNorm eps, so the pair may differ by
                # what the oracle itself computes differently at the two: that known gap is added to the
                # source's outputs before comparing (triangle inequality), and only what remains counts.
                eps, source_eps = layer_norm_eps[target], layer_norm_eps[source]
                label = f"{source} (weights via {how}" + (", LayerNorm eps corrected)" if eps != source_eps else ")")
                for index, (name, batch) in enumerate(cases):
                    step(f"{target} <- {source} ({how}): {name}")
                    out = model(**batch, intermediates=True)
                    expected = results[source][name]
                    if eps != source_eps:
                        expected = shifted(expected, reference(eps)[name], reference(source_eps)[name])
                    check = Check(name, target, label, *compare_outputs(out, expected, tolerance))
                    keyed_checks.append(((1, targets.index(a), targets.index(b), direction, index), check))
                del model
    report.checks = [check for _, check in sorted(keyed_checks, key=lambda keyed: keyed[0])]
    if progress:
        progress(done, done, "done")
    report.seconds = time.perf_counter() - started
    return report


def shifted(out: BERTOutput, to: BERTOutput, start: BERTOutput) -> BERTOutput:
    """``out`` moved by the oracle's own difference ``to - start``, in every output and activation: what
    ``out`` would be under the setting ``to`` was computed with (a framework's LayerNorm eps, say)."""

    def move(value: np.ndarray | None, target: np.ndarray | None, origin: np.ndarray | None) -> np.ndarray | None:
        return None if value is None or target is None or origin is None else value + (target - origin)

    intermediates = None
    if out.intermediates is not None:
        intermediates = OrderedDict(
            (name, move(out.intermediates.get(name), to.intermediates[name], start.intermediates[name]))
            for name in start.intermediates
        )
    return BERTOutput(*(move(*(getattr(o, name) for o in (out, to, start))) for name in OUTPUT_NAMES), intermediates)


def _rebuild_in_memory(config: BERTConfig, weights: dict[str, np.ndarray], target: Target) -> BackendModel:
    return load_backend(target.backend).build(
        config, weights, device=target.device, dtype=target.dtype, gradients=False
    )


def _rebuild_through_file(config: BERTConfig, weights: dict[str, np.ndarray], target: Target) -> BackendModel:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "weights.npz"
        save_weights(path, config, weights)
        loaded_config, loaded = load_weights(path)
    return _rebuild_in_memory(loaded_config, loaded, target)
