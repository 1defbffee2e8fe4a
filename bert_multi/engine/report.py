"""A conformance run for people: its summary table, where each failure first diverged, what each target
ran on, and plots of the error per layer and of pretraining curves."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..backend.contract import intermediate_names
from ..backend.registry import label_of
from ..display import format_table
from ..safe_files import replace_file
from ..spec.schema import SUPPORTED_DTYPES
from .compare import Comparison
from .results import OUTPUT_NAMES, Check, Report, Target


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2e}"


def _margin(comparison: Comparison) -> str:
    if comparison.problem:
        return "-"
    if comparison.nonfinite:
        return "NaN/Inf"
    return "inf" if comparison.ratio == 0 else f"{comparison.margin:.3g}x"


def verdict(report: Report, subject: str) -> str:
    """One sentence on what the run proved about ``subject`` (a file, a model): which backends compute
    what the float64 oracle computes, on how many cases, how closely; or how many comparisons failed."""
    rows = report.worst()
    failing = [(target, reference, output, c) for target, reference, output, c in rows if not c.passed]
    raised = ""
    if report.errors:
        error = report.errors[0]
        on = f" on case {error.case}" if error.case else ""
        targets = len({error.target for error in report.errors})
        said = (error.error.splitlines() or [""])[0]
        raised = f"{targets} target(s) raised ({error.target}{on}: {said})"
    if failing:
        target, reference, output, c = failing[0]
        first = f"first {target.label} {target.dtype} {output} against {reference}, max abs {_number(c.max_abs)}"
        what = f"{len(failing)} of {len(rows)} comparisons are outside tolerance ({first})"
        return f"{subject} does NOT compute what the float64 oracle computes: {what}{'; ' + raised if raised else ''}"
    if raised:  # what raised proves nothing about the subject, either way
        ran = f"; the {len(rows)} comparisons that ran are within tolerance" if rows else ""
        return f"{subject} was not checked in full: {raised}{ran}"
    if not rows:
        return f"{subject}: nothing was compared (no requested backend could run here)"
    backends = list(dict.fromkeys(_label(target) for target, *_ in rows))
    paired = any(not reference.startswith("oracle") for _, reference, _, _ in rows)
    closeness = largest_by_dtype(report)
    who = ", ".join(backends[:-1]) + (" and " if len(backends) > 1 else "") + backends[-1]
    also = ", and with each other" if paired else ""
    cases = len(report.cases)
    return (
        f"{subject}: {who} compute{'s' if len(backends) == 1 else ''} what the float64 oracle computes{also}, "
        f"on {cases} case{'s' if cases != 1 else ''}: largest difference {closeness}, every one of "
        f"{len(rows)} comparisons within tolerance"
    )


def _label(target: Target) -> str:
    """How people call a target's backend, and its attention where that is not d2l's: "PyTorch (sdpa)"."""
    return label_of(target.backend) + ("" if target.attention == "d2l" else f" ({target.attention})")


def largest_by_dtype(report: Report) -> str:
    """The largest difference of each dtype's comparisons: "1.7e-06 in float32 and 3.4e-15 in float64"."""
    largest: dict[str, float] = {}
    for target, _, _, comparison in report.worst():
        largest[target.dtype] = max(largest.get(target.dtype, 0.0), comparison.max_abs)
    return " and ".join(f"{value:.1e} in {dtype}" for dtype, value in largest.items())


def summary_table(report: Report, wide: bool = False) -> str:
    """One row per target, reference and output: the worst case's error, the tolerance and the margin (how
    many times the error could grow before failing), in at most ``NARROW`` columns for a usual run; ``wide``:
    the target's parts apart, the relative error, and how each reference got its weights."""
    rows: list[tuple[str, ...]] = []
    for target, reference, output, c in report.worst():
        result = "PASS" if c.passed else "FAIL"
        if wide:
            tolerance = f"atol {c.tolerance.atol:g} rtol {c.tolerance.rtol:g}"
            numbers = (_number(c.max_abs), _number(c.max_rel), tolerance, _margin(c), result)
            rows.append((target.label, target.dtype, target.device, reference, output, *numbers))
        else:
            tolerance = f"{c.tolerance.atol:g} / {c.tolerance.rtol:g}"
            rows.append(
                (str(target), _short(reference, target), output, _number(c.max_abs), tolerance, _margin(c), result)
            )
    unrun = [(target, f"SKIP: {reason}") for target, reason in report.skipped.items()]
    unrun += [(error.target, f"ERROR: {error.error}") for error in report.errors]
    for target, said in unrun:
        if wide:
            rows.append((target.label, target.dtype, target.device, "-", "-", "-", "-", "-", "-", said))
        else:
            rows.append((str(target), "-", "-", "-", "-", "-", said.splitlines()[0] if said else said))
    if wide:
        header: tuple[str, ...] = ("backend", "dtype", "device", "compared with", "output", "max abs err",
                                   "max rel err", "tolerance", "margin", "result")  # fmt: skip
        return format_table(header, rows)
    header = ("target", "compared with", "output", "max abs err", "atol / rtol", "margin", "result")
    return format_table(header, rows) + "\n" + MARGIN_NOTE


NARROW = 100  # columns: what the default table fits in, for a usual run
MARGIN_NOTE = (
    "margin: how many times the largest error could grow and still pass (|err| <= atol + rtol * |ref|)\n"
    "--wide: the relative errors, and how each reference got its weights"
)


def _short(reference: str, target: Target) -> str:
    """A reference as the narrow table names it: without how its weights came (the wide table says), and
    without its dtype and device where they are the target's ("numpy" for "numpy float32 cpu (...)")."""
    bare = reference.split(" (", 1)[0]
    same = f" {target.dtype} {target.device}"
    return bare.removesuffix(same) if bare.endswith(same) else bare


def failure_details(report: Report, names: Callable[[str], str] | None = None) -> str:
    """What each backend that raised was doing, and where each failing target first diverges from each
    reference, in computation order: one line per distinct divergence, with how many of the cases and
    which dtypes show it, and the worst of them; ``names`` says where an activation is in a user's model."""
    lines = [error.describe() for error in report.errors]
    groups: dict[tuple[str, str, str, str], list[Check]] = {}
    for check in report.failures():
        first = check.first_divergence
        assert first is not None
        key = (check.target.label, check.target.device, _without_dtype(check.reference), first.name)
        groups.setdefault(key, []).append(check)
    for (backend, device, reference, name), checks in groups.items():
        cases = sorted({check.case for check in checks}, key=report.cases.index)
        run = {c.case for c in report.checks if (c.target.label, c.target.device) == (backend, device)}
        dtypes = " and ".join(sorted({check.target.dtype for check in checks}))
        shown = ", ".join(cases[:3]) + (", ..." if len(cases) > 3 else "")
        where = f" (yours: {names(name)})" if names and names(name) != name else ""
        lines.append(
            f"FAIL {backend} vs {reference}: first divergence at {name!r}{where} in {len(cases)} of {len(run)} "
            f"case{'s' if len(run) > 1 else ''} ({shown}), {dtypes} on {device}"
        )
        worst = max(checks, key=lambda check: check.first_divergence.ratio)  # type: ignore[union-attr]
        first = worst.first_divergence
        assert first is not None
        lines.append(f"     worst, case {worst.case} in {worst.target.dtype}: {first.describe()}")
    return "\n".join(lines)


def _without_dtype(reference: str) -> str:
    """A reference without its dtype: "torch cpu (weights via file)" for "torch float32 cpu (...)"."""
    return " ".join(word for word in reference.split(" ") if word not in SUPPORTED_DTYPES)


def runtime_lines(report: Report) -> str:
    """What each target ran on: framework version, threads, TF32 (each wrapped to ``NARROW`` columns)."""
    lines = []
    for target, info in report.runtime.items():
        details = ", ".join(
            f"{key} {value}" for key, value in info.items() if key not in ("backend", "dtype", "device")
        )
        lines.append(textwrap.fill(f"{target}: {details}", NARROW, initial_indent="  ", subsequent_indent="    "))
    return "\n".join(lines)


MAX_LABELS = 30  # layer names on a plot's axis: past that, every k-th (and the outputs), so they stay legible


def plot_report(report: Report, path: str | Path) -> Path:
    """A PNG of the worst max-abs error against the oracle at each layer, one panel per dtype (each with its
    absolute tolerance dotted) and one line per backend: where error grows, and how far it is from
    failing. At most 14 inches wide, with at most ``MAX_LABELS`` layer names, whatever the model's depth."""
    plt = _pyplot()
    layers = intermediate_names(report.config) + list(OUTPUT_NAMES)
    worst: dict[str, dict[str, dict[str, float]]] = {}  # dtype -> backend -> layer -> error
    tolerances: dict[str, float] = {}
    for check in report.checks:
        if not check.against_oracle:
            continue
        series = worst.setdefault(check.target.dtype, {}).setdefault(f"{check.target.label} {check.target.device}", {})
        for comparison in check.intermediates + check.outputs:
            error = math.inf if comparison.nonfinite or comparison.problem else comparison.max_abs
            series[comparison.name] = max(series.get(comparison.name, 0.0), error)
            tolerances[check.target.dtype] = comparison.tolerance.atol
    floor = 1e-17  # exact agreement, drawn at the bottom of the log scale
    dtypes = sorted(worst) or ["float32"]
    width = min(14.0, max(8.0, 0.3 * len(layers)))
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(width, 3.2 * len(dtypes) + 1.2), sharex=True, squeeze=False)
    colors: dict[str, str] = {}  # one colour per backend, the same in every panel
    for ax, dtype in zip(axes[:, 0], dtypes):
        for backend, series in worst.get(dtype, {}).items():
            color = colors.setdefault(backend, f"C{len(colors)}")
            ys = [max(series.get(layer, math.nan), floor) for layer in layers]
            ax.plot(range(len(layers)), ys, marker="o", markersize=3, color=color, label=backend)
        if tolerances.get(dtype, 0) > 0:
            ax.axhline(tolerances[dtype], color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"atol {tolerances[dtype]:g}", (0, tolerances[dtype]), textcoords="offset points",
                        xytext=(2, 3), fontsize=8, color="grey")  # fmt: skip
        ax.set_yscale("log")
        ax.set_ylabel(f"{dtype}\nmax |error|")
        ax.grid(True, which="major", axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    step = math.ceil(len(layers) / MAX_LABELS)
    shown = [i for i in range(len(layers)) if i % step == 0 or i >= len(layers) - len(OUTPUT_NAMES)]
    axes[-1, 0].set_xticks(shown, [layers[i] for i in shown], rotation=45, ha="right", fontsize=8)
    c = report.config
    fig.suptitle(
        f"Error per layer against the float64 oracle, worst case (exact agreement drawn at 1e-17)\n"
        f"{c.num_blks} blocks, {c.num_hiddens} hidden, {c.num_heads} heads, vocab {c.vocab_size}",
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    save_figure(fig, path, dpi=110)
    return path


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise RuntimeError("plotting needs matplotlib: pip install 'bert_multi[plot]'") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training(runs: Sequence, path: str | Path) -> Path:
    """A PNG of each backend's pretraining loss per step and, below, how far apart the curves are."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(2, 1))
    for number, run in enumerate(runs):
        steps = range(1, len(run.losses) + 1)
        color = f"C{number}"
        top.plot(steps, [loss.total for loss in run.losses], marker=".", color=color, label=f"{run.backend} total")
        top.plot(steps, [loss.mlm for loss in run.losses], linestyle=":", color=color, label=f"{run.backend} MLM")
    top.set_ylabel("loss")
    top.legend(fontsize=8)
    top.grid(True, alpha=0.3)
    for number, run in enumerate(runs[1:], start=1):  # each curve's distance from the first
        gaps = [max(abs(a.total - b.total), 1e-17) for a, b in zip(runs[0].losses, run.losses)]
        bottom.semilogy(range(1, len(gaps) + 1), gaps, marker=".", color=f"C{number}", label=run.backend)
    if len(runs) > 1:
        bottom.set_ylabel(f"|loss - {runs[0].backend}'s|")
        bottom.legend(fontsize=8)
    bottom.set_xlabel("step")
    bottom.grid(True, alpha=0.3)
    top.set_title("Pretraining loss per step, same weights and batches")
    fig.tight_layout()
    path = Path(path)
    save_figure(fig, path, dpi=110)
    return path


def save_figure(figure: Any, path: str | Path, dpi: int) -> None:
    """A matplotlib figure saved to ``path`` in the format its suffix names, replacing any earlier file
    whole or not at all; the figure is closed."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        replace_file(path, lambda file: figure.savefig(file, format=path.suffix.lstrip(".") or "png", dpi=dpi))
    finally:
        plt.close(figure)
