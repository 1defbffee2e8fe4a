"""``bert-multi fixtures``: rewrite the golden fixtures (weights, inputs, oracle outputs)."""

from __future__ import annotations

import argparse

from ..tools.fixtures import DEFAULT_DIRECTORY, write_fixtures
from .common import check_output


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("fixtures", help="rewrite the golden fixtures (weights, inputs, oracle outputs)")
    parser.add_argument(
        "--dir",
        default=str(DEFAULT_DIRECTORY),
        help=f"where to write them (default: {DEFAULT_DIRECTORY}, run from the repository root)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    check_output(args.dir, "--dir", directory=True)
    for path in write_fixtures(args.dir):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0
