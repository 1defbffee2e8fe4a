"""Showing work to people: plain-text tables, a progress bar, and text a terminal shows as text."""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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
    """Progress of long work: a one-line bar on a terminal; on anything else (a log, CI, ``nohup``) a line
    as work starts and ends, and then at least every ``LOG_EVERY_S`` seconds while it goes on, from a
    timer, so that a log never goes silent for longer, even inside one long step."""

    LOG_EVERY_S = 10.0

    def __init__(
        self, stream: TextIO | None = None, width: int = 28, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream, self.width, self.clock = stream or sys.stderr, width, clock
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.state: tuple[int, int, str] | None = None  # the last update, on a log
        self.started = self.said = 0.0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.timer: threading.Thread | None = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if total <= 0:
            return
        if self.enabled:
            filled = round(self.width * min(done, total) / total)
            self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {label[:60]:<60}")
            self.stream.flush()
            return
        with self.lock:
            first, self.state = self.state is None, (done, total, label)
            if first:
                self.started = self.clock()
            if first or done >= total or self.clock() - self.said >= self.LOG_EVERY_S:
                self._line("")
        if first and self.timer is None:
            self.timer = threading.Thread(target=self._keep_telling, daemon=True)
            self.timer.start()

    def tick(self) -> None:
        """Say where the work is, if nothing was said for ``LOG_EVERY_S`` (the timer's call)."""
        with self.lock:
            if self.state is not None and self.clock() - self.said >= self.LOG_EVERY_S:
                self._line(" (still at it)")

    def _line(self, after: str) -> None:
        done, total, label = self.state or (0, 0, "")
        self.said = self.clock()
        self.stream.write(f"[{self.said - self.started:5.0f} s] {done}/{total} {label}{after}\n")
        self.stream.flush()

    def _keep_telling(self) -> None:
        while not self.stopped.wait(1.0):
            self.tick()

    def close(self) -> None:
        self.stopped.set()
        self.clear()

    def print(self, line: str) -> None:
        """Print a line to standard output above the bar (the bar is redrawn by the next update)."""
        self.clear()
        print(line, flush=True)

    def note(self, line: str) -> None:
        """A line of progress on the bar's stream, terminal or not (a log keeps it): what long work has
        done so far, where a bar alone would leave a log silent."""
        self.clear()
        with self.lock:
            self.said = self.clock()
            self.stream.write(line + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Take the bar off the terminal's line, for a line of text (the next update draws it again)."""
        if self.enabled:
            self.stream.write("\r" + " " * (self.width + 74) + "\r")
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
