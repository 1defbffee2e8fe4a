"""The NumPy oracle: d2l's BERT written as an executable specification, in float64 by default.

Read it top to bottom: each function is one rule of docs/design.md ("What the model computes"), and the
comments cite the rule. Where d2l's generations differ, each switch of ``config.semantics`` is one visible branch, with
the release it reproduces. Every other backend is compared against this code, so it favours plainness
over speed. Weights are the canonical dict; a dense layer named ``p`` uses ``p.weight`` (out, in) and
``p.bias``.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import numpy as np

from ..errors import CannotRunHere, UsageError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.loss import MLM_NORMALIZATIONS, LossValues
from ..spec.schema import nsp_layers
from ..spec.semantics import Semantics, sinusoidal_positions
from .contract import BackendModel, BERTOutput, parse_device, read_only, shareable, stream_weights

NAME = "numpy"

MASK_VALUE = -1e6  # d2l masks scores with -1e6, not -inf: a row with no valid key becomes uniform
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm and gluon.nn.LayerNorm default


def kernel_eps(eps: float) -> float:
    """The LayerNorm epsilon this backend really computes with when asked for ``eps``: exactly it."""
    return eps


def dense(X: np.ndarray, weights: dict, prefix: str, bias: bool = True) -> np.ndarray:
    """y = x W^T + b over the last axis, with W stored (out, in) as in torch.nn.Linear and gluon.nn.Dense.

    Every row of every batch item goes through one matrix product (X flattened to 2-D), as the
    frameworks do: one BLAS call instead of one per batch item, 1.4x faster on the chapter's shape."""
    Y = (X.reshape(-1, X.shape[-1]) @ weights[f"{prefix}.weight"].T).reshape(*X.shape[:-1], -1)
    return Y + weights[f"{prefix}.bias"] if bias else Y


def relu(X: np.ndarray) -> np.ndarray:
    return np.maximum(X, 0)


erf = np.frompyfunc(math.erf, 1, 1)  # NumPy has no erf; math.erf is correctly rounded in float64


def activation(X: np.ndarray, kind: str) -> np.ndarray:
    """The FFN's and the MLM transform's nonlinearity (``semantics.activation``)."""
    if kind == "relu":  # d2l
        return relu(X)
    if kind == "gelu":  # original BERT: x * Phi(x), Phi the standard normal CDF, in its exact erf form
        return (0.5 * X * (1.0 + erf(X / math.sqrt(2.0)))).astype(X.dtype)
    # "gelu_tanh": the tanh approximation some BERT checkpoints were trained with
    return 0.5 * X * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (X + 0.044715 * X**3)))


def layer_norm(X: np.ndarray, weights: dict, prefix: str, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """Normalise over the last axis with the biased variance, then scale by gamma and shift by beta."""
    mean = X.mean(axis=-1, keepdims=True)
    var = X.var(axis=-1, keepdims=True)
    return (X - mean) / np.sqrt(var + eps) * weights[f"{prefix}.weight"] + weights[f"{prefix}.bias"]


def softmax(X: np.ndarray) -> np.ndarray:
    exp = np.exp(X - X.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def masked_softmax(scores: np.ndarray, valid_lens: np.ndarray | None) -> np.ndarray:
    """Softmax over keys, where key positions >= valid_len get the score -1e6 first.

    scores: (N, T_q, T_k). valid_lens: None (no mask), (N,) (one length for every query row of item n)
    or (N, T_q) (a length per query row).
    """
    if valid_lens is None:
        return softmax(scores)
    lens = valid_lens[:, None] if valid_lens.ndim == 1 else valid_lens  # (N, T_q) either way
    key_positions = np.arange(scores.shape[-1])
    keep = key_positions[None, None, :] < lens[:, :, None]
    return softmax(np.where(keep, scores, scores.dtype.type(MASK_VALUE)))


def split_heads(X: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, T, H) -> (B, T, h, H/h) -> (B, h, T, H/h) -> (B*h, T, H/h): row b*h + j is batch b, head j."""
    B, T, H = X.shape
    return X.reshape(B, T, num_heads, H // num_heads).transpose(0, 2, 1, 3).reshape(B * num_heads, T, H // num_heads)


def merge_heads(X: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of ``split_heads``: (B*h, T, H/h) -> (B, T, H)."""
    BH, T, D = X.shape
    return X.reshape(BH // num_heads, num_heads, T, D).transpose(0, 2, 1, 3).reshape(BH // num_heads, T, num_heads * D)


def repeat_over_heads(valid_lens: np.ndarray, num_heads: int, layout: str = "interleaved") -> np.ndarray:
    """valid_lens for each row of ``split_heads``' output, (B, ...) -> (B*h, ...)."""
    if layout == "interleaved":  # d2l >= 0.16: (b0, b0, ..., b1, b1, ...), row b*h + j gets sample b's
        return np.repeat(valid_lens, num_heads, axis=0)
    # "tiled", d2l <= 0.15 (np.tile): (b0, b1, ..., b0, b1, ...), so row b*h + j, head j of sample b,
    # gets the lengths of sample (b*h + j) mod B. d2l's bug, reproduced: it is what those releases computed.
    return np.tile(valid_lens, (num_heads,) + (1,) * (valid_lens.ndim - 1))


def multi_head_attention(
    X: np.ndarray, valid_lens: np.ndarray | None, weights: dict, prefix: str, num_heads: int, semantics: Semantics
) -> np.ndarray:
    """Self-attention: W_q/W_k/W_v projections, per-head scaled dot product, then W_o."""
    bias = semantics.attention_bias  # d2l >= 0.12's BERT asks for biases; d2l 0.11's projections have none
    queries = split_heads(dense(X, weights, f"{prefix}.W_q", bias), num_heads)
    keys = split_heads(dense(X, weights, f"{prefix}.W_k", bias), num_heads)
    values = split_heads(dense(X, weights, f"{prefix}.W_v", bias), num_heads)
    head_dim = queries.shape[-1]
    scores = queries @ keys.transpose(0, 2, 1) / math.sqrt(head_dim)  # scale by the per-head width
    if valid_lens is not None:
        valid_lens = repeat_over_heads(valid_lens, num_heads, semantics.valid_lens_over_heads)
    attention = masked_softmax(scores, valid_lens)  # attention dropout: inference applies none
    return dense(merge_heads(attention @ values, num_heads), weights, f"{prefix}.W_o", bias)


def position_wise_ffn(X: np.ndarray, weights: dict, prefix: str, kind: str = "relu") -> np.ndarray:
    """Dense(H -> F) -> ReLU (GELU in original BERT) -> Dense(F -> H), no dropout inside."""
    return dense(activation(dense(X, weights, f"{prefix}.dense1"), kind), weights, f"{prefix}.dense2")


def forward(
    config: BERTConfig,
    weights: dict,
    inputs: ModelInputs,
    record: OrderedDict[str, np.ndarray] | None = None,
    layer_norm_eps: float | None = None,
) -> BERTOutput:
    """The whole model on checked inputs; named activations go into ``record`` when it is given.

    ``layer_norm_eps`` is the semantics' (1e-5 in d2l, 1e-12 in original BERT) unless given: a backend
    whose framework stores it differently (MXNet keeps it as a C float) is compared against the oracle
    run with that framework's value.
    """

    def keep(name: str, value: np.ndarray) -> np.ndarray:
        if record is not None:
            record[name] = value
        return value

    tokens, segments, valid_lens, pred_positions = inputs
    T = tokens.shape[1]
    semantics = config.semantics
    eps = semantics.layer_norm_eps if layer_norm_eps is None else layer_norm_eps
    # Input representation: token + segment + positional embedding; no LayerNorm, no scaling.
    X = weights["encoder.token_embedding.weight"][tokens] + weights["encoder.segment_embedding.weight"][segments]
    if semantics.positions == "learned":  # d2l >= 0.12: a learned (1, max_len, H) parameter
        X = X + weights["encoder.pos_embedding"][:, :T, :]
    else:  # d2l 0.11: the fixed sin/cos table of d2l.PositionalEncoding (its dropout: off at inference)
        X = X + sinusoidal_positions(config.max_len, config.num_hiddens)[:T].astype(X.dtype, copy=False)
    if semantics.embedding_norm:  # original BERT: LayerNorm (then dropout, off here) on the sum; d2l has none
        X = layer_norm(X, weights, "encoder.embedding_norm", eps)
    keep("embedding", X)
    # Post-LayerNorm encoder blocks: Y = LN(X + MHA(X)), out = LN(Y + FFN(Y)); dropout off.
    for i in range(config.num_blks):
        blk = f"encoder.blks.{i}"
        attention = keep(
            f"blks.{i}.attention",
            multi_head_attention(X, valid_lens, weights, f"{blk}.attention", config.num_heads, semantics),
        )
        Y = keep(f"blks.{i}.addnorm1", layer_norm(X + attention, weights, f"{blk}.addnorm1.ln", eps))
        ffn = keep(f"blks.{i}.ffn", position_wise_ffn(Y, weights, f"{blk}.ffn", semantics.activation))
        X = keep(f"blks.{i}.output", layer_norm(Y + ffn, weights, f"{blk}.addnorm2.ln", eps))
    encoded = X
    # MaskLM: gather X[b, pred_positions[b, k]], then Dense(H) -> ReLU (GELU) -> LayerNorm -> Dense(V).
    # Each head is optional (config.heads): a model without one returns None for what it computes.
    mlm = nsp = None
    if pred_positions is not None and "mlm" in config.heads:
        gathered = encoded[np.arange(encoded.shape[0])[:, None], pred_positions]  # (B, P, H)
        transformed = activation(dense(gathered, weights, "mlm.mlp.0"), semantics.activation)
        hidden = layer_norm(transformed, weights, "mlm.mlp.2", eps)
        if semantics.mlm_decoder == "own":  # d2l: a Dense(V) of its own
            mlm = dense(hidden, weights, "mlm.mlp.3")
        else:  # original BERT: the token embedding, transposed, plus the decoder's own bias
            mlm = hidden @ weights["encoder.token_embedding.weight"].T + weights["mlm.mlp.3.bias"]
    # Pooler: Dense(H) -> tanh on the <cls> vector; NSP: Dense(2) on the pooler output. The same in
    # every generation; where the two layers live (semantics.nsp_head) is a matter of names.
    pooler, classifier = nsp_layers(config)
    if "pooler" in config.heads:
        pooled = keep("pooler", np.tanh(dense(encoded[:, 0, :], weights, pooler)))
        if "nsp" in config.heads:
            nsp = dense(pooled, weights, classifier)
    return BERTOutput(encoded, mlm, nsp, record)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-row softmax cross-entropy: logsumexp(logits) - logits[label]."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=-1))
    return log_sum - np.take_along_axis(shifted, labels[:, None], axis=-1)[:, 0]


def pretraining_loss(
    config: BERTConfig,
    weights: dict,
    batch: dict[str, np.ndarray],
    mlm_normalization: str = "real_slots",
    layer_norm_eps: float | None = None,
) -> LossValues:
    """(total, MLM, NSP) loss of a checked pretraining batch (see ``spec.loss.check_batch``).

    MLM cross-entropy is averaged over the real prediction slots (weight 1), NSP cross-entropy over the
    batch. ``mlm_normalization="all_slots"`` reproduces d2l's PyTorch code instead, whose loss had
    already averaged over every slot, padding included, before the weights were applied.
    ``layer_norm_eps`` as for ``forward``.
    """
    if mlm_normalization not in MLM_NORMALIZATIONS:
        raise UsageError(f"unknown mlm_normalization {mlm_normalization!r}: expected one of {list(MLM_NORMALIZATIONS)}")
    inputs = ModelInputs(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    out = forward(config, weights, inputs, layer_norm_eps=layer_norm_eps)
    if out.mlm is None or out.nsp is None:
        raise UsageError(f"pretraining needs the MLM and NSP heads; this model has {list(config.heads)}")
    slot_losses = cross_entropy(out.mlm.reshape(-1, config.vocab_size), batch["mlm_labels"].reshape(-1))
    slot_weights = batch["mlm_weights"].reshape(-1).astype(slot_losses.dtype)
    if mlm_normalization == "all_slots":
        slot_losses = np.full_like(slot_losses, slot_losses.mean())
    mlm = (slot_losses * slot_weights).sum() / (slot_weights.sum() + 1e-8)
    nsp = cross_entropy(out.nsp, batch["nsp_labels"]).mean()
    return LossValues(float(mlm + nsp), float(mlm), float(nsp))


class NumpyBERT(BackendModel):
    """The oracle behind the common interface. CPU only; float64 unless asked otherwise."""

    backend = NAME

    def __init__(
        self, config: BERTConfig, weights: dict[str, np.ndarray], dtype: str, layer_norm_eps: float | None
    ) -> None:
        super().__init__(config, dtype, parse_device("cpu"))
        self.weights = weights
        self.layer_norm_eps = layer_norm_eps

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        record: OrderedDict[str, np.ndarray] | None = OrderedDict() if intermediates else None
        return forward(self.config, self.weights, inputs, record, self.layer_norm_eps)

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        return {name: read_only(array) if share else array.copy() for name, array in self.weights.items()}

    def framework_info(self) -> dict[str, object]:
        # NumPy offers no getter for its BLAS's threads; the variables that set them tell, if set.
        threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        return {"framework": f"numpy {np.__version__}", "threads": int(threads) if threads else "BLAS default"}


def supports(config: BERTConfig, device: str = "cpu") -> str | None:
    """Every config, on the CPU only."""
    return None if parse_device(device).kind == "cpu" else f"it runs on the CPU only, not {device!r}"


def build(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    device: str = "cpu",
    dtype: object = "float64",
    layer_norm_eps: float | None = None,
    gradients: bool = True,
    share: bool = False,
) -> NumpyBERT:
    """The oracle model on canonical ``weights``, cast to ``dtype`` (float64 by default). It computes no
    gradients, so ``gradients`` (the common interface's) changes nothing. With ``share`` it reads the
    caller's arrays where no cast is needed (it never writes them); the caller then leaves them
    unchanged while it lives."""
    reason = supports(config, device)
    if reason is not None:
        raise CannotRunHere(f"backend {NAME!r}: {reason}")
    dtype, arrays = stream_weights(config, weights, dtype)
    own = {
        name: array if shareable(array, given, share, gradients=False) else array.copy()
        for name, given, array in arrays
    }
    return NumpyBERT(config, own, dtype, layer_norm_eps)
