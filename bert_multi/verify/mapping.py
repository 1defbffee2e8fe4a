"""Where each canonical tensor lives in a user's model: the mapping ``bert-multi verify`` loads weights
through, reads gradients back through, and names activations by.

A mapping is found without comparing anything with the oracle, so that it never depends on whether the
model conforms:

1. a map file's rules first (``map_file.read_map``): renames, transposes, and parts of a fused tensor;
2. then names, tensor by tensor: the known family (every d2l generation's PyTorch, Gluon and Flax names,
   with Flax's (in, out) kernels transposed; transformers' names) and wrapper prefix (``module.``,
   ``params.``) that place the most, then other families under that prefix for the rest;
3. then what is left in the order the model uses it (the order its modules are called in a forward pass
   where its framework can tell, else their registration order), against the canonical tensors in the
   order the oracle uses them, by shape: a 2-D Flax ``kernel`` is (in, out), and a tensor three times
   W_q's size is a fused QKV;
4. else a ``MappingError`` listing what could not be placed, with a map file that would place it
   (``MappingError.suggested``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from ..backend.contract import framework_names
from ..errors import UsageError
from ..files.formats import flax, gluon, huggingface
from ..spec.config import BERTConfig
from ..spec.schema import nsp_layers, param_shapes
from .map_file import MapFile
from .placement import ParameterMap, Placement, Shape, per_block

# The NSP path's two dense layers in each generation (d2l >= 0.12: the pooler is BERTModel.hidden; 0.11:
# NextSentencePred's own MLP): a port keeps its generation's names whatever preset it is checked under.
NSP_LAYOUTS = (("hidden.0", "nsp.output"), ("nsp.mlp.0", "nsp.mlp.2"))


class MappingError(UsageError):
    """The user's parameters and the canonical tensors could not be matched: a set-up error, which says
    what could not be placed and how a map file would place it (``suggested``: that map file's contents,
    to write and check)."""

    def __init__(
        self, problem: str, suggested: dict[str, object] | None = None, unplaced: tuple[str, ...] = ()
    ) -> None:
        advice = (
            ""
            if suggested is None
            else " Write a map file and pass it with --map (map_file=); this one is guessed, so check every line "
            "({i} stands for a block, NAME.T for a transposed tensor, NAME[k/3] for the k-th third of a fused QKV, "
            f"? for what nothing fits):\n{json.dumps(suggested, indent=2)}"
        )
        super().__init__(problem + advice)
        self.problem, self.suggested = problem, suggested  # what went wrong, without the advice
        self.unplaced = unplaced  # the canonical tensors nothing in the model was found for


def may_lack(name: str) -> bool:
    """Whether a model may have no parameter for the canonical tensor ``name`` and still be checked: the
    positions, which ports often keep as a fixed table (a buffer) where d2l learns them, and a block's
    LayerNorms, which a port may leave out around a sublayer. What it computes in their place is compared
    (the embedding; the sublayer's output, where the block's activation is then read)."""
    return (
        name == "encoder.pos_embedding"
        or re.fullmatch(r"encoder\.blks\.\d+\.addnorm[12]\.ln\.(weight|bias)", name) is not None
    )


def _expected_shape(shape: Shape, user: Shape, placement: Placement) -> bool:
    """Whether a canonical tensor of ``shape`` fits at ``placement`` in a user tensor of shape ``user``
    (a leading axis of 1 may be missing: transformers keeps positions as (P, H), d2l as (1, P, H); a
    kernel or bias may keep the heads as an axis of its own: Flax's DenseGeneral, (H, heads, H/heads),
    (heads, H/heads, H), (heads, H/heads))."""
    if placement.transpose and len(user) > 2 and len(shape) == 2 and not placement.part:
        return math.prod(user) == math.prod(shape) and (user[0] == shape[1] or user[-1] == shape[0])
    if not placement.transpose and len(user) == 2 and len(shape) == 1 and not placement.part:
        return math.prod(user) == shape[0] and user[0] > 1 and user[1] > 1  # a bias split over the heads
    if placement.rows:
        user = (user[0] - placement.rows, *user[1:])
    if placement.transpose:
        user = tuple(reversed(user))
    if placement.part:
        k, n = placement.part
        if not user or user[0] % n or not 0 <= k < n:
            return False
        return (user[0] // n, *user[1:]) == shape  # a part is cut along the first axis: no axis to drop
    return tuple(d for d in user if d != 1) == tuple(d for d in shape if d != 1)


# --- families of known names -----------------------------------------------------------------------------


def families(
    config: BERTConfig, native: Mapping[str, Mapping[str, str]] | None = None
) -> list[tuple[str, dict[str, Placement]]]:
    """(who writes these names, canonical name -> its placement) for every naming ``config``'s tensors are
    known under: d2l's PyTorch, Gluon and Flax names of each generation (Flax's kernels transposed),
    transformers' names, and the ``native`` names of the model's framework's own blocks (label -> map-file
    rules, ``Subject.native_names``)."""
    found = []
    for label, own in (native or {}).items():
        found.append((label, MapFile(dict(own), (), label).expand(param_shapes(config))))
    own_layout = nsp_layers(config)
    for layout in sorted(NSP_LAYOUTS, key=lambda layout: layout != own_layout):
        moved = [(rf"^{re.escape(old)}\.", f"{new}.") for old, new in zip(own_layout, layout) if old != new]
        generation = "d2l >= 0.12" if layout == NSP_LAYOUTS[0] else "d2l 0.11"
        for framework, rules in (("PyTorch", []), ("Gluon", gluon.NAME_RULES), ("Flax", flax.NAME_RULES)):
            names = framework_names(config, moved + rules)
            placed = {name: Placement(own, flax.transposed(own) and framework == "Flax") for name, own in names.items()}
            found.append((f"{generation}'s {framework} names", placed))
    if huggingface.inexpressible_semantics(config) is None:  # a BertModel alone, or inside a class with heads
        for label, inside in (("transformers' names", True), ("transformers' BertModel names", False)):
            found.append((label, {c: Placement(own) for c, own in huggingface.hf_names(config, inside).items()}))
    return found


# --- finding the mapping ---------------------------------------------------------------------------------


def map_parameters(
    config: BERTConfig,
    parameters: Iterable[tuple[str, Shape]],
    map_file: MapFile | None = None,
    called: Callable[[], Sequence[str]] | None = None,
    lacking: bool = False,
    native: Mapping[str, Mapping[str, str]] | None = None,
    kept: Collection[str] = (),
    padded: Collection[str] = (),
    made: Mapping[str, Shape] | None = None,
) -> ParameterMap:
    """Place every canonical tensor of ``config`` in the user's ``parameters`` ((name, shape) in
    registration order), as this module's docstring says, or raise ``MappingError``. ``called()``: the
    parameters' names in the order a forward pass uses them, where the framework can tell (asked only
    when names leave something to place). ``lacking``: ``config`` leaves out parts the model lacks, so the
    parameters no canonical tensor sets (its own versions of those parts) are ignored, not refused.
    ``native``: the names of its framework's own blocks (``families``). ``kept``: canonical tensors the
    model has no parameter for (``may_lack``), placed nowhere. ``padded``: the user's
    tables whose row 0 is padding (PyTorch's ``padding_idx=0``). ``made``: the weights its forward makes
    anew on every call (a layer built inside ``forward``), name -> shape, as ``called()`` finds them: a
    canonical tensor is placed there by the order of use, and never set."""
    shapes = dict(parameters)
    canonical = {name: shape for name, shape in param_shapes(config).items() if name not in kept}
    ignored = list(map_file.ignore) if map_file else []
    unknown = [name for name in ignored if name not in shapes]
    if unknown:
        raise MappingError(f"the map file ignores parameters your model does not have: {unknown}")
    placements = map_file.expand(canonical) if map_file else {}
    hows = [f"map file {map_file.source}"] if map_file else []
    left = [name for name in canonical if name not in placements]
    taken = {placement.name for placement in placements.values()}
    free = {name: shape for name, shape in shapes.items() if name not in ignored and name not in taken}
    inferred: tuple[str, ...] = ()
    if left:
        found, how, inferred = _automatic(config, left, free, called, native, padded, made)
        placements.update(found)
        hows.append(how)
    if lacking:
        used = {placement.name for placement in placements.values()}
        ignored += [name for name in shapes if name not in used and name not in ignored]
    made_used = [name for name in (made or {}) if name in {placement.name for placement in placements.values()}]
    if made_used:
        shapes.update({name: (made or {})[name] for name in made_used})
        hows.append(f"{len(made_used)} at weights your forward makes anew on every call (never set)")
    if kept:
        hows.append(f"none of yours for {', '.join(kept)} (what your model computes in their place is compared)")
    mapping = ParameterMap({name: placements[name] for name in canonical if name in placements}, shapes,
                           " + ".join(hows) if hows else "map file", ignored, inferred, tuple(made_used))  # fmt: skip
    _check(mapping, canonical, placements)
    return mapping


def computation_order(config: BERTConfig) -> list[str]:
    """The canonical tensors in the order the oracle uses them: the embeddings, each block, then the heads
    as d2l's ``BERTModel`` calls them, the masked LM before the pooler and the NSP classifier (the schema
    lists the pooler first, as d2l registers it)."""
    rank = {"mlm": 1, "hidden": 2, "nsp": 3}
    return sorted(param_shapes(config), key=lambda name: rank.get(name.split(".")[0], 0))


def _automatic(
    config: BERTConfig,
    left: list[str],
    free: dict[str, Shape],
    order_of_use: Callable[[], Sequence[str]] | None,
    native: Mapping[str, Mapping[str, str]] | None = None,
    padded: Collection[str] = (),
    made: Mapping[str, Shape] | None = None,
) -> tuple[dict[str, Placement], str, tuple[str, ...]]:
    """Placements for the ``left`` canonical tensors among the ``free`` user parameters (name -> shape,
    in registration order): by names, tensor by tensor, then the rest by the order of use and shape, else
    a ``MappingError``. And how, and which were placed by order."""
    canonical = param_shapes(config)
    placements, hows = _by_names(config, left, free, native)
    # In the order the model uses them where its framework can tell, else in d2l's registration order.
    rest = [name for name in canonical if name in left and name not in placements]
    if rest:
        called = order_of_use() if order_of_use is not None else None
        free.update(made or {})  # what the forward made, known once it has run, takes its place in the order
        if called is not None:
            rest = [name for name in computation_order(config) if name in rest]
        taken = {placement.name for placement in placements.values()}
        order = [name for name in (called or []) if name in free and name not in taken]
        known = len(order) if called is not None else None  # the rest the forward never used
        order += [name for name in free if name not in taken and name not in order]
        found, unplaced = _by_order(rest, order, free, canonical, known, padded)
        if unplaced:
            raise MappingError(
                *_unplaced(found, unplaced, free, canonical, placements, called is not None), tuple(unplaced)
            )
        placements.update(found)
        by = "order of use" if called is not None else "registration order"
        hows.append(f"{by} and shape ({len(rest)} tensors, inferred: check them)")
    return placements, " + ".join(hows), tuple(rest)


def _by_names(
    config: BERTConfig, left: list[str], free: dict[str, Shape], native: Mapping[str, Mapping[str, str]] | None = None
) -> tuple[dict[str, Placement], list[str]]:
    """Placements of the ``left`` tensors whose names a family knows: the family and wrapper prefix that
    place the most, then, under that prefix, any other family's names for the rest. And how each did."""
    canonical = param_shapes(config)
    known = families(config, native)
    placements: dict[str, Placement] = {}
    hows: list[str] = []
    prefix: str | None = None
    while True:
        best: tuple[int, str, str, dict[str, Placement]] | None = None
        for family, names in known:
            for candidate in [prefix] if prefix is not None else _prefixes(names, left, free):
                found = {
                    name: Placement(candidate + names[name].name, names[name].transpose, names[name].part)
                    for name in left
                    if name in names  # a family of a framework's blocks names only theirs
                    and name not in placements
                    and candidate + names[name].name in free
                    and _expected_shape(canonical[name], free[candidate + names[name].name], names[name])
                }
                if found and (best is None or len(found) > best[0]):
                    best = (len(found), family, candidate, found)
        if best is None:
            return placements, hows
        count, family, prefix, found = best
        placements.update(found)
        under = f", under the prefix {prefix!r}" if prefix else ""
        every = count == len(left) and not hows
        hows.append(f"names ({family}{under})" if every else f"names ({family}{under}: {count} tensors)")


def _prefixes(names: dict[str, Placement], left: list[str], free: dict[str, Shape]) -> list[str]:
    """The wrapper prefixes under which some of the ``left`` tensors' names in ``names`` are ``free``."""
    found = []
    for name in (name for name in left if name in names):
        own = names[name].name
        for candidate in free:
            if candidate == own or candidate.endswith("." + own):
                found.append(candidate[: -len(own)])
    return sorted(set(found), key=found.index)


_NUMBERED = re.compile(r"^(?P<family>.*?)(?P<index>\d+)(?=[. ]|$)")


def _block_prefixes(names: Iterable[str], blocks: int) -> dict[int, str]:
    """Each block's path in the user's names ("layers.0" ...), where one family of numbered modules counts
    exactly the config's blocks: so that a block's module is sought in that block, and a model that lacks
    one (a LayerNorm left out) does not take the next block's in its place. Empty where none does."""
    families: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for name in names:
        match = _NUMBERED.match(name)
        if match and match["family"] and match["family"][-1] in "._":
            families.setdefault(match["family"], set()).add(int(match["index"]))
            counts[match["family"]] = counts.get(match["family"], 0) + 1
    fitting = [family for family, indices in families.items() if indices == set(range(blocks))]
    if not fitting:
        return {}
    family = max(fitting, key=lambda f: counts[f])
    return {i: f"{family}{i}" for i in range(blocks)}


def _in_block(name: str, canonical: str, prefixes: Mapping[int, str]) -> bool:
    """Whether the user's parameter ``name`` may hold the canonical tensor ``canonical`` of a block: inside
    that block's path where the user's blocks are known (``_block_prefixes``), anywhere else."""
    block = re.match(r"encoder\.blks\.(\d+)\.", canonical)
    if block is None or not prefixes:
        return True
    prefix = prefixes[int(block[1])]
    return name.startswith((prefix + ".", prefix + " "))


def _by_order(
    rest: list[str],
    order: list[str],
    free: dict[str, Shape],
    canonical: dict[str, Shape],
    known: int | None = None,
    padded: Collection[str] = (),
) -> tuple[dict[str, Placement], list[str]]:
    """The ``rest`` of the canonical tensors (in the oracle's order) placed in the user's parameters taken
    in ``order``, in two passes. First whole modules: each canonical module (a dense layer's weight and
    bias, a LayerNorm's, a table) at the module of the first unused parameter that fits its first tensor,
    where that module's tensors fit its own one for one (a pre-norm block's LayerNorm, used before the
    attention, is still its LayerNorm; three times W_q's size is a fused QKV). Then the rest tensor by
    tensor, each at the first unused parameter of its shape between where the modules before and after it
    were placed (a module holding several roles' tensors), or among the parameters after the first
    ``known`` of ``order``: the forward never used them, so where they belong is unknown. Flax's 2-D
    ``kernel`` is taken as (in, out). And the tensors it could not place."""
    placements: dict[str, Placement] = {}
    unused = list(order)
    position = {name: index for index, name in enumerate(order)}
    known = len(order) if known is None else known

    prefixes = _block_prefixes(free, sum(1 for name in canonical if name.endswith(".attention.W_q.weight")))

    def fits(name: str, candidate: str) -> bool:
        return _in_block(candidate, name, prefixes) and _expected_shape(
            canonical[name], free[candidate], _placed(name, canonical[name], candidate, free[candidate], padded)
        )

    modules = _grouped(rest)
    for owner, names in modules.items():
        found = _fused(owner, modules, unused, free, canonical) if not any(n in placements for n in names) else {}
        # The first module that can hold it: whole where it holds nothing else, else left to the second pass
        # (one module of several roles); a module with too few tensors of its shapes is passed over.
        for home in dict.fromkeys(_owner(u) for u in unused if fits(names[0], u)):
            if found is not None:
                break
            members = [u for u in unused if _owner(u) == home]
            held = _fit(names, members, free, canonical, padded)
            if held is not None:
                whole = len(members) == len(names) == len([u for u in order if _owner(u) == home])
                found = held if whole else {}
        for placement in (found or {}).values():
            if placement.name in unused:
                unused.remove(placement.name)
        placements.update(found or {})
    owners = list(modules)
    for index, owner in enumerate(owners):
        before = [position[placements[n].name] for o in owners[:index] for n in modules[o] if n in placements]
        after = [position[placements[n].name] for o in owners[index + 1 :] for n in modules[o] if n in placements]
        low, high = max(before, default=-1), min(after, default=len(order))
        if low >= high:  # the modules around it were placed crossed (a pre-norm block): after the one before
            high = len(order)
        window = [u for u in unused if low < position[u] < min(high, known) or position[u] >= known]
        for name in modules[owner]:
            same = next((u for u in window if fits(name, u)), None) if name not in placements else None
            if same is not None:
                placements[name] = _placed(name, canonical[name], same, free[same], padded)
                unused.remove(same)
                window.remove(same)
    return placements, [name for name in rest if name not in placements]


def _owner(name: str) -> str:
    """The module a parameter belongs to: its path without the last part ("" for the model's own)."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def _grouped(names: list[str]) -> dict[str, list[str]]:
    """``names`` by module, the modules in the order of their first parameter in ``names``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_owner(name), []).append(name)
    return groups


# What a canonical tensor's last name is called in the frameworks' layers, for telling a module's tensors
# apart where the shapes cannot (a LayerNorm's gamma and beta).
LEAF_NAMES = {"weight": ("weight", "kernel", "scale", "gamma", "embedding", "w"), "bias": ("bias", "beta", "b")}


def _fit(
    names: list[str],
    members: list[str],
    free: dict[str, Shape],
    canonical: dict[str, Shape],
    padded: Collection[str] = (),
) -> dict[str, Placement] | None:
    """The canonical module ``names`` held by the user's module ``members``, each tensor at a member of its
    shape (by the leaves' names where shapes are alike, else by order); None if they cannot hold it."""
    found: dict[str, Placement] = {}
    left = list(members)
    for name in names:
        leaf = name.rsplit(".", 1)[-1]
        fitting = [
            u
            for u in left
            if _expected_shape(canonical[name], free[u], _placed(name, canonical[name], u, free[u], padded))
        ]
        named = [u for u in fitting if u.rsplit(".", 1)[-1] in LEAF_NAMES.get(leaf, ())]
        if not fitting:
            return None
        chosen = (named or fitting)[0]
        found[name] = _placed(name, canonical[name], chosen, free[chosen], padded)
        left.remove(chosen)
    return found


def _fused(
    owner: str, modules: dict[str, list[str]], unused: list[str], free: dict[str, Shape], canonical: dict[str, Shape]
) -> dict[str, Placement] | None:
    """W_q, W_k and W_v as the thirds of one module of the user's (a fused QKV), where ``owner`` is W_q's:
    the module of the first unused parameter three times W_q's weight."""
    if not owner.endswith(".attention.W_q"):
        return None
    trio = [owner[: -len("W_q")] + f"W_{x}" for x in "qkv"]
    if not all(module in modules for module in trio):
        return None
    tripled = {name: (3 * shape[0], *shape[1:]) for name, shape in canonical.items()}
    weight = modules[owner][0]
    first = next((u for u in unused if _expected_shape(tripled[weight], free[u], _oriented(u, free[u]))), None)
    if first is None:
        return None
    thirds = _fit(modules[owner], [u for u in unused if _owner(u) == _owner(first)], free, tripled)
    if not thirds:
        return None
    return {
        name.replace(".W_q.", f".W_{x}."): Placement(placement.name, placement.transpose, (k, 3))
        for name, placement in thirds.items()
        for k, x in enumerate("qkv")
    }


def _oriented(name: str, shape: Shape, part: tuple[int, int] | None = None) -> Placement:
    """A placement at the user's parameter ``name``. Framework difference: a Flax Dense keeps its kernel
    (in, out), the transpose of a d2l weight (a DenseGeneral's with the heads as axes of their own)."""
    return Placement(name, flax.transposed(name) and len(shape) >= 2, part)


def _placed(canonical: str, shape: Shape, name: str, user: Shape, padded: Collection[str] = ()) -> Placement:
    """Where ``canonical`` would be in the user's parameter ``name`` of shape ``user``, by order: as
    ``_oriented`` says, and a segment table of one row more whose row 0 is padding (``padded``) after that
    row (segment ids counted from 1, 0 for padding)."""
    placement = _oriented(name, user)
    if canonical == "encoder.segment_embedding.weight" and name in padded and user[0] == shape[0] + 1:
        return Placement(placement.name, placement.transpose, rows=1)
    return placement


def _unplaced(
    guessed: dict[str, Placement],
    unplaced: list[str],
    free: dict[str, Shape],
    canonical: dict[str, Shape],
    placed: dict[str, Placement],
    called: bool,
) -> tuple[str, dict[str, object]]:
    """The error for tensors that could not be placed: what is missing, and a map file to start from (what
    names ``placed``, then the order's ``guessed`` placements, "?" for the ``unplaced``), which the error
    offers."""
    taken = {placement.name for placement in {**placed, **guessed}.values()}
    rules = {name: placement.describe() for name, placement in {**placed, **guessed}.items()}
    rules.update((name, "?") for name in unplaced)
    suggested: dict[str, object] = {
        "names": per_block(dict(sorted(rules.items(), key=lambda item: list(canonical).index(item[0])))),
        "ignore": [name for name in free if name not in taken],
    }
    by = "the order your model calls its modules in" if called else "registration order"
    message = (
        f"{len(unplaced)} canonical tensor(s) could not be placed in your model's parameters: their names "
        f"are none of the known families (d2l's PyTorch, Gluon or Flax names of any generation, "
        f"transformers' names, under any prefix), and by {by} no parameter of the right shape is left for "
        f"them. Not placed: {', '.join(f'{n} {canonical[n]}' for n in unplaced[:8])}"
        f"{' ...' if len(unplaced) > 8 else ''}."
    )
    return message, suggested


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
        if n != len(taken) or sorted(taken) != [(k, n) for k in range(len(taken))]:
            problems.append(f"{name}: its parts are placed as {sorted(taken)}; each of its {n} parts exactly once")
    unplaced = [name for name in mapping.shapes if name not in parts and name not in mapping.ignored]
    if unplaced:
        problems.append(
            f"your model has parameters no canonical tensor sets, which would keep whatever values they hold: "
            f'{unplaced[:8]}{" ..." if len(unplaced) > 8 else ""} (list them under "ignore" in a map file if '
            "they take no part in BERT's outputs)"
        )
    if problems:  # the placement found is still the best start for a map file
        raise MappingError(f"the mapping found by {mapping.how} does not fit: " + "; ".join(problems),
                           suggested=mapping.as_map_file())  # fmt: skip
