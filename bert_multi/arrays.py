"""Small facts about NumPy arrays that error messages and checks need."""

from __future__ import annotations

import numpy as np


def first_index(mask: np.ndarray) -> tuple[int, ...]:
    """The index of the first True element of ``mask`` (which must have one), for error messages."""
    return tuple(int(i) for i in np.argwhere(mask)[0])


def all_finite(array: np.ndarray) -> bool:
    """Whether every element is finite. A sum is NaN or infinite if any element is, and finite sums are
    the rule, so one pass without a temporary settles it; only a sum that overflowed needs a look at
    each element."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(array)):
            return True
    return bool(np.isfinite(array).all())
