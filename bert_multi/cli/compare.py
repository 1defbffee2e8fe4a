"""``bert-multi compare``: the same comparison on your own weights (and inputs)."""

from __future__ import annotations

import argparse

from ..engine.cases import CASE_NAMES, CASES, get_case
from ..engine.results import Target
from ..errors import UsageError
from .common import (
    add_checkpoint_options,
    add_run_options,
    check_report_outputs,
    comma_list,
    cores_shared,
    load_as_stated,
    parse_targets,
    read_inputs,
    run_and_report,
    write_reports,
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compare",
        help="the same comparison on your own weights (and inputs)",
        description="Compare every backend with the oracle on a canonical weights file, "
        "and say where a failing backend first diverges.",
    )
    parser.add_argument(
        "weights",
        help="a checkpoint in any format bert_multi reads (as inspect describes it): canonical .npz, PyTorch "
        ".pt/.pth, Gluon .params, Flax .msgpack, a d2l pretrained-model dir, a HuggingFace directory ...",
    )
    parser.add_argument(
        "--inputs",
        metavar="NPZ",
        help="an .npz with tokens, segments and optionally valid_lens, pred_positions "
        f"(default: the built-in cases: {', '.join(CASE_NAMES)})",
    )
    parser.add_argument(
        "--preset",
        help="compute the weights as this d2l generation (a preset or a d2l version) instead of the file's own; "
        "d2l 0.12-0.15 and 1.0 files have the same tensors, so only you can tell them apart",
    )
    parser.add_argument(
        "--cases",
        type=comma_list,
        default=["all"],
        help=f"comma-separated built-in cases or 'all' (default): {', '.join(CASE_NAMES)}",
    )
    parser.add_argument(
        "--details", action="store_true", help="the full table, per backend, dtype and output, and what each ran on"
    )
    add_checkpoint_options(parser, preset=False)
    add_run_options(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    check_report_outputs(args)
    targets = parse_targets(args)
    with cores_shared(targets):
        return _run(args, targets)


def _run(args: argparse.Namespace, targets: list[Target]) -> int:
    if args.inputs and args.cases != ["all"]:
        raise UsageError("--cases chooses among the built-in cases; with --inputs your batch is the case")
    chosen = CASES if args.cases == ["all"] else [get_case(name) for name in args.cases]
    checkpoint = load_as_stated(args, args.weights, args.preset)
    config, weights = checkpoint.config, checkpoint.weights
    if args.inputs:
        cases = read_inputs(args.inputs)
    else:
        cases = [case.input(config, args.seed) for case in chosen]
    report = run_and_report(args, targets, config, weights, cases, subject=args.weights)
    return write_reports(args, {config.semantics.name: report})
