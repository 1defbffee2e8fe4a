"""The gradient oracle: d2l's BERT differentiated by hand, in float64 NumPy.

Each function is the derivative of the rule of the same name in ``oracle.py``: given what that rule was
given and the gradient of its output, it returns the gradient of its input and adds its parameters'
gradients to ``grads``. ``gradients`` walks the model backwards, and ``pretraining_loss_gradients`` starts
from d2l's pretraining loss. Nothing here depends on a framework's autograd, so gradients have an oracle
of their own, as the forward does; the tests check it against finite differences of ``oracle.forward``
and against every framework's autograd.
"""

from __future__ import annotations

import math

import numpy as np

from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.loss import LossValues
from ..spec.schema import nsp_layers
from ..spec.semantics import sinusoidal_positions
from .oracle import (
    activation,
    dense,
    erf,
    forward,
    layer_norm,
    masked_softmax,
    merge_heads,
    multi_head_attention,
    position_wise_ffn,
    pretraining_loss,
    repeat_over_heads,
    softmax,
    split_heads,
)

Grads = dict[str, np.ndarray]


def dense_backward(
    X: np.ndarray, weights: dict, prefix: str, dY: np.ndarray, grads: Grads, bias: bool = True
) -> np.ndarray:
    """y = x W^T + b: dW = dY^T X and db = sum dY over every row; dX = dY W."""
    X2, dY2 = X.reshape(-1, X.shape[-1]), dY.reshape(-1, dY.shape[-1])
    grads[f"{prefix}.weight"] += dY2.T @ X2
    if bias:
        grads[f"{prefix}.bias"] += dY2.sum(axis=0)
    return (dY2 @ weights[f"{prefix}.weight"]).reshape(X.shape)


def activation_backward(X: np.ndarray, kind: str, dY: np.ndarray) -> np.ndarray:
    """ReLU passes the gradient where x > 0; GELU x Phi(x) has Phi(x) + x phi(x); its tanh form the
    derivative of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    if kind == "relu":
        return dY * (X > 0)
    if kind == "gelu":
        cdf = (0.5 * (1.0 + erf(X / math.sqrt(2.0)))).astype(X.dtype)
        pdf = np.exp(-0.5 * X**2) / math.sqrt(2.0 * math.pi)
        return dY * (cdf + X * pdf)
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (X + 0.044715 * X**3))
    return dY * (0.5 * (1.0 + t) + 0.5 * X * (1.0 - t**2) * c * (1.0 + 3 * 0.044715 * X**2))


def layer_norm_backward(
    X: np.ndarray, weights: dict, prefix: str, eps: float, dY: np.ndarray, grads: Grads
) -> np.ndarray:
    """y = x_hat gamma + beta, x_hat = (x - mean) / sqrt(var + eps) over the last axis:
    dgamma = sum dY x_hat, dbeta = sum dY, dX = (g - mean(g) - x_hat mean(g x_hat)) / sqrt(var + eps)
    with g = dY gamma."""
    std = np.sqrt(X.var(axis=-1, keepdims=True) + eps)
    x_hat = (X - X.mean(axis=-1, keepdims=True)) / std
    grads[f"{prefix}.weight"] += (dY * x_hat).reshape(-1, X.shape[-1]).sum(axis=0)
    grads[f"{prefix}.bias"] += dY.reshape(-1, X.shape[-1]).sum(axis=0)
    g = dY * weights[f"{prefix}.weight"]
    return (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / std


def masked_softmax_backward(scores: np.ndarray, valid_lens: np.ndarray | None, dP: np.ndarray) -> np.ndarray:
    """P = softmax(masked scores): dS = P (dP - sum(dP P)) where a key is kept; a masked score was replaced
    by the constant -1e6, so it gets none."""
    P = masked_softmax(scores, valid_lens)
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    if valid_lens is None:
        return dS
    lens = valid_lens[:, None] if valid_lens.ndim == 1 else valid_lens
    keep = np.arange(scores.shape[-1])[None, None, :] < lens[:, :, None]
    return np.where(keep, dS, 0.0)


def multi_head_attention_backward(
    X: np.ndarray,
    valid_lens: np.ndarray | None,
    weights: dict,
    prefix: str,
    num_heads: int,
    config: BERTConfig,
    dOut: np.ndarray,
    grads: Grads,
) -> np.ndarray:
    """Back through W_o, the weighted sum of values, the masked softmax, the 1/sqrt(head width) scaled
    scores, and the three projections, whose input gradients add up. Heads are split and merged by
    reshaping, so each one's backward is the other."""
    bias = config.semantics.attention_bias
    queries = split_heads(dense(X, weights, f"{prefix}.W_q", bias), num_heads)
    keys = split_heads(dense(X, weights, f"{prefix}.W_k", bias), num_heads)
    values = split_heads(dense(X, weights, f"{prefix}.W_v", bias), num_heads)
    scale = 1.0 / math.sqrt(queries.shape[-1])
    scores = queries @ keys.transpose(0, 2, 1) * scale
    lens = (
        None if valid_lens is None else repeat_over_heads(valid_lens, num_heads, config.semantics.valid_lens_over_heads)
    )
    attention = masked_softmax(scores, lens)
    merged = merge_heads(attention @ values, num_heads)
    dAV = split_heads(dense_backward(merged, weights, f"{prefix}.W_o", dOut, grads, bias), num_heads)
    dValues = attention.transpose(0, 2, 1) @ dAV
    dScores = masked_softmax_backward(scores, lens, dAV @ values.transpose(0, 2, 1)) * scale
    dQueries, dKeys = dScores @ keys, dScores.transpose(0, 2, 1) @ queries
    dX = dense_backward(X, weights, f"{prefix}.W_q", merge_heads(dQueries, num_heads), grads, bias)
    dX += dense_backward(X, weights, f"{prefix}.W_k", merge_heads(dKeys, num_heads), grads, bias)
    dX += dense_backward(X, weights, f"{prefix}.W_v", merge_heads(dValues, num_heads), grads, bias)
    return dX


def position_wise_ffn_backward(
    X: np.ndarray, weights: dict, prefix: str, kind: str, dY: np.ndarray, grads: Grads
) -> np.ndarray:
    """Back through Dense(F -> H), the activation and Dense(H -> F)."""
    hidden = dense(X, weights, f"{prefix}.dense1")
    dActivated = dense_backward(activation(hidden, kind), weights, f"{prefix}.dense2", dY, grads)
    return dense_backward(X, weights, f"{prefix}.dense1", activation_backward(hidden, kind, dActivated), grads)


def mask_lm_backward(
    config: BERTConfig,
    weights: dict,
    encoded: np.ndarray,
    pred_positions: np.ndarray,
    eps: float,
    dMLM: np.ndarray,
    grads: Grads,
) -> np.ndarray:
    """Back through the decoder (its own Dense, or the token embedding tied to it), the LayerNorm, the
    activation and Dense(H), to the gathered rows, whose gradients add up where a position repeats."""
    kind = config.semantics.activation
    rows = np.arange(encoded.shape[0])[:, None]
    gathered = encoded[rows, pred_positions]
    pre = dense(gathered, weights, "mlm.mlp.0")
    transformed = activation(pre, kind)
    hidden = layer_norm(transformed, weights, "mlm.mlp.2", eps)
    if config.semantics.mlm_decoder == "own":
        dHidden = dense_backward(hidden, weights, "mlm.mlp.3", dMLM, grads)
    else:  # tied: logits = hidden E^T + bias, so the token embedding learns from the decoder too
        flat_dMLM, flat_hidden = dMLM.reshape(-1, dMLM.shape[-1]), hidden.reshape(-1, hidden.shape[-1])
        grads["encoder.token_embedding.weight"] += flat_dMLM.T @ flat_hidden
        grads["mlm.mlp.3.bias"] += flat_dMLM.sum(axis=0)
        dHidden = dMLM @ weights["encoder.token_embedding.weight"]
    dTransformed = layer_norm_backward(transformed, weights, "mlm.mlp.2", eps, dHidden, grads)
    dGathered = dense_backward(gathered, weights, "mlm.mlp.0", activation_backward(pre, kind, dTransformed), grads)
    dEncoded = np.zeros_like(encoded)
    np.add.at(dEncoded, (np.broadcast_to(rows, pred_positions.shape), pred_positions), dGathered)
    return dEncoded


def pooler_backward(
    config: BERTConfig,
    weights: dict,
    encoded: np.ndarray,
    dNSP: np.ndarray | None,
    grads: Grads,
    record: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Back through the NSP classifier and tanh(Dense(H)) on <cls>: only position 0 gets a gradient."""
    pooler, classifier = nsp_layers(config)
    pooled = np.tanh(dense(encoded[:, 0, :], weights, pooler))
    dPooled = np.zeros_like(pooled) if dNSP is None else dense_backward(pooled, weights, classifier, dNSP, grads)
    if record is not None:
        record["pooler"] = dPooled
    dEncoded = np.zeros_like(encoded)
    dEncoded[:, 0, :] = dense_backward(encoded[:, 0, :], weights, pooler, dPooled * (1.0 - pooled**2), grads)
    return dEncoded


def gradients(
    config: BERTConfig,
    weights: dict,
    inputs: ModelInputs,
    dEncoded: np.ndarray | None,
    dMLM: np.ndarray | None = None,
    dNSP: np.ndarray | None = None,
    layer_norm_eps: float | None = None,
    record: dict[str, np.ndarray] | None = None,
) -> Grads:
    """The gradient of sum(dEncoded * encoded) + sum(dMLM * mlm) + sum(dNSP * nsp) for every canonical
    parameter (zeros for one it does not reach), at ``oracle.forward``'s outputs on checked ``inputs``;
    with ``record``, the gradient of each named activation (``intermediate_names``) goes into it too."""
    tokens, segments, valid_lens, pred_positions = inputs
    semantics = config.semantics
    eps = semantics.layer_norm_eps if layer_norm_eps is None else layer_norm_eps
    grads = {name: np.zeros_like(array, dtype=np.float64) for name, array in weights.items()}
    # The forward again, keeping what each block's backward needs (the rules' own functions).
    T = tokens.shape[1]
    summed = weights["encoder.token_embedding.weight"][tokens] + weights["encoder.segment_embedding.weight"][segments]
    if semantics.positions == "learned":
        summed = summed + weights["encoder.pos_embedding"][:, :T, :]
    else:
        summed = summed + sinusoidal_positions(config.max_len, config.num_hiddens)[:T]
    X = layer_norm(summed, weights, "encoder.embedding_norm", eps) if semantics.embedding_norm else summed
    blocks = []  # per block: its input, attention, first add-and-norm and FFN outputs
    for i in range(config.num_blks):
        blk = f"encoder.blks.{i}"
        attention = multi_head_attention(X, valid_lens, weights, f"{blk}.attention", config.num_heads, semantics)
        Y = layer_norm(X + attention, weights, f"{blk}.addnorm1.ln", eps)
        ffn = position_wise_ffn(Y, weights, f"{blk}.ffn", semantics.activation)
        blocks.append((X, attention, Y, ffn))
        X = layer_norm(Y + ffn, weights, f"{blk}.addnorm2.ln", eps)
    encoded = X
    # Backwards: the heads, the blocks last to first, the embedding.
    dX = np.zeros_like(encoded) if dEncoded is None else np.array(dEncoded, dtype=np.float64)
    if dMLM is not None and pred_positions is not None and "mlm" in config.heads:
        dX += mask_lm_backward(config, weights, encoded, pred_positions, eps, dMLM, grads)
    if "pooler" in config.heads:
        dX += pooler_backward(config, weights, encoded, dNSP if "nsp" in config.heads else None, grads, record)
    kept = record if record is not None else {}
    for i in reversed(range(config.num_blks)):
        blk = f"encoder.blks.{i}"
        X, attention, Y, ffn = blocks[i]
        kept[f"blks.{i}.output"] = dX
        dSum2 = layer_norm_backward(Y + ffn, weights, f"{blk}.addnorm2.ln", eps, dX, grads)
        kept[f"blks.{i}.ffn"] = dSum2
        dY = dSum2 + position_wise_ffn_backward(Y, weights, f"{blk}.ffn", semantics.activation, dSum2, grads)
        kept[f"blks.{i}.addnorm1"] = dY
        dSum1 = layer_norm_backward(X + attention, weights, f"{blk}.addnorm1.ln", eps, dY, grads)
        kept[f"blks.{i}.attention"] = dSum1
        dX = dSum1 + multi_head_attention_backward(
            X, valid_lens, weights, f"{blk}.attention", config.num_heads, config, dSum1, grads
        )
    kept["embedding"] = dX
    if semantics.embedding_norm:
        dX = layer_norm_backward(summed, weights, "encoder.embedding_norm", eps, dX, grads)
    np.add.at(grads["encoder.token_embedding.weight"], tokens, dX)
    np.add.at(grads["encoder.segment_embedding.weight"], segments, dX)
    if semantics.positions == "learned":
        grads["encoder.pos_embedding"][0, :T] += dX.sum(axis=0)
    return grads


def cross_entropy_backward(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per row, softmax(logits) minus the one-hot label."""
    dLogits = softmax(logits)
    dLogits[np.arange(len(labels)), labels] -= 1.0
    return dLogits


def pretraining_loss_gradients(
    config: BERTConfig,
    weights: dict,
    batch: dict[str, np.ndarray],
    mlm_normalization: str = "real_slots",
    layer_norm_eps: float | None = None,
) -> tuple[LossValues, Grads]:
    """``oracle.pretraining_loss`` and its gradient for every canonical parameter: masked-LM cross-entropy
    weighted by ``mlm_weights`` over their sum (+ 1e-8, as d2l divides), plus next-sentence cross-entropy
    averaged over the batch. With ``all_slots`` every slot counts alike, d2l's PyTorch code's mean.
    ``layer_norm_eps`` as for ``oracle.forward``."""
    losses = pretraining_loss(config, weights, batch, mlm_normalization, layer_norm_eps)
    inputs = ModelInputs(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    out = forward(config, weights, inputs, layer_norm_eps=layer_norm_eps)
    assert out.mlm is not None and out.nsp is not None  # pretraining_loss refused a model without them
    dMLM, dNSP = loss_cotangents(config, out.mlm, out.nsp, batch, mlm_normalization)
    return losses, gradients(config, weights, inputs, None, dMLM, dNSP, layer_norm_eps)


def loss_cotangents(
    config: BERTConfig, mlm: np.ndarray, nsp: np.ndarray, batch: dict[str, np.ndarray], mlm_normalization: str
) -> tuple[np.ndarray, np.ndarray]:
    """The pretraining loss's gradient with respect to the MLM and NSP outputs ``mlm`` and ``nsp``."""
    slot_weights = batch["mlm_weights"].reshape(-1).astype(np.float64)
    denominator = slot_weights.sum() + 1e-8
    per_slot = slot_weights / denominator
    if mlm_normalization == "all_slots":
        per_slot = np.full_like(slot_weights, slot_weights.sum() / denominator / slot_weights.size)
    dMLM = cross_entropy_backward(mlm.reshape(-1, config.vocab_size), batch["mlm_labels"].reshape(-1))
    dMLM = (dMLM * per_slot[:, None]).reshape(mlm.shape)
    dNSP = cross_entropy_backward(nsp, batch["nsp_labels"]) / len(batch["nsp_labels"])
    return dMLM, dNSP
