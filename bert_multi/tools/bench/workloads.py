"""What ``bench`` times of the models, the same way on every device: the forward at each shape and
precision, and a pretraining step, every backend here and its variants side by side, each row with its
share of a peak.

A forward row times the model on its device: the inputs moved there once, the outputs left there, the
call returning once they are computed (``BackendModel.on_device``); the common interface's call, NumPy in
and out, is a row of its own (``ROUND_TRIP``). A model is built once per shape and reused for every
precision its framework applies at call time (``BackendModel.at_precision``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ...backend.contract import BackendModel, parse_device
from ...backend.registry import LoadedBackend, backends, load_backend
from ...errors import CannotRunHere
from ...spec.config import CONFIGS, BERTConfig
from ...spec.inputs import check_inputs
from ...spec.schema import SUPPORTED_DTYPES, random_weights
from ...training import PretrainingData, builtin_corpus, paragraphs_from_lines
from .results import COMPILED, Row, row_name
from .rounds import Progress, best_of, every_round, interleave

# Each shape's model, and by device kind the (batch, length) of its forward and of its pretraining step:
# a GPU needs larger batches to be busy (BERT-base's forward on 64 x 128 tokens and its step on 128 x 128;
# the chapter's model on 512 x 64, d2l's pretraining set-up, as ``pretrain`` runs it).
SHAPES: dict[str, tuple[BERTConfig, dict[str, tuple[tuple[int, int], tuple[int, int]]]]] = {
    "chapter": (CONFIGS["chapter"], {"cpu": ((8, 64), (8, 64)), "gpu": ((512, 64), (512, 64))}),
    "base": (CONFIGS["base"], {"cpu": ((8, 128), (8, 64)), "gpu": ((64, 128), (128, 128))}),
    "tiny": (CONFIGS["tiny"], {"cpu": ((4, 16), (4, 16)), "gpu": ((4, 16), (8, 16))}),
}
DEFAULT_SHAPES = {"cpu": ["chapter"], "gpu": ["base", "chapter"]}
QUICK_SHAPES = ["tiny"]
# The precisions a GPU offers, as build options: float32 products in full, in TF32, or in bfloat16. On the
# CPU the precisions are the dtypes.
GPU_PRECISIONS: dict[str, dict[str, object]] = {
    "float32": {"tf32": False},
    "tf32": {"tf32": True},
    "bfloat16": {"mixed_precision": "bfloat16"},
}
# A timed model runs many times, so it is built as one: its compiler takes its time to make fast code.
TIMED: dict[str, object] = {"optimize": True}
ROUND_TRIP = "(NumPy round trip)"  # the row of the common interface's call, beside its model's own row
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

Workload = tuple[str, BERTConfig, int, int]  # (its shape's name, the model, batch size, sequence length)
Finished = Callable[[list[Row]], None]  # told each workload's rows as it ends


def gpu_peak(gpu: str, precision: str) -> float | None:
    """The data sheet's dense peak of ``gpu`` (its name) for products in ``precision``, in FLOP/s; None
    for a GPU not in ``GPU_PEAKS``."""
    for fragment, peaks in GPU_PEAKS:
        if fragment in gpu:
            return peaks[precision] * 1e12
    return None


def forward_flops(config: BERTConfig, batch: int, steps: int, predictions: int = 0) -> float:
    """Multiply-adds x 2 of a forward: in each block the four projections, the scores and their weighted
    sum and the FFN; the pooler and the NSP classifier on each <cls>; the MLM head (its dense layer and
    the vocabulary's) on ``predictions`` positions of each sequence. The heads count where the model has them."""
    H, F, T, V = config.num_hiddens, config.ffn_num_hiddens, steps, config.vocab_size
    per_block = 2 * batch * T * (4 * H * H + 2 * H * F) + 4 * batch * T * T * H
    heads = 2 * batch * H * H if "pooler" in config.heads else 0
    heads += 2 * batch * 2 * H if "nsp" in config.heads else 0
    heads += 2 * batch * predictions * (H * H + H * V) if "mlm" in config.heads else 0
    return float(per_block * config.num_blks + heads)


class DrawnWeights:
    """Random weights for each model and dtype, drawn once in a run and shared by every backend's builds
    (which copy them): drawing BERT-base's takes seconds."""

    def __init__(self) -> None:
        self.drawn: dict[tuple[BERTConfig, str], dict[str, np.ndarray]] = {}

    def __call__(self, config: BERTConfig, dtype: str) -> dict[str, np.ndarray]:
        if (config, dtype) not in self.drawn:
            self.drawn[(config, dtype)] = random_weights(config, seed=0, dtype=dtype)
        return self.drawn[(config, dtype)]


class Models:
    """What a run times on: the backends of this environment that it asked for, its device, the weights
    drawn once, and each backend's model of the shape being timed, built once for every precision its
    framework applies at call time; dropped when the next shape begins."""

    def __init__(self, device: str, only: list[str] | None) -> None:
        self.device, self.kind = device, parse_device(device).kind
        # A backend run by another environment's worker would be timed with its file transfers: it is
        # timed by bench in its own environment.
        self.available = [
            load_backend(name)
            for name, status in backends().items()
            if status.available and (only is None or name in only) and load_backend(name).elsewhere is None
        ]
        self.drawn = DrawnWeights()
        self.shape: str | None = None
        self.built: dict[tuple[str, str, str], BackendModel] = {}

    def model(
        self, shape: str, backend: LoadedBackend, config: BERTConfig, variant: str, dtype: str, options: dict[str, Any]
    ) -> BackendModel | None:
        """``backend``'s model of ``variant`` (``variants``) at ``dtype``, its products as ``options`` ask
        (one of ``GPU_PRECISIONS``); None where it cannot compute so here."""
        if shape != self.shape:
            self.shape, self.built = shape, {}
        made_by = variants(backend, self.device, True)[variant]
        key = (backend.name, variant, dtype)
        try:
            if key not in self.built:
                weights = self.drawn(config, dtype)
                self.built[key] = backend.build(config, weights, self.device, dtype, gradients=False, **made_by)
            built = self.built[key]
            if not options:
                return built
            return built.at_precision(**options) or backend.build(
                config, self.drawn(config, dtype), self.device, dtype, gradients=False, **made_by, **options
            )
        except CannotRunHere:  # a precision it does not offer (TF32 in MXNet, bfloat16 on XLA's CPU)
            return None


def variants(backend: LoadedBackend, device: str, compiled: bool) -> dict[str, dict[str, object]]:
    """Each variant of ``backend`` to time on ``device``, by name ("" for the plain build; on a GPU "sdpa"
    for one whose attention is fused, as ``pretrain`` builds it there: ``LoadedBackend.fused_on``), with the
    build options that make it: the plain one, compiled where asked for and its build takes ``compile``,
    then its ``BENCH_VARIANTS`` that differ from those; all ``TIMED``."""
    plain = backend.fused_on(device)
    name = "sdpa" if plain else ""
    found: dict[str, dict[str, object]] = {name: plain}
    if compiled and backend.takes("compile"):
        found[f"{name} {COMPILED}".strip()] = plain | {"compile": True}
    for variant, options in backend.bench_variants.items():
        if plain | options not in found.values():
            found[variant] = plain | options
    return {variant: TIMED | options for variant, options in found.items()}


def precision_options(precision: str) -> tuple[str, dict[str, object]]:
    """The weights' dtype and the build options of a row's precision: a dtype, or one of ``GPU_PRECISIONS``."""
    return ("float32", GPU_PRECISIONS[precision]) if precision in GPU_PRECISIONS else (precision, {})


def _peak(model: BackendModel, precision: str) -> tuple[float | None, str]:
    """The peak a model's FLOPs are a share of, on a GPU: its data sheet's for ``precision`` (None for a
    GPU not in ``GPU_PEAKS``), and where it comes from."""
    gpu = str(model.runtime_info().get("gpu", ""))
    return gpu_peak(gpu, precision), f"{gpu} data sheet, {precision}"


def _inputs(config: BERTConfig, batch: int, steps: int) -> dict[str, np.ndarray]:
    """A forward's inputs, the same for every backend: valid lengths from half the sequence to all of it,
    and 15% of the positions predicted, as pretraining does."""
    rng = np.random.default_rng(0)
    return {
        "tokens": rng.integers(0, config.vocab_size, (batch, steps)),
        "segments": rng.integers(0, 2, (batch, steps)),
        "valid_lens": rng.integers(steps // 2, steps + 1, batch),
        "pred_positions": rng.integers(0, steps, (batch, max(1, round(0.15 * steps)))),
    }


def forward_rows(models: Models, workload: Workload, precision: str, rounds: int, progress: Progress | None,
                 compiled: bool, round_trip: bool = True) -> list[Row]:  # fmt: skip
    """The forward at one shape and precision, every backend and variant in turn each round, and with
    ``round_trip`` each plain build's NumPy round trip; with the share of a same-process GEMM peak on the
    CPU, of the data sheet's on a GPU."""
    shape, base, batch, steps = workload
    dtype, options = precision_options(precision)
    calls: dict[str, Callable[[int], object]] = {}
    about: dict[str, tuple[object, float, tuple[float | None, str]]] = {}  # row -> threads, FLOPs, peak
    for backend in models.available:
        config = computable(backend, base, models.device)
        if config is None:
            continue
        inputs = _inputs(config, batch, steps)
        flops = forward_flops(config, batch, steps, inputs["pred_positions"].shape[1])
        for number, variant in enumerate(variants(backend, models.device, compiled)):
            model = models.model(shape, backend, config, variant, dtype, options)
            if model is None:
                continue
            row = row_name(backend.name, variant)
            interface = functools.partial(
                model, inputs["tokens"], inputs["segments"], inputs["valid_lens"], inputs["pred_positions"]
            )
            on_device = model.on_device(check_inputs(config, **inputs))
            timed = {row: on_device or interface}
            if on_device is not None and number == 0 and round_trip:
                timed[f"{row} {ROUND_TRIP}"] = interface
            data_sheet = _peak(model, precision) if models.kind == "gpu" else (None, "")
            for name, call in timed.items():
                calls[name] = every_round(call)
                about[name] = (model.runtime_info().get("threads"), flops, data_sheet)
        backend.synchronize()  # building may queue work (MXNet); none may run inside another's timing
    workload_name = f"forward {shape} {batch}x{steps}" + ("" if models.kind == "cpu" else f" on {models.device}")
    sample = _cpu_peak(calls, models, base, batch, steps, dtype)
    timings, first = interleave(calls, rounds, f"{workload_name} {precision}", progress, sample)
    rows = []
    for name, (threads, flops, (peak, source)) in about.items():
        if models.kind == "cpu":
            peak, source = sample.peak(name), "same-process GEMM"
        rows.append(Row(workload_name, name, precision, timings[name], batch * steps, flops, peak,
                        threads=threads, first=first[name], peak_source=source))  # fmt: skip
    return rows


class _CpuPeak:
    """The CPU's peak: each framework's matrix product at the model's widest shape (at least 512 a side, so
    that a tiny model is not measured against a product too small to reach it), the best of every round,
    sampled beside the forward (called after each row's timing)."""

    def __init__(self, products: dict[str, Callable[[], object]], m: int, k: int, n: int) -> None:
        self.products, self.flops = products, 2.0 * m * k * n
        self.fastest = {name: best_of(product, 3) for name, product in products.items()}

    def __call__(self, row: str) -> None:
        name = row.split(" ", 1)[0]
        if name in self.products:
            self.fastest[name] = min(self.fastest[name], best_of(self.products[name], 1))

    def peak(self, row: str) -> float | None:
        name = row.split(" ", 1)[0]
        return self.flops / self.fastest[name] if name in self.fastest else None


def _cpu_peak(calls: dict[str, Any], models: Models, base: BERTConfig, batch: int, steps: int, dtype: str) -> _CpuPeak:
    m, k, n = max(batch * steps, 512), max(base.num_hiddens, 512), max(base.ffn_num_hiddens, 512)
    named = dict.fromkeys(row.split(" ", 1)[0] for row in calls) if models.kind == "cpu" else {}
    return _CpuPeak({name: load_backend(name).gemm(dtype, m, k, n) for name in named}, m, k, n)


@functools.cache
def _pretraining_data(max_len: int) -> PretrainingData:
    return PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=max_len)


def train_rows(models: Models, set_up: Workload, precision: str, rounds: int, progress: Progress | None,
               compiled: bool) -> list[Row]:  # fmt: skip
    """One pretraining step (forward, both losses, backward, Adam) per framework and variant, on weights
    of the precision's dtype, its products in ``precision``, each round on a batch of its own; on a GPU
    with the share of the data sheet's peak that three forwards' FLOPs reach (a backward is about two)."""
    shape, base, batch, max_len = set_up
    data = _pretraining_data(max_len)
    config = dataclasses.replace(base, vocab_size=len(data.vocab), max_len=data.max_len)
    dtype, options = precision_options(precision)
    trainers, about = {}, {}
    for backend in models.available:
        if backend.role != "framework" or not backend.can_train:
            continue
        for variant, made_by in variants(backend, models.device, compiled).items():
            try:
                model = backend.build(config, models.drawn(config, dtype), models.device, dtype, **made_by, **options)
            except CannotRunHere:  # a precision it does not offer
                continue
            row = row_name(backend.name, variant)
            trainers[row] = backend.trainer(model)
            about[row] = model.runtime_info().get("threads"), _peak(model, precision)
    stream = data.batches(batch, seed=0)
    batches = [next(stream) for _ in range(rounds + 1)]
    workload = f"train step {shape} {batch}x{data.max_len}" + ("" if models.kind == "cpu" else f" on {models.device}")
    calls = {row: functools.partial(_step, trainer, batches) for row, trainer in trainers.items()}
    timings, first = interleave(calls, rounds, f"{workload} {precision}", progress, wait=_synchronize)
    slots = batches[0]["pred_positions"].shape[1]
    flops = 3 * forward_flops(config, batch, data.max_len, slots) if models.kind == "gpu" else 0.0
    rows = []
    for row, (threads, (peak, source)) in about.items():
        rows.append(Row(workload, row, precision, timings[row], batch * data.max_len, flops,
                        peak if flops else None, threads=threads, first=first[row], peak_source=source))  # fmt: skip
    return rows


def _step(trainer: Any, batches: list[dict[str, np.ndarray]], index: int) -> object:
    """Round ``index``'s training step: its own batch, so that no round repeats another's."""
    return trainer.step(batches[index])


def _synchronize(row: str) -> None:
    """Wait for a row's backend's queued work: a step's update is queued after its loss is read (on a GPU,
    and by MXNet's engine, which returns before the work is done: docs/framework-differences.md). A step
    not waited for is timed short, and its work runs inside the next one's timing."""
    load_backend(row.split(" ", 1)[0]).synchronize()


def workloads(
    device: str = "cpu",
    shapes: list[str] | None = None,
    precisions: list[str] | None = None,
    rounds: int = 5,
    train: bool = True,
    only: list[str] | None = None,
    compiled: bool = True,
    progress: Progress | None = None,
) -> list[tuple[str, Callable[[], list[Row]]]]:
    """What a run times on ``device``, in order, each as (what it times, a function timing it), so that a
    caller can stop between two and keep the rows it has: for each of ``shapes`` (default
    ``DEFAULT_SHAPES``), the forward in each of ``precisions`` (the dtypes on the CPU, ``GPU_PRECISIONS``
    on a GPU), the NumPy round trip beside the first; then, with ``train``, a pretraining step at each.
    Every backend of this environment that can (those named in ``only``), and with ``compiled`` each
    one's compiled variant."""
    kind = parse_device(device).kind
    shapes = shapes or DEFAULT_SHAPES[kind]
    precisions = precisions or (list(SUPPORTED_DTYPES) if kind == "cpu" else list(GPU_PRECISIONS))
    models = Models(device, only)
    found: list[tuple[str, Callable[[], list[Row]]]] = []
    for what, timing, train_size in (("forward", forward_rows, False), ("train step", train_rows, True)):
        if what == "train step" and not train:
            continue
        for shape in shapes:
            config, sizes = SHAPES[shape]
            batch, steps = sizes[kind][train_size]
            for precision in precisions:
                timed = functools.partial(timing, models, (shape, config, batch, steps), precision, rounds, progress,
                                          compiled)  # fmt: skip
                if timing is forward_rows:
                    timed = functools.partial(timed, round_trip=precision == precisions[0])
                found.append((f"{what} {shape} {precision}", timed))
    return found


def computable(backend: LoadedBackend, config: BERTConfig, device: str = "cpu") -> BERTConfig | None:
    """``config``, or for a backend that computes only the original BERT (a reference) the original BERT
    of its sizes; None if it computes neither on ``device``."""
    for candidate in (config, config.with_semantics("bert")):
        if backend.supports(candidate, device) is None:
            return candidate
    return None
