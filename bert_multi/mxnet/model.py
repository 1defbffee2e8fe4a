"""d2l 1.0's BERT in MXNet/Gluon (NumPy mode), class for class.

Read it beside ``bert_multi/torch/model.py``: the two files have the same functions and classes in the
same order, and a comment starting "Framework difference" marks each place where they must differ.
Constructor signatures are d2l's, so code written for ``from d2l import mxnet as d2l`` keeps working.
One addition: an optional ``num_inputs`` on the layers whose shapes Gluon would defer. ``BERTModel``
passes it, so its parameters exist as soon as it is initialised and weights load before any forward.
"""

from __future__ import annotations

import math

from mxnet import np, npx
from mxnet.gluon import nn

npx.set_np()  # Gluon on mxnet.np arrays, as d2l does


def _dense(
    num_outputs: int,
    num_inputs: int | None = None,
    bias: bool = True,
    activation: str | None = None,
    flatten: bool = False,
) -> nn.Block:
    # Framework difference: Gluon's Dense infers its input width on the first forward when in_units=0
    # (deferred initialisation); torch needs the width up front or a Lazy layer. Gluon's Dense also
    # flattens its input to 2-D by default, so sequence layers pass flatten=False.
    return nn.Dense(num_outputs, activation=activation, use_bias=bias, flatten=flatten, in_units=num_inputs or 0)


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
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = _dense(num_hiddens, num_inputs, use_bias)
        self.W_k = _dense(num_hiddens, num_inputs, use_bias)
        self.W_v = _dense(num_hiddens, num_inputs, use_bias)
        self.W_o = _dense(num_hiddens, num_hiddens, use_bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None:
            # Interleaved (b0, b0, ..., b1, b1, ...) to match the head layout of transpose_qkv.
            valid_lens = valid_lens.repeat(self.num_heads, axis=0)
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
    """Dense -> ReLU -> Dense, applied at every position."""

    def __init__(self, ffn_num_hiddens: int, ffn_num_outputs: int, num_inputs: int | None = None) -> None:
        super().__init__()
        # Framework difference: Gluon fuses the ReLU into dense1; torch keeps it as its own module.
        self.dense1 = _dense(ffn_num_hiddens, num_inputs, activation="relu")
        self.dense2 = _dense(ffn_num_outputs, ffn_num_hiddens)

    def forward(self, X):
        return self.dense2(self.dense1(X))


class AddNorm(nn.Block):
    """Residual connection, then LayerNorm (post-LN): LN(dropout(Y) + X)."""

    def __init__(self, dropout: float, num_inputs: int | None = None) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        # Framework difference: Gluon's LayerNorm infers the normalised width (in_channels=0) and names
        # its parameters gamma/beta; torch's needs the shape and calls them weight/bias. Both eps=1e-5.
        self.ln = nn.LayerNorm(in_channels=num_inputs or 0)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class TransformerEncoderBlock(nn.Block):
    """Y = AddNorm(X, MHA(X, X, X)); out = AddNorm(Y, FFN(Y))."""

    def __init__(
        self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, dropout: float, use_bias: bool = False
    ) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(num_hiddens, num_heads, dropout, use_bias, num_inputs=num_hiddens)
        self.addnorm1 = AddNorm(dropout, num_inputs=num_hiddens)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens, num_inputs=num_hiddens)
        self.addnorm2 = AddNorm(dropout, num_inputs=num_hiddens)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class BERTEncoder(nn.Block):
    """Token + segment + learned positional embeddings, then ``num_blks`` encoder blocks."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        max_len: int = 1000,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.token_embedding = nn.Embedding(vocab_size, num_hiddens)
        self.segment_embedding = nn.Embedding(2, num_hiddens)
        self.blks = nn.Sequential()
        for _ in range(num_blks):
            # BERT's encoder asks for bias in attention, though d2l's attention defaults to none.
            self.blks.add(TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, True))
        # Framework difference: a bare learnable tensor is a Parameter from self.params.get in Gluon and
        # an nn.Parameter attribute in torch.
        self.pos_embedding = self.params.get("pos_embedding", shape=(1, max_len, num_hiddens))

    def forward(self, tokens, segments, valid_lens):
        X = self.token_embedding(tokens) + self.segment_embedding(segments)
        # Framework difference: a Gluon Parameter holds one copy per context; .data(ctx) picks X's.
        X = X + self.pos_embedding.data(ctx=X.ctx)[:, : X.shape[1], :]
        for blk in self.blks:
            X = blk(X, valid_lens)
        return X


class MaskLM(nn.Block):
    """Masked-LM head: gather the encodings at pred_positions, then Dense -> ReLU -> LayerNorm -> Dense(V)."""

    def __init__(self, vocab_size: int, num_hiddens: int, num_inputs: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.mlp = nn.Sequential()
        self.mlp.add(_dense(num_hiddens, num_inputs, activation="relu"))
        self.mlp.add(nn.LayerNorm(in_channels=num_hiddens))
        self.mlp.add(_dense(vocab_size, num_hiddens))

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


class BERTModel(nn.Block):
    """Encoder, pooler and both pretraining heads; returns (encoded_X, mlm_Y_hat or None, nsp_Y_hat)."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_blks: int,
        dropout: float,
        max_len: int = 1000,
    ) -> None:
        super().__init__()
        self.encoder = BERTEncoder(
            vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout, max_len=max_len
        )
        # Framework difference: Gluon fuses the tanh into the Dense (hence hidden.weight); torch stacks
        # Linear and Tanh in a Sequential (hence hidden.0.weight).
        self.hidden = _dense(num_hiddens, num_hiddens, activation="tanh", flatten=True)
        self.mlm = MaskLM(vocab_size, num_hiddens, num_inputs=num_hiddens)
        self.nsp = NextSentencePred(num_inputs=num_hiddens)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        encoded_X = self.encoder(tokens, segments, valid_lens)
        if pred_positions is not None:
            mlm_Y_hat = self.mlm(encoded_X, pred_positions)
        else:
            mlm_Y_hat = None
        # The pooler reads position 0, the <cls> token.
        nsp_Y_hat = self.nsp(self.hidden(encoded_X[:, 0, :]))
        return encoded_X, mlm_Y_hat, nsp_Y_hat
