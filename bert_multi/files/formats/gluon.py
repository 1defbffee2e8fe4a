"""Gluon's ``.params`` files (MXNet's NDArray list format), read without MXNet.

``Block.save_parameters`` writes MXNet's own binary format, which MXNet reads back in C++ trusting
every field: a header claiming ``ndim = 0xFFFFFFFF`` crashes the process. So this module reads the
format itself, checking every count and size against the bytes that remain before it allocates
anything. The layout, as MXNet 1.x writes it (``NDArray::Save`` in ``src/ndarray/ndarray.cc``),
little-endian:

- u64 0x112 (the list magic), u64 reserved, u64 number of arrays, then each array:
  u32 magic (0xF993FAC9: V2, legacy mode; 0xF993FACA: V3, NumPy mode), i32 storage type (0: dense),
  i32 ndim and ndim i64 dimensions (V2: ndim 0 means "no array"; V3: ndim -1 does), then for an
  array with a shape: i32 device type and i32 device id, i32 type flag, and the data, C order;
- u64 number of names (0 or the number of arrays), then each name: u64 length and UTF-8 bytes.

The names are Gluon's structural names (``NAME_RULES``), which the MXNet backend's parameters carry too.
A file of GluonNLP's ``BERTModel`` (its model zoo's BERTs: the original BERT under GluonNLP's names,
``GLUONNLP_NAMES``) is read as the canonical original BERT.
"""

from __future__ import annotations

import collections
import io
import math
import os
import re
import struct
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...safe_files import MXNET_LIST_MAGIC, check_shape, describe_format, file_size, open_regular
from .base import FrameworkFile, Probe, Raw, control_character, no_key, task_head_left_out, translated, weight_and_bias

# (regex, replacement) rules, applied in turn, from canonical names to Gluon's structural names (what
# save_parameters writes, what d2l's Gluon code loads). Gluon's LayerNorm calls its parameters
# gamma/beta; Gluon fuses the pooler's tanh and the ReLU and tanh inside the heads' MLPs into their Dense
# layers, so hidden.0 is hidden and those Sequentials are shorter.
NAME_RULES: list[tuple[str, str]] = [
    (r"^mlm\.mlp\.2\.", "mlm.mlp.1."),
    (r"^mlm\.mlp\.3\.", "mlm.mlp.2."),
    (r"^nsp\.mlp\.2\.", "nsp.mlp.1."),
    (r"^hidden\.0\.", "hidden."),
    (r"(\.ln|\.embedding_norm|^mlm\.mlp\.1)\.weight$", r"\1.gamma"),
    (r"(\.ln|\.embedding_norm|^mlm\.mlp\.1)\.bias$", r"\1.beta"),
]

LIST_MAGIC = 0x112
V2_MAGIC, V3_MAGIC = 0xF993FAC9, 0xF993FACA
MAX_NDIM = 32
# mshadow's type flags (mshadow/base.h); bfloat16 (12) has no NumPy dtype.
TYPE_FLAGS = {
    0: "float32",
    1: "float64",
    2: "float16",
    3: "uint8",
    4: "int32",
    5: "int8",
    6: "int64",
    7: "bool",
    8: "int16",
    9: "uint16",
    10: "uint32",
    11: "uint64",
}


class _Reader:
    """Reads fields from ``file``, refusing any read that asks for more bytes than remain."""

    def __init__(self, file: io.BufferedReader, path: str | os.PathLike) -> None:
        self.file, self.path, self.remaining = file, path, file_size(file)

    def fail(self, message: str) -> WeightsError:
        return WeightsError(f"{self.path}: not a readable Gluon .params checkpoint: {message}")

    def bytes(self, count: int, what: str) -> bytearray:
        if count > self.remaining:
            raise self.fail(f"{what} needs {count} bytes, but only {self.remaining} remain (truncated or corrupt)")
        data = bytearray(count)
        if self.file.readinto(data) != count:
            raise self.fail(f"the file ended inside {what}")
        self.remaining -= count
        return data

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack(fmt, self.bytes(struct.calcsize(fmt), what))[0]

    def array(self, index: int) -> np.ndarray | None:
        """The next array, or None for a parameter saved without a shape (never initialised)."""
        what = f"array #{index}"
        magic = self.number("<I", f"{what}'s magic")
        if magic not in (V2_MAGIC, V3_MAGIC):
            raise self.fail(
                f"{what} starts with 0x{magic:08X}, not an NDArray magic (0x{V2_MAGIC:08X} or 0x{V3_MAGIC:08X}); "
                "files from MXNet before 1.0 are not read"
            )
        storage = self.number("<i", f"{what}'s storage type")
        if storage != 0:
            raise self.fail(f"{what} has storage type {storage} (sparse); only dense arrays (0) are read")
        ndim = self.number("<i", f"{what}'s ndim")
        if (magic == V3_MAGIC and ndim == -1) or (magic == V2_MAGIC and ndim == 0):
            return None
        if not 0 <= ndim <= MAX_NDIM:
            raise self.fail(f"{what} claims {ndim} dimensions; expected 0 to {MAX_NDIM}")
        shape = struct.unpack(f"<{ndim}q", self.bytes(8 * ndim, f"{what}'s shape"))
        self.bytes(8, f"{what}'s device")  # i32 device type and id: where it lived, not what it holds
        flag = self.number("<i", f"{what}'s type flag")
        if flag not in TYPE_FLAGS:
            raise self.fail(f"{what} has type flag {flag} (12 is bfloat16), which NumPy cannot hold")
        dtype = np.dtype(TYPE_FLAGS[flag]).newbyteorder("<")
        try:
            check_shape(shape, dtype)
        except ValueError as error:
            raise self.fail(f"{what} has {error}") from None
        data = self.bytes(math.prod(shape) * dtype.itemsize, f"{what}'s data ({dtype.name} {shape})")
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def name(self, index: int) -> str:
        length = self.number("<Q", f"name #{index}'s length")
        raw = self.bytes(length, f"name #{index}")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.fail(f"name #{index} is not UTF-8 text ({error.reason} at byte {error.start})") from None
        if bad := control_character(name):
            raise self.fail(f"name #{index}, {name!r:.200}, holds the control character {bad}")
        return name


def read_params(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every named array of a ``.params`` file (``save_parameters``, ``npx.save``, ``nd.save`` of a
    dict), as NumPy arrays. Anything malformed is a ``WeightsError`` naming the file and the field."""
    with open_regular(path, "Gluon .params checkpoint", WeightsError) as file:
        reader = _Reader(file, path)
        magic = reader.bytes(8, "the list magic") if reader.remaining >= 8 else bytearray()
        if int.from_bytes(magic, "little") != LIST_MAGIC or len(magic) != 8:
            file.seek(0)
            raise reader.fail(
                f"it does not start with MXNet's NDArray list magic; it looks like {describe_format(file.read(8))}"
            )
        reader.number("<Q", "the reserved field")
        count = reader.number("<Q", "the array count")
        if count > reader.remaining // 12:  # every array takes at least 12 bytes
            raise reader.fail(f"it claims {count} arrays, more than its {reader.remaining} bytes can hold")
        arrays = [reader.array(index) for index in range(count)]
        name_count = reader.number("<Q", "the name count")
        if name_count != count:
            unnamed = " (an unnamed list, not save_parameters' output)" if name_count == 0 else ""
            raise reader.fail(f"it has {count} arrays but {name_count} names{unnamed}")
        names = [reader.name(index) for index in range(count)]
        if reader.remaining:
            raise reader.fail(f"{reader.remaining} unexpected bytes follow the last name")
    repeated = [name for name, seen in collections.Counter(names).items() if seen > 1]
    if repeated:
        raise WeightsError(f"{path}: parameter(s) {repeated[:5]} appear more than once")
    uninitialised = [name for name, array in zip(names, arrays) if array is None]
    if uninitialised:
        raise WeightsError(
            f"{path}: parameter(s) {uninitialised[:5]} were saved before Gluon knew their shapes (deferred "
            "initialisation); run one forward pass before save_parameters"
        )
    return {name: array for name, array in zip(names, arrays) if array is not None}


def read_checkpoint(
    path: str | os.PathLike, key: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """A Gluon parameter file as a checkpoint reader returns one: its arrays under the file's own names,
    their dtypes, and notes (none). ``key`` picks an entry of a PyTorch wrapper dict: Gluon has none."""
    no_key(Path(path), key)
    arrays = read_params(path)
    return arrays, {name: array.dtype.name for name, array in arrays.items()}, []


# (GluonNLP's name, canonical name): {i} is a block, {p} weight or bias (a LayerNorm's gamma or beta, as
# Gluon calls them). GluonNLP's BERTModel ties its decoder's weight to the word embedding (decoder.3.weight,
# saved under both names) and fuses the pooler's tanh into its Dense.
GLUONNLP_NAMES: list[tuple[str, str]] = [
    ("word_embed.0.weight", "encoder.token_embedding.weight"),
    ("token_type_embed.0.weight", "encoder.segment_embedding.weight"),
    ("encoder.position_weight", "encoder.pos_embedding"),  # (P, H) there, (1, P, H) here
    ("encoder.layer_norm.{p}", "encoder.embedding_norm.{p}"),
    ("encoder.transformer_cells.{i}.attention_cell.proj_query.{p}", "encoder.blks.{i}.attention.W_q.{p}"),
    ("encoder.transformer_cells.{i}.attention_cell.proj_key.{p}", "encoder.blks.{i}.attention.W_k.{p}"),
    ("encoder.transformer_cells.{i}.attention_cell.proj_value.{p}", "encoder.blks.{i}.attention.W_v.{p}"),
    ("encoder.transformer_cells.{i}.proj.{p}", "encoder.blks.{i}.attention.W_o.{p}"),
    ("encoder.transformer_cells.{i}.layer_norm.{p}", "encoder.blks.{i}.addnorm1.ln.{p}"),
    ("encoder.transformer_cells.{i}.ffn.ffn_1.{p}", "encoder.blks.{i}.ffn.dense1.{p}"),
    ("encoder.transformer_cells.{i}.ffn.ffn_2.{p}", "encoder.blks.{i}.ffn.dense2.{p}"),
    ("encoder.transformer_cells.{i}.ffn.layer_norm.{p}", "encoder.blks.{i}.addnorm2.ln.{p}"),
    ("pooler.{p}", "hidden.0.{p}"),
    ("classifier.{p}", "nsp.output.{p}"),
    ("decoder.0.{p}", "mlm.mlp.0.{p}"),
    ("decoder.2.{p}", "mlm.mlp.2.{p}"),
    ("decoder.3.{p}", "mlm.mlp.3.{p}"),  # its weight only where not tied to the word embedding
]


def gluonnlp_canonical(name: str) -> str | None:
    """The canonical name of a tensor of GluonNLP's BERTModel, or None."""
    return translated(weight_and_bias(name), GLUONNLP_NAMES)


def gluonnlp_prefix(names: collections.abc.Collection[str]) -> str | None:
    """Where a file's names are GluonNLP's BERTModel's (its word and segment embeddings, its cells), their
    prefix: "" for the BERTModel's own file, "bert." for its BERTClassifier's, which holds it as ``bert``.
    None for any other file."""
    for prefix in ("", "bert."):
        tables = {f"{prefix}word_embed.0.weight", f"{prefix}token_type_embed.0.weight"}
        if tables <= set(names) and any(name.startswith(f"{prefix}encoder.transformer_cells.") for name in names):
            return prefix
    return None


def from_gluonnlp(path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str], prefix: str) -> Raw:
    """A GluonNLP BERTModel's file (its names under ``prefix``) as canonical tensors, the tied decoder's twin
    dropped, a BERTClassifier's head (``classifier.*``) left out with a note; any other name is a
    ``WeightsError``."""
    own = {name.removeprefix(prefix): array for name, array in arrays.items() if name.startswith(prefix)}
    head = sorted(name for name in arrays if prefix and re.fullmatch(r"classifier\.\d+\.(weight|bias)", name))
    if np.array_equal(own.get("decoder.3.weight", np.empty(0)), own["word_embed.0.weight"]):
        del own["decoder.3.weight"]  # the word embedding, saved again under the decoder's name
    canonical = {name: gluonnlp_canonical(name) for name in own}
    unknown = [prefix + name for name, found in canonical.items() if found is None]
    unknown += [name for name in arrays if not name.startswith(prefix) and name not in head]
    if unknown:
        raise WeightsError(f"{path}: GluonNLP's BERTModel's names, but tensors of no BERT layer: {unknown[:5]}")
    read = {
        found: own[name][None] if found == "encoder.pos_embedding" else own[name]
        for name, found in canonical.items()
        if found is not None
    }
    kinds = {found: dtypes[prefix + name] for name, found in canonical.items() if found is not None}
    notes = [
        "GluonNLP's BERTModel names, read as the original BERT (GluonNLP's BERTModel also zeroes the encoder's "
        "output past valid_length, which the original BERT does not)"
    ]
    if head:
        notes.append(task_head_left_out(head, "the head of GluonNLP's BERTClassifier"))
    return Raw(FORMAT.kind, None, read, kinds, notes)


def is_own(names: list[str]) -> bool:
    """Whether a state's names are Gluon's: a LayerNorm's gamma and beta mark them (d2l's MXNet BERT's)."""
    return any(name.endswith((".gamma", ".beta")) for name in names)


BACKEND = "mxnet"  # whose own file it is


class ParameterFile(FrameworkFile):
    kind = "gluon"
    description = "Gluon parameter file (save_parameters)"
    framework = BACKEND
    suffixes = (".params",)
    name_rules = NAME_RULES

    def recognizes(self, probe: Probe) -> bool:
        return probe.head.startswith(MXNET_LIST_MAGIC)

    def read_arrays(self, path: Path, key: str | None) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
        return read_checkpoint(path, key)  # framework-free: MXNet's own reader trusts every size in the file

    def read(self, path: Path, key: str | None) -> Raw:
        arrays, dtypes, notes = self.read_arrays(path, key)
        prefix = gluonnlp_prefix(arrays)
        if prefix is not None:
            return from_gluonnlp(path, arrays, dtypes, prefix)
        return Raw(self.kind, self.framework, arrays, dtypes, notes)


FORMAT = ParameterFile()
