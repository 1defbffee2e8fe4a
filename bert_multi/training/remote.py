"""A ``Pretrainer`` in a worker of another environment (``bert_multi.backend.remote``), driven step by
step from this process: the batches, seeds and checkpoints stay the caller's, so a run there is the
run here, step for step."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..backend.remote import RemoteModel
from ..spec.loss import LossValues
from .data import BatchTotals, check_batch


class RemoteTrainer:
    """The worker's ``Pretrainer`` of a ``RemoteModel``: each call sends its batch and returns what the
    trainer there returned (losses, canonical gradients, the optimizer state)."""

    def __init__(self, model: RemoteModel, **options: Any) -> None:
        self.model, self.config, self.worker = model, model.config, model.worker
        self.id = int(self.worker.call("trainer", model=model.id, options=options)["trainer"])
        weakref.finalize(self, self.worker.drop, self.id)

    def seed(self, value: int) -> None:
        self.worker.call("seed", trainer=self.id, value=int(value))

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        reply, _ = self.worker.exchange("loss", {"batch": self._checked(batch)}, False, trainer=self.id)
        return LossValues(*reply["losses"])

    def step(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None) -> LossValues:
        sent = {"batch": self._checked(batch)}
        reply, _ = self.worker.exchange("step", sent, False, trainer=self.id, totals=_plain_totals(totals))
        return LossValues(*reply["losses"])

    def gradients(
        self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None
    ) -> tuple[LossValues, dict[str, np.ndarray]]:
        sent = {"batch": self._checked(batch)}
        reply, arrays = self.worker.exchange("gradients", sent, True, trainer=self.id, totals=_plain_totals(totals))
        return LossValues(*reply["losses"]), arrays

    def state(self) -> dict[str, np.ndarray]:
        return self.worker.exchange("state", {}, True, trainer=self.id)[1]

    def load_state(self, arrays: dict[str, np.ndarray], steps: int) -> None:
        self.worker.exchange("load_state", {"state": arrays}, False, trainer=self.id, steps=int(steps))

    def _checked(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return check_batch(self.config, batch)  # here, before the worker sees it


def _plain_totals(totals: BatchTotals | None) -> list[float] | None:
    return None if totals is None else [float(value) for value in totals]
