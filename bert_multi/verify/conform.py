"""The conformance engine: run cases through backends, compare with the float64 oracle and with each
other, find where a failing run first diverges, and report.

Everything compares NumPy arrays, so the same functions serve the command line, this project's
tests and a user's own test suite.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import os
import platform
import sys
import tempfile
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.contract import BackendModel, BERTOutput, parse_device
from ..backend.registry import LoadedBackend, check_names, load_backend
from ..errors import CannotRunHere, InputError
from ..files.weights import load_weights, save_weights
from ..spec.config import BERTConfig
from ..spec.inputs import check_inputs
from ..spec.schema import SUPPORTED_DTYPES, cut_max_len, validate_weights
from .cases import Batch, CaseInput
from .compare import Comparison, Tolerance, compare_arrays, tolerance_for

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
    """Compare every output and, when either side recorded intermediates, each of the reference's. An
    output or activation that one side lacks is a failing comparison naming it, never an exception; so is
    a side that recorded no activations where the other did."""
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
            "errors": [{"target": str(e.target), "during": e.during, "error": e.error} for e in self.errors],
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


def _max_len_groups(config: BERTConfig, cases: Sequence[CaseInput]) -> dict[int, list[int]]:
    """The indices of the cases by the max_len of the model they run on, longest first."""
    groups: dict[int, list[int]] = {}
    for index, case in enumerate(cases):
        groups.setdefault(case.max_len or config.max_len, []).append(index)
    return dict(sorted(groups.items(), reverse=True))


def run_conformance(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    targets: Sequence[Target],
    cases: Sequence[CaseInput | tuple[str, Batch]],
    pairs: bool = True,
    progress: Progress | None = None,
) -> Report:
    """Run every case on every target and compare each with the float64 oracle.

    With ``pairs``, targets of the same dtype are also compared with each other, after moving the
    weights between them: for each pair (a, b), b is rebuilt from a's exported weights in memory, and
    a from b's exported weights through a canonical weight file, so both directions and both ways of
    moving weights are exercised. A case with its own ``max_len`` runs on the model cut to it
    (``schema.cut_max_len``), oracle included.

    What the report says: an unknown backend, dtype or device name is a ``ValueError``, and an input that
    breaks the model's contract an ``InputError``, before anything runs; a target that cannot run here
    (``CannotRunHere``: its framework or device is missing, or it does not compute this model) is skipped
    with the reason; any other exception from a backend is a ``RunError``, a failure; and
    ``Report.passed`` needs at least one check, all passing.
    """
    _check_targets(targets)
    if not cases:
        raise ValueError("no cases to run: a conformance run needs at least one")
    # Weights or inputs that do not fit the config are the caller's mistake, not a backend's failure.
    validate_weights(config, weights)
    inputs = [CaseInput(*case) for case in cases]
    for case in inputs:
        try:
            check_inputs(config, **case.batch)
        except InputError as error:
            raise InputError(f"case {case.name!r}: {error}") from None
    started = time.perf_counter()
    run = _Run(config, weights, targets, inputs, pairs, progress)
    with _collector_skipping_existing_objects():
        report = run.all()
    report.seconds = time.perf_counter() - started
    return report


def _check_targets(targets: Sequence[Target]) -> None:
    """Refuse a name that is not a backend, a dtype or a device, before anything runs."""
    check_names([target.backend for target in targets])
    for target in targets:
        if target.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unknown dtype {target.dtype!r} in {target}: expected one of {list(SUPPORTED_DTYPES)}")
        parse_device(target.device)
    if len(set(targets)) != len(targets):
        raise ValueError(f"a target is asked for twice: {[str(t) for t in targets if list(targets).count(t) > 1]}")


class _Run:
    """One conformance run: its schedule, and what it holds meanwhile. One dtype at a time and one model
    at a time, each dropped once it has run its cases, and a target's exported weights kept only while
    a later target is still to be built from them. Models are built with ``share`` and export with it,
    so a framework that can keep the arrays it is given (torch) costs no copy and lends views: in the
    default run (torch, then MXNet) at most two sets of weights are held at once, the caller's and the
    one Gluon copies (in the other order, three while MXNet is rebuilt from torch's file)."""

    def __init__(
        self,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        targets: Sequence[Target],
        cases: list[CaseInput],
        pairs: bool,
        progress: Progress | None,
    ) -> None:
        self.config, self.weights, self.targets, self.cases = config, weights, targets, cases
        self.pairs, self.progress = pairs, progress
        self.groups = _max_len_groups(config, cases)
        self.report = Report(config, [case.name for case in cases])
        self.report.cut = {case.name: cut for case in cases if (cut := case.cut(config)) is not None}
        self.backends: dict[Target, LoadedBackend] = {}
        self.oracle = load_backend("numpy")
        self.references: dict[float, dict[int, BERTOutput]] = {}  # LayerNorm eps -> case -> float64 oracle outputs
        self.results: dict[Target, dict[int, BERTOutput]] = {}  # target -> case -> its outputs
        self.keyed_checks: list[tuple[tuple[int, ...], Check]] = []  # keyed to sort into the order asked for
        self.done = 0
        self.during = "loading its backend"  # what the engine is doing, for a RunError
        for target in targets:
            self.attempt(target, self.load, target)

    def load(self, target: Target) -> None:
        self.backends[target] = load_backend(target.backend)

    def attempt(self, target: Target, work: Callable[..., object], *arguments: Any) -> bool:
        """``work(*arguments)`` for ``target``; whether it finished. ``CannotRunHere`` skips the target with
        its reason; any other exception is a ``RunError``. Either way the target takes no further part."""
        try:
            work(*arguments)
            return True
        except CannotRunHere as error:
            self.report.skipped[target] = str(error)
        except Exception as error:  # noqa: BLE001 - a backend's failure is reported, not raised
            self.report.errors.append(RunError(target, self.during, _describe_exception(error)))
        self.backends.pop(target, None)
        self.results.pop(target, None)
        return False

    def all(self) -> Report:
        for dtype in dict.fromkeys(target.dtype for target in self.targets):
            ran = [target for target in self.targets if target.dtype == dtype and target in self.backends]
            exports: dict[Target, tuple[BERTConfig, dict[str, np.ndarray]]] = {}  # for the targets after them
            # Cast once for every build of this dtype (the same cast each build would make).
            weights = {name: np.asarray(array, dtype=dtype) for name, array in self.weights.items()} if ran else {}
            for position, target in enumerate(ran):
                later = position < len(ran) - 1
                if not self.attempt(target, self.run_target, target, ran[:position], exports, weights, later):
                    exports.pop(target, None)
            for target in ran:  # pairs are of one dtype: its outputs are not asked for again
                self.results.pop(target, None)
        self.report.checks = [check for _, check in sorted(self.keyed_checks, key=lambda keyed: keyed[0])]
        if self.progress:
            self.progress(self.done, self.done, "done")
        return self.report

    def run_target(
        self,
        target: Target,
        before: list[Target],
        exports: dict[Target, tuple[BERTConfig, dict[str, np.ndarray]]],
        weights: dict[str, np.ndarray],
        later: bool,
    ) -> None:
        """``target`` alone and in its pairs with the targets ``before`` it. Each pair (a, b): b is rebuilt
        from a's weights in memory before b runs alone, so a's export can be dropped first; a is rebuilt
        from b's through a file once b has run."""
        for source in list(exports):
            self.run_pair(target, source, "memory", exports[source] if later else exports.pop(source))
        earlier = [source for source in before if source in self.results] if self.pairs else []
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "weights.npz"
            export = self.run_alone(target, weights, keep=self.pairs and later, file=path if earlier else None)
            if export is not None:
                exports[target] = export
            del export  # held by exports alone, so that it is freed once popped
            for source in earlier:  # a failure here is the rebuilt source's
                self.attempt(source, self.run_pair, source, target, "file", load_weights(path))

    def run_alone(
        self, target: Target, weights: dict[str, np.ndarray], keep: bool, file: Path | None
    ) -> tuple[BERTConfig, dict[str, np.ndarray]] | None:
        """Run every case on ``target``'s model of ``weights`` and compare with the oracle. Its model of
        the longest max_len is exported: written to ``file`` if given, and returned if ``keep``."""
        tolerance = tolerance_for(target.dtype, target.device_kind)
        # A framework that stores LayerNorm's eps differently (MXNet: as a C float) is held to the
        # oracle computed with the eps it really uses, and the report says so.
        eps = self.kernel_eps(target)
        label = "oracle" if eps == self.config.semantics.layer_norm_eps else f"oracle (LayerNorm eps {eps:.9g})"
        export = None
        self.results[target] = {}
        lends = keep or file is not None
        paired = self.pairs and sum(other.dtype == target.dtype for other in self.backends) > 1
        # Not enumerate(): it would hold each model until the next was built.
        for model, indices in self.models(target, self.config, weights):
            self.report.runtime[str(target)] = model.runtime_info()
            if lends:  # the first model, of the longest max_len, lends its weights
                lends = False
                self.during = "exporting its weights"
                export = (model.config, model.export_weights(share=True))
                if file is not None:
                    save_weights(file, *export)
                if not keep:
                    export = None
            for index in indices:
                out = self.run_case(model, index, str(target))
                if paired:  # what the other targets of its dtype are compared with
                    self.results[target][index] = out
                expected = self.reference(eps)[index]
                self.check((0, self.targets.index(target), index), target, label, index, out, expected, tolerance)
            del model  # so that it is freed before the next is built
        return export

    def run_pair(
        self, target: Target, source: Target, how: str, lent: tuple[BERTConfig, dict[str, np.ndarray]]
    ) -> None:
        """Run every case on ``target``'s model of the weights ``source`` exported, moved ``how``
        ("memory" or "file"), and compare with ``source``'s own outputs."""
        kind = "gpu" if "gpu" in (target.device_kind, source.device_kind) else "cpu"
        tolerance = tolerance_for(target.dtype, kind, pair=True)
        # Each side agrees with the oracle at its own LayerNorm eps, so the pair may differ by what the
        # oracle itself computes differently at the two: that known gap is added to the source's outputs
        # before comparing (triangle inequality), and only what remains counts.
        eps, source_eps = self.kernel_eps(target), self.kernel_eps(source)
        label = f"{source} (weights via {how}" + (", LayerNorm eps corrected)" if eps != source_eps else ")")
        first, second = sorted((self.targets.index(target), self.targets.index(source)))
        for model, indices in self.models(target, *lent, rebuilt_from=f"{source}'s weights via {how}"):
            for index in indices:
                out = self.run_case(model, index, f"{target} <- {source} ({how})")
                expected = self.results[source][index]
                if eps != source_eps:
                    expected = shifted(expected, self.reference(eps)[index], self.reference(source_eps)[index])
                key = (1, first, second, 0 if how == "memory" else 1, index)
                self.check(key, target, label, index, out, expected, tolerance)
            del model

    def models(
        self, target: Target, config: BERTConfig, weights: dict[str, np.ndarray], rebuilt_from: str = ""
    ) -> Iterator[tuple[BackendModel, list[int]]]:
        """``target``'s model for each group of cases, cut to the group's max_len, with the group. The
        caller drops each before asking for the next, which is built only once the one before is freed."""
        backend = self.backends[target]
        for max_len, indices in self.groups.items():
            self.during = f"building its model (max_len {max_len}" + (
                f", from {rebuilt_from})" if rebuilt_from else ")"
            )
            model = backend.build(
                *cut_max_len(config, weights, max_len),
                device=target.device,
                dtype=target.dtype,
                gradients=False,
                share=True,
            )
            yield model, indices
            del model
            _release_memory()

    def reference(self, eps: float) -> dict[int, BERTOutput]:
        """The oracle's float64 outputs for every case, computed with LayerNorm ``eps``, once."""
        if eps not in self.references:
            self.references[eps] = {}
            for max_len, indices in self.groups.items():
                model_config, weights = cut_max_len(self.config, self.weights, max_len)
                oracle = self.oracle.build(model_config, weights, dtype="float64", layer_norm_eps=eps, share=True)
                self.references[eps].update(
                    (index, oracle(**self.cases[index].batch, intermediates=True)) for index in indices
                )
                del oracle
                _release_memory()
        return self.references[eps]

    def kernel_eps(self, target: Target) -> float:
        """The LayerNorm eps ``target``'s framework computes with, for the config's."""
        return self.backends[target].kernel_eps(self.config.semantics.layer_norm_eps)

    def run_case(self, model: BackendModel, index: int, label: str) -> BERTOutput:
        if self.progress:
            alive = [target for target in self.targets if target in self.backends]  # not skipped, not broken
            self.progress(
                self.done, _planned_steps(alive, len(self.cases), self.pairs), f"{label}: {self.cases[index].name}"
            )
        self.done += 1
        self.during = f"running case {self.cases[index].name}"
        return model(**self.cases[index].batch, intermediates=True)

    def check(
        self,
        key: tuple[int, ...],
        target: Target,
        label: str,
        index: int,
        out: BERTOutput,
        expected: BERTOutput,
        tolerance: Tolerance,
    ) -> None:
        outputs = compare_outputs(out, expected, tolerance)
        self.keyed_checks.append((key, Check(self.cases[index].name, target, label, *outputs)))


def _describe_exception(error: BaseException) -> str:
    """An exception's type, message and the line that raised it, in one line."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


@contextlib.contextmanager
def _collector_skipping_existing_objects() -> Iterator[None]:
    """The cycle collector leaves alone what exists now (the frameworks' modules and the caller's
    objects: some 200,000 once torch and MXNet are imported) until the block ends: each collection that
    frees a model then takes milliseconds, not a tenth of a second. A caller that froze objects itself
    keeps them frozen: then nothing more is frozen here, and nothing unfrozen."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _release_memory() -> None:
    """Hand a dropped model's memory back now: Gluon blocks sit in reference cycles (each with its
    name scope), so only the cycle collector frees an MXNet model, and glibc keeps freed blocks for
    reuse until asked to trim. Without this the default run's peak held two extra float64 models."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


def _glibc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_malloc_trim = _glibc_malloc_trim()


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
