"""PyTorch's legacy ``torch.save`` format (PyTorch before 1.6, and ``_use_new_zipfile_serialization=False``
since; many ``pytorch_model.bin`` of 2019 and 2020), checked without unpickling before torch reads it.

The file is five pickles and then the storages' bytes: the magic number, the protocol version (1001), the
system's sizes, the object (each tensor's storage named by a persistent id: ``("storage", its class, key,
location, element count, view)``), the sorted list of storage keys; then, for each key, its element count
(8 bytes) and its values. torch's reader allocates each storage at the size its persistent id claims
before reading a byte of it, so those sizes are checked here against the bytes the file holds.

The pickles are read by ``pickletools.genops``, which parses opcodes and runs none; a shadow stack keeps
the few values a persistent id is built from (strings, numbers, classes' names, tuples, the memo), and
stands an opaque value for anything else.
"""

from __future__ import annotations

import io
import pickletools
import struct
from typing import Any, BinaryIO, NamedTuple

from ...errors import WeightsError
from ...safe_files import file_size, reason

MAGIC = 0x1950A86A20F9469CFC6C
HEAD = b"\x80\x02\x8a\x0a" + MAGIC.to_bytes(10, "little")  # the first pickle: protocol 2, the magic number
PROTOCOL = 1001
MAX_PICKLES = 1 << 20  # bytes of the five pickles: a BERT-large's take 40 KB
ELEMENT_SIZES = {
    **{"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8},
    **{"IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1},
    "UntypedStorage": 1,
}
STRINGS = ("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING")
NUMBERS = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4")
CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
PUTS, GETS = ("PUT", "BINPUT", "LONG_BINPUT"), ("GET", "BINGET", "LONG_BINGET")
MARK, OPAQUE = object(), object()  # a mark on the shadow stack; a value not followed


class Global(NamedTuple):
    name: str  # "module name", as GLOBAL names it


def is_legacy(head: bytes) -> bool:
    """Whether a file starting with ``head`` (8 bytes or more) is a legacy ``torch.save`` file."""
    return len(head) >= 8 and HEAD.startswith(head[: len(HEAD)])


def _shadow(stream: io.BytesIO, fail: Any) -> tuple[list[Any], list[Any]]:
    """(every simple value the next pickle of ``stream`` pushes, in order; its persistent ids)."""
    stack: list[Any] = []
    memo: dict[Any, Any] = {}
    pushed: list[Any] = []
    ids: list[Any] = []

    def pop() -> Any:
        if not stack:
            raise fail("a pickle pops more than it pushed")
        return stack.pop()

    def pop_to_mark() -> list[Any]:
        items = []
        while (item := pop()) is not MARK:
            items.append(item)
        return items[::-1]

    for opcode, arg, _ in pickletools.genops(stream):
        name = opcode.name
        if name in STRINGS or name in NUMBERS or name in CONSTANTS or name == "GLOBAL":
            value = Global(str(arg)) if name == "GLOBAL" else CONSTANTS[name] if name in CONSTANTS else arg
            stack.append(value)
            pushed.append(value)
        elif name == "MARK":
            stack.append(MARK)
        elif name in ("TUPLE", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
            count = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}.get(name)
            stack.append(tuple(pop_to_mark() if count is None else [pop() for _ in range(count)][::-1]))
        elif name in PUTS or name == "MEMOIZE":
            if not stack:
                raise fail("a pickle memoizes an empty stack")
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in GETS:
            if arg not in memo:
                raise fail(f"a pickle reads memo {arg}, which it never wrote")
            stack.append(memo[arg])
        elif name == "BINPERSID":
            ids.append(pop())
            stack.append(OPAQUE)
        elif name == "PERSID":
            raise fail("a persistent id of text, which torch.save never writes")
        elif name != "STOP":  # any other opcode: its effect on the stack, values not followed
            before = opcode.stack_before
            if pickletools.markobject in before:
                pop_to_mark()
                before = before[: before.index(pickletools.markobject)]
            for _ in before:
                pop()
            stack.extend(OPAQUE for _ in opcode.stack_after)
    return pushed, ids


def check_legacy(file: BinaryIO, path: object) -> None:
    """Refuse a legacy ``torch.save`` file whose storages claim more than it holds, or whose structure is
    not what ``torch.save`` writes; leave ``file`` at its start for torch."""

    def fail(message: str) -> WeightsError:
        return WeightsError(f"{path}: not a readable PyTorch legacy checkpoint: {message}")

    size = file_size(file)
    file.seek(0)
    stream = io.BytesIO(file.read(MAX_PICKLES))
    try:
        (magic, *_), _ = _shadow(stream, fail)
        (protocol, *_), _ = _shadow(stream, fail)
        _shadow(stream, fail)  # the system's sizes: torch reads them itself
        _, ids = _shadow(stream, fail)
        keys, _ = _shadow(stream, fail)
    except (ValueError, TypeError, IndexError, KeyError, RecursionError) as error:  # genops on a damaged pickle
        raise fail(f"its pickles do not parse within {MAX_PICKLES} bytes: {reason(error)}") from None
    if (magic, protocol) != (MAGIC, PROTOCOL):
        raise fail(
            f"magic number {magic!r:.40} and protocol {protocol!r:.40}; torch.save writes {MAGIC} and {PROTOCOL}"
        )
    declared = _storages(ids, fail)
    if set(keys) != set(declared) or len(set(keys)) != len(keys):
        raise fail(f"its list of storages ({len(keys)}) is not the {len(declared)} its tensors name")
    offset = stream.tell()
    for key in keys:
        count, element_size = declared[key]
        file.seek(offset)
        written = file.read(8)
        if len(written) < 8 or struct.unpack("<q", written)[0] != count:
            raise fail(f"storage {key!r} declares {count} elements, but its bytes say otherwise or are cut short")
        offset += 8 + count * element_size
        if offset > size:
            raise fail(f"storage {key!r} of {count} elements runs past the end of the file ({size} bytes)")
    if offset != size:
        raise fail(f"{size - offset} bytes follow its last storage")
    file.seek(0)


def _storages(ids: list[Any], fail: Any) -> dict[str, tuple[int, int]]:
    """Each storage key's (element count, element size), from the persistent ids naming them."""
    declared: dict[str, tuple[int, int]] = {}
    for pid in ids:
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage" and isinstance(pid[1], Global)):
            raise fail(f"a persistent id {pid!r:.80} is not a storage as torch.save names one")
        _, kind, key, _, count, _ = pid
        element_size = ELEMENT_SIZES.get(kind.name.removeprefix("torch "))
        if element_size is None or not kind.name.startswith("torch "):
            raise fail(f"a storage of class {kind.name!r:.80}, which holds no tensor bert_multi reads")
        if not isinstance(key, str) or type(count) is not int or not 0 <= count < 1 << 48:
            raise fail(f"a storage named {key!r:.40} of {count!r:.40} elements")
        if declared.setdefault(key, (count, element_size)) != (count, element_size):
            raise fail(f"storage {key!r:.40} is named with two sizes")
    return declared
