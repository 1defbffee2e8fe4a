"""Gradients and the pretraining loss of a user's model, held to the float64 gradient oracle
(``bert_multi.backend.backward``).

Two fixed scalars are differentiated: a seeded random projection of every output (reaches every
parameter the outputs depend on) and d2l's pretraining loss of a fixed batch with fixed labels (what
training follows). The user's model gives each parameter's gradient by its framework's autograd; the
oracle by hand-written derivatives. A parameter with no gradient where the oracle has one is a failure
naming it, unless it is stated to be frozen.

Where a framework can (``Subject.isolated_vjp``), each module's backward is then checked alone: every
located activation is made the oracle's, value and gradient, so a module's parameters get what its own
backward gives from the oracle's input and output gradient. Each differing gradient is then put down to
its cause: its module computes other values from the oracle's input (the gradient follows from that
forward divergence), its module's backward alone is wrong (a detached or missing gradient, a hand-written
backward), or it is right alone and the difference is carried from elsewhere.
"""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backend import backward, oracle
from ..engine.cases import get_case
from ..engine.compare import Comparison, Tolerance, compare_arrays, tolerance_for
from ..errors import UsageError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs, check_inputs
from ..spec.loss import MLM_NORMALIZATIONS
from .placement import ParameterMap
from .subject import Cotangents, Subject, Taps, activation_of, call_user

# Measured (docs/tolerances.md, "Gradients"): PyTorch's and MXNet's float64 autograd agree with the
# oracle to about 1e-15 on gradients up to about 1; planted faults move gradients by 1e-3 and more.
GRADIENT_TOLERANCE = Tolerance(atol=1e-9, rtol=1e-7)
EMBEDDING_TABLES = ("encoder.token_embedding.weight", "encoder.segment_embedding.weight")
MAX_PADDING_ROWS = 2  # rows of a table that alone differ, said to be padding rows
LOSS_TOLERANCE = Tolerance(atol=1e-9, rtol=1e-9)
SCALARS = ("random projection", "pretraining loss")
# Why a parameter's gradient differs, found by checking its module alone.
CAUSES = {
    "forward": "its module computes other values from the oracle's input, and its gradients follow",
    "backward": "its module's backward alone gives another gradient (or none) from the oracle's",
    "carried": "right when its module is checked alone: carried from a divergence elsewhere",
}


def gradient_batch(config: BERTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """A pretraining batch with fixed labels: the ``mixed_valid_lens`` case's inputs with lengths T, T/2,
    1 and 1, masked-LM labels, and weights that make two prediction slots padding (weight 0), so that a
    loss averaged over the padding differs from the masked mean.

    No length is 0, as in pretraining data (<cls> and <sep> at least): with every key masked, d2l's
    attention is uniform whatever the scores, so no gradient reaches them, while an additive mask
    (transformers') is uniform only by rounding and passes the scores' gradient on; the forward cases
    cover length 0."""
    batch = {name: np.asarray(array) for name, array in get_case("mixed_valid_lens").batch(config, seed).items()}
    batch["valid_lens"] = np.maximum(batch["valid_lens"], 1)
    rng = np.random.default_rng(seed + 1)
    B, P = batch["pred_positions"].shape
    weights = np.ones((B, P))
    weights[0, -1] = weights[2, -1] = 0.0
    return {
        **batch,
        "mlm_labels": rng.integers(0, config.vocab_size, size=(B, P)),
        "mlm_weights": weights,
        "nsp_labels": np.arange(B) % 2,
    }


@dataclass(frozen=True)
class GradientCheck:
    """Every parameter's gradient of one scalar, against the oracle's."""

    scalar: str
    device: str
    comparisons: tuple[Comparison, ...]  # per canonical parameter
    ungraded: tuple[str, ...]  # no gradient where the oracle has one: a failure
    frozen: tuple[str, ...]  # stated to be frozen, so not compared
    # Each differing parameter -> a key of CAUSES; empty where modules could not be checked alone.
    causes: Mapping[str, str] = field(default_factory=dict)
    # An embedding table that differs only in a row or two -> those rows (a padding_idx's, most likely).
    rows_alone_differing: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.comparisons) and not self.ungraded and all(c.passed for c in self.comparisons)

    @property
    def first_divergence(self) -> Comparison | None:
        return next((c for c in self.comparisons if not c.passed), None)

    def caused_by(self, cause: str) -> list[str]:
        """The differing parameters put down to ``cause``, in canonical order."""
        return [name for name, found in self.causes.items() if found == cause]


@dataclass(frozen=True)
class LossCheck:
    """The user's loss function on the fixed batch, against the loss with the stated MLM averaging."""

    normalization: str
    values: tuple[float, float, float]  # the user's (mlm, nsp, total)
    comparisons: tuple[Comparison, ...]
    diagnosis: str | None  # what the numbers show the function does, when it fails

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def problems(self) -> list[str]:
        """Each value out of tolerance, and what the numbers show the function does."""
        return [c.describe() for c in self.comparisons if not c.passed] + ([self.diagnosis] if self.diagnosis else [])


def resolve_frozen(names: Iterable[str], mapping: ParameterMap) -> set[str]:
    """The canonical tensors that ``names`` (the user's parameter names or canonical ones) state frozen."""
    frozen = set()
    for name in names:
        found = {c for c, placement in mapping.placements.items() if name in (c, placement.name)}
        if not found:
            known = list(mapping.shapes) + list(mapping.placements)
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise UsageError(f"--frozen {name!r}: no parameter of your model or canonical tensor has that name{hint}")
        frozen |= found
    return frozen


def projection(outputs: Sequence[np.ndarray | None], seed: int) -> Cotangents:
    """Seeded standard-normal multipliers of each output's shape (None for an absent output)."""
    rng = np.random.default_rng(seed + 7)
    encoded, mlm, nsp = (None if o is None else rng.standard_normal(o.shape) for o in outputs)
    assert encoded is not None
    return Cotangents(encoded, mlm, nsp)


@dataclass(frozen=True)
class _Setting:
    """What each scalar's check shares: the subject, the fixed inputs and the oracle's activations."""

    config: BERTConfig
    weights: dict[str, np.ndarray]
    subject: Subject
    mapping: ParameterMap
    device: str
    frozen: set[str]
    inputs: ModelInputs
    eps: float | None
    taps: Taps  # where each activation is in the user's model: what can be made the oracle's
    reference: dict[str, np.ndarray]  # the oracle's activations and outputs


def check_gradients(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    subject: Subject,
    mapping: ParameterMap,
    device: str,
    frozen: set[str],
    seed: int = 0,
    layer_norm_eps: float | None = None,
    taps: Taps | None = None,
) -> list[GradientCheck]:
    """Both scalars' gradients of the float64 ``subject`` (holding ``weights``) against the oracle's,
    computed with the LayerNorm eps the subject's framework uses (``layer_norm_eps``); with ``taps`` (every
    activation located), differing gradients are put down to their causes module by module."""
    if not hasattr(subject, "vjp"):
        raise UsageError(f"{subject.framework} gives no gradients (a NumPy-protocol model needs a gradients method)")
    batch = gradient_batch(config, seed)
    inputs = check_inputs(config, batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    record: OrderedDict[str, np.ndarray] = OrderedDict()
    out = oracle.forward(config, weights, inputs, record, layer_norm_eps=layer_norm_eps)
    heads = {"mlm": out.mlm, "nsp": out.nsp}
    reference = {**record, **{name: value for name, value in heads.items() if value is not None}}
    located = taps is not None and set(record) <= set(taps) and hasattr(subject, "isolated_vjp")
    setting = _Setting(config, weights, subject, mapping, device, frozen, inputs, layer_norm_eps,
                       taps if located and taps is not None else {}, reference)  # fmt: skip
    cotangents = projection((out.encoded, out.mlm, out.nsp), seed)
    checks = [_compare(setting, SCALARS[0], cotangents, cotangents)]
    if "mlm" in config.heads and "nsp" in config.heads:
        (_, mlm, nsp), _ = call_user("your model", subject.run, inputs, {})
        assert mlm is not None and nsp is not None and out.mlm is not None and out.nsp is not None
        zero = np.zeros_like(out.encoded)
        own = Cotangents(zero, *backward.loss_cotangents(config, mlm, nsp, batch, "real_slots"))
        oracles = Cotangents(zero, *backward.loss_cotangents(config, out.mlm, out.nsp, batch, "real_slots"))
        checks.append(_compare(setting, SCALARS[1], own, oracles))
    return checks


def _compare(setting: _Setting, scalar: str, cotangents: Cotangents, oracles: Cotangents) -> GradientCheck:
    """The user's gradient of sum(``cotangents`` * its outputs) against the oracle's of sum(``oracles`` *
    the oracle's outputs): the same scalar's, each at its own outputs."""
    config, subject, mapping = setting.config, setting.subject, setting.mapping
    flowing: dict[str, np.ndarray] = {}  # the oracle's gradient of each activation
    expected = backward.gradients(config, setting.weights, setting.inputs, *oracles, setting.eps, record=flowing)
    shapes = {name: array.shape for name, array in expected.items()}
    own = call_user("your model's backward pass", subject.vjp, setting.inputs, cotangents)  # type: ignore[attr-defined]
    got = mapping.to_canonical(own, shapes)
    comparisons, ungraded = [], []
    for name, reference in expected.items():
        if name in setting.frozen:
            continue
        if _gets_none(got.get(name), reference):
            if np.any(reference != 0):
                ungraded.append(name)
            continue
        comparisons.append(compare_arrays(name, got[name], reference, GRADIENT_TOLERANCE))
    differing = {*ungraded, *(c.name for c in comparisons if not c.passed)}
    causes = _causes(setting, expected, flowing, oracles, differing) if differing and setting.taps else {}
    rows = {
        name: _rows_alone_differing(name, got.get(name), expected[name]) for name in differing & set(EMBEDDING_TABLES)
    }
    return GradientCheck(scalar, setting.device, tuple(comparisons), tuple(ungraded), tuple(sorted(setting.frozen)),
                         causes, {name: found for name, found in rows.items() if found})  # fmt: skip


def _rows_alone_differing(name: str, gradient: np.ndarray | None, reference: np.ndarray) -> tuple[int, ...]:
    """The few rows of an embedding table's gradient that alone differ from the oracle's (an
    ``nn.Embedding``'s ``padding_idx`` keeps the lookup's gradient from its row); none where more do."""
    if gradient is None or gradient.shape != reference.shape or gradient.ndim != 2:
        return ()
    bound = GRADIENT_TOLERANCE.atol + GRADIENT_TOLERANCE.rtol * np.abs(reference)
    rows = np.flatnonzero(~(np.abs(gradient - reference) <= bound).all(axis=1))
    return tuple(int(row) for row in rows) if 0 < rows.size <= MAX_PADDING_ROWS < len(reference) // 2 else ()


def _causes(
    setting: _Setting,
    expected: dict[str, np.ndarray],
    flowing: dict[str, np.ndarray],
    oracles: Cotangents,
    differing: set[str],
) -> dict[str, str]:
    """Why each ``differing`` parameter's gradient differs (a key of ``CAUSES``), from the user's backward
    with every located activation made the oracle's: its value (``setting.reference``) and its gradient
    (``flowing``)."""
    forced = {name: (setting.reference[name], flowing[name]) for name in setting.taps}
    isolated = setting.subject.isolated_vjp  # type: ignore[attr-defined]
    alone, computed = call_user("your model's backward pass", isolated, setting.inputs, setting.taps, forced, oracles)
    alone = setting.mapping.to_canonical(alone, {name: array.shape for name, array in expected.items()})
    tolerance = tolerance_for("float64", "cpu" if setting.device == "cpu" else "gpu")
    astray = {
        name for name, value in computed.items()
        if value is not None and name in setting.reference
        and not compare_arrays(name, value, setting.reference[name], tolerance).passed
    }  # fmt: skip
    causes = {}
    for name in (n for n in expected if n in differing):  # canonical order
        if _gets_none(alone.get(name), expected[name]):
            causes[name] = "backward"
        elif compare_arrays(name, alone[name], expected[name], GRADIENT_TOLERANCE).passed:
            causes[name] = "carried"
        else:
            causes[name] = "forward" if activation_of(setting.config, name) in astray else "backward"
    return causes


def _gets_none(gradient: np.ndarray | None, reference: np.ndarray) -> bool:
    """No gradient reaches the parameter: None (torch: not in the graph), or all zero (Gluon keeps a zero
    gradient there) where the oracle's is not."""
    return gradient is None or (bool(np.any(reference != 0)) and not np.any(gradient))


def check_loss(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    subject: Subject,
    function: object,
    normalization: str,
    seed: int = 0,
    layer_norm_eps: float | None = None,
) -> LossCheck:
    """The user's ``_get_batch_loss_bert`` on the fixed batch, held to the loss whose masked-LM part is
    averaged as ``normalization`` says (``real_slots``: over the real prediction slots)."""
    if normalization not in MLM_NORMALIZATIONS:
        raise UsageError(f"unknown MLM normalization {normalization!r}: expected one of {list(MLM_NORMALIZATIONS)}")
    if not hasattr(subject, "batch_loss"):
        raise UsageError(f"--loss needs a framework model; {subject.framework} has no loss object to pass")
    batch = gradient_batch(config, seed)
    run = subject.batch_loss
    returned = call_user("your loss function", run, function, batch, config.vocab_size)
    if len(returned) != 3:
        raise UsageError(f"your loss function returned {len(returned)} values; expected (mlm_l, nsp_l, l) as d2l's")
    values = (returned[0], returned[1], returned[2])
    reference = oracle.pretraining_loss(config, weights, batch, normalization, layer_norm_eps)
    names = ("mlm", "nsp", "total")
    expected = (reference.mlm, reference.nsp, reference.total)
    comparisons = tuple(
        compare_arrays(f"loss ({name})", np.array([v]), np.array([e]), LOSS_TOLERANCE)
        for name, v, e in zip(names, values, expected)
    )
    diagnosis = None
    if not all(c.passed for c in comparisons):
        other = next(n for n in MLM_NORMALIZATIONS if n != normalization)
        alternative = oracle.pretraining_loss(config, weights, batch, other, layer_norm_eps)
        if abs(values[0] - alternative.mlm) <= LOSS_TOLERANCE.atol + LOSS_TOLERANCE.rtol * abs(alternative.mlm):
            diagnosis = (
                "your masked-LM loss is averaged over every prediction slot, padding included (the loss object "
                "had already reduced to a mean before the weights were applied: d2l-en issue 2582); if that is "
                "intended, say --mlm-normalization all_slots"
                if other == "all_slots"
                else "your masked-LM loss is averaged over the real prediction slots only, not all slots"
            )
    return LossCheck(normalization, values, comparisons, diagnosis)
