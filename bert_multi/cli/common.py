"""What the subcommands share: option types, the run options, reading checkpoints and inputs as stated,
checking output paths before any work, and running and reporting a conformance run."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

try:  # a dependency; a source tree run where it is not installed leaves BLAS its own threads
    import threadpoolctl
except ImportError:
    threadpoolctl = None

from ..backend.channel import worker_environment
from ..backend.registry import backend_names, check_names, frameworks, processes_for
from ..backend.remote import use_python
from ..display import ProgressBar
from ..engine.cases import Batch, CaseInput
from ..engine.conform import WeightsSource, check_targets, run_conformance
from ..engine.report import NARROW, failure_details, plot_report, runtime_lines, summary_table, verdict
from ..engine.results import Report, Target
from ..errors import InputError, StatementsMissing, UsageError
from ..files.checkpoints import Checkpoint, load_checkpoint
from ..safe_files import NpzReader, open_regular, replace_text
from ..spec.config import CONFIGS, HEADS, BERTConfig
from ..spec.schema import SUPPORTED_DTYPES, random_weights
from ..spec.semantics import PRESETS

# The exit status of a command that found, checked or timed nothing: what it was asked to look at is
# not here (no section has those words, no backend could run, nothing could be timed on that device).
NOTHING_FOUND = 1


@contextlib.contextmanager
def cores_shared(targets: list[Target]) -> Iterator[None]:
    """This process its share of the cores where a worker runs some of ``targets`` beside it, unless the
    user set ``OMP_NUM_THREADS``: the frameworks here start their thread pools with it (PyTorch, MXNet),
    and the BLAS libraries already loaded (NumPy's, for the oracle, loads with NumPy, before the command
    knows its targets) are set to it where threadpoolctl is installed. A worker inherits it, and XLA's
    pool takes the cores it may run on whatever it says. On 2 cores, threads of both processes would
    otherwise wait for the same cores, spinning: the oracle took twice as long beside JAX's worker."""
    processes = processes_for(target.backend for target in targets)
    if processes < 2 or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    share = max(1, (os.cpu_count() or 1) // processes)
    os.environ["OMP_NUM_THREADS"] = str(share)
    try:
        with contextlib.nullcontext() if threadpoolctl is None else threadpoolctl.threadpool_limits(share, "blas"):
            yield
    finally:  # a caller in this process (a test) keeps its own environment
        del os.environ["OMP_NUM_THREADS"]


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def backend_and_python(text: str) -> tuple[str, str]:
    backend, equals, python = text.partition("=")
    if not equals or not backend.strip() or not python.strip():
        raise argparse.ArgumentTypeError(f"expected BACKEND=PYTHON, such as jax=.venv-numpy2/bin/python, got {text!r}")
    return backend.strip(), python.strip()


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_targets(args: argparse.Namespace) -> list[Target]:
    """The targets asked for; any name that is not a backend, dtype or device is refused here."""
    for backend, python in getattr(args, "python", None) or []:
        check_names([backend])
        use_python(backend, python)
    names = frameworks() if args.backends is None else args.backends
    if args.reference:
        references = backend_names("reference")
        if args.reference not in references:
            raise UsageError(f"--reference {args.reference!r}: expected one of the references {references}")
        names = [*names, args.reference] if args.reference not in names else names
    attentions = getattr(args, "attention", ["d2l"])
    targets = [
        Target(backend, dtype, device, attention)
        for device in args.devices
        for backend in names
        for attention in attentions
        for dtype in args.dtypes
    ]
    check_targets(targets)
    return targets


def model_and_weights(
    args: argparse.Namespace, spec: str, preset: str | None, per_dtype: bool = False
) -> tuple[BERTConfig, Any]:
    """A built-in config name with random weights from ``--seed``, or a checkpoint in any format with what
    the options state about it; computing the generation ``preset`` when one is given. With
    ``per_dtype``, a built-in config's weights come as a function of the dtype (``WeightsSource``), so a
    conformance run holds one dtype's at a time."""
    if spec in CONFIGS:
        stated = [option for option in ("num_heads", "d2l_version", "cast", "key", "prefix") if getattr(args, option)]
        if stated:
            options = ", ".join("--" + option.replace("_", "-") for option in stated)
            raise UsageError(f"{options}: these describe a checkpoint file, not the built-in config {spec!r}")
        config = CONFIGS[spec].with_semantics(preset or "d2l")
        # Every tensor random (biases and LayerNorm parameters too), so that every weight is checked.
        source = functools.partial(random_weights, config, args.seed)  # a dtype's: the float64 ones rounded
        return config, source if per_dtype else source("float64")
    if Path(spec).exists():
        checkpoint = load_as_stated(args, spec, preset)
        return checkpoint.config, checkpoint.weights
    raise UsageError(f"--config {spec!r} is neither a built-in config {sorted(CONFIGS)} nor an existing checkpoint")


def load_as_stated(args: argparse.Namespace, path: str, preset: str | None) -> Checkpoint:
    """A checkpoint in any format, with the statements of --num-heads, --preset/--d2l-version, --cast, --key,
    --prefix; what was done to read it is said."""
    try:
        checkpoint = load_checkpoint(
            path,
            num_heads=args.num_heads,
            preset=preset,
            d2l_version=args.d2l_version,
            dtype=args.cast,
            key=args.key,
            prefix=args.prefix,
        )
    except StatementsMissing as missing:  # in this interface's spelling: flags
        raise UsageError(missing.for_command_line()) from None
    for note in checkpoint.info.notes:
        print(f"note: {note}")
    if checkpoint.info.ignored:
        print(f"ignored (not part of d2l's BERTModel): {', '.join(checkpoint.info.ignored)}")
    return checkpoint


PREFIX_HELP = "the attribute of a wrapper (a LightningModule) whose tensors are the model's, e.g. model."
MAX_INPUT_BYTES = 1 << 30  # what an inputs .npz may expand to


def read_inputs(path: str) -> list[CaseInput]:
    """One batch from an .npz with tokens, segments and optionally valid_lens and pred_positions."""
    allowed = ("tokens", "segments", "valid_lens", "pred_positions")
    with open_regular(path, "file of inputs (.npz)", InputError) as file:
        archive = NpzReader(file, path, InputError, max_compressed_bytes=MAX_INPUT_BYTES)
        unknown = sorted(set(archive.names) - set(allowed))
        if unknown or not {"tokens", "segments"} <= set(archive.names):
            raise InputError(
                f"{path}: expected arrays tokens, segments and optionally valid_lens, pred_positions; "
                f"found {sorted(archive.names)}"
            )
        arrays = {name: archive.read(name, archive.header(name)) for name in archive.names}
    return [CaseInput(Path(path).stem, {name: arrays.get(name) for name in allowed})]


def check_output(path: str | None, option: str, directory: bool = False) -> None:
    """Refuse, before any work starts, an output path that could not be written at the end: its
    directory must exist (or, for a directory to create, its nearest existing ancestor) and be writable,
    where a link leads (a dangling link's too). A file is replaced whole; a device or a FIFO (/dev/null,
    /dev/stdout) is written to as a stream; anything else is refused."""
    if path is None:
        return
    target = Path(os.path.realpath(path))
    if directory:
        if target.exists() and not target.is_dir():
            raise UsageError(f"{option} {path}: exists and is not a directory")
        parent = next(p for p in (target, *target.parents) if p.exists())
    else:
        if target.is_dir():
            raise UsageError(f"{option} {path}: is a directory; expected a file name")
        mode = target.stat().st_mode if target.exists() else stat.S_IFREG
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return  # written to as a stream, in place
        if not stat.S_ISREG(mode):
            raise UsageError(f"{option} {path}: is neither a file, a device nor a FIFO; expected a file name")
        parent = target.parent
        if not parent.is_dir():
            raise UsageError(f"{option} {path}: the directory {str(parent)!r} does not exist")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot write in {str(parent)!r}")


def check_plot(path: str | None, option: str = "--plot") -> None:
    check_output(path, option)
    if path is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"{option} needs matplotlib: pip install 'bert_multi[plot]'")


def describe_case(config: BERTConfig, case: CaseInput) -> str:
    cut = case.cut(config)
    return case.name if cut is None else f"{case.name} (on the model cut to max_len {cut})"


def run_and_report(
    args: argparse.Namespace,
    targets: list[Target],
    config: BERTConfig,
    weights: dict[str, np.ndarray] | WeightsSource,
    cases: list[CaseInput] | list[tuple[str, Batch]],
    subject: str | None = None,
) -> Report:
    """Run the comparison and show it: the table (unless ``args.details`` is False), where failures
    diverge, and the verdict; with ``subject``, the verdict as one sentence about it."""
    details = getattr(args, "details", True)
    print(textwrap.fill(f"config: {config_line(config)}", NARROW, subsequent_indent="  "))
    absent = [head for head in HEADS if head not in config.heads]
    if absent:
        print(f"absent from this model, so not compared: {', '.join(absent)}")
    described = ", ".join(describe_case(config, CaseInput(*case)) for case in cases)
    print(textwrap.fill(f"cases: {described}", NARROW, subsequent_indent="  ", break_on_hyphens=False))
    bar = ProgressBar()
    try:
        report = run_conformance(config, weights, targets, cases, pairs=not args.no_pairs, progress=bar)
    finally:
        bar.close()
    if details:
        print(summary_table(report, wide=args.wide))
        print(f"\nran on:\n{runtime_lines(report)}")
    if not report.passed:
        print("\n" + failure_details(report))
    rows = report.worst()
    passing = sum(1 for *_, comparison in rows if comparison.passed)
    broken = f", {len(report.errors)} error(s)" if report.errors else ""
    skipped = f", {len(report.skipped)} target(s) skipped" if report.skipped else ""
    print(
        f"\n{'PASS' if report.passed else 'FAIL'}: {passing} of {len(rows)} comparisons within tolerance, each the "
        f"worst of {len(cases)} case(s){broken}{skipped}, {report.seconds:.1f} s"
    )
    if subject is not None:
        print(verdict(report, subject) + ("" if details else " (--details: the table)"))
    return report


def config_line(config: BERTConfig) -> str:
    """The config as a person reads it: without dropout, which a comparison never uses (inference)."""
    return re.sub(r"dropout=[^,]*, ", "", repr(config))


def write_reports(args: argparse.Namespace, reports: dict[str, Report]) -> int:
    """Write --json and --plot (one plot per generation when there are several); the exit code."""
    if args.json:
        document = (
            next(iter(reports.values())).to_json()
            if len(reports) == 1
            else {preset: report.to_json() for preset, report in reports.items()}
        )
        replace_text(args.json, json.dumps(document, indent=1))
        print(f"report written to {args.json}")
    if args.plot:
        for preset, report in reports.items():
            path = Path(args.plot)
            if len(reports) > 1:
                path = path.with_name(f"{path.stem}-{preset}{path.suffix}")
            print(f"plot written to {plot_report(report, path)}")
    if not all(report.checks for report in reports.values()):
        print("bert-multi: nothing was checked: no requested backend could run here", file=sys.stderr)
        return NOTHING_FOUND
    return 0 if all(report.passed for report in reports.values()) else 1


def check_report_outputs(args: argparse.Namespace) -> None:
    check_output(args.json, "--json")
    check_plot(args.plot)


def run_there(args: argparse.Namespace, python: str | os.PathLike) -> int:
    """This very command, run by another environment's ``python``: its output is this one's, and so is its
    exit status. It is marked as sent on (``worker_environment``), so it is never sent further."""
    return subprocess.run([str(python), "-m", "bert_multi.cli", *args.argv], env=worker_environment()).returncode


def add_run_options(parser: argparse.ArgumentParser, backends: bool = True) -> None:
    """The options of a conformance run; without ``backends``, those that choose backends and pairs."""
    if backends:
        parser.add_argument(
            "--backends",
            type=comma_list,
            help="comma-separated backend names (default: every framework backend; bert-multi backends lists them)",
        )
    parser.add_argument(
        "--devices",
        type=comma_list,
        default=["cpu"],
        help="comma-separated: cpu, cuda, cuda:N, gpu, gpu:N (default: cpu); "
        "a device a backend cannot use here is reported as skipped",
    )
    parser.add_argument(
        "--dtypes", type=comma_list, default=list(SUPPORTED_DTYPES), help="comma-separated (default: float32,float64)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs (default 0)")
    if backends:
        parser.add_argument(
            "--no-pairs", action="store_true", help="compare with the oracle only, not backends with each other"
        )
        parser.add_argument(
            "--attention",
            type=comma_list,
            default=["d2l"],
            help="comma-separated: d2l (the default: the chapter's written-out attention), sdpa (the same function "
            "through the framework's fused kernel, where it has one), or both",
        )
        parser.add_argument(
            "--python",
            type=backend_and_python,
            action="append",
            metavar="BACKEND=PYTHON",
            help="run BACKEND, where it cannot load here, in this Python's environment (default: the project's "
            "own, e.g. .venv-numpy2 for jax; or BERT_MULTI_PYTHON_<BACKEND>); repeatable",
        )
        parser.add_argument(
            "--reference",
            help="add a reference backend, an independent implementation of the original BERT such as "
            "transformers, as one more row (the bert preset only)",
        )
    add_report_options(parser)


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """How a conformance run's report is shown and kept (conform, compare, verify)."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="the table with the relative errors and how each reference got its weights (wider than 100 columns)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of the error per layer")


def add_checkpoint_options(parser: argparse.ArgumentParser, preset: bool = True) -> None:
    """What a user states about a checkpoint that its tensors cannot tell (see bert_multi.load_checkpoint)."""
    parser.add_argument(
        "--num-heads", type=int, help="the number of attention heads: required for a d2l file, which cannot reveal it"
    )
    if preset:
        parser.add_argument(
            "--preset",
            help=f"the d2l generation: one of {', '.join(PRESETS)} (required when the tensors fit more than one)",
        )
    parser.add_argument("--d2l-version", help="the d2l release that saved the file, such as 0.14.4 (or use --preset)")
    parser.add_argument(
        "--cast", choices=SUPPORTED_DTYPES, help="cast the weights to this dtype (float16/bfloat16 files need it)"
    )
    parser.add_argument("--key", help="the entry of a PyTorch wrapper dict that holds the state_dict, e.g. model")
    parser.add_argument("--prefix", help=PREFIX_HELP)
