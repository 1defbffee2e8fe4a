"""``verify``: hold a user's own BERT to the oracle (forward, gradients, loss) and say where it goes wrong,
in the user's names. The command line's ``bert-multi verify`` and ``bert_multi.testing`` call this."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.contract import BERTOutput, intermediate_names
from ..backend.registry import register_backend, unregister_backend
from ..engine.cases import CASES, get_case
from ..engine.compare import Comparison, tolerance_for
from ..engine.conform import Progress, run_conformance
from ..engine.report import failure_details
from ..engine.results import OUTPUT_NAMES, Report, Target
from ..errors import CannotRunHere, UsageError
from ..spec.config import CONFIGS, BERTConfig
from ..spec.inputs import check_inputs
from ..spec.schema import cut_max_len, random_weights, validate_weights
from ..spec.semantics import releases_of
from .gradients import CAUSES, GradientCheck, LossCheck, check_gradients, check_loss, resolve_frozen
from .map_file import MapFile, read_map
from .mistakes import MISTAKES, Diagnosis, Site, diagnose, nondeterminism
from .placement import ParameterMap
from .roles import decide_roles
from .subject import activation_of, call_user
from .user import Given, UserBackend, UserBERT


@dataclass
class VerifyReport:
    """What ``verify`` found: the forward conformance report, the gradient and loss checks, and how the
    user's parameters and activations were placed."""

    label: str
    config: BERTConfig
    mapping: ParameterMap
    activations: dict[str, str]  # canonical activation -> where it is in the user's model
    forward: Report
    gradients: list[GradientCheck] = field(default_factory=list)
    loss: LossCheck | None = None
    seed: int = 0  # of the weights and the cases
    gradients_skipped: dict[str, str] = field(default_factory=dict)  # device -> why its gradients were not taken
    map_file: MapFile | None = None
    diagnoses: list[Diagnosis] = field(default_factory=list)  # what each diverging module computes instead

    @property
    def passed(self) -> bool:
        """Every check asked for ran and passed (a forward run that compared nothing is a failure, and so is
        asking for gradients where none could be taken)."""
        return (
            self.forward.passed
            and (bool(self.gradients) or not self.gradients_skipped)
            and all(check.passed for check in self.gradients)
            and (self.loss is None or self.loss.passed)
        )

    def user_name(self, name: str) -> str:
        """A canonical parameter's or activation's place in the user's model, for a message."""
        if name in self.activations:
            return self.activations[name]
        if name in self.mapping.placements:
            return self.mapping.user_name(name)
        return name

    def verdict(self) -> str:
        """One sentence: does the user's model compute d2l's BERT, and if not, where it first goes wrong."""
        if self.passed:
            asked = ["its outputs and activations"]
            asked += ["its gradients"] if self.gradients else []
            asked += ["its loss"] if self.loss else []
            name = self.config.semantics.name
            what = "the original BERT" if name == "bert" else f"the BERT of {releases_of(name).split(' (')[0]}"
            skipped = [f"{t.dtype} on {t.device}" for t in self.forward.skipped]
            skipped += [f"gradients on {device}" for device in self.gradients_skipped]
            unrun = f" (not run here: {', '.join(skipped)})" if skipped else ""
            return f"PASS: {self.label} computes {what}: {', '.join(asked)} conform{unrun}."
        failures = self.forward.failures()
        if failures:
            order = [*intermediate_names(self.config), *OUTPUT_NAMES]
            check = min(failures, key=lambda check: order.index(check.first_divergence.name))  # type: ignore[union-attr]
            first = check.first_divergence
            assert first is not None
            found = next((d for d in self.diagnoses if d.activation == first.name and d.mistake is not None), None)
            instead = f": it {found.mistake.says(found.rule, self.config)}" if found and found.mistake else ""
            return (
                f"FAIL: {self.label} first diverges at {first.name} (yours: {self.user_name(first.name)}), "
                f"case {check.case}, {check.target.dtype} on {check.target.device}{instead}."
            )
        if not self.forward.passed:
            return f"FAIL: {self.label}'s forward did not run through (see the errors above)."
        broken = next((check for check in self.gradients if not check.passed), None)
        if broken is not None:
            own = broken.caused_by("backward")
            where = own or broken.ungraded or [c.name for c in broken.comparisons if not c.passed]
            if not where:
                return f"FAIL: {self.label}'s gradient of the {broken.scalar} compared no parameter."
            why = (": no gradient reaches it" if where[0] in broken.ungraded
                   else ": its module's own backward gives another gradient" if own else "")  # fmt: skip
            return (
                f"FAIL: {self.label}'s outputs conform, but its gradient of the {broken.scalar} does not, at "
                f"{self.user_name(where[0])}{why}."
            )
        return f"FAIL: {self.label}'s outputs conform, but its loss does not."

    def failures(self) -> str:
        """Where each failing check first goes wrong, in the user's names (empty when all passed)."""
        lines = [failure_details(self.forward, self.user_name)] if not self.forward.passed else []
        lines += [f"diagnosis: {diagnosis.describe()}" for diagnosis in self.diagnoses]
        for check in self.gradients:
            lines += [f"gradient of the {check.scalar} ({check.device}): {line}" for line in self.gradient_lines(check)]
        if self.loss is not None:
            lines += self.loss.problems()
        return "\n".join(lines)

    def gradient_lines(self, check: GradientCheck) -> list[str]:
        """What differs in one gradient check, put down to its causes where modules were checked alone."""
        if not check.causes:
            if check.ungraded:
                return [f"no gradient reaches {', '.join(self.user_name(name) for name in check.ungraded)}"]
            first = check.first_divergence
            return [] if first is None else [self._in_user_names(first)]
        lines = []
        follows = check.caused_by("forward")
        if follows:
            lines.append(f"{self._modules(follows)} compute other values from the oracle's input, and the gradients "
                         f"of their {len(follows)} parameter(s) differ with them")  # fmt: skip
        own = check.caused_by("backward")
        if own:
            missing = [self.user_name(name) for name in own if name in check.ungraded]
            wrong = [c for c in check.comparisons if c.name in own and not c.passed]
            said = ([f"no gradient reaches {', '.join(missing)}"] if missing else []) + (
                [f"worst {self._in_user_names(max(wrong, key=lambda c: c.ratio))}"] if wrong else []
            )
            lines.append(f"the backward of {self._modules(own)} is wrong on its own (fed the oracle's input and "
                         f"output gradient): {'; '.join(said)}")  # fmt: skip
        carried = check.caused_by("carried")
        if carried:
            lines.append(f"{len(carried)} other parameter(s) get the oracle's gradient when their modules are checked "
                         "alone: their differences are carried from the above")  # fmt: skip
        return lines

    def _in_user_names(self, comparison: Comparison) -> str:
        return dataclasses.replace(comparison, name=self.user_name(comparison.name)).describe()

    def _modules(self, parameters: list[str]) -> str:
        """The modules holding ``parameters``: each by the activation it computes and, where its parameters'
        names in the user's model share a prefix, that prefix."""
        groups: dict[str, list[list[str]]] = {}
        for name in parameters:
            groups.setdefault(activation_of(self.config, name), []).append(self.user_name(name).split("."))
        named = []
        for module, names in groups.items():
            common = [level[0] for level in itertools.takewhile(lambda level: len(set(level)) == 1, zip(*names))]
            prefix = ".".join(common if len(names) > 1 else names[0][:-1])
            named.append(f"{module} (yours: {prefix})" if prefix else module)
        return ", ".join(named)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.label,
            "passed": self.passed,
            "parameters placed by": self.mapping.how,
            "placements": {name: self.mapping.user_name(name) for name in self.mapping.placements},
            "activations": self.activations,
            "forward": self.forward.to_json(),
            "gradients": [
                {
                    "scalar": check.scalar,
                    "device": check.device,
                    "passed": check.passed,
                    "no_gradient": list(check.ungraded),
                    "frozen": list(check.frozen),
                    "worst": _worst(check),
                    "causes": {self.user_name(name): CAUSES[cause] for name, cause in check.causes.items()},
                }
                for check in self.gradients
            ],
            "gradients_skipped": self.gradients_skipped,
            "diagnoses": [
                {
                    "activation": d.activation,
                    "module": d.where,
                    "mistake": d.mistake.name if d.mistake else None,
                    "change": {key: str(value) for key, value in d.rule.items()},
                    "reproduces_to": d.error,
                    "d2l_rule_off_by": d.off,
                    "said": d.describe(),
                }
                for d in self.diagnoses
            ],
            "loss": None
            if self.loss is None
            else {
                "passed": self.loss.passed,
                "normalization": self.loss.normalization,
                "values": list(self.loss.values),
                "diagnosis": self.loss.diagnosis,
            },
        }


def _worst(check: GradientCheck) -> dict[str, Any] | None:
    if not check.comparisons:
        return None
    worst = max(check.comparisons, key=lambda c: c.ratio)
    return {"parameter": worst.name, "max_abs": worst.max_abs, "ratio": worst.ratio}


def load_factory(spec: str) -> tuple[Callable[..., Any], str]:
    """``FILE.py:NAME`` or ``package.module:NAME``: the object, and a label for reports. Importing runs
    the user's module, so what it raises is theirs (``UserCodeError``)."""
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise UsageError(f"{spec!r}: expected FILE.py:FACTORY or package.module:FACTORY")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"{spec!r}: no file {where}")
        module_name = f"bert_multi_user_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        sys.path.insert(0, str(path.resolve().parent))  # so that it imports its neighbours
        try:
            call_user(f"importing {where}", loader.loader.exec_module, module)
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        if importlib.util.find_spec(where.split(".")[0]) is None:
            raise UsageError(f"{spec!r}: no module {where!r} can be imported here")
        module = call_user(f"importing {where}", importlib.import_module, where)
    if not hasattr(module, name):
        found = [n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise UsageError(f"{spec!r}: {where} has no {name!r}; it defines {found[:10]}")
    return getattr(module, name), f"{Path(where).name}:{name}"


def verify(
    model: Any,
    config: BERTConfig | str = "chapter",
    *,
    weights: dict[str, np.ndarray] | None = None,
    dtypes: Sequence[str] = ("float32", "float64"),
    devices: Sequence[str] = ("cpu",),
    cases: Iterable[str] | None = None,
    gradients: bool = False,
    frozen: Iterable[str] = (),
    loss: Callable[..., Any] | None = None,
    mlm_normalization: str = "real_slots",
    map_file: MapFile | str | Path | None = None,
    seed: int = 0,
    label: str | None = None,
    progress: Progress | None = None,
) -> VerifyReport:
    """Hold ``model`` (a factory ``factory(config)``, or a model object) to the oracle.

    Its forward runs every case (or those named) at each dtype and device, with activations compared at
    the modules its parameter mapping locates; with ``gradients``, each parameter's float64 gradient of
    two fixed scalars is compared with the gradient oracle's (``frozen``: parameters meant to get none);
    with ``loss`` (d2l's ``_get_batch_loss_bert`` signature), its value with the loss whose masked-LM
    part is averaged as ``mlm_normalization`` says. ``weights``: canonical weights (default: random from
    ``seed``). A mapping or set-up problem raises (``MappingError``, ``UsageError``); an exception in
    the user's own code raises ``UserCodeError`` with their frames."""
    config = CONFIGS[config] if isinstance(config, str) and config in CONFIGS else config
    if not isinstance(config, BERTConfig):
        raise UsageError(f"config {config!r}: expected a BERTConfig or one of {sorted(CONFIGS)}")
    weights = random_weights(config, seed=seed, dtype="float64") if weights is None else weights
    validate_weights(config, weights)
    if map_file is not None and not isinstance(map_file, MapFile):
        map_file = read_map(map_file)
    given = Given.of(model, label)
    chosen = CASES if cases is None else [get_case(name) for name in cases]
    backend = UserBackend(given, map_file)
    register_backend(backend, role="subject", label=given.label)
    try:
        # Set-up first, on the CPU in float64: making, mapping, loading and one forward of the model, so
        # that a mapping problem or an exception in the user's code stops here, before any comparison.
        probe = backend.build(config, weights, "cpu", "float64")
        # What cannot be checked is refused before any work.
        if loss is not None and not hasattr(probe.subject, "batch_loss"):
            raise UsageError(f"--loss needs d2l's loss in your model's framework; {probe.subject.framework} has none "
                             "to follow (d2l wrote it for PyTorch and Gluon)")  # fmt: skip
        if gradients and not hasattr(probe.subject, "vjp"):
            raise UsageError(f"{probe.subject.framework} gives no gradients (a NumPy-protocol model needs a gradients "
                             "method)")  # fmt: skip
        probe = _decided(backend, probe, weights, next(case.input(config, seed) for case in chosen).batch)
        frozen_names = resolve_frozen(frozen, probe.mapping)
        backend.keep_spare(probe)
        targets = [Target(given.label, dtype, device) for device in devices for dtype in dtypes]
        inputs = [case.input(config, seed) for case in chosen]
        forward = run_conformance(config, weights, targets, inputs, pairs=True, progress=progress)
        # The set-up model, for the checks below, given the float64 weights anew: a model the user gave as
        # one instance holds whatever the run's last build gave it.
        backend.keep_spare(probe)
        probe = backend.build(config, weights, "cpu", "float64")
        report = VerifyReport(given.label, config, probe.mapping, probe.activation_names(), forward, seed=seed)
        report.map_file = map_file
        report.diagnoses = diagnose_divergences(report, backend, weights)
        eps = backend.kernel_eps(config.semantics.layer_norm_eps)
        if gradients:
            for device in devices:
                try:
                    model64 = probe if device == "cpu" else backend.build(config, weights, device, "float64")
                except CannotRunHere as error:
                    report.gradients_skipped[device] = str(error)
                    continue
                subject, mapping, taps = model64.subject, model64.mapping, model64.taps
                report.gradients += check_gradients(
                    config, weights, subject, mapping, device, frozen_names, seed, eps, taps
                )
        if loss is not None:
            report.loss = check_loss(config, weights, probe.subject, loss, mlm_normalization, seed, eps)
        return report
    finally:
        unregister_backend(given.label)


def _decided(backend: UserBackend, probe: UserBERT, weights: dict[str, np.ndarray], batch: dict) -> UserBERT:
    """The set-up model after one forward on ``batch``; where its placement was inferred (the order of use
    only suggests it), rebuilt with the roles the oracle decides from that forward's activations."""
    out = call_user(f"your model {backend.given.label}", probe, **batch, intermediates=True)
    if not probe.mapping.inferred:
        return probe
    recorded = _recorded(out)
    config = probe.config
    decided, _ = decide_roles(probe.mapping, config, weights, check_inputs(config, **batch), recorded)
    if decided is probe.mapping:
        return probe
    backend.decided = decided
    probe = backend.build(config, weights, "cpu", "float64")
    call_user(f"your model {backend.given.label}", probe, **batch)
    return probe


def diagnose_divergences(report: VerifyReport, backend: UserBackend, weights: dict[str, np.ndarray]) -> list[Diagnosis]:
    """What the user's module computes instead at each distinct first divergence, from a float64 run on the
    CPU of the first case that shows it: dropout left on if two runs of it differ, else the catalogue's
    mistake that reproduces the module's output from its own recorded input (``mistakes.diagnose``)."""
    found: list[Diagnosis] = []
    seen: set[str] = set()
    for check in sorted(report.forward.failures(), key=lambda check: check.target.dtype != "float64"):
        first = check.first_divergence
        assert first is not None
        if first.name in seen:
            continue
        seen.add(first.name)
        case = get_case(check.case).input(report.config, report.seed)
        config, cut = cut_max_len(report.config, weights, case.max_len) if case.max_len else (report.config, weights)
        model = backend.build(config, cut, "cpu", "float64")
        out, again = (call_user(f"your model {report.label}", model, **case.batch, intermediates=True) for _ in "12")
        recorded = _recorded(out)
        where = _module(report.user_name(first.name))
        apart = nondeterminism(recorded, {**(again.intermediates or {}), "encoded": again.encoded})
        if apart > 0:
            found.append(Diagnosis(first.name, where, MISTAKES["dropout_at_inference"], {"apart": apart}, 0.0, apart,
                                   config))  # fmt: skip
            continue
        inputs = check_inputs(config, **case.batch)
        diagnosis = diagnose(Site(config, cut, inputs, first.name, recorded), where, tolerance_for("float64"))
        if diagnosis is not None:
            found.append(diagnosis)
    return found


def _recorded(out: BERTOutput) -> dict[str, np.ndarray | None]:
    """Everything a run recorded, by name: its activations and its outputs ("encoded", "mlm", "nsp")."""
    return {**(out.intermediates or {}), "encoded": out.encoded, "mlm": out.mlm, "nsp": out.nsp}


def _module(place: str) -> str:
    """Where an activation is, as a module: "layers.0.norm1" for its output, "the input of ..." else."""
    path, _, side = place.rpartition(" (")
    if not path:
        return place
    return path if side == "output)" else f"the input of {path}"


__all__ = ["VerifyReport", "UserBERT", "diagnose_divergences", "load_factory", "verify"]
