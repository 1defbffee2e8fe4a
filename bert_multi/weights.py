"""The canonical weight file: a NumPy ``.npz`` of the schema's tensors plus a JSON manifest.

The manifest (stored as UTF-8 bytes under ``__manifest__``) records the format name and version, the
model config, the dtype and a SHA-256 per tensor. Nothing on the load path can unpickle anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .config import BERTConfig
from .errors import WeightsError
from .schema import SUPPORTED_DTYPES, param_shapes, validate_weights

FORMAT_NAME = "bert_multi.weights"
FORMAT_VERSION = 1
MANIFEST_KEY = "__manifest__"


def tensor_sha256(array: np.ndarray) -> str:
    """SHA-256 of a tensor's values as little-endian, C-ordered bytes."""
    little_endian = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return hashlib.sha256(little_endian.tobytes()).hexdigest()


def make_manifest(config: BERTConfig, weights: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "dtype": dtype,
        "tensors": {name: tensor_sha256(array) for name, array in weights.items()},
    }


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on failure delete it.

    Whatever goes wrong before the rename, an earlier file at ``path`` is left as it was.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp_name)
        with open(tmp_name, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def write_npz(path: str | os.PathLike, manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write a manifest and arrays as an .npz, atomically."""
    manifest_bytes = np.frombuffer(json.dumps(manifest, indent=1).encode("utf-8"), dtype=np.uint8)
    with atomic_path(path) as tmp_path, open(tmp_path, "wb") as file:
        # Writing to an open file keeps np.savez from appending ".npz" to the user's name.
        np.savez(file, **{MANIFEST_KEY: manifest_bytes}, **arrays)


def save_weights(path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> Path:
    """Validate ``weights`` against ``config``'s schema and write the canonical file atomically.

    Refuses (``WeightsError``) anything ``load_weights`` would reject, before touching the disk.
    """
    if not isinstance(config, BERTConfig):
        raise WeightsError(f"config must be a BERTConfig, got {type(config).__name__}")
    dtype = validate_weights(config, weights)
    write_npz(path, make_manifest(config, weights, dtype), weights)
    return Path(path)


def _parse_manifest(path: Path, archive: Any) -> tuple[BERTConfig, str, dict[str, str]]:
    if MANIFEST_KEY not in archive.files:
        raise WeightsError(f"{path}: no {MANIFEST_KEY!r} entry; this is not a bert_multi weights file")
    try:
        raw = archive[MANIFEST_KEY]
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise ValueError(f"expected 1-D uint8 JSON bytes, got {raw.dtype} of shape {raw.shape}")
        manifest = json.loads(raw.tobytes().decode("utf-8"))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise WeightsError(f"{path}: the manifest is unreadable: {error}") from error
    if not isinstance(manifest, dict):
        raise WeightsError(f"{path}: the manifest must be a JSON object, got {type(manifest).__name__}")
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
    """Read and check a canonical weight file; return its config and weights.

    Every problem (unreadable or truncated file, missing or bad manifest, future format version, a
    missing, extra, mis-shaped, wrongly typed, non-finite or tampered tensor) is a ``WeightsError``
    whose message names the file and the tensor or field at fault.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise WeightsError(f"{path}: not a readable .npz file (truncated or corrupt?): {error}") from error
    if not hasattr(archive, "files"):
        raise WeightsError(f"{path}: holds a single array, not an .npz archive of named tensors")
    with archive:
        config, dtype, digests = _parse_manifest(path, archive)
        stored = [name for name in archive.files if name != MANIFEST_KEY]
        unlisted = [name for name in stored if name not in digests]
        if unlisted:
            raise WeightsError(f"{path}: tensor(s) {unlisted[:5]} are in the file but not in its manifest")
        absent = [name for name in digests if name not in stored]
        if absent:
            raise WeightsError(f"{path}: tensor(s) {absent[:5]} are listed in the manifest but missing from the file")
        weights = {}
        for name in stored:
            try:
                array = archive[name]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
                raise WeightsError(f"{path}: tensor {name!r} is unreadable: {error}") from error
            if array.dtype.name != dtype:
                raise WeightsError(f"{path}: tensor {name!r} has dtype {array.dtype}, the manifest says {dtype}")
            if tensor_sha256(array) != digests[name]:
                raise WeightsError(
                    f"{path}: tensor {name!r} fails its SHA-256 check: "
                    "the file was modified or corrupted after it was written"
                )
            weights[name] = array
    try:
        validate_weights(config, weights)
    except WeightsError as error:
        raise WeightsError(f"{path}: {error}") from error
    return config, {name: weights[name] for name in param_shapes(config)}
