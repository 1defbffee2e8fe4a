"""What every framework's ``Pretrainer`` shares: the options and their checks, the step count, and the
gradients and optimizer state read and written per canonical parameter. A framework fills in the
loss, the backward pass and the optimizer step, and how one parameter's gradient and Adam moments are
read and written: the abstract methods below, in its ``pretrain.py``."""

from __future__ import annotations

import abc

import numpy as np

from ..backend.contract import BackendModel, framework_names
from ..spec.loss import BatchTotals, LossValues
from .loop import check_mixed_precision, check_trainable, check_training_options


class Trainer(abc.ABC):
    """Training steps on a framework's model: ``optimizer`` "sgd" or "adam" at learning rate ``lr``.

    ``adam_epsilon_style`` says where Adam's epsilon acts: "torch" adds it to sqrt of the bias-corrected
    second moment (torch.optim.Adam); "mxnet" adds it to sqrt of the raw second moment, as MXNet does by
    folding the bias correction into the learning rate. Both compute the same update when epsilon is
    rescaled each step, which a framework does for the other's style. ``train_positions=False`` freezes
    the positional embedding, as d2l 0.16-0.17's PyTorch code did (it added ``pos_embedding.data``).
    ``mixed_precision`` ("bfloat16", where the framework offers it: ``MIXED_PRECISION``) computes the
    matrix products in that dtype; the float32 weights, their gradients and the updates stay float32. A
    model built with ``mixed_precision`` trains in it without asking again.
    """

    NAME_RULES: list[tuple[str, str]]  # the framework's parameter names, from the canonical ones
    MIXED_PRECISION: tuple[str, ...] = ()  # the mixed precisions the framework trains in

    def __init__(
        self,
        model: BackendModel,
        optimizer: str,
        mlm_normalization: str,
        adam_epsilon: float,
        adam_epsilon_style: str,
        train_positions: bool,
        mixed_precision: str | None = None,
    ) -> None:
        check_training_options(optimizer, mlm_normalization, adam_epsilon_style)
        check_mixed_precision(model.backend, mixed_precision, model.dtype)
        check_trainable(model.config, train_positions)
        self.mixed_precision = mixed_precision or getattr(model, "mixed_precision", None)
        self.model, self.config = model, model.config
        self._train_positions(train_positions)
        self.mlm_normalization = mlm_normalization
        self.adam_epsilon, self.adam_epsilon_style = adam_epsilon, adam_epsilon_style
        self.steps = 0

    # --- what each framework fills in ---------------------------------------------------------------

    def _train_positions(self, train: bool) -> None:
        """Whether the positional embedding trains (the model stops its gradient when not)."""
        self.model.module.encoder.train_positions = train

    @abc.abstractmethod
    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        """The loss in inference mode (dropout off), without gradients."""

    @abc.abstractmethod
    def seed(self, value: int) -> None:
        """Seed the generator dropout draws from (the framework's global one)."""

    @abc.abstractmethod
    def _backward(self, batch: dict[str, np.ndarray], totals: BatchTotals | None) -> LossValues:
        """The loss in train mode, its gradients left on the parameters (the whole batch's, across workers)."""

    @abc.abstractmethod
    def _update(self) -> None:
        """One optimizer step on the gradients ``_backward`` left (``self.steps`` already counts it)."""

    @abc.abstractmethod
    def _gradient(self, own_name: str) -> np.ndarray:
        """The gradient of the parameter called ``own_name``; zeros for one that does not train."""

    @abc.abstractmethod
    def _moments(self, own_name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Adam's first and second moments of that parameter, or None (SGD, or no step taken yet)."""

    @abc.abstractmethod
    def _restore(self, own_name: str, moments: tuple[np.ndarray, np.ndarray], steps: int) -> None:
        """Set that parameter's moments, as they were after ``steps`` steps."""

    # --- the same in every framework -------------------------------------------------------------------

    def own_names(self) -> dict[str, str]:
        """Canonical parameter name -> the framework's own."""
        return framework_names(self.config, self.NAME_RULES)

    def gradients(
        self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None
    ) -> tuple[LossValues, dict[str, np.ndarray]]:
        """The loss in train mode and its gradient for every canonical parameter (no step taken; one that
        does not train, such as a frozen positional embedding, has a zero gradient); with ``totals``,
        ``batch``'s share of the loss of the whole batch they count (see ``step``)."""
        losses = self._backward(batch, totals)
        return losses, {name: self._gradient(own) for name, own in self.own_names().items()}

    def step(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None) -> LossValues:
        """One optimizer step; returns the loss before it. With ``totals``, ``batch`` is one shard of a
        larger batch whose totals they are (``training.shard``), and the loss is its share."""
        losses = self._backward(batch, totals)
        self.steps += 1
        self._update()
        return losses

    def state(self) -> dict[str, np.ndarray]:
        """The optimizer's state as canonical arrays: Adam's moments as "m.<name>" and "v.<name>" (SGD
        keeps none); with ``self.steps``, all a resumed run needs besides the weights."""
        arrays = {}
        for name, own in self.own_names().items():
            moments = self._moments(own)
            if moments is not None:
                arrays[f"m.{name}"], arrays[f"v.{name}"] = moments
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray], steps: int) -> None:
        """Take up the optimizer state ``state()`` returned after ``steps`` steps."""
        self.steps = steps
        for name, own in self.own_names().items():
            if f"m.{name}" in arrays:
                self._restore(own, (arrays[f"m.{name}"], arrays[f"v.{name}"]), steps)
