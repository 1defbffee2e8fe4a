"""Where compiled code is kept between runs, so that a framework compiles a model's shapes once, not once a
run: JAX's persistent compilation cache and Inductor's (``torch.compile``), each in a directory of the
user's cache (``$XDG_CACHE_HOME/bert_multi``, else ``~/.cache/bert_multi``).

``BERT_MULTI_CACHE_DIR`` names another directory, or turns the cache off (``none``; the command line's
``--no-cache`` sets it, so the processes a command starts see it too).

A cache changes how long a run takes, never what it computes. JAX's entries are kept by
``SealedEntries``: each is sealed with its key and digest and checked whole before it is used, so an entry
that is damaged, cut short, copied from another program, oversized or not a regular file is ignored (said
once) and compiled afresh, never run and never waited on; a directory another user may write to is not used.
JAX's cache holds at most ``MAX_CACHE_BYTES``, least recently used out first, under a file lock, so
processes may share it. Inductor's entries are kept as Inductor keeps them. ``bert-multi lessons`` keeps
what each of the guide's samples printed the same way, by its code and the environment that ran it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CACHE_VARIABLE = "BERT_MULTI_CACHE_DIR"
OFF = "none"
MAX_CACHE_BYTES = 1 << 30


def cache_root() -> Path | None:
    """The directory holding every framework's cache, or None when caching is off."""
    configured = os.environ.get(CACHE_VARIABLE, "").strip()
    if configured.lower() == OFF:
        return None
    # ``~user`` expanded as a shell does it: one that names no user is left as written (Path.expanduser raises).
    if configured:
        return Path(os.path.expanduser(configured)).absolute()
    return Path(os.path.expanduser(os.environ.get("XDG_CACHE_HOME") or "~/.cache")).absolute() / "bert_multi"


def cache_for(framework: str) -> Path | None:
    """The directory where ``framework`` ("jax", "torch") keeps its compiled code, or None when off."""
    root = cache_root()
    return None if root is None else root / framework


def turn_off() -> None:
    """No cache for this process and those it starts (``--no-cache``)."""
    os.environ[CACHE_VARIABLE] = OFF


def described(directory: object) -> str:
    """A cache directory as a run's report states it."""
    return "off" if not directory else str(directory)


class EntryRefused(ValueError):
    """A cache entry that is not the sealed entry of the key asked for: damaged, replaced, oversized or not
    a regular file. It is ignored, and the program compiled afresh."""


class NoEntry(EntryRefused):
    """Nothing is kept for the key: a cache miss, the one refusal that is not worth a word."""


ENTRY_SUFFIX = ".sealed"
MAX_ENTRY_BYTES = 256 << 20  # a BERT-base executable is a few MB; a bigger entry is not one of ours
LOCK_TIMEOUT_SECONDS = 10.0
STALE_WRITE_SECONDS = 3600.0
_SEAL = b"bert_multi compiled code\n"
_DIGEST_BYTES = 32


def seal(key: str, value: bytes) -> bytes:
    """An entry as it is written: the seal, its key, the value's SHA-256 and length, then the value."""
    named = key.encode()
    return b"".join(
        (
            _SEAL,
            len(named).to_bytes(2, "little"),
            named,
            hashlib.sha256(value).digest(),
            len(value).to_bytes(8, "little"),
            value,
        )
    )


def unseal(data: bytes, key: str) -> bytes:
    """The value of an entry read whole, if it is the sealed entry of ``key``; else ``EntryRefused``."""
    if not data.startswith(_SEAL):
        raise EntryRefused("it is not a sealed bert_multi entry")
    at = len(_SEAL)
    if len(data) < at + 2:
        raise EntryRefused("it is cut short")
    length = int.from_bytes(data[at : at + 2], "little")
    named = data[at + 2 : at + 2 + length]
    at += 2 + length
    if len(data) < at + _DIGEST_BYTES + 8:
        raise EntryRefused("it is cut short")
    if named != key.encode():
        raise EntryRefused("it is the entry of another program")
    digest, size = (
        data[at : at + _DIGEST_BYTES],
        int.from_bytes(data[at + _DIGEST_BYTES : at + _DIGEST_BYTES + 8], "little"),
    )
    value = data[at + _DIGEST_BYTES + 8 :]
    if len(value) != size:
        raise EntryRefused(f"it holds {len(value)} bytes where its seal says {size}")
    if hashlib.sha256(value).digest() != digest:
        raise EntryRefused("its bytes do not match its seal")
    return value


def read_entry(path: str | Path, key: str, *, max_bytes: int = MAX_ENTRY_BYTES) -> bytes:
    """The value of the entry at ``path`` for ``key``: a regular file (never followed through a link, never
    a FIFO or device waited on), at most ``max_bytes``, sealed for ``key``; else ``EntryRefused``
    (``NoEntry`` when there is none)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NoEntry("there is no such entry") from None
    except OSError as error:
        raise EntryRefused(f"cannot open it ({error.strerror or error})") from None
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise EntryRefused("it is a directory" if stat.S_ISDIR(status.st_mode) else "it is not a regular file")
    with os.fdopen(descriptor, "rb") as file:
        if status.st_size > max_bytes:
            raise EntryRefused(f"it is {status.st_size} bytes, over the {max_bytes} an entry may hold")
        try:
            data = file.read(status.st_size + 1)
        except OSError as error:
            raise EntryRefused(f"it cannot be read ({error.strerror or error})") from None
        if len(data) != status.st_size:
            raise EntryRefused("it changed while it was read")
        value = unseal(data, key)
        with contextlib.suppress(OSError):  # its last use, for least-recently-used eviction
            os.utime(descriptor)
    return value


class SealedEntries:
    """A framework's compiled programs, one sealed file per key (``seal``), in a directory of the user's own.

    An entry read is checked whole before it is used (``read_entry``): one that is damaged, cut short,
    copied from another key, oversized, or not a regular file is ignored, said once, and replaced when the
    program is compiled again; nothing in the directory is ever waited on but its lock, and that for at
    most ``LOCK_TIMEOUT_SECONDS``. A directory another user owns or may write to is not used at all, since
    whoever writes an entry chooses what runs. At most ``max_bytes`` in all, least recently used out first,
    under a lock shared by every process using the directory."""

    def __init__(
        self,
        directory: str | Path,
        max_bytes: int = MAX_CACHE_BYTES,
        kept: str = "compilation cache",
        afresh: str = "compiling afresh",
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.kept, self.afresh = kept, afresh  # what the entries are, and what is done without one: for messages
        self._said: set[str] = set()
        self.usable = self._check_directory()

    def get(self, key: str) -> bytes | None:
        """The value kept for ``key``, or None (nothing kept, or an entry that is ignored)."""
        if not self.usable:
            return None
        path = self._path(key)
        try:
            with self._locked():
                return read_entry(path, key, max_bytes=min(self.max_bytes, MAX_ENTRY_BYTES))
        except NoEntry:
            return None
        except (EntryRefused, OSError, TimeoutError) as error:
            self._say(f"ignored the entry {path}: {_reason(error)}; {self.afresh}", kind=_reason(error))
            return None

    def put(self, key: str, value: bytes) -> None:
        """Keep ``value`` for ``key``, replacing whatever is there, making room by evicting the least
        recently used. Written whole or not at all: a failed write leaves no entry behind."""
        if not self.usable:
            return
        entry = seal(key, value)
        if len(entry) > min(self.max_bytes, MAX_ENTRY_BYTES):
            self._say(f"an entry of {len(entry)} bytes is over what an entry may hold; not kept")
            return
        path = self._path(key)
        # Not safe_files.replace_file: that follows a link at the entry's name and streams into a FIFO
        # there, where a cache must neither write elsewhere nor wait.
        try:
            with self._locked():
                self._evict(len(entry))
                descriptor, written = tempfile.mkstemp(dir=self.directory, prefix=".writing-")
                try:
                    with os.fdopen(descriptor, "wb") as file:
                        file.write(entry)
                    os.replace(written, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(written)
                    raise
        except (EntryRefused, OSError, TimeoutError) as error:
            self._say(f"could not keep an entry in {self.directory}: {_reason(error)}")

    def _path(self, key: str) -> Path:
        """The entry's file: the key as far as it is a plain file name, and its digest (so any key is safe)."""
        plain = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:80].lstrip(".")
        return self.directory / f"{plain}-{hashlib.sha256(key.encode()).hexdigest()[:16]}{ENTRY_SUFFIX}"

    def _check_directory(self) -> bool:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            status = os.stat(self.directory)
        except OSError as error:
            self._say(f"cannot use {self.directory}: {_reason(error)}; {self.afresh}")
            return False
        if not stat.S_ISDIR(status.st_mode):
            self._say(f"{self.directory} is not a directory; {self.afresh}")
            return False
        if status.st_uid != os.geteuid() or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            self._say(
                f"{self.directory} is not used: another user owns it or may write to it (mode "
                f"{stat.S_IMODE(status.st_mode):o}), and whoever writes an entry chooses what is used; {self.afresh}"
            )
            return False
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        descriptor = os.open(
            self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600
        )
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise EntryRefused("its lock is not a regular file")
            deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"its lock was held for over {LOCK_TIMEOUT_SECONDS:g} s") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(descriptor)

    def _evict(self, room: int) -> None:
        """Remove the least recently used entries until ``room`` more bytes fit."""
        entries = []
        for item in os.scandir(self.directory):
            if not item.is_file(follow_symlinks=False):
                continue
            status = item.stat(follow_symlinks=False)
            if item.name.endswith(ENTRY_SUFFIX):
                entries.append((status.st_mtime_ns, status.st_size, item.path))
            elif item.name.startswith(".writing-") and time.time() - status.st_mtime > STALE_WRITE_SECONDS:
                with contextlib.suppress(FileNotFoundError):  # left by a process killed while it wrote
                    os.unlink(item.path)
        entries.sort()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total + room <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size

    def _say(self, what: str, kind: str | None = None) -> None:
        """One line on standard error, the first time each ``kind`` of thing (else ``what``) happens here."""
        if (kind or what) not in self._said:
            self._said.add(kind or what)
            print(f"bert_multi: {self.kept}: {what}.", file=sys.stderr)


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)


def sealed_cache(interface: type) -> type:
    """A framework's cache interface (a class whose instances answer ``get(key)`` and ``put(key, value)``,
    as JAX's ``CacheInterface``) kept by ``SealedEntries``, made for a directory."""

    class Sealed(interface):  # the framework's class, given at run time
        def __init__(self, directory: str) -> None:
            self._path = Path(directory)
            self.entries = SealedEntries(directory)

        def get(self, key: str) -> bytes | None:
            return self.entries.get(key)

        def put(self, key: str, value: bytes) -> None:
            self.entries.put(key, value)

    return Sealed
