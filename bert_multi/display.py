"""Showing work to people: plain-text tables and a progress bar."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with columns padded to their widest cell."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


class ProgressBar:
    """A one-line progress bar on a terminal; silent when the stream is not one (logs, CI)."""

    def __init__(self, stream: TextIO | None = None, width: int = 28) -> None:
        self.stream, self.width = stream or sys.stderr, width
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled or total <= 0:
            return
        filled = round(self.width * min(done, total) / total)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {label[:60]:<60}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (self.width + 74) + "\r")
            self.stream.flush()

    def print(self, line: str) -> None:
        """Print a line to standard output above the bar (the bar is redrawn by the next update)."""
        self.close()
        print(line, flush=True)
