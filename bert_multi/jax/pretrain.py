"""Pretraining in JAX with optax: d2l's loss, gradients per canonical parameter, optimizer steps.

Parallel to ``bert_multi/torch/pretrain.py`` and ``bert_multi/mxnet/pretrain.py``.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from ..errors import UsageError
from ..files.formats import flax as flax_format
from ..spec.loss import LossValues
from ..training import (
    BatchTotals,
    TrainingRun,
    check_batch,
    free_address,
    handout,
    load_run,
    run_pretraining,
    save_run,
    watch_workers,
)
from ..training.trainer import Trainer
from .backend import NAME_RULES, JaxBERT, Jitted
from .model import BERTModel


def pretraining_loss(
    module: BERTModel,
    params: Any,
    batch: dict[str, jax.Array],
    mlm_normalization: str = "real_slots",
    totals: BatchTotals | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(total, MLM, NSP) loss, as d2l's ``_get_batch_loss_bert``, in training mode when given a
    ``dropout_key``. With ``totals`` (those of a whole batch of which ``batch`` is one shard): this
    shard's share of that batch's loss."""
    # Framework difference: the parameters are an argument of every call, and dropout draws from the
    # key passed in (torch and Gluon draw from a global generator, in a mode set on the module).
    _, mlm_Y_hat, nsp_Y_hat = module.apply(
        {"params": params},
        batch["tokens"],
        batch["segments"],
        batch["valid_lens"],
        batch["pred_positions"],
        training=dropout_key is not None,
        rngs=None if dropout_key is None else {"dropout": dropout_key},
    )
    weights = batch["mlm_weights"].reshape(-1)
    labels = batch["mlm_labels"].reshape(-1)
    # optax's cross-entropy never reduces: one loss per slot, as Gluon's.
    slot_losses = optax.softmax_cross_entropy_with_integer_labels(mlm_Y_hat.reshape(-1, module.vocab_size), labels)
    nsp_losses = optax.softmax_cross_entropy_with_integer_labels(nsp_Y_hat, batch["nsp_labels"])
    if totals is not None:  # sums over this shard, divided by the whole batch's totals
        if mlm_normalization == "real_slots":
            mlm_l = (slot_losses * weights).sum() / (totals.mlm_weight + 1e-8)
        else:
            mlm_l = slot_losses.sum() * (totals.mlm_weight / (totals.mlm_weight + 1e-8) / totals.slots)
        nsp_l = nsp_losses.sum() / totals.examples
        return mlm_l + nsp_l, mlm_l, nsp_l
    if mlm_normalization == "all_slots":
        # d2l's PyTorch code, reproduced: one average over every slot, padding included.
        slot_losses = slot_losses.mean()
    mlm_l = (slot_losses * weights).sum() / (weights.sum() + 1e-8)
    nsp_l = nsp_losses.mean()
    return mlm_l + nsp_l, mlm_l, nsp_l


def _losses(module: BERTModel, mlm_normalization: str, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    return jnp.stack(pretraining_loss(module, params, batch, mlm_normalization))


_loss = Jitted(_losses, static_argnums=(0, 1))


def _loss_and_gradients(
    module: BERTModel,
    mlm_normalization: str,
    params: Any,
    batch: dict[str, jax.Array],
    totals: BatchTotals | None,
    dropout_key: jax.Array,
) -> Any:
    """The loss in training mode and its gradient, compiled once per module, options and batch shape.
    Framework difference: ``jax.grad`` transforms the loss function into its gradient function; torch
    and Gluon record the forward and walk the record backwards."""

    def total(params: Any) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        losses = pretraining_loss(module, params, batch, mlm_normalization, totals, dropout_key)
        return losses[0], losses

    (_, losses), gradients = jax.value_and_grad(total, has_aux=True)(params)
    return jnp.stack(losses), gradients


_gradients = Jitted(_loss_and_gradients, static_argnums=(0, 1))


def transformation(settings: tuple) -> optax.GradientTransformation:
    """The optax transformation that ``settings`` (optimizer, lr, beta1, beta2, epsilon, epsilon style) name."""
    name, lr, beta1, beta2, epsilon, style = settings
    if name == "sgd":
        return optax.sgd(lr)
    if style == "mxnet":
        # optax adds epsilon to sqrt of the bias-corrected second moment, as torch does; MXNet's place is
        # the same update with epsilon rescaled each step (count is the number of steps taken before).
        return optax.inject_hyperparams(optax.adam)(
            learning_rate=lr, b1=beta1, b2=beta2, eps=lambda count: epsilon / jnp.sqrt(1 - beta2 ** (count + 1))
        )
    return optax.adam(lr, b1=beta1, b2=beta2, eps=epsilon)


# Framework difference: the optimizer's state is a value like the parameters, passed in and returned;
# donating both lets XLA write the new ones over the old. A buffer a NumPy view still reads (an
# ``export_weights(share=True)``) is not donated: JAX copies instead.
def _update_step(settings: tuple, params: Any, gradients: Any, state: Any) -> tuple[Any, Any]:
    updates, state = transformation(settings).update(gradients, state, params)
    return optax.apply_updates(params, updates), state


_updated = Jitted(_update_step, static_argnums=0, donate_argnums=(1, 3))


class Pretrainer(Trainer):
    """Training steps on a ``JaxBERT`` (``bert_multi.training.Trainer`` has the options). Its own Adam
    style is "torch" (optax's); "mxnet" rescales epsilon each step."""

    NAME_RULES = NAME_RULES

    def __init__(
        self,
        model: JaxBERT,
        optimizer: str = "adam",
        lr: float = 0.01,
        mlm_normalization: str = "real_slots",
        adam_epsilon: float = 1e-8,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        adam_epsilon_style: str = "torch",
        train_positions: bool = True,
        distributed: bool = False,
        mixed_precision: str | None = None,
    ) -> None:
        super().__init__(
            model, optimizer, mlm_normalization, adam_epsilon, adam_epsilon_style, train_positions, mixed_precision
        )
        self.model: JaxBERT = model
        # distributed: this process is one of jax.distributed's processes; each computes its shard's
        # share of the loss and the gradients are summed over the processes (_backward).
        self.workers = jax.process_count() if distributed else 1
        self.settings = (optimizer, float(lr), *map(float, adam_betas), float(adam_epsilon), adam_epsilon_style)
        # On the model's device from the start: jit compiles again for arguments placed otherwise, and
        # the state the first step returns is placed there.
        with model.computing():
            self.optimizer_state = jax.device_put(transformation(self.settings).init(model.params), model.place)
        self.key = jax.random.key(0)
        self.last_gradients: Any = None

    def _train_positions(self, train: bool) -> None:
        # Framework difference: a Flax module is an immutable description; a copy with the field changed
        # replaces it (torch and Gluon set an attribute on the live module).
        self.module = self.model.module.clone(train_positions=train)

    def _arrays(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        checked = check_batch(self.config, batch)
        return {
            name: jax.device_put(value.astype(self.model.dtype) if value.dtype.kind == "f" else value, self.model.place)
            for name, value in checked.items()
        }

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        with self.model.computing():
            values = _loss[self.model.compiled](
                self.module, self.mlm_normalization, self.model.params, self._arrays(batch)
            )
        return LossValues(*np.asarray(values).tolist())

    def seed(self, value: int) -> None:
        # Framework difference: no global generator; a key, split for each draw (_backward).
        self.key = jax.random.key(value % 2**32)

    def _backward(self, batch: dict[str, np.ndarray], totals: BatchTotals | None) -> LossValues:
        self.key, dropout_key = jax.random.split(self.key)
        with self.model.computing():
            arrays = self._arrays(batch)
            losses, gradients = _gradients[self.model.compiled](
                self.module, self.mlm_normalization, self.model.params, arrays, totals, dropout_key
            )
            if self.workers > 1:  # the workers' shares add up to the whole batch's loss and gradient
                losses, gradients = jax.tree_util.tree_map(
                    lambda gathered: gathered.sum(axis=0), multihost_utils.process_allgather((losses, gradients))
                )
        self.last_gradients = gradients
        return LossValues(*np.asarray(losses).tolist())  # one read of the three, not three

    def _update(self) -> None:
        with self.model.computing():
            gradients = jax.device_put(self.last_gradients, self.model.place)
            updated = _updated[self.model.compiled](self.settings, self.model.params, gradients, self.optimizer_state)
        self.model.params, self.optimizer_state = updated

    def _leaf(self, tree: Any, own_name: str) -> np.ndarray:
        """The array at parameter ``own_name``'s place in a tree shaped as the parameters, laid out canonically."""
        for part in own_name.split("."):  # the own name is the path in the tree, dotted
            tree = tree[part]
        return np.array(tree.T if flax_format.transposed(own_name) else tree)

    def _gradient(self, own_name: str) -> np.ndarray:
        # A parameter that does not train has a zero gradient: stop_gradient in the model.
        return self._leaf(self.last_gradients, own_name)

    def _moments(self, own_name: str) -> tuple[np.ndarray, np.ndarray] | None:
        adam = _adam_state(self.optimizer_state)
        frozen = not self.module.train_positions and own_name == "encoder.pos_embedding"
        if adam is None or int(adam.count) == 0 or frozen:
            return None
        return self._leaf(adam.mu, own_name), self._leaf(adam.nu, own_name)

    def _restore(self, own_name: str, moments: tuple[np.ndarray, np.ndarray], steps: int) -> None:
        *parents, leaf = own_name.split(".")
        adam = _adam_state(self.optimizer_state)
        with self.model.computing():
            for tree, moment in zip((adam.mu, adam.nu), moments):
                for part in parents:
                    tree = tree[part]
                tree[leaf] = jax.device_put(moment.T if flax_format.transposed(own_name) else moment, self.model.place)
            # Every step count in the state (optax's adam and the epsilon schedule keep one each).
            counted = jax.tree_util.tree_map_with_path(
                lambda where, leaf: jnp.asarray(steps, leaf.dtype) if _is_count(where) else leaf, self.optimizer_state
            )
            self.optimizer_state = jax.device_put(counted, self.model.place)


def _adam_state(state: Any) -> Any:
    """optax's ``ScaleByAdamState`` inside ``state``, or None (SGD)."""
    found = [node for node in jax.tree_util.tree_leaves(state, is_leaf=_is_adam) if _is_adam(node)]
    return found[0] if found else None


def _is_adam(node: Any) -> bool:
    return isinstance(node, optax.ScaleByAdamState)


def _is_count(path: tuple) -> bool:
    return bool(path) and getattr(path[-1], "name", None) == "count"


@contextlib.contextmanager
def process_group(
    rank: int | None = None, workers: int | None = None, address: str | None = None, timeout_s: float = 60.0
) -> Iterator[None]:
    """This process as process ``rank`` of ``workers`` in ``jax.distributed``, the one at rank 0 serving
    at ``address`` ("host:port"); without them, as JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID say. Framework difference: JAX's CPU collectives between processes are gloo's only
    when asked for, before JAX starts its CPU client."""
    if address is None:
        address, workers, rank = _from_environment()
    elif rank is None or workers is None:
        raise UsageError(f"a process group at {address} needs this worker's rank and the number of workers")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(address, workers, rank, initialization_timeout=math.ceil(timeout_s))
    try:
        yield
    finally:
        jax.distributed.shutdown()


JOIN_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _from_environment() -> tuple[str, int, int]:
    missing = [name for name in JOIN_VARIABLES if not os.environ.get(name)]
    if missing:
        raise UsageError(
            f"joining a JAX run needs {', '.join(JOIN_VARIABLES)} (process 0's host:port, the number of "
            f"processes, this one's number); {', '.join(missing)} unset"
        )
    try:
        workers, rank = int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"])
    except ValueError:
        raise UsageError("JAX_NUM_PROCESSES and JAX_PROCESS_ID must be whole numbers") from None
    return os.environ["JAX_COORDINATOR_ADDRESS"], workers, rank


def join_data_parallel(on_step: Callable[[int, LossValues], None] | None = None, **arguments: Any) -> TrainingRun:
    """``run_pretraining(backend_name="jax", **arguments)`` as one process of a data-parallel run started
    on one machine or several, each with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set.
    Every worker returns the same weights; only worker 0 calls ``on_step``."""
    with process_group():
        rank, workers = jax.process_index(), jax.process_count()
        return run_pretraining("jax", rank=rank, workers=workers, on_step=on_step if rank == 0 else None, **arguments)


def end_worker(code: int) -> int:
    """The exit status ``code`` of this data-parallel worker, its work done and written: the process ends
    as any does (``jax.distributed.shutdown`` has already left the group)."""
    return code


def _worker(rank: int, workers: int, address: str, cores: list[int], out: str, progress: Any, inputs: Any) -> None:
    arguments = inputs.get()
    # XLA sizes its thread pool from the cores this process may run on, when JAX first computes.
    os.sched_setaffinity(0, cores)
    # gloo greets each connection on stdout; a worker's progress goes through the queue instead.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    report = (lambda step, losses: progress.put((step, tuple(losses)))) if rank == 0 else None
    with process_group(rank, workers, address):
        run = run_pretraining("jax", rank=rank, workers=workers, on_step=report, **arguments)
    if rank == 0:  # every worker ends with the same weights
        save_run(out, arguments["config"], run)


def train_data_parallel(
    workers: int,
    threads_per_worker: int = 1,
    on_step: Callable[[int, LossValues], None] | None = None,
    **arguments: Any,
) -> TrainingRun:
    """``run_pretraining(backend_name="jax", **arguments)`` on ``workers`` processes of this machine, each
    on its shard of every batch, gradients summed over ``jax.distributed`` (gloo's CPU collectives on
    127.0.0.1). ``on_step(step, losses)`` sees worker 0's steps as they happen. A worker that dies stops
    the others at once and raises ``WorkerFailed``."""
    spawn = multiprocessing.get_context("spawn")
    progress = spawn.SimpleQueue()
    address = free_address()
    # Framework difference: threads are cores here (xla_threads): worker r runs on the r-th
    # ``threads_per_worker`` of the cores this process may use, round the machine if they run out.
    usable = sorted(os.sched_getaffinity(0))
    cores = [
        [usable[(rank * threads_per_worker + index) % len(usable)] for index in range(threads_per_worker)]
        for rank in range(workers)
    ]
    inputs = handout(spawn, arguments, workers)
    with tempfile.TemporaryDirectory() as out:
        processes = [
            spawn.Process(target=_worker, args=(rank, workers, address, cores[rank], out, progress, inputs))
            for rank in range(workers)
        ]
        for process in processes:
            process.start()
        watch_workers(processes, progress, on_step)
        return load_run(out, "jax")
