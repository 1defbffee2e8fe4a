"""Timing in interleaved rounds: every candidate once a round, in turn, so that a machine that slows down
mid-run slows every candidate alike; each one's first call timed apart (first calls allocate and compile)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

Progress = Callable[[str], None]


def best_of(call: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls, after one call not timed."""
    call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def every_round(call: Callable[[], object]) -> Callable[[int], object]:
    """``call`` as a workload of the rounds: the same call in each."""
    return lambda _round: call()


def _no_wait(name: str) -> None:
    return None


def interleave(
    calls: Mapping[str, Callable[[int], object]],
    rounds: int,
    label: str,
    progress: Progress | None,
    after: Callable[[str], None] | None = None,
    wait: Callable[[str], None] = _no_wait,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds of ``calls[name](round)`` for rounds 1..``rounds``, every candidate in turn each round,
    and apart from them the seconds of each one's first call (round 0). Each timing includes
    ``wait(name)`` (queued work a call leaves); ``after(name)`` runs outside the timings. ``progress`` is
    told ``label`` as the first calls start, then each round's ``"{label} round i/n: name"``."""
    timings: dict[str, list[float]] = {name: [] for name in calls}
    first: dict[str, float] = {}
    if progress:
        progress(label)  # the workload alone as it starts, then each of its rounds
    for name, call in calls.items():
        started = time.perf_counter()
        call(0)
        wait(name)
        first[name] = time.perf_counter() - started
    for index in range(1, rounds + 1):
        for name, call in calls.items():
            if progress:
                progress(f"{label} round {index}/{rounds}: {name}")
            started = time.perf_counter()
            call(index)
            wait(name)
            timings[name].append(time.perf_counter() - started)
            if after:
                after(name)
    return timings, first
