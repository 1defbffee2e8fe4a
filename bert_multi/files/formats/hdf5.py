"""HDF5 files as Keras 2's ``save_weights`` writes them (transformers 4's ``tf_model.h5``), read without
h5py: the parts of HDF5 such a file uses, each address and size checked against the file before it is
followed.

h5py writes, by default, the file format's first versions: a superblock of version 0, groups as symbol
tables (a B-tree of version 1 whose leaves list each member's name, kept in the group's local heap, and
its object header), object headers of version 1, and each dataset's values contiguous in the file. A
dataset's header holds its shape (dataspace message), its element type (datatype) and where its values
are (layout). Attributes (Keras's ``weight_names``) are not read: the datasets' paths name the weights.
Anything else, the formats' later versions, chunked or compressed datasets among them, is refused by
name, not guessed. Work is bounded: at most ``MAX_OBJECTS`` groups and datasets, ``MAX_STRUCTURE`` bytes of
headers, tree nodes and heaps, ``MAX_DEPTH`` levels; each object is visited once, each byte of data
belongs to one dataset.
"""

from __future__ import annotations

import io
import math
import os
import struct
from typing import NamedTuple

import numpy as np

from ...errors import WeightsError
from ...safe_files import check_shape, describe_format, file_size, open_regular
from .base import Member, control_character

SIGNATURE = b"\x89HDF\r\n\x1a\n"
MAX_OBJECTS = 100_000  # groups and datasets: a BERT-large's tf_model.h5 has under 2,000
MAX_STRUCTURE = 16 << 20  # bytes of object headers, B-tree nodes and heaps, all told: a BERT-large's take 1 MB
MAX_DEPTH = 32  # of groups; Keras nests about 10 deep
MAX_MESSAGES = 4096  # in one object header, or entries in one B-tree or symbol table node
MAX_NAME = 1024  # bytes of a group member's name: Keras's are under 100
UNDEFINED = (1 << 64) - 1  # an address never written
OPAQUE = 5  # the datatype class of bytes with no meaning HDF5 knows
# Object header message types (HDF5 file format specification, IV.A.2).
DATASPACE, LINK_INFO, DATATYPE, LINK, LAYOUT, EXTERNAL, FILTERS, CONTINUATION, SYMBOL_TABLE = (
    1, 2, 3, 6, 8, 7, 11, 16, 17
)  # fmt: skip
# IEEE floats as HDF5 describes them: size -> (bit offset, precision, exponent location and size, mantissa
# location and size, exponent bias), and the dtype.
FLOATS = {
    2: ((0, 16, 10, 5, 0, 10, 15), "float16"),
    4: ((0, 32, 23, 8, 0, 23, 127), "float32"),
    8: ((0, 64, 52, 11, 0, 52, 1023), "float64"),
}


class Dataset(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype
    address: int  # of its values, contiguous; for a compact dataset, -1 and ``values`` holds them
    values: bytes = b""


class _File:
    """An HDF5 file's structure read by address, within the file and the structure budget."""

    def __init__(self, file: io.BufferedReader, path: str, within: str = "", member: Member | None = None) -> None:
        self.file, self.path, self.within = file, path, within
        self.base, self.size = (member.start, member.size) if member else (0, file_size(file))
        self.spent = 0
        self.seen: set[int] = set()  # object header addresses visited
        self.datasets: dict[str, Dataset] = {}

    def fail(self, message: str) -> WeightsError:
        return WeightsError(f"{self.path}: not a readable HDF5 weights file: {message}")

    def read(self, at: int, count: int, what: str) -> bytes:
        if at == UNDEFINED or at + count > self.size:
            raise self.fail(f"{what} at byte {at} ({count} bytes) lies past the end of the file ({self.size} bytes)")
        self.spent += count
        if self.spent > MAX_STRUCTURE:
            raise self.fail(f"its structure takes over {MAX_STRUCTURE} bytes; a weights file's takes far less")
        self.file.seek(self.base + at)
        data = self.file.read(count)
        if len(data) != count:
            raise self.fail(f"it changed while read: {what} at byte {at} is no longer there")
        return data

    def values(self, name: str, dataset: Dataset) -> np.ndarray:
        """A dataset's values, in this machine's byte order: read straight into the array (no copy), from
        the place checked to be within the file (values, not structure: not budgeted)."""
        if dataset.address < 0:
            array = np.frombuffer(dataset.values, dtype=dataset.dtype).reshape(dataset.shape).copy()
        else:
            array = np.empty(dataset.shape, dataset.dtype)
            self.file.seek(self.base + dataset.address)
            if self.file.readinto(array.data.cast("B")) != array.nbytes:
                raise self.fail(f"it changed while read: the values of {name!r} are no longer there")
        return array.astype(array.dtype.newbyteorder("="), copy=False)

    def root(self) -> int:
        """The root group's object header address, from the superblock (versions 0 and 1)."""
        head = self.read(0, 24, "the superblock") if self.size >= 24 else b""
        if not head.startswith(SIGNATURE):
            raise self.fail(f"it does not start with HDF5's signature; it looks like {describe_format(head[:8])}")
        version, offsets, lengths = head[8], head[13], head[14]
        if version not in (0, 1):
            raise self.fail(f"superblock version {version} (written with libver='latest'); h5py's default, 0, is read")
        if (offsets, lengths) != (8, 8):
            raise self.fail(f"addresses of {offsets} bytes and lengths of {lengths}; h5py writes 8 and 8")
        start = 24 + 4 * version  # version 1 adds the indexed storage K and a reserved field
        base, _, end, _ = struct.unpack("<4Q", self.read(start, 32, "the superblock"))
        if base != 0:
            raise self.fail(f"its data starts at byte {base} (a user block), which Keras never writes")
        if end > self.size:
            raise self.fail(f"it is cut short: its superblock says {end} bytes, the file has {self.size}")
        return struct.unpack("<Q", self.read(start + 40, 8, "the root group's entry"))[0]

    def messages(self, at: int, name: str) -> list[tuple[int, int, bytes]]:
        """The (type, flags, body) of each message of the version-1 object header at ``at``, continuations
        followed."""
        if at in self.seen:
            raise self.fail(f"{name or '/'!r} is an object already read (a cycle, or a second link)")
        self.seen.add(at)
        if len(self.seen) > MAX_OBJECTS:
            raise self.fail(f"over {MAX_OBJECTS} groups and datasets")
        prefix = self.read(at, 16, f"the object header of {name or '/'!r}")
        if prefix.startswith(b"OHDR"):
            raise self.fail(
                f"{name or '/'!r} has an object header of version 2 (libver='latest'); h5py's default, 1, is read"
            )
        version, _, count, _, length = struct.unpack("<BBHII", prefix[:12])
        if version != 1 or count > MAX_MESSAGES:
            raise self.fail(f"{name or '/'!r} has an object header of version {version} with {count} messages")
        blocks, found, taken = [(at + 16, length)], [], 0
        while blocks and taken < count:
            start, length = blocks.pop()
            data = self.read(start, length, f"the object header of {name or '/'!r}")
            pos = 0
            while pos + 8 <= length and taken < count:
                kind, size, flags = struct.unpack_from("<HHB", data, pos)
                body = data[pos + 8 : pos + 8 + size]
                if len(body) < size:
                    raise self.fail(f"a message of {name or '/'!r} runs past its object header")
                if kind == CONTINUATION:
                    blocks.append(struct.unpack("<QQ", body[:16].ljust(16, b"\0")))
                else:
                    found.append((kind, flags, body))
                pos, taken = pos + 8 + size, taken + 1
        return found

    def walk(self, at: int, name: str, depth: int) -> None:
        """Every dataset under the object at ``at`` (named ``name``) into ``self.datasets``."""
        if depth > MAX_DEPTH:
            raise self.fail(f"{name!r} is nested over {MAX_DEPTH} groups deep")
        messages = self.messages(at, name)
        kinds = {kind for kind, _, _ in messages}
        if SYMBOL_TABLE in kinds:
            body = next(body for kind, _, body in messages if kind == SYMBOL_TABLE)
            tree, heap = struct.unpack("<QQ", body[:16].ljust(16, b"\0"))
            names = self.heap(heap, name)
            for member, header in self.members(tree, names, name, 0):
                path = f"{name}/{member}" if name else member
                if not self.within or f"{self.within}/".startswith(f"{path}/") or path.startswith(f"{self.within}/"):
                    self.walk(header, path, depth + 1)
        elif kinds & {LINK, LINK_INFO}:
            raise self.fail(
                f"{name or '/'!r} is a group of HDF5's newer kind (libver='latest'); h5py's default is read"
            )
        elif DATATYPE in kinds:
            if name in self.datasets:  # a group naming two members alike: which is meant?
                raise self.fail(f"dataset {name!r} appears twice")
            self.datasets[name] = self.dataset(messages, name)
        # Anything else holds no weights.

    def heap(self, at: int, group: str) -> bytes:
        """The data segment of a group's local heap, where its members' names are."""
        head = self.read(at, 32, f"the local heap of {group or '/'!r}")
        if not head.startswith(b"HEAP"):
            raise self.fail(f"the local heap of {group or '/'!r} at byte {at} has no HEAP signature")
        size, _, address = struct.unpack_from("<3Q", head, 8)
        return self.read(address, size, f"the names of {group or '/'!r}")

    def members(self, at: int, names: bytes, group: str, level: int) -> list[tuple[str, int]]:
        """(name, object header address) of each member under the group B-tree node at ``at``."""
        head = self.read(at, 24, f"the B-tree of {group or '/'!r}")
        node_type, node_level, used = struct.unpack_from("<BBH", head, 4)
        if not head.startswith(b"TREE") or node_type != 0 or level > MAX_DEPTH or used > MAX_MESSAGES:
            raise self.fail(f"the B-tree of {group or '/'!r} at byte {at} is not a group's")
        # Keys and children alternate, a key first and last: each child is 8 bytes after its key.
        body = self.read(at + 24, 16 * used + 8, f"the B-tree of {group or '/'!r}")
        children = [struct.unpack_from("<Q", body, 16 * i + 8)[0] for i in range(used)]
        found: list[tuple[str, int]] = []
        for child in children:
            if child in self.seen:
                raise self.fail(f"the B-tree of {group or '/'!r} leads to byte {child} twice")
            self.seen.add(child)
            found += self.members(child, names, group, level + 1) if node_level else self.symbols(child, names, group)
        return found

    def symbols(self, at: int, names: bytes, group: str) -> list[tuple[str, int]]:
        """(name, object header address) of each entry of a symbol table node."""
        head = self.read(at, 8, f"the members of {group or '/'!r}")
        count = struct.unpack_from("<H", head, 6)[0]
        if not head.startswith(b"SNOD") or count > MAX_MESSAGES:
            raise self.fail(f"the members of {group or '/'!r} at byte {at} are not a symbol table node")
        body = self.read(at + 8, 40 * count, f"the members of {group or '/'!r}")
        found = []
        for i in range(count):
            offset, header = struct.unpack_from("<QQ", body, 40 * i)
            end = names.find(b"\0", offset, offset + MAX_NAME + 1)
            if offset >= len(names) or end < 0:
                raise self.fail(
                    f"a member of {group or '/'!r} has its name at {offset}: outside its heap, or over {MAX_NAME} bytes"
                )
            try:
                member = names[offset:end].decode("utf-8")
            except UnicodeDecodeError:
                raise self.fail(f"a member of {group or '/'!r} has a name that is not UTF-8") from None
            bad = control_character(member) or ("/" if "/" in member or not member else None)
            if bad:
                raise self.fail(f"a member of {group or '/'!r} is named {member!r:.80}")
            found.append((member, header))
        return found

    def dataset(self, messages: list[tuple[int, int, bytes]], name: str) -> Dataset:
        """A dataset's shape, dtype and values' place, from its object header's messages."""
        by_kind = {kind: body for kind, _, body in messages}
        if FILTERS in by_kind or EXTERNAL in by_kind:
            raise self.fail(f"dataset {name!r} is compressed or stored outside the file; Keras writes neither")
        if DATASPACE not in by_kind or LAYOUT not in by_kind:
            raise self.fail(f"dataset {name!r} has no {'shape' if DATASPACE not in by_kind else 'layout'}")
        if any(flags & 0x02 for kind, flags, _ in messages if kind == DATATYPE):
            raise self.fail(f"dataset {name!r} has a shared (committed) datatype; Keras writes none")
        shape, dtype = self.shape(by_kind[DATASPACE], name), self.dtype(by_kind[DATATYPE], name)
        try:
            check_shape(shape, dtype)
        except ValueError as error:
            raise self.fail(f"dataset {name!r}: {error}") from None
        layout = by_kind[LAYOUT]
        nbytes = math.prod(shape) * dtype.itemsize
        if len(layout) >= 2 and layout[:2] == b"\x03\x00":  # compact: the values in the header
            size = struct.unpack_from("<H", layout.ljust(4, b"\0"), 2)[0]
            if size != nbytes or len(layout) < 4 + size:
                raise self.fail(f"dataset {name!r} of shape {shape} holds {size} bytes inline")
            return Dataset(shape, dtype, -1, layout[4 : 4 + size])
        if len(layout) < 18 or layout[:2] != b"\x03\x01":
            version, layout_class = (layout + b"\xff\xff")[:2]
            kind = {0: "compact", 1: "contiguous", 2: "chunked"}.get(layout_class, "") if version == 3 else ""
            how = f"is stored {kind or 'in an unknown way'}" if version == 3 else f"has a layout of version {version}"
            raise self.fail(f"dataset {name!r} {how}; Keras stores each contiguous (layout version 3)")
        address, size = struct.unpack_from("<QQ", layout, 2)
        if size != nbytes or address == UNDEFINED or address + size > self.size:
            raise self.fail(
                f"dataset {name!r} of shape {shape} claims {size} bytes at {address}, which are not its shape's, "
                f"or not within the file's {self.size}"
            )
        return Dataset(shape, dtype, address)

    def shape(self, body: bytes, name: str) -> tuple[int, ...]:
        version, rank = (body + b"\0\0")[:2]
        start = {1: 8, 2: 4}.get(version)
        if start is None or rank > 32 or len(body) < start + 8 * rank:
            raise self.fail(f"dataset {name!r} has a dataspace of version {version} and rank {rank}")
        if version == 2 and body[3] != 1:
            raise self.fail(f"dataset {name!r} is {'a scalar' if body[3] == 0 else 'empty'}, where weights are arrays")
        return struct.unpack_from(f"<{rank}Q", body, start)

    def dtype(self, body: bytes, name: str) -> np.dtype:
        if len(body) < 20 or body[0] & 0x0F != 1 or body[1] & 0x40:
            kind = body[0] & 0x0F if body else -1
            opaque = " (opaque bytes, as Keras 3 stores bfloat16: save the model in float32)" if kind == OPAQUE else ""
            raise self.fail(f"dataset {name!r} holds HDF5 type class {kind}{opaque}, where weights are IEEE floats (1)")
        size = struct.unpack_from("<I", body, 4)[0]
        layout = struct.unpack_from("<HHBBBBI", body, 8)
        ieee = FLOATS.get(size)
        if ieee is None or layout != ieee[0] or body[2] != 8 * size - 1:  # the sign the highest bit
            raise self.fail(f"dataset {name!r} holds floats of {size} bytes laid out as {layout}, not IEEE's")
        return np.dtype(ieee[1]).newbyteorder(">" if body[1] & 0x01 else "<")


def read_hdf5(
    path: str | os.PathLike, within: str = "", member: Member | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every dataset of an HDF5 file under its path (``layer/scope/.../kernel:0``), or only those in the group
    ``within`` (nothing else is read), in the byte order of this machine, and each one's dtype; the file is
    at ``path``, or is the ``member`` stored there (a zip's, read in place). Anything malformed, or of a part
    of HDF5 Keras does not write, is a ``WeightsError`` naming the file and what."""
    with open_regular(path, "HDF5 weights file", WeightsError) as file:
        reader = _File(file, f"{path}/{member.name}" if member else str(path), within, member)
        reader.walk(reader.root(), "", 0)
        datasets = reader.datasets
        # Each byte of data belongs to one dataset at most: what is read is never more than the file holds.
        spans = sorted((d.address, d.address + math.prod(d.shape) * d.dtype.itemsize, name)
                       for name, d in datasets.items() if d.address >= 0)  # fmt: skip
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise reader.fail(f"datasets {first!r} and {second!r} overlap")
        arrays = {name: reader.values(name, found) for name, found in datasets.items()}
    return arrays, {name: found.dtype.name for name, found in datasets.items()}
