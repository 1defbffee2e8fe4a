"""What the pretraining loss is: its three values, how the masked-LM part is averaged, what a batch
holds (checked by ``check_batch``) and what a shard of one divides by (``BatchTotals``).

Loss = masked-LM cross-entropy averaged over the real prediction slots (weight 1) + next-sentence
cross-entropy averaged over the batch. d2l's PyTorch code averaged the masked-LM part over every slot,
padding included, because its loss object had already reduced to a mean ("all_slots" reproduces it).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import InputError
from .config import BERTConfig
from .inputs import check_inputs

MLM_NORMALIZATIONS = ("real_slots", "all_slots")  # all_slots: d2l's PyTorch code, padding averaged in


class LossValues(NamedTuple):
    total: float
    mlm: float
    nsp: float


BATCH_FIELDS = ("tokens", "segments", "valid_lens", "pred_positions", "mlm_weights", "mlm_labels", "nsp_labels")


class BatchTotals(NamedTuple):
    """What the loss of a whole batch divides by. A worker holding one shard of a batch divides its
    sums by the whole batch's totals, so the workers' losses add up to the loss of the whole batch
    (and their gradients to its gradient) whatever each shard holds."""

    mlm_weight: float  # the sum of mlm_weights: the real prediction slots
    examples: int  # the batch size, over which NSP is averaged
    slots: int  # every prediction slot, padding included ("all_slots" normalization)

    @classmethod
    def of(cls, batch: dict[str, np.ndarray]) -> BatchTotals:
        weights = np.asarray(batch["mlm_weights"])
        return cls(float(weights.sum(dtype=np.float64)), int(weights.shape[0]), int(weights.size))


def check_batch(config: BERTConfig, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model inputs checked as usual, and the labels: mlm_labels in [0, vocab_size), mlm_weights
    finite and non-negative, nsp_labels in {0, 1}, all with matching shapes. Raises ``InputError``."""
    missing = [field for field in BATCH_FIELDS if field not in batch]
    if missing:
        raise InputError(f"a pretraining batch needs {list(BATCH_FIELDS)}; missing {missing}")
    inputs = check_inputs(config, batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    if inputs.valid_lens is None or inputs.pred_positions is None:
        raise InputError("a pretraining batch needs valid_lens and pred_positions, not None")
    B, P = inputs.pred_positions.shape
    labels = np.asarray(batch["mlm_labels"])
    weights = np.asarray(batch["mlm_weights"])
    nsp = np.asarray(batch["nsp_labels"])
    for name, array, shape in (
        ("mlm_labels", labels, (B, P)),
        ("mlm_weights", weights, (B, P)),
        ("nsp_labels", nsp, (B,)),
    ):
        if array.shape != shape:
            raise InputError(f"{name} has shape {array.shape}: expected {shape}")
    if labels.dtype.kind not in "iu" or nsp.dtype.kind not in "iu":
        raise InputError("mlm_labels and nsp_labels must be integer arrays")
    if labels.size and (labels.min() < 0 or labels.max() >= config.vocab_size):
        raise InputError(
            f"mlm_labels must be token ids in [0, {config.vocab_size}), got {labels.min()}..{labels.max()}"
        )
    if not np.isin(nsp, (0, 1)).all():
        raise InputError("nsp_labels must be 0 or 1")
    if weights.dtype.kind != "f" or not np.isfinite(weights).all() or (weights < 0).any():
        raise InputError("mlm_weights must be finite, non-negative floats")
    return {
        "tokens": inputs.tokens,
        "segments": inputs.segments,
        "valid_lens": inputs.valid_lens,
        "pred_positions": inputs.pred_positions,
        "mlm_weights": weights,
        "mlm_labels": labels.astype(np.int64),
        "nsp_labels": nsp.astype(np.int64),
    }
