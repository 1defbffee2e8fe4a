"""Which of a user's alike modules plays which part, where names and shapes cannot tell and the order of use
only suggests: W_q, W_k, W_v and W_o of a block (four dense layers of one shape), the pooler and the masked
LM's first dense layer, a block's two LayerNorms, a square weight stored under a name that says nothing of
its orientation.

The oracle decides, group by group, from one forward of the user's model with the weights placed as the
order suggests: each activation those modules compute is recomputed by the oracle's rule from the user's
own recorded input (``rules.compute``), the canonical weights given to the roles in each other way
(and an unsure square weight either way round); the assignment that reproduces what the user's model
computed is the placement. Where none does (the model computes something else there), the order's
placement stands and the report says that the oracle could not confirm it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping

import numpy as np

from ..engine.compare import tolerance_for
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.schema import param_shapes
from .mistakes import Mistake, tries_at
from .placement import ParameterMap, Placement
from .rules import Rule, Site, compute
from .subject import activation_of

Shape = tuple[int, ...]
# A square weight whose name says which way it is stored (torch's and Gluon's weight is (out, in), Flax's
# kernel (in, out)) is not tried the other way round.
KNOWN_ORIENTATION = ("weight", "kernel")
MAX_ASSIGNMENTS = 400  # per group: the permutations and orientations tried, at most
# (its order: the owner whose placed module computes each role; which unsure owners' weights are flipped)
Assignment = tuple[tuple[str, ...], tuple[bool, ...]]


def decide_roles(
    mapping: ParameterMap,
    config: BERTConfig,
    weights: Mapping[str, np.ndarray],
    inputs: ModelInputs,
    recorded: Mapping[str, np.ndarray | None],
) -> tuple[ParameterMap, list[str]]:
    """``mapping`` with the roles of the alike modules it placed by order decided by the oracle, and a line
    for each group whose placement it changed or could not confirm (none where the order was right)."""
    canonical = param_shapes(config)
    changed: dict[str, Placement] = {}
    notes: list[str] = []
    for owners in _alike(mapping, canonical):
        sites = sorted({site for owner in owners if (site := _site(owner, config)) is not None})
        if not sites or any(recorded.get(site) is None for site in sites):
            continue
        unsure = [owner for owner in owners if _unsure(mapping, owner, canonical)]
        yours = ", ".join(_module(mapping.placements, owner) for owner in owners)
        # d2l's rule first; then, for a model that computes something else there, each known mistake's.
        found: Assignment | None = None
        allowed = ""
        for candidate, rule in [(None, {}), *_mistakes(sites, config, weights, inputs, recorded)]:
            found = _assignment(owners, unsure, sites, canonical, config, weights, inputs, recorded, rule)
            if found is not None:
                allowed = f" (allowing for its {candidate.name}, diagnosed below)" if candidate is not None else ""
                break
        if found is None:
            # Where d2l's rule reproduces some sites alone (the model computes something else at the others),
            # those decide.
            alone = {site: _assignment(owners, unsure, [site], canonical, config, weights, inputs, recorded, {})
                     for site in sites}  # fmt: skip
            kept, lost = [s for s in sites if alone[s] is not None], [s for s in sites if alone[s] is None]
            if kept and lost:
                found = _assignment(owners, unsure, kept, canonical, config, weights, inputs, recorded, {})
                allowed = f" (from {', '.join(kept)} alone: no assignment reproduces {', '.join(lost)})"
            if found is None:
                why = f"reproduces {', '.join(lost)}" if lost else f"reproduces {' and '.join(sites)} at once"
                notes.append(f"the oracle could not confirm which of {yours} is which of {', '.join(owners)}: "
                             f"no assignment {why}")  # fmt: skip
                continue
        moved = _placements(found, owners, unsure, mapping.placements, canonical)
        if any(moved[name] != mapping.placements[name] for name in moved):
            changed.update(moved)
            at = ", ".join(f"{owner} at {_module(moved, owner, describe=True)}" for owner in owners)
            notes.append(f"the oracle placed {at}{allowed}")
    if not notes:
        return mapping, notes
    return mapping.with_placements(changed, "; ".join(notes)), notes


def _alike(mapping: ParameterMap, canonical: Mapping[str, Shape]) -> list[list[str]]:
    """Groups of canonical modules placed by order that their shapes cannot tell apart, within one part of
    one block or among the heads (the pooler and the masked LM's first layer); and each module alone whose
    square weight's orientation its name does not say."""
    groups: dict[tuple[str, tuple[Shape, ...]], list[str]] = {}
    for owner in dict.fromkeys(name.rsplit(".", 1)[0] for name in mapping.inferred):
        tensors = _tensors(owner, canonical)
        if not all(name in mapping.inferred for name in tensors):
            continue
        block = re.match(r"encoder\.blks\.(\d+)\.(attention|ffn|addnorm\d)", owner)
        where = f"{block[1]} {'norm' if block[2].startswith('addnorm') else block[2]}" if block else "heads"
        groups.setdefault((where, tuple(canonical[name] for name in tensors)), []).append(owner)
    found = [owners for owners in groups.values() if len(owners) > 1]
    found += [owners for owners in groups.values() if len(owners) == 1 and _unsure(mapping, owners[0], canonical)]
    return found


def _site(owner: str, config: BERTConfig) -> str | None:
    """The activation a canonical module computes, where the oracle can recompute it from recorded input
    (not the embedding's, nor the NSP classifier's)."""
    site = activation_of(config, owner)
    return None if site in ("embedding", "nsp") else site


def _tensors(owner: str, canonical: Mapping[str, Shape]) -> list[str]:
    return [name for name in canonical if name.rsplit(".", 1)[0] == owner]


def _unsure(mapping: ParameterMap, owner: str, canonical: Mapping[str, Shape]) -> bool:
    """Whether the owner's weight is square and stored under a name that does not say its orientation."""
    weight = f"{owner}.weight"
    shape = canonical.get(weight, ())
    placed = mapping.placements.get(weight)
    return (
        placed is not None
        and len(shape) == 2
        and shape[0] == shape[1]
        and placed.name.rsplit(".", 1)[-1] not in KNOWN_ORIENTATION
    )


def _mistakes(
    sites: list[str],
    config: BERTConfig,
    weights: Mapping[str, np.ndarray],
    inputs: ModelInputs,
    recorded: Mapping[str, np.ndarray | None],
) -> Iterator[tuple[Mistake, Rule]]:
    """The catalogue's changes that could show at any of ``sites``."""
    for site in sites:
        yield from tries_at(Site(config, dict(weights), inputs, site, recorded))


def _assignment(
    owners: list[str],
    unsure: list[str],
    sites: list[str],
    canonical: Mapping[str, Shape],
    config: BERTConfig,
    weights: Mapping[str, np.ndarray],
    inputs: ModelInputs,
    recorded: Mapping[str, np.ndarray | None],
    rule: Rule,
) -> Assignment | None:
    """The first assignment (the order's own first) under which the oracle, its ``rule`` changed so,
    reproduces every site."""
    for order, flips in itertools.islice(_assignments(owners, unsure), MAX_ASSIGNMENTS):
        given = dict(weights)
        for role, source in zip(owners, order):
            for name in _tensors(role, canonical):
                value = weights[source + name[len(role) :]]
                given[name] = value.T if _flipped(name, source, unsure, flips) else value
        if all(_reproduces(Site(config, given, inputs, site, recorded), rule) for site in sites):
            return order, flips
    return None


def _assignments(owners: list[str], unsure: list[str]) -> Iterator[Assignment]:
    for flips in itertools.product((False, True), repeat=len(unsure)):
        for order in itertools.permutations(owners):
            yield order, flips


def _flipped(name: str, source: str, unsure: list[str], flips: tuple[bool, ...]) -> bool:
    return name.endswith(".weight") and source in unsure and flips[unsure.index(source)]


def _reproduces(site: Site, rule: Rule) -> bool:
    """Whether the oracle's rule (changed by ``rule``), from the recorded input, computes what the model
    recorded (to float32's bound: a framework's kernels may be less exact than float64's)."""
    own = site.own(site.activation)
    try:
        computed = compute(site, **rule)
    except ValueError:  # an input recorded at a module that is not the one the rule reads
        return False
    except KeyError:  # an input the rule reads that was not recorded
        return False
    if computed.shape != own.shape:
        return False
    tolerance = tolerance_for("float32")
    bound = tolerance.atol + tolerance.rtol * float(np.nanmax(np.abs(own), initial=0.0))
    with np.errstate(invalid="ignore"):
        return bool(np.nanmax(np.abs(computed - own), initial=0.0) <= bound)


def _placements(
    found: Assignment,
    owners: list[str],
    unsure: list[str],
    placements: Mapping[str, Placement],
    canonical: Mapping[str, Shape],
) -> dict[str, Placement]:
    """Where the assignment puts each role's tensors: where the tensors of the owner whose module computes
    the role were placed, turned round where that module's square weight was found flipped."""
    order, flips = found
    moved = {}
    for role, source in zip(owners, order):
        for name in _tensors(role, canonical):
            placed = placements[source + name[len(role) :]]
            flip = _flipped(name, source, unsure, flips)
            moved[name] = Placement(placed.name, placed.transpose != flip, placed.part)
    return moved


def _module(placements: Mapping[str, Placement], owner: str, describe: bool = False) -> str:
    """The user's module an owner's tensors are placed in; with ``describe``, its first tensor's placement
    (where one module holds several roles' tensors, the parameter is what tells them apart)."""
    placed = next(placement for name, placement in placements.items() if name.rsplit(".", 1)[0] == owner)
    if describe:
        return placed.describe()
    return placed.name.rsplit(".", 1)[0] if "." in placed.name else placed.name
