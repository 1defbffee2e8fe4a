"""Files are hostile until checked: opening them safely, reading .npz archives with every declared size
checked before anything is allocated, and writing atomically.

Every reader here costs time and memory in proportion to the file's real size, whatever its headers
claim, and reports anything malformed as the caller's error class (``WeightsError`` for weights,
``InputError`` for inputs), naming the file. Nothing here can unpickle.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import io
import math
import os
import re
import secrets
import socket
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
MXNET_LIST_MAGIC = (0x112).to_bytes(8, "little")  # kMXAPINDArrayListMagic, the start of a Gluon .params file
MAX_NPY_HEADER_BYTES = 10_000  # NumPy's own limit for headers it reads safely
READ_CHUNK_BYTES = 1 << 22
LOCAL_HEADER = struct.Struct("<4s22xHH")  # a zip member's local header: signature, ..., name and extra lengths


def stored_data_start(file: BinaryIO, info: zipfile.ZipInfo) -> int:
    """Where a zip member's bytes start in the zip's ``file``: past its local header, whose name and extra
    lengths only it holds. ``ValueError`` where the directory points at no local header."""
    file.seek(info.header_offset)
    header = file.read(LOCAL_HEADER.size).ljust(LOCAL_HEADER.size)
    signature, name_length, extra_length = LOCAL_HEADER.unpack(header)
    if signature != ZIP_MAGIC:
        raise ValueError("no local zip header where the archive's directory points")
    return info.header_offset + LOCAL_HEADER.size + name_length + extra_length


def describe_format(head: bytes) -> str:
    """What a file that starts with ``head`` (its first 8 bytes or more) looks like, for error messages."""
    if head.startswith(MXNET_LIST_MAGIC):
        return "an MXNet NDArray file (Gluon .params)"
    if head.startswith(NPY_MAGIC):
        return "a single NumPy .npy array"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return (
            "an HDF5 file (Keras's .h5 weights: transformers 4's TensorFlow BERT's are read alone too, a "
            "KerasHub preset's model.weights.h5 in its directory)"
        )
    if head.startswith(ZIP_MAGIC):
        return "a zip archive (a NumPy .npz, a PyTorch checkpoint or a .keras file)"
    if head.startswith(b"\x80") and len(head) > 1 and head[1] <= 5:
        return "a Python pickle"
    return "not a format bert_multi reads"


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, what: str, error: type[Exception]) -> Iterator[io.BufferedReader]:
    """Open ``path`` for reading, refusing anything that is not a regular file (a FIFO would block
    forever, a device never end) without blocking on it. Failures are ``error``s naming the file."""
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except (OSError, ValueError) as failure:  # ValueError: a NUL byte in the path
        raise error(f"{path}: cannot open the {what}: {reason(failure)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
            raise error(f"{path}: is {kind}; expected a {what}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        yield file


def reason(failure: BaseException, limit: int = 300) -> str:
    """An exception as one short readable phrase: a plain ValueError's message, OSError's reason
    without the repeated path, otherwise the type and message."""
    if isinstance(failure, OSError) and failure.strerror:
        text = failure.strerror
    elif type(failure) is ValueError:
        text = str(failure)
    else:
        text = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
    return text if len(text) <= limit else text[:limit] + " ..."


def file_size(file: BinaryIO) -> int:
    return os.fstat(file.fileno()).st_size


class NpyHeader(NamedTuple):
    """What a .npy header declares: the array's shape and dtype, and where its data starts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def check_shape(shape: tuple, dtype: np.dtype) -> None:
    """``ValueError`` unless NumPy can hold an array of ``shape``: non-negative ints whose product, zeros
    aside, fits in an address (a header may pair a zero with dimensions of 2**62)."""
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise ValueError(f"an invalid shape {shape}")
    if math.prod(max(n, 1) for n in shape) * max(dtype.itemsize, 1) > np.iinfo(np.intp).max:
        raise ValueError(f"a shape {shape} too large for any array")


def size_field(value: object, what: str, low: int = 0, high: int = 1 << 40) -> int:
    """``value`` as a size or a count read from a file: an int in [``low``, ``high``]. A bool, a float
    (Infinity and 1.5 among them) or a string is not a size, whatever it would convert to; ``ValueError``
    naming ``what`` otherwise."""
    if type(value) is not int:
        raise ValueError(f"{what} is {value!r:.40}, not a whole number")
    if not low <= value <= high:
        raise ValueError(f"{what} is {value}, outside [{low}, {high}]")
    return value


def parse_npy_header(read: Callable[[int], bytes]) -> NpyHeader:
    """Parse a .npy header from ``read(n) -> bytes``, bounded in size; raise ``ValueError`` if malformed."""
    prefix = read(len(NPY_MAGIC) + 2)
    if len(prefix) < len(NPY_MAGIC) + 2 or not prefix.startswith(NPY_MAGIC):
        raise ValueError("not .npy data (no NumPy magic)")
    version = tuple(prefix[len(NPY_MAGIC) :])
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy format version {version}, expected (1, 0) or (2, 0)")
    length_bytes = read(2 if version == (1, 0) else 4)
    length = int.from_bytes(length_bytes, "little")
    if len(length_bytes) not in (2, 4) or length > MAX_NPY_HEADER_BYTES:
        raise ValueError(f"a .npy header of {length} bytes, more than {MAX_NPY_HEADER_BYTES}")
    header = read(length)
    if len(header) != length:
        raise ValueError("truncated inside its .npy header")
    parse = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    try:
        shape, fortran_order, dtype = parse(io.BytesIO(length_bytes + header))
    except Exception as failure:  # noqa: BLE001 - NumPy's parser raises many types (TokenError, SyntaxError ...)
        raise ValueError(f"a malformed .npy header ({reason(failure, 120)})") from None
    if dtype.hasobject:
        raise ValueError(f"it holds Python objects ({dtype}), which only pickle could read; refused")
    check_shape(tuple(shape), dtype)
    return NpyHeader(tuple(shape), dtype, bool(fortran_order), len(prefix) + len(length_bytes) + length)


class NpzReader:
    """An .npz archive read member by member, each member's declared shape and size checked before its
    data is read, so that no header can make the reader allocate more than the file holds.

    Members must be stored uncompressed (as ``np.savez`` writes them), which bounds their data by the
    file's size; with ``max_compressed_bytes`` deflated members are accepted too (``np.savez_compressed``)
    as long as together they expand to no more than that. ``describe(name)`` names a member in errors.
    """

    def __init__(
        self,
        file: io.BufferedReader,
        path: str | os.PathLike,
        error: type[Exception],
        describe: Callable[[str], str] = lambda name: f"array {name!r}",
        max_compressed_bytes: int | None = None,
    ) -> None:
        self.path, self.error, self.describe = path, error, describe
        archive_bytes = file_size(file)
        allow_compressed = max_compressed_bytes is not None
        head = file.read(len(NPY_MAGIC))
        file.seek(0)
        if head.startswith(NPY_MAGIC):
            raise error(f"{path}: holds a single array, not an .npz archive of named arrays")
        try:
            self._file = file
            self._zip = zipfile.ZipFile(file)
            infos = self._zip.infolist()
        except Exception as failure:  # noqa: BLE001 - zipfile raises many types on hostile input
            raise error(f"{path}: not a readable .npz file (truncated or corrupt?): {reason(failure)}") from None
        self._infos: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = info.filename
            if not name.endswith(".npy"):
                raise error(f"{path}: archive member {name!r} is not a .npy array")
            if name[:-4] in self._infos:
                raise error(f"{path}: archive member {name!r} appears twice")
            if info.flag_bits & 0x1:
                raise error(f"{path}: archive member {name!r} is encrypted")
            if info.compress_type != zipfile.ZIP_STORED and not (
                allow_compressed and info.compress_type == zipfile.ZIP_DEFLATED
            ):
                expected = "stored or deflated" if allow_compressed else "stored uncompressed, as np.savez writes it"
                raise error(
                    f"{path}: archive member {name!r} uses compression method {info.compress_type}; expected {expected}"
                )
            if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
                raise error(f"{path}: archive member {name!r} is stored but declares two different sizes")
            if info.compress_size > archive_bytes:
                raise error(f"{path}: archive member {name!r} declares more bytes than the whole file holds")
            self._infos[name[:-4]] = info
        expanded = sum(info.file_size for info in infos)
        limit = archive_bytes if max_compressed_bytes is None else max_compressed_bytes
        if expanded > limit:
            raise error(f"{path}: the archive's members declare {expanded} bytes in all, more than the {limit} allowed")

    @property
    def names(self) -> list[str]:
        """Member names without '.npy', in archive order."""
        return list(self._infos)

    def __contains__(self, name: str) -> bool:
        return name in self._infos

    def _fail(self, name: str, failure: BaseException) -> Exception:
        return self.error(f"{self.path}: {self.describe(name)} is unreadable: {reason(failure)}")

    def header(self, name: str) -> NpyHeader:
        """The member's .npy header, checked against the member's declared size."""
        info = self._infos[name]
        try:
            with self._zip.open(info) as member:
                header = parse_npy_header(member.read)
        except Exception as failure:  # noqa: BLE001
            raise self._fail(name, failure) from None
        if header.data_offset + header.nbytes != info.file_size:
            raise self.error(
                f"{self.path}: {self.describe(name)} is unreadable: its header declares {header.nbytes} bytes of "
                f"{header.dtype} {header.shape}, but the member holds {info.file_size - header.data_offset}"
            )
        return header

    def read(self, name: str, header: NpyHeader, check_crc: bool = True) -> np.ndarray:
        """The member's array (writable, in the file's byte order), read in bounded chunks. Without
        ``check_crc`` a stored member's CRC-32 is not computed: for a caller that checks a stronger digest of
        the data itself (the canonical weight file's SHA-256), which the CRC would only repeat."""
        info = self._infos[name]
        array = np.empty(header.nbytes, dtype=np.uint8)  # not bytearray(n), which writes zeros first
        try:
            if info.compress_type == zipfile.ZIP_STORED:
                self._read_stored(info, header, array.data, check_crc)
            else:
                self._read_deflated(info, header, array.data)
        except Exception as failure:  # noqa: BLE001 - includes zipfile's CRC and decompression errors
            raise self._fail(name, failure) from None
        return array.view(header.dtype).reshape(header.shape, order="F" if header.fortran_order else "C")

    def _read_stored(self, info: zipfile.ZipInfo, header: NpyHeader, buffer: memoryview, check_crc: bool) -> None:
        # Straight from the file into the array, one copy (zipfile's reader makes two), with the
        # member's CRC-32 checked as zipfile would, if asked.
        self._file.seek(stored_data_start(self._file, info))
        npy_header = self._file.read(header.data_offset)
        crc = zlib.crc32(npy_header)
        filled = 0
        while filled < len(buffer):
            count = self._file.readinto(buffer[filled : filled + min(READ_CHUNK_BYTES, len(buffer) - filled)])
            if not count:
                raise EOFError(f"the data ends after {filled} of {len(buffer)} bytes")
            if check_crc:
                crc = zlib.crc32(buffer[filled : filled + count], crc)
            filled += count
        if len(npy_header) != header.data_offset or (check_crc and crc != info.CRC):
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")

    def _read_deflated(self, info: zipfile.ZipInfo, header: NpyHeader, buffer: memoryview) -> None:
        with self._zip.open(info) as member:
            member.read(header.data_offset)
            filled = 0
            while filled < len(buffer):
                chunk = member.read(min(READ_CHUNK_BYTES, len(buffer) - filled))
                if not chunk:
                    raise EOFError(f"the data ends after {filled} of {len(buffer)} bytes")
                buffer[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
            if member.read(1):
                raise ValueError("the data runs past its declared size")


# --- Writing --------------------------------------------------------------------------------------------

_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _temporary_name(target: Path) -> str:
    # The host and process that write it are in the name, so a later save can tell a leftover of a
    # writer that died (kill -9 leaves it behind) from the file of a writer still at work.
    return f".{target.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _remove_leftovers(target: Path) -> None:
    """Delete temporary files of ``target`` left by writers on this host that no longer run."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{re.escape(_HOST)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match or int(match[1]) == os.getpid():
            continue
        try:
            os.kill(int(match[1]), 0)
        except ProcessLookupError:  # its writer is gone: the file can never be completed
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        except (PermissionError, OverflowError, OSError):
            continue  # alive under another user, or not a pid at all: leave it


@contextlib.contextmanager
def _named_when_done(fd: int, target: Path) -> Iterator[Path]:
    """Yield a path that writes the unnamed file ``fd``; once the writer is done, sync it, give it a name
    beside ``target`` and rename that onto ``target`` (``_rename_when_due``). The descriptor is closed either
    way."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        yield Path(f"/proc/self/fd/{fd}")
        os.fsync(fd)
        tmp = target.parent / _temporary_name(target)
        # Its first name, now that it is complete. A directory descriptor makes Python call linkat
        # (following the /proc link to the file), where it would otherwise link the /proc link itself.
        directory = os.open(target.parent, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.link(f"/proc/self/fd/{fd}", tmp.name, dst_dir_fd=directory, follow_symlinks=True)
        finally:
            os.close(directory)
    finally:
        os.close(fd)
    _rename_when_due(tmp, target)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; some filesystems cannot, which is not an error."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# The complete files of a ``written_together`` block, (temporary name, target), renamed when it ends.
_TOGETHER: contextvars.ContextVar[list[tuple[Path, Path]] | None] = contextvars.ContextVar("together", default=None)


def _rename_when_due(tmp: Path, target: Path) -> None:
    """Rename the complete, synced ``tmp`` onto ``target`` now, or when the ``written_together`` block
    around this write ends."""
    together = _TOGETHER.get()
    if together is not None:
        together.append((tmp, target))
        return
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


@contextlib.contextmanager
def written_together() -> Iterator[None]:
    """The files that ``atomic_path`` (and what uses it) writes inside the block replace their targets
    together, when the block ends: each is complete and synced under its temporary name first, so whatever
    fails in the block (the second file's write, a full disk, an interrupt) leaves every earlier file as it
    was. Only a crash in the instant of the renames themselves can leave some replaced and the rest not.
    A block inside another belongs to the outer one."""
    if _TOGETHER.get() is not None:
        yield
        return
    together: list[tuple[Path, Path]] = []
    token = _TOGETHER.set(together)
    try:
        yield
    except BaseException:
        for tmp, _ in together:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        _TOGETHER.reset(token)
    for done, (tmp, target) in enumerate(together):
        try:
            os.replace(tmp, target)
        except BaseException:
            for left, _ in together[done:]:
                left.unlink(missing_ok=True)
            raise
    for directory in dict.fromkeys(target.parent for _, target in together):
        _fsync_directory(directory)


UNNAMED_WRITES = True  # write into an unnamed file where the system has them (False: always named)


def unnamed_file(directory: Path) -> int | None:
    """A file with no name in ``directory`` (Linux's ``O_TMPFILE``), open for writing through
    ``/proc/self/fd``; None where the system or the filesystem has none."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not UNNAMED_WRITES or not os.path.isdir("/proc/self/fd"):
        return None
    try:  # mode 0o666: the umask decides, as for any new file
        return os.open(directory, flag | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError:  # the filesystem cannot (EOPNOTSUPP), or the kernel predates it (EISDIR)
        return None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, named: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on failure delete it.

    Whatever goes wrong before the rename, an earlier file at ``path`` is left as it was. The new
    file gets the old file's permissions (or the umask's, for a new file), a symbolic link at ``path``
    keeps pointing where it did (its target is replaced), and the file and the rename are fsynced,
    so a save that returned survives a power loss. Where the filesystem has unnamed files, the new file
    has no name until it is complete and synced, so a writer killed meanwhile leaves nothing; elsewhere
    (and for the instant between naming and renaming) leftovers of killed writers are removed by the
    next save of the same file. ``named``: a named file always, for a writer in another process. Inside
    ``written_together`` the rename waits for the block's end. A failed write (a full disk, a file-size
    limit) is an ``OSError`` naming ``path``.
    """
    try:
        with _atomic_path(path, named) as tmp:
            yield tmp
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, f"{error.strerror}, writing it (any earlier file is kept)", str(path)) from error


def replace_file(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """The file at ``path`` replaced whole, or not at all (``atomic_path``), by what ``write`` writes."""
    with atomic_path(path) as written, open(written, "wb") as file:
        write(file)


def replace_arrays(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """The file at ``path`` replaced whole, or not at all, by an ``.npz`` of ``arrays`` (``np.savez``)."""
    replace_file(path, lambda file: np.savez(file, **arrays))


def replace_text(path: str | os.PathLike, text: str) -> None:
    """The file at ``path`` replaced whole, or not at all, by ``text`` (UTF-8)."""
    replace_file(path, lambda file: file.write(text.encode("utf-8")))


@contextlib.contextmanager
def _atomic_path(path: str | os.PathLike, named: bool) -> Iterator[Path]:
    target = Path(os.path.realpath(path))
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory; expected a file name to write", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        # A device or a FIFO (/dev/null, /dev/stdout, a pipe) is written to as a stream, never replaced.
        yield target
        return
    _remove_leftovers(target)
    unnamed = None if named else unnamed_file(target.parent)
    if unnamed is not None:
        with _named_when_done(unnamed, target) as tmp:
            yield tmp
        return
    tmp = target.parent / _temporary_name(target)
    # Mode 0o666 lets the umask decide, as for any new file (mkstemp would force 0o600).
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
    try:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _rename_when_due(tmp, target)
