"""Waits that Ctrl-C ends at once, on the main thread.

Python runs a signal's handler (SIGINT's raises ``KeyboardInterrupt``) on the main thread, between two
steps of its bytecode. A wait with no timeout (``Event.wait()``, ``Thread.join()``) sits in the kernel
until it ends, and is cut short only where the signal is delivered to that very thread: delivered to
another (a worker's reader, a framework's own threads), or just before the wait begins, it is left
pending until the wait ends by itself, which may be never. These waits wake every
``INTERRUPT_CHECK_S`` seconds, so a pending signal is acted on within that time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

INTERRUPT_CHECK_S = 0.25


def wait(event: threading.Event) -> None:
    """Until ``event`` is set."""
    while not event.wait(INTERRUPT_CHECK_S):
        pass


def join(thread: threading.Thread) -> None:
    """Until ``thread`` has ended."""
    while thread.is_alive():
        thread.join(INTERRUPT_CHECK_S)


def wait_until(condition: threading.Condition, predicate: Callable[[], object]) -> None:
    """Until ``predicate()`` holds, ``condition`` held by the caller (as ``Condition.wait_for``)."""
    while not condition.wait_for(predicate, INTERRUPT_CHECK_S):
        pass
