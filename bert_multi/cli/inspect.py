"""``bert-multi inspect``: what a checkpoint is: format, tensors, implied sizes and generations, what it cannot tell."""

from __future__ import annotations

import argparse
import json

from ..files.checkpoints import inspect_checkpoint
from ..safe_files import replace_text
from .common import PREFIX_HELP, check_output


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "inspect",
        help="what a checkpoint is: format, tensors, implied sizes and generations, what it cannot tell",
        description="Describe a checkpoint in any format bert_multi reads, without loading it into a model.",
    )
    parser.add_argument(
        "path",
        help="a .npz (bert_multi's, or np.savez of a state_dict), .pt/.pth, .params, .msgpack, .safetensors, a d2l "
        "pretrained-model directory or zip, a HuggingFace BERT directory (model.safetensors, "
        "pytorch_model.bin, tf_model.h5 or flax_model.msgpack), Google's TensorFlow BERT directory, a "
        "training run's checkpoint (PyTorch Lightning's .ckpt, DeepSpeed's directory, Flax's checkpoint_N, "
        "bert-multi pretrain's --checkpoint-dir), any of these directories zipped, "
        "or any other format bert_multi reads (docs/checkpoints.md)",
    )
    parser.add_argument("--key", help="the entry of a PyTorch wrapper dict that holds the state_dict")
    parser.add_argument("--prefix", help=PREFIX_HELP)
    parser.add_argument("--json", metavar="PATH", help="write the description as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    check_output(args.json, "--json")
    info = inspect_checkpoint(args.path, key=args.key, prefix=args.prefix)
    print(info.describe())
    if args.json:
        replace_text(args.json, json.dumps(info.to_json(), indent=1))
        print(f"report written to {args.json}")
    return 0
