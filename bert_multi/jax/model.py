"""d2l's BERT in JAX/Flax (linen), class for class, and every earlier generation through ``semantics``.

d2l 1.0 teaches its transformer chapters in JAX too, but not its BERT chapter: these classes are written
in the style of d2l 1.0's ``jax.py`` (dataclass fields, ``setup``/``__call__``, a ``training`` flag,
dropout drawing from the ``dropout`` random stream). Read them beside ``bert_multi/torch/model.py``
and ``bert_multi/mxnet/model.py``: the same functions and classes in the same order, and a comment
starting "Framework difference" at each place where they must differ. The named activations are
recorded with Flax's own ``sow`` into the ``intermediates`` collection.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from ..spec.config import HEADS
from ..spec.semantics import PRESETS, Semantics, semantics_for, sinusoidal_positions


def _dense(num_outputs: int, bias: bool = True, name: str | None = None) -> nn.Module:
    # Framework difference: Flax's Dense infers its input width when its parameters are first created,
    # as Gluon's does, and keeps its kernel as (in, out), the transpose of torch's and Gluon's weight.
    return nn.Dense(num_outputs, use_bias=bias, name=name)


def _layer_norm(eps: float) -> nn.Module:
    # Framework difference: Flax's LayerNorm takes the variance as E[x^2] - E[x]^2 unless told not to,
    # which cancels in float32 where the mean dwarfs the spread (2.6x the float32 tolerance on a 2-wide
    # model); torch and Gluon take the mean of the squared deviations, as the oracle does.
    return nn.LayerNorm(epsilon=eps, use_fast_variance=False)


def _activation(kind: str, X: jax.Array) -> jax.Array:
    # "gelu" is the exact erf form (original BERT), "gelu_tanh" its tanh approximation; d2l uses ReLU.
    if kind == "relu":
        return nn.relu(X)
    return nn.gelu(X, approximate=kind == "gelu_tanh")


def masked_softmax(X: jax.Array, valid_lens: jax.Array | None) -> jax.Array:
    """Softmax over the last axis; key positions >= valid_len are scored -1e6 first.

    X: (N, T_q, T_k). valid_lens: None, (N,) for every query row, or (N, T_q) for each query row.
    """
    if valid_lens is None:
        return nn.softmax(X, axis=-1)
    lens = valid_lens[:, None] if valid_lens.ndim == 1 else valid_lens  # (N, T_q)
    keep = jnp.arange(X.shape[-1])[None, None, :] < lens[:, :, None]
    # d2l's _sequence_mask: -1e6, not -inf, so a row with valid_len 0 becomes uniform rather than NaN.
    return nn.softmax(jnp.where(keep, X, -1e6), axis=-1)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention with dropout on the attention weights."""

    dropout: float

    @nn.compact
    def __call__(self, queries, keys, values, valid_lens=None, training: bool = False):
        d = queries.shape[-1]
        scores = queries @ keys.swapaxes(1, 2) / math.sqrt(d)
        weights = masked_softmax(scores, valid_lens)
        # Framework difference: dropout draws from an explicit random stream ("dropout" key), and is on
        # only when the call says training=True; torch and Gluon have a mode and a global generator.
        return nn.Dropout(self.dropout, deterministic=not training)(weights) @ values


class FusedDotProductAttention(nn.Module):
    """``DotProductAttention``'s function through JAX's ``jax.nn.dot_product_attention``
    (``attention="sdpa"``): no attention weights are kept.

    queries, keys, values: (B, T, h, H/h), d2l's row b*h + j at [b, :, j]; valid_lens (B,) or (B, T_q), the
    same for every head, or in d2l's row layout, (B*h,) or (B*h, T_q). Framework difference: JAX's function
    takes the heads as an axis after the positions (torch's fused kernel before them); it has no dropout,
    and computes its softmax in float32 whatever the inputs' dtype, so training with dropout, and float64,
    compute d2l's expression in this layout instead."""

    dropout: float

    @nn.compact
    def __call__(self, queries, keys, values, valid_lens=None, training: bool = False):
        B, _, _, d = queries.shape
        keep = None
        if valid_lens is not None:
            per_query = valid_lens.shape[-1] if valid_lens.ndim == 2 else 1
            lens = valid_lens.reshape(B, -1, per_query, 1)  # (B, 1 or h, 1 or T_q, 1)
            keep = jnp.arange(keys.shape[1]) < lens  # (B, h, 1 or T_q, T_k); True: the key takes part
        if (training and self.dropout > 0) or queries.dtype == jnp.float64:
            scores = jnp.einsum("bqhd,bkhd->bhqk", queries, keys) / math.sqrt(d)
            # d2l's _sequence_mask, as masked_softmax applies it.
            weights = nn.softmax(scores if keep is None else jnp.where(keep, scores, -1e6), axis=-1)
            weights = nn.Dropout(self.dropout, deterministic=not training)(weights)
            return jnp.einsum("bhqk,bkhd->bqhd", weights, values)
        if keep is not None:
            # d2l scores a masked key -1e6, so a row of valid_len 0 attends to every key alike; such a row
            # keeps every key here, and a zero query scores them all 0: the same uniform weights.
            empty = lens == 0
            keep = keep | empty
            queries = jnp.where(empty.transpose(0, 2, 1, 3), 0, queries)
        return jax.nn.dot_product_attention(queries, keys, values, mask=keep)


class MultiHeadAttention(nn.Module):
    """Multi-head attention; heads are split by reshaping, so row b*h + j is batch b, head j (with
    ``attention="sdpa"``, [b, :, j] of a (B, T, h, H/h) array, which JAX's fused function takes)."""

    num_hiddens: int
    num_heads: int
    dropout: float
    bias: bool = False
    valid_lens_over_heads: str = "interleaved"
    # Framework difference: a Flax field may not share its name with a submodule, so the choice is
    # attention_kind here (attention in torch).
    attention_kind: str = "d2l"

    @property
    def fused(self) -> bool:
        return self.attention_kind == "sdpa"

    def setup(self) -> None:
        self.attention = FusedDotProductAttention(self.dropout) if self.fused else DotProductAttention(self.dropout)
        self.W_q = _dense(self.num_hiddens, self.bias)
        self.W_k = _dense(self.num_hiddens, self.bias)
        self.W_v = _dense(self.num_hiddens, self.bias)
        self.W_o = _dense(self.num_hiddens, self.bias)

    def __call__(self, queries, keys, values, valid_lens, training: bool = False):
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None and self.valid_lens_over_heads == "interleaved":
            # (b0, b0, ..., b1, b1, ...), to match the head layout of transpose_qkv; fused, the heads are
            # an axis of their own, so each sequence's lengths are given once.
            if not self.fused:
                valid_lens = jnp.repeat(valid_lens, self.num_heads, axis=0)
        elif valid_lens is not None:
            # d2l <= 0.15 tiled them, (b0, b1, ..., b0, b1, ...): its bug, reproduced with jnp.tile (jnp.repeat
            # interleaves, as NumPy's and MXNet's do; torch's Tensor.repeat is the one that tiles).
            valid_lens = jnp.tile(valid_lens, (self.num_heads,) + (1,) * (valid_lens.ndim - 1))
        output = self.attention(queries, keys, values, valid_lens, training)
        return self.W_o(self.transpose_output(output))

    def transpose_qkv(self, X):
        """(B, T, H) -> (B*h, T, H/h); fused, (B, T, h, H/h), the same rows without moving them."""
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
        if self.fused:
            return X
        X = X.transpose(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        """(B*h, T, H/h) -> (B, T, H), undoing transpose_qkv; fused, from (B, T, h, H/h)."""
        if not self.fused:
            X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
            X = X.transpose(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)


class PositionWiseFFN(nn.Module):
    """Dense -> ReLU (GELU in original BERT) -> Dense, applied at every position."""

    ffn_num_hiddens: int
    ffn_num_outputs: int
    activation: str = "relu"

    def setup(self) -> None:
        # Framework difference: Flax applies the activation as a function; torch keeps it as a module.
        self.dense1 = _dense(self.ffn_num_hiddens)
        self.dense2 = _dense(self.ffn_num_outputs)

    def __call__(self, X):
        return self.dense2(_activation(self.activation, self.dense1(X)))


class AddNorm(nn.Module):
    """Residual connection, then LayerNorm (post-LN): LN(dropout(Y) + X)."""

    dropout: float
    eps: float = 1e-5

    def setup(self) -> None:
        # Framework difference: Flax's LayerNorm calls its parameters scale/bias (torch: weight/bias,
        # Gluon: gamma/beta) and infers the shape, as Gluon's does.
        self.ln = _layer_norm(self.eps)
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, X, Y, training: bool = False):
        return self.ln(self.drop(Y, deterministic=not training) + X)


class PositionalEncoding(nn.Module):
    """d2l's fixed sinusoidal positions added to the input, then dropout (d2l 0.11's BERT uses them)."""

    num_hiddens: int
    dropout: float
    max_len: int = 1000

    def setup(self) -> None:
        # A constant, as in d2l: never trained nor saved.
        self.P = sinusoidal_positions(self.max_len, self.num_hiddens)[None]
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, X, training: bool = False):
        X = X + jnp.asarray(self.P[:, : X.shape[1], :], dtype=X.dtype)
        return self.drop(X, deterministic=not training)


class TransformerEncoderBlock(nn.Module):
    """Y = AddNorm(X, MHA(X, X, X)); out = AddNorm(Y, FFN(Y))."""

    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    dropout: float
    use_bias: bool = False
    valid_lens_over_heads: str = "interleaved"
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    attention_kind: str = "d2l"

    def setup(self) -> None:
        self.attention = MultiHeadAttention(
            self.num_hiddens,
            self.num_heads,
            self.dropout,
            self.use_bias,
            self.valid_lens_over_heads,
            self.attention_kind,
        )
        self.addnorm1 = AddNorm(self.dropout, self.layer_norm_eps)
        self.ffn = PositionWiseFFN(self.ffn_num_hiddens, self.num_hiddens, self.activation)
        self.addnorm2 = AddNorm(self.dropout, self.layer_norm_eps)

    def __call__(self, X, valid_lens, training: bool = False):
        attention = self.attention(X, X, X, valid_lens, training)
        Y = self.addnorm1(X, attention, training)
        ffn = self.ffn(Y)
        out = self.addnorm2(Y, ffn, training)
        # Framework difference: no hooks in Flax; a module records what it wants seen with sow (under
        # names of their own: a variable may not share its name with a submodule).
        for name, value in (("attention", attention), ("addnorm1", Y), ("ffn", ffn), ("output", out)):
            self.sow("intermediates", f"{name}_out", value)
        return out


class BERTEncoder(nn.Module):
    """Token + segment + positional embeddings, then ``num_blks`` encoder blocks."""

    vocab_size: int
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int
    dropout: float
    max_len: int = 1000
    semantics: Semantics | str = PRESETS["d2l"]
    train_positions: bool = True
    attention: str = "d2l"

    def setup(self) -> None:
        self.switches = semantics = semantics_for(self.semantics)
        self.token_embedding = nn.Embed(self.vocab_size, self.num_hiddens)
        self.segment_embedding = nn.Embed(2, self.num_hiddens)
        if semantics.positions == "learned":
            # Framework difference: a bare learnable tensor is a param of the module (self.param), as it
            # is an nn.Parameter attribute in torch and self.params.get in Gluon.
            self.pos_embedding = self.param(
                "pos_embedding", nn.initializers.normal(1.0), (1, self.max_len, self.num_hiddens)
            )
        else:  # d2l 0.11: fixed sinusoidal positions, then dropout
            self.pos_encoding = PositionalEncoding(self.num_hiddens, self.dropout, self.max_len)
        if semantics.embedding_norm:  # original BERT: LayerNorm, then dropout, on the embedding sum
            self.embedding_norm = _layer_norm(semantics.layer_norm_eps)
            self.embedding_dropout = nn.Dropout(self.dropout)
        # Framework difference: Flax names a list of submodules blks_0, blks_1, ... (torch and Gluon:
        # blks.0, blks.1 in a Sequential).
        self.blks = [
            TransformerEncoderBlock(
                self.num_hiddens,
                self.ffn_num_hiddens,
                self.num_heads,
                self.dropout,
                semantics.attention_bias,
                semantics.valid_lens_over_heads,
                semantics.activation,
                semantics.layer_norm_eps,
                self.attention,
            )
            for _ in range(self.num_blks)
        ]

    def __call__(self, tokens, segments, valid_lens, training: bool = False):
        X = self.token_embedding(tokens) + self.segment_embedding(segments)
        if self.switches.positions == "learned":
            # d2l 0.16-0.17's PyTorch code added pos_embedding.data, so it never trained: train_positions=False.
            positions = self.pos_embedding if self.train_positions else jax.lax.stop_gradient(self.pos_embedding)
            X = X + positions[:, : X.shape[1], :].astype(X.dtype)
        else:
            X = self.pos_encoding(X, training)
        if self.switches.embedding_norm:
            X = self.embedding_dropout(self.embedding_norm(X), deterministic=not training)
        self.sow("intermediates", "embedding", X)
        for blk in self.blks:
            X = blk(X, valid_lens, training)
        return X


class TiedDecoder(nn.Module):
    """Original BERT's MLM decoder: logits = X E^T + bias, E the token embedding's (tied)."""

    embedding: nn.Embed
    vocab_size: int

    @nn.compact
    def __call__(self, X):
        # Framework difference: the encoder's Embed is shared by passing the module itself; its table
        # stays in the encoder's parameters (saved once, there), and attend() multiplies by its transpose.
        bias = self.param("bias", nn.initializers.zeros, (self.vocab_size,))
        return self.embedding.attend(X) + bias


class MaskLM(nn.Module):
    """Masked-LM head: gather the encodings at pred_positions, then Dense -> ReLU -> LayerNorm -> Dense(V)
    (original BERT: GELU, and a decoder tied to the token embedding)."""

    vocab_size: int
    num_hiddens: int
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    tied_embedding: nn.Embed | None = None

    def setup(self) -> None:
        # Framework difference: the layers torch keeps in a Sequential (mlp.0, mlp.2, mlp.3) are named
        # mlp_0, mlp_2, mlp_3 here, the activation being a function.
        self.mlp_0 = _dense(self.num_hiddens)
        self.mlp_2 = _layer_norm(self.layer_norm_eps)
        if self.tied_embedding is None:
            self.mlp_3 = _dense(self.vocab_size)
        else:
            self.mlp_3 = TiedDecoder(self.tied_embedding, self.vocab_size)

    def __call__(self, X, pred_positions):
        batch_size, num_pred_positions = pred_positions.shape
        # For batch_size 2 and 3 positions, batch_idx is [0, 0, 0, 1, 1, 1].
        batch_idx = jnp.repeat(jnp.arange(batch_size), num_pred_positions)
        masked_X = X[batch_idx, pred_positions.reshape(-1)].reshape(batch_size, num_pred_positions, -1)
        return self.mlp_3(self.mlp_2(_activation(self.activation, self.mlp_0(masked_X))))


class NextSentencePred(nn.Module):
    """Next-sentence-prediction head: one Dense(2) on the pooled <cls> representation."""

    def setup(self) -> None:
        self.output = _dense(2)

    def __call__(self, X):
        return self.output(X)


class NextSentencePredMLP(nn.Module):
    """d2l 0.11's next-sentence-prediction head: it reads <cls> itself, then Dense(H, tanh), Dense(2)."""

    num_hiddens: int

    def setup(self) -> None:
        self.mlp_0 = _dense(self.num_hiddens)
        self.mlp_2 = _dense(2)

    def __call__(self, X):
        # 0 is the index of the <cls> token.
        pooled = jnp.tanh(self.mlp_0(X[:, 0, :]))
        self.sow("intermediates", "pooler", pooled)
        return self.mlp_2(pooled)


class BERTModel(nn.Module):
    """Encoder, pooler and both pretraining heads; returns (encoded_X, mlm_Y_hat, nsp_Y_hat), None for
    what the model has no head for (and mlm_Y_hat without pred_positions)."""

    vocab_size: int
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int
    dropout: float
    max_len: int = 1000
    semantics: Semantics | str = PRESETS["d2l"]
    train_positions: bool = True
    heads: tuple[str, ...] = HEADS
    attention: str = "d2l"

    def setup(self) -> None:
        semantics = semantics_for(self.semantics)
        self.encoder = BERTEncoder(
            self.vocab_size,
            self.num_hiddens,
            self.ffn_num_hiddens,
            self.num_heads,
            self.num_blks,
            self.dropout,
            self.max_len,
            semantics,
            self.train_positions,
            self.attention,
        )
        self.pooled = semantics.nsp_head == "pooler"
        tied = self.encoder.token_embedding if semantics.mlm_decoder == "tied" else None
        options: dict[str, Any] = dict(activation=semantics.activation, layer_norm_eps=semantics.layer_norm_eps)
        if self.pooled:
            if "pooler" in self.heads:
                # Framework difference: the pooler is one Dense, its tanh applied in __call__ (torch: a
                # Sequential of Linear and Tanh, hence hidden.0; Gluon fuses the tanh into its Dense).
                self.hidden = _dense(self.num_hiddens)
            if "mlm" in self.heads:
                self.mlm = MaskLM(self.vocab_size, self.num_hiddens, tied_embedding=tied, **options)
            if "nsp" in self.heads:
                self.nsp = NextSentencePred()
        else:  # d2l 0.11: the NSP head pools <cls> itself
            if "nsp" in self.heads:
                self.nsp = NextSentencePredMLP(self.num_hiddens)
            if "mlm" in self.heads:
                self.mlm = MaskLM(self.vocab_size, self.num_hiddens, tied_embedding=tied, **options)

    def __call__(self, tokens, segments, valid_lens=None, pred_positions=None, training: bool = False):
        encoded_X = self.encoder(tokens, segments, valid_lens, training)
        mlm_Y_hat = nsp_Y_hat = None
        if pred_positions is not None and "mlm" in self.heads:
            mlm_Y_hat = self.mlm(encoded_X, pred_positions)
        # The pooler reads position 0, the <cls> token.
        if not self.pooled and "nsp" in self.heads:
            nsp_Y_hat = self.nsp(encoded_X)
        elif "pooler" in self.heads:
            pooled = jnp.tanh(self.hidden(encoded_X[:, 0, :]))
            self.sow("intermediates", "pooler", pooled)
            nsp_Y_hat = self.nsp(pooled) if "nsp" in self.heads else None
        return encoded_X, mlm_Y_hat, nsp_Y_hat
