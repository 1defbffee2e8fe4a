"""How the conformance engine and the workers of other environments hold little memory: the cycle
collector skips the objects that existed before a run, so that collecting each dropped model is quick,
and freed memory goes back to the system before the next model is built."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator


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
    if _libc is not None:
        _libc.malloc_trim(0)


def large_blocks_from_the_system() -> None:
    """From now on glibc serves each block of 1 MiB or more straight from the system and hands it back
    when it is freed (a fixed ``M_MMAP_THRESHOLD``; by default the threshold grows to 32 MiB as blocks are
    freed). A run whose lanes allocate weights on several threads then holds no freed weights in one
    thread's arena while another's allocates afresh: the default run's peak was 0.99 to 1.03 GB without
    it, 0.90 GB with it. For the process, from a command, not for a library's caller."""
    if _libc is not None:
        _libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)


def _glibc() -> ctypes.CDLL | None:
    """glibc, for malloc_trim and mallopt; None where the C library is another (nothing to tune)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_libc = _glibc()
