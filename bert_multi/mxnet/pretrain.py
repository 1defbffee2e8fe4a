"""Pretraining in MXNet/Gluon: d2l's loss, gradients per canonical parameter, optimizer steps.

Parallel to ``bert_multi/torch/pretrain.py``.
"""

from __future__ import annotations

import math

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..backend import framework_names
from ..pretraining import BatchTotals, LossValues, check_batch, check_trainable, check_training_options
from .backend import NAME_RULES, MXNetBERT, _parameters
from .model import BERTModel

_loss = gluon.loss.SoftmaxCrossEntropyLoss()


def pretraining_loss(
    net: BERTModel,
    batch: dict[str, mx.np.ndarray],
    vocab_size: int,
    mlm_normalization: str = "real_slots",
    totals: BatchTotals | None = None,
) -> tuple[mx.np.ndarray, mx.np.ndarray, mx.np.ndarray]:
    """(total, MLM, NSP) loss, as d2l's ``_get_batch_loss_bert``. With ``totals`` (those of a whole batch
    of which ``batch`` is one shard): this shard's share of that batch's loss."""
    _, mlm_Y_hat, nsp_Y_hat = net(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    weights = batch["mlm_weights"].reshape(-1)
    labels = batch["mlm_labels"].reshape(-1)
    if totals is not None:  # sums over this shard, divided by the whole batch's totals

        def exactly(value: float) -> mx.np.ndarray:
            # Framework difference: a Python number in an MXNet expression becomes a C float operator
            # parameter (docs/framework-differences.md); an array keeps float64's precision.
            return mx.np.array(value, dtype=weights.dtype, ctx=weights.ctx)

        slot_losses = _loss(mlm_Y_hat.reshape((-1, vocab_size)), labels)
        if mlm_normalization == "real_slots":
            mlm_l = (slot_losses * weights).sum() / exactly(totals.mlm_weight + 1e-8)
        else:
            mlm_l = slot_losses.sum() * exactly(totals.mlm_weight / (totals.mlm_weight + 1e-8) / totals.slots)
        nsp_l = _loss(nsp_Y_hat, batch["nsp_labels"]).sum() / exactly(totals.examples)
        return mlm_l + nsp_l, mlm_l, nsp_l
    if mlm_normalization == "real_slots":
        # Framework difference: Gluon's losses take per-sample weights and never reduce over the batch.
        slot_losses = _loss(mlm_Y_hat.reshape((-1, vocab_size)), labels)
    else:
        # d2l's PyTorch code, reproduced: one average over every slot, padding included.
        slot_losses = _loss(mlm_Y_hat.reshape((-1, vocab_size)), labels).mean()
    mlm_l = (slot_losses * weights).sum() / (weights.sum() + 1e-8)
    nsp_l = _loss(nsp_Y_hat, batch["nsp_labels"]).mean()
    return mlm_l + nsp_l, mlm_l, nsp_l


class Pretrainer:
    """Training steps on an ``MXNetBERT``: ``optimizer`` "sgd" or "adam" at learning rate ``lr``.

    ``adam_epsilon_style`` says where Adam's epsilon acts: "mxnet" adds it to sqrt of the raw second
    moment (MXNet folds the bias correction into the learning rate); "torch" adds it to sqrt of the
    bias-corrected second moment, as torch.optim.Adam does. Both compute the same update when epsilon
    is rescaled each step, which is what "torch" does here. ``train_positions=False`` freezes the
    positional embedding, as d2l 0.16-0.17's PyTorch code did.
    """

    def __init__(
        self,
        model: MXNetBERT,
        optimizer: str = "adam",
        lr: float = 0.01,
        mlm_normalization: str = "real_slots",
        adam_epsilon: float = 1e-8,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        adam_epsilon_style: str = "mxnet",
        train_positions: bool = True,
    ) -> None:
        check_training_options(optimizer, mlm_normalization, adam_epsilon_style)
        check_trainable(model.config, train_positions)
        self.model, self.config = model, model.config
        # d2l 0.16-0.17's PyTorch code never trained the positional embedding (it added pos_embedding.data).
        model.module.encoder.train_positions = train_positions
        if not train_positions:
            # Framework difference: a Gluon Trainer refuses a parameter whose gradient backward never
            # updated unless its grad_req is 'null'; torch's optimizers skip a parameter whose grad is None.
            model.module.encoder.pos_embedding.grad_req = "null"
        self.mlm_normalization = mlm_normalization
        self.adam_epsilon, self.adam_epsilon_style = adam_epsilon, adam_epsilon_style
        self.steps = 0
        params = model.module.collect_params()
        # Framework difference: Gluon's Trainer takes its hyper-parameters as a dict and scales
        # gradients by 1 / the batch size passed to step(); the loss is already a mean, so step(1)
        # (docs/framework-differences.md: "who divides by the batch size", "Adam's epsilon").
        hyper = {"learning_rate": lr}
        if optimizer == "adam":
            hyper.update(epsilon=adam_epsilon, beta1=adam_betas[0], beta2=adam_betas[1])
        self.trainer = gluon.Trainer(params, optimizer, hyper)

    def _arrays(self, batch: dict[str, np.ndarray]) -> dict[str, mx.np.ndarray]:
        checked = check_batch(self.config, batch)
        return {
            name: mx.np.array(
                value, dtype=self.model.dtype if value.dtype.kind == "f" else value.dtype, ctx=self.model.context
            )
            for name, value in checked.items()
        }

    def _loss(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None):
        return pretraining_loss(
            self.model.module, self._arrays(batch), self.config.vocab_size, self.mlm_normalization, totals
        )

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        """The loss in inference mode (dropout off), without gradients."""
        return LossValues(*(float(value) for value in self._loss(batch)))

    def _backward(self, batch: dict[str, np.ndarray], totals: BatchTotals | None) -> LossValues:
        # Framework difference: Gluon records the graph (and turns dropout on) only inside
        # autograd.record(); torch records always and uses train()/eval() for dropout.
        with autograd.record(train_mode=True):
            total, mlm_l, nsp_l = self._loss(batch, totals)
        total.backward()
        return LossValues(float(total), float(mlm_l), float(nsp_l))

    def gradients(
        self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None
    ) -> tuple[LossValues, dict[str, np.ndarray]]:
        """The loss in train mode and its gradient for every canonical parameter (no step taken); with
        ``totals``, ``batch``'s share of the loss of the whole batch they count (see ``step``)."""
        losses = self._backward(batch, totals)
        params = _parameters(self.model.module)
        return losses, {
            name: params[gluon_name].grad(self.model.context).asnumpy().copy()
            for name, gluon_name in framework_names(self.config, NAME_RULES).items()
        }

    def step(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None) -> LossValues:
        """One optimizer step; returns the loss before it. With ``totals``, ``batch`` is one shard of a
        larger batch whose totals they are (``pretraining.shard``), and the loss is its share."""
        losses = self._backward(batch, totals)
        self.steps += 1
        optimizer = self.trainer._optimizer
        if self.adam_epsilon_style == "torch" and isinstance(optimizer, mx.optimizer.Adam):
            optimizer.epsilon = self.adam_epsilon * math.sqrt(1 - optimizer.beta2**self.steps)
        self.trainer.step(1)
        return losses
