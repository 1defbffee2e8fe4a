"""d2l's pretraining loop on any backend that can train: options, the loop, checkpoints and resuming, and
what a data-parallel worker hands back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.contract import check_mixed_precision_option
from ..backend.registry import LoadedBackend, backends, load_backend
from ..errors import UsageError, WorkerFailed
from ..safe_files import replace_text, written_together
from ..spec.config import HEADS, BERTConfig
from ..spec.loss import MLM_NORMALIZATIONS, BatchTotals, LossValues
from ..spec.training_state import TrainingState, load_training_state, save_training_state
from ..spec.weight_file import load_weights, save_weights
from .data import PretrainingData, shard


def free_address() -> str:
    """127.0.0.1 and a port no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


OPTIMIZERS = ("adam", "sgd")
ADAM_EPSILON_STYLES = ("torch", "mxnet")


def check_training_options(optimizer: str, mlm_normalization: str, adam_epsilon_style: str) -> None:
    for name, value, allowed in (
        ("optimizer", optimizer, OPTIMIZERS),
        ("mlm_normalization", mlm_normalization, MLM_NORMALIZATIONS),
        ("adam_epsilon_style", adam_epsilon_style, ADAM_EPSILON_STYLES),
    ):
        if value not in allowed:
            raise UsageError(f"unknown {name} {value!r}: expected one of {list(allowed)}")


def check_mixed_precision(backend_name: str, mixed_precision: str | None, dtype: str) -> None:
    """Mixed precision is asked of a backend whose ``Pretrainer`` offers it, on float32 weights."""
    if mixed_precision is None:
        return
    check_mixed_precision_option(mixed_precision, dtype)
    if mixed_precision not in load_backend(backend_name).mixed_precisions:
        offering = [
            name
            for name, status in backends().items()
            if status.available and name != backend_name and mixed_precision in load_backend(name).mixed_precisions
        ]
        raise UsageError(
            f"backend {backend_name!r} trains in its weights' dtype only; mixed precision "
            f"({mixed_precision}) is offered by {offering or 'no backend available here'}"
        )


def check_trainable(config: BERTConfig, train_positions: bool) -> None:
    """Pretraining needs both pretraining heads; freezing the positional embedding (as d2l 0.16-0.17's
    PyTorch code did, by adding ``pos_embedding.data``) needs a learned one."""
    if config.heads != HEADS:
        raise UsageError(
            f"pretraining needs the pooler and both heads (MLM and NSP); this model has only {list(config.heads)}"
        )
    if not train_positions and config.semantics.positions != "learned":
        raise UsageError(
            f"there are no positional embeddings to freeze: preset {config.semantics.name!r} adds a fixed "
            "sinusoidal table"
        )


@dataclass
class TrainingRun:
    """The losses of each step of one backend's run, how long it took and the weights it ended with."""

    backend: str
    losses: list[LossValues]
    seconds: float
    tokens: int  # valid (non-padding) tokens processed
    runtime: dict
    weights: dict[str, np.ndarray]
    rank: int = 0  # which worker of a data-parallel run returned it
    first_step_seconds: float = 0.0  # of ``seconds``: a compiling framework compiles then

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def steady_tokens_per_second(self) -> float:
        """Tokens per second after the first step (every step's batch has as many examples)."""
        rest = self.seconds - self.first_step_seconds
        steps = len(self.losses)
        return self.tokens * (steps - 1) / steps / rest if steps > 1 and rest > 0 else float("nan")


def save_run(directory: str | os.PathLike, config: BERTConfig, run: TrainingRun) -> None:
    """What worker 0 of a data-parallel run hands back to the process that launched it."""
    summary = {"losses": run.losses, "seconds": run.seconds, "tokens": run.tokens, "runtime": run.runtime}
    summary["first_step_seconds"] = run.first_step_seconds
    with written_together():
        save_weights(Path(directory) / "weights.npz", config, run.weights)
        replace_text(Path(directory) / "run.json", json.dumps(summary))


def load_run(directory: str | os.PathLike, backend_name: str) -> TrainingRun:
    """The run ``save_run`` left in ``directory``."""
    summary = json.loads((Path(directory) / "run.json").read_text())
    _, weights = load_weights(Path(directory) / "weights.npz")
    losses = [LossValues(*values) for values in summary["losses"]]
    return TrainingRun(
        backend_name,
        losses,
        summary["seconds"],
        summary["tokens"],
        summary["runtime"],
        weights,
        first_step_seconds=summary["first_step_seconds"],
    )


def handout(context: Any, arguments: dict[str, Any], workers: int) -> Any:
    """A queue holding a copy of ``arguments`` for each of ``workers`` processes that ``context`` (a
    multiprocessing context) is about to start; each worker takes one with ``get()``.

    A spawned process is sent its target's arguments as it starts, and ``start()`` waits until the pipe has
    taken them all: a worker that dies before reading them (a script that starts workers from its top level,
    without ``if __name__ == "__main__":``, runs itself again in each, which fails) would leave that wait,
    and the run, hanging for ever. A queue's own thread writes them instead, so a dead worker is seen and
    named. Keep the queue until the workers have ended: the semaphore they open goes with it."""
    queue = context.Queue()
    queue.cancel_join_thread()  # a copy no worker took is not waited for as this process exits
    for _ in range(workers):
        queue.put(arguments)
    return queue


def relay_steps(progress, on_step) -> None:
    """Pass the (step, losses) worker 0 has queued so far to ``on_step``, in order."""
    while not progress.empty():
        step, values = progress.get()
        if on_step:
            on_step(step, LossValues(*values))


@contextlib.contextmanager
def worker_environment(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` set in this process's environment for the duration, so that worker processes started
    then inherit them (settings a framework reads once, as it starts)."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def watch_workers(processes: list[Any], progress: Any, on_step: Callable[[int, LossValues], None] | None) -> None:
    """Relay worker 0's steps until every one of ``processes`` (started ``multiprocessing.Process``es)
    has ended well; the first to fail kills the others and raises ``WorkerFailed`` naming it."""
    try:
        while True:
            relay_steps(progress, on_step)
            for index, process in enumerate(processes):
                if process.exitcode not in (None, 0):
                    code = process.exitcode
                    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                    raise WorkerFailed.died(index, len(processes), how)
            if all(process.exitcode == 0 for process in processes):
                break
            time.sleep(0.2)
        relay_steps(progress, on_step)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()


def _resumed(directory: str | os.PathLike, config: BERTConfig, settings: dict, steps: int) -> TrainingState | None:
    """The training state saved in ``directory``, if any, checked against the run that resumes it."""
    state = load_training_state(directory)
    if state is None:
        return None
    if state.step > steps:
        raise UsageError(f"{directory}: its state is at step {state.step}, past the {steps} steps asked for")
    saved, asked = {**state.config.to_dict(), **state.settings}, {**config.to_dict(), **settings}
    differences = [
        f"{name} {saved.get(name, 'unset')!r} where this run has {asked.get(name, 'unset')!r}"
        for name in dict.fromkeys([*saved, *asked])
        if saved.get(name, "unset") != asked.get(name, "unset")
    ]
    if differences:
        raise UsageError(
            f"{directory}: its state was saved by a run with {', '.join(differences)}; resume with the same settings"
        )
    return state


def _trainable_backend(backend_name: str, mixed_precision: str | None, dtype: str) -> LoadedBackend:
    """The backend, checked to have a ``Pretrainer`` that trains in the precision asked for."""
    backend = load_backend(backend_name)
    if not backend.can_train:
        trainable = [name for name, status in backends().items() if status.available and load_backend(name).can_train]
        raise UsageError(f"backend {backend_name!r} cannot train (it has no Pretrainer): use one of {trainable}")
    check_mixed_precision(backend_name, mixed_precision, dtype)
    return backend


def run_pretraining(
    backend_name: str,
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    data: PretrainingData,
    steps: int,
    batch_size: int,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    on_step=None,
    rank: int = 0,
    workers: int = 1,
    checkpoint_every: int = 0,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    compile: bool = False,
    **options,
) -> TrainingRun:
    """``steps`` optimizer steps of ``backend_name`` from ``weights`` on ``data``'s batches (drawn from
    ``seed``, so two backends given the same seed see the same batches). ``options`` go to the
    backend's ``Pretrainer`` (optimizer, lr, mlm_normalization, adam_epsilon, adam_epsilon_style,
    train_positions).
    ``on_step(step, losses)`` is called after each step. ``compile``: the model is built with
    ``compile=True`` (its framework's opt-in compiler, where it has one) and trains compiled. A training
    run takes many steps of one shape, so its compiler takes its time to make fast code (``optimize``).

    With ``workers`` > 1 this process is worker ``rank`` of a data-parallel run whose process group the
    caller has set up: it draws every batch of ``batch_size`` as one process would and trains on its
    shard (``shard``), and the framework's engine combines the gradients; losses are the whole batch's.

    ``checkpoint_every`` K > 0 saves the whole training state to ``checkpoint_dir`` every K steps (worker
    0 does); ``resume`` goes on from the state there, if any, to ``steps`` in all, and ends with the
    weights an uninterrupted run ends with. The losses returned are those of the steps this call took."""
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    if batch_size % workers:
        raise UsageError(f"batch_size {batch_size} must be a multiple of the number of workers, {workers}")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise UsageError("checkpoints and resuming need a checkpoint directory")
    settings = {"backend": backend_name, "dtype": dtype, "seed": seed, "batch_size": batch_size, **options}
    settings = json.loads(json.dumps(settings))  # as a saved state holds them (tuples become lists)
    state = _resumed(checkpoint_dir, config, settings, steps) if resume and checkpoint_dir is not None else None
    if state is not None:
        weights = state.weights
    start = state.step if state else 0
    backend = _trainable_backend(backend_name, options.get("mixed_precision"), dtype)
    fused = backend.fused_on(device)  # on a GPU, the framework's fused attention kernel
    model = backend.build(config, weights, device=device, dtype=dtype, compile=compile, optimize=True, **fused)
    trainer = backend.trainer(model, **options, **({"distributed": True} if workers > 1 else {}))
    if state:
        trainer.load_state(state.optimizer, start)
    saves = checkpoint_dir if checkpoint_every and rank == 0 else None  # where this worker saves, if it does
    if saves is not None:
        os.makedirs(saves, exist_ok=True)
    batches = data.batches(batch_size, seed, skip=start)  # after the batches the saved steps took
    losses, tokens = [], 0
    first_step = 0.0  # none taken when resuming a run already at ``steps``
    started = time.perf_counter()
    for step in range(start + 1, steps + 1):
        batch = next(batches)
        # Dropout's masks come from a generator seeded from the step, so that a resumed run draws the
        # masks the uninterrupted one would have: the random state is (seed, step).
        trainer.seed(seed * 1_000_003 + step)
        if workers == 1:
            losses.append(trainer.step(batch))
        else:
            losses.append(trainer.step(shard(batch, rank, workers), BatchTotals.of(batch)))
        tokens += int(batch["valid_lens"].sum())
        if saves is not None and step % checkpoint_every == 0:
            save_training_state(saves, TrainingState(step, config, model.export_weights(), trainer.state(), settings))
        if step == start + 1:
            first_step = time.perf_counter() - started
        if on_step:
            on_step(step, losses[-1])
    seconds = time.perf_counter() - started
    return TrainingRun(
        backend_name, losses, seconds, tokens, model.runtime_info(), model.export_weights(), rank, first_step
    )
