"""``bert-multi lessons``: how the frameworks differ: list the guide's sections, or run one in every framework."""

from __future__ import annotations

import argparse
import itertools

from ..backend.registry import backends, label_of
from ..errors import UsageError
from ..tools import lessons


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "lessons",
        help="how the frameworks differ: list the guide's sections, or run one in every framework",
        description="The framework-differences guide (docs/framework-differences.md), section by section: "
        "each sample run in its framework, printed side by side with the other's.",
    )
    parser.add_argument("section", nargs="?", type=int, help="the section to run (default: list them)")
    return parser


def run(args: argparse.Namespace) -> int:
    """List the framework-differences guide's sections, or run one in every framework side by side."""
    sections = lessons.read_guide()
    if args.section is None:
        for listed in sections:
            print(f"{listed.number}. {listed.title}")
        print(f"\nbert-multi lessons N runs section N in every framework; the guide: {lessons.GUIDE}")
        return 0
    section = next((s for s in sections if s.number == args.section), None)
    if section is None:
        raise UsageError(f"no section {args.section}: the guide has sections 1 to {len(sections)}")
    print(f"{section.number}. {section.title}\n")
    status = backends()
    parts = []  # per sample: (header, code lines, printed lines, verdict)
    for sample in section.samples:
        outcome = lessons.run([sample])[0] if status[sample.framework].available else None
        printed = outcome.printed.rstrip() if outcome else f"(not run: {status[sample.framework].reason})"
        verdict = "" if outcome is None else ("as the guide says" if outcome.as_written else "NOT as the guide says")
        parts.append((f"{label_of(sample.framework)}:", sample.code.splitlines(), printed.splitlines(), verdict))
    code_rows = max(len(code) for _, code, _, _ in parts)
    printed_rows = max(len(printed) for _, _, printed, _ in parts)
    columns = [
        [
            header,
            *code,
            *[""] * (code_rows - len(code)),
            "",
            "prints:",
            *printed,
            *[""] * (printed_rows - len(printed)),
            verdict,
        ]  # fmt: skip
        for header, code, printed, verdict in parts
    ]
    width = max(len(line) for line in columns[0]) + 4
    for row in itertools.zip_longest(*columns, fillvalue=""):
        print("".join(f"{cell:<{width}}" for cell in row).rstrip())
    return 0
