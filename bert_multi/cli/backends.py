"""``bert-multi backends``: list the backends and whether each can run here."""

from __future__ import annotations

import argparse

from ..backend.registry import backends, load_backend, refused
from ..display import format_table


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("backends", help="list the backends and whether each can run here")
    return parser


def run(args: argparse.Namespace) -> int:
    status = backends()
    rows = []
    for name, state in status.items():
        devices = ", ".join(load_backend(name).devices()) if state.available else "-"
        rows.append((name, "yes" if state.available else "no", state.role, devices, state.where, state.reason or ""))
    print(format_table(("backend", "available", "role", "devices here", "from", "why not"), rows))
    for reason in refused():
        print(f"refused: {reason}")
    usable = [name for name, state in status.items() if state.available]
    print(f"\n{len(usable)} of {len(status)} backends can run here: {', '.join(usable) or 'none'}.")
    return 0
