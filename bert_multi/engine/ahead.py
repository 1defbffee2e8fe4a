"""Compiling ahead: a backend that compiles a program for each input shape (the contract's ``prepare``:
JAX) compiles what a conformance run will ask of it on a thread of its own, from the moment it is loaded,
while the run loads the other frameworks, computes the oracle's outputs and runs the others; it gives way
to the run's own work and ends with the run."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from .. import waiting
from ..backend.registry import LoadedBackend
from ..spec.config import BERTConfig
from .cases import Batch
from .lanes import LaneSteps, lane_of
from .results import Target


class CompilingAhead:
    """The run's compiling ahead, for its ``config``, ``batches`` (grouped by the max_len of the model
    that runs them, ``groups``), ``targets`` and ``dtypes`` in the order the run takes them."""

    def __init__(
        self,
        config: BERTConfig,
        batches: Sequence[Batch],
        groups: dict[int, list[int]],
        targets: Sequence[Target],
        dtypes: list[str],
        lane_steps: LaneSteps,
    ) -> None:
        self.config, self.targets, self.dtypes, self.lane_steps = config, targets, dtypes, lane_steps
        self.groups = [(max_len, [batches[index]]) for max_len, indices in groups.items() for index in indices]
        self.threads: list[threading.Thread] = []

    def start(self, name: str, backend: LoadedBackend) -> None:
        """A backend that compiles ahead starts as soon as it is loaded, on a thread of its own, for the
        dtypes and devices asked of it. It is asked for one dtype and case at a time (a worker's run comes
        first between two), a later dtype's only while its lane is not at work on the dtype before (it
        would stand in that one's way), until the run is over, and compiles wherever the backend runs; its
        failures are not the run's (the run's own models meet them, and report them). A target with the
        fused attention compiles its own programs (what is asked ahead is d2l's written-out attention)."""
        if not backend.prepares:
            return
        asked: dict[str, list[str]] = {}  # device -> its dtypes, each in the order the run needs it
        for target in sorted(self.targets, key=lambda target: self.dtypes.index(target.dtype)):
            if target.backend == name and not target.options:
                asked.setdefault(target.device, []).append(target.dtype)
        lane = lane_of(name, backend)
        for device, dtypes in asked.items():
            work: list[tuple[Any, ...]] = []
            for before, dtype in zip([None, *dtypes], dtypes):
                for group in self.groups:
                    if before is not None:
                        work.append((self.lane_steps.wait_idle, lane, before))
                    work.append((backend.prepare, self.config, [group], [dtype], device))
            self.threads.append(threading.Thread(target=_until, args=(self.lane_steps, work), daemon=True))
            self.threads[-1].start()

    def stop(self, interrupted: bool) -> None:
        """Nothing compiling ahead outlives the run, whether it finished or a caller stopped it: a worker's
        channel would wait on it, and a thread still compiling in this process as it exits crashes it.
        Each stops at its next group; after Ctrl-C they are not waited for (a worker busy compiling ahead
        is stopped as its process ends)."""
        self.lane_steps.stop()
        for thread in [] if interrupted else self.threads:
            waiting.join(thread)


def _until(lane_steps: LaneSteps, work: list[tuple[Any, ...]]) -> None:
    """Each ``function(*arguments)`` of ``work`` in turn until the run is over, a failure left for the work
    that follows to meet and report."""
    for function, *arguments in work:
        if lane_steps.stopped:
            return
        try:
            function(*arguments)
        except Exception:  # noqa: BLE001, S110 - compiling ahead is an optimization; the run reports failures
            pass
