"""``verify``: hold a user's own BERT to the oracle (forward, gradients, loss) and say where it goes wrong,
in the user's names. The command line's ``bert-multi verify`` and ``bert_multi.testing`` call this."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.contract import BERTOutput, parse_device
from ..backend.registry import register_backend, unregister_backend
from ..engine.cases import CASES, get_case
from ..engine.compare import tolerance_for
from ..engine.conform import Progress, run_conformance
from ..engine.results import Target, computation_rank
from ..errors import CannotRunHere, UsageError
from ..spec.config import CONFIGS, HEADS, BERTConfig
from ..spec.inputs import check_inputs
from ..spec.schema import cut_max_len, head_of, param_shapes, random_weights, validate_weights, without_heads
from .diagnosis import Diagnosis, diagnose, nondeterminism
from .findings import VerifyReport
from .gradients import check_gradients, check_loss, resolve_frozen
from .map_file import MapFile, read_map
from .mapping import MappingError, may_lack
from .mistakes import LAYERS_IN_FORWARD, MISTAKES, PARAMETERS_CHANGED
from .roles import decide_roles
from .rules import Site
from .subject import ProtocolSubject, call_user
from .user import Given, UserBackend, UserBERT


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
        # What it defines itself, d2l's _private helpers included, not what it imports.
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("__")
                 and getattr(v, "__module__", None) == module.__name__]  # fmt: skip
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
    config, weights = _config_and_weights(config, weights, seed)
    if map_file is not None and not isinstance(map_file, MapFile):
        map_file = read_map(map_file)
    absent = _declared_absent(config, map_file)
    config = _without(config, absent)
    weights = {name: weights[name] for name in param_shapes(config)}
    given = Given.of(model, label)
    chosen = CASES if cases is None else [get_case(name) for name in cases]
    if gradients and "float64" not in dtypes:
        raise UsageError("gradients are checked in float64, against the float64 gradient oracle: add float64 to the "
                         f"dtypes (asked: {', '.join(dtypes)})")  # fmt: skip
    backend = UserBackend(given, map_file)
    backend.lacking = config.heads != HEADS
    register_backend(backend, role="subject", label=given.label)
    # The set-up, and the diagnosis of what diverges, run at one of the dtypes and devices asked for: float64
    # on the CPU where asked (a model that computes only in float32, or only on a GPU, is set up so).
    setup = ("float64" if "float64" in dtypes else dtypes[0], "cpu" if "cpu" in devices else devices[0])
    try:
        probe, config, weights = _set_up(backend, config, weights, setup, absent)
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
        # The set-up model, for the checks below, given the set-up's weights anew: a model the user gave as
        # one instance holds whatever the run's last build gave it.
        backend.keep_spare(probe)
        probe = backend.build(config, weights, setup[1], setup[0])
        report = VerifyReport(given.label, config, probe.mapping, probe.activation_names(), forward, seed=seed)
        report.map_file = map_file
        report.absent = {head: why for head, why in absent.items() if head is not None}
        stages = _Stages(given.label, progress, gradients, loss is not None)
        stages.start("the diagnosis")
        report.diagnoses = diagnose_divergences(report, backend, weights, *setup)
        eps = backend.kernel_eps(config.semantics.layer_norm_eps)
        if gradients:
            stages.start("gradients")
            _check_gradients(report, backend, probe, weights, devices, frozen_names, eps)
        if loss is not None:
            stages.start("d2l's loss")
            report.loss = check_loss(config, weights, probe.subject, loss, mlm_normalization, seed, eps)
        stages.start("checked")
        return report
    finally:
        unregister_backend(given.label)


def _declared_absent(config: BERTConfig, map_file: MapFile | None) -> dict[str | None, str]:
    """The parts after the encoder that are not to be checked, and why: not in the config, or declared
    absent by the map file (a tensor of the encoder cannot be: a ``UsageError``)."""
    absent: dict[str | None, str] = {head: "not in the config asked for" for head in HEADS if head not in config.heads}
    if map_file is not None:
        absent.update(_parts_of(config, map_file.lacking(param_shapes(config)), f"{map_file.source} says it lacks"))
        if None in absent:
            tensors = absent[None].split(" lacks ")[-1]
            raise UsageError(
                f"{map_file.source}: {tensors} are the encoder's, which verify checks in every model: only a part "
                "after it (pooler, mlm, nsp) can be absent"
            )
    return absent


# Why a pooler is not checked where nothing verify observes shows it.
UNSEEN_POOLER = (
    "no NSP classifier reads it, and no module of your model is known to output it (a map file's pooler_output "
    "names one)"
)


def _set_up(
    backend: UserBackend,
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    setup: tuple[str, str],
    absent: dict[str | None, str],
) -> tuple[UserBERT, BERTConfig, dict[str, np.ndarray]]:
    """The model made, its weights placed and loaded, at the set-up's (dtype, device), so that a mapping
    problem or an exception in the user's code stops the run before any comparison. Where nothing in the
    model is found for some of a head's tensors only, the model lacks that head: ``absent`` says so, and
    the model, its config and weights without it come back. A tensor it may lack (``may_lack``: a fixed
    table for the positions, a LayerNorm left out) is placed nowhere, and what the model computes in its
    place is compared. A pooler that nothing observed shows (no NSP classifier reads it, and its class
    names no module whose output it is: ``Subject.pooled_at``) is not checked either, and ``absent`` says so."""
    try:
        probe = backend.build(config, weights, setup[1], setup[0])
    except MappingError as error:
        kept = tuple(name for name in error.unplaced if may_lack(name))
        lacked = _parts_of(
            config, [name for name in error.unplaced if name not in kept], "your model has no parameters for"
        )
        if not (lacked or kept) or None in lacked:
            raise
        backend.kept = kept
        absent.update(lacked)
        config, weights = _lacking(backend, config, weights, absent)
        probe = backend.build(config, weights, setup[1], setup[0])
    if "nsp" not in config.heads and "pooler" in config.heads and "pooler" not in probe.taps \
            and not isinstance(probe.subject, ProtocolSubject):  # fmt: skip
        absent["pooler"] = UNSEEN_POOLER
        config, weights = _lacking(backend, config, weights, absent)
        probe = backend.build(config, weights, setup[1], setup[0])
    return probe, config, weights


def _lacking(
    backend: UserBackend, config: BERTConfig, weights: dict[str, np.ndarray], absent: dict[str | None, str]
) -> tuple[BERTConfig, dict[str, np.ndarray]]:
    """``config`` and ``weights`` without the ``absent`` parts, which ``backend``'s model is then built
    without (its parameters for parts it lacks ignored; a tensor it may lack is no part)."""
    config = _without(config, absent)
    backend.lacking = backend.lacking or config.heads != HEADS
    return config, {name: weights[name] for name in param_shapes(config)}


def _check_gradients(
    report: VerifyReport,
    backend: UserBackend,
    probe: UserBERT,
    weights: dict[str, np.ndarray],
    devices: Sequence[str],
    frozen: set[str],
    eps: float,
) -> None:
    """Every parameter's float64 gradient on each device (the set-up model's on the CPU), into ``report``;
    a device the model cannot use is said to be skipped."""
    config = report.config
    for device in devices:
        try:
            model64 = probe if device == "cpu" else backend.build(config, weights, device, "float64")
        except CannotRunHere as error:
            report.gradients_skipped[device] = str(error)
            continue
        subject, mapping, taps = model64.subject, model64.mapping, model64.taps
        report.gradients += check_gradients(config, weights, subject, mapping, device, frozen, report.seed, eps, taps)


def _without(config: BERTConfig, absent: dict[str | None, str]) -> BERTConfig:
    """``config`` without the ``absent`` heads, and ``absent`` told of a head that goes with them (the NSP
    classifier reads the pooler; in d2l 0.11 the two are one head), so that the report lists every part
    not checked."""
    without = without_heads(config, [head for head in absent if head is not None])
    for head in config.heads:
        if head not in without.heads and head not in absent:
            absent[head] = (
                "it reads the pooler, which is not checked" if head == "nsp" else "one head with the NSP classifier"
            )
    return without


def _parts_of(config: BERTConfig, names: Iterable[str], why: str) -> dict[str | None, str]:
    """The parts the canonical tensors ``names`` belong to (``HEADS``; None for the encoder), each with why
    it is not checked: ``why`` and its tensors."""
    grouped: dict[str | None, list[str]] = {}
    for name in names:
        grouped.setdefault(head_of(config, name), []).append(name)
    return {part: f"{why} {', '.join(found[:3])}{' ...' if len(found) > 3 else ''}" for part, found in grouped.items()}


def _decided(backend: UserBackend, probe: UserBERT, weights: dict[str, np.ndarray], batch: dict) -> UserBERT:
    """The set-up model after one forward on ``batch``; where its placement was inferred (the order of use
    only suggests it), rebuilt with the roles the oracle decides from that forward's activations."""
    out = call_user(f"your model {backend.given.label}", probe.recording_inputs(), **batch, intermediates=True)
    if not probe.mapping.inferred:
        return probe
    recorded = _recorded(out)
    config = probe.config
    decided, _ = decide_roles(probe.mapping, config, weights, check_inputs(config, **batch), recorded)
    if decided is probe.mapping:
        return probe
    backend.decided = decided
    probe = backend.build(config, weights, str(probe.device), probe.dtype)
    call_user(f"your model {backend.given.label}", probe, **batch)
    return probe


def diagnose_divergences(
    report: VerifyReport,
    backend: UserBackend,
    weights: dict[str, np.ndarray],
    dtype: str = "float64",
    device: str = "cpu",
) -> list[Diagnosis]:
    """What the user's modules compute instead: every activation that diverges in any case, each once, in
    computation order, from a run in ``dtype`` on ``device`` (the set-up's: float64 on the CPU where asked)
    of the first case that shows it. Dropout left on if two runs of that case differ; else, for each, the
    catalogue's mistake that reproduces the module's output from its own recorded input
    (``diagnosis.diagnose``), so that a module fed a difference from upstream is not blamed for it and every
    module that differs itself is named, not only the first."""
    wanted: dict[str, list[str]] = {}  # case -> the activations it is the first to show diverging
    seen: set[str] = set()
    for check in sorted(report.forward.failures(), key=lambda check: check.target.dtype != dtype):
        diverging = sorted(
            (c for c in check.intermediates + check.outputs if not c.passed), key=lambda c: computation_rank(c.name)
        )
        for comparison in diverging:
            if comparison.name not in seen and comparison.name != "intermediates":
                seen.add(comparison.name)
                wanted.setdefault(check.case, []).append(comparison.name)
    found: list[Diagnosis] = []
    tolerance = tolerance_for(dtype, parse_device(device).kind)
    for name, activations in wanted.items():
        case = get_case(name).input(report.config, report.seed)
        config, cut = cut_max_len(report.config, weights, case.max_len) if case.max_len else (report.config, weights)
        model = backend.build(config, cut, device, dtype).recording_inputs()
        before = _parameters(model)
        out, again = (call_user(f"your model {report.label}", model, **case.batch, intermediates=True) for _ in "12")
        recorded = _recorded(out)
        apart = nondeterminism(recorded, {**(again.intermediates or {}), "encoded": again.encoded})
        if apart > 0:
            where = _module(report.user_name(activations[0]))
            made = sorted({report.mapping.module_of(name) or "the model" for name in report.mapping.placements
                           if report.mapping.placements[name].name in report.mapping.made})  # fmt: skip
            changed = _changed(before, _parameters(model))
            if changed:
                mistake, rule = PARAMETERS_CHANGED, {"apart": apart, "changed": changed}
            elif made:
                mistake, rule = LAYERS_IN_FORWARD, {"apart": apart, "made": ", ".join(made)}
            else:
                mistake, rule = MISTAKES["dropout_at_inference"], {"apart": apart}
            found.append(Diagnosis(activations[0], where, mistake, rule, 0.0, apart, config))
        inputs = check_inputs(config, **case.batch)
        for activation in activations[1:] if apart > 0 else activations:
            site = Site(config, cut, inputs, activation, recorded)
            diagnosis = diagnose(site, _module(report.user_name(activation)), tolerance)
            # Where two runs differ, what no mistake reproduces may be that randomness: only what one does is said.
            if diagnosis is not None and (apart == 0 or diagnosis.mistake is not None):
                found.append(diagnosis)
    return sorted(found, key=lambda diagnosis: computation_rank(diagnosis.activation))


def _parameters(model: UserBERT) -> dict[str, np.ndarray]:
    """The user's parameters as they are now, by their names (none for a NumPy-protocol model, which
    shows only what it was given)."""
    return {} if isinstance(model.subject, ProtocolSubject) else model.subject.arrays()


def _changed(before: dict[str, np.ndarray], after: dict[str, np.ndarray], shown: int = 5) -> str:
    """The parameters that differ between two readings, for a sentence ("" where none does)."""
    changed = [
        name
        for name, value in before.items()
        if name not in after or not np.array_equal(value, after[name], equal_nan=True)
    ]
    more = f" and {len(changed) - shown} more" if len(changed) > shown else ""
    return ", ".join(changed[:shown]) + more


def _config_and_weights(
    config: BERTConfig | str, weights: dict[str, np.ndarray] | None, seed: int
) -> tuple[BERTConfig, dict[str, np.ndarray]]:
    """The config asked for (a built-in one by name) and its weights, checked (random from ``seed``)."""
    config = CONFIGS[config] if isinstance(config, str) and config in CONFIGS else config
    if not isinstance(config, BERTConfig):
        raise UsageError(f"config {config!r}: expected a BERTConfig or one of {sorted(CONFIGS)}")
    weights = random_weights(config, seed=seed, dtype="float64") if weights is None else weights
    validate_weights(config, weights)
    return config, weights


class _Stages:
    """The checks after the forward run, each told to ``progress`` as it starts (a log hears of it at once)."""

    def __init__(self, label: str, progress: Progress | None, gradients: bool, loss: bool) -> None:
        self.label, self.progress = label, progress
        self.names = ["the diagnosis", *(["gradients"] if gradients else []), *(["d2l's loss"] if loss else [])]

    def start(self, name: str) -> None:
        if self.progress is not None:
            done = len(self.names) if name == "checked" else self.names.index(name)
            self.progress(done, len(self.names), f"{self.label}: {name}")


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
