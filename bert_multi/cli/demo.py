"""``bert-multi demo``: run the d2l chapter's demo model through every installed backend."""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..backend.registry import backends, load_backend
from ..display import ProgressBar, format_table
from ..spec.config import CONFIGS
from ..spec.schema import init_weights


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("demo", help="run the d2l chapter's demo model through every installed backend")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights and tokens (default 0)")
    return parser


def run(args: argparse.Namespace) -> int:
    """The d2l chapter's demo: its model and inputs through every installed framework backend (the
    references compute the original BERT, not d2l's)."""
    config = CONFIGS["chapter"]
    weights = init_weights(config, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    # As in the chapter: two sequences of 8 tokens, the second half in segment B, 3 MLM positions each.
    tokens = rng.integers(0, config.vocab_size, size=(2, 8))
    segments = np.array([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    mlm_positions = np.array([[1, 5, 2], [6, 1, 5]])
    print(f"d2l chapter demo: {config}")
    rows: list[tuple[object, ...]] = []
    # The references compute the original BERT, not the chapter's.
    chosen = {name: status for name, status in backends().items() if status.role != "reference"}
    bar = ProgressBar()
    for done, (name, status) in enumerate(chosen.items()):
        bar(done, len(chosen), f"{name}: building the chapter's model and running it")
        if not status.available:
            rows.append((name, "-", "-", "-", "-", "-", f"skipped: {status.reason}"))
            continue
        model = load_backend(name).build(config, weights)
        start = time.perf_counter()
        out = model(tokens, segments, None, mlm_positions)
        elapsed = time.perf_counter() - start
        rows.append(
            (
                name,
                model.dtype,
                model.device,
                out.encoded.shape,
                "-" if out.mlm is None else out.mlm.shape,
                "-" if out.nsp is None else out.nsp.shape,
                f"{elapsed * 1000:.0f} ms",
            )
        )
    bar.close()
    print(format_table(("backend", "dtype", "device", "encoded_X", "mlm_Y_hat", "nsp_Y_hat", "forward"), rows))
    return 0
