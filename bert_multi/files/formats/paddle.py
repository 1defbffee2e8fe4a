"""PaddlePaddle's ``paddle.save(net.state_dict(), "bert.pdparams")``, read without Paddle and without
unpickling, and written back as ``paddle.load`` reads it.

d2l 0.17's package ships a Paddle BERT (``d2l/paddle.py``, the code of d2l-zh 2.0) whose parameters have
its PyTorch model's names, and its fine-tuning section downloads ``bert.small.paddle.zip``
(``pretrained.pdparams`` and ``vocab.json``). ``paddle.save`` turns each tensor into a NumPy array and
pickles a dict of them (protocol 4 unless asked for 2 or 3), with one more entry,
``StructuredToParameterName@@``: each name's Paddle-internal name (``linear_3.w_0``). Anything else given
to ``paddle.save`` (a dict around a state_dict) is pickled with each tensor as a (name, array) tuple.

Unpickling runs whatever a file names, so this module never unpickles: ``pickles.Machine`` parses the
opcodes and builds plain values and arrays from NumPy's own recipe, calling nothing the file names. Each
array is read from the file once its shape and dtype are checked against the bytes it has.

Framework difference: Paddle's ``nn.Linear`` holds its weight (in, out) and computes ``x @ W``; PyTorch's
holds (out, in). Every attention projection is square, so no shape tells them apart: that the file is
Paddle's does, and every Linear weight is transposed, reading and writing.
"""

from __future__ import annotations

import math
import os
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...arrays import bfloat16_widened, contiguous_transpose
from ...backend.contract import framework_names, prepare_weights
from ...errors import WeightsError
from ...safe_files import check_shape, file_size, open_regular, reason, replace_file
from ...spec.config import BERTConfig
from .base import MAX_TENSORS, PADDLE_PARAMS_FILE, CheckpointFormat, Probe, Raw, StateDictInside, state_dict_in
from .pickles import PARSE_ERRORS, SAVE_AS_FLAX, Array, Clamped, Machine, Stored, kind_of

NAMES_TABLE = "StructuredToParameterName@@"  # each name's Paddle-internal name, which nothing here needs
SLICED = "UnpackBigParamInfor@@"  # protocols 2 and 3 cut a tensor over 1 GiB into slices: no BERT has one
# The dtypes of Paddle's tensors as NumPy arrays. NumPy has no bfloat16: Paddle hands over its bits as uint16.
DTYPES = ("f2", "f4", "f8", "u2", "i1", "i2", "i4", "i8", "u1", "b1")
# A 2-D weight is an nn.Linear's, (in, out), unless an nn.Embedding's (d2l's token_embedding, PaddleNLP's
# word_embeddings) or PaddleNLP's MLM decoder, a TransposedLinear held (vocab, hidden) as PyTorch holds it.
LINEAR_WEIGHT = re.compile(r"(?<!_embedding)(?<!_embeddings)(?<!decoder)\.weight$")
MATERIALISED_FACTOR = 2  # what the arrays may take, as a multiple of the file (arrays may share bytes)
MATERIALISED_SLACK = 1 << 20
PROTOCOL = 4  # what paddle.save writes unless asked


def _entries(machine: Machine, top: object, key: str | None) -> tuple[dict[str, Any], list[str]]:
    """The state_dict in the file: the dict itself or, with ``key``, one entry of a dict around it."""

    def tensors(value: object) -> dict[str, Any] | None:
        """A state_dict's names -> arrays (a tensor saved as a (name, array) tuple unwrapped), or None."""
        if not isinstance(value, dict):
            return None
        found = {}
        for name, entry in value.items():
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Array):
                entry = entry[1]
            if name != NAMES_TABLE and not (isinstance(name, str) and isinstance(entry, Array)):
                return None
            found[name] = entry
        found.pop(NAMES_TABLE, None)
        return found or None

    if not isinstance(top, dict):
        raise machine.fail(f"it holds {kind_of(top)}; paddle.save(net.state_dict()) writes a dict of name -> array")
    if not set(top) - {NAMES_TABLE}:
        raise machine.fail("it holds no tensors (paddle.save of an empty dict)")
    if SLICED in top:
        raise machine.fail(f"it cuts tensors over 1 GiB into slices ({SLICED}), which no BERT has")
    if key is None and _is_tree(top) and all(tensors(entry) is None for entry in top.values()):  # no state_dict's
        raise machine.fail(
            "it holds arrays in nested dicts, as a Flax model's parameters are (pickle.dump(jax.device_get(params))), "
            f"not a state_dict: {SAVE_AS_FLAX}"
        )
    return state_dict_in(machine.path, top, key, tensors)


def _is_tree(value: object, depth: int = 0) -> bool:
    """Whether ``value`` is a dict of dicts (at most 16 deep) whose leaves are all arrays."""
    if not isinstance(value, dict) or not value or depth > 16:
        return False
    inner = [entry for entry in value.values() if not isinstance(entry, Array)]
    return (depth > 0 or bool(inner)) and all(_is_tree(entry, depth + 1) for entry in inner)


def _materialise(machine: Machine, file: BinaryIO, name: str, spec: Array) -> np.ndarray:
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
    size = spec.data.size if isinstance(spec.data, Stored) else len(spec.data)
    count = math.prod(spec.shape)
    if size != count * dtype.itemsize:
        raise machine.fail(
            f"the array {name!r} of shape {spec.shape} ({dtype.name}) has {size} bytes, not {count * dtype.itemsize}"
        )
    if isinstance(spec.data, Stored):
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
    machine = Machine(path, "Paddle state_dict file (paddle.save)")
    with open_regular(path, "Paddle state_dict file", WeightsError) as file:
        size = file_size(file)
        try:
            top = machine.run(Clamped(file, size))
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
                total += 0 if spec.data is None else spec.data.size if isinstance(spec.data, Stored) else len(spec.data)
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
    for name in bits:  # Paddle saves bfloat16 as its bits
        arrays[name] = bfloat16_widened(arrays[name])
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
