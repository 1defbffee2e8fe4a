"""The oracle's rules at one site of a user's model, open to the changes the catalogue of known mistakes
makes (``mistakes``): each activation recomputed from the module's own recorded input, d2l's way or with
one rule changed (a LayerNorm's epsilon or form, the activation, the mask's fill, put in place or added,
the score's scale, the lengths' layout over the heads, the biases, a transposed weight, pre-norm, the
embedding's segments and positions, the pooler's position and activation, zeros at padded positions)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import oracle
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.schema import nsp_layers
from ..spec.semantics import sinusoidal_positions

# Changes to the oracle's rules at one site, by keyword of ``compute``.
Rule = dict[str, Any]


@dataclass(frozen=True)
class Site:
    """One activation of a user's model on one case, with what the oracle's rule for it needs: the
    canonical float64 weights the model holds, the inputs, and everything the model recorded (its
    activations, and its outputs as ``encoded``, ``mlm`` and ``nsp``)."""

    config: BERTConfig
    weights: dict[str, np.ndarray]
    inputs: ModelInputs
    activation: str  # "embedding", "blks.0.attention", "pooler", "mlm", "nsp", ...
    recorded: Mapping[str, np.ndarray | None]

    @property
    def kind(self) -> str:
        """The rule the activation follows: the block's part ("attention", "addnorm1", "ffn", "output")
        for a block's activation, else its own name."""
        return self.activation.rsplit(".", 1)[-1] if self.activation.startswith("blks.") else self.activation

    @property
    def block(self) -> str:
        return f"encoder.blks.{self.activation.split('.')[1]}"

    def own(self, name: str) -> np.ndarray:
        """What the user's model recorded at ``name`` (``KeyError``: not recorded, so nothing to try)."""
        value = self.recorded.get(name)
        if value is None:
            raise KeyError(name)
        return np.asarray(value, dtype=np.float64)

    @property
    def precision(self) -> np.dtype:
        """The floating dtype the user's model computed this activation in (float64 where it is not known)."""
        value = self.recorded.get(self.activation)
        dtype = np.asarray(value).dtype if value is not None else np.dtype(np.float64)
        return dtype if np.issubdtype(dtype, np.floating) else np.dtype(np.float64)

    def encoding(self) -> np.ndarray:
        """The encoding the heads read: the last block's output where it was recorded (the run whose
        activations these are), else the encoding the model returned."""
        last = f"blks.{self.config.num_blks - 1}.output"
        return self.own(last if self.recorded.get(last) is not None else "encoded")

    def block_input(self) -> np.ndarray:
        index = int(self.activation.split(".")[1])
        return self.own("embedding" if index == 0 else f"blks.{index - 1}.output")


def layer_norm_parts(site: Site) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The input of the LayerNorm at ``site`` (the residual sum) and its gamma and beta."""
    base = site.activation.rsplit(".", 1)[0]  # "blks.0"
    if site.kind == "addnorm1":
        total, prefix = site.block_input() + site.own(f"{base}.attention"), f"{site.block}.addnorm1.ln"
    elif site.kind == "output":
        total, prefix = site.own(f"{base}.addnorm1") + site.own(f"{base}.ffn"), f"{site.block}.addnorm2.ln"
    else:
        raise KeyError(site.activation)
    return total, site.weights[f"{prefix}.weight"], site.weights[f"{prefix}.bias"]


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": oracle.relu,
    "gelu": lambda X: oracle.activation(X, "gelu"),
    "gelu_tanh": lambda X: oracle.activation(X, "gelu_tanh"),
    "tanh": np.tanh,
    "sigmoid": lambda X: 1 / (1 + np.exp(-X)),
    "silu": lambda X: X / (1 + np.exp(-X)),
    "identity": lambda X: X,
}
# Ways ports write LayerNorm that are not d2l's (nor torch's or Gluon's): the unbiased variance, or eps
# added to the standard deviation (as the Annotated Transformer's does, with torch.std's unbiased one).
LAYER_NORM_FORMS = {
    "unbiased": "(x - mean) / sqrt(var + eps) with the unbiased variance",
    "std_eps": "(x - mean) / (std + eps), eps added to the standard deviation",
    "unbiased_std_eps": "(x - mean) / (std + eps) with the unbiased standard deviation",
}


def layer_norm(X: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, form: str = "d2l") -> np.ndarray:
    """LayerNorm over the last axis as d2l computes it, or in one of ``LAYER_NORM_FORMS``."""
    centred = X - X.mean(axis=-1, keepdims=True)
    var = X.var(axis=-1, keepdims=True, ddof=1 if form.startswith("unbiased") else 0)
    scale = np.sqrt(var) + eps if form.endswith("std_eps") else np.sqrt(var + eps)
    return centred / scale * gamma + beta


def compute(site: Site, **rule: Any) -> np.ndarray:
    """The activation at ``site`` as the oracle computes it from the user's own recorded input, with the
    rule's changes (none: d2l's rule)."""
    config, weights, semantics = site.config, site.weights, site.config.semantics
    eps = rule.get("eps", semantics.layer_norm_eps)
    kind = site.kind
    if kind == "embedding":
        X = _embedding(
            site,
            rule.get("segments", "given"),
            rule.get("offset", 0),
            rule.get("positions"),
            eps,
            rule.get("form", "d2l"),
        )
        if rule.get("pre_norm"):  # what a pre-norm block's W_q reads: the normalised input
            X = _normalised(X, weights, "encoder.blks.0.addnorm1.ln", eps, rule.get("form", "d2l"))
        return X
    # A pre-norm block (``pre_norm``): its first LayerNorm normalises the block's input X, which the attention
    # reads; its second the residual sum X + attention, which the FFN reads; the block's output is that sum
    # plus the FFN's. Each LayerNorm is held to what the other reads, so that a LayerNorm is not taken for
    # pre-norm only because it normalises what it reads.
    pre_norm, part = rule.get("pre_norm"), site.activation.rsplit(".", 1)[0]
    if kind == "attention":
        X = site.own(f"{part}.addnorm1") if pre_norm else site.block_input()
        return _attention(site, X, **{k: v for k, v in rule.items() if k in ATTENTION_RULES})
    if kind in ("addnorm1", "output"):
        sublayer = site.own(f"{part}.{'attention' if kind == 'addnorm1' else 'ffn'}")
        if rule.get("sublayer") == "bare":  # no residual and no LayerNorm around the sublayer
            return sublayer
        if rule.get("sublayer") == "no_residual":
            prefix = f"{site.block}.addnorm{1 if kind == 'addnorm1' else 2}.ln"
            return _normalised(sublayer, weights, prefix, eps, rule.get("form", "d2l"))
        if pre_norm:
            attention = site.own(f"{part}.attention")
            if kind == "addnorm1":
                read, prefix = site.own(f"{part}.ln2_input") - attention, f"{site.block}.addnorm1.ln"
            else:
                read, prefix = site.own(f"{part}.ln1_input") + attention, f"{site.block}.addnorm2.ln"
            return _normalised(read, weights, prefix, eps, rule.get("form", "d2l"))
        total, gamma, beta = layer_norm_parts(site)
        return layer_norm(total, gamma, beta, eps, rule.get("form", "d2l"))
    if kind == "ffn":
        Y = site.own(f"{part}.output" if pre_norm else f"{part}.addnorm1")
        act = ACTIVATIONS[rule.get("activation", semantics.activation)]
        return oracle.dense(
            act(oracle.dense(Y, weights, f"{site.block}.ffn.dense1")), weights, f"{site.block}.ffn.dense2"
        )
    if kind == "mlm":
        # An output, computed from the encoding the model returned (its own run's, where a framework's fast
        # path made the outputs apart from the observed run).
        encoded, positions = site.own("encoded"), site.inputs.pred_positions
        if positions is None:
            raise KeyError(site.activation)
        gathered = encoded[np.arange(encoded.shape[0])[:, None], positions]
        act = ACTIVATIONS[rule.get("activation", semantics.activation)]
        transformed = act(oracle.dense(gathered, weights, "mlm.mlp.0"))
        hidden = layer_norm(
            transformed, weights["mlm.mlp.2.weight"], weights["mlm.mlp.2.bias"], eps, rule.get("form", "d2l")
        )
        if semantics.mlm_decoder == "own":
            return oracle.dense(hidden, weights, "mlm.mlp.3")
        return hidden @ weights["encoder.token_embedding.weight"].T + weights["mlm.mlp.3.bias"]
    last = f"blks.{config.num_blks - 1}"
    # A pre-norm block's output is its residual sum, which no module returns: the FFN's, added to what its
    # second LayerNorm read.
    block_output = site.own(f"{last}.ln2_input") + site.own(f"{last}.ffn") if pre_norm else None
    if kind == "pooler":
        encoded = site.encoding() if block_output is None else block_output
        act = ACTIVATIONS[rule.get("pooler_activation", "tanh")]
        return act(oracle.dense(encoded[:, rule.get("position", 0), :], weights, nsp_layers(config)[0]))
    if kind == "encoded":  # the last block's output, as the encoder returns it
        X = site.own(f"{last}.output") if block_output is None else block_output
        lens = site.inputs.valid_lens
        if rule.get("padded") == "zero" and lens is not None and lens.ndim == 1:
            X = np.where(np.arange(X.shape[1])[None, :, None] < lens[:, None, None], X, 0.0)
        return X
    raise KeyError(site.activation)


def _normalised(X: np.ndarray, weights: Mapping[str, np.ndarray], prefix: str, eps: float, form: str) -> np.ndarray:
    return layer_norm(X, weights[f"{prefix}.weight"], weights[f"{prefix}.bias"], eps, form)


def _attention(
    site: Site,
    X: np.ndarray,
    fill: float | str = oracle.MASK_VALUE,
    additive: bool = False,
    mask_shift: int = 0,
    softmax_over: str = "keys",
    reshaped: str = "",
    scale: str = "head",
    layout: str | None = None,
    bias: bool | None = None,
    transposed: tuple[str, ...] = (),
    empty: str = "uniform",
    attend: str = "valid_lens",
) -> np.ndarray:
    """d2l's multi-head attention (``oracle.multi_head_attention``) with its rules open to change; ``additive``:
    ``fill`` added to the masked scores rather than put in their place (softmax does not change when a whole
    row is shifted, so a row whose every key is masked attends as if none were), the sum rounded to the
    precision the model computed in (in float32, -1e6 keeps a score to 1/16); ``mask_shift``: each length
    moved by that many keys (1: ``<=`` written for ``<``); ``softmax_over``: the axis the weights sum to 1
    over, "keys" (d2l's) or "queries"; ``reshaped``: where the heads are split ("split"), merged ("merge") or
    both by a reshape alone, without the transpose that keeps each position's features together; ``empty``:
    what a row whose every key is masked attends to, "uniform" (d2l's -1e6) or "zero" (none at all);
    ``attend``: the keys attended to, those within "valid_lens" or those whose token id is not 0 ("tokens")."""
    config, weights, semantics = site.config, site.weights, site.config.semantics
    prefix, heads = f"{site.block}.attention", config.num_heads
    biased = semantics.attention_bias if bias is None else bias

    def project(name: str, Z: np.ndarray) -> np.ndarray:
        W = weights[f"{prefix}.{name}.weight"]
        Y = Z @ (W if name in transposed else W.T)
        return Y + weights[f"{prefix}.{name}.bias"] if biased and f"{prefix}.{name}.bias" in weights else Y

    split = _reshaped_split if reshaped in ("split", "both") else oracle.split_heads
    merge = _reshaped_merge if reshaped in ("merge", "both") else oracle.merge_heads
    queries, keys, values = (split(project(name, X), heads) for name in ("W_q", "W_k", "W_v"))
    divisor = {"head": math.sqrt(queries.shape[-1]), "full": math.sqrt(config.num_hiddens), "none": 1.0}[scale]
    scores = queries @ keys.transpose(0, 2, 1) / divisor
    valid_lens = site.inputs.valid_lens
    keep = None  # where a key may be attended to; None: everywhere
    if attend == "tokens":  # whatever valid_lens says; each sample's row repeated for its heads
        keep = np.repeat(site.inputs.tokens != 0, heads, axis=0)[:, None, :]
        scores = np.where(keep, scores, oracle.MASK_VALUE if fill == "none" else fill)
    elif valid_lens is not None and fill != "none":
        lens = oracle.repeat_over_heads(valid_lens, heads, layout or semantics.valid_lens_over_heads)
        lens = lens[:, None] if lens.ndim == 1 else lens
        keep = np.arange(scores.shape[-1])[None, None, :] < lens[:, :, None] + mask_shift
        if additive:
            masked = scores.astype(site.precision) + np.where(keep, 0.0, fill).astype(site.precision)
            scores = masked.astype(np.float64)
        else:
            scores = np.where(keep, scores, fill)
    with np.errstate(invalid="ignore"):  # -inf everywhere in a row is NaN, as in the frameworks
        attention = (
            oracle.softmax(scores) if softmax_over == "keys" else oracle.softmax(scores.swapaxes(1, 2)).swapaxes(1, 2)
        )
    if empty == "zero" and keep is not None:
        attention = np.where(keep.any(axis=-1, keepdims=True), attention, 0.0)
    return project("W_o", merge(attention @ values, heads))


# The changes ``_attention`` takes, each a keyword of a rule.
ATTENTION_RULES = tuple(inspect.signature(_attention).parameters)[2:]


def _reshaped_split(X: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, T, H) -> (B*h, T, H/h) by a reshape alone (``view(B, h, T, -1)``): a head's rows are cut from the
    positions' features in memory order, not its own slice of every position's."""
    B, T, H = X.shape
    return X.reshape(B * num_heads, T, H // num_heads)


def _reshaped_merge(X: np.ndarray, num_heads: int) -> np.ndarray:
    """(B*h, T, H/h) -> (B, T, H) by a reshape alone, the inverse of ``_reshaped_split``."""
    BH, T, D = X.shape
    return X.reshape(BH // num_heads, T, num_heads * D)


def _embedding(site: Site, segments: str, offset: int, positions_kind: str | None, eps: float, form: str) -> np.ndarray:
    """The embedding sum with the segments "given", all "zero" or "none" at all, its positions counted
    from ``offset`` (past the table's end they wrap round, as a port's would that indexes modulo its length)
    from a "learned" or "sinusoidal" table (None: the semantics' own), normalised where the semantics
    normalise it, with LayerNorm's ``eps`` and ``form``."""
    config, weights, semantics = site.config, site.weights, site.config.semantics
    tokens, segment_ids = site.inputs.tokens, site.inputs.segments
    positions = (np.arange(tokens.shape[1]) + offset) % config.max_len
    X = weights["encoder.token_embedding.weight"][tokens]
    if segments != "none":
        X = X + weights["encoder.segment_embedding.weight"][segment_ids if segments == "given" else 0 * segment_ids]
    if (positions_kind or semantics.positions) == "learned":
        X = X + weights["encoder.pos_embedding"][:, positions, :]
    else:
        X = X + sinusoidal_positions(config.max_len, config.num_hiddens)[positions]
    if semantics.embedding_norm:
        X = layer_norm(X, weights["encoder.embedding_norm.weight"], weights["encoder.embedding_norm.bias"], eps, form)
    return X
