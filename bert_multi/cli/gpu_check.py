"""``bert-multi gpu-check``: every GPU check in one offline command (docs/gpu.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..display import ProgressBar
from ..errors import UsageError
from ..safe_files import replace_text
from ..tools.gpu_check import EXIT_INCOMPLETE, GpuReport, Listener, run_gpu_check
from .common import check_output


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "gpu-check",
        help="every GPU check in one offline command: conformance, TF32, training, fixtures, bench",
        description="For every GPU and every installed backend that can use it, in the order of what they "
        "prove: d2l's BERT against the oracle and the CPU (float32 with TF32 off, float64), float32 products "
        "at full precision, gradients and training steps against the CPU, the earlier generations, the golden "
        "fixtures, and bench. A line as each part starts and ends; gpu-check.md and gpu-check.json under "
        f"--out, rewritten after every part. Exit 1 if a check fails, {EXIT_INCOMPLETE} if --budget stopped "
        "the run first (what did not run is NOT RUN); with no GPU every part is a SKIP and the exit status is 0.",
    )
    parser.add_argument("--out", default="gpu-check", metavar="DIR", help="where the reports go (default gpu-check/)")
    parser.add_argument(
        "--quick", action="store_true", help="the tiny model; d2l 1.0, TF32, training and bench only: a smoke test"
    )
    parser.add_argument("--bench-rounds", type=int, default=3, help="interleaved bench rounds (default 3)")
    parser.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="stop cleanly once this much time is spent: the parts not run are listed as NOT RUN",
    )
    return parser


def write_reports(report: GpuReport, out: Path) -> None:
    """gpu-check.json (everything) and gpu-check.md (the summary), each replaced whole or not at all."""
    for name, text in (
        ("gpu-check.json", json.dumps(report.to_json(), indent=1, default=str)),
        ("gpu-check.md", report.markdown()),
    ):
        replace_text(out / name, text)


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "--out", directory=True)
    if args.budget is not None and not args.budget > 0:
        raise UsageError(f"--budget {args.budget:g}: expected a number of seconds above 0")
    if args.bench_rounds < 1:
        raise UsageError(f"--bench-rounds {args.bench_rounds}: expected at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bar = ProgressBar()
    listener = Listener(line=bar.print, step=bar, report=lambda report: write_reports(report, out))
    try:
        report = run_gpu_check(args.quick, args.bench_rounds, args.budget, listener)
    finally:
        bar.close()
    print(report.table())
    print(f"\nreports written to {out / 'gpu-check.md'} and {out / 'gpu-check.json'} ({report.seconds:.0f} s)")
    print(report.verdict())
    return report.exit_status()
