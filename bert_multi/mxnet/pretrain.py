"""Pretraining in MXNet/Gluon: d2l's loss, gradients per canonical parameter, optimizer steps.

Parallel to ``bert_multi/torch/pretrain.py``.
"""

from __future__ import annotations

import atexit
import gc
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

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
    worker_environment,
)
from ..training.trainer import Trainer
from .backend import NAME_RULES, MXNetBERT, _parameters
from .model import BERTModel

_loss = gluon.loss.SoftmaxCrossEntropyLoss()


def pretraining_loss(
    net: BERTModel,
    batch: dict[str, mx.np.ndarray],
    vocab_size: int,
    mlm_normalization: str = "real_slots",
    totals: BatchTotals | None = None,
) -> tuple[mx.np.ndarray, mx.np.ndarray, mx.np.ndarray]:
    """(total, MLM, NSP) loss, as d2l's ``_get_batch_loss_bert``. With ``totals`` (those of a whole batch
    of which ``batch`` is one shard): this shard's share of that batch's loss."""
    _, mlm_Y_hat, nsp_Y_hat = net(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    weights = batch["mlm_weights"].reshape(-1)
    labels = batch["mlm_labels"].reshape(-1)
    if totals is not None:  # sums over this shard, divided by the whole batch's totals

        def exactly(value: float) -> mx.np.ndarray:
            # Framework difference: a Python number in an MXNet expression becomes a C float operator
            # parameter (docs/framework-differences.md); an array keeps float64's precision.
            return mx.np.array(value, dtype=weights.dtype, ctx=weights.ctx)

        slot_losses = _loss(mlm_Y_hat.reshape((-1, vocab_size)), labels)
        if mlm_normalization == "real_slots":
            mlm_l = (slot_losses * weights).sum() / exactly(totals.mlm_weight + 1e-8)
        else:
            mlm_l = slot_losses.sum() * exactly(totals.mlm_weight / (totals.mlm_weight + 1e-8) / totals.slots)
        nsp_l = _loss(nsp_Y_hat, batch["nsp_labels"]).sum() / exactly(totals.examples)
        return mlm_l + nsp_l, mlm_l, nsp_l
    if mlm_normalization == "real_slots":
        # Framework difference: Gluon's losses take per-sample weights and never reduce over the batch.
        slot_losses = _loss(mlm_Y_hat.reshape((-1, vocab_size)), labels)
    else:
        # d2l's PyTorch code, reproduced: one average over every slot, padding included.
        slot_losses = _loss(mlm_Y_hat.reshape((-1, vocab_size)), labels).mean()
    mlm_l = (slot_losses * weights).sum() / (weights.sum() + 1e-8)
    nsp_l = _loss(nsp_Y_hat, batch["nsp_labels"]).mean()
    return mlm_l + nsp_l, mlm_l, nsp_l


_KVSTORE: list[mx.kvstore.KVStore] = []


def dist_kvstore() -> mx.kvstore.KVStore:
    """This process's distributed key-value store, created once: each creation joins the scheduler."""
    if not _KVSTORE:
        _KVSTORE.append(mx.kv.create("dist_sync"))
        # Framework difference: the store leaves the run (ps-lite's finalize, a barrier with the other
        # processes) only as it is freed, so it is freed by an exit handler, not left to the interpreter's
        # teardown, which a finished command skips (bert_multi.ending): the others would wait for it.
        atexit.register(_free_kvstore)
    return _KVSTORE[0]


def _free_kvstore() -> None:
    _KVSTORE.clear()
    gc.collect()  # a trainer in a reference cycle may still hold it


class Pretrainer(Trainer):
    """Training steps on an ``MXNetBERT`` (``bert_multi.training.Trainer`` has the options). Its own Adam
    style is "mxnet"; "torch" rescales epsilon each step."""

    NAME_RULES = NAME_RULES

    def __init__(
        self,
        model: MXNetBERT,
        optimizer: str = "adam",
        lr: float = 0.01,
        mlm_normalization: str = "real_slots",
        adam_epsilon: float = 1e-8,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        adam_epsilon_style: str = "mxnet",
        train_positions: bool = True,
        distributed: bool = False,
        mixed_precision: str | None = None,
    ) -> None:
        super().__init__(
            model, optimizer, mlm_normalization, adam_epsilon, adam_epsilon_style, train_positions, mixed_precision
        )
        self.model: MXNetBERT = model
        if not train_positions:
            # Framework difference: a Gluon Trainer refuses a parameter whose gradient backward never
            # updated unless its grad_req is 'null'; torch's optimizers skip a parameter whose grad is None.
            model.module.encoder.pos_embedding.grad_req = "null"
        self.params = _parameters(model.module)
        # Framework difference: Gluon's Trainer takes its hyper-parameters as a dict and scales
        # gradients by 1 / the batch size passed to step(); the loss is already a mean, so step(1)
        # (docs/framework-differences.md: "who divides by the batch size", "Adam's epsilon").
        hyper = {"learning_rate": lr}
        if optimizer == "adam":
            hyper.update(epsilon=adam_epsilon, beta1=adam_betas[0], beta2=adam_betas[1])
        # distributed: this process is one worker of MXNet's distributed key-value store (dist_sync, set
        # up by the DMLC_* variables). Framework difference: the store *sums* the gradients the workers
        # push (torch's DDP averages them), so each worker's share of the loss is used as it is, and it
        # sums in float32 whatever the arrays' dtype. Each worker then runs the optimizer on the sums, as
        # in torch. Gluon's Trainer can drive the store itself (kvstore=), but the pull with which it
        # broadcasts the parameters raced the updates here: 2 workers ended 4 SGD steps up to 1.0 away from
        # one process, differently from run to run. Pushing and pulling each gradient, then waiting for
        # MXNet's asynchronous engine before the update, is exact and repeatable.
        self.kvstore = dist_kvstore() if distributed else None
        self.workers = 1 if self.kvstore is None else self.kvstore.num_workers
        params = model.module.collect_params()
        self.trainer = gluon.Trainer(params, optimizer, hyper, kvstore=None)
        if self.kvstore is not None:
            self.trained = [param for param in params.values() if param.grad_req != "null"]
            for key, param in enumerate(self.trained):
                self.kvstore.init(key, param.data())
            self.loss_key = len(self.trained)
            self.kvstore.init(self.loss_key, mx.np.zeros(3, dtype="float64"))

    def _arrays(self, batch: dict[str, np.ndarray]) -> dict[str, mx.np.ndarray]:
        checked = check_batch(self.config, batch)
        return {
            name: mx.np.array(
                value, dtype=self.model.dtype if value.dtype.kind == "f" else value.dtype, ctx=self.model.context
            )
            for name, value in checked.items()
        }

    def _loss(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None):
        return pretraining_loss(
            self.model.module, self._arrays(batch), self.config.vocab_size, self.mlm_normalization, totals
        )

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        # Framework difference: outside autograd.record() Gluon computes no gradients and dropout is off.
        return LossValues(*(float(value) for value in self._loss(batch)))

    def seed(self, value: int) -> None:
        mx.random.seed(value)

    def _backward(self, batch: dict[str, np.ndarray], totals: BatchTotals | None) -> LossValues:
        # Framework difference: Gluon records the graph (and turns dropout on) only inside
        # autograd.record(); torch records always and uses train()/eval() for dropout.
        with autograd.record(train_mode=True):
            total, mlm_l, nsp_l = self._loss(batch, totals)
        total.backward()
        if self.kvstore is None:
            return LossValues(float(total), float(mlm_l), float(nsp_l))
        values = mx.np.array([float(total), float(mlm_l), float(nsp_l)], dtype="float64")
        self.kvstore.push(self.loss_key, values)  # the workers' shares add up to the whole batch's loss
        self.kvstore.pull(self.loss_key, out=values)
        return LossValues(*values.asnumpy().tolist())

    def _update(self) -> None:
        optimizer = self.trainer._optimizer
        if self.adam_epsilon_style == "torch" and isinstance(optimizer, mx.optimizer.Adam):
            optimizer.epsilon = self.adam_epsilon * math.sqrt(1 - optimizer.beta2**self.steps)
        if self.kvstore is not None:
            for key, param in enumerate(self.trained):
                self.kvstore.pushpull(key, param.grad(), out=param.grad())  # summed over the workers
            mx.npx.waitall()
        self.trainer.step(1)

    def _gradient(self, own_name: str) -> np.ndarray:
        param = self.params[own_name]
        # Framework difference: a parameter that does not train has no gradient array (grad_req 'null').
        grad = mx.np.zeros_like(param.data()) if param.grad_req == "null" else param.grad(self.model.context)
        return grad.asnumpy().copy()

    def _moments(self, own_name: str) -> tuple[np.ndarray, np.ndarray] | None:
        # Framework difference: Gluon's Trainer.save_states pickles its updater, and nothing may be
        # unpickled on a load path here, so the moments are read out of the updater one by one.
        moments = self.trainer._updaters[0].states.get(self.trainer._param2idx[self.params[own_name].name])
        return None if moments is None else (moments[0].asnumpy(), moments[1].asnumpy())

    def _restore(self, own_name: str, moments: tuple[np.ndarray, np.ndarray], steps: int) -> None:
        updater, optimizer = self.trainer._updaters[0], self.trainer._optimizer
        index = self.trainer._param2idx[self.params[own_name].name]
        updater.states[index] = tuple(mx.nd.array(moment, dtype=self.model.dtype) for moment in moments)
        updater.states_synced[index] = False  # moved to the parameter's device at the next update
        optimizer._index_update_count[index] = steps
        optimizer.num_update = steps


def _worker(workers: int, out: str, progress: Any, inputs: Any) -> None:
    arguments = inputs.get()
    rank = dist_kvstore().rank  # the scheduler numbers the workers as they join
    report = (lambda step, losses: progress.put((step, tuple(losses)))) if rank == 0 else None
    run = run_pretraining("mxnet", rank=rank, workers=workers, on_step=report, **arguments)
    if rank == 0:  # every worker ends with the same weights
        save_run(out, arguments["config"], run)


def join_data_parallel(on_step: Callable[[int, LossValues], None] | None = None, **arguments: Any) -> TrainingRun:
    """``run_pretraining(backend_name="mxnet", **arguments)`` as one worker of a data-parallel run launched
    from outside, on one machine or several: the DMLC_* variables (DMLC_ROLE=worker) name the scheduler,
    and it numbers the workers. Every worker returns the same weights; only worker 0 calls ``on_step``."""
    rank, workers = dist_kvstore().rank, dist_kvstore().num_workers
    return run_pretraining("mxnet", rank=rank, workers=workers, on_step=on_step if rank == 0 else None, **arguments)


def end_worker(code: int) -> int:
    """The exit status ``code`` of this data-parallel worker, its work done and written: the process ends
    as any does. Framework difference: MXNet's key-value store tells the scheduler and the servers, as
    the interpreter tears it down, that this worker is done; torch's workers leave without the teardown."""
    return code


def train_data_parallel(
    workers: int,
    threads_per_worker: int = 1,
    on_step: Callable[[int, LossValues], None] | None = None,
    **arguments: Any,
) -> TrainingRun:
    """``run_pretraining(backend_name="mxnet", **arguments)`` on ``workers`` processes of this machine,
    each on its shard of every batch, gradients summed by MXNet's dist_sync key-value store (a
    scheduler and a server on 127.0.0.1 besides the workers). ``on_step(step, losses)`` sees worker 0's
    steps as they happen. A worker that dies stops the others at once and raises ``WorkerFailed``."""
    host, port = free_address().split(":")
    dmlc = {
        "DMLC_PS_ROOT_URI": host,
        "DMLC_PS_ROOT_PORT": port,
        "DMLC_NUM_SERVER": "1",
        "DMLC_NUM_WORKER": str(workers),
    }
    spawn = multiprocessing.get_context("spawn")
    progress = spawn.SimpleQueue()
    inputs = handout(spawn, arguments, workers)

    helpers: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory() as out:
            # OMP_NUM_THREADS must be set before a worker imports MXNet, so the workers inherit it.
            with worker_environment({**dmlc, "DMLC_ROLE": "worker", "OMP_NUM_THREADS": str(threads_per_worker)}):
                processes = [
                    spawn.Process(target=_worker, args=(workers, out, progress, inputs)) for _ in range(workers)
                ]
                for process in processes:
                    process.start()
            # Framework difference: MXNet's engine is a scheduler and key-value servers besides the workers. A
            # process whose DMLC_ROLE is scheduler or server takes that role when it imports mxnet, and exits
            # when the workers are done; torch.distributed needs only the workers. They start after the
            # workers, which find them when they join: a script that starts workers from its top level fails
            # in each worker at its first start, before it has helpers that would outlive it when it is stopped.
            helpers.extend(
                subprocess.Popen([sys.executable, "-c", "import mxnet"], env={**os.environ, **dmlc, "DMLC_ROLE": role})
                for role in ("scheduler", "server")
            )
            watch_workers(processes, progress, on_step)
            return load_run(out, "mxnet")
    except BaseException:
        for helper in helpers:  # they would wait for the workers that are gone
            helper.kill()
        raise
    finally:
        for helper in helpers:
            try:
                helper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()
