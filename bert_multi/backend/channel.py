"""The channel to a worker of another environment (``worker``): a process of that environment's Python,
a JSON request per line on its stdin and a JSON reply per line on its stdout, arrays in ``.npz`` files of
a private directory. Every exchange is bounded in time, in size and in kind, and a worker that breaks a
bound, dies or is interrupted is stopped with its directory removed (docs/backends.md, "What a worker
can cost"). ``remote`` builds backends on it.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import errors, waiting
from ..errors import UsageError, WorkerFailed
from ..safe_files import NpzReader, open_regular

# Set in a worker: a backend that cannot load there is unavailable, never sent on to yet another process.
WORKER_VARIABLE = "BERT_MULTI_WORKER"
# How long one request may take, in seconds ("none": no limit), and how often a working worker says it is
# alive: one that says nothing for SILENCE_S is stopped before its deadline (stopped, or stuck holding
# the interpreter). A hung worker costs at most the shorter of the two.
TIMEOUT_VARIABLE = "BERT_MULTI_WORKER_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
HEARTBEAT_VARIABLE = "BERT_MULTI_WORKER_HEARTBEAT"
HEARTBEAT_S = 5.0
SILENCE_S = 60.0
ALIVE_CHECK_S = 0.5  # how often a wait for a reply looks whether the worker still lives
# What a reply may hold: its JSON line, the end of the worker's stderr kept for messages, and its arrays
# (uncompressed, as np.savez writes them, so their size is bounded by the files' real sizes).
MAX_REPLY_LINE_BYTES = 4 << 20
STDERR_TAIL_BYTES = 64 << 10
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the bert_multi package


class DamagedFile(Exception):
    """An array file between a worker and its caller that is not what ``np.savez`` writes (its reader
    turns it into a ``RemoteFailure`` naming the worker)."""


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` the worker or its caller wrote, in order: a regular file, read like any
    other file (no pickle, no compression, every size checked before it is allocated)."""
    with open_regular(path, "array file", DamagedFile) as file:
        archive = NpzReader(file, path, DamagedFile)
        return {name: archive.read(name, archive.header(name)) for name in archive.names}


class RemoteFailure(WorkerFailed):
    """A worker of another environment failed: it raised what is not one of bert_multi's own exceptions
    (``RemoteBug``), died, hung past its deadline, or sent a reply that does not check out."""


class RemoteBug(RemoteFailure):
    """An exception of no bert_multi class raised in a worker: a bug, as it would be in this process. Its
    text is one line; the worker's traceback is ``remote_traceback``, for the report of the bug."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


def worker_timeout() -> float | None:
    """The longest one request may take, from ``BERT_MULTI_WORKER_TIMEOUT`` (seconds, or "none")."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UsageError(f"{TIMEOUT_VARIABLE}={text!r}: expected a number of seconds above 0, or 'none'")
    return value


def worker_environment() -> dict[str, str]:
    """The environment of a process run in another environment on this one's behalf: this source tree
    first on its path, and marked as such (``WORKER_VARIABLE``: it never sends work on again)."""
    path = os.pathsep.join([str(SOURCE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, WORKER_VARIABLE: "1"}


class Worker:
    """One worker process: a JSON request per line on its stdin, a JSON reply per line on its stdout
    (``{"alive": true}`` lines while it works), arrays in files of a private directory. Every exchange is
    bounded: in time (``worker_timeout``, and ``SILENCE_S`` without a sign of life), in size (a reply
    line, the arrays its files hold, the end of its stderr kept for messages) and in kind (regular
    files). A worker that fails any bound, dies, or is interrupted (Ctrl-C) is stopped and its directory
    removed; every later request is refused at once, saying why."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.timeout = worker_timeout()
        # Removed by ``stop`` (``_remove``); at exit, what is left there is removed quietly.
        self.directory = tempfile.TemporaryDirectory(prefix="bert_multi-worker-", ignore_cleanup_errors=True)
        self.requests = itertools.count(1)  # each request's number, which its reply must carry
        heartbeat = str(HEARTBEAT_S if self.timeout is None else min(HEARTBEAT_S, self.timeout / 4))
        self.process = subprocess.Popen(
            [str(python), "-m", "bert_multi.backend.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**worker_environment(), HEARTBEAT_VARIABLE: heartbeat},
            process_group=0,  # a group of its own, so that whatever it starts is stopped with it (``stop``)
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self.stopped: str | None = None  # why the worker was stopped, once it is
        self.pending = b""  # what the worker wrote past the last reply line read
        self.stderr_tail: collections.deque[bytes] = collections.deque()
        self.stderr_reader = threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True)
        self.stderr_reader.start()
        # One request at a time (``busy``); a request made in the background lets those waiting go first.
        self.busy, self.waiting, self.turn = False, 0, threading.Condition()
        self.files = itertools.count()
        atexit.register(self.close)

    def path(self, kind: str) -> Path:
        """A new file name in the worker's directory."""
        return Path(self.directory.name) / f"{kind}-{next(self.files)}.npz"

    def exchange(
        self,
        op: str,
        sent: dict[str, dict[str, np.ndarray]],
        received: bool,
        background: bool = False,
        **arguments: Any,
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``call`` with arrays: each of ``sent`` written to a file named by that argument, and, if
        ``received``, the arrays the worker writes to the file named by ``out``; the files removed after."""
        paths = {argument: self.path(argument) for argument in sent}
        if received:
            paths["out"] = self.path("out")
        try:
            for argument, arrays in sent.items():
                np.savez(paths[argument], **arrays)
            files = {argument: str(path) for argument, path in paths.items()}
            reply = self.call(op, background=background, **arguments, **files)
            if not received:
                return reply, {}
            try:
                return reply, read_arrays(paths["out"])
            except DamagedFile as error:
                raise self.failure(f"its reply to {op!r} is damaged: {error}") from None
        finally:
            for path in paths.values():
                path.unlink(missing_ok=True)

    def call(self, op: str, background: bool = False, **arguments: Any) -> dict[str, Any]:
        """Send one request and return its reply; the worker's exception raised here as the same
        bert_multi exception, or a ``RemoteFailure`` with its traceback. A request made in the
        ``background`` (compiling ahead) lets every other waiting go first: it fills the worker's idle time."""
        with self.turn_for(background):
            if self.stopped:
                raise RemoteFailure(f"the worker ({self.python}) was stopped: {self.stopped}")
            number = next(self.requests)
            try:
                reply = self._request(op, json.dumps({"op": op, "id": number, **arguments}).encode() + b"\n")
            except BaseException as error:  # Ctrl-C or a failure: the worker's state is unknown, so it goes
                self.stop(f"interrupted while running {op!r}" if isinstance(error, KeyboardInterrupt) else str(error))
                raise
        if reply.get("id") != number:  # a line sent ahead, or left over: the channel is out of step
            raise self.failure(f"its reply to {op!r} (request {number}) answers another: {str(reply)[:200]}")
        if reply.get("ok") is True:
            return reply
        if reply.get("ok") is False:
            raise _exception(self.python, reply)
        raise self.failure(f"its reply to {op!r} is not one: {str(reply)[:200]}")

    @contextlib.contextmanager
    def turn_for(self, background: bool) -> Iterator[None]:
        """The worker to this thread's request alone, once no request it must let go first is waiting."""
        with self.turn:
            if background:
                waiting.wait_until(self.turn, lambda: not self.busy and not self.waiting)
            else:
                self.waiting += 1
                try:
                    waiting.wait_until(self.turn, lambda: not self.busy)
                finally:  # even interrupted: a request in the background must not wait for it
                    self.waiting -= 1
            self.busy = True
        try:
            yield
        finally:
            with self.turn:
                self.busy = False
                self.turn.notify_all()

    def field(self, reply: dict[str, Any], op: str, name: str, valid: Callable[[Any], bool], expected: str) -> Any:
        """The reply's ``name``, where ``valid`` holds of it; else the worker failed (it is stopped)."""
        value = reply.get(name)
        if not valid(value):
            raise self.failure(f"its reply to {op!r} holds {name} {str(value)[:100]}; expected {expected}")
        return value

    def failure(self, what: str) -> RemoteFailure:
        """A ``RemoteFailure`` naming the worker; the worker, no longer trusted, is stopped."""
        error = RemoteFailure(f"the worker ({self.python}) failed: {what}")
        self.stop(what)
        return error

    def _request(self, op: str, line: bytes) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(line)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RemoteFailure(self._ended()) from None
        started = last_sign = time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in self.pending:
                    text, self.pending = self.pending.split(b"\n", 1)
                    try:
                        message = json.loads(text)
                    except (ValueError, RecursionError):  # RecursionError: a line nested beyond Python's stack
                        raise RemoteFailure(
                            f"the worker ({self.python}) sent a line that is not JSON in reply to {op!r}: "
                            f"{text[:200]!r}"
                        ) from None
                    if not isinstance(message, dict):
                        raise RemoteFailure(f"the worker ({self.python}) sent {str(message)[:200]} in reply to {op!r}")
                    if message.get("alive") is not True:
                        return message
                    last_sign = time.monotonic()
                if len(self.pending) > MAX_REPLY_LINE_BYTES:
                    raise RemoteFailure(
                        f"the worker ({self.python}) sent a reply to {op!r} of over {MAX_REPLY_LINE_BYTES} bytes"
                    )
                now = time.monotonic()
                waits = [last_sign + SILENCE_S - now]
                if self.timeout is not None:
                    waits.append(started + self.timeout - now)
                if min(waits) <= 0:
                    raise RemoteFailure(self._overdue(op, now - last_sign))
                if selector.select(min(*waits, ALIVE_CHECK_S)):
                    chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                    if not chunk:
                        raise RemoteFailure(self._ended())
                    self.pending += chunk
                elif self.has_ended():  # though a process it started may hold its pipes open
                    raise RemoteFailure(self._ended())

    def _overdue(self, op: str, silent: float) -> str:
        if silent >= SILENCE_S:
            return f"the worker ({self.python}) said nothing for {silent:.0f} s while running {op!r}; it was stopped"
        return (
            f"the worker ({self.python}) took over {self.timeout:g} s to run {op!r} ({TIMEOUT_VARIABLE}); "
            "it was stopped"
        )

    def _ended(self) -> str:
        if self._ends_within(5):
            self._reap()  # with what it left running, which would hold its stderr open
        self.stderr_reader.join(timeout=5)
        return f"the worker ({self.python}) ended: {self._log_tail()}"

    def _drain(self, stream: Any) -> None:
        """Keep the last ``STDERR_TAIL_BYTES`` the worker writes to stderr (it may write without end)."""
        kept = 0
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            self.stderr_tail.append(chunk)
            kept += len(chunk)
            while kept - len(self.stderr_tail[0]) >= STDERR_TAIL_BYTES:
                kept -= len(self.stderr_tail.popleft())

    def drop(self, model: int) -> None:
        """Forget a model the worker holds (its memory is freed there)."""
        if not self.has_ended() and not self.stopped:
            try:
                self.call("drop", model=model)
            except RemoteFailure:
                pass

    def stop(self, why: str) -> None:
        """End the worker now and remove its directory; later requests are refused, saying ``why``."""
        self.stopped = self.stopped or why
        self._reap()
        _remove(Path(self.directory.name))

    def has_ended(self) -> bool:
        """Whether the worker process has ended, leaving it unreaped: until it is reaped, its number is
        its own, and so is the number of its process group."""
        if self.process.returncode is not None:
            return True
        if not hasattr(os, "waitid"):  # a system without it: reaped as it is found ended
            return self.process.poll() is not None
        try:
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _ends_within(self, seconds: float) -> bool:
        """Whether the worker ends within ``seconds`` (left unreaped, as ``has_ended`` leaves it)."""
        deadline = time.monotonic() + seconds
        while not self.has_ended():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _reap(self) -> None:
        """Stop the worker and every process it started in its group (before it is reaped, while the group's
        number cannot be another's), then reap it."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        """End the worker as it ends by itself (its requests end), stopping it if it has not within 10 s;
        at once if another thread's request is under way (its caller is ending): no one will read the reply."""
        if not self.has_ended() and not self.busy:
            assert self.process.stdin is not None
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # end of requests: the worker exits
            self._ends_within(10)
        self.stop("it was closed")

    def _log_tail(self) -> str:
        """The last lines of the worker's stderr, each cut short, or how it ended."""
        text = b"".join(self.stderr_tail)[-STDERR_TAIL_BYTES:].decode(errors="replace")
        lines = [line if len(line) <= 300 else line[:300] + " ..." for line in text.strip().splitlines()[-3:]]
        return " / ".join(lines) or f"exit code {self.process.returncode}, nothing on stderr"


def _exception(python: Path, reply: dict[str, Any]) -> Exception:
    """The exception a worker's error reply stands for: bert_multi's own class where it is one, else a
    ``RemoteBug`` of one line holding the worker's traceback."""
    kind, message = str(reply.get("type"))[:100], str(reply.get("message"))
    said = errors.bounded_text(message.splitlines()[0] if message.strip() else "")
    return errors.carried(kind, message) or RemoteBug(
        f"the worker ({python}) raised {kind}: {said}", errors.bounded_text(str(reply.get("traceback")), lines=True)
    )


def _remove(directory: Path) -> None:
    """The worker's directory gone, whatever the worker left there: a link or a file in its place is
    removed as itself (never followed), and what cannot be removed is left, never raised at the end."""
    with contextlib.suppress(OSError):
        if directory.is_symlink() or not directory.is_dir():
            directory.unlink()
        else:
            shutil.rmtree(directory, ignore_errors=True)
