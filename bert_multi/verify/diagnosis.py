"""What a user's diverging module computes instead: every change the catalogue of known mistakes
(``mistakes``) tries at that activation, fed the module's own recorded input (the user's activations
upstream, so that an earlier divergence cannot leak in), alone and two or three together; the entry and
value that reproduce the module's output are named, or how far the closest comes. And how far two runs of
one input are apart (dropout left on, layers made in ``forward``)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..engine.compare import Tolerance, tolerance_for
from ..spec.config import BERTConfig
from .mistakes import FLOAT32_INSIDE, Mistake, tries_at
from .rules import Rule, Site, compute

FLOAT32 = tolerance_for("float32")
# How far float32's rounding inside a module can move its output, relative to the output's scale: 64 of
# float32's units in the last place.
FLOAT32_ROUNDING = 64 * float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class Diagnosis:
    """What a user's module computes instead, where it diverges: the mistake and change that reproduce
    its output (with ``also``, the other mistakes made in the same module), and how closely (``error``); or
    none, with how far d2l's rule and the closest change are."""

    activation: str
    where: str  # the user's module, in their names
    mistake: Mistake | None
    rule: Rule
    error: float  # the max abs difference from the user's output of the rule named (the closest tried)
    off: float  # how far d2l's own rule is from the user's output
    config: BERTConfig
    also: tuple[tuple[Mistake, Rule], ...] = ()

    def says(self) -> str:
        """What the module does instead, every mistake found in it: "adds ...; it normalises ..."."""
        assert self.mistake is not None
        return "; it ".join(
            mistake.says(rule, self.config) for mistake, rule in ((self.mistake, self.rule), *self.also)
        )

    def describe(self) -> str:
        if self.mistake is not None:
            reproduced = f" (reproduces your output to {self.error:.1g})" if self.mistake.reproduced_by_rule else ""
            return f"{self.where} {self.says()}{reproduced}"
        closest = (
            f"; the closest known mistake, that it {self.rule['said']}, is off by {self.error:.3g}" if self.rule else ""
        )
        return (
            f"{self.where}: no known mistake reproduces its output (d2l's rule is off by {self.off:.3g}{closest}); "
            "its input is yours, so the difference is in this module"
        )


def _distance(candidate: np.ndarray, own: np.ndarray) -> float:
    """The max abs difference, NaN where only one side is NaN counting as infinite, where both as none."""
    if candidate.shape != own.shape:
        return math.inf
    both = np.isnan(candidate) & np.isnan(own)
    difference = np.where(both, 0.0, np.abs(candidate - own))
    return float(np.nan_to_num(difference, nan=math.inf).max(initial=0.0))


def diagnose(site: Site, where: str, tolerance: Tolerance) -> Diagnosis | None:
    """The catalogue's entry that reproduces the user's output at ``site`` within ``tolerance``, tried on
    the module's own recorded input; or a ``Diagnosis`` saying none does. None where the site's input was
    not recorded (nothing to try)."""
    try:
        own = site.own(site.activation)
        expected = compute(site)
    except (KeyError, ValueError):  # its input not recorded, or recorded at a module of another shape
        return None
    off = _distance(expected, own)
    peak = float(np.nanmax(np.abs(own), initial=0.0))  # the output's scale, for every bound below
    bound = tolerance.atol + tolerance.rtol * peak
    if off <= bound:  # d2l's rule reproduces it here: nothing to diagnose in this run
        return None
    tried: dict[str, list[tuple[float, Mistake, Rule]]] = {}  # each mistake's changes, the closest first
    for mistake, rule in tries_at(site):
        try:
            error = _distance(compute(site, **rule), own)
        except (KeyError, ValueError):  # not recorded, or recorded at a module of another shape
            continue
        tried.setdefault(mistake.name, []).append((error, mistake, rule))
    for changes in tried.values():
        changes.sort(key=lambda entry: entry[0])
    # Reproduced: to the dtype's own bound, or, where a framework's kernel is itself less exact than that
    # (MXNet's float64 GELU: 1e-7), within float32's and a thousand times closer than d2l's rule.
    loose = FLOAT32.atol + FLOAT32.rtol * peak

    def reproduces(error: float) -> bool:
        return error <= bound or (error <= loose and 1000 * error <= off)

    ranked = sorted(tried.values(), key=lambda changes: changes[0][0])
    if ranked and ranked[0][0][0] <= bound:
        error, found, rule = ranked[0][0]
        return Diagnosis(site.activation, where, found, rule, error, off, site.config)
    # One mistake that comes only near (a pre-norm block whose LayerNorm's epsilon differs by 1e-5 too) gives
    # way to several that reproduce the output to the dtype's own bound.
    together = _together(site, own, ranked[:COMBINED])
    single = ranked[0][0] if ranked and reproduces(ranked[0][0][0]) else None
    if together is not None and reproduces(together[0]) and (single is None or together[0] <= bound):
        error, ((found, rule), *others) = together
        return Diagnosis(site.activation, where, found, rule, error, off, site.config, also=tuple(others))
    if single is not None:
        error, found, rule = single
        return Diagnosis(site.activation, where, found, rule, error, off, site.config)
    if site.precision == np.float64 and off <= FLOAT32_ROUNDING * max(1.0, peak):
        return Diagnosis(site.activation, where, FLOAT32_INSIDE, {"off": off}, off, off, site.config)
    if not ranked:
        return Diagnosis(site.activation, where, None, {}, math.inf, off, site.config)
    error, found, rule = ranked[0][0]
    named = {**rule, "name": found.name, "said": found.says(rule, site.config)}
    return Diagnosis(site.activation, where, None, named, error, off, site.config)


# Several mistakes in one module (a port on a framework's defaults: Flax's LayerNorm epsilon and its tanh
# GELU in the masked LM's transform; a from-scratch repository's fixed positions read through its pre-norm
# LayerNorm of its own form) are tried together, each mistake with every change it tries (the epsilon that
# fits alone need not fit beside another mistake): pairs, the changes closest alone first, then the
# closest pairs with a third. At most ``MAX_TOGETHER`` computations more of each, at a site no single
# mistake reproduces; a mistake far from the user's output alone may be the other half of a pair (a mask
# made from the tokens, read through a pre-norm block), so the closest ``COMBINED`` are a wide cut.
COMBINED = 10
MAX_TOGETHER = 128
EXTENDED = 4  # the closest pairs a third mistake is tried with


def _together(
    site: Site, own: np.ndarray, closest: list[list[tuple[float, Mistake, Rule]]]
) -> tuple[float, list[tuple[Mistake, Rule]]] | None:
    """The closest combination of changes from two or three of the ``closest`` mistakes (each one's changes,
    the closest alone first) that change different things, tried together."""
    changes = [[(mistake, rule) for _, mistake, rule in tried] for tried in closest]
    ranked = sorted(  # the changes closest alone first, within their mistakes
        (
            (i + j, [first[i], second[j]])
            for first, second in itertools.combinations(changes, 2)
            for i, j in itertools.product(range(len(first)), range(len(second)))
        ),
        key=lambda entry: entry[0],
    )
    pairs = [pair for _, pair in ranked if _apart(pair)]
    scored = _scored(site, own, pairs[:MAX_TOGETHER])
    triples = [
        [*pair, third]
        for _, pair in scored[:EXTENDED]
        for other in changes
        if all(other[0][0] is not mistake for mistake, _ in pair)
        for third in other
        if _apart([*pair, third])
    ]
    scored += _scored(site, own, triples[:MAX_TOGETHER])
    return min(scored, key=lambda entry: entry[0], default=None)


def _scored(
    site: Site, own: np.ndarray, combinations: list[list[tuple[Mistake, Rule]]]
) -> list[tuple[float, list[tuple[Mistake, Rule]]]]:
    """Each combination's distance from the user's output, the closest first."""
    scored = []
    for chosen in combinations:
        try:
            candidate = compute(site, **{key: value for _, rule in chosen for key, value in rule.items()})
        except (KeyError, ValueError):  # not recorded, or recorded at a module of another shape
            continue
        scored.append((_distance(candidate, own), chosen))
    return sorted(scored, key=lambda entry: entry[0])


def _apart(changes: list[tuple[Mistake, Rule]]) -> bool:
    """Whether the changes change different things (no keyword twice)."""
    return sum(len(rule) for _, rule in changes) == len({key for _, rule in changes for key in rule})


def nondeterminism(first: Mapping[str, np.ndarray | None], second: Mapping[str, np.ndarray | None]) -> float:
    """How far two runs of one input are apart, over every array both recorded: 0 for a model in
    inference mode."""
    apart = 0.0
    for name, value in first.items():
        other = second.get(name)
        if value is not None and other is not None and np.shape(value) == np.shape(other):
            apart = max(apart, _distance(np.asarray(value, np.float64), np.asarray(other, np.float64)))
    return apart
