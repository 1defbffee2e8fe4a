"""A pickle's opcodes run on a stack of plain values, never unpickled: what ``paddle.save``'s files are read
with, without Paddle.

Unpickling runs whatever a file names, so nothing here does: ``pickletools.genops`` parses the opcodes and a
small stack machine (``Machine``) builds strings, numbers and containers, and arrays from NumPy's own recipe
(``_reconstruct``, a dtype, the raw bytes). Nothing a file names is ever called: any other callable gives an
opaque value, an error only where an array was expected. An array's raw bytes (protocols 3 and 4) are not kept
while parsing, only their place in the file. A pickle of another library's objects (``FOREIGN``: Gluon's
trainer states, JAX's arrays) is named for what it is.
"""

from __future__ import annotations

import pickletools
import struct
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, NamedTuple, cast

from ...errors import WeightsError

RECONSTRUCT = ("numpy.core.multiarray _reconstruct", "numpy._core.multiarray _reconstruct")  # NumPy 1, 2
MAX_OPCODES = 1 << 22  # a BERT-large's state_dict takes 15,000; each opcode may push a value
MAX_NDIM = 32
# Another library's pickle, by the module its objects are of: whose objects, and what to read instead.
SAVE_AS_FLAX = (
    "load it in code you trust and save the parameters as Flax's own file, which bert_multi reads: "
    "open('bert.msgpack', 'wb').write(flax.serialization.to_bytes(params))"
)
FLAX_PARAMETERS = (
    f"pickle.dump of a Flax model's parameters writes one, and bert_multi unpickles nothing: {SAVE_AS_FLAX}"
)
FOREIGN = {
    "mxnet": (
        "MXNet",
        "Gluon's Trainer.save_states pickles an optimizer's state so; the model's weights are the .params file "
        "save_parameters writes, which bert_multi reads",
    ),
    "jax": ("JAX", FLAX_PARAMETERS),
    "flax": ("Flax", FLAX_PARAMETERS),
}
# What genops raises on a damaged pickle: a length past the end, an unknown opcode, text that is no UTF-8 ...
PARSE_ERRORS = (ValueError, TypeError, IndexError, KeyError, OverflowError, EOFError, struct.error, MemoryError)


class Global(NamedTuple):
    name: str  # "module qualname"


class Opaque(NamedTuple):
    what: str  # what made it, for a message


class Stored(NamedTuple):
    """Raw bytes left in the file: where they start and how many."""

    start: int
    size: int


@dataclass(eq=False)
class Dtype:
    code: str
    order: str = "|"


@dataclass(eq=False)
class Array:
    """An array as NumPy's recipe builds it: empty from ``_reconstruct``, then given its state."""

    shape: tuple[int, ...] | None = None
    dtype: Dtype | None = None
    fortran: bool = False
    data: bytes | Stored | None = None


DATA_OFFSET = {"SHORT_BINBYTES": 2, "BINBYTES": 5, "BINBYTES8": 9, "BYTEARRAY8": 9}  # opcode, then length
LITERALS = (
    *("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"),
    *("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"),
)
SCALARS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
TUPLES = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
PUTS, GETS = ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"), ("GET", "BINGET", "LONG_BINGET")


def kind_of(value: object) -> str:
    """What a value built from the file is, for a message (never its repr: it may be huge)."""
    if isinstance(value, Opaque):
        return f"a pickled {value.what}"
    if isinstance(value, Array):
        return "an array"
    return f"a {type(value).__name__}"


class Clamped:
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


class Machine:
    """Runs a pickle's opcodes on a stack of the values above (marks kept apart, as CPython keeps them),
    calling nothing the file names."""

    def __init__(self, path: object, what: str) -> None:
        self.path, self.what = path, what  # what: the file it should be, for messages
        self.stack: list[Any] = []
        self.marks: list[int] = []  # where each open mark is on the stack
        self.memo: dict[int, Any] = {}
        self.foreign: str | None = None  # the first class the pickle names of a library in FOREIGN

    def fail(self, message: str) -> WeightsError:
        return self.refused(WeightsError(f"{self.path}: not a readable {self.what}: {message}"))

    def refused(self, error: WeightsError) -> WeightsError:
        """``error``, or, for a pickle of another library's objects (``FOREIGN``), what it is instead."""
        if self.foreign is None:
            return error
        library, advice = FOREIGN[self.foreign.split(".")[0]]
        return WeightsError(f"{self.path}: a pickle of {library}'s objects ({self.foreign}): {advice}")

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

    def run(self, file: Clamped) -> Any:
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
            push(Stored(position + DATA_OFFSET[name], len(arg)))
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
            push(Global(" ".join(module_name)) if all(isinstance(n, str) for n in module_name) else Opaque("global"))
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
                raise self.fail(f"a dict key that is {kind_of(key)}, not text or a number")
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
        self.stack.extend(Opaque(name) for _ in opcode.stack_after)

    def reduce(self, call: object, arguments: object) -> object:
        """What calling ``call`` would make, for the few calls paddle.save's pickles make; else opaque."""
        if not isinstance(call, Global):
            return Opaque(f"call of {kind_of(call)}")
        given = arguments if isinstance(arguments, tuple) else ()
        if call.name in RECONSTRUCT and given[:1] == (Global("numpy ndarray"),):
            return Array()
        if call.name == "numpy dtype" and given and isinstance(given[0], str):
            return Dtype(given[0])
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
        return Opaque(call.name.replace(" ", "."))

    def build(self, target: object, state: object) -> None:
        """Give a dtype its byte order, an array its shape, dtype and bytes, as NumPy's ``__setstate__``."""
        self.stack.append(target)
        if isinstance(target, Dtype) and isinstance(state, tuple) and len(state) > 1:
            if state[1] not in ("<", ">", "|", "="):
                raise self.fail(f"a dtype of byte order {kind_of(state[1])}")
            target.order = state[1]
        elif isinstance(target, Array):
            if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
                raise self.fail(f"an array's state is {kind_of(state)}, not NumPy's (1, shape, dtype, order, bytes)")
            _, shape, dtype, fortran, data = state
            if not isinstance(shape, tuple) or not all(type(n) is int for n in shape) or len(shape) > MAX_NDIM:
                raise self.fail(f"an array's shape is {kind_of(shape)}, not a tuple of at most {MAX_NDIM} integers")
            if not isinstance(dtype, Dtype) or not isinstance(data, (bytes, Stored)):
                raise self.fail(f"an array of {kind_of(dtype)} and {kind_of(data)}, not a dtype and raw bytes")
            target.shape, target.dtype, target.fortran, target.data = shape, dtype, fortran is True, data
