"""The conformance engine's schedule of one dtype, on lanes: a backend in another environment's worker
runs its part of the run on a thread of its own, beside this process's (``conform`` runs the rest)."""

from __future__ import annotations

import functools
import tempfile
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .. import waiting
from ..arrays import same_bits
from ..backend.contract import BERTOutput
from ..backend.registry import LoadedBackend
from ..spec.config import BERTConfig
from ..spec.weight_file import load_weights
from .results import Target

Lent = tuple[BERTConfig, dict[str, np.ndarray]]  # a target's model's config and exported weights


class Run(Protocol):
    """What lanes ask of the run they are a part of (``conform``'s): its model, targets' backends and
    outputs, the work of one target alone and of one pair, and what the lanes share."""

    config: BERTConfig
    pairs: bool
    backends: dict[Target, LoadedBackend]
    results: dict[Target, dict[int, BERTOutput]]  # target -> case -> its outputs, kept for its pairs
    recorded: dict[Target, dict[int, tuple[str, ...] | None]]  # and the activations each recorded
    lane_steps: LaneSteps

    @property
    def holding(self) -> AbstractContextManager[Any]:
        """Held while this process holds one set of weights beyond the run's own, whichever lane needs it."""
        ...

    def attempt(self, target: Target, work: Callable[..., object], *arguments: Any) -> bool:
        """``work(*arguments)``, a backend's failure recorded against ``target``; whether it succeeded."""
        ...

    def run_alone(self, target: Target, weights: dict[str, np.ndarray], keep: bool, file: Path | None,
                  paired: bool, written: Callable[[], object] | None = None) -> Lent | None:  # fmt: skip
        """Every case on ``target`` against the oracle; its exported weights where ``keep``."""
        ...

    def run_pair(self, target: Target, source: Target, how: str, lent: Lent | None, exact: bool) -> None:
        """Every case on ``target`` rebuilt from ``source``'s weights, moved ``how``, against its outputs."""
        ...


class LaneSteps:
    """Which lanes have begun and finished their steps of which dtype, for work that waits on them
    (compiling a dtype's shapes ahead, so that it does not stand in the way of the dtype before), and
    whether the run is over (then nothing waits)."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.begun: set[tuple[str | None, str]] = set()  # (lane, dtype)
        self.done: set[tuple[str | None, str]] = set()  # (lane, dtype), lane "*": every lane
        self.stopped = False

    def begin(self, lane: str | None, dtype: str) -> None:
        with self.changed:
            self.begun.add((lane, dtype))

    def finish(self, lane: str | None, dtype: str) -> None:
        with self.changed:
            self.done.add((lane, dtype))
            self.changed.notify_all()

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()

    def wait_idle(self, lane: str | None, dtype: str) -> None:
        """Until ``lane`` is not at work on ``dtype``: it has not begun it, or has finished it (or every
        lane has, or the run is over)."""
        with self.changed:
            waiting.wait_until(
                self.changed,
                lambda: (
                    self.stopped
                    or (lane, dtype) not in self.begun
                    or not {(lane, dtype), ("*", dtype)}.isdisjoint(self.done)
                ),
            )


def lane_of(name: str, backend: LoadedBackend) -> str | None:
    """The lane of a backend's models: None for this process, else its worker's (by the backend's name)."""
    return None if backend.elsewhere is None else name


class Lanes:
    """One dtype's part of a run: each target alone, and each pair of targets (a before b) both ways: b
    rebuilt from a's weights in memory, a from b's through a file; on lanes, so that a worker computes
    while this process does. This process's targets take their part on this thread, in the order one
    process would (for each target: it alone, then the pairs rebuilding it from the targets before it,
    then those targets rebuilt from its file). A backend in another environment's worker takes its own
    on a thread of its own: its targets alone first, then its pairs. A pair waits only for its two
    targets to have run alone, each on its own lane before any pair there, and the first steps of a
    worker's lane wait for nothing, so the lanes never wait on each other in a circle.

    Memory, per process: a lane builds one model at a time; a target's exported weights are held while
    a target still to be rebuilt from them in memory is, its file kept while one still to be rebuilt from
    the file is, and its outputs kept while a pair of it, either side, is still to be compared; and one set of
    weights beyond the run's own is held at a time in this process, across the lanes (``holding``)."""

    def __init__(self, run: Run, ran: list[Target], weights: dict[str, np.ndarray]) -> None:
        self.run_, self.weights, self.dtype = run, weights, ran[0].dtype
        self.directory = tempfile.TemporaryDirectory(prefix="bert_multi-pairs-")
        # Each target's part: ("alone", target, None) or ("pair", rebuilt target, source, how).
        steps: list[tuple[str, Target, Target | None, str]] = []
        for position, target in enumerate(ran):
            before = ran[:position] if run.pairs else []
            steps.append(("alone", target, None, ""))
            steps += [("pair", target, source, "memory") for source in before]
            steps += [("pair", source, target, "file") for source in before]
        # What each target's alone run leaves for the pairs: its outputs (which a pair compares with, or
        # which stand for the rebuilt model's where its weights arrive bit-exact), its weights in memory,
        # its file.
        self.uses = {(what, source): 0 for source in ran for what in ("outputs", "memory", "file")}
        for _, target, source, how in steps:
            if source is not None:
                self.uses["outputs", source] += 1
                self.uses["outputs", target] += 1
                self.uses[how, source] += 1
        self.lanes: dict[str | None, list[tuple[str, Target, Target | None, str]]] = {}
        for step in steps:
            self.lanes.setdefault(self.lane(step[1]), []).append(step)
        # A worker's lane starts at once, with what needs nothing from the others, and this process's
        # pairs with its targets find them run.
        for lane, taken in self.lanes.items():
            if lane is not None:
                taken.sort(key=lambda step: step[0] != "alone")
        self.alone = {target: threading.Event() for target in ran}  # set once it has run alone (or failed)
        self.exports: dict[Target, Lent] = {}
        self.files: dict[Target, Path] = {}
        self.exact_files: dict[Target, bool] = {}  # whether a target's file, once read, held the run's weights
        self.reading = {target: threading.Lock() for target in ran}  # held while a target's file is read
        self.readers: list[threading.Thread] = []  # reading a file back as soon as it is written
        self.lock = threading.Lock()
        self.failures: list[BaseException] = []  # a lane's own exceptions, raised on this thread after

    def lane(self, target: Target) -> str | None:
        return lane_of(target.backend, self.run_.backends[target])

    def run(self, first: Callable[[], None] | None = None) -> None:
        """Every step, each lane's in order; ``first`` on this thread before its own, once the others'
        lanes have started."""
        stop = threading.Event()
        threads = [
            threading.Thread(target=self.lane_thread, args=(lane, steps, stop), daemon=True)
            for lane, steps in self.lanes.items()
            if lane is not None
        ]
        for lane in self.lanes:
            self.run_.lane_steps.begin(lane, self.dtype)
        try:
            for thread in threads:
                thread.start()
            if first is not None:
                first()
            self.take(self.lanes.get(None, []), stop)
            self.run_.lane_steps.finish(None, self.dtype)
            for thread in threads:
                waiting.join(thread)
        finally:
            self.run_.lane_steps.finish("*", self.dtype)
            stop.set()  # a lane stops at its next step once this thread is interrupted, or fails
            for ran_alone in self.alone.values():  # and none waits on a target that will not run now
                ran_alone.set()
            for reader in self.readers:
                waiting.join(reader)
            self.directory.cleanup()
            for target in self.alone:  # pairs are of one dtype: its outputs are not asked for again
                self.run_.results.pop(target, None)
                self.run_.recorded.pop(target, None)
        if self.failures:
            raise self.failures[0]

    def lane_thread(
        self, lane: str, steps: list[tuple[str, Target, Target | None, str]], stop: threading.Event
    ) -> None:
        try:
            self.take(steps, stop)
        except BaseException as error:  # noqa: BLE001 - the engine's own failure, raised on the run's thread
            self.failures.append(error)
            for kind, target, _, _ in steps:  # the other lanes' pairs with its targets wait no longer
                if kind == "alone":
                    self.alone[target].set()
        finally:
            self.run_.lane_steps.finish(lane, self.dtype)

    def take(self, steps: list[tuple[str, Target, Target | None, str]], stop: threading.Event) -> None:
        run = self.run_
        for kind, target, source, how in steps:
            if stop.is_set():
                return
            if kind == "alone":
                if target in run.backends:
                    run.attempt(target, self.run_alone, target)
                self.alone[target].set()
                continue
            assert source is not None
            waiting.wait(self.alone[source])
            waiting.wait(self.alone[target])
            if stop.is_set():
                return
            if target in run.backends and source in run.results:
                run.attempt(target, self.run_pair, target, source, how)
            self.used(target, source, how)

    def run_alone(self, target: Target) -> None:
        run, uses = self.run_, self.uses
        name = f"{target.label.replace(' ', '-')}-{target.device}.npz"
        file = Path(self.directory.name) / name if uses["file", target] else None
        if file is not None:
            self.files[target] = file
        keep, paired = uses["memory", target] > 0, uses["outputs", target] > 0
        # A worker's file is read back at once: its model holds nothing here (this process's holds a copy
        # of the weights where its framework makes one, so its file is read once it is dropped).
        written = None if self.lane(target) is None else functools.partial(self.read_back, target)
        export = run.run_alone(target, self.weights, keep, file, paired, written)
        if export is not None:
            self.exports[target] = export

    def run_pair(self, target: Target, source: Target, how: str) -> None:
        if how == "memory":
            lent = self.exports[source]
            self.run_.run_pair(target, source, how, lent, self.arrived_exact(lent))
            return
        with self.reading[source]:
            if self.exact_files.get(source):  # read before: the run's weights, bit for bit
                self.run_.run_pair(target, source, how, None, True)
                return
            with self.run_.holding:
                lent = load_weights(self.files[source])
                exact = self.exact_files[source] = self.arrived_exact(lent)
                self.run_.run_pair(target, source, how, lent, exact)

    def read_back(self, target: Target) -> None:
        """Read ``target``'s file back as soon as it is written, on a thread beside its run's cases, to learn
        whether it holds the run's weights bit for bit: its pairs, later, then read nothing (they wait for
        it: the file is ``reading`` from now until it is read)."""
        self.reading[target].acquire()
        self.readers.append(threading.Thread(target=self.check_file, args=(target,), daemon=True))
        self.readers[-1].start()

    def check_file(self, target: Target) -> None:
        """Read ``target``'s file, once no other weights are held here (``holding``), and record whether it
        holds the run's weights bit for bit. A file that fails to read is left for its pairs to read, and
        report."""
        try:
            with self.run_.holding:
                self.exact_files[target] = self.arrived_exact(load_weights(self.files[target]))
        except Exception:  # noqa: BLE001, S110 - its pairs read it again, and report what it raised
            pass
        finally:
            self.reading[target].release()

    def arrived_exact(self, lent: Lent) -> bool:
        """Whether weights that moved are the config and the very bits every target of the dtype ran alone."""
        return lent[0] == self.run_.config and same_bits(lent[1], self.weights)

    def used(self, target: Target, source: Target, how: str) -> None:
        """A pair rebuilt from ``source`` is over: what nothing else needs of either is let go."""
        with self.lock:  # two lanes may finish pairs of one source at once: one of them lets each thing go
            for what, of in (("outputs", source), ("outputs", target), (how, source)):
                self.uses[what, of] -= 1
            done = [of for of in (source, target) if not self.uses["outputs", of]]
            memory, file = (self.uses[what, source] for what in ("memory", "file"))
            path = None if file else self.files.pop(source, None)
        for of in done:
            self.run_.results.pop(of, None)
            self.run_.recorded.pop(of, None)
        if not memory:
            self.exports.pop(source, None)
        if path is not None:
            path.unlink(missing_ok=True)
