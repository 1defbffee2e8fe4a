"""``bert-multi convert``: a checkpoint from any format to any other (canonical .npz, PyTorch .pt,
Gluon .params, d2l's pretrained-model directory, HuggingFace's)."""

from __future__ import annotations

import argparse

from ..files.checkpoints import inspect_checkpoint, output_format, save_checkpoint
from ..files.formats import DESCRIPTIONS, DIRECTORY_FRAMEWORKS
from ..files.formats.d2l import read_vocab
from ..files.layout import STATED_BY
from .common import add_checkpoint_options, check_output, config_line, load_as_stated


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "convert",
        help="convert a checkpoint between .npz, .pt, .params, .msgpack, d2l's pretrained-model directory and "
        "HuggingFace's",
        description="Read a checkpoint in any format and write it in the format OUT's name asks for: .npz "
        "(canonical), .pt/.pth (PyTorch state_dict), .params (Gluon), .msgpack (Flax), or a directory (with "
        "--framework: d2l's "
        "pretrained.params + vocab.json, or HuggingFace's config.json + model.safetensors). Each is what that "
        "framework's code loads with its own strict call.",
    )
    parser.add_argument("source", help="the checkpoint to read")
    parser.add_argument("out", help="where to write; the suffix picks the format (no suffix: a d2l directory)")
    add_checkpoint_options(parser)
    parser.add_argument(
        "--framework",
        choices=DIRECTORY_FRAMEWORKS,
        help="for a directory: a d2l one with this framework's pretrained.params, or a HuggingFace one",
    )
    parser.add_argument("--vocab", help="for a d2l directory: a JSON list of tokens, when the source has no vocab")
    return parser


def run(args: argparse.Namespace) -> int:
    kind = output_format(args.out)
    check_output(args.out, "OUT", directory=kind == "d2l-dir")
    vocab = read_vocab(args.vocab) if args.vocab else None
    checkpoint = load_as_stated(args, args.source, args.preset)
    written = save_checkpoint(
        args.out, checkpoint.config, checkpoint.weights, framework=args.framework, vocab=vocab or checkpoint.vocab
    )
    print(f"config: {config_line(checkpoint.config)}")
    print(f"wrote {args.out}: {DESCRIPTIONS[written]}")  # what was written (--framework huggingface: its directory)
    unrecorded = [what for what in inspect_checkpoint(args.out).unknowns if what in STATED_BY]
    if unrecorded:
        values = {"num_heads": checkpoint.config.num_heads, "the generation": checkpoint.config.semantics.name}
        flags = " ".join(f"{STATED_BY[what][1].split()[0]} {values[what]}" for what in unrecorded)
        arguments = ", ".join(f"{STATED_BY[what][0].split()[0]}{values[what]!r}" for what in unrecorded)
        print(
            f"warning: {args.out} does not record {' or '.join(unrecorded)}: whoever reads it must state them "
            f"({flags}; in Python {arguments})"
        )
    return 0
