"""Pretraining in PyTorch: d2l's loss, gradients per canonical parameter, optimizer steps.

Parallel to ``bert_multi/mxnet/pretrain.py``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..errors import UsageError, WorkerFailed
from ..spec.loss import LossValues
from ..training import (
    BatchTotals,
    TrainingRun,
    check_batch,
    free_address,
    handout,
    load_run,
    relay_steps,
    run_pretraining,
    save_run,
)
from ..training.trainer import Trainer
from .backend import NAME_RULES, TORCH_DTYPES, TorchBERT, autocast, compiled_run, tf32_enabled


def pretraining_loss(
    net: nn.Module,  # a BERTModel, or one in DistributedDataParallel
    batch: dict[str, torch.Tensor],
    vocab_size: int,
    mlm_normalization: str = "real_slots",
    totals: BatchTotals | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, MLM, NSP) loss, as d2l's ``_get_batch_loss_bert``. With ``totals`` (those of a whole batch
    of which ``batch`` is one shard): this shard's share of that batch's loss."""
    _, mlm_Y_hat, nsp_Y_hat = net(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    weights = batch["mlm_weights"].reshape(-1)
    labels = batch["mlm_labels"].reshape(-1)
    if totals is not None:  # sums over this shard, divided by the whole batch's totals
        reduction = "none" if mlm_normalization == "real_slots" else "sum"
        slot_losses = nn.functional.cross_entropy(mlm_Y_hat.reshape(-1, vocab_size), labels, reduction=reduction)
        if mlm_normalization == "real_slots":
            mlm_l = (slot_losses * weights).sum() / (totals.mlm_weight + 1e-8)
        else:
            mlm_l = slot_losses * (totals.mlm_weight / (totals.mlm_weight + 1e-8) / totals.slots)
        nsp_l = nn.functional.cross_entropy(nsp_Y_hat, batch["nsp_labels"], reduction="sum") / totals.examples
        return mlm_l + nsp_l, mlm_l, nsp_l
    if mlm_normalization == "real_slots":
        slot_losses = nn.functional.cross_entropy(mlm_Y_hat.reshape(-1, vocab_size), labels, reduction="none")
    else:
        # d2l's PyTorch code: CrossEntropyLoss() has already averaged over every slot, padding included,
        # so the weights below only scale that one number.
        slot_losses = nn.functional.cross_entropy(mlm_Y_hat.reshape(-1, vocab_size), labels)
    mlm_l = (slot_losses * weights).sum() / (weights.sum() + 1e-8)
    nsp_l = nn.functional.cross_entropy(nsp_Y_hat, batch["nsp_labels"])
    return mlm_l + nsp_l, mlm_l, nsp_l


class Pretrainer(Trainer):
    """Training steps on a ``TorchBERT`` (``bert_multi.training.Trainer`` has the options). Its own Adam
    style is "torch"; "mxnet" rescales epsilon each step. A model built with ``compile=True`` trains
    through ``torch.compile`` too: the forward and the loss as one graph, and its backward."""

    NAME_RULES = NAME_RULES
    MIXED_PRECISION = ("bfloat16",)

    def __init__(
        self,
        model: TorchBERT,
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
        self.model: TorchBERT = model
        # distributed: this process is one worker of torch.distributed's default process group, and the
        # module runs inside DistributedDataParallel, whose backward all-reduces every gradient to the
        # workers' mean: each worker's share of the loss is scaled by their number to make it the sum.
        self.workers = dist.get_world_size() if distributed else 1
        self.net: nn.Module = model.module
        if distributed:
            if not train_positions:
                model.module.encoder.pos_embedding.requires_grad_(False)  # DDP refuses a parameter never used
            self.net = nn.parallel.DistributedDataParallel(model.module)
        self.compute_loss = pretraining_loss
        if model.compiled is not None:
            if distributed:
                raise UsageError("compiled training runs in one process: leave out compile or the workers")
            self.compute_loss = torch.compile(pretraining_loss, fullgraph=True)
        self.params = dict(model.module.named_parameters())
        # Framework difference: a torch optimizer holds the parameters; Gluon's Trainer does too, but
        # takes its hyper-parameters as a dict and scales gradients by 1 / the batch size it is given
        # (docs/framework-differences.md: "who divides by the batch size", "Adam's epsilon").
        self.optimizer = (
            torch.optim.SGD(self.params.values(), lr=lr)
            if optimizer == "sgd"
            else torch.optim.Adam(self.params.values(), lr=lr, betas=adam_betas, eps=adam_epsilon)
        )

    def _tensors(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        checked = check_batch(self.config, batch)
        dtype = TORCH_DTYPES[self.model.dtype]
        return {
            name: torch.from_numpy(value).to(self.model.torch_device, dtype if value.dtype.kind == "f" else None)
            for name, value in checked.items()
        }

    def _loss(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None):
        tensors = self._tensors(batch)
        # autocast runs each matrix product in bfloat16 and the operations it lists as needing float32
        # range (the losses among them) in float32; the parameters and their gradients stay float32.
        lower = autocast(self.model.torch_device, self.mixed_precision)
        with lower, tf32_enabled(self.model.tf32), compiled_run(self.model.compiled is not None):
            return self.compute_loss(self.net, tensors, self.config.vocab_size, self.mlm_normalization, totals)

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        self.model.module.eval()
        with torch.no_grad():
            return LossValues(*(float(value) for value in self._loss(batch)))

    def seed(self, value: int) -> None:
        torch.manual_seed(value)

    def _backward(self, batch: dict[str, np.ndarray], totals: BatchTotals | None) -> LossValues:
        self.model.module.train()
        self.optimizer.zero_grad()
        total, mlm_l, nsp_l = self._loss(batch, totals)
        with tf32_enabled(self.model.tf32):  # the backward's products as the forward's
            (total * self.workers if self.workers > 1 else total).backward()
        values = torch.stack([total, mlm_l, nsp_l]).detach()
        if self.workers > 1:
            dist.all_reduce(values)  # the workers' shares add up to the whole batch's loss
        return LossValues(*values.tolist())

    def _update(self) -> None:
        if self.adam_epsilon_style == "mxnet" and isinstance(self.optimizer, torch.optim.Adam):
            beta2 = self.optimizer.param_groups[0]["betas"][1]
            for group in self.optimizer.param_groups:
                group["eps"] = self.adam_epsilon / math.sqrt(1 - beta2**self.steps)
        self.optimizer.step()

    def _gradient(self, own_name: str) -> np.ndarray:
        param = self.params[own_name]
        # Framework difference: a parameter that does not train has no gradient at all (None).
        grad = torch.zeros_like(param) if param.grad is None else param.grad
        return grad.detach().cpu().numpy().copy()

    def _moments(self, own_name: str) -> tuple[np.ndarray, np.ndarray] | None:
        slots = self.optimizer.state.get(self.params[own_name], {})
        if "exp_avg" not in slots:
            return None
        return slots["exp_avg"].detach().cpu().numpy().copy(), slots["exp_avg_sq"].detach().cpu().numpy().copy()

    def _restore(self, own_name: str, moments: tuple[np.ndarray, np.ndarray], steps: int) -> None:
        param = self.params[own_name]
        first, second = (torch.from_numpy(moment).to(param.device, param.dtype) for moment in moments)
        self.optimizer.state[param] = {"step": torch.tensor(float(steps)), "exp_avg": first, "exp_avg_sq": second}


@contextlib.contextmanager
def process_group(
    rank: int | None = None, workers: int | None = None, address: str | None = None, timeout_s: float = 60.0
) -> Iterator[None]:
    """This process as worker ``rank`` of ``workers`` in torch.distributed's default group (gloo, which
    runs on CPU tensors), the one at rank 0 listening at ``address`` ("host:port"); without them, as
    torchrun's environment says (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    timeout = timedelta(seconds=timeout_s)
    if address is None:
        dist.init_process_group("gloo", timeout=timeout)
    elif rank is None or workers is None:
        raise UsageError(f"a process group at {address} needs this worker's rank and the number of workers")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://{address}", rank=rank, world_size=workers, timeout=timeout)
    try:
        yield
    finally:
        dist.destroy_process_group()


def join_data_parallel(on_step: Callable[[int, LossValues], None] | None = None, **arguments: Any) -> TrainingRun:
    """``run_pretraining(backend_name="torch", **arguments)`` as one worker of a data-parallel run launched
    from outside, by torchrun on one machine or several (its environment gives the rank and the number of
    workers). Every worker returns the same weights; only worker 0 calls ``on_step``."""
    with process_group():
        rank, workers = dist.get_rank(), dist.get_world_size()
        return run_pretraining("torch", rank=rank, workers=workers, on_step=on_step if rank == 0 else None, **arguments)


def end_worker(code: int) -> int:
    """End this data-parallel worker's process with exit status ``code``, its work done and written.

    Framework difference: torch 2.13 keeps gloo's threads running after ``destroy_process_group`` (no
    Python object holds the group, and ``shutdown()`` leaves them too), and tearing them down as the
    interpreter exits aborted about one worker in 30 ("terminate called without an active exception",
    SIGABRT). So the process leaves without the interpreter's teardown; MXNet's workers need theirs.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _worker(rank: int, workers: int, address: str, threads: int, out: str, progress: Any, inputs: Any) -> None:
    torch.set_num_threads(threads)
    arguments = inputs.get()
    report = (lambda step, losses: progress.put((step, tuple(losses)))) if rank == 0 else None
    with process_group(rank, workers, address):
        run = run_pretraining("torch", rank=rank, workers=workers, on_step=report, **arguments)
    if rank == 0:  # every worker ends with the same weights
        save_run(out, arguments["config"], run)
    end_worker(0)


def train_data_parallel(
    workers: int,
    threads_per_worker: int = 1,
    on_step: Callable[[int, LossValues], None] | None = None,
    **arguments: Any,
) -> TrainingRun:
    """``run_pretraining(backend_name="torch", **arguments)`` on ``workers`` processes of this machine,
    each on its shard of every batch, gradients all-reduced by DistributedDataParallel over gloo.
    ``on_step(step, losses)`` sees worker 0's steps as they happen. A worker that raises or dies stops
    the others at once and raises ``WorkerFailed`` naming it."""
    spawn = torch.multiprocessing.get_context("spawn")
    progress, inputs = spawn.SimpleQueue(), handout(spawn, arguments, workers)
    with tempfile.TemporaryDirectory() as out:
        context = torch.multiprocessing.start_processes(
            _worker,
            args=(workers, free_address(), threads_per_worker, out, progress, inputs),
            nprocs=workers,
            join=False,
            start_method="spawn",
        )
        try:
            while not context.join(timeout=0.2):
                relay_steps(progress, on_step)
        except torch.multiprocessing.ProcessRaisedException as error:
            message = str(error).strip().splitlines()[-1]
            raise WorkerFailed(f"worker {error.error_index} of {workers} failed: {message}") from None
        except torch.multiprocessing.ProcessExitedException as error:
            how = f"signal {error.signal_name}" if error.signal_name else f"exit code {error.exit_code}"
            raise WorkerFailed.died(error.error_index, workers, how) from None
        relay_steps(progress, on_step)
        return load_run(out, "torch")
