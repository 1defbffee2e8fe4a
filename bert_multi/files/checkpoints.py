"""Checkpoints of any d2l generation and framework: what a file is, what it implies, and loading and
converting it without guessing.

A d2l checkpoint is a framework's own file (a PyTorch ``state_dict``, Gluon ``.params``, or d2l's
pretrained-model directory holding one plus ``vocab.json``). Its tensor names say which generation
and which heads it has, and its shapes give every size but one: the number of attention heads, which
no weight reveals. Nor can a file tell d2l 0.12-0.15 (valid_lens tiled over heads) from 0.16+
(interleaved): same names, same shapes. Both compute a different function when wrong, so both are
required statements, never defaults. Every failure is a ``WeightsError`` that says what to do.

Gluon files and canonical ``.npz`` files are read without any framework; PyTorch files need torch,
whose reader runs with ``weights_only=True``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.contract import framework_names
from ..backend.registry import load_backend, registrations
from ..errors import WeightsError
from ..spec.config import HEADS, BERTConfig
from ..spec.schema import SUPPORTED_DTYPES, normalize_dtype, param_shapes, validate_weights
from ..spec.semantics import PRESETS, Semantics, releases_of, semantics_for
from . import gluon_params, huggingface
from .safe import MXNET_LIST_MAGIC, ZIP_MAGIC, atomic_path, describe_format, open_regular, reason
from .weights import MANIFEST_KEY, load_weights, save_weights

# What bert_multi reads and writes, for people.
FORMATS = {
    "npz": "bert_multi canonical weights (.npz with a manifest)",
    "torch": "PyTorch state_dict file (torch.save)",
    "gluon": "Gluon parameter file (save_parameters)",
    "d2l-dir": "d2l pretrained-model directory (pretrained.params + vocab.json)",
    "d2l-zip": "d2l pretrained-model zip (pretrained.params + vocab.json)",
    "hf-dir": "HuggingFace BERT directory (config.json + model.safetensors or pytorch_model.bin)",
}
PARAMS_FILE, VOCAB_FILE = "pretrained.params", "vocab.json"  # as d2l's load_pretrained_model reads them


@dataclass(frozen=True)
class FrameworkFormat:
    """A framework's own parameter file: the backend whose file it is (which writes it), the suffixes
    that ask for it, the rules from canonical names to the names it holds, and its reader."""

    backend: str
    suffixes: tuple[str, ...]
    name_rules: list[tuple[str, str]]
    read: Callable[[Path, str | None], tuple[dict[str, np.ndarray], dict[str, str], list[str]]]


# The frameworks' own formats, by FORMATS key. A PyTorch file needs torch to read; a Gluon one is parsed
# here without MXNet, whose reader trusts every size in it.
FRAMEWORK_FORMATS = {
    "torch": FrameworkFormat(
        "torch", (".pt", ".pth"), [], lambda path, key: load_backend("torch").read_checkpoint(path, key)
    ),
    "gluon": FrameworkFormat("mxnet", (".params",), gluon_params.NAME_RULES, gluon_params.read_checkpoint),
}


# What save_checkpoint's framework= takes for a directory: a d2l one of each framework's file, or HuggingFace's.
DIRECTORY_FRAMEWORKS = [*(own.backend for own in FRAMEWORK_FORMATS.values()), "huggingface"]


def _format_of(framework: str) -> FrameworkFormat:
    return next(f for f in FRAMEWORK_FORMATS.values() if f.backend == framework)


def _label(framework: str) -> str:
    return registrations()[framework].label or framework


def _reader(framework: str | None) -> str:
    """The call that reads a framework's files on purpose (a canonical file's, for None)."""
    return "bert_multi.load_weights" if framework is None else f"{registrations()[framework].where}.load_checkpoint"


# The top-level modules of d2l's BERTModel; a file's other tensors belong to something else (a task head).
MODEL_PARTS = ("encoder", "hidden", "mlm", "nsp")
D2L_0_11_MAX_LEN = 1000  # d2l 0.11 computes its sinusoidal table up to BERTEncoder's default max_len
MAX_ZIP_RATIO = 20  # weights hardly compress; a member that claims to expand more is refused
MAX_VOCAB_BYTES = 64 << 20
SIZES = ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_blks", "max_len")  # what weights reveal
SHOWN = 5  # names shown in a message before "and N more"


def _some(names: list[Any] | set[str]) -> str:
    names = sorted(names) if isinstance(names, set) else list(names)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"{names[:SHOWN]}{more}"


@dataclass(frozen=True)
class Tensor:
    """One tensor as the file stores it."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class CheckpointInfo:
    """What a checkpoint file is and what it implies, before anything is stated about it."""

    path: str
    format: str  # a key of FORMATS
    framework: str | None  # the backend whose own file it is (FRAMEWORK_FORMATS), or None
    tensors: list[Tensor]  # under the file's own names, in its order
    sizes: dict[str, int]  # vocab_size, num_hiddens, ffn_num_hiddens, num_blks and, if stored, max_len
    heads: tuple[str, ...]
    presets: tuple[str, ...]  # the generations whose names and shapes the tensors fit
    config: BERTConfig | None  # complete only when the file records it (a canonical file)
    vocab: list[str] | None = None
    ignored: list[str] = field(default_factory=list)  # tensors that are not d2l BERT's (a task head)
    notes: list[str] = field(default_factory=list)  # what was done to read it
    unknowns: dict[str, str] = field(default_factory=dict)  # what the file cannot tell -> how to state it

    def describe(self) -> str:
        """A report for people: the file, its tensors as a table, what it implies and what it cannot tell."""
        from ..display import format_table

        lines = [f"{self.path}: {FORMATS[self.format]}"]
        if self.framework:
            lines[0] += f", {_label(self.framework)}"
        rows = [[t.name, "x".join(map(str, t.shape)) or "scalar", t.dtype] for t in self.tensors]
        lines += ["", format_table(["tensor", "shape", "dtype"], rows), ""]
        total = sum(int(np.prod(t.shape)) for t in self.tensors)
        lines.append(f"{len(self.tensors)} tensors, {total:,} numbers")
        lines.append("sizes: " + ", ".join(f"{name}={value}" for name, value in self.sizes.items()))
        lines.append(f"heads: {', '.join(self.heads) or 'none (encoder only)'}")
        fits = [f"{name} ({releases_of(name)})" for name in self.presets]
        lines.append(f"fits: {'; '.join(fits)}")
        if self.config is not None:
            lines.append(f"config (recorded in the file): {self.config}")
        if self.vocab is not None:
            lines.append(f"vocab: {len(self.vocab)} tokens, starting {self.vocab[:5]}")
        lines += [f"ignored: {name}" for name in self.ignored]
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"cannot tell {topic}: {why}" for topic, why in self.unknowns.items()]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "framework": self.framework,
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in self.tensors],
            "sizes": self.sizes,
            "heads": list(self.heads),
            "presets": list(self.presets),
            "config": None if self.config is None else self.config.to_dict(),
            "vocab_size": None if self.vocab is None else len(self.vocab),
            "ignored": self.ignored,
            "notes": self.notes,
            "unknowns": self.unknowns,
        }


@dataclass
class Checkpoint:
    """A loaded checkpoint: the config (the file's sizes plus what was stated), canonical weights, and
    the vocabulary when the file came with one."""

    config: BERTConfig
    weights: dict[str, np.ndarray]
    info: CheckpointInfo

    @property
    def vocab(self) -> list[str] | None:
        return self.info.vocab


# --- Reading a file's tensors under its own names ----------------------------------------------------


@dataclass
class _Raw:
    format: str
    framework: str | None
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]  # the file's own dtypes (bfloat16 arrives as float32)
    notes: list[str]
    vocab: list[str] | None = None
    config: BERTConfig | None = None


def _is_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):  # too long, unreadable, a NUL byte: open_regular says which
        return False


def _sniff(path: Path) -> tuple[str, str | None]:
    """(format, framework) from a file's first bytes and, for a zip, its member names; a file named
    ``.npz`` is read as canonical weights."""
    if _is_directory(path) and huggingface.is_directory(path):
        return "hf-dir", None
    if _is_directory(path):
        params = path / PARAMS_FILE
        if not params.is_file():
            raise WeightsError(f"{path}: is a directory, but not a d2l pretrained-model one (it has no {PARAMS_FILE})")
        return "d2l-dir", _sniff(params)[1]
    with open_regular(path, "checkpoint", WeightsError) as file:
        if path.suffix.lower() == ".npz":  # the canonical reader says precisely what is wrong with one
            return "npz", None
        head = file.read(8)
        if head.startswith(MXNET_LIST_MAGIC):
            return "gluon", FRAMEWORK_FORMATS["gluon"].backend
        if head.startswith(ZIP_MAGIC):
            file.seek(0)
            try:
                names = zipfile.ZipFile(file).namelist()
            except Exception as error:  # noqa: BLE001 - zipfile raises many types on hostile input
                names = []
                problem = f"a damaged zip archive: {reason(error)}"
            else:
                problem = (
                    f"a zip archive, but neither a bert_multi .npz (no {MANIFEST_KEY}), a PyTorch checkpoint (no "
                    f"data.pkl) nor a d2l pretrained-model zip (no {PARAMS_FILE}); it holds {_some(names)}"
                )
            if f"{MANIFEST_KEY}.npy" in names:
                return "npz", None
            if any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
                return "torch", FRAMEWORK_FORMATS["torch"].backend
            if any(Path(name).name == PARAMS_FILE for name in names):
                return "d2l-zip", None  # the framework is that of the file inside
        elif head.startswith(b"\x80"):  # a pickle: torch.save before PyTorch 1.6, or of an arbitrary object
            problem = (
                f"{describe_format(head)}; only the zip format torch.save has written since PyTorch 1.6 is read "
                "(its sizes can be checked before anything is unpickled): re-save it with a current PyTorch"
            )
        else:
            problem = f"{describe_format(head)}; expected one of: " + "; ".join(FORMATS.values())
    raise WeightsError(f"{path}: {problem}")


def _read_framework_file(path: Path, kind: str, key: str | None) -> _Raw:
    """A framework's own file (``kind`` a key of FRAMEWORK_FORMATS): its arrays, their own dtypes, and
    how they were found."""
    own = FRAMEWORK_FORMATS[kind]
    arrays, dtypes, notes = own.read(path, key)
    return _Raw(kind, own.backend, arrays, dtypes, notes)


def _read_vocab(path: Path, data: bytes) -> list[str]:
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
    return _read_vocab(Path(shown_as or path), data)


def _extract(archive: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path, path: Path) -> None:
    """Copy one member out of a zip, refusing one that claims to expand beyond reason."""
    if member.flag_bits & 0x1:
        raise WeightsError(f"{path}: {member.filename} is encrypted")
    if member.file_size > MAX_ZIP_RATIO * member.compress_size + (1 << 20):
        raise WeightsError(
            f"{path}: {member.filename} claims to expand from {member.compress_size} to {member.file_size} bytes"
        )
    with archive.open(member) as source, open(target, "wb") as sink:
        shutil.copyfileobj(source, sink, 1 << 20)


def _read_d2l_zip(path: Path, key: str | None) -> _Raw:
    with tempfile.TemporaryDirectory(prefix="bert_multi-") as scratch:
        try:
            with zipfile.ZipFile(path) as archive:
                params = [m for m in archive.infolist() if Path(m.filename).name == PARAMS_FILE]
                if len(params) != 1:
                    raise WeightsError(f"{path}: expected one {PARAMS_FILE} in the zip, found {len(params)}")
                folder = str(Path(params[0].filename).parent)
                vocab_name = VOCAB_FILE if folder == "." else f"{folder}/{VOCAB_FILE}"
                _extract(archive, params[0], Path(scratch) / PARAMS_FILE, path)
                vocab_members = [m for m in archive.infolist() if m.filename == vocab_name]
                for member in vocab_members:
                    _extract(archive, member, Path(scratch) / VOCAB_FILE, path)
        except WeightsError:
            raise
        except Exception as error:  # noqa: BLE001 - zipfile raises many types on hostile input
            raise WeightsError(f"{path}: a damaged zip archive: {reason(error)}") from None
        raw = _read_d2l_dir(Path(scratch), key, shown_as=path)
    raw.format = "d2l-zip"
    return raw


def _read_d2l_dir(directory: Path, key: str | None, shown_as: Path | None = None) -> _Raw:
    try:
        kind = _sniff(directory / PARAMS_FILE)[0]
        if kind not in FRAMEWORK_FORMATS:
            raise WeightsError(f"{directory / PARAMS_FILE}: a {FORMATS[kind]}, not a framework's parameter file")
        raw = _read_framework_file(directory / PARAMS_FILE, kind, key)
    except WeightsError as error:  # name the file the user gave, not a scratch copy
        raise WeightsError(str(error).replace(str(directory), str(shown_as or directory))) from None
    vocab_path = directory / VOCAB_FILE
    if vocab_path.exists():
        raw.vocab = read_vocab(vocab_path, shown_as)
    raw.format = "d2l-dir"
    return raw


def _read(path: Path, key: str | None, sniffed: tuple[str, str | None] | None = None) -> _Raw:
    kind = (sniffed or _sniff(path))[0]
    if kind == "npz":
        if key is not None:
            raise WeightsError(f"{path}: key={key!r} only applies to a PyTorch file holding a wrapper dict")
        config, weights = load_weights(path)
        raw = _Raw(kind, None, weights, {}, [], config=config)
    elif kind == "hf-dir":
        config, arrays, dtypes, notes = huggingface.read_directory(path)
        raw = _Raw(kind, None, arrays, dtypes, notes, config=config)
    elif kind == "d2l-dir":
        raw = _read_d2l_dir(path, key)
    elif kind == "d2l-zip":
        raw = _read_d2l_zip(path, key)
    else:
        raw = _read_framework_file(path, kind, key)
    raw.dtypes = {name: raw.dtypes.get(name, array.dtype.name) for name, array in raw.arrays.items()}
    if raw.config is None:
        _strip_prefix(raw.arrays, raw.dtypes, raw.notes)
    return raw


# --- What the names and shapes imply ----------------------------------------------------------------


@dataclass
class _Layout:
    presets: tuple[str, ...]
    heads: tuple[str, ...]
    canonical: dict[str, str]  # canonical name -> the file's name
    ignored: list[str]
    sizes: dict[str, int]


def _head_choices(semantics: Semantics) -> Iterator[tuple[str, ...]]:
    for count in range(len(HEADS), -1, -1):
        for heads in itertools.combinations(HEADS, count):
            try:
                BERTConfig(2, 2, 2, 1, 1, semantics=semantics, heads=heads)
            except ValueError:
                continue
            yield heads


def _family(names: set[str]) -> str:
    """Which other model family a set of tensor names looks like, if any, as a clause for a message."""
    if any(re.match(r"(\w+\.)?embeddings\.word_embeddings\.", name) for name in names):
        return (
            " (they look like a HuggingFace transformers BERT: the original BERT, whose names and layers "
            "differ from d2l's)"
        )
    if "encoder.embedding.weight" in names or any(name.startswith("decoder.") for name in names):
        return " (they look like d2l's Transformer for machine translation, not its BERT)"
    return ""


def _interpret(path: Path, framework: str | None, arrays: dict[str, np.ndarray]) -> _Layout:
    """Which generations and heads a file's names fit, its canonical names, and its sizes."""
    names = set(arrays)
    blocks = {int(m[1]) for name in names if (m := re.match(r"encoder\.blks\.(\d+)\.", name))}
    rules = _format_of(framework).name_rules if framework else []
    fits: list[tuple[str, tuple[str, ...], dict[str, str]]] = []
    nearest: tuple[int, list[str]] | None = None  # the closest candidate's names, in schema order
    for preset, semantics in PRESETS.items():
        for heads in _head_choices(semantics):
            proto = BERTConfig(2, 2, 2, 1, max(len(blocks), 1), max_len=1, semantics=semantics, heads=heads)
            expected = framework_names(proto, rules)
            missing = set(expected.values()) - names
            if nearest is None or len(missing) < nearest[0]:
                nearest = (len(missing), list(expected.values()))
            leftover = names - set(expected.values())
            if not missing and not any(name.split(".")[0] in MODEL_PARTS for name in leftover):
                fits.append((preset, heads, expected))
    if not blocks or not fits:
        assert nearest is not None
        expected_names = nearest[1]
        raise WeightsError(
            f"{path}: its tensor names are not those of a d2l BERT{_family(names)}. The file has "
            f"{_some(names)}; a d2l BERT{' of ' + str(len(blocks)) + ' blocks' if blocks else ''} has "
            f"{_some(expected_names)}; missing {_some(set(expected_names) - names)}, "
            f"unexpected {_some(names - set(expected_names))}"
        )
    largest = max(len(expected) for _, _, expected in fits)
    fits = [fit for fit in fits if len(fit[2]) == largest]
    presets = tuple(dict.fromkeys(preset for preset, _, _ in fits))
    heads, expected = fits[0][1], fits[0][2]
    ignored = sorted(names - set(expected.values()))

    def shape(canonical: str, ndim: int) -> tuple[int, ...]:
        array = arrays[expected[canonical]]
        if array.ndim != ndim:
            raise WeightsError(f"{path}: tensor {expected[canonical]!r} has shape {array.shape}; expected {ndim} axes")
        return array.shape

    vocab_size, num_hiddens = shape("encoder.token_embedding.weight", 2)
    sizes = {
        "vocab_size": vocab_size,
        "num_hiddens": num_hiddens,
        "ffn_num_hiddens": shape("encoder.blks.0.ffn.dense1.weight", 2)[0],
        "num_blks": len(blocks),
    }
    if "encoder.pos_embedding" in expected:
        sizes["max_len"] = shape("encoder.pos_embedding", 3)[1]
    return _Layout(presets, heads, expected, ignored, sizes)


def _unknowns(layout: _Layout) -> dict[str, str]:
    """What the file cannot tell -> why it matters and the option that states it."""
    hiddens = layout.sizes["num_hiddens"]
    divisors = [d for d in range(1, hiddens + 1) if hiddens % d == 0]
    unknowns = {
        "num_heads": f"no weight reveals how num_hiddens={hiddens} is split into heads (any of {_some(divisors)} "
        "fits), and a wrong count loads and computes a different function; state it with num_heads= (--num-heads)"
    }
    if len(layout.presets) > 1:
        fits = " and ".join(f"{name} ({releases_of(name)})" for name in layout.presets)
        unknowns["the generation"] = (
            f"the tensors fit {fits}, which copy valid_lens over the heads differently (interleaved in 0.16+, "
            "tiled in 0.12-0.15) and so differ when a batch mixes lengths; state it with preset= or "
            "d2l_version= (--preset / --d2l-version)"
        )
    if "max_len" not in layout.sizes:
        unknowns["max_len"] = (
            f"d2l 0.11 computes its sinusoidal position table, so the file holds none; {D2L_0_11_MAX_LEN}, "
            "d2l 0.11's default, is assumed (it only bounds the sequence length)"
        )
    return unknowns


def _file_tensors(raw: _Raw) -> list[Tensor]:
    return [Tensor(name, tuple(array.shape), raw.dtypes[name]) for name, array in raw.arrays.items()]


def _stated_info(path: Path, raw: _Raw, config: BERTConfig) -> CheckpointInfo:
    """The description of a file whose config is known: recorded in it, or stated in full."""
    sizes = {name: getattr(config, name) for name in SIZES}
    info = CheckpointInfo(str(path), raw.format, raw.framework, _file_tensors(raw), sizes, config.heads, (), None)
    info.presets, info.vocab, info.notes = (config.semantics.name,), raw.vocab, raw.notes
    if raw.config is not None:
        info.config = config
    return info


def _describe(path: Path, raw: _Raw) -> tuple[CheckpointInfo, _Layout | None]:
    """What a file's tensors imply, and the layout they were read with (none for a canonical file)."""
    if raw.config is not None:
        return _stated_info(path, raw, raw.config), None
    layout = _interpret(path, raw.framework, raw.arrays)
    info = CheckpointInfo(
        str(path),
        raw.format,
        raw.framework,
        _file_tensors(raw),
        layout.sizes,
        layout.heads,
        layout.presets,
        None,
        raw.vocab,
        layout.ignored,
        raw.notes,
        _unknowns(layout),
    )
    return info, layout


def inspect_checkpoint(path: str | Path, key: str | None = None) -> CheckpointInfo:
    """What the file at ``path`` is: its format, tensors, the sizes and generations they imply, and what
    it cannot tell. ``key`` picks the state_dict out of a PyTorch wrapper dict."""
    path = Path(path)
    return _describe(path, _read(path, key))[0]


# --- Loading: the file plus what was stated ---------------------------------------------------------


def _strip_prefix(arrays: dict[str, np.ndarray], dtypes: dict[str, str], notes: list[str]) -> None:
    """``nn.DataParallel``/``DistributedDataParallel`` save every name under ``module.``: unambiguous."""
    if arrays and all(name.startswith("module.") for name in arrays):
        for name in list(arrays):
            arrays[name.removeprefix("module.")] = arrays.pop(name)
            dtypes[name.removeprefix("module.")] = dtypes.pop(name)
        notes.append("stripped the prefix 'module.' from every name (a model wrapped in nn.DataParallel)")


def _cast(path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str], dtype: str | None) -> dict:
    """The arrays as ``dtype``, or, without it, unchanged once each is float32 or float64."""
    if dtype is not None:
        return {name: np.asarray(array, dtype=dtype) for name, array in arrays.items()}
    for name, own in dtypes.items():
        if own in ("float16", "bfloat16"):
            raise WeightsError(
                f"{path}: tensor {name!r} is {own}; bert_multi computes in {' or '.join(SUPPORTED_DTYPES)}, and "
                "casts only when asked: pass dtype='float32' (--cast float32)"
            )
        if own not in SUPPORTED_DTYPES:
            raise WeightsError(f"{path}: tensor {name!r} has dtype {own}; expected floating-point weights")
    return arrays


def _names_error(path: Path, have: set[str], expected: set[str]) -> WeightsError:
    """The file's own names next to the expected ones, and what differs."""
    differences = [
        f"{what} {_some(names)}"
        for what, names in (("missing", expected - have), ("unexpected", have - expected))
        if names
    ]
    return WeightsError(
        f"{path}: its tensor names do not match the stated config. The file has {_some(have)}; the config "
        f"expects {_some(expected)}; {', '.join(differences)}"
    )


def _statement(preset: str | Semantics | None, d2l_version: str | None) -> Semantics | None:
    if preset is not None and d2l_version is not None:
        raise ValueError("state the generation once: preset= or d2l_version=, not both")
    stated = preset if preset is not None else d2l_version
    return None if stated is None else semantics_for(stated)


def _check_framework(path: Path, kind: str, found: str | None, wanted: str) -> None:
    """A framework's reader refuses the other framework's files (and canonical ones), naming the reader."""
    if found != wanted:
        written = f", written by {_label(found)}" if found else ""
        raise WeightsError(
            f"{path}: this is a {FORMATS[kind]}{written}, not a {_label(wanted)} checkpoint: read it "
            f"with {'bert_multi.from_huggingface' if kind == 'hf-dir' else _reader(found)} or "
            "bert_multi.load_checkpoint (any format), or convert it: "
            f"bert-multi convert {path} OUT"
        )


def _config_from_layout(path: Path, layout: _Layout, num_heads: int | None, semantics: Semantics | None) -> BERTConfig:
    unknowns = _unknowns(layout)
    if num_heads is None:
        raise WeightsError(f"{path}: num_heads is required: {unknowns['num_heads']}")
    if semantics is None:
        if len(layout.presets) > 1:
            raise WeightsError(f"{path}: the generation is required: {unknowns['the generation']}")
        semantics = PRESETS[layout.presets[0]]
    elif semantics.name not in layout.presets:
        fits = ", ".join(f"{name} ({releases_of(name)})" for name in layout.presets)
        raise WeightsError(
            f"{path}: the stated generation {semantics.name!r} does not fit the file, whose tensor names fit {fits}"
        )
    sizes = dict(layout.sizes)
    sizes.setdefault("max_len", D2L_0_11_MAX_LEN)
    return BERTConfig(num_heads=num_heads, semantics=semantics, heads=layout.heads, **sizes)


def load_checkpoint(
    path: str | os.PathLike,
    config: BERTConfig | None = None,
    *,
    num_heads: int | None = None,
    preset: str | Semantics | None = None,
    d2l_version: str | None = None,
    dtype: object = None,
    key: str | None = None,
    framework: str | None = None,
) -> Checkpoint:
    """A checkpoint in any format bert_multi reads (``FORMATS``), as a config and canonical weights.

    The sizes come from the file; what it cannot reveal is stated: ``num_heads``, and ``preset`` or
    ``d2l_version`` when the tensors fit more than one generation (a canonical file records both).
    A ``config`` states everything at once. ``dtype`` casts the weights explicitly (half-precision files
    need it); ``key`` names the entry of a PyTorch wrapper dict that holds the state_dict. A ``module.``
    prefix is stripped and a task head is ignored, each said in ``info.notes``. ``framework`` (a backend
    with a format of its own, ``FRAMEWORK_FORMATS``) refuses other files, naming the reader they need.
    """
    path = Path(path)
    dtype = None if dtype is None else normalize_dtype(dtype)
    semantics = _statement(preset, d2l_version)
    kind, sniffed = _sniff(path)
    if framework is not None and kind != "d2l-zip":  # a zip's framework is that of the file inside
        _check_framework(path, kind, sniffed, framework)
    raw = _read(path, key, (kind, sniffed))
    if framework is not None:
        _check_framework(path, raw.format, raw.framework, framework)
    if raw.config is not None:
        info = _describe(path, raw)[0]
        if config is None:
            config = raw.config
            if num_heads is not None and num_heads != config.num_heads:
                raise WeightsError(f"{path}: the file records num_heads={config.num_heads}; {num_heads} was stated")
            if semantics is not None and semantics != config.semantics:
                stated = config.with_semantics(semantics)
                try:
                    validate_weights(stated, raw.arrays)
                except WeightsError as error:
                    raise WeightsError(
                        f"{path}: the file's weights ({config.semantics.name}) do not fit the stated generation "
                        f"{semantics.name!r}: {error}"
                    ) from None
                config = stated
        weights = _cast(path, raw.arrays, raw.dtypes, dtype)
    else:
        if config is None:
            info, layout = _describe(path, raw)
            assert layout is not None
            config = _config_from_layout(path, layout, num_heads, semantics)
        else:  # everything is stated: the file is only checked against it
            info = _stated_info(path, raw, config)
        expected = framework_names(config, _format_of(raw.framework).name_rules if raw.framework else [])
        leftover = set(raw.arrays) - set(expected.values())
        if not set(expected.values()) <= set(raw.arrays) or any(n.split(".")[0] in MODEL_PARTS for n in leftover):
            raise _names_error(path, set(raw.arrays), set(expected.values()))
        info.ignored = sorted(leftover)
        arrays = {name: raw.arrays[own] for name, own in expected.items()}
        weights = _cast(path, arrays, {name: raw.dtypes[own] for name, own in expected.items()}, dtype)
    try:
        validate_weights(config, weights)
    except WeightsError as error:
        raise WeightsError(f"{path}: {error} (config: {config})") from None
    if info.vocab is not None and len(info.vocab) != config.vocab_size:
        raise WeightsError(
            f"{path}: {VOCAB_FILE} has {len(info.vocab)} tokens, but the token embedding has {config.vocab_size} rows"
        )
    return Checkpoint(config, {name: weights[name] for name in param_shapes(config)}, info)


# --- Writing any format --------------------------------------------------------------------------------


def output_format(path: str | Path) -> str:
    """The format a path asks for: by suffix (.npz, or a framework format's), else a d2l directory."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        return "npz"
    for kind, own in FRAMEWORK_FORMATS.items():
        if suffix in own.suffixes:
            return kind
    if suffix and not Path(path).is_dir():
        known = [".npz", *(s for own in FRAMEWORK_FORMATS.values() for s in own.suffixes)]
        raise ValueError(
            f"{path}: unknown output suffix {suffix!r}: expected {', '.join(known)}, or a directory name "
            "(a d2l pretrained-model directory)"
        )
    return "d2l-dir"


def save_checkpoint(
    path: str | Path,
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    *,
    framework: str | None = None,
    vocab: list[str] | None = None,
) -> str:
    """Write ``weights`` in the format ``path`` asks for (``output_format``); return that format.

    Each framework's file is what its own d2l code loads with its own strict call (``load_state_dict``,
    ``load_parameters``). A d2l pretrained-model directory needs ``framework`` (whose
    ``pretrained.params`` it holds) and ``vocab`` (its ``vocab.json``), as d2l's ``load_pretrained_model``
    reads both. Every file is written atomically.
    """
    kind = output_format(path)
    validate_weights(config, weights)
    if kind == "npz":
        save_weights(path, config, weights)
    elif kind in FRAMEWORK_FORMATS:
        load_backend(FRAMEWORK_FORMATS[kind].backend).save_checkpoint(path, config, weights)
    elif framework == "huggingface":
        huggingface.write_directory(path, config, weights)
        kind = "hf-dir"
    else:
        if framework not in DIRECTORY_FRAMEWORKS:
            raise ValueError(
                f"{path}: a directory is a d2l pretrained-model directory, holding one framework's {PARAMS_FILE}, "
                f"or a HuggingFace one: say which with framework= (--framework), one of {DIRECTORY_FRAMEWORKS}"
            )
        if vocab is None:
            raise ValueError(
                f"{path}: a d2l pretrained-model directory needs a {VOCAB_FILE} (d2l's load_pretrained_model reads "
                "it), and the input has none: give one with vocab= (--vocab FILE, a JSON list of tokens)"
            )
        if len(vocab) != config.vocab_size:
            raise ValueError(f"{path}: the vocab has {len(vocab)} tokens, the model {config.vocab_size}")
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        load_backend(framework).save_checkpoint(directory / PARAMS_FILE, config, weights)
        with atomic_path(directory / VOCAB_FILE) as tmp_path:
            Path(tmp_path).write_text(json.dumps(vocab, ensure_ascii=False))
    return kind


def convert(
    source: str | Path,
    target: str | Path,
    *,
    framework: str | None = None,
    vocab: list[str] | None = None,
    **statements: Any,
) -> Checkpoint:
    """Read ``source`` in any format (``statements`` as for ``load_checkpoint``) and write it to
    ``target`` in the format its name asks for; the vocabulary travels when the source has one."""
    output_format(target)  # refuse a bad output name before reading anything
    checkpoint = load_checkpoint(source, **statements)
    save_checkpoint(target, checkpoint.config, checkpoint.weights, framework=framework, vocab=vocab or checkpoint.vocab)
    return checkpoint


def from_huggingface(path: str | Path, dtype: object = None) -> Checkpoint:
    """A HuggingFace BERT directory (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``) as a
    ``Checkpoint`` of the ``bert`` preset: its config says everything, so nothing needs stating."""
    if not (_is_directory(Path(path)) and huggingface.is_directory(Path(path))):
        raise WeightsError(
            f"{path}: not a HuggingFace model directory: expected {huggingface.CONFIG_FILE} and "
            f"{huggingface.SAFETENSORS_FILE} or {huggingface.TORCH_FILE}"
        )
    return load_checkpoint(path, dtype=dtype)
