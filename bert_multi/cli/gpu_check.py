"""``bert-multi gpu-check``: every GPU check in one offline command (docs/gpu.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..display import ProgressBar
from ..tools.gpu_check import run_gpu_check
from .common import check_output


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "gpu-check",
        help="every GPU check in one offline command: conformance, TF32, training, bench",
        description="For every GPU and every installed backend that can use it: conformance of every preset "
        "(float32 with TF32 off, float64, GPU against CPU), the golden fixtures, what TF32 does, gradients and "
        "pretraining steps against the CPU, and bench. Writes gpu-check.md and gpu-check.json under --out; "
        "exit 1 if a check fails. With no GPU, every part is a SKIP and the exit status is 0.",
    )
    parser.add_argument("--out", default="gpu-check", metavar="DIR", help="where the reports go (default gpu-check/)")
    parser.add_argument("--quick", action="store_true", help="the tiny model and one bench round: a smoke test")
    parser.add_argument("--bench-rounds", type=int, default=3, help="interleaved bench rounds (default 3)")
    return parser


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "--out", directory=True)
    bar = ProgressBar()
    try:
        report = run_gpu_check(args.quick, args.bench_rounds, lambda label: bar(0, 1, label))
    finally:
        bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
    (out / "gpu-check.md").write_text(report.markdown())
    print(report.table())
    print(f"\nreports written to {out / 'gpu-check.md'} and {out / 'gpu-check.json'} ({report.seconds:.0f} s)")
    print(report.verdict())
    return 1 if report.failed else 0
