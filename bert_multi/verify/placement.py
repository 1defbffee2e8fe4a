"""Where a canonical tensor is in a user's model (``Placement``: their parameter, transposed or not, or a
part of a fused one), and a whole model's placements (``ParameterMap``), which move arrays both ways:
the canonical weights into the user's parameters, and the user's parameters or gradients back. How they
are found is ``mapping``'s; how a user writes them down, ``map_file``'s."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where one canonical tensor is in the user's model: their parameter ``name``, transposed or not,
    and which part of it (the k-th of n equal parts along the first axis, for a fused QKV; or its rows
    from ``rows`` on, after rows of the model's own: a segment table whose row 0 is padding)."""

    name: str
    transpose: bool = False
    part: tuple[int, int] | None = None
    rows: int = 0

    def describe(self) -> str:
        part = f"[{self.part[0]}/{self.part[1]}]" if self.part else f"[{self.rows}:]" if self.rows else ""
        return self.name + (".T" if self.transpose else "") + part


@dataclass
class ParameterMap:
    """Every canonical tensor's placement in the user's parameters, and how it was found."""

    placements: dict[str, Placement]  # canonical name -> where it is
    shapes: dict[str, Shape]  # the user's parameters, in registration order
    how: str  # "names (...)", "registration order and shape", or the map file, for the report
    ignored: list[str] = field(default_factory=list)  # user parameters stated to be no canonical tensor's
    inferred: tuple[str, ...] = ()  # the canonical tensors placed by order and shape, not by names
    made: tuple[str, ...] = ()  # the user's weights, placed at, that its forward makes anew on every call

    def with_placements(self, changed: Mapping[str, Placement], note: str) -> ParameterMap:
        """The same mapping with some placements changed, and why."""
        placements = {name: changed.get(name, placement) for name, placement in self.placements.items()}
        return ParameterMap(placements, self.shapes, f"{self.how} + {note}", self.ignored, self.inferred)

    def user_name(self, canonical: str) -> str:
        return self.placements[canonical].describe()

    def to_user(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The canonical ``weights`` as the user's parameters (parts of a fused tensor put together)."""
        grouped: dict[str, list[tuple[int, np.ndarray, bool]]] = {}
        for canonical, placement in self.placements.items():
            index = placement.part[0] if placement.part else 0
            array = weights[canonical]
            if placement.rows:  # the rows before are padding, which a model never reads: zeros
                array = np.concatenate([np.zeros((placement.rows, *array.shape[1:]), array.dtype), array])
            grouped.setdefault(placement.name, []).append((index, array, placement.transpose))
        arrays = {}
        for name, pieces in grouped.items():
            pieces.sort(key=lambda piece: piece[0])
            joined = np.concatenate([piece[1] for piece in pieces]) if len(pieces) > 1 else pieces[0][1]
            arrays[name] = np.ascontiguousarray((joined.T if pieces[0][2] else joined).reshape(self.shapes[name]))
        return arrays

    def to_canonical(
        self, arrays: Mapping[str, np.ndarray | None], shapes: Mapping[str, Shape]
    ) -> dict[str, np.ndarray | None]:
        """The user's ``arrays`` (parameters or their gradients; None stays None) as canonical tensors of
        ``shapes``."""
        out: dict[str, np.ndarray | None] = {}
        for canonical, placement in self.placements.items():
            array = arrays.get(placement.name)
            if array is not None:
                array = _canonical_view(array, placement, shapes[canonical])
            out[canonical] = array
        return out

    def as_map_file(self) -> dict[str, object]:
        """These placements as a map file's contents, which ``read_map`` reads back to the same placements
        (``--write-map``): one rule per block pattern where every block follows it."""
        placed = {name: placement for name, placement in self.placements.items() if placement.name not in self.made}
        return {  # weights made in forward are none of the model's: found again as they were found here
            "names": per_block({name: placement.describe() for name, placement in placed.items()}),
            "ignore": list(self.ignored),
        }

    def module_of(self, canonical: str) -> str | None:
        """The user's module that holds ``canonical`` (its parameter's path without the last part), or
        None for a parameter of the model itself."""
        name = self.placements[canonical].name
        if name in self.made:  # "layers.0.attn (made in forward: 2)": that module's forward made it
            module = name.rsplit(" (", 1)[0]
            return None if module == "the model" else module
        return name.rsplit(".", 1)[0] if "." in name else None


def _canonical_view(array: np.ndarray, placement: Placement, shape: Shape) -> np.ndarray:
    if placement.transpose:
        # A kernel of more axes (Flax's DenseGeneral: (in, heads, head_dim), or (heads, head_dim, out)) is the
        # (in, out) matrix with axes split: merged first, then transposed.
        array = (array.reshape(shape[::-1]) if array.ndim != 2 and not placement.part else array).T
    if placement.part:
        k, n = placement.part
        size = array.shape[0] // n
        array = array[k * size : (k + 1) * size]
    return array[placement.rows :].reshape(shape)


def per_block(guesses: dict[str, str]) -> dict[str, str]:
    """The same rules with the block number as {i} wherever every block follows one pattern."""
    patterns: dict[str, set[str]] = {}
    for name, guess in guesses.items():
        block = re.match(r"encoder\.blks\.(\d+)\.", name)
        key = name if block is None else name.replace(block[0], "encoder.blks.{i}.", 1)
        if block is not None:  # the block's number where it is a part of the user's name
            guess = re.sub(rf"(^|\.){block[1]}(?=\.)", r"\g<1>{i}", guess)
        patterns.setdefault(key, set()).add(guess)
    if all(len(found) == 1 for found in patterns.values()):
        return {key: found.pop() for key, found in patterns.items()}
    return guesses
