"""What a conformance run produces and how two outputs are compared: targets, checks, errors, the
report (for people and as JSON), and the comparisons a user's own test suite can call
(``compare_outputs``, ``assert_conforms``).

Everything compares NumPy arrays, so the same functions serve the command line, this project's tests
and a user's own test suite.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend.contract import BERTOutput, parse_device
from ..spec.config import BERTConfig
from .compare import Comparison, Tolerance, compare_arrays, tolerance_for

OUTPUT_NAMES = ("encoded", "mlm", "nsp")


@dataclass(frozen=True)
class Target:
    """One way of running the model: a backend at a dtype on a device, its attention written out as d2l
    does or through the framework's fused kernel (``attention="sdpa"``, ``spec.config.ATTENTIONS``)."""

    backend: str
    dtype: str
    device: str = "cpu"
    attention: str = "d2l"

    @property
    def device_kind(self) -> str:
        return parse_device(self.device).kind

    @property
    def label(self) -> str:
        """The backend, and how its attention is computed where that is not d2l's way: "torch sdpa"."""
        return self.backend if self.attention == "d2l" else f"{self.backend} {self.attention}"

    @property
    def options(self) -> dict[str, str]:
        """The build options that make this target beyond its device and dtype (none for d2l's attention,
        which every backend computes)."""
        return {} if self.attention == "d2l" else {"attention": self.attention}

    def __str__(self) -> str:
        return f"{self.label} {self.dtype} {self.device}"


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
        """The first activation or output, in computation order (``computation_rank``), outside its
        tolerance."""
        ordered = sorted(self.intermediates + self.outputs, key=lambda comparison: computation_rank(comparison.name))
        return next((comparison for comparison in ordered if not comparison.passed), None)


def computation_rank(name: str) -> tuple[int, ...]:
    """Where an activation or output is computed: the embedding, each block's parts, the encoder's output,
    the masked LM, the pooler, the NSP classifier (a missing record of activations first of all)."""
    block = re.fullmatch(r"blks\.(\d+)\.(\w+)", name)
    if block:
        return 1, int(block[1]), BLOCK_PARTS.index(block[2]) if block[2] in BLOCK_PARTS else len(BLOCK_PARTS)
    return {"intermediates": (-1,), "embedding": (0,), "encoded": (2,), "mlm": (3,), "pooler": (4,)}.get(name, (5,))


BLOCK_PARTS = ("attention", "addnorm1", "ffn", "output")


def compare_outputs(
    out: BERTOutput, ref: BERTOutput, tolerance: Tolerance, recorded: tuple[str, ...] | None = None
) -> tuple[tuple[Comparison, ...], tuple[Comparison, ...]]:
    """Compare every output and, when either side recorded intermediates, each of the reference's (or
    only those named in ``recorded``: what a user's model states it records; () compares none). An
    output or activation that one side lacks is a failing comparison naming it, never an exception; so is
    a side that recorded no activations where the other did."""
    if recorded is not None:
        kept = OrderedDict((name, (ref.intermediates or {}).get(name)) for name in recorded)
        ref = BERTOutput(ref.encoded, ref.mlm, ref.nsp, kept if recorded else None)
        out = BERTOutput(out.encoded, out.mlm, out.nsp, out.intermediates if recorded else None)
    outputs = tuple(
        compare_arrays(name, getattr(out, name), getattr(ref, name), tolerance)
        for name in OUTPUT_NAMES
        if getattr(out, name) is not None or getattr(ref, name) is not None
    )
    intermediates: tuple[Comparison, ...] = ()
    if out.intermediates is not None or ref.intermediates is not None:
        # Asked for on one side at least: a side with none compared nothing, which is a failure.
        if not out.intermediates or not ref.intermediates:
            side = "the compared side" if not out.intermediates else "the reference"
            problem = f"{side} recorded no activations, so none was compared"
            intermediates = (Comparison.unusable("intermediates", tolerance, problem),)
        else:
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


@dataclass(frozen=True)
class RunError:
    """A backend raised while the engine ran it (anything but ``CannotRunHere``): a failure, shown with
    what the engine was doing and where the exception came from."""

    target: Target
    during: str
    error: str
    case: str | None = None  # the case it raised on, where it raised on one case and ran the others

    def describe(self) -> str:
        return f"ERROR {self.target}, {self.during}: {self.error}"


@dataclass
class Report:
    """Every check of one run, what was skipped and why, what broke, and what the run ran on."""

    config: BERTConfig
    cases: list[str]
    checks: list[Check] = field(default_factory=list)
    skipped: dict[Target, str] = field(default_factory=dict)  # target -> why it could not run here
    errors: list[RunError] = field(default_factory=list)  # what raised, each a failure
    runtime: dict[str, dict[str, Any]] = field(default_factory=dict)  # target -> runtime_info()
    cut: dict[str, int] = field(default_factory=dict)  # case -> the max_len its model was cut to
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """At least one check ran, every check passed, and nothing raised: a run that compared nothing
        proves nothing."""
        return bool(self.checks) and not self.errors and all(check.passed for check in self.checks)

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
            "cut_max_len": self.cut,
            "environment": environment(),
            "runtime": self.runtime,
            "skipped": {str(target): reason for target, reason in self.skipped.items()},
            "errors": [
                {"target": str(e.target), "during": e.during, "error": e.error, "case": e.case} for e in self.errors
            ],
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
        "python_executable": sys.executable,  # which environment ran it
        "platform": platform.platform(),
        "numpy": np.__version__,
        "cpu_count": len(os.sched_getaffinity(0)),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def shifted(out: BERTOutput, to: BERTOutput, start: BERTOutput) -> BERTOutput:
    """``out`` moved by the oracle's own difference ``to - start``, in every output and activation: what
    ``out`` would be under the setting ``to`` was computed with (a framework's LayerNorm eps, say)."""

    def move(value: np.ndarray | None, target: np.ndarray | None, origin: np.ndarray | None) -> np.ndarray | None:
        return None if value is None or target is None or origin is None else value + (target - origin)

    intermediates = None
    if out.intermediates is not None and to.intermediates is not None and start.intermediates is not None:
        intermediates = OrderedDict(
            (name, move(out.intermediates.get(name), to.intermediates[name], start.intermediates[name]))
            for name in start.intermediates
        )
    encoded = out.encoded + (to.encoded - start.encoded)
    return BERTOutput(encoded, move(out.mlm, to.mlm, start.mlm), move(out.nsp, to.nsp, start.nsp), intermediates)
