"""The conformance engine: run cases through backends, compare with the float64 oracle and with each
other, and collect what it found in a ``Report`` (``results``). Its schedule is here, each dtype's part
on lanes (``lanes``); what it does to hold little memory (collecting dropped models, returning memory
to the system) is in ``memory``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import waiting
from ..backend.contract import BackendModel, BERTOutput, check_attention, parse_device
from ..backend.memory import collector_skipping_existing_objects, release_memory
from ..backend.registry import LoadedBackend, check_names, load_backend, load_backends
from ..errors import CannotRunHere, InputError, UsageError, UserCodeError
from ..spec.config import BERTConfig
from ..spec.inputs import check_inputs
from ..spec.schema import SUPPORTED_DTYPES, cut_max_len, validate_weights
from .ahead import CompilingAhead
from .cases import Batch, CaseInput
from .compare import Tolerance, tolerance_for
from .lanes import Lanes, LaneSteps, Lent
from .results import Check, Report, RunError, Target, compare_outputs, shifted

Progress = Callable[[int, int, str], None]  # (steps done, steps planned, what runs now)
Build = Callable[[BERTConfig, dict[str, np.ndarray]], BackendModel]


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


# The canonical weights in a dtype: its float32 weights must be its float64 weights rounded, as
# ``random_weights`` and ``init_weights`` of one seed are.
WeightsSource = Callable[[str], dict[str, np.ndarray]]


def run_conformance(
    config: BERTConfig,
    weights: dict[str, np.ndarray] | WeightsSource,
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

    ``weights`` is the canonical dict, or a function of the dtype giving it (``WeightsSource``): then the
    run asks for each dtype's weights when it reaches that dtype and for the float64 ones first, for the
    oracle, and holds one dtype's at a time, not the float64 ones throughout (BERT-base's float64
    weights are a gigabyte).

    What the report says: an unknown backend, dtype or device name is a ``ValueError``, and an input that
    breaks the model's contract an ``InputError``, before anything runs; a target that cannot run here
    (``CannotRunHere``: its framework or device is missing, or it does not compute this model) is skipped
    with the reason; any other exception from a backend is a ``RunError``, a failure; and
    ``Report.passed`` needs at least one check, all passing.
    """
    check_targets(targets)
    if not cases:
        raise UsageError("no cases to run: a conformance run needs at least one")
    # Weights or inputs that do not fit the config are the caller's mistake, not a backend's failure.
    if not callable(weights):
        validate_weights(config, weights)
    inputs = [CaseInput(*case) for case in cases]
    for case in inputs:
        try:
            check_inputs(config, **case.batch)
        except InputError as error:
            raise InputError(f"case {case.name!r}: {error}") from None
    started = time.perf_counter()
    run = _Run(config, weights, targets, inputs, pairs, progress)
    with collector_skipping_existing_objects():
        report = run.all()
    report.seconds = time.perf_counter() - started
    return report


def check_targets(targets: Sequence[Target]) -> None:
    """Refuse a name that is not a backend, a dtype or a device, before anything runs."""
    check_names([target.backend for target in targets])
    for target in targets:
        if target.dtype not in SUPPORTED_DTYPES:
            raise UsageError(f"unknown dtype {target.dtype!r} in {target}: expected one of {list(SUPPORTED_DTYPES)}")
        parse_device(target.device)
        check_attention(target.attention)
    if len(set(targets)) != len(targets):
        raise UsageError(f"a target is asked for twice: {[str(t) for t in targets if list(targets).count(t) > 1]}")


class _Run:
    """One conformance run: its schedule, and what it holds meanwhile. One dtype at a time (its pairs on
    lanes, ``lanes.Lanes``), one model at a time in each process, each dropped once it has run its cases, and
    a target's exported weights kept only while a later target is still to be built from them. Models
    are built with ``share`` and export with it, so a framework that can keep the arrays it is given
    (torch, Gluon on the CPU) costs no copy and lends views: the caller's weights and one cast per dtype
    are held (from a ``WeightsSource``, one dtype's weights at a time), and a rebuilt model's weights
    read from a file while it runs."""

    def __init__(
        self,
        config: BERTConfig,
        weights: dict[str, np.ndarray] | WeightsSource,
        targets: Sequence[Target],
        cases: list[CaseInput],
        pairs: bool,
        progress: Progress | None,
    ) -> None:
        self.config, self.targets, self.cases = config, targets, cases
        self.weights: dict[str, np.ndarray] | None = None if callable(weights) else weights
        self.source: WeightsSource | None = weights if callable(weights) else None
        self.pairs, self.progress = pairs, progress
        self.groups = _max_len_groups(config, cases)
        # The dtypes in the order they run: float64 first, on the weights the oracle's outputs are made from.
        self.dtypes = sorted(dict.fromkeys(target.dtype for target in targets), key=lambda dtype: dtype != "float64")
        self.report = Report(config, [case.name for case in cases])
        self.report.cut = {case.name: cut for case in cases if (cut := case.cut(config)) is not None}
        self.backends: dict[Target, LoadedBackend] = {}
        self.oracle = load_backend("numpy")
        self.references: dict[float, dict[int, BERTOutput]] = {}  # LayerNorm eps -> case -> float64 oracle outputs
        self.referenced = threading.Event()  # set once they are made
        self.results: dict[Target, dict[int, BERTOutput]] = {}  # target -> case -> its outputs
        self.recorded: dict[Target, dict[int, tuple[str, ...] | None]] = {}  # and the activations it recorded
        self.keyed_checks: list[tuple[tuple[int, ...], Check]] = []  # keyed to sort into the order asked for
        self.eps: dict[Target, float] = {}  # each target's LayerNorm eps, as its framework computes it
        self.done = 0
        self.counting = threading.Lock()  # lanes run cases side by side
        # One set of weights beyond the run's own at a time in this process, whichever lane needs it: an
        # export written to a file (a worker's is a copy), or a file's weights a pair is rebuilt from.
        self.holding = threading.Lock()
        self.doing = threading.local()  # what each lane is doing, for a RunError
        self.lane_steps = LaneSteps()
        batches = [case.batch for case in cases]
        self.ahead = CompilingAhead(config, batches, self.groups, targets, self.dtypes, self.lane_steps)
        self.during = "loading its backend"
        try:
            loaded = load_backends((target.backend for target in targets), then=self.ahead.start)
        except BaseException:
            self.ahead.stop(interrupted=True)
            raise
        for target in targets:
            self.attempt(target, self.load, target, loaded[target.backend])

    @property
    def during(self) -> str:
        """What the engine is doing on this thread, for a ``RunError``."""
        return str(getattr(self.doing, "what", ""))

    @during.setter
    def during(self, what: str) -> None:
        self.doing.what = what

    def load(self, target: Target, loaded: LoadedBackend | Exception) -> None:
        if isinstance(loaded, Exception):
            raise loaded
        self.backends[target] = loaded

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
        self.recorded.pop(target, None)
        return False

    def all(self) -> Report:
        self.during = "asking its LayerNorm eps"
        for target in list(self.backends):
            self.attempt(target, self.kernel_eps, target)
        interrupted = False
        try:
            return self.scheduled()
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            self.ahead.stop(interrupted)

    def scheduled(self) -> Report:
        # The float64 weights first: made once (from a source: drawn once, and cast for the other dtypes),
        # never two sets at once. The oracle's outputs are computed from them on this thread as the
        # float64 targets' lanes start, so that a worker's lane builds and runs meanwhile (its checks
        # wait for them), and before any cast.
        held = self.weights_in("float64")
        references: Callable[[], None] | None = functools.partial(self.compute_references, held)
        if "float64" not in self.dtypes:
            self.compute_references(held)
            references = None
        for dtype in self.dtypes:
            ran = [target for target in self.targets if target.dtype == dtype and target in self.backends]
            if not ran:
                self.lane_steps.finish("*", dtype)
                continue
            weights = held if dtype == "float64" else self.cast_away(held, dtype)
            Lanes(self, ran, weights).run(first=references)
            references = None
            del weights  # before the next dtype's are made
        if references is not None:  # nothing ran: there is nothing to compare with them either
            self.referenced.set()
        self.report.checks = [check for _, check in sorted(self.keyed_checks, key=lambda keyed: keyed[0])]
        ran_on = self.report.runtime  # in the order asked for, as the checks are
        self.report.runtime = {str(target): ran_on[str(target)] for target in self.targets if str(target) in ran_on}
        if self.progress:
            self.progress(self.done, self.done, "done")
        return self.report

    def run_alone(
        self,
        target: Target,
        weights: dict[str, np.ndarray],
        keep: bool,
        file: Path | None,
        paired: bool,
        written: Callable[[], object] | None = None,
    ) -> Lent | None:
        """Run every case on ``target``'s model of ``weights`` and compare with the oracle, keeping its
        outputs if ``paired`` (other targets are compared with them). Its model of the longest max_len is
        exported: written to ``file`` if given (then ``written`` is called), and returned if ``keep``."""
        tolerance = tolerance_for(target.dtype, target.device_kind)
        # A framework that stores LayerNorm's eps differently (MXNet: as a C float) is held to the
        # oracle computed with the eps it really uses, and the report says so.
        eps = self.kernel_eps(target)
        label = "oracle" if eps == self.config.semantics.layer_norm_eps else f"oracle (LayerNorm eps {eps:.9g})"
        export = None
        self.results[target], self.recorded[target] = {}, {}
        lends = keep or file is not None
        # Not enumerate(): it would hold each model until the next was built.
        for model, indices in self.models(self.builder(target), self.config, weights):
            self.report.runtime[str(target)] = model.runtime_info()
            if lends:  # the first model, of the longest max_len, lends its weights
                lends = False
                self.during = "exporting its weights"
                # A worker's model writes its file there, holding nothing here.
                here = file is not None and self.backends[target].elsewhere is None
                with self.holding if here else contextlib.nullcontext():
                    if file is not None:
                        model.save(file)
                if file is not None and written is not None:
                    written()
                if keep:
                    export = (model.config, model.export_weights(share=True))
            for index in indices:
                out = self.run_case(model, index, str(target), target)
                if out is None:
                    continue
                if paired:  # what the other targets of its dtype are compared with, or stand for it
                    self.results[target][index], self.recorded[target][index] = out, model.recorded
                expected = self.reference(eps, index)
                key = (0, self.targets.index(target), index)
                self.check(key, target, label, index, out, expected, tolerance, model.recorded)
            del model  # so that it is freed before the next is built
        return export

    def run_pair(
        self,
        target: Target,
        source: Target,
        how: str,
        lent: Lent | None,
        exact: bool,
    ) -> None:
        """Run every case on ``target``'s model of the weights ``source`` exported, ``lent`` moved ``how``
        ("memory" or "file"), and compare with ``source``'s own outputs. Weights that arrived ``exact``,
        bit for bit those ``target`` ran alone, would rebuild the model that run had: its outputs are the
        rebuilt model's, and are not computed again (``bit-exact`` in the report; ``lent`` may be None)."""
        kind = "gpu" if "gpu" in (target.device_kind, source.device_kind) else "cpu"
        tolerance = tolerance_for(target.dtype, kind, pair=True)
        # Each side agrees with the oracle at its own LayerNorm eps, so the pair may differ by what the
        # oracle itself computes differently at the two: that known gap is added to the source's outputs
        # before comparing (triangle inequality), and only what remains counts.
        eps, source_eps = self.kernel_eps(target), self.kernel_eps(source)
        exact = exact and target in self.results
        label = f"{source} (weights via {how}" + ", bit-exact" * exact
        label += ", LayerNorm eps corrected)" if eps != source_eps else ")"
        first, second = sorted((self.targets.index(target), self.targets.index(source)))
        outputs = self.results[source]  # held for the pair, whatever the source's own lane does meanwhile
        for index, out, recorded in self.rebuilt_outputs(target, source, how, lent, exact):
            if index not in outputs:  # the source raised on it: its error is reported
                continue
            expected = outputs[index]
            if eps != source_eps:
                expected = shifted(expected, self.references[eps][index], self.references[source_eps][index])
            key = (1, first, second, 0 if how == "memory" else 1, index)
            self.check(key, target, label, index, out, expected, tolerance, recorded)

    def rebuilt_outputs(
        self,
        target: Target,
        source: Target,
        how: str,
        lent: Lent | None,
        exact: bool,
    ) -> Iterator[tuple[int, BERTOutput, tuple[str, ...] | None]]:
        """Each case's outputs, and the activations recorded, of ``target`` rebuilt from ``lent``: its own
        run's where the weights are ``exact``ly those it ran alone with."""
        if exact:
            for index, out in self.results[target].items():
                self.tick(index, f"{target} <- {source} ({how}, bit-exact)")
                yield index, out, self.recorded[target][index]
            return
        assert lent is not None  # the weights are lent unless they are known to be the target's own
        for model, indices in self.models(self.builder(target), *lent, rebuilt_from=f"{source}'s weights via {how}"):
            for index in indices:
                rebuilt = self.run_case(model, index, f"{target} <- {source} ({how})", target)
                if rebuilt is not None:
                    yield index, rebuilt, model.recorded
            del model

    def models(
        self, build: Build, config: BERTConfig, weights: dict[str, np.ndarray], rebuilt_from: str = ""
    ) -> Iterator[tuple[BackendModel, list[int]]]:
        """A model of ``build`` for each group of cases, cut to the group's max_len, with the group. The
        caller drops each before asking for the next. A model that cuts itself (``BackendModel.cut``: it
        shares the weights it keeps; a worker's takes none again) makes the next; any other is freed
        before the next is built."""
        previous: BackendModel | None = None
        for max_len, indices in self.groups.items():
            self.during = f"building its model (max_len {max_len}" + (
                f", from {rebuilt_from})" if rebuilt_from else ")"
            )
            model = None if previous is None else previous.cut(max_len)
            previous = None
            if model is None:
                release_memory()
                model = build(*cut_max_len(config, weights, max_len))
            yield model, indices
            previous = model
            del model

    def builder(self, target: Target) -> Build:
        """How ``target``'s models are built: only run, sharing the weights they are given."""
        backend = self.backends[target]
        options: dict[str, Any] = dict(target.options)
        return functools.partial(
            backend.build, device=target.device, dtype=target.dtype, gradients=False, share=True, **options
        )

    def weights_in(self, dtype: str) -> dict[str, np.ndarray]:
        """The weights in ``dtype``: cast once for every build of that dtype (the cast each build would
        make), or the source's, checked as the caller's dict is."""
        if self.weights is not None:
            return {name: np.asarray(array, dtype=dtype) for name, array in self.weights.items()}
        assert self.source is not None
        weights = self.source(dtype)
        validate_weights(self.config, weights)
        return weights

    def cast_away(self, held: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
        """The weights in ``dtype`` from the float64 ``held``, each tensor let go of once it is cast. From
        a source the cast is what it would give (``WeightsSource``), without drawing them again."""
        if self.source is None:
            held.clear()
            release_memory()
            return self.weights_in(dtype)
        return {name: held.pop(name).astype(dtype) for name in list(held)}

    def compute_references(self, weights: dict[str, np.ndarray]) -> None:
        """The oracle's outputs at each target's LayerNorm eps, from the float64 ``weights``; then the
        checks waiting for them go on, whether they were all made or not."""
        try:
            self.during = "computing the oracle's outputs at its LayerNorm eps"
            for target in list(self.backends):
                self.attempt(target, self.compute_reference, target, weights)
        finally:
            self.referenced.set()

    def reference(self, eps: float, index: int) -> BERTOutput:
        """The oracle's outputs for case ``index`` at ``eps``, once they are made."""
        waiting.wait(self.referenced)
        return self.references[eps][index]

    def compute_reference(self, target: Target, weights: dict[str, np.ndarray]) -> None:
        """The oracle's float64 outputs for every case at ``target``'s LayerNorm eps, from the float64
        ``weights``: once per eps, in ``self.references``."""
        eps = self.kernel_eps(target)
        if eps in self.references:
            return
        self.references[eps] = {}
        build = functools.partial(self.oracle.build, dtype="float64", layer_norm_eps=eps, share=True)
        for oracle, indices in self.models(build, self.config, weights):
            self.references[eps].update(
                (index, oracle(**self.cases[index].batch, intermediates=True)) for index in indices
            )
            del oracle

    def kernel_eps(self, target: Target) -> float:
        """The LayerNorm eps ``target``'s framework computes with, for the config's (asked once)."""
        if target not in self.eps:
            self.eps[target] = self.backends[target].kernel_eps(self.config.semantics.layer_norm_eps)
        return self.eps[target]

    def run_case(self, model: BackendModel, index: int, label: str, target: Target) -> BERTOutput | None:
        """Case ``index`` on ``model``; None where code a user wrote raised on it (a 2-D valid_lens that
        its mask cannot express, say): that case's error is reported, and the other cases still run."""
        self.tick(index, label)
        self.during = f"running case {self.cases[index].name}"
        try:
            return model(**self.cases[index].batch, intermediates=True)
        except UserCodeError as error:
            self.report.errors.append(RunError(target, self.during, str(error), self.cases[index].name))
            return None

    def tick(self, index: int, label: str) -> None:
        """A step of the progress: case ``index`` of ``label``."""
        with self.counting:
            if self.progress:
                alive = [target for target in self.targets if target in self.backends]  # not skipped, not broken
                planned = _planned_steps(alive, len(self.cases), self.pairs)
                self.progress(self.done, planned, f"{label}: {self.cases[index].name}")
            self.done += 1

    def check(
        self,
        key: tuple[int, ...],
        target: Target,
        label: str,
        index: int,
        out: BERTOutput,
        expected: BERTOutput,
        tolerance: Tolerance,
        recorded: tuple[str, ...] | None,
    ) -> None:
        outputs = compare_outputs(out, expected, tolerance, recorded)
        self.keyed_checks.append((key, Check(self.cases[index].name, target, label, *outputs)))


def _describe_exception(error: BaseException) -> str:
    """An exception's type, message and the line that raised it, in one line."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"
