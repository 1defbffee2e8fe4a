"""Pretraining in PyTorch: d2l's loss, gradients per canonical parameter, optimizer steps.

Parallel to ``bert_multi/mxnet/pretrain.py``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..backend import framework_names
from ..pretraining import LossValues, check_batch, check_trainable, check_training_options
from .backend import NAME_RULES, TORCH_DTYPES, TorchBERT
from .model import BERTModel


def pretraining_loss(
    net: BERTModel, batch: dict[str, torch.Tensor], vocab_size: int, mlm_normalization: str = "real_slots"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, MLM, NSP) loss, as d2l's ``_get_batch_loss_bert``."""
    _, mlm_Y_hat, nsp_Y_hat = net(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    weights = batch["mlm_weights"].reshape(-1)
    labels = batch["mlm_labels"].reshape(-1)
    if mlm_normalization == "real_slots":
        slot_losses = nn.functional.cross_entropy(mlm_Y_hat.reshape(-1, vocab_size), labels, reduction="none")
    else:
        # d2l's PyTorch code: CrossEntropyLoss() has already averaged over every slot, padding included,
        # so the weights below only scale that one number.
        slot_losses = nn.functional.cross_entropy(mlm_Y_hat.reshape(-1, vocab_size), labels)
    mlm_l = (slot_losses * weights).sum() / (weights.sum() + 1e-8)
    nsp_l = nn.functional.cross_entropy(nsp_Y_hat, batch["nsp_labels"])
    return mlm_l + nsp_l, mlm_l, nsp_l


class Pretrainer:
    """Training steps on a ``TorchBERT``: ``optimizer`` "sgd" or "adam" at learning rate ``lr``.

    ``adam_epsilon_style`` says where Adam's epsilon acts: "torch" adds it to sqrt of the
    bias-corrected second moment (torch.optim.Adam); "mxnet" adds it to sqrt of the raw second moment,
    as MXNet does by folding the bias correction into the learning rate. Both compute the same update
    when epsilon is rescaled each step, which is what "mxnet" does here. ``train_positions=False``
    freezes the positional embedding, as d2l 0.16-0.17's PyTorch code did.
    """

    def __init__(
        self,
        model: TorchBERT,
        optimizer: str = "adam",
        lr: float = 0.01,
        mlm_normalization: str = "real_slots",
        adam_epsilon: float = 1e-8,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        adam_epsilon_style: str = "torch",
        train_positions: bool = True,
    ) -> None:
        check_training_options(optimizer, mlm_normalization, adam_epsilon_style)
        check_trainable(model.config, train_positions)
        self.model, self.config = model, model.config
        # d2l 0.16-0.17's PyTorch code never trained the positional embedding (it added pos_embedding.data).
        model.module.encoder.train_positions = train_positions
        self.mlm_normalization = mlm_normalization
        self.adam_epsilon, self.adam_epsilon_style = adam_epsilon, adam_epsilon_style
        self.steps = 0
        params = model.module.parameters()
        # Framework difference: a torch optimizer holds the parameters; Gluon's Trainer does too, but
        # takes its hyper-parameters as a dict and scales gradients by 1 / the batch size it is given
        # (docs/framework-differences.md: "who divides by the batch size", "Adam's epsilon").
        self.optimizer = (
            torch.optim.SGD(params, lr=lr)
            if optimizer == "sgd"
            else torch.optim.Adam(params, lr=lr, betas=adam_betas, eps=adam_epsilon)
        )

    def _tensors(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        checked = check_batch(self.config, batch)
        dtype = TORCH_DTYPES[self.model.dtype]
        return {
            name: torch.from_numpy(value).to(self.model.torch_device, dtype if value.dtype.kind == "f" else None)
            for name, value in checked.items()
        }

    def _loss(self, batch: dict[str, np.ndarray]):
        return pretraining_loss(self.model.module, self._tensors(batch), self.config.vocab_size, self.mlm_normalization)

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        """The loss in eval mode (dropout off), without gradients."""
        self.model.module.eval()
        with torch.no_grad():
            return LossValues(*(float(value) for value in self._loss(batch)))

    def _backward(self, batch: dict[str, np.ndarray]) -> LossValues:
        self.model.module.train()
        self.optimizer.zero_grad()
        total, mlm_l, nsp_l = self._loss(batch)
        total.backward()
        return LossValues(*(float(value.detach()) for value in (total, mlm_l, nsp_l)))

    def gradients(self, batch: dict[str, np.ndarray]) -> tuple[LossValues, dict[str, np.ndarray]]:
        """The loss in train mode and its gradient for every canonical parameter (no step taken)."""
        losses = self._backward(batch)
        params = dict(self.model.module.named_parameters())
        return losses, {
            name: params[torch_name].grad.detach().cpu().numpy().copy()
            for name, torch_name in framework_names(self.config, NAME_RULES).items()
        }

    def step(self, batch: dict[str, np.ndarray]) -> LossValues:
        """One optimizer step; returns the loss before it."""
        losses = self._backward(batch)
        self.steps += 1
        if self.adam_epsilon_style == "mxnet" and isinstance(self.optimizer, torch.optim.Adam):
            beta2 = self.optimizer.param_groups[0]["betas"][1]
            for group in self.optimizer.param_groups:
                group["eps"] = self.adam_epsilon / math.sqrt(1 - beta2**self.steps)
        self.optimizer.step()
        return losses
