"""How the conformance engine and the workers of other environments hold little memory: the cycle
collector skips the objects that existed before a run, so that collecting each dropped model is quick,
and freed memory goes back to the system before the next model is built."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def collector_skipping_existing_objects() -> Iterator[None]:
    """The cycle collector leaves alone what exists now (the frameworks' modules and the caller's
    objects: some 200,000 once torch and MXNet are imported) until the block ends: each collection that
    frees a model then takes milliseconds, not a tenth of a second. A caller that froze objects itself
    keeps them frozen: then nothing more is frozen here, and nothing unfrozen."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release_memory() -> None:
    """Hand a dropped model's memory back now: Gluon blocks sit in reference cycles (each with its
    name scope), so only the cycle collector frees an MXNet model, and glibc keeps freed blocks for
    reuse until asked to trim. Without this the default run's peak held two extra float64 models."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


def _glibc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_malloc_trim = _glibc_malloc_trim()
