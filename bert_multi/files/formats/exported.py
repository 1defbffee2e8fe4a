"""An ExportedProgram's archive (``torch.export.save``, ``.pt2``) as a checkpoint format, read without torch.

The archive is a zip whose one folder holds ``archive_format`` ("pt2"), the traced graph (``models/``, JSON)
and the program's state_dict apart from it: a table of its tensors (``data/weights/model_weights_config.json``:
each one's file, dtype, sizes, strides and storage offset) and each storage's raw bytes
(``data/weights/weight_N``; tensors that share a storage, a tied weight's, share its file). bert_multi reads the
table and the bytes, checked against each other before anything is allocated; it never reads the graph, and a
tensor torch pickled there (a tensor subclass's) is refused, as is the sample inputs' pickle never opened. The
names are the module's own, read as a state_dict's."""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ...arrays import bfloat16_widened
from ...errors import WeightsError
from ...safe_files import open_regular
from .base import MAX_TENSORS, CheckpointFormat, Probe, Raw, check_member, no_key, some, zip_errors

FORMAT_FILE = "archive_format"
WEIGHTS_DIR = "data/weights/"
CONFIG_SUFFIX = "_weights_config.json"  # model_weights_config.json: the program saved as "model"
MAX_CONFIG_BYTES = 64 << 20  # a BERT-large's table is about 2 MB
# torch.export's serialized dtypes (torch/_export/serde/schema.py's ScalarType) that a BERT's weights have.
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32", 8: "float64",
          12: "bool", 13: "bfloat16"}  # fmt: skip
STRIDED = 7  # torch.strided, the only layout of a weight saved as raw bytes
AOTI_DIR = "/data/aotinductor/"  # an AOTInductor package's compiled models, one folder each


def _format_folders(members: tuple[str, ...]) -> list[str]:
    """The folders of a zip's ``members`` that hold a ``.pt2`` archive's ``archive_format``."""
    return [name[: -len(FORMAT_FILE)] for name in members if name.rpartition("/")[2] == FORMAT_FILE]


def archive_root(members: tuple[str, ...]) -> str | None:
    """The folder ``torch.export.save`` put everything in (``bert/``, after the file), where ``members`` are
    such an archive's; else None."""
    folders = _format_folders(members)
    return folders[0] if len(folders) == 1 and folders[0].count("/") == 1 else None


def weights_tables(members: tuple[str, ...], root: str) -> list[str]:
    """The state_dicts' tables of the archive's programs (one per program it holds)."""
    return [name for name in members if name.startswith(root + WEIGHTS_DIR) and name.endswith(CONFIG_SUFFIX)]


def unread_archive(path: Path, members: tuple[str, ...]) -> str | None:
    """What a zip of ``members`` is when torch wrote it as a ``.pt2`` archive bert_multi does not read (an
    AOTInductor package; an ExportedProgram's without a table of its weights, which an older torch pickled), and
    how to make a file bert_multi reads; else None."""
    if not _format_folders(members):
        return None
    if any(AOTI_DIR in name for name in members):
        return (
            "an AOTInductor package (torch._inductor.aoti_compile_and_package, .pt2): the model compiled to a shared "
            "library, its weights inside it, which bert_multi does not read; where the model is, torch saves its "
            "state_dict (torch.save(model.state_dict(), 'bert.pt')) or its ExportedProgram "
            "(torch.export.save(torch.export.export(model, args), 'bert.pt2')), each of which bert_multi reads"
        )
    return (
        "an ExportedProgram's archive (torch.export.save, .pt2) without torch.export's table of its weights "
        "(data/weights/model_weights_config.json), which bert_multi reads, its weights pickled as an older torch saved "
        "them; torch saves its state_dict as one torch.save file, which bert_multi reads: "
        f"torch.save(torch.export.load({os.path.abspath(path)!r}).state_dict, 'bert.pt')"
    )


class ExportedProgram(CheckpointFormat):
    kind = "pt2"
    description = "ExportedProgram archive (torch.export.save, .pt2: its state_dict read, its graph not)"
    zip_marker = "an ExportedProgram's archive (no data/weights/model_weights_config.json)"
    holds_transformers_names = True

    def recognizes(self, probe: Probe) -> bool:
        root = archive_root(probe.members)
        return root is not None and bool(weights_tables(probe.members, root))

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        with zip_errors(path), open_regular(path, "ExportedProgram archive", WeightsError) as file:
            with zipfile.ZipFile(file) as archive:
                arrays, dtypes = read_state_dict(path, archive)
        return Raw(self.kind, None, arrays, dtypes, ["read the ExportedProgram's state_dict, not its graph"])


def read_state_dict(path: Path, archive: zipfile.ZipFile) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The program's state_dict (each tensor as a NumPy array, bfloat16 as float32) and each one's own dtype."""
    members = tuple(archive.namelist())
    root = archive_root(members) or ""
    if root + "byteorder" in members and (order := _member(path, archive, root + "byteorder", 16)) != b"little":
        raise WeightsError(f"{path}: its tensors are in byte order {order!r}; bert_multi reads b'little'")
    tables = weights_tables(members, root)
    if len(tables) != 1:
        raise WeightsError(f"{path}: the archive holds {len(tables)} programs' weights ({some(tables)}); bert_multi "
                           "reads an archive of one, as torch.export.save writes it")  # fmt: skip
    table = _json(path, archive, tables[0])
    entries = table.get("config") if isinstance(table, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise WeightsError(f"{path}: {tables[0]} lists no tensors under 'config'; expected torch.export's table")
    if len(entries) > MAX_TENSORS:
        raise WeightsError(f"{path}: {tables[0]} lists {len(entries)} tensors; a BERT has hundreds")
    by_file: dict[str, list[tuple[str, str, list[int], list[int], int]]] = {}
    for name, entry in entries.items():
        dtype, sizes, strides, offset, file_name = _entry(path, name, entry)
        by_file.setdefault(file_name, []).append((name, dtype, sizes, strides, offset))
    arrays, dtypes = {}, {}
    for file_name, views in by_file.items():  # each storage read once, and let go once its tensors are copied
        storage = _member(path, archive, root + WEIGHTS_DIR + file_name)
        for name, dtype, sizes, strides, offset in views:
            arrays[name], dtypes[name] = _view(path, name, storage, dtype, sizes, strides, offset), dtype
    return {name: arrays[name] for name in entries}, dtypes


def _json(path: Path, archive: zipfile.ZipFile, name: str) -> Any:
    try:
        return json.loads(_member(path, archive, name, MAX_CONFIG_BYTES))
    except (ValueError, RecursionError) as error:
        raise WeightsError(f"{path}: {name} is not JSON ({str(error)[:200]})") from None


def _member(path: Path, archive: zipfile.ZipFile, name: str, limit: int | None = None) -> bytes:
    """A member's bytes, its size (and, compressed, its expansion) bounded before any is read."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise WeightsError(f"{path}: the archive holds no {name}, which its table of weights names") from None
    if limit is not None and info.file_size > limit:
        raise WeightsError(f"{path}: {name} claims {info.file_size} bytes; expected at most {limit}")
    check_member(info, path)
    with archive.open(info) as source:
        data = source.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise WeightsError(f"{path}: {name} holds {len(data)} bytes where the zip says {info.file_size}")
    return data


def _entry(path: Path, name: str, entry: Any) -> tuple[str, list[int], list[int], int, str]:
    """A table entry's (dtype, sizes, strides, storage offset, file), each checked for its kind."""
    if not isinstance(name, str) or not isinstance(entry, dict) or not isinstance(entry.get("tensor_meta"), dict):
        raise WeightsError(f"{path}: the table's entry {name!r:.80} is not torch.export's (path_name, tensor_meta)")
    if entry.get("use_pickle") is not False:
        raise WeightsError(f"{path}: {name!r} is saved as a pickle (a tensor subclass's), which bert_multi never "
                           "unpickles; a plain tensor is saved as raw bytes")  # fmt: skip
    meta, file_name = entry["tensor_meta"], entry.get("path_name")
    if not isinstance(file_name, str) or not file_name or "/" in file_name:
        raise WeightsError(f"{path}: {name!r} names the file {file_name!r:.80}; expected one of data/weights/")
    if meta.get("layout") != STRIDED or meta.get("dtype") not in DTYPES:
        layout, dtype = meta.get("layout"), meta.get("dtype")
        raise WeightsError(f"{path}: {name!r} has layout {layout!r:.20} and dtype {dtype!r:.20}; expected a "
                           f"strided tensor ({STRIDED}) of one of {sorted(DTYPES)}")  # fmt: skip
    sizes, strides = (_integers(path, name, what, meta.get(what)) for what in ("sizes", "strides"))
    if len(sizes) != len(strides) or len(sizes) > 32:
        raise WeightsError(f"{path}: {name!r} has {len(sizes)} sizes and {len(strides)} strides; expected as many")
    (offset,) = _integers(path, name, "storage_offset", [meta.get("storage_offset")])
    return DTYPES[meta["dtype"]], sizes, strides, offset, file_name


def _integers(path: Path, name: str, what: str, values: Any) -> list[int]:
    """torch.export's integers (``{"as_int": 3}``) as ints from 0 to 2**40; a symbolic one is refused."""
    numbers: list[int] = []
    for value in values if isinstance(values, list) else [None]:
        number = value.get("as_int") if isinstance(value, dict) else None
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= 1 << 40:
            raise WeightsError(f"{path}: {name!r} has {what} {values!r:.80}; expected a list of whole numbers from 0 "
                               "to 2**40, none symbolic")  # fmt: skip
        numbers.append(number)
    return numbers


def _view(
    path: Path, name: str, storage: bytes, dtype: str, sizes: list[int], strides: list[int], offset: int
) -> np.ndarray:
    """The tensor torch builds with ``as_strided`` over its storage, copied; every element it reaches checked to
    be inside the storage first."""
    stored = np.dtype("<u2") if dtype == "bfloat16" else np.dtype(dtype).newbyteorder("<")  # bfloat16's bits
    itemsize, elements = stored.itemsize, len(storage) // stored.itemsize
    if 0 in sizes:
        return np.zeros(sizes, np.float32 if dtype == "bfloat16" else dtype)
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    # A weight's elements are its storage's, each once: more would be one element repeated (a stride of 0),
    # which no weight is, and a way for a few bytes to claim any amount of memory.
    if len(storage) % itemsize or last >= elements or math.prod(sizes) > elements:
        raise WeightsError(f"{path}: {name!r} of sizes {sizes} reaches element {last} of a storage of "
                           f"{len(storage)} bytes ({elements} of {dtype})")  # fmt: skip
    flat = np.frombuffer(storage, stored)
    view = np.lib.stride_tricks.as_strided(flat[offset:], sizes, [stride * itemsize for stride in strides])
    # Either makes an array of its own, leaving the storage's bytes free to go.
    return bfloat16_widened(view) if dtype == "bfloat16" else view.astype(stored.newbyteorder("="))


FORMAT = ExportedProgram()
