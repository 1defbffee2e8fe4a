"""``bert-multi verify``: hold your own BERT (a PyTorch or Gluon port, a transformers model) to the oracle,
and say where it goes wrong in your names."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from ..backend.channel import WORKER_VARIABLE
from ..backend.registry import environment_for
from ..display import ProgressBar, format_table
from ..engine.cases import CASE_NAMES
from ..engine.report import failure_details, plot_report, runtime_lines, summary_table
from ..errors import UserCodeError
from ..safe_files import replace_text
from ..spec.config import HEADS
from ..spec.loss import MLM_NORMALIZATIONS
from ..spec.schema import param_shapes
from ..spec.semantics import PRESETS
from ..verify.map_file import write_map
from ..verify.mapping import MappingError
from ..verify.repro import save_repro
from ..verify.session import VerifyReport, load_factory, verify
from .common import (
    add_checkpoint_options,
    add_run_options,
    check_output,
    check_report_outputs,
    comma_list,
    model_and_weights,
    run_there,
)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "verify",
        help="hold your own BERT to the oracle: forward, gradients, loss; where it first goes wrong",
        description="Run the conformance cases on your model (FILE.py:FACTORY or package.module:FACTORY, where "
        "FACTORY(config) returns it), with the canonical weights loaded into its own parameters; compare "
        "outputs and activations with the float64 oracle, and optionally gradients and your loss function. "
        "Exit 0 when everything conforms, 1 when something does not, 2 for a set-up error.",
    )
    parser.add_argument("model", metavar="FILE.py:FACTORY", help="where your model's factory is")
    parser.add_argument("--config", default="chapter", help="a built-in config or a weights file (default: chapter)")
    parser.add_argument("--preset", help=f"the d2l generation your model computes: {', '.join(PRESETS)} (default d2l)")
    parser.add_argument("--cases", type=comma_list, default=["all"], help=f"comma-separated: {', '.join(CASE_NAMES)}")
    parser.add_argument("--map", metavar="FILE", help="a JSON map file placing the canonical tensors (docs/verify.md)")
    parser.add_argument(
        "--heads",
        type=comma_list,
        help=f"the parts after the encoder your model has, comma-separated: some of {', '.join(HEADS)}, or none "
        "(default: found from its parameters; a part it has no parameters for is reported as not checked)",
    )
    parser.add_argument(
        "--write-map",
        metavar="FILE",
        help="write the placement used (or, where none is found, the one guessed) as a map file that --map reads",
    )
    parser.add_argument("--gradients", action="store_true", help="also compare every parameter's float64 gradient")
    parser.add_argument(
        "--frozen", nargs="+", default=[], metavar="NAME", help="parameters meant to get no gradient (your names)"
    )
    parser.add_argument(
        "--loss", metavar="FILE.py:FN", help="your _get_batch_loss_bert(net, loss, vocab_size, tokens_X, ...)"
    )
    parser.add_argument(
        "--mlm-normalization",
        choices=MLM_NORMALIZATIONS,
        default="real_slots",
        help="how the masked-LM loss should be averaged: over the real slots (default) or all (d2l's PyTorch code)",
    )
    parser.add_argument("--save-repro", metavar="DIR", help="on a failure, write what reproduces it with NumPy alone")
    add_checkpoint_options(parser, preset=False)
    add_run_options(parser, backends=False)
    return parser


def run(args: argparse.Namespace) -> int:
    check_report_outputs(args)
    check_output(args.save_repro, "--save-repro", directory=True)
    check_output(args.write_map, "--write-map")
    try:
        factory, label = load_factory(args.model)
    except UserCodeError as error:
        elsewhere = _environment_missing(error)
        if elsewhere is None:
            raise
        return _run_elsewhere(args, *elsewhere)
    loss = load_factory(args.loss)[0] if args.loss else None
    config, weights = model_and_weights(args, args.config, args.preset)
    if args.heads is not None:
        config = dataclasses.replace(config, heads=tuple(head for head in args.heads if head != "none"))
        weights = {name: weights[name] for name in param_shapes(config)}
    print(f"verifying {label} against the oracle; config: {config}")
    bar = ProgressBar()
    try:
        report = verify(
            factory, config, weights=weights, dtypes=args.dtypes, devices=args.devices, seed=args.seed, label=label,
            cases=None if args.cases == ["all"] else args.cases, gradients=args.gradients, frozen=args.frozen,
            loss=loss, mlm_normalization=args.mlm_normalization, map_file=args.map, progress=bar,
        )  # fmt: skip
    except MappingError as error:
        if not (args.write_map and error.suggested):
            raise
        write_map(args.write_map, error.suggested)
        raise MappingError(
            f"{error}\n(written to {args.write_map}: check it, then pass --map {args.write_map})"
        ) from None
    finally:
        bar.close()
    print(f"parameters placed by {report.mapping.how}: {len(report.mapping.placements)} canonical tensors")
    if args.write_map:
        write_map(
            args.write_map, report.mapping.as_map_file() | (report.map_file.declared() if report.map_file else {})
        )
        print(f"the placement written to {args.write_map} (--map reads it)")
    print(summary_table(report.forward, wide=args.wide))
    print(f"\nran on:\n{runtime_lines(report.forward)}")
    if not report.forward.passed:
        print("\n" + failure_details(report.forward, report.user_name))
        for diagnosis in report.diagnoses:
            print(f"diagnosis: {diagnosis.describe()}")
    print_gradients_and_loss(report)
    if args.json:
        replace_text(args.json, json.dumps(report.to_json(), indent=1))
        print(f"report written to {args.json}")
    if args.plot:
        print(f"plot written to {plot_report(report.forward, args.plot)}")
    if args.save_repro and not report.forward.passed:
        print(f"reproduction written to {save_repro(report, factory, weights, args.save_repro)}")
    print("\n" + report.verdict())
    return 0 if report.passed else 1


def _environment_missing(error: UserCodeError) -> tuple[str, str, Path] | None:
    """Where the model's module can be imported, when it could not here for want of a framework that a
    registered environment provides: (the package missing, that environment, its Python); else None."""
    missing = getattr(error.error, "name", None) if isinstance(error.error, ModuleNotFoundError) else None
    if not missing or os.environ.get(WORKER_VARIABLE):  # never sent on from an environment sent to
        return None
    found = environment_for(missing.split(".")[0])
    return None if found is None else (missing.split(".")[0], *found)


def _run_elsewhere(args: argparse.Namespace, package: str, environment: str, python: Path) -> int:
    """This very command, run by ``python``: its output is the report, its exit status this one's."""
    print(f"your model imports {package}, which is not installed here: verify runs it in {environment} "
          f"({python})", flush=True)  # fmt: skip
    return run_there(args, python)


def print_gradients_and_loss(report: VerifyReport) -> None:
    rows = []
    for check in report.gradients:
        worst = max(check.comparisons, key=lambda c: c.ratio, default=None)
        result = "PASS" if check.passed else "FAIL"
        if check.causes:
            counts = {cause: len(check.caused_by(cause)) for cause in ("forward", "backward", "carried")}
            result += (f": {counts['forward']} follow the forward, {counts['backward']} the backward's own, "
                       f"{counts['carried']} carried")  # fmt: skip
        elif check.ungraded:
            result += f": no gradient reaches {', '.join(report.user_name(n) for n in check.ungraded)}"
        elif worst is not None and not worst.passed:
            result += f": first at {report.user_name(check.first_divergence.name)}"  # type: ignore[union-attr]
        rows.append(
            (
                check.scalar,
                check.device,
                str(len(check.comparisons)) + (f" ({len(check.frozen)} frozen)" if check.frozen else ""),
                "-" if worst is None else f"{worst.max_abs:.2e}",
                "-" if worst is None else report.user_name(worst.name),
                result,
            )
        )
    if rows:
        heads = ("gradient of", "device", "parameters", "max abs err", "worst parameter (yours)", "result")
        print("\ngradients, float64, against the gradient oracle:\n" + format_table(heads, rows))
    for device, reason in report.gradients_skipped.items():
        print(f"  gradients on {device}: SKIP, {reason}")
    for check in report.gradients:
        for line in report.gradient_lines(check):
            print(f"  {check.scalar} ({check.device}): {line}")
    if report.loss is not None:
        mlm, nsp, total = report.loss.values
        result = "PASS" if report.loss.passed else "FAIL"
        averaged = report.loss.normalization
        print(f"\nyour loss: mlm {mlm:.10g}, nsp {nsp:.10g}, total {total:.10g}: {result} ({averaged})")
        for problem in report.loss.problems():
            print(f"  {problem}")
        if not report.loss.passed and not report.forward.passed:
            print("  (it may follow from the forward, which differs above: your loss is computed on your outputs)")
