"""What a checkpoint format is to bert_multi: how it recognizes one, reads its tensors under the file's
own names, writes one, and describes it to people. Each format is one module of this package."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ...backend.registry import load_backend
from ...errors import UsageError, WeightsError
from ...safe_files import atomic_path, reason, stored_data_start
from ...spec.config import BERTConfig

PARAMS_FILE, VOCAB_FILE = "pretrained.params", "vocab.json"  # as d2l's load_pretrained_model reads them
PADDLE_PARAMS_FILE = "pretrained.pdparams"  # what d2l 0.17's Paddle code reads in place of PARAMS_FILE
MAX_TENSORS = 100_000  # a BERT has hundreds; more is no BERT, and refused before any is read
MAX_ZIP_RATIO = 20  # weights hardly compress; a zip's member that claims to expand more is refused


@dataclass
class Raw:
    """A file's tensors under its own names, as a format read them."""

    format: str  # the format's kind
    framework: str | None  # the backend whose own file it is, or None
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]  # the file's own dtypes (bfloat16 arrives as float32)
    notes: list[str] = field(default_factory=list)  # what was done to read it
    vocab: list[str] | None = None
    config: BERTConfig | None = None  # when the file records it
    # What the file records beyond the model's computation (a HuggingFace config.json, with its dropout,
    # pad_token_id, initializer_range...): written again, unchanged, to a file of the same format.
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    """What recognizing a file may look at: its path, its first bytes and, for a zip, its member names."""

    path: Path
    head: bytes
    members: tuple[str, ...]  # a zip's member names; empty for anything else


class CheckpointFormat:
    """One checkpoint format. ``kind`` names it, ``description`` says what it is for people; a
    framework's own file names its backend (``framework``) and how its names differ from the canonical
    ones (``name_rules``). A format written by suffix lists them (``suffixes``)."""

    kind: str
    description: str
    framework: str | None = None
    suffixes: tuple[str, ...] = ()
    name_rules: list[tuple[str, str]] = []
    directory = False  # a directory, not a file
    framework_option: str | None = None  # the --framework (framework=) that asks for this directory when writing
    zip_marker: str | None = None  # a zip-based format: what a zip would hold to be one, for messages
    d2l_published = False  # a file that d2l's pretrained-model directories hold (MXNet's, PyTorch's, Paddle's)
    d2l_file = PARAMS_FILE  # its name there
    holds_transformers_names = False  # may hold a transformers BERT's state_dict alone, read as one if so
    marker_files: tuple[str, ...] = ()  # a directory format's: the names of files that mark one, in a zip

    def recognizes(self, probe: Probe) -> bool:
        """Whether the file (or directory) is one of this format."""
        raise NotImplementedError

    def names_checkpoint(self, path: Path) -> bool:
        """Whether ``path`` names one of this format's checkpoints though it is neither a file of this format
        nor a directory it recognizes (TensorFlow's checkpoint prefix, ``bert_model.ckpt``)."""
        return False

    def framework_of(self, path: Path) -> str | None:
        """The backend whose own file ``path`` is, before reading it (a d2l directory's is its file's)."""
        return self.framework

    def read(self, path: Path, key: str | None) -> Raw:
        """The tensors under the file's own names; ``key`` picks a PyTorch wrapper dict's entry."""
        raise NotImplementedError

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """Write ``weights`` as this format, atomically (``framework`` and ``vocab``: what a d2l directory
        holds; ``settings``: what a file of this format recorded beyond the model, ``Raw.settings``, kept)."""
        raise UsageError(f"{path}: bert_multi reads {self.description}s but does not write them")


SHOWN = 5  # names shown in a message before "and N more"
# What would end or rewrite a line where a name is shown: no framework puts one in a tensor's name.
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def control_character(name: str) -> str | None:
    """The first control character in a name read from a file, as an escape (``\\n``), or None. A name
    holding one is refused where it is read, so that a file cannot write lines of a report or an error."""
    found = _CONTROL_CHARACTER.search(name)
    return None if found is None else found[0].encode("unicode_escape").decode("ascii")


def some(names: list[Any] | set[str]) -> str:
    """The first few of ``names`` (sorted, if a set), and how many more, for a message."""
    names = sorted(names) if isinstance(names, set) else list(names)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"{names[:SHOWN]}{more}"


def natural_order(names: list[str]) -> list[str]:
    """``names`` sorted as people count: a run's checkpoint-2 before its checkpoint-10."""
    return sorted(names, key=lambda name: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)])


def task_head_left_out(names: list[str], what: str) -> str:
    """The note for a fine-tuning head read past (``what``: whose head it is), the same from every format."""
    return (
        f"left out {sorted(names)}, {what}: not part of BERT (bert_multi computes the encoder and the pretraining "
        "heads), so neither compared nor converted"
    )


def translated(name: str, table: list[tuple[str, str]], reverse: bool = False) -> str | None:
    """``name`` rewritten by the first row of ``table`` (one naming's pattern, the other's) that matches it,
    read right to left where ``reverse``; or None. A pattern's ``{i}`` is a block's index and ``{p}``
    weight or bias, the same in both."""
    for row in table:
        source, target = row[::-1] if reverse else row
        regex = re.escape(source).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", "(?P<p>weight|bias)")
        match = re.fullmatch(regex, name)
        if match:
            return target.format(**match.groupdict())
    return None


def weight_and_bias(name: str) -> str:
    """``name`` with a LayerNorm's ``gamma`` and ``beta`` (Gluon's and TensorFlow's names) as ``weight`` and
    ``bias``, as the tables of names (``translated``) spell them."""
    return re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))


class StateDictInside(WeightsError):
    """A file whose state_dict is an entry of a dict around it (a training run's checkpoint), read without
    the key: its names (``names``) tell the reader of them the prefix a wrapper put before them, which
    ``telling`` adds, so that one message says all there is to state."""

    def __init__(self, path: object, keys: list[str], holders: list[str], names: list[str]) -> None:
        self.path, self.keys, self.holders, self.names = path, keys, holders, names
        super().__init__(self.telling())

    def telling(self, prefix: str = "") -> str:
        key = self.holders[0]
        under = f", its BERT's names under {prefix!r} (a wrapper's attribute: a LightningModule's)" if prefix else ""
        python, line = f"key={key!r}", f"--key {key}"
        if prefix:
            python, line = f"{python}, prefix={prefix!r}", f"{line} --prefix {prefix}"
        return (
            f"{self.path}: the file holds a dict with the keys {some(self.keys)}, not a state_dict; the state_dict "
            f"is under {self.holders}{under}: pass {python} ({line})"
        )


def state_dict_in(
    path: object, top: object, key: str | None, tensors: Callable[[object], dict[str, Any] | None]
) -> tuple[dict[str, Any], list[str]]:
    """The state_dict in what a pickle held (``top``): the object itself or, with ``key``, the entry of a dict
    around it (``{'model': net.state_dict(), 'epoch': 3}``), and a note saying which. ``tensors``: a value's
    names -> tensors, or None where it is no state_dict."""
    if key is not None:
        if not isinstance(top, dict) or key not in top:
            keys = list(map(str, top)) if isinstance(top, dict) else []
            raise WeightsError(f"{path}: key {key!r} asked for, but the file's top-level keys are {some(keys)}")
        if (found := tensors(top[key])) is None:
            raise WeightsError(f"{path}: the entry {key!r} is not a state_dict (a dict of name -> tensor)")
        return found, [f"read the state_dict under the key {key!r}"]
    if (found := tensors(top)) is not None:
        return found, []
    if not isinstance(top, dict):
        raise WeightsError(f"{path}: expected a state_dict (a dict of name -> tensor), got {type(top).__name__}")
    keys = list(map(str, top))
    holding = {str(name): found for name, value in top.items() if (found := tensors(value)) is not None}
    if holding:
        raise StateDictInside(path, keys, list(holding), list(map(str, next(iter(holding.values())))))
    why = (
        "it is an optimizer's state (torch.optim's), not a model's"
        if {"state", "param_groups"} <= set(top)
        else "none of its entries is a state_dict (a dict of name -> tensor)"
    )
    raise WeightsError(f"{path}: the file holds a dict with the keys {some(keys)}, not a state_dict; {why}")


def no_key(path: Path, key: str | None) -> None:
    """Refuse ``key`` for a format that has no wrapper dict to pick from."""
    if key is not None:
        raise WeightsError(f"{path}: key={key!r} only applies to a PyTorch file holding a wrapper dict")


@contextmanager
def zip_errors(path: Path) -> Iterator[None]:
    """Whatever zipfile raises on the hostile zip at ``path``, said as a ``WeightsError`` (one of bert_multi's
    own passes as it is)."""
    try:
        yield
    except WeightsError:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile raises many types on hostile input
        raise WeightsError(f"{path}: a damaged zip archive: {reason(error)}") from None


def check_member(member: zipfile.ZipInfo, path: Path) -> None:
    """Refuse a member of the zip at ``path`` that is encrypted or claims to expand beyond reason, before any of
    it is read."""
    if member.flag_bits & 0x1:
        raise WeightsError(f"{path}: {member.filename} is encrypted")
    if member.file_size > MAX_ZIP_RATIO * member.compress_size + (1 << 20):
        raise WeightsError(
            f"{path}: {member.filename} claims to expand from {member.compress_size} to {member.file_size} bytes"
        )


def extract(archive: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path, path: Path) -> None:
    """Copy one member out of the zip at ``path`` (``check_member``'s refusals first)."""
    check_member(member, path)
    with archive.open(member) as source, open(target, "wb") as sink:
        shutil.copyfileobj(source, sink, 1 << 20)


class Member(NamedTuple):
    """A zip's member stored uncompressed: its name, and where its bytes are in the zip's file."""

    name: str
    start: int
    size: int


def stored_member(file: BinaryIO, member: zipfile.ZipInfo, path: Path) -> Member | None:
    """Where ``member`` of the zip at ``path`` (open as ``file``) lies in it, to be read in place, when it is
    stored uncompressed (as Keras stores a .keras file's); its bytes checked against the zip's checksum first
    (what extracting it would check). None for a member compressed or encrypted: extract it."""
    if member.compress_type != zipfile.ZIP_STORED or member.flag_bits & 0x1 or member.file_size != member.compress_size:
        return None
    try:
        start = stored_data_start(file, member)
    except ValueError:
        raise WeightsError(f"{path}: {member.filename}'s local header is not where the zip's directory says") from None
    checksum, left = 0, member.file_size
    file.seek(start)
    while left:
        chunk = file.read(min(left, 1 << 20))
        if not chunk:
            raise WeightsError(f"{path}: {member.filename} is cut short: the zip says {member.file_size} bytes")
        checksum, left = zlib.crc32(chunk, checksum), left - len(chunk)
    if checksum != member.CRC:
        raise WeightsError(f"{path}: {member.filename} is damaged: its bytes do not match the zip's checksum")
    return Member(member.filename, start, member.file_size)


LISTED = 256  # the entries of a directory looked at for checkpoints inside it: bounded, whatever it holds


def listed(path: Path) -> list[str]:
    """The names of the first ``LISTED`` entries of the directory at ``path``; none where it cannot be read."""
    try:
        with os.scandir(path) as entries:
            return [entry.name for entry in itertools.islice(entries, LISTED)]
    except OSError:
        return []


def is_directory(path: Path) -> bool:
    return _is_kind(path, stat.S_ISDIR)


def is_regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (through links), as ``Path.is_file``, but never raising (which it
    does for a link to a name too long)."""
    return _is_kind(path, stat.S_ISREG)


def _is_kind(path: Path, kind: Callable[[int], bool]) -> bool:
    try:
        return kind(os.stat(path).st_mode)
    except (OSError, ValueError):  # too long, unreadable, a NUL byte: open_regular says which
        return False


class FrameworkFile(CheckpointFormat):
    """A framework's own parameter file: read by ``read_arrays`` (the arrays under the file's names, their
    dtypes, notes), written by that framework's backend, as its own save writes it."""

    framework: str
    d2l_published = True

    def read_arrays(self, path: Path, key: str | None) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
        raise NotImplementedError

    def read(self, path: Path, key: str | None) -> Raw:
        arrays, dtypes, notes = self.read_arrays(path, key)
        return Raw(self.kind, self.framework, arrays, dtypes, notes)

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        # Named, since the backend may write it from its worker process; replaced, perhaps together with
        # the files beside it (``written_together``), once it is complete.
        with atomic_path(path, named=True) as written:
            load_backend(self.framework).save_checkpoint(written, config, weights)
