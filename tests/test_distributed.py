"""Data-parallel pretraining: the shards' losses and gradients add up to the whole batch's, and
workers of the framework's own distributed engine end where one process on the whole batch ends."""

import numpy as np
import pytest

from bert_multi import BERTConfig, init_weights
from bert_multi.engine.compare import compare_arrays, tolerance_for
from bert_multi.training import (
    MLM_NORMALIZATIONS,
    BatchTotals,
    PretrainingData,
    builtin_corpus,
    paragraphs_from_lines,
    run_pretraining,
    shard,
)

pytestmark = pytest.mark.needs("Pretrainer", "train_data_parallel")  # on each framework's own engine

DATA = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=32, seed=0)
CONFIG = BERTConfig(len(DATA.vocab), 16, 24, 2, 2, max_len=32)
WEIGHTS = init_weights(CONFIG, seed=1, dtype="float64")


def test_shards_are_equal_contiguous_slices_that_cover_the_batch():
    batch = next(DATA.batches(12, seed=3))
    shards = [shard(batch, rank, 3) for rank in range(3)]
    for name, values in batch.items():
        assert np.array_equal(np.concatenate([s[name] for s in shards]), values)
    with pytest.raises(ValueError, match="a batch of 12 cannot be split into 5 equal shards"):
        shard(batch, 0, 5)
    with pytest.raises(ValueError, match=r"\(rank 3\)"):
        shard(batch, 3, 3)


@pytest.mark.parametrize("mlm_normalization", MLM_NORMALIZATIONS)
def test_the_shards_shares_add_up_to_the_whole_batchs_loss_and_gradient(framework, mlm_normalization):
    # Shards that differ in how many real MLM slots they hold: a mean of per-shard means would be wrong.
    batch = next(DATA.batches(8, seed=4))
    batch["mlm_weights"] = batch["mlm_weights"].copy()
    batch["mlm_weights"][0, 1:] = 0
    shards = [shard(batch, rank, 2) for rank in range(2)]
    assert shards[0]["mlm_weights"].sum() != shards[1]["mlm_weights"].sum()
    options = {"mlm_normalization": mlm_normalization}
    trainer = framework.Pretrainer(framework.build(CONFIG, WEIGHTS, dtype="float64"), **options)
    whole_losses, whole = trainer.gradients(batch)
    parts = [trainer.gradients(part, BatchTotals.of(batch)) for part in shards]
    assert np.allclose(np.sum([losses for losses, _ in parts], axis=0), whole_losses, rtol=0, atol=1e-13)
    for name, gradient in whole.items():
        assert np.abs(parts[0][1][name] + parts[1][1][name] - gradient).max() <= 1e-13, name


def test_data_parallel_needs_a_batch_the_workers_can_share():
    with pytest.raises(ValueError, match="batch_size 9 must be a multiple of the number of workers, 2"):
        run_pretraining("torch", CONFIG, WEIGHTS, DATA, steps=1, batch_size=9, workers=2)


# Bounds on the largest weight and loss differences after 4 float64 steps, 2 workers against one
# process (what was measured in the comments). MXNet's key-value store sums in float32 whatever the
# dtype, so its float64 runs agree to float32's rounding of the gradients (and of the losses, which go
# through it too), not to float64's; Adam, which divides each gradient by its own RMS, turns that into
# larger steps where a gradient is nearly zero.
AGREEMENT = {  # (weights, losses)
    ("torch", "sgd"): (1e-10, 1e-12),  # measured 1.1e-16, 8.9e-16
    ("torch", "adam"): (1e-10, 1e-12),  # measured 1.5e-12, 8.9e-16
    ("mxnet", "sgd"): (1e-7, 1e-6),  # measured 2.0e-9, 2.4e-7
    ("mxnet", "adam"): (1e-4, 1e-6),  # measured 1.4e-6, 2.4e-7
    ("jax", "sgd"): (1e-10, 1e-12),  # measured 1.4e-17, 1.8e-15
    ("jax", "adam"): (1e-10, 1e-12),  # measured 3.7e-13, 1.8e-15
}


# Each optimizer and each dtype, not each pair: SGD in float64 is the launch from outside's, below.
@pytest.mark.parametrize(("optimizer", "dtype"), [("adam", "float64"), ("sgd", "float32")])
def test_two_workers_end_where_one_process_ends(framework, optimizer, dtype):
    """The framework's own engine (torch: DistributedDataParallel over gloo; MXNet: the dist_sync
    key-value store, a scheduler and a server; JAX: jax.distributed with gloo's CPU collectives), 2
    processes of 1 thread each, against one process."""
    arguments = {"config": CONFIG, "weights": WEIGHTS, "data": DATA, "steps": 4, "batch_size": 16, "seed": 0}
    arguments.update(dtype=dtype, optimizer=optimizer, lr=0.05)
    alone = run_pretraining(framework.NAME, **arguments)
    together = framework.train_data_parallel(2, **arguments)
    moved = max(np.abs(alone.weights[name] - WEIGHTS[name]).max() for name in WEIGHTS)
    assert moved > 0.05  # the steps really trained: agreement below is not two copies of the start
    if dtype == "float64":
        weights_bound, losses_bound = AGREEMENT[(framework.NAME, optimizer)]
        assert np.abs(np.subtract(together.losses, alone.losses)).max() <= losses_bound
        assert max(np.abs(together.weights[name] - alone.weights[name]).max() for name in WEIGHTS) <= weights_bound
    else:
        tolerance = tolerance_for("float32")
        for name in WEIGHTS:
            assert compare_arrays(name, together.weights[name], alone.weights[name], tolerance).passed, name


def test_a_worker_that_dies_stops_the_run_with_a_message_naming_it(framework):
    import multiprocessing
    import os
    import signal
    import threading

    from bert_multi.errors import WorkerFailed

    started, outcome = threading.Event(), []

    def train() -> None:
        arguments = {"config": CONFIG, "weights": WEIGHTS, "data": DATA, "steps": 10_000, "batch_size": 16}
        try:
            framework.train_data_parallel(2, on_step=lambda step, losses: started.set(), **arguments)
        except WorkerFailed as error:
            outcome.append(str(error))

    runner = threading.Thread(target=train)
    runner.start()
    assert started.wait(60), "the workers never took a step"
    os.kill(multiprocessing.active_children()[-1].pid, signal.SIGKILL)
    # A bounded wait: the survivor is stopped, not left blocked in an all-reduce, and MXNet's scheduler and
    # server, which would wait for the workers, with it.
    runner.join(10)
    assert not runner.is_alive()
    assert len(outcome) == 1 and outcome[0].startswith("worker ") and "of 2 died (signal SIGKILL)" in outcome[0]


# A script that starts workers from its top level: spawn runs it again in each worker, where it fails
# before the worker has read what it was sent (here more than a pipe holds).
UNGUARDED_SCRIPT = """
from bert_multi import BERTConfig, init_weights, load_backend
from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=32, seed=0)
config = BERTConfig(len(data.vocab), 16, 24, 2, 2, max_len=32)
weights = init_weights(config, seed=1, dtype="float64")
load_backend({name!r}).module.train_data_parallel(2, config=config, weights=weights, data=data, steps=1, batch_size=16)
"""


def test_workers_started_from_a_scripts_top_level_fail_the_run_and_never_hang_it(framework, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    assert sum(array.nbytes for array in WEIGHTS.values()) > 1 << 16  # more than a pipe holds
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT.format(name=framework.NAME))
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=environment)
    assert done.returncode != 0 and "of 2 died" in done.stderr, done.stderr[-3000:]
    assert "if __name__ == '__main__'" in done.stderr  # multiprocessing's own advice, from the workers


def test_the_command_line_runs_workers_and_says_so(tmp_path, capsys):
    pytest.importorskip("torch")
    from bert_multi.cli import main

    out = tmp_path / "w.npz"
    command = ["pretrain", "--workers", "2", "--threads-per-worker", "1", "--steps", "2", "--batch-size", "8"]
    assert main([*command, "--num-hiddens", "16", "--ffn-num-hiddens", "24", "--max-len", "32", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 workers of 1 thread(s), each on 4 examples" in printed and "step    2/2" in printed and out.exists()
    assert main(["pretrain", "--workers", "2", "--compare"]) == 2
    assert "use it without --compare" in capsys.readouterr().err


def launched_from_outside(framework, tmp_path):
    """The launch lines of docs/pretraining.md, on this machine: torchrun for torch; a scheduler, a server and the
    workers with the DMLC_* variables for MXNet; the processes with the JAX_* variables for JAX. Returns the
    weights worker 0 wrote."""
    import os
    import subprocess
    import sys

    from bert_multi import load_weights
    from bert_multi.training import free_address

    command = ["-m", "bert_multi.cli", "pretrain", "--backend", framework, "--join", "--dtype", "float64"]
    command += ["--optimizer", "sgd", "--steps", "3", "--batch-size", "8", "--num-hiddens", "16"]
    command += ["--ffn-num-hiddens", "24", "--max-len", "32", "--out", str(tmp_path / "joined.npz")]
    if framework == "jax":
        variables = {"JAX_COORDINATOR_ADDRESS": free_address(), "JAX_NUM_PROCESSES": "2"}
        processes = [
            subprocess.Popen(
                [sys.executable, *command],
                env={**os.environ, **variables, "JAX_PROCESS_ID": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for rank in range(2)
        ]
        for process in processes:
            assert process.wait(timeout=180) == 0, process.stderr.read()[-2000:]
    elif framework == "torch":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        finished = subprocess.run([*launcher, *command], capture_output=True, text=True, timeout=180)
        assert finished.returncode == 0, finished.stderr[-2000:]
    else:
        host, port = free_address().split(":")
        dmlc = {"DMLC_PS_ROOT_URI": host, "DMLC_PS_ROOT_PORT": port, "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2"}
        roles = ["scheduler", "server", "worker", "worker"]
        processes = [
            subprocess.Popen(
                [sys.executable, *(command if role == "worker" else ["-c", "import mxnet"])],
                env={**os.environ, **dmlc, "DMLC_ROLE": role, "OMP_NUM_THREADS": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for role in roles
        ]
        for process in processes:
            assert process.wait(timeout=180) == 0, process.stderr.read()[-2000:]
    return load_weights(tmp_path / "joined.npz")[1]


def test_workers_launched_from_outside_train_as_one_process(framework, tmp_path):
    from bert_multi import load_weights
    from bert_multi.cli import main

    joined = launched_from_outside(framework.NAME, tmp_path)
    alone = ["pretrain", "--backend", framework.NAME, "--dtype", "float64", "--optimizer", "sgd", "--steps", "3"]
    alone += ["--batch-size", "8", "--num-hiddens", "16", "--ffn-num-hiddens", "24", "--max-len", "32"]
    assert main([*alone, "--out", str(tmp_path / "alone.npz")]) == 0
    _, expected = load_weights(tmp_path / "alone.npz")
    bound = AGREEMENT[(framework.NAME, "sgd")][0]
    assert max(np.abs(joined[name] - expected[name]).max() for name in expected) <= bound


def test_torch_and_mxnet_workers_agree_as_their_single_processes_do():
    """2 DDP workers against 2 dist_sync workers, from the same weights and batches, with SGD at a learning
    rate float32 holds exactly (MXNet passes it as a C float)."""
    from bert_multi import load_backend
    from bert_multi.backend.registry import not_in_process

    if any(not_in_process(name) for name in ("torch", "mxnet")):
        pytest.skip("needs both frameworks here")
    arguments = {"config": CONFIG, "weights": WEIGHTS, "data": DATA, "steps": 4, "batch_size": 16, "seed": 0}
    arguments.update(dtype="float64", optimizer="sgd", lr=2.0**-4)
    single = {name: run_pretraining(name, **arguments).weights for name in ("torch", "mxnet")}
    workers = {name: load_backend(name).train_data_parallel(2, **arguments).weights for name in ("torch", "mxnet")}

    def gap(runs):
        return max(np.abs(runs["torch"][name] - runs["mxnet"][name]).max() for name in WEIGHTS)

    assert gap(single) <= 1e-10  # measured 3.4e-12
    assert gap(workers) <= gap(single) + AGREEMENT[("mxnet", "sgd")][0]  # measured 3.0e-9: MXNet's float32 sums
