"""d2l 1.0's BERT in PyTorch, class for class, and every earlier generation through ``semantics``.

Read it beside ``bert_multi/mxnet/model.py``: the two files have the same functions and classes in the
same order, and a comment starting "Framework difference" marks each place where they must differ.
Constructor signatures are d2l's, so code written for ``from d2l import torch as d2l`` keeps working.
Additions, all optional: ``num_inputs`` on the layers d2l builds lazily (``BERTModel`` passes it, so its
parameters exist on construction and a state dict loads before any forward); ``semantics`` (a preset
of ``bert_multi.semantics``) and the switches it sets, through which the same classes compute d2l 0.11
to 1.0; ``train_positions``; ``attention`` (``bert_multi.spec.config.ATTENTIONS``: "sdpa" computes the
same attention through PyTorch's fused kernel). The modules ``d2l_0_11``, ``d2l_0_12`` and ``d2l_0_17`` give the same
classes each generation's constructor signatures.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..spec.config import HEADS
from ..spec.semantics import PRESETS, Semantics, semantics_for, sinusoidal_positions


def _dense(num_outputs: int, num_inputs: int | None = None, bias: bool = True) -> nn.Module:
    # Framework difference: torch needs the input width up front or a Lazy layer that infers it on the
    # first forward; Gluon's Dense takes in_units=0 to mean "infer it" (deferred initialisation;
    # docs/framework-differences.md, "Layers that learn their input width").
    if num_inputs is None:
        return nn.LazyLinear(num_outputs, bias=bias)
    return nn.Linear(num_inputs, num_outputs, bias=bias)


def _activation(kind: str) -> nn.Module:
    # "gelu" is the exact erf form (original BERT), "gelu_tanh" its tanh approximation; d2l uses ReLU.
    return {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh")}[kind]


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose masks on the CPU come from 16 random bits per element: an element is dropped
    with probability round(p * 2**16) / 2**16 (0.199997 for 0.2) and a kept one scaled by the inverse of
    its keep probability, so the expectation is exact.

    Framework difference: torch's CPU ``bernoulli_`` draws a 64-bit number per element (a third of
    d2l's pretraining step goes there); these masks cost a fifth of that. On a GPU, and inside a
    compiled graph, torch's own dropout is already fused and is used as it is.
    """

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or X.device.type != "cpu" or torch.compiler.is_compiling():
            return super().forward(X)
        dropped = round(self.p * 2**16)
        if dropped >= 2**16:
            return super().forward(X)
        # A 64-bit draw is four independent, uniform 16-bit ones; full-range draws are exactly uniform.
        words = torch.empty((X.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        # Of the 2**16 values a draw takes, the lowest ``dropped`` drop their element.
        keep = words.view(torch.int16)[: X.numel()].view(X.shape) >= dropped - 2**15
        return X.mul(keep).mul_(2**16 / (2**16 - dropped))


def masked_softmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis; key positions >= valid_len are scored -1e6 first.

    X: (N, T_q, T_k). valid_lens: None, (N,) for every query row, or (N, T_q) for each query row.
    """
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = X.reshape(-1, shape[-1])
    # d2l's _sequence_mask: -1e6, not -inf, so a row with valid_len 0 becomes uniform rather than NaN.
    key_positions = torch.arange(shape[-1], dtype=torch.float32, device=X.device)
    mask = key_positions[None, :] < valid_lens[:, None]
    X = X.masked_fill(~mask, -1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention with dropout on the attention weights."""

    def __init__(self, dropout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dropout = Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


# What the fused attention adds to a masked key's score. d2l scores a masked key -1e6, so a row of valid_len 0
# attends to every key alike; a mask that keeps no key (boolean, or -inf) is NaN or zeros in a fused kernel.
# -1e30 is so far below any score that the score rounds away in the sum (any under 2**75 in float32, under
# 2**46 in float64): a masked key's weight is 0, and a row of valid_len 0 scores every key the same. (The
# dtype's minimum would overflow to -inf in a kernel that scales the scores.)
MASKED_SCORE = -1e30


class FusedDotProductAttention(nn.Module):
    """``DotProductAttention``'s function through PyTorch's fused ``scaled_dot_product_attention``
    (``attention="sdpa"``): the scores are never materialised, so ``attention_weights`` is None.

    queries, keys, values: (B, h, T, H/h), d2l's row b*h + j at [b, j]; valid_lens (B,) or (B, T_q), the
    same for every head, or in d2l's row layout, (B*h,) or (B*h, T_q). Framework difference: torch's fused
    kernels take the heads as an axis before the positions; JAX's after them."""

    def __init__(self, dropout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dropout = Dropout(dropout)
        self.attention_weights = None

    def forward(self, queries, keys, values, valid_lens=None):
        mask = None
        if valid_lens is not None:
            per_query = valid_lens.shape[-1] if valid_lens.dim() == 2 else 1
            lens = valid_lens.reshape(queries.shape[0], -1, per_query, 1)  # (B, 1 or h, 1 or T_q, 1)
            masked = torch.arange(keys.shape[2], device=keys.device) >= lens  # True: the key is left out
            # Added to the scores, in their dtype, as the kernels take it (a boolean mask is converted).
            # Framework difference: JAX's function takes a boolean mask, so there a row of valid_len 0 keeps
            # every key and its query is zeroed, which XLA fuses; here that zeroing would copy the queries.
            mask = masked.to(queries.dtype).mul_(MASKED_SCORE)
        dropout = self.dropout.p if self.training else 0.0
        return nn.functional.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, dropout_p=dropout)


class MultiHeadAttention(nn.Module):
    """Multi-head attention; heads are split by reshaping, so row b*h + j is batch b, head j (with
    ``attention="sdpa"``, [b, j] of a (B, h, T, H/h) view, which fused kernels take without a copy)."""

    def __init__(
        self,
        num_hiddens: int,
        num_heads: int,
        dropout: float,
        bias: bool = False,
        num_inputs: int | None = None,
        valid_lens_over_heads: str = "interleaved",
        attention: str = "d2l",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.valid_lens_over_heads = valid_lens_over_heads
        self.fused = attention == "sdpa"
        self.attention = FusedDotProductAttention(dropout) if self.fused else DotProductAttention(dropout)
        self.W_q = _dense(num_hiddens, num_inputs, bias)
        self.W_k = _dense(num_hiddens, num_inputs, bias)
        self.W_v = _dense(num_hiddens, num_inputs, bias)
        self.W_o = _dense(num_hiddens, num_hiddens, bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None and self.valid_lens_over_heads == "interleaved":
            # (b0, b0, ..., b1, b1, ...), to match the head layout of transpose_qkv; fused, the heads are
            # an axis of their own, so each sequence's lengths are given once.
            if not self.fused:
                valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        elif valid_lens is not None:
            # d2l <= 0.15 tiled them, (b0, b1, ..., b0, b1, ...): its bug, reproduced. Framework
            # difference: torch's Tensor.repeat tiles (like np.tile); NumPy's and MXNet's repeat interleave
            # (docs/framework-differences.md, "`repeat` means opposite things").
            valid_lens = valid_lens.repeat(self.num_heads, *[1] * (valid_lens.dim() - 1))
        output = self.attention(queries, keys, values, valid_lens)
        return self.W_o(self.transpose_output(output))

    def transpose_qkv(self, X):
        """(B, T, H) -> (B*h, T, H/h); fused, the (B, h, T, H/h) view of the same rows."""
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
        X = X.permute(0, 2, 1, 3)
        return X if self.fused else X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        """(B*h, T, H/h) -> (B, T, H), undoing transpose_qkv; fused, from (B, h, T, H/h)."""
        if not self.fused:
            X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
        X = X.permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)


class PositionWiseFFN(nn.Module):
    """Dense -> ReLU (GELU in original BERT) -> Dense, applied at every position."""

    def __init__(
        self, ffn_num_hiddens: int, ffn_num_outputs: int, num_inputs: int | None = None, activation: str = "relu"
    ) -> None:
        super().__init__()
        # Framework difference: torch keeps the activation as its own module (d2l calls it relu); Gluon
        # fuses a ReLU into dense1.
        self.dense1 = _dense(ffn_num_hiddens, num_inputs)
        self.relu = _activation(activation)
        self.dense2 = _dense(ffn_num_outputs, ffn_num_hiddens)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """Residual connection, then LayerNorm (post-LN): LN(dropout(Y) + X)."""

    def __init__(self, norm_shape, dropout: float, eps: float = 1e-5) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        # Framework difference: torch's LayerNorm needs the normalised shape and names its parameters
        # weight/bias; Gluon's infers the shape and calls them gamma/beta. Both default to eps=1e-5.
        self.ln = nn.LayerNorm(norm_shape, eps=eps)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class PositionalEncoding(nn.Module):
    """d2l's fixed sinusoidal positions added to the input, then dropout (d2l 0.11's BERT uses them)."""

    def __init__(self, num_hiddens: int, dropout: float, max_len: int = 1000) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        # A plain tensor, as in d2l: never trained nor saved. Framework difference: torch keeps it on the
        # CPU and moves a slice to the input's device; MXNet copies a slice to the input's context.
        self.P = torch.from_numpy(sinusoidal_positions(max_len, num_hiddens))[None]

    def forward(self, X):
        return self.dropout(X + self.P[:, : X.shape[1], :].to(X.device, X.dtype))


class TransformerEncoderBlock(nn.Module):
    """Y = AddNorm(X, MHA(X, X, X)); out = AddNorm(Y, FFN(Y))."""

    def __init__(
        self,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        dropout: float,
        use_bias: bool = False,
        valid_lens_over_heads: str = "interleaved",
        activation: str = "relu",
        layer_norm_eps: float = 1e-5,
        attention: str = "d2l",
    ) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(
            num_hiddens,
            num_heads,
            dropout,
            use_bias,
            num_inputs=num_hiddens,
            valid_lens_over_heads=valid_lens_over_heads,
            attention=attention,
        )
        self.addnorm1 = AddNorm(num_hiddens, dropout, layer_norm_eps)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens, num_inputs=num_hiddens, activation=activation)
        self.addnorm2 = AddNorm(num_hiddens, dropout, layer_norm_eps)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class BERTEncoder(nn.Module):
    """Token + segment + positional embeddings, then ``num_blks`` encoder blocks."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        max_len: int = 1000,
        semantics: Semantics | str = PRESETS["d2l"],
        train_positions: bool = True,
        attention: str = "d2l",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        semantics = semantics_for(semantics)
        self.learned_positions = semantics.positions == "learned"
        self.train_positions = train_positions
        self.token_embedding = nn.Embedding(vocab_size, num_hiddens)
        self.segment_embedding = nn.Embedding(2, num_hiddens)
        if not self.learned_positions:  # d2l 0.11: fixed sinusoidal positions, then dropout
            self.pos_encoding = PositionalEncoding(num_hiddens, dropout, max_len)
        self.embedding_norm = None
        if semantics.embedding_norm:  # original BERT: LayerNorm, then dropout, on the embedding sum
            self.embedding_norm = nn.LayerNorm(num_hiddens, eps=semantics.layer_norm_eps)
            self.embedding_dropout = Dropout(dropout)
        self.blks = nn.Sequential()
        for i in range(num_blks):
            # BERT's encoder asks for bias in attention (d2l >= 0.12), though d2l's attention defaults to none.
            block = TransformerEncoderBlock(
                num_hiddens,
                ffn_num_hiddens,
                num_heads,
                dropout,
                semantics.attention_bias,
                semantics.valid_lens_over_heads,
                semantics.activation,
                semantics.layer_norm_eps,
                attention,
            )
            self.blks.add_module(f"{i}", block)
        if self.learned_positions:
            # Framework difference: a bare learnable tensor is an nn.Parameter attribute in torch and a
            # Parameter from self.params.get in Gluon.
            self.pos_embedding = nn.Parameter(torch.randn(1, max_len, num_hiddens))

    def forward(self, tokens, segments, valid_lens):
        X = self.token_embedding(tokens) + self.segment_embedding(segments)
        if self.learned_positions:
            # d2l 0.16-0.17's PyTorch code added pos_embedding.data, so it never trained: train_positions=False.
            positions = self.pos_embedding if self.train_positions else self.pos_embedding.detach()
            X = X + positions[:, : X.shape[1], :]
        else:
            X = self.pos_encoding(X)
        if self.embedding_norm is not None:
            X = self.embedding_dropout(self.embedding_norm(X))
        for blk in self.blks:
            X = blk(X, valid_lens)
        return X


class TiedDecoder(nn.Module):
    """Original BERT's MLM decoder: logits = X E^T + bias, E the token embedding's weight (tied)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings))
        # Framework difference: torch registers any Module assigned as an attribute, Gluon any Block; the
        # embedding already belongs to the encoder, so it is held without registering (saved once, there).
        object.__setattr__(self, "embedding", embedding)

    def forward(self, X):
        return X @ self.embedding.weight.T + self.bias


class MaskLM(nn.Module):
    """Masked-LM head: gather the encodings at pred_positions, then Dense -> ReLU -> LayerNorm -> Dense(V)
    (original BERT: GELU, and a decoder tied to the token embedding)."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        num_inputs: int | None = None,
        activation: str = "relu",
        layer_norm_eps: float = 1e-5,
        tied_embedding: nn.Embedding | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        decoder = _dense(vocab_size, num_hiddens) if tied_embedding is None else TiedDecoder(tied_embedding)
        self.mlp = nn.Sequential(
            _dense(num_hiddens, num_inputs),
            _activation(activation),
            nn.LayerNorm(num_hiddens, eps=layer_norm_eps),
            decoder,
        )

    def forward(self, X, pred_positions):
        num_pred_positions = pred_positions.shape[1]
        pred_positions = pred_positions.reshape(-1)
        batch_size = X.shape[0]
        # For batch_size 2 and 3 positions, batch_idx is [0, 0, 0, 1, 1, 1].
        batch_idx = torch.repeat_interleave(torch.arange(0, batch_size, device=X.device), num_pred_positions)
        masked_X = X[batch_idx, pred_positions]
        masked_X = masked_X.reshape((batch_size, num_pred_positions, -1))
        return self.mlp(masked_X)


class NextSentencePred(nn.Module):
    """Next-sentence-prediction head: one Dense(2) on the pooled <cls> representation."""

    def __init__(self, num_inputs: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.output = _dense(2, num_inputs)

    def forward(self, X):
        return self.output(X)


class NextSentencePredMLP(nn.Module):
    """d2l 0.11's next-sentence-prediction head: it reads <cls> itself, then Dense(H, tanh), Dense(2)."""

    def __init__(self, num_hiddens: int, num_inputs: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        # Framework difference: torch stacks Linear and Tanh (hence mlp.0 and mlp.2); Gluon fuses the tanh
        # into its Dense (hence mlp.0 and mlp.1).
        self.mlp = nn.Sequential(_dense(num_hiddens, num_inputs), nn.Tanh(), _dense(2, num_hiddens))

    def forward(self, X):
        # 0 is the index of the <cls> token.
        return self.mlp(X[:, 0, :])


class BERTModel(nn.Module):
    """Encoder, pooler and both pretraining heads; returns (encoded_X, mlm_Y_hat, nsp_Y_hat), None for
    what the model has no head for (and mlm_Y_hat without pred_positions)."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        max_len: int = 1000,
        semantics: Semantics | str = PRESETS["d2l"],
        train_positions: bool = True,
        heads: tuple[str, ...] = HEADS,
        attention: str = "d2l",
    ) -> None:
        super().__init__()
        semantics = semantics_for(semantics)
        self.heads = heads
        self.encoder = BERTEncoder(
            vocab_size,
            num_hiddens,
            ffn_num_hiddens,
            num_heads,
            num_blks,
            dropout,
            max_len=max_len,
            semantics=semantics,
            train_positions=train_positions,
            attention=attention,
        )
        # Each head is optional (a fine-tuned encoder keeps only the pooler); d2l always builds all three.
        self.pooled = semantics.nsp_head == "pooler"
        mlm_options: dict[str, Any] = dict(activation=semantics.activation, layer_norm_eps=semantics.layer_norm_eps)
        if semantics.mlm_decoder == "tied":  # original BERT
            mlm_options["tied_embedding"] = self.encoder.token_embedding
        if self.pooled:
            if "pooler" in heads:
                # Framework difference: torch stacks Dense and Tanh in a Sequential (hence hidden.0.weight);
                # Gluon fuses the activation into the Dense (hence hidden.weight).
                self.hidden = nn.Sequential(nn.Linear(num_hiddens, num_hiddens), nn.Tanh())
            if "mlm" in heads:
                self.mlm = MaskLM(vocab_size, num_hiddens, num_inputs=num_hiddens, **mlm_options)
            if "nsp" in heads:
                self.nsp: NextSentencePred | NextSentencePredMLP = NextSentencePred(num_inputs=num_hiddens)
        else:  # d2l 0.11: the NSP head pools <cls> itself, and is made before MaskLM
            if "nsp" in heads:
                self.nsp = NextSentencePredMLP(num_hiddens, num_inputs=num_hiddens)
            if "mlm" in heads:
                self.mlm = MaskLM(vocab_size, num_hiddens, num_inputs=num_hiddens, **mlm_options)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        encoded_X = self.encoder(tokens, segments, valid_lens)
        mlm_Y_hat = nsp_Y_hat = None
        if pred_positions is not None and "mlm" in self.heads:
            mlm_Y_hat = self.mlm(encoded_X, pred_positions)
        # The pooler reads position 0, the <cls> token.
        if not self.pooled and "nsp" in self.heads:
            nsp_Y_hat = self.nsp(encoded_X)
        elif "pooler" in self.heads:
            pooled = self.hidden(encoded_X[:, 0, :])
            nsp_Y_hat = self.nsp(pooled) if "nsp" in self.heads else None
        return encoded_X, mlm_Y_hat, nsp_Y_hat
