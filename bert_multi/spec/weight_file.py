"""The canonical weight file: a NumPy ``.npz`` of the schema's tensors plus a JSON manifest.

The manifest (stored as UTF-8 bytes under ``__manifest__``) records the format name and version, the
model config, the dtype and a SHA-256 per tensor. Nothing on the load path can unpickle anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import WeightsError
from ..safe_files import NpzReader, open_regular, replace_file
from .config import D2L_ARGUMENTS, BERTConfig
from .schema import SUPPORTED_DTYPES, check_names, param_shapes_within, validate_weights

FORMAT_NAME = "bert_multi.weights"
# The newest version this bert_multi reads. Version 2 adds the config's semantics (a d2l generation
# other than 1.0's) and heads (when some are absent); a file of a complete d2l 1.0 model is still
# written as version 1, exactly as before, so that releases that predate these read it, and refuse the
# others instead of misreading them.
FORMAT_VERSION = 2
MANIFEST_KEY = "__manifest__"
MAX_MANIFEST_BYTES = 1 << 24  # a BERT-base manifest is about 20 KB


# Below glibc's threshold for serving a block straight from the system (``memory``), so that each piece
# reuses the memory the one before it freed.
PIECE_BYTES = 1 << 19


def c_ordered_bytes(array: np.ndarray, dtype: np.dtype | None = None) -> Iterator[memoryview]:
    """An array's values as C-ordered bytes (in ``dtype``, default its own), in pieces: its own memory
    when it is laid out so, else copies of a few rows at a time, where a whole copy of a transposed
    tensor (a Flax kernel is exported as a view) would be fresh memory the size of it, for one pass."""
    dtype = array.dtype if dtype is None else dtype
    if array.dtype == dtype and array.flags.c_contiguous:
        yield array.reshape(-1).view(np.uint8).data
        return
    if array.size == 0:
        return
    array = array.reshape(1) if array.ndim == 0 else array
    rows = max(1, PIECE_BYTES // (array[0].size * dtype.itemsize))
    for start in range(0, len(array), rows):
        yield np.ascontiguousarray(array[start : start + rows], dtype=dtype).reshape(-1).view(np.uint8).data


def tensor_sha256(array: np.ndarray) -> str:
    """SHA-256 of a tensor's values as little-endian, C-ordered bytes (hashed in place when they are)."""
    digest = hashlib.sha256()
    for piece in c_ordered_bytes(array, array.dtype.newbyteorder("<")):
        digest.update(piece)
    return digest.hexdigest()


# hashlib lets go of the GIL while it hashes, so threads hash tensors side by side, or hash one tensor
# while the next is read.
HASH_THREADS = min(4, os.cpu_count() or 1)


def make_manifest(config: BERTConfig, weights: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = dict(zip(weights, pool.map(tensor_sha256, weights.values())))
    return {
        "format": FORMAT_NAME,
        "format_version": 1 if config.to_dict().keys() == set(D2L_ARGUMENTS) else 2,
        "config": config.to_dict(),
        "dtype": dtype,
        "tensors": digests,
    }


def write_npz(path: str | os.PathLike, manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write a manifest and arrays as an .npz, atomically."""
    manifest_bytes = np.frombuffer(json.dumps(manifest, indent=1).encode("utf-8"), dtype=np.uint8)
    replace_file(path, lambda file: write_archive(file, {MANIFEST_KEY: manifest_bytes, **arrays}))


def write_archive(file: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``file`` as the archive ``np.savez`` writes (uncompressed ``.npy`` members,
    zip64; byte for byte when the arrays are C-ordered, and others are written C-ordered), but with each
    array's bytes handed to the file as they are (``c_ordered_bytes``), where ``np.savez`` copies them
    out in 16 MiB pieces."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                header = np.lib.format.header_data_from_array_1_0(array)
                np.lib.format.write_array_header_1_0(member, {**header, "fortran_order": False})
                for piece in c_ordered_bytes(array):
                    member.write(piece)


def save_weights(path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> Path:
    """Validate ``weights`` against ``config``'s schema and write the canonical file atomically.

    Refuses (``WeightsError``) anything ``load_weights`` would reject, before touching the disk.
    """
    if not isinstance(config, BERTConfig):
        raise WeightsError(f"config must be a BERTConfig, got {type(config).__name__}")
    dtype = validate_weights(config, weights)
    write_npz(path, make_manifest(config, weights, dtype), weights)
    return Path(path)


def _describe_member(name: str) -> str:
    return "the manifest" if name == MANIFEST_KEY else f"tensor {name!r}"


def read_json_manifest(path: Path, archive: NpzReader, what: str) -> dict[str, Any]:
    """The JSON object an archive stores as uint8 bytes under ``__manifest__``, size checked before it is
    read; anything else is a ``WeightsError`` saying the file is not a bert_multi ``what``."""
    if MANIFEST_KEY not in archive:
        raise WeightsError(
            f"{path}: no {MANIFEST_KEY!r} entry; this is not a bert_multi {what} (an .npz of named arrays alone, "
            "np.savez of a state_dict, reads with load_checkpoint, which asks for what its names cannot tell)"
        )
    header = archive.header(MANIFEST_KEY)
    if header.dtype != np.uint8 or len(header.shape) != 1 or header.nbytes > MAX_MANIFEST_BYTES:
        raise WeightsError(
            f"{path}: the manifest is unreadable: expected at most {MAX_MANIFEST_BYTES} bytes of 1-D uint8 "
            f"JSON, got {header.dtype} of shape {header.shape}"
        )
    try:
        manifest = json.loads(archive.read(MANIFEST_KEY, header).tobytes().decode("utf-8"))
    except (ValueError, RecursionError) as error:  # RecursionError: JSON nested too deeply
        raise WeightsError(f"{path}: the manifest is unreadable: {type(error).__name__}: {error}") from None
    if not isinstance(manifest, dict):
        raise WeightsError(f"{path}: the manifest must be a JSON object, got {type(manifest).__name__}")
    return manifest


def _read_manifest(path: Path, archive: NpzReader) -> tuple[BERTConfig, str, dict[str, str]]:
    manifest = read_json_manifest(path, archive, "weights file")
    for field in ("format", "format_version", "config", "dtype", "tensors"):
        if field not in manifest:
            raise WeightsError(f"{path}: the manifest has no {field!r} field")
    if manifest["format"] != FORMAT_NAME:
        raise WeightsError(f"{path}: manifest format is {manifest['format']!r}, expected {FORMAT_NAME!r}")
    version = manifest["format_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise WeightsError(f"{path}: manifest format_version is {version!r}, expected a positive int")
    if version > FORMAT_VERSION:
        raise WeightsError(
            f"{path}: format version {version} is newer than this bert_multi reads "
            f"(up to {FORMAT_VERSION}); upgrade bert_multi"
        )
    try:
        config = BERTConfig.from_dict(manifest["config"])
    except (ValueError, TypeError) as error:
        raise WeightsError(f"{path}: the manifest's config is invalid: {error}") from error
    if manifest["dtype"] not in SUPPORTED_DTYPES:
        raise WeightsError(f"{path}: manifest dtype is {manifest['dtype']!r}, expected one of {SUPPORTED_DTYPES}")
    digests = manifest["tensors"]
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise WeightsError(f"{path}: manifest 'tensors' must map each tensor name to its SHA-256 hex string")
    return config, manifest["dtype"], digests


def load_weights(path: str | os.PathLike) -> tuple[BERTConfig, dict[str, np.ndarray]]:
    """Read and check a canonical weight file; return its config and weights (in native byte order).

    Every problem (unreadable, truncated or hostile file, missing or bad manifest, future format
    version, a missing, extra, mis-shaped, wrongly typed, non-finite or tampered tensor) is a
    ``WeightsError`` whose message names the file and the tensor or field at fault. Each tensor's
    header is checked against the schema before its data is read, so time and memory stay in
    proportion to the file's real size.
    """
    path = Path(path)
    with open_regular(path, "weights file", WeightsError) as file:
        archive = NpzReader(file, path, WeightsError, describe=_describe_member)
        config, dtype, digests = _read_manifest(path, archive)
        names = archive.names
        stored = set(names) - {MANIFEST_KEY}
        unlisted = [name for name in names if name in stored and name not in digests]
        if unlisted:
            raise WeightsError(f"{path}: tensor(s) {unlisted[:5]} are in the file but not in its manifest")
        absent = [name for name in digests if name not in stored]
        if absent:
            raise WeightsError(f"{path}: tensor(s) {absent[:5]} are listed in the manifest but missing from the file")
        # A schema larger than the file cannot match it; building no more of it than the file could
        # hold keeps a config claiming 10**40 blocks from costing anything.
        shapes = param_shapes_within(config, len(stored))
        try:
            check_names(shapes, stored)
        except WeightsError as error:
            raise WeightsError(f"{path}: {error}") from None
        weights = {}
        # Tensors are hashed in a thread while the next ones are read, and checked in order at the end.
        with ThreadPoolExecutor(1) as hasher:
            hashing: dict[str, Future[str]] = {}
            for name, expected_shape in shapes.items():
                header = archive.header(name)
                if header.dtype.name != dtype:
                    raise WeightsError(f"{path}: tensor {name!r} has dtype {header.dtype}, the manifest says {dtype}")
                if header.shape != expected_shape:
                    raise WeightsError(f"{path}: tensor {name!r} has shape {header.shape}, expected {expected_shape}")
                array = archive.read(name, header, check_crc=False)  # its SHA-256 is checked instead
                hashing[name] = hasher.submit(tensor_sha256, array)
                weights[name] = array.astype(array.dtype.newbyteorder("="), copy=False)
            for name, digest in hashing.items():
                if digest.result() != digests[name]:
                    raise WeightsError(
                        f"{path}: tensor {name!r} fails its SHA-256 check: "
                        "the file was modified or corrupted after it was written"
                    )
    try:
        validate_weights(config, weights)
    except WeightsError as error:
        raise WeightsError(f"{path}: {error}") from error
    return config, weights
