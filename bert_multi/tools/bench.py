"""``bert-multi bench``: every installed backend side by side, in one process, in interleaved rounds.

Each workload (a forward at a shape and dtype, or a pretraining step) runs once per round on every
backend in turn, so a machine that slows down mid-run slows every backend alike; a backend whose build
can compile (``compile=True``: PyTorch's ``torch.compile``, Gluon's hybridize) runs compiled as well, its
compiling timed apart as its first call. Reported per row: median, min and max seconds, tokens per
second, the time against the fastest framework's on the same workload (the limit this machine shows;
the oracle and references are shown against it but are not candidates), and the share of a
same-process GEMM peak (the framework's own dense-layer product at the model's widest shape, at least
512 a side, best of every round) that the forward's FLOPs reach. Speed is shown here, never asserted
by a test.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.registry import LoadedBackend, backends, frameworks, label_of, load_backend
from ..errors import CannotRunHere
from ..files.weights import load_weights, save_weights
from ..spec.config import CONFIGS, BERTConfig
from ..spec.schema import SUPPORTED_DTYPES, random_weights
from ..training import PretrainingData, builtin_corpus, paragraphs_from_lines

# name -> (config, batch size, sequence length): the chapter's shape and BERT-base's; --quick: a tiny one.
SHAPES = {
    "chapter": (CONFIGS["chapter"], 8, 64),
    "base": (CONFIGS["base"], 8, 128),
    "tiny": (CONFIGS["tiny"], 4, 16),
}
# The goal every framework's best variant is held to: within this factor of the fastest framework's time.
GOAL = 1.15
COMPILED = " compiled"  # a row's backend, compiled: "torch compiled"


def row_name(backend: str, compiled: bool) -> str:
    """A row's name for ``backend``, plain or compiled: "torch", "torch compiled"."""
    return backend + (COMPILED if compiled else "")


def backend_of(row: str) -> str:
    """The backend a row's name times: "torch" for "torch compiled"."""
    return row.removesuffix(COMPILED)


@dataclass
class Row:
    workload: str  # "forward chapter 8x64" or "train step ..."
    backend: str
    dtype: str
    seconds: list[float]
    tokens: int
    flops: float
    gemm_flops_per_second: float | None
    nbytes: int = 0  # bytes a weight-file workload writes or reads
    threads: object = None  # the backend's threads, as its runtime_info reports them
    first: float | None = None  # seconds of the first call, apart from the rounds: where JAX compiles
    against_fastest: float | None = None  # median / the fastest framework's median on this workload and dtype

    @property
    def framework(self) -> str:
        """The backend's name, without the variant."""
        return backend_of(self.backend)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def to_json(self) -> dict[str, object]:
        return {
            "workload": self.workload,
            "backend": self.backend,
            "dtype": self.dtype,
            "seconds": self.seconds,
            "first_s": self.first,
            "median_s": self.median,
            "min_s": min(self.seconds),
            "max_s": max(self.seconds),
            "tokens_per_s": self.tokens / self.median if self.tokens else None,
            "megabytes_per_s": self.nbytes / 1e6 / self.median if self.nbytes else None,
            "gemm_peak_share": self.share,
            "threads": self.threads,
            "against_fastest": self.against_fastest,
        }

    @property
    def share(self) -> float | None:
        if not self.gemm_flops_per_second or not self.flops:
            return None
        return self.flops / self.median / self.gemm_flops_per_second


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
    outside the timings."""
    timings: dict[str, list[float]] = {name: [] for name in calls}
    first: dict[str, float] = {}
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
    # A backend run by another environment's worker would be timed with its file transfers: it is timed
    # by bench in its own environment.
    available = [
        load_backend(name)
        for name, status in backends().items()
        if status.available and (only is None or name in only) and load_backend(name).elsewhere is None
    ]
    rows: list[Row] = []
    for shape in shapes:
        for dtype in dtypes:
            rows += _forward_rows(shape, dtype, rounds, progress, available, device, compiled)
    if train:
        rows += _train_rows(shapes[0], rounds, progress, device, [backend.name for backend in available], compiled)
    if files and device == "cpu":
        rows += _file_rows(shapes[-1], rounds, progress)
    return against_fastest(rows)


def against_fastest(rows: list[Row]) -> list[Row]:
    """``rows``, each model workload's with its time against the fastest framework's on that workload and
    dtype (the oracle's and references' too, though they are never the fastest)."""
    fastest: dict[tuple[str, str], float] = {}
    for row in rows:
        if row.tokens and row.framework in frameworks():
            key = (row.workload, row.dtype)
            fastest[key] = min(fastest.get(key, row.median), row.median)
    for row in rows:
        if row.tokens and (row.workload, row.dtype) in fastest:
            row.against_fastest = row.median / fastest[(row.workload, row.dtype)]
    return rows


def goal_verdict(rows: list[Row]) -> str:
    """One sentence: whether every framework's best variant is within ``GOAL`` of the fastest framework on
    every workload timed, and if not where not."""
    best: dict[tuple[str, str, str], float] = {}  # (workload, dtype, framework) -> its best variant's ratio
    for row in rows:
        if row.against_fastest is not None and row.framework in frameworks():
            key = (row.workload, row.dtype, row.framework)
            best[key] = min(best.get(key, row.against_fastest), row.against_fastest)
    if not best:
        return "No framework was timed on a model workload, so nothing is compared with the fastest."
    behind = [(key, ratio) for key, ratio in best.items() if ratio > GOAL]
    workloads = len({key[:2] for key in best})
    if not behind:
        scope = "the one workload timed" if workloads == 1 else f"all {workloads} workloads timed"
        return f"Every framework's best variant is within {GOAL}x of the fastest framework on {scope}."
    listed = "; ".join(
        f"{label_of(framework)} {ratio:.2f}x on {workload} {dtype}" for (workload, dtype, framework), ratio in behind
    )
    return f"Not every framework's best variant is within {GOAL}x of the fastest framework: {listed}."


def _variants(backend: LoadedBackend, compiled: bool) -> tuple[bool, ...]:
    """Whether to build it plain, or compiled too (asked for, and its build takes ``compile``)."""
    return (False, True) if compiled and backend.takes("compile") else (False,)


def _forward_rows(
    shape: str,
    dtype: str,
    rounds: int,
    progress: Callable[[str], None] | None,
    available: list[LoadedBackend],
    device: str,
    compiled: bool = True,
) -> list[Row]:
    """The forward at one shape and dtype, every backend (and compiled variant) in turn each round; with
    the share of the GEMM peak on the CPU."""
    base, batch, steps = SHAPES[shape]
    runners: dict[str, Callable[[], object]] = {}  # by row: the backend's name, " compiled" for the variant
    threads: dict[str, object] = {}
    for backend in available:
        config = computable(backend, base)
        if config is None or backend.supports(config, device) is not None:
            continue
        weights = random_weights(config, seed=0, dtype=dtype)
        rng = np.random.default_rng(0)
        inputs = {
            "tokens": rng.integers(0, config.vocab_size, (batch, steps)),
            "segments": rng.integers(0, 2, (batch, steps)),
            "valid_lens": rng.integers(steps // 2, steps + 1, batch),
            "pred_positions": rng.integers(0, steps, (batch, max(1, round(0.15 * steps)))),
        }
        for variant in _variants(backend, compiled):
            try:
                model = backend.build(config, weights, device=device, dtype=dtype, gradients=False, compile=variant)
            except CannotRunHere:
                continue
            row = row_name(backend.name, variant)
            threads[row] = model.runtime_info().get("threads")
            runners[row] = functools.partial(
                model, inputs["tokens"], inputs["segments"], inputs["valid_lens"], inputs["pred_positions"]
            )
    for row in runners:  # building may queue work (MXNet); none may run inside another's timing
        _synchronize(row)
    workload = f"forward {shape} {batch}x{steps}"
    # The peak: the framework's matrix product at the model's widest shape (at least 512 a side, so that a
    # tiny model is not measured against a product too small to reach it), on the CPU.
    m, k, n = max(batch * steps, 512), max(base.num_hiddens, 512), max(base.ffn_num_hiddens, 512)
    named = dict.fromkeys(backend_of(row) for row in runners)
    products = {name: load_backend(name).gemm(dtype, m, k, n) for name in named} if device == "cpu" else {}
    fastest = {name: _best(product, 3) for name, product in products.items()}

    def sample_peak(row: str) -> None:  # in every round too, beside the forward: the best of all is the peak
        name = backend_of(row)
        if name in products:
            fastest[name] = min(fastest[name], _best(products[name], 1))

    calls = {row: _every_round(run) for row, run in runners.items()}
    timings, first = _interleave(calls, rounds, f"{workload} {dtype}", progress, sample_peak, _synchronize)
    flops = forward_flops(base, batch, steps)
    peak = {row: 2.0 * m * k * n / fastest[backend_of(row)] for row in runners if backend_of(row) in fastest}
    return [
        Row(
            workload,
            row,
            dtype,
            timings[row],
            batch * steps,
            flops,
            peak.get(row),
            threads=threads[row],
            first=first[row],
        )  # fmt: skip
        for row in runners
    ]


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
    from ..verify.cases import CASES
    from ..verify.conform import run_conformance
    from ..verify.results import Target
    from ..verify.session import verify

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
    shape: str,
    rounds: int,
    progress: Callable[[str], None] | None,
    device: str = "cpu",
    only: list[str] | None = None,
    compiled: bool = True,
) -> list[Row]:
    """One pretraining step (forward, both losses, backward, Adam) per framework (of ``only``) and
    compiled variant on ``device``, float32."""
    base, batch, steps = SHAPES[shape]
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=min(steps, 64))
    config = dataclasses.replace(base, vocab_size=len(data.vocab), max_len=data.max_len)
    weights = random_weights(config, seed=0, dtype="float32")
    trainers, threads = {}, {}
    status = backends()
    for name in frameworks():
        if status[name].available and load_backend(name).can_train and (only is None or name in only):
            backend = load_backend(name)
            for variant in _variants(backend, compiled):
                try:
                    model = backend.build(config, weights, device=device, dtype="float32", compile=variant)
                except CannotRunHere:
                    continue
                row = row_name(name, variant)
                trainers[row], threads[row] = backend.trainer(model), model.runtime_info().get("threads")
    stream = data.batches(batch, seed=0)
    batches = [next(stream) for _ in range(rounds + 1)]
    workload = f"train step {shape} {batch}x{data.max_len}"
    calls = {name: functools.partial(_train_step, trainer, batches) for name, trainer in trainers.items()}
    timings, first = _interleave(calls, rounds, workload, progress, wait=_synchronize)
    tokens = batch * data.max_len
    return [
        Row(workload, name, "float32", timings[name], tokens, 0.0, None, threads=threads[name], first=first[name])
        for name in trainers
    ]


def computable(backend: LoadedBackend, config: BERTConfig, device: str = "cpu") -> BERTConfig | None:
    """``config``, or for a backend that computes only the original BERT (a reference) the original BERT
    of its sizes; None if it computes neither on ``device``."""
    for candidate in (config, config.with_semantics("bert")):
        if backend.supports(candidate, device) is None:
            return candidate
    return None


def format_rows(rows: list[Row]) -> str:
    """The table ``bert-multi bench`` prints."""
    from ..display import format_table

    def share(row: Row) -> str:
        return "-" if row.share is None else f"{100 * row.share:.0f}%"

    def rate(row: Row) -> str:
        if row.nbytes:
            return f"{row.nbytes / 1e6 / row.median:,.0f} MB/s"
        return f"{row.tokens / row.median:,.0f}" if row.tokens else "-"

    body = [
        [
            row.workload,
            row.backend,
            row.dtype,
            f"{1000 * row.median:.1f}",
            f"{1000 * min(row.seconds):.1f}",
            f"{1000 * max(row.seconds):.1f}",
            "-" if row.first is None else f"{1000 * row.first:.0f}",
            "-" if row.against_fastest is None else f"{row.against_fastest:.2f}x",
            rate(row),
            share(row),
        ]  # fmt: skip
        for row in rows
    ]
    header = ["workload", "backend", "dtype", "median ms", "min ms", "max ms", "first call ms", "vs fastest"]
    header += ["tokens/s (MB/s)", "of GEMM peak"]
    return format_table(header, body)


def plot_rows(rows: list[Row], path: str) -> str:
    """A bar chart of each model workload's rows against its fastest framework (1 is the fastest; the
    goal, ``GOAL``, drawn as a line), each bar labelled with its ratio and median time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in rows if row.against_fastest is not None]
    labels = [f"{row.workload} {row.dtype}  {row.backend}" for row in rows]
    ratios = [row.against_fastest or 0.0 for row in rows]
    colours = ["tab:blue" if row.framework in frameworks() else "tab:gray" for row in rows]
    figure, axes = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.2))
    axes.barh(range(len(rows)), ratios, color=colours)
    for index, (row, ratio) in enumerate(zip(rows, ratios)):
        axes.text(ratio, index, f" {ratio:.2f}x  {1000 * row.median:,.0f} ms", va="center", fontsize=6)
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.axvline(GOAL, color="tab:red", linestyle="--", linewidth=0.8, label=f"goal: within {GOAL}x")
    axes.set_yticks(range(len(rows)), labels, fontsize=6)
    axes.invert_yaxis()
    axes.set_xlabel("median time against the fastest framework's on the workload (grey: not a framework)", fontsize=8)
    axes.legend(loc="lower right", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
