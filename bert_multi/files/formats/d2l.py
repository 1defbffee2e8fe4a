"""d2l's pretrained-model directory (``pretrained.params`` in one framework's own format, or Paddle's
``pretrained.pdparams``, and ``vocab.json``), as d2l's ``load_pretrained_model`` reads it, and the same two
files zipped."""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import UsageError, WeightsError
from ...safe_files import open_regular, reason, replace_text
from ...spec.config import BERTConfig
from .base import (
    PADDLE_PARAMS_FILE,
    PARAMS_FILE,
    VOCAB_FILE,
    CheckpointFormat,
    Probe,
    Raw,
    extract,
    is_directory,
    is_regular_file,
    zip_errors,
)

PARAMS_FILES = (PARAMS_FILE, PADDLE_PARAMS_FILE)
MAX_VOCAB_BYTES = 64 << 20
MAX_VOCAB_TOKENS = 1 << 20  # more than any BERT's vocabulary (multilingual ones have 250,000 tokens)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _parse_vocab(path: Path, data: bytes) -> list[str]:
    """A flat JSON list of strings, its shape and length checked before it is parsed: parsing builds an
    object per element, 15 to 25 times the bytes for a list of empty lists."""
    shape = re.sub(rb"\s", b"", _STRING.sub(b"S", data))  # every string one letter, no spaces
    if not re.fullmatch(rb"\[(S(,S)*)?\]", shape):
        raise WeightsError(f"{path}: expected a JSON list of tokens (d2l's vocab.idx_to_token)")
    if shape.count(b"S") > MAX_VOCAB_TOKENS:
        raise WeightsError(f"{path}: {shape.count(b'S')} tokens; a BERT's vocabulary has at most {MAX_VOCAB_TOKENS}")
    try:
        vocab = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise WeightsError(f"{path}: not valid JSON: {reason(error)}") from None
    if not isinstance(vocab, list) or not all(isinstance(token, str) for token in vocab):
        raise WeightsError(f"{path}: expected a JSON list of tokens (d2l's vocab.idx_to_token)")
    return vocab


def read_vocab(path: str | Path, shown_as: str | Path | None = None) -> list[str]:
    """A vocabulary as d2l saves it (``vocab.json``: the JSON list ``vocab.idx_to_token``)."""
    with open_regular(path, "vocabulary (a JSON list of tokens)", WeightsError) as file:
        data = file.read(MAX_VOCAB_BYTES + 1)
    if len(data) > MAX_VOCAB_BYTES:
        raise WeightsError(f"{shown_as or path}: larger than {MAX_VOCAB_BYTES} bytes; not a vocabulary")
    return _parse_vocab(Path(shown_as or path), data)


class Directory(CheckpointFormat):
    """A d2l pretrained-model directory: a framework's parameter file, whose format ``sniff`` (the
    registry's, which holds this one) tells, and d2l's vocabulary."""

    kind = "d2l-dir"
    description = "d2l pretrained-model directory (pretrained.params or .pdparams, and vocab.json)"
    directory = True

    def __init__(self, sniff: Callable[[Path], CheckpointFormat], published: Callable[[str], CheckpointFormat]) -> None:
        self.sniff = sniff
        self.published = published  # the format of the file a directory holds, by --framework's name

    def recognizes(self, probe: Probe) -> bool:
        return is_directory(probe.path) and any(is_regular_file(probe.path / name) for name in PARAMS_FILES)

    def params_file(self, path: Path) -> Path:
        """The directory's parameter file: ``pretrained.params``, or Paddle's ``pretrained.pdparams``."""
        found = [path / name for name in PARAMS_FILES if is_regular_file(path / name)]
        if len(found) != 1:
            raise WeightsError(f"{path}: expected one of {list(PARAMS_FILES)}, found {[p.name for p in found]}")
        return found[0]

    def params_format(self, path: Path) -> CheckpointFormat:
        """The format of the directory's parameter file: one d2l published a pretrained BERT in."""
        own = self.sniff(path)
        if not own.d2l_published:
            raise WeightsError(f"{path}: a {own.description}, not a parameter file d2l publishes BERTs in")
        return own

    def framework_of(self, path: Path) -> str | None:
        return self.params_format(self.params_file(path)).framework

    def read(self, path: Path, key: str | None, shown_as: Path | None = None) -> Raw:
        try:
            params = self.params_file(path)
            raw = self.params_format(params).read(params, key)
        except WeightsError as error:  # name the file the user gave, not a scratch copy
            raise WeightsError(str(error).replace(str(path), str(shown_as or path))) from None
        if os.path.lexists(path / VOCAB_FILE):  # a link to nothing is a broken vocabulary, not none
            raw.vocab = read_vocab(path / VOCAB_FILE, shown_as)
        raw.format = self.kind
        return raw

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        if vocab is None:
            raise UsageError(
                f"{path}: a d2l pretrained-model directory needs a {VOCAB_FILE} (d2l's load_pretrained_model reads "
                "it), and the input has none: give one with vocab= (--vocab FILE, a JSON list of tokens)"
            )
        if len(vocab) != config.vocab_size:
            raise UsageError(f"{path}: the vocab has {len(vocab)} tokens, the model {config.vocab_size}")
        path.mkdir(parents=True, exist_ok=True)
        assert framework is not None  # save_checkpoint asks for it before anything is written
        own = self.published(framework)
        own.write(path / own.d2l_file, config, weights)
        replace_text(path / VOCAB_FILE, json.dumps(vocab, ensure_ascii=False))


class Zip(CheckpointFormat):
    """A d2l pretrained-model zip: a ``Directory``'s files, read as that directory once extracted."""

    kind = "d2l-zip"
    description = "d2l pretrained-model zip (pretrained.params or .pdparams, and vocab.json)"
    zip_marker = f"a d2l pretrained-model zip (no {PARAMS_FILE} or {PADDLE_PARAMS_FILE})"

    def __init__(self, directory: Directory) -> None:
        self.directory_format = directory

    def recognizes(self, probe: Probe) -> bool:
        return any(Path(name).name in PARAMS_FILES for name in probe.members)

    def framework_of(self, path: Path) -> str | None:
        return None  # that of the file inside, known once read

    def read(self, path: Path, key: str | None) -> Raw:
        with tempfile.TemporaryDirectory(prefix="bert_multi-") as scratch:
            with zip_errors(path), zipfile.ZipFile(path) as archive:
                params = [m for m in archive.infolist() if Path(m.filename).name in PARAMS_FILES]
                if len(params) != 1:
                    raise WeightsError(
                        f"{path}: expected one {' or '.join(PARAMS_FILES)} in the zip, found {len(params)}"
                    )
                folder = str(Path(params[0].filename).parent)
                vocab_name = VOCAB_FILE if folder == "." else f"{folder}/{VOCAB_FILE}"
                extract(archive, params[0], Path(scratch) / Path(params[0].filename).name, path)
                for member in [m for m in archive.infolist() if m.filename == vocab_name]:
                    extract(archive, member, Path(scratch) / VOCAB_FILE, path)
            raw = self.directory_format.read(Path(scratch), key, shown_as=path)
        raw.format = self.kind
        return raw
