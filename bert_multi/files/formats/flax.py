"""Flax's own parameter file (``flax.serialization.to_bytes(params)``, a ``.msgpack``), read and written
without Flax.

Flax serialises a parameter tree as MessagePack: nested maps whose leaves are extension type 1, each
holding a MessagePack array ``[shape, dtype name, raw C-order bytes]``. This module parses that
format itself, checking every count and length against the bytes that remain before allocating,
and writes exactly the bytes ``to_bytes`` writes for the same tree (a test compares them), so the
files move between environments with or without JAX.

The tree is the JAX backend's (``bert_multi/jax/model.py``): ``encoder/blks_0/attention/W_q/kernel``,
dotted here as ``encoder.blks_0.attention.W_q.kernel`` (``NAME_RULES``). A file may hold the tree, the
variables dict around it (``{"params": tree}``), or a training state around that (what
``flax.training.checkpoints.save_checkpoint`` wrote before Flax moved to Orbax: a ``TrainState``'s
``step``, ``params`` and ``opt_state``), whose parameters are read and the rest passed over unread.
Framework difference: Flax's dense kernels are (in, out), torch's and Gluon's weights (out, in); the
reader turns them to (out, in) and the writer back.
"""

from __future__ import annotations

import io
import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ...arrays import bfloat16_widened, contiguous_transpose
from ...backend.contract import framework_names, prepare_weights
from ...errors import WeightsError
from ...safe_files import check_shape, describe_format, file_size, open_regular, replace_file
from ...spec.config import BERTConfig
from .base import MAX_TENSORS, FrameworkFile, Probe, Raw, control_character, no_key
from .transformers_names import flax_name, is_transformers_state_dict

# (regex, replacement) rules, applied in turn, from canonical names to the Flax tree's dotted paths: a
# list of submodules is blks_0, blks_1 (a Sequential's mlp.2 is mlp_2), the pooler is one Dense
# (hidden), a LayerNorm's weight is its scale, an embedding's its embedding table, a Dense's its kernel.
NAME_RULES: list[tuple[str, str]] = [
    (r"\.(blks|mlp)\.(\d+)\.", r".\1_\2."),
    (r"^hidden\.0\.", "hidden."),
    (r"(\.ln|\.embedding_norm|^mlm\.mlp_2)\.weight$", r"\1.scale"),
    (r"(_embedding)\.weight$", r"\1.embedding"),
    (r"\.weight$", ".kernel"),
]

NDARRAY_EXT = 1  # flax.serialization's extension code for an array
MAX_DEPTH = 16  # BERT's tree is 6 deep; anything deeper is not a parameter tree
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
# MessagePack markers (msgpack-spec): map, str, bin, array, ext, and non-negative ints.
FIXMAP, FIXARRAY, FIXSTR = range(0x80, 0x90), range(0x90, 0xA0), range(0xA0, 0xC0)
SIZED = {
    0xDE: ("map", ">H"),
    0xDF: ("map", ">I"),
    0xDC: ("array", ">H"),
    0xDD: ("array", ">I"),
    0xD9: ("str", ">B"),
    0xDA: ("str", ">H"),
    0xDB: ("str", ">I"),
    0xC4: ("bin", ">B"),
    0xC5: ("bin", ">H"),
    0xC6: ("bin", ">I"),
    0xC7: ("ext", ">B"),
    0xC8: ("ext", ">H"),
    0xC9: ("ext", ">I"),
}
FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
UINTS = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q"}
# What a training state holds beside its parameters (a step, a learning rate): nil, false, true, and the
# floats and signed ints by the bytes that follow each marker; fixints are below 0x80 and from 0xE0.
SCALARS = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
PARAMS = "params"  # the variables dict's, and a TrainState's, key for the parameter tree
MAX_PASSED = MAX_TENSORS  # items passed over unread: a TrainState holds a few for each parameter (and Adam moment)


def transposed(name: str) -> bool:
    """Whether the tree holds this dotted path transposed: a Dense kernel."""
    return name.endswith(".kernel")


class _Parser:
    """MessagePack read from ``file`` (``size`` bytes) as it is parsed, refusing any length beyond the bytes
    that remain: the arrays kept are read straight into their own memory, and what is passed over (an
    optimizer's state) is sought past, never read."""

    def __init__(self, file: io.BufferedReader, size: int, path: str | os.PathLike) -> None:
        self.file, self.size, self.at, self.path = file, size, 0, path
        self.dtypes: dict[str, str] = {}  # each array's own dtype: a bfloat16 one is read widened to float32
        self.passed = 0  # items passed over unread, bounded by MAX_PASSED

    def fail(self, message: str) -> WeightsError:
        return WeightsError(f"{self.path}: not a readable Flax .msgpack checkpoint: {message} (at byte {self.at})")

    def need(self, count: int, what: str) -> None:
        if count > self.size - self.at:
            raise self.fail(f"{what} needs {count} bytes, but only {self.size - self.at} remain")

    def seek(self, at: int) -> None:
        self.file.seek(at)
        self.at = at

    def take(self, count: int, what: str) -> bytes:
        self.need(count, what)
        chunk = self.file.read(count)
        if len(chunk) != count:
            raise self.fail(f"{what} ends early: the file changed while it was read")
        self.at += count
        return chunk

    def take_into(self, array: np.ndarray, what: str) -> None:
        """Fill ``array`` (C-contiguous, its size checked with ``need`` before it was made) from the file."""
        flat = array.reshape(-1).view(np.uint8).data
        if self.file.readinto(flat) != flat.nbytes:
            raise self.fail(f"{what} ends early: the file changed while it was read")
        self.at += flat.nbytes

    def number(self, fmt: str, what: str) -> int:
        return int(struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0])

    def header(self, what: str) -> tuple[str, int]:
        """The next item's kind and its length (or value, for an int)."""
        marker = self.number(">B", what)
        if marker < 0x80:
            return "int", marker
        for kind, markers in (("map", FIXMAP), ("array", FIXARRAY), ("str", FIXSTR)):
            if marker in markers:
                return kind, marker - markers.start
        if marker in SIZED:
            kind, fmt = SIZED[marker]
            return kind, self.number(fmt, f"{what}'s length")
        if marker in FIXEXT:
            return "ext", FIXEXT[marker]
        if marker in UINTS:
            return "int", self.number(UINTS[marker], what)
        raise self.fail(f"{what} has MessagePack marker 0x{marker:02X}, which a Flax parameter file never holds")

    def text(self, what: str) -> str:
        kind, length = self.header(what)
        if kind != "str":
            raise self.fail(f"{what} is a MessagePack {kind}, not a string")
        try:
            text = bytes(self.take(length, what)).decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.fail(f"{what} is not UTF-8 text ({error.reason})") from None
        if bad := control_character(text):
            raise self.fail(f"{what} holds the text {text!r:.200}, with the control character {bad}")
        return text

    def entries(self, what: str, kind: str, count: int) -> int:
        """How many items a map or array of ``count`` entries holds, refused beyond what the bytes left hold."""
        items = 2 * count if kind == "map" else count
        if items > self.size - self.at:  # each item takes at least a byte
            raise self.fail(f"{what} claims {count} entries, more than the file's remaining bytes can hold")
        return items

    def keys(self) -> list[str]:
        """The top-level map's keys, read past everything else; the parser left where it started."""
        start = self.at
        kind, count = self.header("the top level")
        if kind != "map":
            raise self.fail(f"the top level is a MessagePack {kind}, not a map of parameters")
        keys = []
        for _ in range(self.entries("the top level", kind, count) // 2):
            keys.append(self.text("a key of the top level"))
            self.skip(keys[-1], 1)
        self.seek(start)
        return keys

    def skip(self, what: str, depth: int) -> None:
        """Past the next item, unread, whatever MessagePack it is (a TrainState's step and optimizer state)."""
        if depth > MAX_DEPTH:
            raise self.fail(f"{what} is nested over {MAX_DEPTH} levels deep")
        self.passed += 1
        if self.passed > MAX_PASSED:
            raise self.fail(f"it holds over {MAX_PASSED} MessagePack items; a training state holds far fewer")
        marker = self.number(">B", what)
        if marker < 0x80 or marker >= 0xE0 or marker in SCALARS:
            self.pass_over(SCALARS.get(marker, 0), what)
            return
        self.seek(self.at - 1)
        kind, length = self.header(what)
        if kind in ("map", "array"):
            for _ in range(self.entries(what, kind, length)):
                self.skip(what, depth + 1)
        elif kind != "int":
            self.pass_over(length + (kind == "ext"), what)  # an extension's type byte follows its length

    def pass_over(self, count: int, what: str) -> None:
        self.need(count, what)
        self.seek(self.at + count)

    def tree(self, path: tuple[str, ...], found: dict[str, np.ndarray], only: str | None = None) -> None:
        """The map at ``path``: its arrays into ``found`` under dotted paths (of its entries, ``only`` that one,
        the others passed over unread)."""
        what = ".".join(path) or "the top level"
        if len(path) > MAX_DEPTH:
            raise self.fail(f"{what} is nested over {MAX_DEPTH} levels deep")
        kind, count = self.header(what)
        if kind != "map":
            raise self.fail(f"{what} is a MessagePack {kind}, not a map of parameters")
        self.entries(what, kind, count)
        for _ in range(count):
            key = self.text(f"a key of {what}")
            if key == "__msgpack_chunked_array__":
                raise self.fail(f"{what} is a chunked array (over 1 GiB), which is not read")
            if only is not None and key != only:
                self.skip(key, len(path) + 1)
                continue
            start = self.at
            marker = self.number(">B", f"{what}.{key}")
            self.seek(start)
            if marker in FIXMAP or marker in (0xDE, 0xDF):
                self.tree((*path, key), found)
            else:
                name = ".".join((*path, key))
                if name in found:
                    raise self.fail(f"{name} appears twice")
                found[name] = self.array(name)

    def array(self, name: str) -> np.ndarray:
        kind, length = self.header(name)
        if kind != "ext":
            raise self.fail(f"{name} is a MessagePack {kind}, not an array")
        code = self.number(">b", f"{name}'s extension type")
        end = self.at + length
        if code != NDARRAY_EXT:
            raise self.fail(f"{name} has extension type {code}; arrays are type {NDARRAY_EXT}")
        kind, items = self.header(f"{name}'s fields")
        if (kind, items) != ("array", 3):
            raise self.fail(f"{name}'s fields are a {kind} of {items}; expected [shape, dtype, data]")
        kind, ndim = self.header(f"{name}'s shape")
        if kind != "array" or ndim > 32:
            raise self.fail(f"{name}'s shape is a {kind} of {ndim}; expected an array of at most 32 sizes")
        shape = []
        for axis in range(ndim):
            kind, size = self.header(f"{name}'s size {axis}")
            if kind != "int":
                raise self.fail(f"{name}'s size {axis} is a {kind}, not a whole number")
            shape.append(size)
        dtype_name = self.text(f"{name}'s dtype")
        dtype = np.dtype("<u2") if dtype_name == "bfloat16" else None
        if dtype is None and dtype_name not in DTYPES:
            raise self.fail(f"{name} has dtype {dtype_name!r}; expected one of {list(DTYPES)} or bfloat16")
        dtype = dtype or np.dtype(dtype_name).newbyteorder("<")
        try:
            check_shape(tuple(shape), dtype)
        except ValueError as error:
            raise self.fail(f"{name} has {error}") from None
        kind, count = self.header(f"{name}'s data")
        if kind != "bin" or count != math.prod(shape) * dtype.itemsize:
            raise self.fail(f"{name}'s data is a {kind} of {count} bytes; {dtype_name} {tuple(shape)} takes "
                            f"{math.prod(shape) * dtype.itemsize}")  # fmt: skip
        self.need(count, f"{name}'s data")
        array = np.empty(shape, dtype)
        self.take_into(array, f"{name}'s data")
        if self.at != end:
            raise self.fail(f"{name}'s extension is {length} bytes, but its fields take {length + self.at - end}")
        self.dtypes[name] = dtype_name
        if dtype_name == "bfloat16":
            return bfloat16_widened(array)
        return array.astype(array.dtype.newbyteorder("="), copy=False)  # a copy only on a big-endian machine


def read_tree(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every array of a Flax ``.msgpack`` file under its dotted path (below a top-level ``params``), as
    stored: kernels (in, out); and each one's own dtype (bfloat16 arrays arrive widened to float32).
    Anything malformed is a ``WeightsError`` naming the file and the entry."""
    found, dtypes, _ = _read(path)
    return found, dtypes


def _read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """``read_tree``'s arrays and dtypes, and the top-level entries passed over beside ``params`` (a
    training state's ``step`` and ``opt_state``)."""
    with open_regular(path, "Flax .msgpack checkpoint", WeightsError) as file:
        parser = _Parser(file, file_size(file), path)
        head = file.read(8)
        parser.seek(0)
        if not head or head[0] not in FIXMAP and head[0] not in (0xDE, 0xDF):
            raise parser.fail(f"it does not start with a MessagePack map; it looks like {describe_format(head)}")
        keys = parser.keys()
        # A training state: only its parameters are a model's (an optimizer's state has their names too).
        only = PARAMS if PARAMS in keys and len(keys) > 1 else None
        found: dict[str, np.ndarray] = {}
        parser.tree((), found, only)
        if parser.at != parser.size:
            raise parser.fail(f"{parser.size - parser.at} unexpected bytes follow the parameter tree")
    found, dtypes = _without_variables_key(found, parser.dtypes)
    return found, dtypes, [key for key in keys if only is not None and key != only]


def _without_variables_key(
    found: dict[str, np.ndarray], dtypes: dict[str, str]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A tree's paths without the variables dict's ``params.``, where every path has it."""
    if found and all(name.startswith(f"{PARAMS}.") for name in found):
        found = {name.removeprefix(f"{PARAMS}."): array for name, array in found.items()}
        dtypes = {name.removeprefix(f"{PARAMS}."): dtype for name, dtype in dtypes.items()}
    return found, dtypes


LEAF_NAMES = ("kernel", "scale", "embedding")  # what Flax's Dense, LayerNorm and Embed call their parameters


def is_tree(names: list[str]) -> bool:
    """Whether dotted paths are a Flax parameter tree's: its modules' own leaf names mark it."""
    return any(name.rpartition(".")[2] in LEAF_NAMES for name in names)


def turned(
    stored: dict[str, np.ndarray], dtypes: dict[str, str], notes: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """A Flax parameter tree's arrays under their dotted paths as a checkpoint reader returns them: without
    ``params.``, the kernels turned to (out, in), said in a note."""
    stored, dtypes = _without_variables_key(stored, dtypes)
    if any(map(transposed, stored)):
        notes = [*notes, "Flax's (in, out) kernels read as (out, in) weights"]
    arrays = {}
    for name in list(stored):  # each kernel given up as it is turned: one at a time in memory twice
        array = stored.pop(name)
        arrays[name] = contiguous_transpose(array) if transposed(name) else array
    return arrays, dtypes, notes


def with_pytorch_names(raw: Raw) -> Raw:
    """``raw``, where its tree is transformers 4's Flax BERT's, under its PyTorch classes' names, as their
    state_dict is read."""
    renamed = {name: flax_name(name)[0] for name in raw.arrays}
    if is_transformers_state_dict(renamed.values()):
        raw.arrays = {renamed[name]: array for name, array in raw.arrays.items()}
        raw.dtypes = {renamed[name]: dtype for name, dtype in raw.dtypes.items()}
        raw.framework = None
        raw.notes.append("read transformers' Flax names as its PyTorch classes'")
    return raw


def read_checkpoint(
    path: str | os.PathLike, key: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """A Flax parameter file as a checkpoint reader returns one: its arrays under the file's dotted paths
    with the kernels turned to (out, in), their own dtypes (a bfloat16 one is refused later unless a cast
    is asked for), and notes."""
    no_key(Path(path), key)
    stored, dtypes, passed = _read(path)
    notes = [f"read the tree under {PARAMS!r} and left out the entries beside it: {passed}"] if passed else []
    return turned(stored, dtypes, notes)


def _pack_length(kind: str, length: int) -> bytes:
    """A str, bin, map, array or ext header as msgpack writes it: the smallest form that holds ``length``."""
    fixed = {"str": (0xA0, 32), "map": (0x80, 16), "array": (0x90, 16)}
    if kind in fixed and length < fixed[kind][1]:
        return bytes([fixed[kind][0] + length])
    markers = {"str": (0xD9, 0xDA, 0xDB), "bin": (0xC4, 0xC5, 0xC6), "map": (None, 0xDE, 0xDF),
               "array": (None, 0xDC, 0xDD), "ext": (0xC7, 0xC8, 0xC9)}[kind]  # fmt: skip
    for marker, fmt, limit in zip(markers, (">B", ">H", ">I"), (1 << 8, 1 << 16, 1 << 32)):
        if marker is not None and length < limit:
            return bytes([marker]) + struct.pack(fmt, length)
    raise WeightsError(f"a MessagePack {kind} of {length} is too long (Flax chunks arrays over 1 GiB)")


def _pack_int(value: int) -> bytes:
    if value < 0x80:
        return bytes([value])
    for marker, fmt in UINTS.items():
        if value < 1 << (8 * struct.calcsize(fmt)):
            return bytes([marker]) + struct.pack(fmt, value)
    raise WeightsError(f"a size of {value} is too large")


def _pack_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _pack_length("str", len(raw)) + raw


def _pack_array(array: np.ndarray) -> bytes:
    data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    fields = _pack_length("array", 3) + _pack_length("array", array.ndim) + b"".join(map(_pack_int, array.shape))
    fields += _pack_str(array.dtype.name) + _pack_length("bin", len(data)) + data
    fixext = {size: marker for marker, size in FIXEXT.items()}
    header = bytes([fixext[len(fields)]]) if len(fields) in fixext else _pack_length("ext", len(fields))
    return header + struct.pack(">b", NDARRAY_EXT) + fields


def pack_tree(tree: dict[str, Any]) -> bytes:
    """``tree`` (nested dicts of NumPy arrays) as ``flax.serialization.to_bytes`` writes it."""
    parts = [_pack_length("map", len(tree))]
    for key, value in tree.items():
        parts.append(_pack_str(key))
        parts.append(pack_tree(value) if isinstance(value, dict) else _pack_array(np.asarray(value)))
    return b"".join(parts)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """{dotted path: leaf} as a tree of nested dicts, in the same order."""
    tree: dict[str, Any] = {}
    for dotted, leaf in flat.items():
        *modules, name = dotted.split(".")
        node = tree
        for part in modules:
            node = node.setdefault(part, {})
        node[name] = leaf
    return tree


def flax_tree(config: BERTConfig, weights: dict[str, np.ndarray]) -> dict[str, Any]:
    """The canonical weights as the Flax model's parameter tree, in the model's order, kernels (in, out)."""
    names = framework_names(config, NAME_RULES)
    return nested({dotted: contiguous_transpose(weights[name]) if transposed(dotted) else weights[name]
                   for name, dotted in names.items()})  # fmt: skip


def save_checkpoint(path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> None:
    """Write canonical weights as a Flax parameter file: the bytes ``flax.serialization.to_bytes`` writes
    for the JAX backend's parameter tree."""
    _, weights = prepare_weights(config, weights)
    data = pack_tree(flax_tree(config, weights))
    replace_file(path, lambda file: file.write(data))


BACKEND = "jax"  # whose own file it is


class ParameterTree(FrameworkFile):
    kind = "flax"
    description = "Flax parameter file (flax.serialization.to_bytes, .msgpack)"
    framework = BACKEND
    suffixes = (".msgpack",)
    name_rules = NAME_RULES
    d2l_published = False  # d2l never published a JAX BERT

    def recognizes(self, probe: Probe) -> bool:
        first = probe.head[:1]
        # The tree, its variables dict, or a TrainState as flax.training.checkpoints saved it (checkpoint_N).
        starts = probe.head[1:].startswith((b"\xa6params", b"\xa7encode", b"\xa4step"))
        return probe.path.suffix.lower() == ".msgpack" or (first != b"" and first[0] in FIXMAP and starts)

    holds_transformers_names = True  # transformers 4's Flax BERT's params: its flax_model.msgpack, or to_bytes

    def read_arrays(self, path: Path, key: str | None) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
        return read_checkpoint(path, key)  # framework-free: the format is plain MessagePack

    def read(self, path: Path, key: str | None) -> Raw:
        return with_pytorch_names(super().read(path, key))

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        save_checkpoint(path, config, weights)  # framework-free too, so any environment converts to it


FORMAT = ParameterTree()
