"""``bert-multi conform``: prove every backend matches the oracle and each other (the main job)."""

from __future__ import annotations

import argparse

from ..backend.memory import large_blocks_from_the_system
from ..display import format_table
from ..engine.cases import CASES, get_case
from ..engine.results import Target
from ..errors import UsageError
from ..spec.config import CONFIGS
from ..spec.semantics import PRESETS, described
from .common import (
    add_checkpoint_options,
    add_run_options,
    check_report_outputs,
    comma_list,
    cores_shared,
    model_and_weights,
    parse_targets,
    run_and_report,
    write_reports,
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "conform",
        help="prove every backend matches the oracle and each other (the main job)",
        description="Run the conformance cases on every backend, dtype and device asked "
        "for; compare with the float64 oracle and pairwise; exit 1 on failure.",
    )
    parser.add_argument(
        "--config",
        default="chapter",
        help=f"a built-in config {sorted(CONFIGS)} with random weights, or a weights .npz (default: chapter)",
    )
    parser.add_argument(
        "--cases",
        type=comma_list,
        default=["all"],
        help="comma-separated case names or 'all' (default); see --list-cases",
    )
    parser.add_argument("--list-cases", action="store_true", help="list the cases and exit")
    parser.add_argument(
        "--preset",
        help=f"the d2l generation to compute: {', '.join(PRESETS)}, a d2l version such as 0.14.4, or 'all' "
        "(default: d2l, or a weights file's own)",
    )
    add_checkpoint_options(parser, preset=False)
    add_run_options(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.list_cases:
        print(format_cases())
        return 0
    check_report_outputs(args)
    large_blocks_from_the_system()  # the run's lanes allocate weights on several threads
    targets = parse_targets(args)
    with cores_shared(targets):
        return _run(args, targets)


def _run(args: argparse.Namespace, targets: list[Target]) -> int:
    chosen = CASES if args.cases == ["all"] else [get_case(name) for name in args.cases]
    if args.preset == "all" and args.config not in CONFIGS:
        raise UsageError("--preset all needs a built-in --config: a weights file holds one generation's tensors")
    presets = list(PRESETS) if args.preset == "all" else [args.preset]
    reports = {}
    for preset in presets:
        config, weights = model_and_weights(args, args.config, preset, per_dtype=True)
        if len(presets) > 1:
            print(f"\n== preset {config.semantics.name} ({described(config.semantics)}) ==")
        cases = [case.input(config, args.seed) for case in chosen]
        reports[config.semantics.name] = run_and_report(args, targets, config, weights, cases)
    return write_reports(args, reports)


def format_cases() -> str:
    return format_table(("case", "what it covers"), [(case.name, case.description) for case in CASES])
