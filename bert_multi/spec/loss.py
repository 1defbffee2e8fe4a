"""What the pretraining loss is: its three values, and how the masked-LM part is averaged.

Loss = masked-LM cross-entropy averaged over the real prediction slots (weight 1) + next-sentence
cross-entropy averaged over the batch. d2l's PyTorch code averaged the masked-LM part over every slot,
padding included, because its loss object had already reduced to a mean ("all_slots" reproduces it).
"""

from __future__ import annotations

from typing import NamedTuple

MLM_NORMALIZATIONS = ("real_slots", "all_slots")  # all_slots: d2l's PyTorch code, padding averaged in


class LossValues(NamedTuple):
    total: float
    mlm: float
    nsp: float
