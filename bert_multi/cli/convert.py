"""``bert-multi convert``: a checkpoint from any format to any other (canonical .npz, PyTorch .pt,
Gluon .params, d2l's pretrained-model directory, HuggingFace's)."""

from __future__ import annotations

import argparse

from ..backend.registry import backends, label_of, load_backend
from ..display import ProgressBar
from ..engine.cases import CASES
from ..engine.compare import Comparison, tolerance_for
from ..engine.conform import run_conformance
from ..engine.report import largest_by_dtype, verdict
from ..engine.results import Target, compare_outputs
from ..files.checkpoints import Checkpoint, inspect_checkpoint, load_checkpoint, save_checkpoint
from ..files.formats import D2L_PUBLISHED, DESCRIPTIONS, DIRECTORY_FRAMEWORKS, for_output, huggingface
from ..files.formats.d2l import read_vocab
from ..files.layout import STATED_BY
from .common import add_checkpoint_options, check_output, config_line, load_as_stated


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "convert",
        help="convert a checkpoint between .npz, .pt, .params, .msgpack, .pdparams, d2l's pretrained-model directory, "
        "HuggingFace's and PaddleNLP's",
        description="Read a checkpoint in any format (Google's TensorFlow BERT directory among them) and write it "
        "in the format OUT's name asks for: .npz "
        "(canonical), .pt/.pth (PyTorch state_dict), .params (Gluon), .msgpack (Flax), .pdparams (Paddle), or a "
        "directory (with --framework: d2l's pretrained.params + vocab.json (Paddle's: pretrained.pdparams), "
        "HuggingFace's config.json + model.safetensors, or PaddleNLP's config.json + model_state.pdparams). Each "
        "is what that framework's code loads with its own strict call.",
    )
    parser.add_argument("source", help="the checkpoint to read")
    parser.add_argument("out", help="where to write; the suffix picks the format (no suffix: a d2l directory)")
    add_checkpoint_options(parser)
    parser.add_argument(
        "--framework",
        choices=DIRECTORY_FRAMEWORKS,
        help="for a directory: a d2l one with this framework's pretrained.params (Paddle's: pretrained.pdparams), "
        "or a HuggingFace or PaddleNLP one",
    )
    parser.add_argument("--vocab", help="for a d2l directory: a JSON list of tokens, when the source has no vocab")
    parser.add_argument(
        "--check",
        action="store_true",
        help="read OUT back and run it in its framework on the built-in cases, against the float64 oracle on the "
        "source: one sentence says whether it computes what the source computes",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "OUT", directory=for_output(args.out, args.framework).directory)
    vocab = read_vocab(args.vocab) if args.vocab else None
    checkpoint = load_as_stated(args, args.source, args.preset)
    written = save_checkpoint(
        args.out,
        checkpoint.config,
        checkpoint.weights,
        framework=args.framework,
        vocab=vocab or checkpoint.vocab,
        settings=checkpoint.info.settings,
    )
    print(f"config: {config_line(checkpoint.config)}")
    print(f"wrote {args.out}: {DESCRIPTIONS[written]}")  # what was written (--framework huggingface: its directory)
    if written == huggingface.FORMAT.kind:
        for note in huggingface.config_notes(checkpoint.config, checkpoint.info.settings):
            print(note)
    unrecorded = [what for what in inspect_checkpoint(args.out).unknowns if what in STATED_BY]
    if unrecorded:
        values = {"num_heads": checkpoint.config.num_heads, "the generation": checkpoint.config.semantics.name}
        # each statement's first spelling ("--preset" of "--preset or --d2l-version")
        flags = " ".join(f"{STATED_BY[what][1].split()[0]} {values[what]}" for what in unrecorded)
        arguments = ", ".join(f"{STATED_BY[what][0].split()[0]}{values[what]!r}" for what in unrecorded)
        print(
            f"warning: {args.out} does not record {' or '.join(unrecorded)}: whoever reads it must state them "
            f"({flags}; in Python {arguments})"
        )
    return check_conversion(args, checkpoint) if args.check else 0


def check_conversion(args: argparse.Namespace, source: Checkpoint) -> int:
    """Read the written file back (stating the source's config, as its reader would) and prove two things
    on the built-in cases: the float64 oracle computes the same on it as on the source, and its own
    framework (here, in its environment's worker, else the NumPy oracle) runs it as the oracle does.
    One sentence says what was proven; 0 if both hold."""
    reader = D2L_PUBLISHED[args.framework].framework if args.framework in D2L_PUBLISHED else None  # a backend's
    back = load_checkpoint(args.out, source.config, framework=reader)
    cases = [case.input(source.config) for case in CASES]
    oracle = load_backend("numpy")
    original, written = (
        oracle.build(source.config, weights, dtype="float64") for weights in (source.weights, back.weights)
    )
    tolerance = tolerance_for("float64")
    drift: list[Comparison] = []
    for case in cases:
        batch = case.batch
        inputs = (batch["tokens"], batch["segments"], batch.get("valid_lens"), batch.get("pred_positions"))
        drift += compare_outputs(written(*inputs), original(*inputs), tolerance)[0]
    # The written file's own framework runs it; a HuggingFace directory's is transformers.
    framework = for_output(args.out, args.framework).framework
    framework = framework or ("transformers" if args.framework == "huggingface" else "numpy")
    if not backends()[framework].available:
        print(f"note: {label_of(framework)} cannot run here ({backends()[framework].reason}); the NumPy oracle runs it")
        framework = "numpy"
    bar = ProgressBar()
    try:
        targets = [Target(framework, dtype) for dtype in ("float32", "float64")]
        report = run_conformance(back.config, back.weights, targets, cases, pairs=False, progress=bar)
    finally:
        bar.close()
    apart = max(comparison.max_abs for comparison in drift)
    if not all(comparison.passed for comparison in drift):
        print(
            f"{args.out} does NOT compute what {args.source} computes: the float64 oracle's outputs on them differ "
            f"by up to {apart:.1e} over {len(cases)} cases, beyond float64's tolerance"
        )
        return 1
    if not report.passed:
        print(verdict(report, str(args.out)))
        return 2 if report.errors and all(c.passed for *_, c in report.worst()) else 1  # 2: it could not tell
    closeness = largest_by_dtype(report)
    ran = (
        f"and {label_of(framework)}, running {args.out} in float32 and float64, matches the float64 oracle on it "
        f"(largest difference {closeness})"
        if framework != "numpy"
        else f"and the NumPy oracle runs it in float32 and float64 as in float64 (largest difference {closeness})"
    )
    print(
        f"{args.out} computes what {args.source} computes: read back, its weights give the float64 oracle the "
        f"outputs {args.source}'s give (largest difference {apart:.1e}), {ran}, over {len(cases)} cases, within "
        "tolerance"
    )
    return 0
