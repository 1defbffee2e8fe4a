"""safetensors files (a HuggingFace directory's ``model.safetensors``), parsed and written without the
safetensors package: every header entry is checked against the bytes really there before any tensor is read."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...arrays import bfloat16_widened
from ...errors import WeightsError
from ...safe_files import atomic_path, check_shape, file_size, open_regular, reason
from ...spec.weight_file import c_ordered_bytes
from .base import MAX_TENSORS

MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit for its JSON header
MAX_NDIM = 32  # NumPy's limit
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
                      "I16": "int16", "I8": "int8", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}  # fmt: skip


def read_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of a safetensors file as NumPy arrays, and each one's own dtype (bfloat16 arrives
    as float32, exactly). Each header entry is checked against the bytes really there first."""

    def fail(message: str) -> WeightsError:
        return WeightsError(f"{path}: not a readable safetensors file: {message}")

    with open_regular(path, "safetensors file", WeightsError) as file:
        size = file_size(file)
        header_size, header = _read_header(file, size, fail)
        header.pop("__metadata__", None)
        if len(header) > MAX_TENSORS:
            raise fail(f"its header lists {len(header)} tensors; a BERT has hundreds")
        data_size = size - 8 - header_size
        entries = {name: _entry(name, entry, data_size, fail) for name, entry in header.items()}
        # Each byte of data belongs to one tensor at most: what is read is never more than the file holds.
        spans = sorted((begin, end, name) for name, (_, _, begin, end) in entries.items() if end > begin)
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise fail(f"tensors {first!r} and {second!r} overlap in the data")
        arrays: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        for name, (kind, shape, begin, end) in entries.items():
            dtype = np.dtype("<u2" if kind == "BF16" else SAFETENSORS_DTYPES[kind]).newbyteorder("<")
            file.seek(8 + header_size + begin)
            array = np.frombuffer(file.read(end - begin), dtype=dtype).reshape(shape)
            if kind == "BF16":
                array = bfloat16_widened(array)
            arrays[name] = array.astype(array.dtype.newbyteorder("="))
            dtypes[name] = "bfloat16" if kind == "BF16" else dtype.name
    return arrays, dtypes


def read_metadata(path: str | Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (its header checked as ``read_safetensors`` checks it): text to
    text, where transformers writes the framework whose names the tensors have (``format``: pt, tf, flax)."""

    def fail(message: str) -> WeightsError:
        return WeightsError(f"{path}: not a readable safetensors file: {message}")

    with open_regular(path, "safetensors file", WeightsError) as file:
        _, header = _read_header(file, file_size(file), fail)
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise fail(f"its __metadata__ is {metadata!r:.80}; expected an object of text")
    return metadata


def _read_header(file: BinaryIO, size: int, fail: Callable[[str], WeightsError]) -> tuple[int, dict[str, Any]]:
    """(its length, the header) of the safetensors file open in ``file``, of ``size`` bytes."""
    head = file.read(8)
    if len(head) < 8:
        raise fail(f"{size} bytes, shorter than the 8-byte header length")
    (header_size,) = struct.unpack("<Q", head)
    if header_size > min(MAX_HEADER_BYTES, size - 8):
        raise fail(f"its header claims {header_size} bytes, the file has {size - 8} after the length")
    return header_size, _header(file.read(header_size), fail)


def _header(data: bytes, fail: Callable[[str], WeightsError]) -> dict[str, Any]:
    """A safetensors header: a JSON object, each name once (JSON lets a later twin silently win)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise fail(f"{key!r} appears twice in its header")
            found[key] = value
        return found

    try:
        header = json.loads(data, object_pairs_hook=unique)
    except (ValueError, RecursionError) as error:
        if isinstance(error, WeightsError):
            raise
        raise fail(f"its header is not JSON: {reason(error)}") from None
    if not isinstance(header, dict):
        raise fail("its header is not a JSON object")
    return header


def _entry(
    name: str, entry: object, data_size: int, fail: Callable[[str], WeightsError]
) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, checked against the data really there."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise fail(f"tensor {name!r}: expected dtype, shape and data_offsets, got {entry!r:.200}")
    kind, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(kind, str) or (kind != "BF16" and kind not in SAFETENSORS_DTYPES):
        raise fail(f"tensor {name!r} has dtype {kind!r:.40}, which bert_multi does not read")
    dtype = np.dtype("<u2" if kind == "BF16" else SAFETENSORS_DTYPES[kind])
    valid = isinstance(shape, list) and len(shape) <= MAX_NDIM and all(type(n) is int and n >= 0 for n in shape)
    valid = valid and isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
    if not valid:
        raise fail(
            f"tensor {name!r}: shape (at most {MAX_NDIM} axes) and data_offsets must be lists of non-negative ints"
        )
    try:
        check_shape(tuple(shape), dtype)
    except ValueError as error:
        raise fail(f"tensor {name!r}: {error}") from None
    begin, end = offsets
    if not 0 <= begin <= end <= data_size or end - begin != math.prod(shape) * dtype.itemsize:
        raise fail(f"tensor {name!r}: data_offsets {offsets} do not hold shape {shape} of {kind} "
                   f"within the file's {data_size} data bytes")  # fmt: skip
    return kind, tuple(shape), begin, end


def write_safetensors(path: str | Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """``arrays`` as a safetensors file, atomically (float32/float64, little-endian, C order)."""
    kinds = {"float64": "F64", "float32": "F32"}
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, array in arrays.items():
        size = array.size * array.dtype.itemsize
        header[name] = {
            "dtype": kinds[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with atomic_path(path) as tmp_path, open(tmp_path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded)
        for array in arrays.values():
            for piece in c_ordered_bytes(array, array.dtype.newbyteorder("<")):
                out.write(piece)
