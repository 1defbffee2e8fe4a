"""Showing work to people: plain-text tables, a progress bar, and text a terminal shows as text."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

# What a terminal would act on rather than show: control characters (an escape sequence in a tensor's name
# could recolour or rewrite the screen) and invisible format characters; newlines, tabs and the carriage
# return a progress bar redraws with are kept. Lone surrogates (undecodable bytes of a file name) cannot
# be written at all.
_UNPRINTABLE = re.compile(
    r"[^\n\r\t\x20-\x7e\xa0-\U0010ffff]|[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff\ud800-\udfff]"
)


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

    def note(self, line: str) -> None:
        """A line of progress on the bar's stream, terminal or not (a log keeps it): what long work has
        done so far, where a bar alone would leave a log silent."""
        self.close()
        self.stream.write(line + "\n")
        self.stream.flush()


def printable(text: str) -> str:
    """``text`` with what a terminal would act on instead of showing written as Python escapes (\\x1b)."""
    return _UNPRINTABLE.sub(lambda match: match[0].encode("unicode_escape").decode("ascii"), text)


class _Printable:
    """A text stream that writes ``printable`` text to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """Within it, standard output and standard error show any text (a file's names, an error quoting
    them) as ``printable`` text."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(sys.stdout), _Printable(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
