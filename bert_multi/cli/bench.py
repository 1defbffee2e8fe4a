"""``bert-multi bench``: speed of every installed backend side by side (forward and a training step)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..backend.contract import parse_device
from ..backend.registry import backends, check_names, frameworks, load_backend, not_in_process
from ..display import ProgressBar
from ..errors import UsageError
from ..safe_files import replace_text
from ..spec.schema import SUPPORTED_DTYPES
from ..tools import bench
from .common import NOTHING_FOUND, check_output, check_plot, comma_list


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "bench",
        help="speed of every installed backend side by side (forward and a training step)",
        description="Every installed backend in one process, in interleaved rounds: median, min and max "
        "time, tokens/s, the time against the fastest framework's and the share of a same-process GEMM peak; "
        "compiled variants where a framework can compile; transformers as a reference where installed.",
    )
    parser.add_argument(
        "--shapes",
        type=comma_list,
        help="comma-separated models: chapter, base, tiny; each at its device's batch (the CPU: chapter 8x64, "
        "base 8x128; a GPU: base 64x128, its training step 128x128, chapter 512x64) (default: chapter on the "
        "CPU, base,chapter on a GPU)",
    )
    parser.add_argument("--dtypes", type=comma_list, default=list(SUPPORTED_DTYPES), help="comma-separated, on the CPU")
    parser.add_argument(
        "--devices",
        type=comma_list,
        default=["cpu"],
        help="comma-separated: cpu (the default), cuda or cuda:N: on a GPU the products in float32, TF32 and "
        "bfloat16, the attention fused where a framework can, each row with its MFU",
    )
    parser.add_argument(
        "--backends",
        type=comma_list,
        help="comma-separated: time only these (default: every backend that runs in this environment)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per workload (default 5)")
    parser.add_argument("--no-train", action="store_true", help="no training step")
    parser.add_argument(
        "--no-files", action="store_true", help="no weight-file save and load (at the last shape's size)"
    )
    parser.add_argument(
        "--verify", action="store_true", help="also what bert-multi verify costs beside a plain forward (PyTorch)"
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="no compiled variants (torch.compile, Gluon's hybridize)"
    )
    parser.add_argument("--quick", action="store_true", help="the tiny shape, two rounds: a smoke test")
    parser.add_argument("--json", metavar="PATH", help="write every timing as JSON")
    parser.add_argument(
        "--plot", metavar="PATH", help="write a PNG of each row's time against the fastest framework's, with the goal"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    check_output(args.json, "--json")
    check_plot(args.plot)
    shapes, rounds = (bench.QUICK_SHAPES, 2) if args.quick else (args.shapes, args.rounds)
    for shape in shapes or []:
        if shape not in bench.SHAPES:
            raise UsageError(f"unknown shape {shape!r}: expected some of {list(bench.SHAPES)}")
    for name in args.backends or []:
        check_names([name])
        reason = not_in_process(name)
        if reason:
            raise UsageError(f"bench times the backends of this environment only: {reason}")
    for device in args.devices:
        parse_device(device)
    if args.backends is None:
        for name in frameworks():
            python = load_backend(name).elsewhere if backends()[name].available else None
            if python is not None:  # timed through a worker, its timings would include the transfers
                print(f"not timed here: {name} runs in another environment; bench times each framework in its own "
                      f"({python} -m bert_multi.cli bench)")  # fmt: skip
    bar = ProgressBar()
    progress = _Progress(bar)
    rows: list[bench.Row] = []
    try:
        for device in args.devices:
            on_cpu = parse_device(device).kind == "cpu"
            timed: list[bench.Row] = []
            found = bench.workloads(device, shapes, args.dtypes if on_cpu else None, rounds, not args.no_train,
                                    args.backends, not args.no_compile, progress)  # fmt: skip
            for _, workload in found:
                progress.finished(workload())
                timed += progress.rows[-1]
            if not timed:
                bar.print(f"nothing timed on {device}: no backend of this environment can use it")
            elif on_cpu and not args.no_files:  # at the last shape's size
                shape = (shapes or bench.DEFAULT_SHAPES["cpu"])[-1]
                progress.finished(bench.file_rows(bench.SHAPES[shape][0], shape, rounds, progress))
                timed += progress.rows[-1]
            rows += timed
        if args.verify:
            shape = (shapes or bench.DEFAULT_SHAPES["cpu"])[0]
            rows += bench.verify_rows(bench.SHAPES[shape][0], shape, rounds, progress)
    finally:
        bar.close()
    rows = bench.against_fastest(rows)
    if not rows:
        print(f"bert-multi: nothing was timed on {', '.join(args.devices)}", file=sys.stderr)
        return NOTHING_FOUND
    per_backend = {row.backend: row.threads for row in rows if row.threads is not None}
    threads = ", ".join(
        [f"{variable}={os.environ.get(variable, 'unset')}" for variable in ("OMP_NUM_THREADS", "XLA_FLAGS")]
        + [f"{name} threads {count}" for name, count in per_backend.items()]
    )
    print(f"{rounds} interleaved rounds per workload; {threads}")
    print(bench.format_rows(rows))
    verdict = bench.goal_verdict(rows)
    print(verdict)
    if args.json:
        report = {"threads": threads, "goal": bench.GOAL, "verdict": verdict, "rows": [row.to_json() for row in rows]}
        replace_text(args.json, json.dumps(report, indent=1))
        print(f"report written to {args.json}")
    if args.plot:
        print(f"plot written to {bench.plot_rows(rows, args.plot)}")
    return 0


class _Progress:
    """The bar on a terminal for each round, and a line on standard error as each workload starts and for
    each row as its workload ends, which a log keeps too: on a GPU a bench runs for minutes, and a run
    stopped early shows what it timed."""

    def __init__(self, bar: ProgressBar) -> None:
        self.bar, self.started = bar, time.perf_counter()
        self.rows: list[list[bench.Row]] = []

    def __call__(self, label: str) -> None:
        if " round " in label:
            self.bar(0, 1, label)
        else:
            self.bar.note(f"bench: {label} ({time.perf_counter() - self.started:.0f} s in)")

    def finished(self, rows: list[bench.Row]) -> None:
        self.rows.append(rows)
        for row in rows:
            self.bar.note(f"bench: {bench.describe_row(row)}")
