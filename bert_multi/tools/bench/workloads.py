"""What ``bench`` times and how: the workloads (a forward, a training step, the weight file, verify) on
the CPU and on a GPU, each backend's variants and precisions, and the interleaved rounds."""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...backend.registry import LoadedBackend, backends, frameworks, load_backend
from ...errors import CannotRunHere
from ...files.weights import load_weights, save_weights
from ...spec.config import CONFIGS, BERTConfig
from ...spec.schema import SUPPORTED_DTYPES, random_weights
from ...training import PretrainingData, builtin_corpus, paragraphs_from_lines
from .results import COMPILED, Row, against_fastest, backend_of, row_name

# name -> (config, batch size, sequence length): the chapter's shape and BERT-base's; --quick: a tiny one.
SHAPES = {
    "chapter": (CONFIGS["chapter"], 8, 64),
    "base": (CONFIGS["base"], 8, 128),
    "tiny": (CONFIGS["tiny"], 4, 16),
}
# On a GPU: the forward at BERT-base's size on a batch of 64 x 128 tokens, and pretraining steps at d2l's
# set-up (the chapter's model, 512 x 64 tokens) and at BERT-base's (128 x 128); a quick run's, tiny.
GPU_FORWARD = {"full": ("base", CONFIGS["base"], 64, 128), "quick": ("tiny", CONFIGS["tiny"], 4, 16)}
GPU_TRAINING = {
    "full": [("d2l", CONFIGS["chapter"], 512, 64), ("base", CONFIGS["base"], 128, 128)],
    "quick": [("tiny", CONFIGS["tiny"], 8, 16)],
}
# The precisions a GPU offers, as build options: float32 products in full, in TF32, or in bfloat16.
GPU_PRECISIONS: dict[str, dict[str, object]] = {
    "float32": {"tf32": False},
    "tf32": {"tf32": True},
    "bfloat16": {"mixed_precision": "bfloat16"},
}
# A timed model runs many times, so it is built as one: its compiler takes its time to make fast code.
TIMED: dict[str, object] = {"optimize": True}
# NVIDIA's data-sheet peaks, dense (sparsity doubles TF32's and bfloat16's, and no model here is
# sparse), in TFLOP/s by the precision of the products; float64's is the tensor cores'. The first
# fragment found in a GPU's name picks its row.
GPU_PEAKS: list[tuple[str, dict[str, float]]] = [
    ("H200 NVL", {"float64": 60.0, "float32": 60.0, "tf32": 417.5, "bfloat16": 835.5}),
    ("H200", {"float64": 67.0, "float32": 67.0, "tf32": 494.5, "bfloat16": 989.5}),
    ("H100 NVL", {"float64": 60.0, "float32": 60.0, "tf32": 417.5, "bfloat16": 835.5}),
    ("H100 PCIe", {"float64": 51.0, "float32": 51.0, "tf32": 378.0, "bfloat16": 756.5}),
    ("H100", {"float64": 67.0, "float32": 67.0, "tf32": 494.5, "bfloat16": 989.5}),
    ("A100", {"float64": 19.5, "float32": 19.5, "tf32": 156.0, "bfloat16": 312.0}),
]


def gpu_peak(gpu: str, precision: str) -> float | None:
    """The data sheet's dense peak of ``gpu`` (its name) for products in ``precision``, in FLOP/s; None
    for a GPU not in ``GPU_PEAKS``."""
    for fragment, peaks in GPU_PEAKS:
        if fragment in gpu:
            return peaks[precision] * 1e12
    return None


def forward_flops(config: BERTConfig, batch: int, steps: int) -> float:
    """Multiply-adds x 2 of the encoder: the four projections, the scores and their weighted sum, the FFN."""
    H, F, T = config.num_hiddens, config.ffn_num_hiddens, steps
    per_block = 2 * batch * T * (4 * H * H + 2 * H * F) + 4 * batch * T * T * H
    return float(per_block * config.num_blks)


def _best(call: Callable[[], object], repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _no_wait(name: str) -> None:
    return None


def _synchronize(row: str) -> None:
    """Wait for a row's backend's queued work (a compiled variant's is its backend's). MXNet's engine
    returns before the work is done (docs/framework-differences.md, "MXNet returns before the work is
    done"): a training step that is not waited for is timed short, and its backward runs inside the next
    backend's timing."""
    load_backend(backend_of(row)).synchronize()


def _every_round(call: Callable[[], object]) -> Callable[[int], object]:
    """``call`` as a workload of the rounds: the same call in each."""
    return lambda _round: call()


def _train_step(trainer: Any, batches: list[dict[str, np.ndarray]], index: int) -> object:
    """Round ``index``'s training step: its own batch, so that no round repeats another's."""
    return trainer.step(batches[index])


def _interleave(
    calls: Mapping[str, Callable[[int], object]],
    rounds: int,
    label: str,
    progress: Callable[[str], None] | None,
    after: Callable[[str], None] | None = None,
    wait: Callable[[str], None] = _no_wait,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds of ``calls[name](round)`` for rounds 1..``rounds``, every backend in turn each round,
    and apart from them the seconds of each one's first call (round 0: first calls allocate and
    compile). Each timing includes ``wait(name)`` (a backend's queued work); ``after(name)`` runs
    outside the timings. ``progress`` is told ``label`` as the first calls start, then each round's
    ``"{label} round i/n: name"``."""
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


Workload = tuple[str, BERTConfig, int, int]  # (its name, the model, batch size, sequence length)


class DrawnWeights:
    """Random weights for each model and dtype, drawn once in a run and shared by every backend's builds
    (which copy them): drawing BERT-base's takes seconds, and a GPU run builds it a dozen times."""

    def __init__(self) -> None:
        self.drawn: dict[tuple[BERTConfig, str], dict[str, np.ndarray]] = {}

    def __call__(self, config: BERTConfig, dtype: str) -> dict[str, np.ndarray]:
        if (config, dtype) not in self.drawn:
            self.drawn[(config, dtype)] = random_weights(config, seed=0, dtype=dtype)
        return self.drawn[(config, dtype)]


def _here(only: list[str] | None) -> list[LoadedBackend]:
    """Every backend that runs in this environment (or those named in ``only``). A backend run by another
    environment's worker would be timed with its file transfers: it is timed by bench in its own."""
    return [
        load_backend(name)
        for name, status in backends().items()
        if status.available and (only is None or name in only) and load_backend(name).elsewhere is None
    ]


def run_bench(
    shapes: list[str],
    dtypes: list[str],
    rounds: int = 5,
    train: bool = True,
    progress: Callable[[str], None] | None = None,
    files: bool = True,
    device: str = "cpu",
    only: list[str] | None = None,
    compiled: bool = True,
) -> list[Row]:
    """Every backend that runs in this environment (a reference such as transformers on the original BERT
    of the same sizes; or the backends named in ``only``) on each shape and dtype, ``rounds`` interleaved rounds;
    then a pretraining step each, and the weight file saved and loaded at the last shape's size. On a
    ``device`` other than the CPU, the backends that can use it, without the GEMM peak and the file.
    ``compiled``: each backend whose build can compile also runs compiled."""
    available = _here(only)
    drawn = DrawnWeights()
    rows: list[Row] = []
    for shape in shapes:
        for dtype in dtypes:
            workload = (shape, *SHAPES[shape])
            rows += _forward_rows(workload, dtype, rounds, progress, available, device, compiled, drawn)
    if train:
        base, batch, steps = SHAPES[shapes[0]]
        set_up = (shapes[0], base, batch, min(steps, 64))
        names = [b.name for b in available]
        rows += _train_rows(set_up, "float32", rounds, progress, device, names, compiled, drawn)
    if files and device == "cpu":
        rows += _file_rows(shapes[-1], rounds, progress)
    return against_fastest(rows)


def run_gpu_bench(
    device: str,
    only: list[str] | None = None,
    quick: bool = False,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Speed on a GPU, every backend here that can use it side by side in each of ``GPU_PRECISIONS``: the
    forward at BERT-base's size (and compiled, and transformers' fused attention), a training step at
    BERT-base's (and compiled) and pretraining steps at d2l's set-up, with each row's share of the GPU's
    data-sheet peak (MFU). ``quick``: the tiny model, no compiled variants."""
    rows: list[Row] = []
    for _, timed in gpu_workloads(device, only, quick, rounds, progress):
        rows += timed()
    return against_fastest(rows)


def gpu_workloads(
    device: str,
    only: list[str] | None = None,
    quick: bool = False,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[str, Callable[[], list[Row]]]]:
    """``run_gpu_bench``'s workloads in order, each as (what it times, a function timing it): a caller can
    stop between two of them and keep the rows it has."""
    size = "quick" if quick else "full"
    available = _here(only)
    names = [backend.name for backend in available]
    drawn = DrawnWeights()
    workloads: list[tuple[str, Callable[[], list[Row]]]] = []
    forward = GPU_FORWARD[size]
    for precision in GPU_PRECISIONS:
        timed = functools.partial(
            _forward_rows, forward, precision, rounds, progress, available, device, not quick, drawn
        )
        workloads.append((f"forward {forward[0]} {precision}", timed))
    for set_up in GPU_TRAINING[size]:
        compiled = not quick and set_up[0] == "base"  # d2l's set-up is timed as pretrain runs it: eager
        for precision in GPU_PRECISIONS:
            timed = functools.partial(_train_rows, set_up, precision, rounds, progress, device, names, compiled, drawn)
            workloads.append((f"train step {set_up[0]} {precision}", timed))
    return workloads


def _variants(backend: LoadedBackend, compiled: bool) -> dict[str, dict[str, object]]:
    """Each variant of ``backend`` to time, by name ("" for the plain build), with the build options that
    make it: compiled where asked for and its build takes ``compile``, then its ``BENCH_VARIANTS``; all
    ``TIMED``."""
    found: dict[str, dict[str, object]] = {"": {}}
    if compiled and backend.takes("compile"):
        found[COMPILED] = {"compile": True}
    return {variant: TIMED | options for variant, options in (found | backend.bench_variants).items()}


def _on(device: str) -> str:
    """Where a workload runs, in its name: nothing for the CPU, " on cuda:0" for a GPU."""
    return "" if device == "cpu" else f" on {device}"


def _precision_options(precision: str) -> tuple[str, dict[str, object]]:
    """The weights' dtype and the build options of a row's precision: a dtype, or one of ``GPU_PRECISIONS``."""
    return ("float32", GPU_PRECISIONS[precision]) if precision in GPU_PRECISIONS else (precision, {})


def _peak(model: Any, precision: str) -> tuple[float | None, str]:
    """The peak a model's FLOPs are a share of, on a GPU: its data sheet's for ``precision`` (None for a
    GPU not in ``GPU_PEAKS``), and where it comes from."""
    gpu = str(model.runtime_info().get("gpu", ""))
    return gpu_peak(gpu, precision), f"{gpu} data sheet, {precision}"


def _forward_rows(
    workload: Workload,
    precision: str,
    rounds: int,
    progress: Callable[[str], None] | None,
    available: list[LoadedBackend],
    device: str,
    compiled: bool,
    drawn: DrawnWeights,
) -> list[Row]:
    """The forward at one shape and precision (a dtype, or on a GPU one of ``GPU_PRECISIONS``), every
    backend and variant in turn each round; with the share of a same-process GEMM peak on the CPU, of
    the data sheet's on a GPU."""
    shape, base, batch, steps = workload
    dtype, options = _precision_options(precision)
    runners: dict[str, Callable[[], object]] = {}  # by row: "torch", "torch compiled", "transformers sdpa"
    threads: dict[str, object] = {}
    peaks: dict[str, tuple[float | None, str]] = {}
    for backend in available:
        config = computable(backend, base)
        if config is None or backend.supports(config, device) is not None:
            continue
        weights = drawn(config, dtype)
        rng = np.random.default_rng(0)
        inputs = {
            "tokens": rng.integers(0, config.vocab_size, (batch, steps)),
            "segments": rng.integers(0, 2, (batch, steps)),
            "valid_lens": rng.integers(steps // 2, steps + 1, batch),
            "pred_positions": rng.integers(0, steps, (batch, max(1, round(0.15 * steps)))),
        }
        for variant, made_by in _variants(backend, compiled).items():
            try:
                model = backend.build(config, weights, device=device, dtype=dtype, gradients=False,
                                      **options, **made_by)  # fmt: skip
            except CannotRunHere:  # a precision it does not offer (TF32 in MXNet, bfloat16 on XLA's CPU)
                continue
            row = row_name(backend.name, variant)
            threads[row] = model.runtime_info().get("threads")
            if device != "cpu":
                peaks[row] = _peak(model, precision)
            runners[row] = functools.partial(
                model, inputs["tokens"], inputs["segments"], inputs["valid_lens"], inputs["pred_positions"]
            )
    for row in runners:  # building may queue work (MXNet); none may run inside another's timing
        _synchronize(row)
    workload_name = f"forward {shape} {batch}x{steps}" + _on(device)
    # The CPU's peak: the framework's matrix product at the model's widest shape (at least 512 a side, so
    # that a tiny model is not measured against a product too small to reach it).
    m, k, n = max(batch * steps, 512), max(base.num_hiddens, 512), max(base.ffn_num_hiddens, 512)
    named = dict.fromkeys(backend_of(row) for row in runners)
    products = {name: load_backend(name).gemm(dtype, m, k, n) for name in named} if device == "cpu" else {}
    fastest = {name: _best(product, 3) for name, product in products.items()}

    def sample_peak(row: str) -> None:  # in every round too, beside the forward: the best of all is the peak
        name = backend_of(row)
        if name in products:
            fastest[name] = min(fastest[name], _best(products[name], 1))

    calls = {row: _every_round(run) for row, run in runners.items()}
    timings, first = _interleave(calls, rounds, f"{workload_name} {precision}", progress, sample_peak, _synchronize)
    flops = forward_flops(base, batch, steps)
    for row in runners:
        if backend_of(row) in fastest:
            peaks[row] = (2.0 * m * k * n / fastest[backend_of(row)], "same-process GEMM")
    rows = []
    for row in runners:
        peak, source = peaks.get(row, (None, ""))
        rows.append(Row(workload_name, row, precision, timings[row], batch * steps, flops, peak,
                        threads=threads[row], first=first[row], peak_source=source))  # fmt: skip
    return rows


def _file_rows(shape: str, rounds: int, progress: Callable[[str], None] | None) -> list[Row]:
    """The canonical weight file written and read, beside NumPy's own .npz functions on the same arrays.
    save_weights also checks, hashes and fsyncs (a save that returned survives a power loss), so
    np.savez is timed with an fsync too; load_weights checks every header and hash as it reads."""
    config = SHAPES[shape][0]
    weights = random_weights(config, seed=0, dtype="float32")
    nbytes = sum(array.nbytes for array in weights.values())
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        paths = {name: Path(directory) / f"{index}.npz" for index, name in enumerate(("bert_multi", "numpy", "+fsync"))}

        def savez(path: Path, durable: bool) -> None:
            with open(path, "wb") as file:
                np.savez(file, **weights)
                if durable:
                    file.flush()
                    os.fsync(file.fileno())

        saves = {
            "save_weights": lambda _: save_weights(paths["bert_multi"], config, weights),
            "np.savez + fsync": lambda _: savez(paths["+fsync"], durable=True),
            "np.savez": lambda _: savez(paths["numpy"], durable=False),
        }
        loads = {
            "load_weights": lambda _: load_weights(paths["bert_multi"]),
            "np.load": lambda _: [array for array in np.load(paths["numpy"], allow_pickle=False).values()],
        }
        for verb, calls in (("save", saves), ("load", loads)):
            workload = f"{verb} weights {shape}"
            timings, _ = _interleave(calls, rounds, workload, progress)
            rows += [Row(workload, name, "float32", timings[name], 0, 0.0, None, nbytes) for name in calls]
    return rows


def verify_rows(shape: str, rounds: int, progress: Callable[[str], None] | None) -> list[Row]:
    """What ``bert-multi verify`` costs beside a plain forward of the same model: d2l's PyTorch classes
    stand for the user's model (built by a factory, as a user's is), over the conformance cases in float32
    and float64; ``conform`` on the torch backend over the same cases is the engine's own cost."""
    from ...verify.cases import CASES
    from ...verify.conform import run_conformance
    from ...verify.results import Target
    from ...verify.session import verify

    config = SHAPES[shape][0]
    torch_backend = load_backend("torch")
    weights = random_weights(config, seed=0, dtype="float64")
    cases = [case.input(config) for case in CASES]

    def factory(config: BERTConfig) -> Any:
        return torch_backend.BERTModel(*config.d2l_args(), semantics=config.semantics)

    def plain() -> None:  # one model per dtype, every case
        for dtype in SUPPORTED_DTYPES:
            model = torch_backend.build(config, weights, dtype=dtype, gradients=False)
            for case in cases:
                batch = case.batch
                model(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])

    targets = [Target("torch", dtype) for dtype in SUPPORTED_DTYPES]
    calls = {
        "plain forward (torch)": _every_round(plain),
        "conform --no-pairs (torch)": _every_round(lambda: run_conformance(config, weights, targets, cases, False)),
        "verify": _every_round(lambda: verify(factory, config, weights=weights)),
        "verify --gradients": _every_round(lambda: verify(factory, config, weights=weights, gradients=True)),
    }
    workload = f"verify {shape}, {len(cases)} cases, float32+float64"
    timings, _ = _interleave(calls, rounds, workload, progress)
    threads = torch_backend.build(config, weights, gradients=False).runtime_info().get("threads")
    return [Row(workload, name, "both", timings[name], 0, 0.0, None, threads=threads) for name in calls]


def _train_rows(
    set_up: Workload,
    precision: str,
    rounds: int,
    progress: Callable[[str], None] | None,
    device: str,
    only: list[str] | None,
    compiled: bool,
    drawn: DrawnWeights,
) -> list[Row]:
    """One pretraining step (forward, both losses, backward, Adam) per framework (of ``only``) and
    compiled variant on ``device``, on float32 weights with products in ``precision``; on a GPU with
    the share of the data sheet's peak that three forwards' FLOPs reach (a backward is about two)."""
    name, base, batch, max_len = set_up
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=max_len)
    config = dataclasses.replace(base, vocab_size=len(data.vocab), max_len=data.max_len)
    _, options = _precision_options(precision)
    weights = drawn(config, "float32")
    trainers, threads, peaks = {}, {}, {}
    status = backends()
    for framework in frameworks():
        if status[framework].available and load_backend(framework).can_train and (only is None or framework in only):
            backend = load_backend(framework)
            for variant, made_by in _variants(backend, compiled).items():
                try:
                    model = backend.build(config, weights, device=device, dtype="float32", **options, **made_by)
                except CannotRunHere:  # a precision it does not offer
                    continue
                row = row_name(framework, variant)
                trainers[row], threads[row] = backend.trainer(model), model.runtime_info().get("threads")
                if device != "cpu":
                    peaks[row] = _peak(model, precision)
    stream = data.batches(batch, seed=0)
    batches = [next(stream) for _ in range(rounds + 1)]
    workload = f"train step {name} {batch}x{data.max_len}" + _on(device)
    calls = {row: functools.partial(_train_step, trainer, batches) for row, trainer in trainers.items()}
    timings, first = _interleave(calls, rounds, f"{workload} {precision}", progress, wait=_synchronize)
    tokens = batch * data.max_len
    flops = 3 * forward_flops(config, batch, data.max_len) if device != "cpu" else 0.0
    rows = []
    for row in trainers:
        peak, source = peaks.get(row, (None, ""))
        rows.append(Row(workload, row, precision, timings[row], tokens, flops, peak,
                        threads=threads[row], first=first[row], peak_source=source))  # fmt: skip
    return rows


def computable(backend: LoadedBackend, config: BERTConfig, device: str = "cpu") -> BERTConfig | None:
    """``config``, or for a backend that computes only the original BERT (a reference) the original BERT
    of its sizes; None if it computes neither on ``device``."""
    for candidate in (config, config.with_semantics("bert")):
        if backend.supports(candidate, device) is None:
            return candidate
    return None
