"""PaddlePaddle's ``paddle.save(net.state_dict(), "bert.pdparams")``, read without Paddle and without
unpickling, and written back as ``paddle.load`` reads it.

d2l 0.17's package ships a Paddle BERT (``d2l/paddle.py``, the code of d2l-zh 2.0) whose parameters have
its PyTorch model's names, and its fine-tuning section downloads ``bert.small.paddle.zip``
(``pretrained.pdparams`` and ``vocab.json``). ``paddle.save`` turns each tensor into a NumPy array and
pickles a dict of them (protocol 4 unless asked for 2 or 3), with one more entry,
``StructuredToParameterName@@``: each name's Paddle-internal name (``linear_3.w_0``). Anything else given
to ``paddle.save`` (a dict around a state_dict) is pickled with each tensor as a (name, array) tuple.

Unpickling runs whatever a file names, so this module never unpickles: ``pickletools.genops`` parses the
opcodes and a small stack machine (``_Machine``) builds strings, numbers and containers, and arrays from
NumPy's own recipe (``_reconstruct``, a dtype, the raw bytes). Nothing a file names is ever called: any
other callable gives an opaque value, an error only where an array was expected. An array's raw bytes
(protocols 3 and 4) are not kept while parsing, only their place in the file; each array is read from
there once its shape and dtype are checked against the bytes it has.

Framework difference: Paddle's ``nn.Linear`` holds its weight (in, out) and computes ``x @ W``; PyTorch's
holds (out, in). Every attention projection is square, so no shape tells them apart: that the file is
Paddle's does, and every Linear weight is transposed, reading and writing.
"""

from __future__ import annotations

import math
import os
import pickletools
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, NamedTuple, cast

import numpy as np

from ...arrays import contiguous_transpose
from ...backend.contract import framework_names, prepare_weights
from ...errors import WeightsError
from ...safe_files import check_shape, file_size, open_regular, reason, replace_file
from ...spec.config import BERTConfig
from .base import MAX_TENSORS, PADDLE_PARAMS_FILE, CheckpointFormat, Probe, Raw, StateDictInside, state_dict_in

NAMES_TABLE = "StructuredToParameterName@@"  # each name's Paddle-internal name, which nothing here needs
SLICED = "UnpackBigParamInfor@@"  # protocols 2 and 3 cut a tensor over 1 GiB into slices: no BERT has one
RECONSTRUCT = ("numpy.core.multiarray _reconstruct", "numpy._core.multiarray _reconstruct")  # NumPy 1, 2
# The dtypes of Paddle's tensors as NumPy arrays. NumPy has no bfloat16: Paddle hands over its bits as uint16.
DTYPES = ("f2", "f4", "f8", "u2", "i1", "i2", "i4", "i8", "u1", "b1")
# A 2-D weight is an nn.Linear's, (in, out), unless an nn.Embedding's (d2l's token_embedding, PaddleNLP's
# word_embeddings) or PaddleNLP's MLM decoder, a TransposedLinear held (vocab, hidden) as PyTorch holds it.
LINEAR_WEIGHT = re.compile(r"(?<!_embedding)(?<!_embeddings)(?<!decoder)\.weight$")
MAX_OPCODES = 1 << 22  # a BERT-large's state_dict takes 15,000; each opcode may push a value
MAX_NDIM = 32
# Another library's pickle that is no model's, by the module its objects are of: what it is, and what to read.
FOREIGN = {
    "mxnet": (
        "MXNet",
        "Gluon's Trainer.save_states pickles an optimizer's state so; the model's weights are the .params file "
        "save_parameters writes, which bert_multi reads",
    ),
}
MATERIALISED_FACTOR = 2  # what the arrays may take, as a multiple of the file (arrays may share bytes)
MATERIALISED_SLACK = 1 << 20
PROTOCOL = 4  # what paddle.save writes unless asked
# What genops raises on a damaged pickle: a length past the end, an unknown opcode, text that is no UTF-8 ...
PARSE_ERRORS = (ValueError, TypeError, IndexError, KeyError, OverflowError, EOFError, struct.error, MemoryError)


class _Global(NamedTuple):
    name: str  # "module qualname"


class _Opaque(NamedTuple):
    what: str  # what made it, for a message


class _Stored(NamedTuple):
    """Raw bytes left in the file: where they start and how many."""

    start: int
    size: int


@dataclass(eq=False)
class _Dtype:
    code: str
    order: str = "|"


@dataclass(eq=False)
class _Array:
    """An array as NumPy's recipe builds it: empty from ``_reconstruct``, then given its state."""

    shape: tuple[int, ...] | None = None
    dtype: _Dtype | None = None
    fortran: bool = False
    data: bytes | _Stored | None = None


DATA_OFFSET = {"SHORT_BINBYTES": 2, "BINBYTES": 5, "BINBYTES8": 9, "BYTEARRAY8": 9}  # opcode, then length
LITERALS = (
    *("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"),
    *("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"),
)
SCALARS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
TUPLES = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
PUTS, GETS = ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"), ("GET", "BINGET", "LONG_BINGET")


def _kind(value: object) -> str:
    """What a value built from the file is, for a message (never its repr: it may be huge)."""
    if isinstance(value, _Opaque):
        return f"a pickled {value.what}"
    if isinstance(value, _Array):
        return "an array"
    return f"a {type(value).__name__}"


class _Clamped:
    """A file whose reads never ask for more than it holds: genops reads as many bytes as a length field
    claims, and a file object allocates them before reading."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self.file, self.size = file, size

    def read(self, count: int = -1) -> bytes:
        left = self.size - self.file.tell()
        return self.file.read(left if count < 0 else min(count, left))

    def readline(self) -> bytes:
        return self.file.readline()

    def tell(self) -> int:
        return self.file.tell()


class _Machine:
    """Runs a pickle's opcodes on a stack of the values above (marks kept apart, as CPython keeps them),
    calling nothing the file names."""

    def __init__(self, path: object) -> None:
        self.path = path
        self.stack: list[Any] = []
        self.marks: list[int] = []  # where each open mark is on the stack
        self.memo: dict[int, Any] = {}
        self.foreign: str | None = None  # the first class the pickle names of a library in FOREIGN

    def fail(self, message: str) -> WeightsError:
        return self.refused(
            WeightsError(f"{self.path}: not a readable Paddle state_dict file (paddle.save): {message}")
        )

    def refused(self, error: WeightsError) -> WeightsError:
        """``error``, or, for a pickle of another library's objects (``FOREIGN``), what it is instead."""
        if self.foreign is None:
            return error
        library, what = FOREIGN[self.foreign.split(".")[0]]
        return WeightsError(
            f"{self.path}: a pickle of {library}'s objects ({self.foreign}), not paddle.save's state_dict: {what}"
        )

    def pop(self) -> Any:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.fail("a pickle pops more than it pushed")
        return self.stack.pop()

    def pop_to_mark(self) -> list[Any]:
        if not self.marks:
            raise self.fail("a pickle closes a mark it never set")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def run(self, file: _Clamped) -> Any:
        for count, (opcode, arg, position) in enumerate(pickletools.genops(cast(IO[bytes], file))):
            if count == MAX_OPCODES:
                raise self.fail(f"its pickle runs past {MAX_OPCODES} opcodes; a state_dict's takes far fewer")
            self.step(opcode, arg, position or 0)
        if file.tell() != file.size:
            raise self.fail(f"{file.size - file.tell()} bytes follow its pickle")
        return self.pop()

    def step(self, opcode: pickletools.OpcodeInfo, arg: Any, position: int) -> None:
        name, push = opcode.name, self.stack.append
        if name in ("PROTO", "FRAME", "STOP"):
            return
        if name in LITERALS:
            push(arg)
        elif name in DATA_OFFSET:
            push(_Stored(position + DATA_OFFSET[name], len(arg)))
        elif name in SCALARS:
            push(SCALARS[name])
        elif name == "MARK":
            self.marks.append(len(self.stack))
        elif name in TUPLES:
            push(tuple(self.pop() for _ in range(TUPLES[name]))[::-1])
        elif name in ("TUPLE", "LIST"):
            items = self.pop_to_mark()
            push(tuple(items) if name == "TUPLE" else items)
        elif name in ("EMPTY_LIST", "EMPTY_DICT"):
            push([] if name == "EMPTY_LIST" else {})
        elif name in ("APPEND", "APPENDS"):
            items = [self.pop()] if name == "APPEND" else self.pop_to_mark()
            if isinstance(target := self.pop(), list):
                target.extend(items)
            push(target)
        elif name in ("SETITEM", "SETITEMS", "DICT"):
            self.set_items(name)
        elif name in PUTS:
            if not self.stack:
                raise self.fail("a pickle memoizes an empty stack")
            self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.stack[-1]
        elif name in GETS:
            if arg not in self.memo:
                raise self.fail(f"a pickle reads memo {arg}, which it never wrote")
            push(self.memo[arg])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            module_name = (arg,) if name == "GLOBAL" else (self.pop(), self.pop())[::-1]
            push(_Global(" ".join(module_name)) if all(isinstance(n, str) for n in module_name) else _Opaque("global"))
            if isinstance(module_name[0], str) and module_name[0].split(".")[0] in FOREIGN:
                self.foreign = self.foreign or ".".join(map(str, module_name))
        elif name == "REDUCE":
            arguments, call = self.pop(), self.pop()
            push(self.reduce(call, arguments))
        elif name == "BUILD":
            state = self.pop()
            self.build(self.pop(), state)
        else:  # any other opcode: its effect on the stack, the values it makes opaque
            self.opaque(opcode, name)

    def set_items(self, name: str) -> None:
        items = [self.pop(), self.pop()][::-1] if name == "SETITEM" else self.pop_to_mark()
        if len(items) % 2:
            raise self.fail("a dict's items are not pairs")
        target = {} if name == "DICT" else self.pop()
        for key, value in zip(items[::2], items[1::2]):
            if not isinstance(key, (str, int)):  # what paddle.save's dicts are keyed by; nothing else is hashed
                raise self.fail(f"a dict key that is {_kind(key)}, not text or a number")
            if isinstance(target, dict):
                target[key] = value
        self.stack.append(target)

    def opaque(self, opcode: pickletools.OpcodeInfo, name: str) -> None:
        before = opcode.stack_before
        if pickletools.markobject in before:  # what lies above the mark first, then what lies below it
            self.pop_to_mark()
            before = before[: before.index(pickletools.markobject)]
        for _ in before:
            self.pop()
        self.stack.extend(_Opaque(name) for _ in opcode.stack_after)

    def reduce(self, call: object, arguments: object) -> object:
        """What calling ``call`` would make, for the few calls paddle.save's pickles make; else opaque."""
        if not isinstance(call, _Global):
            return _Opaque(f"call of {_kind(call)}")
        given = arguments if isinstance(arguments, tuple) else ()
        if call.name in RECONSTRUCT and given[:1] == (_Global("numpy ndarray"),):
            return _Array()
        if call.name == "numpy dtype" and given and isinstance(given[0], str):
            return _Dtype(given[0])
        if call.name == "_codecs encode" and len(given) == 2 and isinstance(given[0], str):  # protocol 2's bytes
            if given[1] not in ("latin1", "latin-1"):
                raise self.fail(f"bytes in the encoding {given[1]!r:.40}; protocol 2 writes them as latin1")
            try:
                return given[0].encode("latin-1")
            except UnicodeEncodeError:
                raise self.fail("bytes spelled with characters beyond latin1") from None
        if call.name in ("__builtin__ bytes", "builtins bytes") and given == ():  # protocol 2's empty bytes
            return b""
        if call.name == "builtins tuple" and len(given) == 1 and isinstance(given[0], (tuple, list)):
            return tuple(given[0])  # how paddle.save pickles a tensor inside anything but a state_dict
        if call.name == "collections OrderedDict" and given == ():
            return {}
        return _Opaque(call.name.replace(" ", "."))

    def build(self, target: object, state: object) -> None:
        """Give a dtype its byte order, an array its shape, dtype and bytes, as NumPy's ``__setstate__``."""
        self.stack.append(target)
        if isinstance(target, _Dtype) and isinstance(state, tuple) and len(state) > 1:
            if state[1] not in ("<", ">", "|", "="):
                raise self.fail(f"a dtype of byte order {_kind(state[1])}")
            target.order = state[1]
        elif isinstance(target, _Array):
            if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
                raise self.fail(f"an array's state is {_kind(state)}, not NumPy's (1, shape, dtype, order, bytes)")
            _, shape, dtype, fortran, data = state
            if not isinstance(shape, tuple) or not all(type(n) is int for n in shape) or len(shape) > MAX_NDIM:
                raise self.fail(f"an array's shape is {_kind(shape)}, not a tuple of at most {MAX_NDIM} integers")
            if not isinstance(dtype, _Dtype) or not isinstance(data, (bytes, _Stored)):
                raise self.fail(f"an array of {_kind(dtype)} and {_kind(data)}, not a dtype and raw bytes")
            target.shape, target.dtype, target.fortran, target.data = shape, dtype, fortran is True, data


def _entries(machine: _Machine, top: object, key: str | None) -> tuple[dict[str, Any], list[str]]:
    """The state_dict in the file: the dict itself or, with ``key``, one entry of a dict around it."""

    def tensors(value: object) -> dict[str, Any] | None:
        """A state_dict's names -> arrays (a tensor saved as a (name, array) tuple unwrapped), or None."""
        if not isinstance(value, dict):
            return None
        found = {}
        for name, entry in value.items():
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], _Array):
                entry = entry[1]
            if name != NAMES_TABLE and not (isinstance(name, str) and isinstance(entry, _Array)):
                return None
            found[name] = entry
        found.pop(NAMES_TABLE, None)
        return found or None

    if not isinstance(top, dict):
        raise machine.fail(f"it holds {_kind(top)}; paddle.save(net.state_dict()) writes a dict of name -> array")
    if not set(top) - {NAMES_TABLE}:
        raise machine.fail("it holds no tensors (paddle.save of an empty dict)")
    if SLICED in top:
        raise machine.fail(f"it cuts tensors over 1 GiB into slices ({SLICED}), which no BERT has")
    return state_dict_in(machine.path, top, key, tensors)


def _materialise(machine: _Machine, file: BinaryIO, name: str, spec: _Array) -> np.ndarray:
    """The array ``spec`` describes, its bytes checked against its shape and read from the file."""
    if spec.shape is None or spec.dtype is None or spec.data is None:
        raise machine.fail(f"the array {name!r} is never given its shape and bytes")
    if spec.dtype.code not in DTYPES:
        raise machine.fail(
            f"the array {name!r} has dtype {spec.dtype.code!r:.40}; a Paddle tensor's is one of {DTYPES}"
        )
    dtype = np.dtype(spec.dtype.order.replace("|", "=") + spec.dtype.code)
    try:
        check_shape(spec.shape, dtype)
    except ValueError as error:
        raise machine.fail(f"the array {name!r} has {error}") from None
    size = spec.data.size if isinstance(spec.data, _Stored) else len(spec.data)
    count = math.prod(spec.shape)
    if size != count * dtype.itemsize:
        raise machine.fail(
            f"the array {name!r} of shape {spec.shape} ({dtype.name}) has {size} bytes, not {count * dtype.itemsize}"
        )
    if isinstance(spec.data, _Stored):
        flat = np.empty(count, dtype)
        file.seek(spec.data.start)
        if file.readinto(flat.view(np.uint8)) != size:  # type: ignore[attr-defined]
            raise machine.fail(f"the array {name!r} runs past the end of the file")
    else:
        flat = np.frombuffer(spec.data, dtype).copy()
    array = flat.reshape(spec.shape, order="F" if spec.fortran else "C")
    return array.astype(dtype.newbyteorder("="), order="C", copy=False)  # 0-d stays 0-d


def read_pdparams(
    path: str | os.PathLike, key: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """The arrays of a ``paddle.save`` state_dict under the file's own names and layouts, their dtypes
    (bfloat16, which Paddle saves as uint16 bits, arrives as float32), and notes. Anything malformed, or
    anything but a state_dict, is a ``WeightsError`` naming the file and what is wrong."""
    machine = _Machine(path)
    with open_regular(path, "Paddle state_dict file", WeightsError) as file:
        size = file_size(file)
        try:
            top = machine.run(_Clamped(file, size))
        except WeightsError:
            raise
        except PARSE_ERRORS as error:
            raise machine.fail(f"its pickle does not parse: {reason(error)}") from None
        try:
            entries, notes = _entries(machine, top, key)
        except StateDictInside:
            raise
        except WeightsError as error:
            raise machine.refused(error) from None
        if len(entries) > MAX_TENSORS:
            raise machine.fail(f"{len(entries)} tensors; a BERT has hundreds")
        arrays: dict[str, np.ndarray] = {}
        made: dict[int, np.ndarray] = {}  # an array saved under two names is read once
        total = 0
        for name, spec in entries.items():
            if id(spec) not in made:
                total += (
                    0 if spec.data is None else spec.data.size if isinstance(spec.data, _Stored) else len(spec.data)
                )
                if total > MATERIALISED_FACTOR * size + MATERIALISED_SLACK:
                    raise machine.fail(f"its arrays claim {total} bytes, more than a file of {size} bytes holds")
                made[id(spec)] = _materialise(machine, file, name, spec)
            arrays[name] = made[id(spec)]
    dtypes = {name: array.dtype.name for name, array in arrays.items()}
    return arrays, dtypes, notes + bfloat16_from_bits(arrays, dtypes)


def bfloat16_from_bits(arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> list[str]:
    """Read every uint16 array of a Paddle file as the bfloat16 whose bits it holds, in place: Paddle hands
    bfloat16 to NumPy, which has none, as uint16, and saves it so (its own pickles, PaddleNLP's safetensors).
    The note saying so, if any was."""
    bits = [name for name, array in arrays.items() if array.dtype == np.uint16]
    for name in bits:  # bfloat16's bits are the top half of a float32's
        arrays[name] = (arrays[name].astype(np.uint32) << 16).view(np.float32)
        dtypes[name] = "bfloat16"
    if not bits:
        return []
    return [f"read {len(bits)} uint16 arrays as bfloat16, which Paddle saves as its bits (NumPy has no bfloat16)"]


def _layout(name: str, array: np.ndarray) -> np.ndarray:
    """``array`` turned between Paddle's layout and the canonical one (the same turn both ways)."""
    return contiguous_transpose(array) if array.ndim == 2 and LINEAR_WEIGHT.search(name) else array


def write_pickle(out: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as the pickle ``paddle.save`` writes of a state_dict, under NumPy 1's name for its
    recipe (``numpy.core``), which NumPy 2 reads too; ``paddle.load`` gives them back as they are."""

    def text(value: str) -> None:
        encoded = value.encode("utf-8")
        out.write(
            b"\x8c" + bytes([len(encoded)]) + encoded
            if len(encoded) < 256
            else b"X" + struct.pack("<I", len(encoded)) + encoded
        )

    def number(value: int) -> None:
        if -(1 << 31) <= value < 1 << 31:
            out.write(b"J" + struct.pack("<i", value))  # BININT
        else:
            out.write(b"\x8a\x08" + struct.pack("<q", value))  # LONG1 of 8 bytes

    def call(module: str, qualname: str) -> None:
        text(module)
        text(qualname)
        out.write(b"\x93")  # STACK_GLOBAL

    out.write(bytes([0x80, PROTOCOL]) + b"}(")  # PROTO, EMPTY_DICT, MARK
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        text(name)
        call("numpy.core.multiarray", "_reconstruct")
        call("numpy", "ndarray")
        out.write(b"K\x00\x85C\x01b\x87R(")  # (ndarray, (0,), b"b"), REDUCE, MARK: the state follows
        number(1)
        out.write(b"(")
        for length in array.shape:
            number(length)
        out.write(b"t")
        call("numpy", "dtype")
        text(array.dtype.str[1:])
        out.write(b"\x89\x88\x87R(")  # (code, False, True), REDUCE, MARK: the dtype's state follows
        number(3)
        text(array.dtype.str[0])
        out.write(b"NNN")
        for value in (-1, -1, 0):
            number(value)
        out.write(b"tb\x89\x8e" + struct.pack("<Q", array.nbytes))  # BUILD the dtype; not Fortran; BINBYTES8
        out.write(array.view(np.uint8).data)
        out.write(b"tb")  # BUILD the array
    out.write(b"u.")  # SETITEMS, STOP


def save_pdparams(path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> None:
    """Write canonical weights as d2l 0.17's Paddle BERT's state_dict, as ``paddle.save`` writes it."""
    _, weights = prepare_weights(config, weights)
    names = framework_names(config, [])  # Paddle's d2l names are PyTorch's, the canonical ones
    arrays = {names[name]: _layout(name, weights[name]) for name in names}
    replace_file(path, lambda file: write_pickle(file, arrays))


class StateDict(CheckpointFormat):
    kind = "paddle"
    description = "PaddlePaddle state_dict file (paddle.save, .pdparams)"
    suffixes = (".pdparams",)
    d2l_published = True  # d2l 0.17's bert.small.paddle.zip holds one
    d2l_file = PADDLE_PARAMS_FILE

    def recognizes(self, probe: Probe) -> bool:
        # Any pickle of protocol 2 to 4 that is not PyTorch's (read first): this reader says what it is not.
        pickle = probe.head[:1] == b"\x80" and len(probe.head) > 1 and 2 <= probe.head[1] <= 4
        return probe.path.suffix.lower() == ".pdparams" or pickle

    def read(self, path: Path, key: str | None) -> Raw:
        arrays, dtypes, notes = read_pdparams(path, key)
        turned = []
        for name, array in arrays.items():  # in place: each file array is freed once turned
            arrays[name] = _layout(name, array)
            turned += [name] if arrays[name] is not array else []
        if turned:
            notes.append(f"transposed {len(turned)} nn.Linear weights from Paddle's (in, out) to (out, in)")
        return Raw(self.kind, None, arrays, dtypes, notes)

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        save_pdparams(path, config, weights)  # framework-free, so any environment converts to it


FORMAT = StateDict()
