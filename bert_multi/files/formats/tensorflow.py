"""Google's TensorFlow BERT checkpoints (the original release, such as ``uncased_L-12_H-768_A-12/``), read
without TensorFlow.

Such a directory holds ``bert_config.json`` (transformers' config.json fields, without ``model_type``)
and a checkpoint in TensorFlow's tensor-bundle format: ``bert_model.ckpt.index``, a LevelDB table that
gives each tensor's dtype, shape and place, and ``bert_model.ckpt.data-00000-of-00001``, their bytes.
Both are parsed here, each entry checked against the bytes really there before any tensor is read. The
directory is read at its latest checkpoint; one checkpoint of it is named as TensorFlow names it, by its
prefix (``bert_model.ckpt``, ``model.ckpt-2``), or by its ``.index`` file.
Google's names are transformers' with ``/`` for ``.`` (transformers' own converter read them so), and
TensorFlow's (in, out) kernels are transposed; Adam's moments and ``global_step`` are training state,
left out with a note, as is a head that ``run_classifier.py`` or ``run_squad.py`` fine-tuned.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...arrays import bfloat16_widened
from ...errors import WeightsError
from ...safe_files import check_shape, file_size, open_regular
from .base import (
    MAX_TENSORS,
    CheckpointFormat,
    Probe,
    Raw,
    control_character,
    is_directory,
    is_regular_file,
    no_key,
    some,
    task_head_left_out,
)
from .huggingface import from_transformers_names, read_config
from .transformers_names import canonical_name

CONFIG_FILE, INDEX_SUFFIX, LATEST_FILE = "bert_config.json", ".index", "checkpoint"
TABLE_MAGIC = 0xDB4775248B80FB57  # the last 8 bytes of a LevelDB table
FOOTER_BYTES, BLOCK_TRAILER_BYTES = 48, 5  # the footer: two block handles, padding, the magic
# A BERT-large's index with Adam's moments is about 100 KB, each entry tens of bytes: the limits keep the
# work of a hostile index (its records and fields are parsed one by one) to a few million steps.
MAX_INDEX_BYTES = 4 << 20
MAX_ENTRY_BYTES = MAX_KEY_BYTES = 1024
MAX_LATEST_BYTES = 1 << 20
# TensorFlow's DataType numbers of the dtypes a BERT's weights are saved in (bfloat16 arrives as float32), and
# TensorFlow 2's string, the object graph of its checkpoints.
DTYPES = {1: "float32", 2: "float64", 3: "int32", 7: "string", 9: "int64", 14: "bfloat16", 19: "float16"}
# Training state, not the model: Adam's moments (Google's AdamWeightDecayOptimizer names them adam_m and
# adam_v, or as TensorFlow names an optimizer's slots; tf.train.Adam's), its powers of beta, the step count.
TRAINING_STATE = (
    r".*/(adam_m|adam_v|AdamWeightDecayOptimizer|AdamWeightDecayOptimizer_1|Adam|Adam_1)|beta[12]_power|global_step"
)
# A head fine-tuned by Google's scripts: run_classifier.py's classifier, run_squad.py's span head.
TASK_HEADS = r"output_(weights|bias)|cls/squad/output_(weights|bias)"


@dataclass(frozen=True)
class Entry:
    """Where one tensor of a bundle is: its dtype's name, shape, and bytes in a data shard."""

    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int


def transformers_name(name: str) -> tuple[str, bool]:
    """(transformers' name for a tensor of Google's checkpoint, whether TensorFlow's array is transposed
    there): ``/`` for ``.``, ``layer_3`` for ``layer.3``, a kernel is a (transposed) weight, as is a table."""
    dotted = re.sub(r"(?<=/)layer_(\d+)(?=/)", r"layer/\1", name).replace("/", ".")
    dotted = {
        "cls.predictions.output_bias": "cls.predictions.bias",
        "cls.seq_relationship.output_weights": "cls.seq_relationship.weight",
        "cls.seq_relationship.output_bias": "cls.seq_relationship.bias",
    }.get(dotted, dotted)
    if dotted.endswith(".kernel"):
        return dotted.removesuffix(".kernel") + ".weight", True
    if re.fullmatch(r"bert\.embeddings\.\w+_embeddings", dotted):  # a table, a variable of its own
        return dotted + ".weight", False
    return dotted, False


def checkpoint_prefix(path: Path) -> Path | None:
    """The checkpoint ``path`` names where it is TensorFlow's prefix of one (``bert_model.ckpt``, as
    ``--init_checkpoint`` takes it) or its ``.index`` file; else None."""
    if not path.name:
        return None
    prefix = path.with_name(path.name.removesuffix(INDEX_SUFFIX))
    return prefix if os.path.isfile(prefix.with_name(prefix.name + INDEX_SUFFIX)) else None


def read_checkpoint(path: Path) -> Raw:
    """The canonical tensors and config of Google's BERT checkpoint: a directory (its latest checkpoint where
    it holds several, as ``tf.train.latest_checkpoint`` picks) or one of its checkpoints (``checkpoint_prefix``),
    with notes of what was read past."""
    prefix = checkpoint_prefix(path)
    prefix, chosen = (prefix, "") if prefix is not None else latest_prefix(path)
    path, index = prefix.parent, prefix.with_name(prefix.name + INDEX_SUFFIX)
    if not is_regular_file(path / CONFIG_FILE):  # a training run's directory: its sizes are in the model's config
        raise WeightsError(
            f"{path}: a TensorFlow checkpoint without {CONFIG_FILE} beside it, which gives its sizes: copy in the "
            f"{CONFIG_FILE} of the model it was trained or fine-tuned from"
        )
    hf = read_config(path / CONFIG_FILE, "BERT config")
    entries, shards = read_index(index)
    state = [name for name in entries if re.fullmatch(TRAINING_STATE, name)]
    task = [name for name in entries if re.fullmatch(TASK_HEADS, name)]
    wanted = {name: transformers_name(name) for name in entries if name not in state and name not in task}
    unknown = [name for name, (hf_name, _) in wanted.items() if canonical_name(hf_name) is None]
    if unknown:
        raise WeightsError(f"{path}: tensors of no BERT layer bert_multi knows: {some(unknown)}")
    arrays, dtypes = read_tensors(prefix, shards, {name: entries[name] for name in wanted})
    own = {wanted[name][0]: (array.T if wanted[name][1] else array) for name, array in arrays.items()}
    kinds = {wanted[name][0]: dtype for name, dtype in dtypes.items()}
    notes = [f"read {prefix.name}{chosen} and {CONFIG_FILE} (TensorFlow's kernels transposed)"]
    if state:
        notes.append(f"left out {len(state)} tensors of training state (Adam's moments, global_step): {some(state)}")
    if task:
        notes.append(task_head_left_out(task, "a head fine-tuned for a task"))
    config, canonical, canonical_dtypes = from_transformers_names(index, path / CONFIG_FILE, own, kinds, hf, notes)
    return Raw(FORMAT.kind, None, canonical, canonical_dtypes, notes, config=config, settings=hf)


def latest_prefix(path: Path, beside: str = f" with {CONFIG_FILE}") -> tuple[Path, str]:
    """The prefix of the directory's checkpoint (``bert_model.ckpt``): its only one, else the latest its
    ``checkpoint`` file names. And why, where it chose (``beside``: what to keep the one to read with)."""
    found = sorted(name.name.removesuffix(INDEX_SUFFIX) for name in path.glob(f"*{INDEX_SUFFIX}"))
    if len(found) == 1:
        return path / found[0], ""
    if not found:
        raise WeightsError(f"{path}: holds {CONFIG_FILE} but no TensorFlow checkpoint (no *{INDEX_SUFFIX} file)")
    latest = None
    if is_regular_file(path / LATEST_FILE):
        with open_regular(path / LATEST_FILE, "TensorFlow checkpoint list", WeightsError) as file:
            text = file.read(MAX_LATEST_BYTES).decode("utf-8", "replace")
        match = re.search(r'^model_checkpoint_path: "([^"\n]*)"', text, re.MULTILINE)
        latest = Path(match[1]).name if match else None
    if latest not in found:
        raise WeightsError(
            f"{path}: holds {len(found)} checkpoints ({some(found)}) and no {LATEST_FILE} file naming one of them "
            f"as the latest: keep the one to read alone{beside}"
        )
    return path / latest, f" (the latest of {len(found)} checkpoints, as its {LATEST_FILE} file says)"


# --- the tensor bundle ------------------------------------------------------------------------------------


class Malformed(Exception):
    """A structure of the index that is not what it claims to be (said as a ``WeightsError``)."""


def varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The unsigned LEB128 number at ``data[at]`` (at most 10 bytes, before ``end``), and where it ends."""
    value = 0
    for shift in range(0, 70, 7):
        if at >= end:
            raise Malformed("a number runs past the end of its record")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
    raise Malformed("a number longer than 10 bytes")


def proto_fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """A protocol-buffer message's (field number, value): a number, or a length-delimited field's bytes."""
    at, end = 0, len(message)
    while at < end:
        key, at = varint(message, at, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(message, at, end)
            yield number, value
        elif wire in (1, 5):  # fixed64, fixed32 (a checksum): skipped
            at += 8 if wire == 1 else 4
            if at > end:
                raise Malformed("a field runs past the end of its record")
        elif wire == 2:
            length, at = varint(message, at, end)
            if at + length > end:
                raise Malformed("a field runs past the end of its record")
            yield number, message[at : at + length]
            at += length
        else:
            raise Malformed(f"a field of wire type {wire}")


def _entry(value: bytes) -> Entry:
    """A ``BundleEntryProto``: dtype (1), shape (2: ``TensorShapeProto``, each dim's size in field 1 of
    field 2), shard_id (3), offset (4), size (5); slices (7) are a partitioned variable's."""
    fields: dict[int, Any] = {}
    dims: list[int] = []
    for number, field in proto_fields(value):
        if number == 2 and isinstance(field, bytes):
            for shape_number, dim in proto_fields(field):
                if shape_number == 3 and dim:
                    raise Malformed("its shape is of unknown rank")
                if shape_number == 2 and isinstance(dim, bytes):
                    dims.append(next((size for n, size in proto_fields(dim) if n == 1 and isinstance(size, int)), 0))
                if len(dims) > 32:
                    raise Malformed("a shape of more than 32 axes; NumPy's arrays have at most 32")
        elif number == 7:
            raise Malformed("a partitioned variable (saved in slices), which bert_multi does not read")
        elif isinstance(field, int):
            fields[number] = field
    dtype = DTYPES.get(fields.get(1, 0))
    if dtype is None:
        raise Malformed(f"TensorFlow dtype number {fields.get(1, 0)}, which bert_multi does not read")
    if any(dim >= 1 << 62 for dim in dims):
        raise Malformed(f"a shape {tuple(dims)} with an axis past 2**62")
    return Entry(dtype, tuple(dims), fields.get(3, 0), fields.get(4, 0), fields.get(5, 0))


def _block(file: BinaryIO, size: int, handle: bytes, at: int = 0) -> tuple[bytes, int]:
    """The block a ``BlockHandle`` (offset, size) at ``handle[at]`` points to, and where the handle ends."""
    offset, at = varint(handle, at, len(handle))
    length, at = varint(handle, at, len(handle))
    if offset + length + BLOCK_TRAILER_BYTES > size:
        raise Malformed(f"a block of {length} bytes at {offset}, past the file's {size} bytes")
    file.seek(offset)
    data = file.read(length + BLOCK_TRAILER_BYTES)
    if len(data) < length + BLOCK_TRAILER_BYTES:
        raise Malformed(f"a block of {length} bytes at {offset}, cut short")
    if data[length] != 0:
        raise Malformed(f"a block compressed with method {data[length]}; TensorFlow writes them uncompressed")
    return data[:length], at


def _records(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """A table block's (key, value) records: each key shares a prefix with the one before."""
    if len(block) < 4:
        raise Malformed("a block shorter than its restart count")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise Malformed(f"a block of {len(block)} bytes claims {restarts} restart points")
    at, key = 0, b""
    while at < end:
        shared, at = varint(block, at, end)
        unshared, at = varint(block, at, end)
        length, at = varint(block, at, end)
        if shared > len(key) or at + unshared + length > end:
            raise Malformed("a record runs past its block")
        key = key[:shared] + block[at : at + unshared]
        if len(key) > MAX_KEY_BYTES:  # each key is built from the last: a long one would be copied each time
            raise Malformed(f"a key of over {MAX_KEY_BYTES} bytes, where a tensor's name is tens")
        yield key, block[at + unshared : at + unshared + length]
        at += unshared + length


def read_index(path: Path) -> tuple[dict[str, Entry], int]:
    """Every tensor's ``Entry`` in a bundle's ``.index`` table, by name, and its number of data shards."""
    with open_regular(path, "TensorFlow checkpoint index", WeightsError) as file:
        size = file_size(file)
        try:
            if not FOOTER_BYTES <= size <= MAX_INDEX_BYTES:
                raise Malformed(f"{size} bytes, where an index is {FOOTER_BYTES} bytes to {MAX_INDEX_BYTES >> 20} MiB")
            file.seek(size - FOOTER_BYTES)
            footer = file.read(FOOTER_BYTES)
            if struct.unpack_from("<Q", footer, FOOTER_BYTES - 8)[0] != TABLE_MAGIC:
                raise Malformed("it does not end with a LevelDB table's magic number")
            _, at = varint(footer, 0, FOOTER_BYTES - 8)  # the metaindex handle, of no use here
            _, at = varint(footer, at, FOOTER_BYTES - 8)
            index, _ = _block(file, size, footer, at)
            return _entries(file, size, index)
        except Malformed as error:
            raise WeightsError(f"{path}: not a readable TensorFlow checkpoint index: {error}") from None


def _entries(file: BinaryIO, size: int, index: bytes) -> tuple[dict[str, Entry], int]:
    entries: dict[str, Entry] = {}
    shards = None
    read = records = 0  # the bytes of the blocks read (at most the file's: no block is read twice), the records
    for _, handle in _records(index):
        block = _block(file, size, handle)[0]
        read += len(block)
        if read > size:
            raise Malformed("its index points to some block twice")
        for key, value in _records(block):
            records += 1  # the header's too: each is work
            if records > MAX_TENSORS + 1:
                raise Malformed(f"it holds over {MAX_TENSORS} records; a BERT's index lists hundreds of tensors")
            if len(value) > MAX_ENTRY_BYTES:
                raise Malformed(f"a record of {len(value)} bytes, where a tensor's entry is tens of bytes")
            if key == b"":  # the header: BundleHeaderProto's num_shards (1), endianness (2: 0 little)
                header = {number: field for number, field in proto_fields(value) if isinstance(field, int)}
                if header.get(2, 0) != 0:
                    raise Malformed("its tensors are big-endian")
                shards = header.get(1, 0)
                continue
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                raise Malformed(f"a tensor name that is not UTF-8: {key[:60]!r}") from None
            if control_character(name) is not None:
                raise Malformed(f"a tensor name holds the control character {control_character(name)}")
            if name in entries:
                raise Malformed(f"{name!r:.80} appears twice")
            try:
                entries[name] = _entry(value)
            except Malformed as error:
                raise Malformed(f"tensor {name!r:.80}: {error}") from None
    if shards is None or not 1 <= shards <= 1 << 16:
        raise Malformed(f"its header gives {shards} data shards")
    return entries, shards


def shard_path(prefix: Path, shard: int, shards: int) -> Path:
    """The data file of a checkpoint's ``shard`` (of ``shards``), beside its ``prefix``."""
    return prefix.with_name(f"{prefix.name}.data-{shard:05d}-of-{shards:05d}")


def read_tensors(prefix: Path, shards: int, entries: dict[str, Entry]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors ``entries`` place in the data shards beside ``prefix`` (``prefix.data-00000-of-00001``):
    each checked to be of its shape's size and within its shard first. And each one's own dtype."""
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    by_shard: dict[int, list[str]] = {}
    for name, entry in entries.items():
        by_shard.setdefault(entry.shard, []).append(name)
    for shard, names in sorted(by_shard.items()):
        path = shard_path(prefix, shard, shards)
        if shard >= shards:
            raise WeightsError(f"{prefix}: tensor {names[0]!r} is in shard {shard} of {shards}")
        # Each byte of a shard belongs to one tensor at most: what is read is never more than the files hold.
        spans = sorted((entries[name].offset, entries[name].offset + entries[name].size, name) for name in names)
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise WeightsError(f"{path}: tensors {first!r} and {second!r} overlap in the data")
        with open_regular(path, "TensorFlow checkpoint data", WeightsError) as file:
            size = file_size(file)
            for name in names:
                entry = entries[name]
                if entry.dtype == "string":  # TensorFlow 2's object graph, read by tf_objects.read_text
                    raise WeightsError(f"{path}: tensor {name!r} holds text, where weights are numbers")
                stored = np.dtype("<u2" if entry.dtype == "bfloat16" else entry.dtype).newbyteorder("<")
                try:
                    check_shape(entry.shape, stored)
                except ValueError as error:
                    raise WeightsError(f"{path}: tensor {name!r}: {error}") from None
                if entry.size != math.prod(entry.shape) * stored.itemsize or entry.offset + entry.size > size:
                    raise WeightsError(
                        f"{path}: tensor {name!r} of shape {entry.shape} claims {entry.size} bytes at {entry.offset}, "
                        f"which are not its shape's, or not within the file's {size}"
                    )
                file.seek(entry.offset)
                array = np.frombuffer(file.read(entry.size), dtype=stored).reshape(entry.shape)
                if entry.dtype == "bfloat16":
                    array = bfloat16_widened(array)
                arrays[name] = array.astype(array.dtype.newbyteorder("="))
                dtypes[name] = entry.dtype
    return arrays, dtypes


def is_checkpoint_directory(path: Path) -> bool:
    """Whether ``path`` holds a TensorFlow checkpoint (Google's BERT directory: with ``bert_config.json``)."""
    return any(path.glob(f"*{INDEX_SUFFIX}"))


class GoogleDirectory(CheckpointFormat):
    kind = "tf-dir"
    description = "Google's TensorFlow BERT directory (bert_config.json + bert_model.ckpt.index and .data files)"
    directory = True
    marker_files = (CONFIG_FILE,)

    def recognizes(self, probe: Probe) -> bool:
        return is_directory(probe.path) and is_checkpoint_directory(probe.path)

    def names_checkpoint(self, path: Path) -> bool:
        return checkpoint_prefix(path) is not None

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        return read_checkpoint(path)


FORMAT = GoogleDirectory()
