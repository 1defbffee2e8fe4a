"""The known porting mistakes, one catalogue: each a change to one rule of the oracle, with where it shows
first, which conformance case catches it, and how to say it.

The fault tests plant every entry in every framework's own model (``conformance/test_faults.py``) and
check that the case catches it where the catalogue says; ``diagnosis.diagnose`` tries every entry on a
diverging activation of a user's model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..spec.config import BERTConfig
from .rules import ACTIVATIONS, LAYER_NORM_FORMS, Rule, Site, layer_norm_parts


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
    # Whether a changed rule reproduces it; False for what is found otherwise (two runs, the model's weights).
    reproduced_by_rule: bool = True


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
        reproduced_by_rule=False,
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
    reproduced_by_rule=False,
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
    reproduced_by_rule=False,
)


# Found from the size of a difference, not planted: in a float64 run, a module off d2l's rule by no more than
# float32's rounding, that no change of the catalogue's reproduces, computes some of its work in float32.
FLOAT32_INSIDE = Mistake(
    "float32_inside",
    "blks.0.attention",
    "mixed_valid_lens",
    lambda rule, config: (
        f"computes part of its work in float32 in a float64 run: it is {rule['off']:.1g} from d2l's rule, the size "
        "of float32's rounding (a cast, or a library call that rounds to float32, as jax.nn.dot_product_attention's "
        "softmax does)"
    ),
    reproduced_by_rule=False,
)


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
    user's model is read: W_q's input, the normalised embedding, the pooler (which reads the last block's
    residual sum)."""
    elsewhere = {
        "layer_norm_eps": ("output", "mlm", "embedding"),
        "layer_norm_form": ("output", "mlm", "embedding"),
        "activation": ("mlm",),
        "pre_norm": ("embedding", "addnorm1", "ffn", "output", "encoded", "pooler"),
        "sublayer_unwrapped": ("addnorm1",),
    }
    return site.kind in elsewhere.get(mistake.name, ())
