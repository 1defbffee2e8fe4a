"""Where each canonical tensor lives in a user's model: the mapping ``bert-multi verify`` loads weights
through, reads gradients back through, and names activations by.

A mapping is found without running the model, so that it never depends on whether the model conforms:

1. a map file's rules first (``read_map``): renames, transposes, and parts of a fused tensor;
2. then the names of a known family (every d2l generation's PyTorch, Gluon and Flax names, with Flax's
   (in, out) kernels transposed; transformers' names), under any wrapper prefix (``module.``, ``params.``);
3. else registration order and shape, when the remaining tensors correspond one to one;
4. else a ``MappingError`` listing what could not be placed, with a map file that would place it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backend.contract import framework_names
from ..errors import UsageError, WeightsError
from ..files.formats import flax, gluon, huggingface
from ..files.safe import open_regular
from ..spec.config import BERTConfig
from ..spec.schema import nsp_layers, param_shapes

Shape = tuple[int, ...]
MAX_MAP_BYTES = 1 << 20
# The NSP path's two dense layers in each generation (d2l >= 0.12: the pooler is BERTModel.hidden; 0.11:
# NextSentencePred's own MLP): a port keeps its generation's names whatever preset it is checked under.
NSP_LAYOUTS = (("hidden.0", "nsp.output"), ("nsp.mlp.0", "nsp.mlp.2"))


class MappingError(UsageError):
    """The user's parameters and the canonical tensors could not be matched: a set-up error, which says
    what could not be placed and how a map file would place it."""


@dataclass(frozen=True)
class Placement:
    """Where one canonical tensor is in the user's model: their parameter ``name``, transposed or not,
    and which part of it (the k-th of n equal parts along the first axis, for a fused QKV)."""

    name: str
    transpose: bool = False
    part: tuple[int, int] | None = None

    def describe(self) -> str:
        return self.name + (".T" if self.transpose else "") + (f"[{self.part[0]}/{self.part[1]}]" if self.part else "")


@dataclass
class ParameterMap:
    """Every canonical tensor's placement in the user's parameters, and how it was found."""

    placements: dict[str, Placement]  # canonical name -> where it is
    shapes: dict[str, Shape]  # the user's parameters, in registration order
    how: str  # "names (...)", "registration order and shape", or the map file, for the report
    ignored: list[str] = field(default_factory=list)  # user parameters stated to be no canonical tensor's

    def user_name(self, canonical: str) -> str:
        return self.placements[canonical].describe()

    def to_user(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The canonical ``weights`` as the user's parameters (parts of a fused tensor put together)."""
        grouped: dict[str, list[tuple[int, np.ndarray, bool]]] = {}
        for canonical, placement in self.placements.items():
            index = placement.part[0] if placement.part else 0
            grouped.setdefault(placement.name, []).append((index, weights[canonical], placement.transpose))
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

    def module_of(self, canonical: str) -> str | None:
        """The user's module that holds ``canonical`` (its parameter's path without the last part), or
        None for a parameter of the model itself."""
        name = self.placements[canonical].name
        return name.rsplit(".", 1)[0] if "." in name else None


def _canonical_view(array: np.ndarray, placement: Placement, shape: Shape) -> np.ndarray:
    if placement.transpose:
        array = array.T
    if placement.part:
        k, n = placement.part
        array = np.split(array, n)[k]
    return array.reshape(shape)


def _expected_shape(shape: Shape, user: Shape, placement: Placement) -> bool:
    """Whether a canonical tensor of ``shape`` fits at ``placement`` in a user tensor of shape ``user``
    (a leading axis of 1 may be missing: transformers keeps positions as (P, H), d2l as (1, P, H))."""
    if placement.transpose:
        user = tuple(reversed(user))
    if placement.part:
        k, n = placement.part
        if not user or user[0] % n or not 0 <= k < n:
            return False
        user = (user[0] // n, *user[1:])
    return tuple(d for d in user if d != 1) == tuple(d for d in shape if d != 1)


# --- families of known names -----------------------------------------------------------------------------


def families(config: BERTConfig) -> list[tuple[str, dict[str, Placement]]]:
    """(who writes these names, canonical name -> its placement) for every naming ``config``'s tensors are
    known under: d2l's PyTorch, Gluon and Flax names of each generation (Flax's kernels transposed), and
    transformers' names."""
    found = []
    own_layout = nsp_layers(config)
    for layout in sorted(NSP_LAYOUTS, key=lambda layout: layout != own_layout):
        moved = [(rf"^{re.escape(old)}\.", f"{new}.") for old, new in zip(own_layout, layout) if old != new]
        generation = "d2l >= 0.12" if layout == NSP_LAYOUTS[0] else "d2l 0.11"
        for framework, rules in (("PyTorch", []), ("Gluon", gluon.NAME_RULES), ("Flax", flax.NAME_RULES)):
            names = framework_names(config, moved + rules)
            placed = {name: Placement(own, flax.transposed(own) and framework == "Flax") for name, own in names.items()}
            found.append((f"{generation}'s {framework} names", placed))
    if huggingface.expressible(config) is None:
        found.append(("transformers' names", {c: Placement(own) for c, own in huggingface.hf_names(config).items()}))
    return found


def _with_prefix(names: dict[str, Placement], wanted: Iterable[str], available: set[str]) -> str | None:
    """The wrapper prefix under which every ``wanted`` canonical tensor's name in ``names`` is in
    ``available``, or None."""
    wanted = list(wanted)
    anchor = names[wanted[0]].name
    for candidate in sorted(available):
        if candidate.endswith(anchor) and (candidate == anchor or candidate[: -len(anchor)].endswith(".")):
            prefix = candidate[: -len(anchor)]
            if all(prefix + names[name].name in available for name in wanted):
                return prefix
    return None


# --- the map file -----------------------------------------------------------------------------------------

_PLACE = re.compile(r"(?P<name>[^\[\]\s]+?)(?P<t>\.T)?(?:\[(?P<k>\d+)/(?P<n>\d+)\])?(?P<t2>\.T)?")


def parse_placement(text: str) -> Placement:
    """``name``, ``name.T`` (transposed), ``name[k/n]`` (the k-th of n equal parts along the first axis)."""
    match = _PLACE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"{text!r} is not a parameter name, NAME.T or NAME[k/n]")
    part = (int(match["k"]), int(match["n"])) if match["n"] else None
    if part and not 0 <= part[0] < part[1]:
        raise UsageError(f"{text!r}: part {part[0]} of {part[1]} does not exist (parts count from 0)")
    return Placement(match["name"], bool(match["t"] or match["t2"]), part)


@dataclass(frozen=True)
class MapFile:
    """A map file's rules: canonical pattern ({i} a block, {p} weight or bias) -> the user's placement
    pattern, and user parameters that are no canonical tensor's (``ignore``)."""

    rules: dict[str, str]
    ignore: tuple[str, ...]
    source: str

    def expand(self, canonical: Iterable[str]) -> dict[str, Placement]:
        found = {}
        for pattern, target in self.rules.items():
            regex = re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", "(?P<p>weight|bias)")
            matched = False
            for name in canonical:
                match = re.fullmatch(regex, name)
                if match:
                    matched = True
                    found[name] = parse_placement(target.replace("{i}", match.groupdict().get("i") or "")
                                                  .replace("{p}", match.groupdict().get("p") or ""))  # fmt: skip
            if not matched:
                raise UsageError(f"{self.source}: {pattern!r} names no canonical tensor of this config")
        return found


def read_map(path: str | Path) -> MapFile:
    """A map file: JSON ``{"names": {canonical pattern: placement}, "ignore": [names]}``. Anything else
    is a ``WeightsError`` naming the file (it is read like every other file: size first, then parsed)."""
    path = Path(path)
    with open_regular(path, "map file", WeightsError) as file:
        data = file.read(MAX_MAP_BYTES + 1)
    if len(data) > MAX_MAP_BYTES:
        raise WeightsError(f"{path}: a map file of over {MAX_MAP_BYTES} bytes is not one; expected a small JSON file")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise WeightsError(f"{path}: not a JSON map file ({str(error)[:200]})") from None
    if not isinstance(document, dict) or set(document) - {"names", "ignore"}:
        raise WeightsError(
            f'{path}: expected an object with "names" (and optionally "ignore"), got {str(document)[:100]}'
        )
    rules, ignore = document.get("names", {}), document.get("ignore", [])
    if not isinstance(rules, dict) or not all(isinstance(v, str) for v in rules.values()):
        raise WeightsError(f'{path}: "names" must map canonical names to strings')
    if not isinstance(ignore, list) or not all(isinstance(v, str) for v in ignore):
        raise WeightsError(f'{path}: "ignore" must be a list of parameter names')
    for target in rules.values():
        try:
            parse_placement(target.replace("{i}", "0").replace("{p}", "weight"))
        except UsageError as error:
            raise WeightsError(f"{path}: {error}") from None
    return MapFile(rules, tuple(ignore), str(path))


# --- finding the mapping ---------------------------------------------------------------------------------


def map_parameters(
    config: BERTConfig, parameters: Iterable[tuple[str, Shape]], map_file: MapFile | None = None
) -> ParameterMap:
    """Place every canonical tensor of ``config`` in the user's ``parameters`` ((name, shape) in
    registration order), as this module's docstring says, or raise ``MappingError``."""
    shapes = dict(parameters)
    canonical = param_shapes(config)
    ignored = list(map_file.ignore) if map_file else []
    unknown = [name for name in ignored if name not in shapes]
    if unknown:
        raise MappingError(f"the map file ignores parameters your model does not have: {unknown}")
    placements = map_file.expand(canonical) if map_file else {}
    hows = [f"map file {map_file.source}"] if map_file else []
    left = [name for name in canonical if name not in placements]
    taken = {placement.name for placement in placements.values()}
    free = {name: shape for name, shape in shapes.items() if name not in ignored and name not in taken}
    if left:
        found, how = _automatic(config, left, free)
        placements.update(found)
        hows.append(how)
    mapping = ParameterMap({name: placements[name] for name in canonical if name in placements}, shapes,
                           " + ".join(hows) if hows else "map file", ignored)  # fmt: skip
    _check(mapping, canonical, placements)
    return mapping


def _automatic(config: BERTConfig, left: list[str], free: dict[str, Shape]) -> tuple[dict[str, Placement], str]:
    """Placements for the ``left`` canonical tensors among the ``free`` user parameters (name -> shape,
    in registration order): by a family's names, else by order and shape, else a ``MappingError``."""
    available = set(free)
    for family, names in families(config):
        prefix = _with_prefix(names, left, available)
        if prefix is not None:
            how = f"names ({family}" + (f", under the prefix {prefix!r})" if prefix else ")")
            return {name: Placement(prefix + names[name].name, names[name].transpose) for name in left}, how
    canonical = param_shapes(config)
    # Framework difference: a Flax Dense keeps its kernel (in, out), the transpose of a d2l weight.
    ordered = {c: Placement(u, flax.transposed(u) and len(free[u]) == 2) for c, u in zip(left, free)}
    if len(free) == len(left) and all(_expected_shape(canonical[c], free[p.name], p) for c, p in ordered.items()):
        return ordered, "registration order and shape (inferred: check it)"
    raise MappingError(_unplaced(left, free, canonical))


def _guesses(left: list[str], free: dict[str, Shape], canonical: dict[str, Shape]) -> dict[str, str]:
    """A first map for ``left``: a tensor three times W_q's size as a fused QKV, else the first unused
    parameter of the right shape, in registration order."""
    guesses: dict[str, str] = {}
    unused = list(free)
    for name in left:
        if name in guesses:
            continue
        query = re.fullmatch(r"(.*\.attention\.)W_q\.(weight|bias)", name)
        if query:
            fused = [u for u in unused if _expected_shape(canonical[name], free[u], Placement(u, part=(0, 3)))]
            trio = [f"{query[1]}W_{x}.{query[2]}" for x in "qkv"]
            if fused and all(other in canonical for other in trio):
                guesses.update((other, f"{fused[0]}[{k}/3]") for k, other in enumerate(trio))
                unused.remove(fused[0])
                continue
        same = [u for u in unused if _expected_shape(canonical[name], free[u], Placement(u))]
        guesses[name] = same[0] if same else "?"
        if same:
            unused.remove(same[0])
    guesses["ignore"] = ", ".join(unused)
    return guesses


def _per_block(guesses: dict[str, str]) -> dict[str, str]:
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


def _unplaced(left: list[str], free: dict[str, Shape], canonical: dict[str, Shape]) -> str:
    """The error for tensors that could not be placed: what is missing, and a map file to start from."""
    guesses = _guesses(left, free, canonical)
    unused = [name for name in guesses.pop("ignore").split(", ") if name]
    shown = json.dumps({"names": _per_block(guesses), "ignore": unused}, indent=2)
    return (
        f"{len(left)} canonical tensor(s) could not be placed in your model's parameters: their names are "
        f"none of the known families (d2l's PyTorch or Gluon names of any generation, transformers' names, "
        f"under any prefix), and by registration order the shapes do not correspond one to one "
        f"({len(left)} canonical tensors, {len(free)} parameters of yours). Not placed: "
        f"{', '.join(f'{n} {canonical[n]}' for n in left[:8])}{' ...' if len(left) > 8 else ''}. "
        f"Write a map file and pass it with --map (map_file=); this one is guessed by shape, so check "
        f"every line ({{i}} stands for a block, NAME.T for a transposed tensor, NAME[k/3] for the k-th "
        f"third of a fused QKV):\n{shown}"
    )


def _check(mapping: ParameterMap, canonical: dict[str, Shape], placements: dict[str, Placement]) -> None:
    """Every placement names a parameter of the right shape; every parameter is placed or ignored; a
    fused tensor's parts are all placed."""
    problems = []
    for name, placement in placements.items():
        user = mapping.shapes.get(placement.name)
        if user is None:
            problems.append(f"{name} -> {placement.describe()}: your model has no parameter {placement.name!r}")
        elif not _expected_shape(canonical[name], user, placement):
            problems.append(f"{name} {canonical[name]} -> {placement.describe()}: that parameter's shape is {user}")
    parts: dict[str, list[tuple[int, int]]] = {}
    for placement in placements.values():
        parts.setdefault(placement.name, []).append(placement.part or (0, 1))
    for name, taken in parts.items():
        n = taken[0][1]
        if sorted(taken) != [(k, n) for k in range(n)]:
            problems.append(f"{name}: its parts are placed as {sorted(taken)}; each of its {n} parts exactly once")
    unplaced = [name for name in mapping.shapes if name not in parts and name not in mapping.ignored]
    if unplaced:
        problems.append(
            f"your model has parameters no canonical tensor sets, which would keep whatever values they hold: "
            f'{unplaced[:8]}{" ..." if len(unplaced) > 8 else ""} (list them under "ignore" in a map file if '
            "they take no part in BERT's outputs)"
        )
    if problems:
        raise MappingError(f"the mapping found by {mapping.how} does not fit: " + "; ".join(problems))
