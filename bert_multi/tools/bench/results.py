"""What ``bench`` measured, as rows, and how it is shown: each row against the fastest framework, the
goal's verdict, the table and the chart."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ...backend.registry import frameworks, label_of
from ...engine.report import save_figure

# The goal every framework's best variant is held to: within this factor of the fastest framework's time.
GOAL = 1.15
COMPILED = "compiled"  # a compiled variant's name: the row "torch compiled"


def row_name(backend: str, variant: str = "") -> str:
    """A row's name for ``backend`` and one of its variants: "torch", "torch compiled", "transformers sdpa"."""
    return f"{backend} {variant}" if variant else backend


def backend_of(row: str) -> str:
    """The backend a row's name times: "torch" for "torch compiled" (backend names have no spaces)."""
    return row.split(" ", 1)[0]


@dataclass
class Row:
    workload: str  # "forward chapter 8x64" or "train step ..."
    backend: str
    dtype: str
    seconds: list[float]
    tokens: int
    flops: float
    peak_flops_per_second: float | None  # what the row's FLOPs are a share of
    nbytes: int = 0  # bytes a weight-file workload writes or reads
    threads: object = None  # the backend's threads, as its runtime_info reports them
    first: float | None = None  # seconds of the first call, apart from the rounds: where JAX compiles
    against_fastest: float | None = None  # median / the fastest framework's median on this workload and dtype
    peak_source: str = "same-process GEMM"  # where the peak comes from

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
            "peak_share": self.share,
            "peak_source": self.peak_source if self.share is not None else None,
            "threads": self.threads,
            "against_fastest": self.against_fastest,
        }

    @property
    def share(self) -> float | None:
        if not self.peak_flops_per_second or not self.flops:
            return None
        return self.flops / self.median / self.peak_flops_per_second


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


def describe_row(row: Row) -> str:
    """One row as a line: "forward base 64x128 on cuda:0 tf32, torch sdpa: 9.6 ms (855,000 tokens/s, 41% of
    the peak)"."""
    rate = ""
    if row.nbytes:
        rate = f" ({row.nbytes / 1e6 / row.median:,.0f} MB/s)"
    elif row.tokens:
        share = "" if row.share is None else f", {100 * row.share:.0f}% of the peak"
        rate = f" ({row.tokens / row.median:,.0f} tokens/s{share})"
    return f"{row.workload} {row.dtype}, {row.backend}: {1000 * row.median:.1f} ms{rate}"


def format_rows(rows: list[Row]) -> str:
    """The table ``bert-multi bench`` prints, and under it what each row's share of a peak is a share of."""
    from ...display import format_table

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
    header = ["workload", "backend", "precision", "median ms", "min ms", "max ms", "first call ms", "vs fastest"]
    header += ["tokens/s (MB/s)", "of peak"]
    sources = sorted({row.peak_source.rsplit(",", 1)[0] for row in rows if row.share is not None})
    dense = " (dense; MFU)" if any("data sheet" in source for source in sources) else ""
    note = [
        f"of peak: the model's FLOPs (its heads' included; a training step's: three forwards') per second, as a "
        f"share of the {' and of the '.join(sources)} peak{dense}"
    ]
    return format_table(header, body) + ("\n" + note[0] if sources else "")


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
    save_figure(figure, path, dpi=100)
    return path
