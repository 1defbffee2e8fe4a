"""Gradients and the pretraining loss of a user's model, held to the float64 gradient oracle
(``bert_multi.backend.backward``).

Two fixed scalars are differentiated: a seeded random projection of every output (reaches every
parameter the outputs depend on) and d2l's pretraining loss of a fixed batch with fixed labels (what
training follows). The user's model gives each parameter's gradient by its framework's autograd; the
oracle by hand-written derivatives. A parameter with no gradient where the oracle has one is a failure
naming it, unless it is stated to be frozen.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..backend import backward, oracle
from ..errors import UsageError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs, check_inputs
from ..spec.loss import MLM_NORMALIZATIONS
from .cases import get_case
from .compare import Comparison, Tolerance, compare_arrays
from .mapping import ParameterMap
from .subject import Cotangents, Subject, call_user

# Measured (docs/tolerances.md, "Gradients"): PyTorch's and MXNet's float64 autograd agree with the
# oracle to about 1e-15 on gradients up to about 1; planted faults move gradients by 1e-3 and more.
GRADIENT_TOLERANCE = Tolerance(atol=1e-9, rtol=1e-7)
LOSS_TOLERANCE = Tolerance(atol=1e-9, rtol=1e-9)
SCALARS = ("random projection", "pretraining loss")


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

    @property
    def passed(self) -> bool:
        return bool(self.comparisons) and not self.ungraded and all(c.passed for c in self.comparisons)

    @property
    def first_divergence(self) -> Comparison | None:
        return next((c for c in self.comparisons if not c.passed), None)


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


def check_gradients(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    subject: Subject,
    mapping: ParameterMap,
    device: str,
    frozen: set[str],
    seed: int = 0,
    layer_norm_eps: float | None = None,
) -> list[GradientCheck]:
    """Both scalars' gradients of the float64 ``subject`` (holding ``weights``) against the oracle's,
    computed with the LayerNorm eps the subject's framework uses (``layer_norm_eps``)."""
    eps = layer_norm_eps
    if not hasattr(subject, "vjp"):
        raise UsageError(f"{subject.framework} gives no gradients (a NumPy-protocol model needs a gradients method)")
    batch = gradient_batch(config, seed)
    inputs = check_inputs(config, batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    reference = oracle.forward(config, weights, inputs, layer_norm_eps=eps)
    cotangents = projection((reference.encoded, reference.mlm, reference.nsp), seed)
    expected = backward.gradients(config, weights, inputs, *cotangents, layer_norm_eps=eps)
    checks = [_compare(SCALARS[0], device, subject, mapping, inputs, cotangents, expected, frozen)]
    if "mlm" in config.heads and "nsp" in config.heads:
        _, expected = backward.pretraining_loss_gradients(config, weights, batch, layer_norm_eps=eps)
        (_, mlm, nsp), _ = call_user("your model", subject.run, inputs, {})
        assert mlm is not None and nsp is not None
        dMLM, dNSP = backward.loss_cotangents(config, mlm, nsp, batch, "real_slots")
        zero = np.zeros_like(reference.encoded)
        loss = Cotangents(zero, dMLM, dNSP)
        checks.append(_compare(SCALARS[1], device, subject, mapping, inputs, loss, expected, frozen))
    return checks


def _compare(
    scalar: str,
    device: str,
    subject: Subject,
    mapping: ParameterMap,
    inputs: ModelInputs,
    cotangents: Cotangents,
    expected: dict[str, np.ndarray],
    frozen: set[str],
) -> GradientCheck:
    own = call_user("your model's backward pass", subject.vjp, inputs, cotangents)  # type: ignore[attr-defined]
    got = mapping.to_canonical(own, {name: array.shape for name, array in expected.items()})
    comparisons, ungraded = [], []
    for name, reference in expected.items():
        if name in frozen:
            continue
        # None (torch: not in the graph) or all zero (Gluon keeps a zero gradient there) where the
        # oracle's is not: no gradient reaches the parameter.
        own_gradient = got.get(name)
        if own_gradient is None or (np.any(reference != 0) and not np.any(own_gradient)):
            if np.any(reference != 0):
                ungraded.append(name)
            continue
        comparisons.append(compare_arrays(name, own_gradient, reference, GRADIENT_TOLERANCE))
    return GradientCheck(scalar, device, tuple(comparisons), tuple(ungraded), tuple(sorted(frozen)))


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
