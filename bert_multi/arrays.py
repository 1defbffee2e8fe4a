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


def contiguous_transpose(array: np.ndarray, rows: int = 128) -> np.ndarray:
    """An array's transpose as a new C-contiguous array; a 2-D one copied a band of ``rows`` rows at a
    time. NumPy's copy of the whole transposed view reads one of the two arrays across a full row's
    stride for every element; a band stays in the cache, which makes it 3 to 5 times faster at BERT's
    sizes."""
    if array.ndim != 2 or array.size == 0:  # empty: nothing to copy, however many rows it claims
        return np.array(array.T, order="C")
    out = np.empty(array.shape[::-1], array.dtype)
    for start in range(0, array.shape[0], rows):
        out[:, start : start + rows] = array[start : start + rows].T
    return out


def bfloat16_widened(bits: np.ndarray) -> np.ndarray:
    """bfloat16 numbers, given as their 16-bit patterns (``uint16``), as a new float32 array, exactly: a
    bfloat16 is the upper half of a float32. Files store bfloat16 so, and NumPy has no such dtype."""
    return (bits.astype("<u4") << 16).view("<f4").astype(np.float32, copy=False)


def same_bits(given: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
    """Whether two sets of named arrays hold the same names, dtypes, shapes and bits: 0.0 is not -0.0,
    and a NaN is equal only to the same NaN."""
    if given.keys() != expected.keys():
        return False
    for name, array in given.items():
        other = expected[name]
        if array.dtype != other.dtype or array.shape != other.shape:
            return False
        bits = np.dtype(f"u{array.dtype.itemsize}")
        if not np.array_equal(np.ascontiguousarray(array).view(bits), np.ascontiguousarray(other).view(bits)):
            return False
    return True
