"""Comparing outputs: the tolerance policy and the error statistics reported for every comparison.

An element passes when |actual - expected| <= atol + rtol * |expected| (NumPy's ``allclose`` rule):
the absolute part keeps near-zero values from failing on relative error alone. NaN or Inf in either
array is a failure of its own, never "close".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..arrays import all_finite, first_index


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def scaled(self, factor: float) -> Tolerance:
        return Tolerance(self.atol * factor, self.rtol * factor)


# Against the float64 oracle, per compute dtype and device kind. Measured on the CPU with the chapter's
# model (docs/tolerances.md): float64 errors are about 1e-14, float32 errors up to about 1e-5.
# GPU rows assume TF32 off; TF32 alone moves float32 outputs by about 1e-3.
POLICY: dict[tuple[str, str], Tolerance] = {
    ("float64", "cpu"): Tolerance(atol=1e-9, rtol=0.0),
    ("float64", "gpu"): Tolerance(atol=1e-9, rtol=0.0),
    ("float32", "cpu"): Tolerance(atol=3e-5, rtol=3e-4),
    ("float32", "gpu"): Tolerance(atol=3e-5, rtol=3e-4),
}


def tolerance_for(dtype: str, device_kind: str = "cpu", pair: bool = False) -> Tolerance:
    """The policy's tolerance against the oracle; ``pair=True`` doubles it for backend-vs-backend
    comparisons, where both sides carry their own error (the triangle inequality)."""
    tolerance = POLICY[(dtype, device_kind)]
    return tolerance.scaled(2.0) if pair else tolerance


@dataclass(frozen=True)
class Comparison:
    """Error statistics of one output against its reference."""

    name: str
    shape: tuple[int, ...]
    tolerance: Tolerance
    max_abs: float
    max_rel: float  # over elements whose reference is not 0
    mean_abs: float
    worst_index: tuple[int, ...]  # where |actual - expected| / (atol + rtol |expected|) peaks
    ratio: float  # that peak: the share of the tolerance used; <= 1 passes
    nonfinite: int  # NaN/Inf elements in actual or expected
    problem: str | None = None  # why there is nothing to compare (missing, or of the wrong shape)

    @classmethod
    def unusable(cls, name: str, tolerance: Tolerance, problem: str) -> Comparison:
        """A failing comparison of something that could not be compared, saying why."""
        return cls(name, (), tolerance, math.nan, math.nan, math.nan, (), math.inf, 0, problem)

    @property
    def passed(self) -> bool:
        return self.problem is None and self.nonfinite == 0 and self.ratio <= 1.0

    @property
    def margin(self) -> float:
        """How many times the error would have to grow to fail (inf when it is exactly zero)."""
        return math.inf if self.ratio == 0 else 1.0 / self.ratio

    @property
    def needed(self) -> Tolerance:
        """The smallest multiple of the tolerance that would pass."""
        return self.tolerance.scaled(self.ratio)

    def describe(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        if self.problem:
            return f"{self.name}: FAIL, {self.problem}"
        if self.nonfinite:
            return f"{self.name}: FAIL, {self.nonfinite} non-finite value(s), first at {self.worst_index}"
        return (
            f"{self.name}: {verdict}, max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}; worst element "
            f"{self.worst_index} uses {self.ratio:.3g}x the tolerance (atol {self.tolerance.atol:g}, "
            f"rtol {self.tolerance.rtol:g})"
        )


def compare_arrays(
    name: str, actual: np.ndarray | None, expected: np.ndarray | None, tolerance: Tolerance
) -> Comparison:
    """Statistics of ``actual`` against ``expected`` (computed in float64). A side that is missing
    (None) or shaped differently from the other is a failing comparison that says so."""
    if actual is None or expected is None:
        side = "the compared side" if actual is None else "the reference"
        return Comparison.unusable(name, tolerance, f"{side} has no value for it (never computed or never recorded)")
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        problem = f"shape {actual.shape} differs from the reference's {expected.shape}"
        return Comparison.unusable(name, tolerance, problem)
    if actual.size == 0:
        return Comparison(name, actual.shape, tolerance, 0.0, 0.0, 0.0, (), 0.0, 0)
    # Three temporaries, each computed in place once: the error, |expected| (then the limit), the relative error.
    with np.errstate(over="ignore", invalid="ignore"):
        error = np.subtract(actual, expected)
    np.abs(error, out=error)
    max_abs = error.max()
    # A NaN or an infinity on either side makes the error's maximum one, so only then is each side
    # looked at (a finite error can also overflow, which is no failure).
    if not math.isfinite(max_abs) and not (all_finite(actual) and all_finite(expected)):
        bad = ~(np.isfinite(actual) & np.isfinite(expected))
        first = first_index(bad)
        return Comparison(name, actual.shape, tolerance, math.nan, math.nan, math.nan, first, math.inf, int(bad.sum()))
    magnitude = np.abs(expected)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        max_rel = np.divide(error, magnitude, out=np.zeros_like(error), where=magnitude != 0).max()
        limit = np.multiply(magnitude, tolerance.rtol, out=magnitude)
        limit += tolerance.atol
        if tolerance.atol > 0:  # the policy's case: the limit is positive everywhere
            ratios = np.divide(error, limit, out=limit)
        else:
            ratios = np.where(limit > 0, error / limit, np.where(error > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratios)), ratios.shape)
    return Comparison(
        name,
        actual.shape,
        tolerance,
        float(max_abs),
        float(max_rel),
        float(error.mean()),
        tuple(int(i) for i in worst),
        float(ratios[worst]),
        0,
    )
