"""The known porting mistakes, one catalogue: each a change to one rule of the oracle, with where it shows
first, which conformance case catches it, and how to say it.

The fault tests plant every entry in every framework's own model (``conformance/test_faults.py``) and
check that the case catches it where the catalogue says; ``diagnose`` tries every entry on a diverging
activation of a user's model, fed that module's own recorded input (the user's activations upstream, so
that an earlier divergence cannot leak in), and names the entry and value that reproduce what the user's
module computed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..engine.compare import Tolerance, tolerance_for
from ..spec.config import BERTConfig
from .rules import ACTIVATIONS, LAYER_NORM_FORMS, Rule, Site, compute, layer_norm_parts

FLOAT32 = tolerance_for("float32")


@dataclass(frozen=True)
class Mistake:
    """One known mistake: the rule it changes (``tries``: the changes to try, each a ``Rule`` of
    ``compute``), where it shows first and which case catches it there (what the fault tests hold every
    framework to), and ``says``: the sentence for a change that reproduces a user's module."""

    name: str
    shows_at: str  # the activation where it shows first, in block 0 for a block's
    caught_by: str  # the conformance case that catches it there
    says: Callable[[Rule, BERTConfig], str]
    tries: Callable[[Site], Iterable[Rule]] = field(default=lambda site: ())


def _eps_values(site: Site) -> list[Rule]:
    """The epsilon the user's LayerNorm used, fitted from its input and output (the normalised value's
    scale is 1 / sqrt(var + eps)), then the usual ones."""
    values: list[float] = [1e-12, 1e-6, 1e-3, 0.0]
    try:
        total, gamma, beta = layer_norm_parts(site)
    except (KeyError, ValueError):  # a LayerNorm inside the module (the masked LM's): the usual values only
        return [{"eps": value} for value in values]
    own = site.own(site.activation)
    if own.shape != total.shape or gamma.shape != own.shape[-1:]:  # not a LayerNorm of that sum: nothing to fit
        return [{"eps": value} for value in values]
    normalised = (own - beta) / np.where(gamma == 0, 1, gamma)
    centred = total - total.mean(axis=-1, keepdims=True)
    usable = np.abs(normalised) > 0.5
    if usable.any():
        scale = np.median(np.abs(centred[usable] / normalised[usable]))
        fitted = scale**2 - float(np.median(total.var(axis=-1)))
        if fitted > 0:
            values.insert(0, float(f"{fitted:.0e}"))
    return [{"eps": value} for value in dict.fromkeys(values)]


ACTIVATION_NAMES = {"relu": "ReLU", "gelu": "GELU (erf)", "gelu_tanh": "GELU (tanh approximation)",
                    "tanh": "tanh", "sigmoid": "a sigmoid", "silu": "SiLU", "identity": "no activation"}  # fmt: skip


def _fill(value: object) -> str:
    return "no mask at all (valid_lens ignored)" if value == "none" else f"{value:g}"


CATALOGUE: tuple[Mistake, ...] = (
    Mistake(
        "tiled_valid_lens",
        "blks.0.attention",
        "mixed_valid_lens",
        lambda rule, config: (
            f"tiles valid_lens over the heads ({rule['layout']}: d2l 0.12-0.15's layout) where "
            f"{config.semantics.name} repeats each sample's"
        ),
        lambda site: [{"layout": "tiled" if site.config.semantics.valid_lens_over_heads != "tiled" else "interleaved"}],
    ),
    Mistake(
        "layer_norm_eps",
        "blks.0.addnorm1",
        "full_valid_len",
        lambda rule, config: (
            f"computes LayerNorm with eps {rule['eps']:g}; {config.semantics.name}'s eps is "
            f"{config.semantics.layer_norm_eps:g}"
        ),
        _eps_values,
    ),
    Mistake(
        "layer_norm_form",
        "blks.0.addnorm1",
        "full_valid_len",
        lambda rule, config: (
            f"computes LayerNorm as {LAYER_NORM_FORMS[rule['form']]}, eps {rule['eps']:g}, where d2l divides by "
            f"sqrt(var + {config.semantics.layer_norm_eps:g}) with the biased variance"
        ),
        lambda site: [{"form": form, "eps": eps} for form in LAYER_NORM_FORMS for eps in (1e-6, 1e-5, 1e-12)],
    ),
    Mistake(
        "activation",
        "blks.0.ffn",
        "no_valid_lens",
        lambda rule, config: (
            f"uses {ACTIVATION_NAMES[rule['activation']]} where {config.semantics.name} uses "
            f"{ACTIVATION_NAMES[config.semantics.activation]}"
        ),
        lambda site: [{"activation": name} for name in ACTIVATIONS if name != site.config.semantics.activation],
    ),
    Mistake(
        "mask_fill",
        "blks.0.attention",
        "valid_len_zero",
        lambda rule, config: f"fills the masked scores with {_fill(rule['fill'])} where d2l uses -1e6",
        lambda site: [{"fill": fill} for fill in (-math.inf, 0.0, -1e4, -1e9, "none")],
    ),
    Mistake(
        "masked_rows_zero",
        "blks.0.attention",
        "valid_len_zero",
        lambda rule, config: (
            "gives a row whose every key is masked no attention at all (zero weights, as PyTorch's key_padding_mask "
            "does), where d2l's -1e6 makes it attend to every key alike"
        ),
        lambda site: [{"empty": "zero"}],
    ),
    Mistake(
        "additive_mask",
        "blks.0.attention",
        "valid_len_zero",
        lambda rule, config: (
            f"adds {_fill(rule['fill'])} to the masked scores (an additive mask) where d2l puts -1e6 in their place: "
            "a row whose every key is masked then attends as if none were, where d2l's attends to every key alike"
        ),
        lambda site: [{"fill": fill, "additive": True} for fill in (-1e4, -1e6)],
    ),
    Mistake(
        "mask_off_by_one",
        "blks.0.attention",
        "mixed_valid_lens",
        lambda rule, config: (
            "attends to one key past each valid length (the mask compares with <= where d2l's keeps the keys < "
            "valid_len)"
            if rule["mask_shift"] > 0
            else "masks the last key within each valid length too (one key fewer than valid_lens attended to)"
        ),
        lambda site: [{"mask_shift": 1}, {"mask_shift": -1}],
    ),
    Mistake(
        "softmax_axis",
        "blks.0.attention",
        "single_segment",
        lambda rule, config: "normalises the attention weights over the queries where d2l's softmax is over the keys",
        lambda site: [{"softmax_over": "queries"}],
    ),
    Mistake(
        "heads_reshaped",
        "blks.0.attention",
        "single_segment",
        lambda rule, config: (
            {"split": "splits the heads", "merge": "merges the heads", "both": "splits and merges the heads"}[
                rule["reshaped"]
            ]
            + " by a reshape alone (B, T, H) to (B*heads, T, H/heads), where d2l moves the heads' axis before the "
            "positions' (a transpose), so that each head sees every position"
        ),
        lambda site: [] if site.config.num_heads == 1 else [{"reshaped": way} for way in ("both", "split", "merge")],
    ),
    Mistake(
        "mask_from_tokens",
        "blks.0.attention",
        "mixed_valid_lens",
        lambda rule, config: (
            "masks the keys whose token id is 0 (a mask made from the tokens, 0 taken for padding) where d2l masks "
            "the positions past valid_lens"
        ),
        # Told apart from ignoring valid_lens only where some token id is 0.
        lambda site: [{"attend": "tokens"}] if (site.inputs.tokens == 0).any() else [],
    ),
    Mistake(
        "score_scale",
        "blks.0.attention",
        "single_segment",
        lambda rule, config: (
            (
                "does not scale the scores"
                if rule["scale"] == "none"
                else f"divides the scores by sqrt({config.num_hiddens}), the full width"
            )
            + f", where d2l divides by sqrt({config.num_hiddens // config.num_heads}), the width of a head"
        ),  # fmt: skip
        lambda site: [{"scale": "full"}, {"scale": "none"}],
    ),
    Mistake(
        "attention_bias",
        "blks.0.attention",
        "mixed_valid_lens",
        lambda rule, config: (
            "computes W_q, W_k, W_v and W_o "
            + ("with" if rule["bias"] else "without")
            + f" biases, where {config.semantics.name}'s have "
            + ("none" if rule["bias"] else "them")
        ),
        lambda site: [{"bias": not site.config.semantics.attention_bias}],
    ),
    Mistake(
        "transposed_weight",
        "blks.0.attention",
        "mixed_valid_lens",
        lambda rule, config: f"uses {' and '.join(rule['transposed'])} transposed (x W where d2l computes x W^T)",
        lambda site: [
            {"transposed": names} for names in (("W_q",), ("W_k",), ("W_v",), ("W_o",), ("W_q", "W_k", "W_v", "W_o"))
        ],  # fmt: skip
    ),
    Mistake(
        "pre_norm",
        "blks.0.attention",
        "mixed_valid_lens",
        lambda rule, config: (
            "normalises the block's input before the attention (pre-norm), where d2l normalises "
            "after the residual (post-norm)"
        ),
        lambda site: [{"pre_norm": True}],
    ),
    Mistake(
        "sublayer_unwrapped",
        "blks.0.output",
        "mixed_valid_lens",
        lambda rule, config: (
            (
                "returns its sublayer's output with no residual connection and no LayerNorm around it"
                if rule["sublayer"] == "bare"
                else "normalises its sublayer's output without adding the residual"
            )
            + ", where d2l computes LayerNorm(X + sublayer(X))"
        ),
        lambda site: [{"sublayer": "bare"}, {"sublayer": "no_residual"}],
    ),
    Mistake(
        "segments_ignored",
        "embedding",
        "mixed_valid_lens",
        lambda rule, config: (
            "leaves the segment embedding out of the embedding sum"
            if rule["segments"] == "none"
            else "reads every token's segment as 0 (the segments passed in are never used)"
        ),
        lambda site: [{"segments": "none"}, {"segments": "zero"}],
    ),
    Mistake(
        "positions_offset",
        "embedding",
        "mixed_valid_lens",
        lambda rule, config: f"counts the positions from {rule['offset']}, where d2l counts from 0",
        lambda site: [{"offset": offset} for offset in (1, 2)],
    ),
    Mistake(
        "fixed_positions",
        "embedding",
        "mixed_valid_lens",
        lambda rule, config: (
            f"adds a fixed sinusoidal table for the positions (a buffer, as the Transformer's) where "
            f"{config.semantics.name} learns them (encoder.pos_embedding)"
        ),
        lambda site: (
            [{"positions": "sinusoidal"}]
            if site.config.semantics.positions == "learned" and site.config.num_hiddens % 2 == 0
            else []
        ),
    ),
    Mistake(
        "padded_positions_zero",
        "encoded",
        "mixed_valid_lens",
        lambda rule, config: (
            "returns zeros at the padded positions (as PyTorch's nn.TransformerEncoder does in inference, through "
            "nested tensors), where d2l computes every position"
        ),
        lambda site: [{"padded": "zero"}],
    ),
    Mistake(
        "pooler_position",
        "pooler",
        "batch_one",
        lambda rule, config: "pools the last position where d2l pools <cls>, the first",
        lambda site: [{"position": -1}],
    ),
    Mistake(
        "pooler_activation",
        "pooler",
        "mixed_valid_lens",
        lambda rule, config: (
            f"uses {ACTIVATION_NAMES[rule['pooler_activation']]} after the pooler's dense layer where "
            f"{config.semantics.name} uses tanh"
        ),
        lambda site: [{"pooler_activation": name} for name in ACTIVATIONS if name != "tanh"],
    ),
    # Nothing to compute: a model with dropout on gives two answers to one input (``diagnose``).
    Mistake(
        "dropout_at_inference",
        "blks.0.attention",
        "valid_lens_2d",
        lambda rule, config: f"leaves dropout on at inference: two runs of one input differ by {rule['apart']:.3g}",
    ),
)
MISTAKES = {mistake.name: mistake for mistake in CATALOGUE}

# Found from the model's own weights, not planted (d2l's models make none): a layer built inside ``forward``
# has weights made anew, at random, on every call, none of the model's parameters, so nothing can set them.
LAYERS_IN_FORWARD = Mistake(
    "layers_in_forward",
    "blks.0.attention",
    "mixed_valid_lens",
    lambda rule, config: (
        f"builds layers inside forward, whose weights are made anew at random on every call and are none of its "
        f"parameters, so no weights can be given to them ({rule['made']}): two runs of one input differ by "
        f"{rule['apart']:.3g}"
    ),
)

# Found from the model's own parameters, read before and after a run: a forward that writes to them gives
# two answers to one input, as dropout does, but from what it changed.
PARAMETERS_CHANGED = Mistake(
    "parameters_changed",
    "blks.0.attention",
    "mixed_valid_lens",
    lambda rule, config: (
        f"changes its own parameters when it runs ({rule['changed']}), where d2l's forward only reads them: two "
        f"runs of one input differ by {rule['apart']:.3g}"
    ),
)


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
            reproduced = f" (reproduces your output to {self.error:.1g})" if "apart" not in self.rule else ""
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
    bound = tolerance.atol + tolerance.rtol * float(np.nanmax(np.abs(own), initial=0.0))
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
    loose = FLOAT32.atol + FLOAT32.rtol * float(np.nanmax(np.abs(own), initial=0.0))

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


def tries_at(site: Site) -> Iterator[tuple[Mistake, Rule]]:
    """Every change of the catalogue's that could show at ``site``, with the mistake it is."""
    for mistake in CATALOGUE:
        if mistake.shows_at.rsplit(".", 1)[-1] == site.kind or _also_at(mistake, site):
            for rule in mistake.tries(site):
                yield mistake, rule


def _also_at(mistake: Mistake, site: Site) -> bool:
    """Where else a mistake shows first: a LayerNorm's epsilon and form at any LayerNorm (the block's second,
    the masked LM's, the embedding's: the original BERT's, or a pre-norm block's first), the activation in
    the masked LM's transform too, a sublayer left without its add-and-norm at either of a block's, and a
    pre-norm block at every activation of its own (each reads another value than d2l's block) and where a
    user's model is read: W_q's input, the normalised embedding."""
    elsewhere = {
        "layer_norm_eps": ("output", "mlm", "embedding"),
        "layer_norm_form": ("output", "mlm", "embedding"),
        "activation": ("mlm",),
        "pre_norm": ("embedding", "addnorm1", "ffn", "output", "encoded"),
        "sublayer_unwrapped": ("addnorm1",),
    }
    return site.kind in elsewhere.get(mistake.name, ())


def nondeterminism(first: Mapping[str, np.ndarray | None], second: Mapping[str, np.ndarray | None]) -> float:
    """How far two runs of one input are apart, over every array both recorded: 0 for a model in
    inference mode."""
    apart = 0.0
    for name, value in first.items():
        other = second.get(name)
        if value is not None and other is not None and np.shape(value) == np.shape(other):
            apart = max(apart, _distance(np.asarray(value, np.float64), np.asarray(other, np.float64)))
    return apart
