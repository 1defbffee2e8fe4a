"""d2l 1.0's BERT in MXNet/Gluon (NumPy mode), class for class, and every earlier generation through
``semantics``.

Read it beside ``bert_multi/torch/model.py``: the two files have the same functions and classes in the
same order, and a comment starting "Framework difference" marks each place where they must differ.
Constructor signatures are d2l's, so code written for ``from d2l import mxnet as d2l`` keeps working.
Additions, all optional: ``num_inputs`` on the layers whose shapes Gluon would defer (``BERTModel``
passes it, so its parameters exist as soon as it is initialised and weights load before any forward);
``semantics`` (a preset of ``bert_multi.semantics``) and the switches it sets, through which the same
classes compute d2l 0.11 to 1.0; ``train_positions``. The modules ``d2l_0_11``, ``d2l_0_12`` and
``d2l_0_17`` give the same classes each generation's constructor signatures.
"""

from __future__ import annotations

import math
from typing import Any

from mxnet import np, npx
from mxnet.gluon import nn

from ..spec.config import HEADS
from ..spec.semantics import PRESETS, Semantics, semantics_for, sinusoidal_positions

npx.set_np()  # Gluon on mxnet.np arrays, as d2l does


def _dense(
    num_outputs: int,
    num_inputs: int | None = None,
    bias: bool = True,
    activation: str | None = None,
    flatten: bool = False,
) -> nn.Block:
    # Framework difference: Gluon's Dense infers its input width on the first forward when in_units=0
    # (deferred initialisation; docs/framework-differences.md, "Layers that learn their input width");
    # torch needs the width up front or a Lazy layer. Gluon's Dense also flattens its input to 2-D by
    # default, so sequence layers pass flatten=False.
    if activation in ("gelu", "gelu_tanh"):
        approximate = activation == "gelu_tanh"
        return GELUDense(num_outputs, use_bias=bias, flatten=flatten, in_units=num_inputs or 0, approximate=approximate)
    return nn.Dense(num_outputs, activation=activation, use_bias=bias, flatten=flatten, in_units=num_inputs or 0)


def gelu(X: np.ndarray, approximate: bool = False) -> np.ndarray:
    """x * Phi(x): exact (erf) or its tanh approximation. Written out: MXNet's own LeakyReLU 'gelu' is
    1.5e-7 off the erf form even in float64, while npx.erf is exact."""
    if approximate:
        return 0.5 * X * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (X + 0.044715 * X**3)))
    return 0.5 * X * (1.0 + npx.erf(X / math.sqrt(2.0)))


class GELUDense(nn.Dense):
    """A Dense followed by GELU, in one block. Framework difference: Gluon fuses a Dense's activation
    into it (so d2l's Gluon MLPs are shorter than torch's), but has no fused GELU; this keeps the fused
    layout, and so the parameter names, for original BERT's GELU."""

    def __init__(self, *args, approximate: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.approximate = approximate

    def forward(self, X):
        return gelu(super().forward(X), self.approximate)


def masked_softmax(X: np.ndarray, valid_lens: np.ndarray | None) -> np.ndarray:
    """Softmax over the last axis; key positions >= valid_len are scored -1e6 first.

    X: (N, T_q, T_k). valid_lens: None, (N,) for every query row, or (N, T_q) for each query row.
    """
    if valid_lens is None:
        return npx.softmax(X)
    shape = X.shape
    if valid_lens.ndim == 1:
        valid_lens = valid_lens.repeat(shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    # Framework difference: MXNet has a fused sequence_mask operator; torch builds the mask by hand.
    # -1e6, not -inf, so a row with valid_len 0 becomes uniform rather than NaN.
    X = npx.sequence_mask(X.reshape(-1, shape[-1]), valid_lens, True, value=-1e6, axis=1)
    return npx.softmax(X).reshape(shape)


class DotProductAttention(nn.Block):
    """Scaled dot-product attention with dropout on the attention weights."""

    def __init__(self, dropout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = npx.batch_dot(queries, keys, transpose_b=True) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return npx.batch_dot(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Block):
    """Multi-head attention; heads are split by reshaping, so row b*h + j is batch b, head j."""

    def __init__(
        self,
        num_hiddens: int,
        num_heads: int,
        dropout: float,
        use_bias: bool = False,
        num_inputs: int | None = None,
        valid_lens_over_heads: str = "interleaved",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.valid_lens_over_heads = valid_lens_over_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = _dense(num_hiddens, num_inputs, use_bias)
        self.W_k = _dense(num_hiddens, num_inputs, use_bias)
        self.W_v = _dense(num_hiddens, num_inputs, use_bias)
        self.W_o = _dense(num_hiddens, num_hiddens, use_bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None and self.valid_lens_over_heads == "interleaved":
            # (b0, b0, ..., b1, b1, ...), to match the head layout of transpose_qkv.
            valid_lens = valid_lens.repeat(self.num_heads, axis=0)
        elif valid_lens is not None:
            # d2l <= 0.15 tiled them, (b0, b1, ..., b0, b1, ...): its bug, reproduced. Framework
            # difference: NumPy's and MXNet's repeat interleave; torch's Tensor.repeat tiles (like np.tile)
            # (docs/framework-differences.md, "`repeat` means opposite things").
            valid_lens = np.tile(valid_lens, (self.num_heads,) + (1,) * (valid_lens.ndim - 1))
        output = self.attention(queries, keys, values, valid_lens)
        return self.W_o(self.transpose_output(output))

    def transpose_qkv(self, X):
        """(B, T, H) -> (B*h, T, H/h)."""
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
        X = X.transpose(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        """(B*h, T, H/h) -> (B, T, H), undoing transpose_qkv."""
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
        X = X.transpose(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)


class PositionWiseFFN(nn.Block):
    """Dense -> ReLU (GELU in original BERT) -> Dense, applied at every position."""

    def __init__(
        self, ffn_num_hiddens: int, ffn_num_outputs: int, num_inputs: int | None = None, activation: str = "relu"
    ) -> None:
        super().__init__()
        # Framework difference: Gluon fuses the activation into dense1; torch keeps it as its own module.
        self.dense1 = _dense(ffn_num_hiddens, num_inputs, activation=activation)
        self.dense2 = _dense(ffn_num_outputs, ffn_num_hiddens)

    def forward(self, X):
        return self.dense2(self.dense1(X))


class AddNorm(nn.Block):
    """Residual connection, then LayerNorm (post-LN): LN(dropout(Y) + X)."""

    def __init__(self, dropout: float, num_inputs: int | None = None, eps: float = 1e-5) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        # Framework difference: Gluon's LayerNorm infers the normalised width (in_channels=0) and names
        # its parameters gamma/beta; torch's needs the shape and calls them weight/bias. Both eps=1e-5.
        self.ln = nn.LayerNorm(epsilon=eps, in_channels=num_inputs or 0)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class PositionalEncoding(nn.Block):
    """d2l's fixed sinusoidal positions added to the input, then dropout (d2l 0.11's BERT uses them)."""

    def __init__(self, num_hiddens: int, dropout: float, max_len: int = 1000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        # A plain array, as in d2l: never trained nor saved. Framework difference: MXNet copies a slice to
        # the input's context; torch keeps it on the CPU and moves a slice to the input's device.
        self.P = np.array(sinusoidal_positions(max_len, num_hiddens)[None], dtype="float64")

    def forward(self, X):
        return self.dropout(X + self.P[:, : X.shape[1], :].as_in_ctx(X.ctx).astype(X.dtype))


class TransformerEncoderBlock(nn.Block):
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
    ) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(
            num_hiddens,
            num_heads,
            dropout,
            use_bias,
            num_inputs=num_hiddens,
            valid_lens_over_heads=valid_lens_over_heads,
        )
        self.addnorm1 = AddNorm(dropout, num_inputs=num_hiddens, eps=layer_norm_eps)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens, num_inputs=num_hiddens, activation=activation)
        self.addnorm2 = AddNorm(dropout, num_inputs=num_hiddens, eps=layer_norm_eps)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class BERTEncoder(nn.Block):
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
            self.embedding_norm = nn.LayerNorm(epsilon=semantics.layer_norm_eps, in_channels=num_hiddens)
            self.embedding_dropout = nn.Dropout(dropout)
        self.blks = nn.Sequential()
        for _ in range(num_blks):
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
            )
            self.blks.add(block)
        if self.learned_positions:
            # Framework difference: a bare learnable tensor is a Parameter from self.params.get in Gluon and
            # an nn.Parameter attribute in torch.
            self.pos_embedding = self.params.get("pos_embedding", shape=(1, max_len, num_hiddens))

    def forward(self, tokens, segments, valid_lens):
        X = self.token_embedding(tokens) + self.segment_embedding(segments)
        if self.learned_positions:
            # Framework difference: a Gluon Parameter holds one copy per context; .data(ctx) picks X's.
            positions = self.pos_embedding.data(ctx=X.ctx)
            # d2l 0.16-0.17's PyTorch code added pos_embedding.data, so it never trained: train_positions=False.
            positions = positions if self.train_positions else positions.detach()
            X = X + positions[:, : X.shape[1], :]
        else:
            X = self.pos_encoding(X)
        if self.embedding_norm is not None:
            X = self.embedding_dropout(self.embedding_norm(X))
        for blk in self.blks:
            X = blk(X, valid_lens)
        return X


class TiedDecoder(nn.Block):
    """Original BERT's MLM decoder: logits = X E^T + bias, E the token embedding's weight (tied)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.bias = self.params.get("bias", shape=(embedding.weight.shape[0],), init="zeros")
        # Framework difference: Gluon registers any Block assigned as an attribute, torch any Module; the
        # embedding already belongs to the encoder, so it is held without registering (saved once, there).
        object.__setattr__(self, "embedding", embedding)

    def forward(self, X):
        return np.dot(X, self.embedding.weight.data(ctx=X.ctx).T) + self.bias.data(ctx=X.ctx)


class MaskLM(nn.Block):
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
        self.mlp = nn.Sequential()
        self.mlp.add(_dense(num_hiddens, num_inputs, activation=activation))
        self.mlp.add(nn.LayerNorm(epsilon=layer_norm_eps, in_channels=num_hiddens))
        self.mlp.add(_dense(vocab_size, num_hiddens) if tied_embedding is None else TiedDecoder(tied_embedding))

    def forward(self, X, pred_positions):
        num_pred_positions = pred_positions.shape[1]
        pred_positions = pred_positions.reshape(-1)
        batch_size = X.shape[0]
        # For batch_size 2 and 3 positions, batch_idx is [0, 0, 0, 1, 1, 1].
        batch_idx = np.repeat(np.arange(0, batch_size, ctx=X.ctx), num_pred_positions)
        masked_X = X[batch_idx, pred_positions]
        masked_X = masked_X.reshape((batch_size, num_pred_positions, -1))
        return self.mlp(masked_X)


class NextSentencePred(nn.Block):
    """Next-sentence-prediction head: one Dense(2) on the pooled <cls> representation."""

    def __init__(self, num_inputs: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.output = _dense(2, num_inputs, flatten=True)

    def forward(self, X):
        return self.output(X)


class NextSentencePredMLP(nn.Block):
    """d2l 0.11's next-sentence-prediction head: it reads <cls> itself, then Dense(H, tanh), Dense(2)."""

    def __init__(self, num_hiddens: int, num_inputs: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        # Framework difference: Gluon fuses the tanh into its Dense (hence mlp.0 and mlp.1); torch stacks
        # Linear and Tanh (hence mlp.0 and mlp.2).
        self.mlp = nn.Sequential()
        self.mlp.add(_dense(num_hiddens, num_inputs, activation="tanh", flatten=True))
        self.mlp.add(_dense(2, num_hiddens, flatten=True))

    def forward(self, X):
        # 0 is the index of the <cls> token.
        return self.mlp(X[:, 0, :])


class BERTModel(nn.Block):
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
        )
        # Each head is optional (a fine-tuned encoder keeps only the pooler); d2l always builds all three.
        self.pooled = semantics.nsp_head == "pooler"
        mlm_options: dict[str, Any] = dict(activation=semantics.activation, layer_norm_eps=semantics.layer_norm_eps)
        if semantics.mlm_decoder == "tied":  # original BERT
            mlm_options["tied_embedding"] = self.encoder.token_embedding
        if self.pooled:
            if "pooler" in heads:
                # Framework difference: Gluon fuses the tanh into the Dense (hence hidden.weight); torch stacks
                # Linear and Tanh in a Sequential (hence hidden.0.weight).
                self.hidden = _dense(num_hiddens, num_hiddens, activation="tanh", flatten=True)
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
