"""The ``bert-multi`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from .backend import backends, load_backend
from .config import CONFIGS
from .errors import BackendUnavailable, InputError, WeightsError
from .schema import init_weights


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with columns padded to their widest cell."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def cmd_backends(args: argparse.Namespace) -> int:
    rows = [(name, "yes" if status.available else "no", status.reason or "")
            for name, status in backends().items()]
    print(format_table(("backend", "available", "why not"), rows))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The d2l chapter's demo: its model and inputs through every installed backend."""
    config = CONFIGS["chapter"]
    weights = init_weights(config, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    # As in the chapter: two sequences of 8 tokens, the second half in segment B, 3 MLM positions each.
    tokens = rng.integers(0, config.vocab_size, size=(2, 8))
    segments = np.array([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    mlm_positions = np.array([[1, 5, 2], [6, 1, 5]])
    print(f"d2l chapter demo: {config}")
    rows = []
    for name, status in backends().items():
        if not status.available:
            rows.append((name, "-", "-", "-", "-", "-", f"skipped: {status.reason}"))
            continue
        model = load_backend(name).build(config, weights)
        start = time.perf_counter()
        out = model(tokens, segments, None, mlm_positions)
        elapsed = time.perf_counter() - start
        rows.append((name, model.dtype, model.device, out.encoded.shape, out.mlm.shape, out.nsp.shape,
                     f"{elapsed * 1000:.0f} ms"))
    print(format_table(("backend", "dtype", "device", "encoded_X", "mlm_Y_hat", "nsp_Y_hat", "forward"), rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bert-multi", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the d2l chapter's demo model through every installed backend")
    demo.add_argument("--seed", type=int, default=0, help="seed for the weights and tokens (default 0)")
    demo.set_defaults(func=cmd_demo)
    listing = sub.add_parser("backends", help="list the backends and whether each can run here")
    listing.set_defaults(func=cmd_backends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (InputError, WeightsError, BackendUnavailable) as error:
        print(f"bert-multi: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
