"""d2l's BERT as a notebook would port it to Flax linen, written from the chapter without bert_multi: the
chapter's class and attribute names, ``setup`` rather than ``nn.compact``, Flax's own defaults where the
notebook did not think to change them (``nn.LayerNorm()``'s epsilon is 1e-6, d2l's 1e-5), the masked-LM
MLP as an ``nn.Sequential``, the positional embedding created before the token embedding, the masked LM
before the pooler, dropout 0.2 and a ``train=True`` default. No bert_multi import."""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn


def masked_softmax(X, valid_lens):
    if valid_lens is None:
        return nn.softmax(X, axis=-1)
    shape = X.shape
    if valid_lens.ndim == 1:
        valid_lens = jnp.repeat(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = X.reshape(-1, shape[-1])
    mask = jnp.arange(shape[-1])[None, :] < valid_lens[:, None]
    return nn.softmax(jnp.where(mask, X, -1e6).reshape(shape), axis=-1)


class MultiHeadAttention(nn.Module):
    num_hiddens: int
    num_heads: int
    dropout: float

    def setup(self):
        self.W_q = nn.Dense(self.num_hiddens)
        self.W_k = nn.Dense(self.num_hiddens)
        self.W_v = nn.Dense(self.num_hiddens)
        self.W_o = nn.Dense(self.num_hiddens)
        self.drop = nn.Dropout(self.dropout)

    def transpose_qkv(self, X):
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1).transpose(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2]).transpose(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)

    def __call__(self, queries, keys, values, valid_lens, train):
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None:
            valid_lens = jnp.repeat(valid_lens, self.num_heads, axis=0)
        scores = queries @ keys.transpose(0, 2, 1) / math.sqrt(queries.shape[-1])
        weights = self.drop(masked_softmax(scores, valid_lens), deterministic=not train)
        return self.W_o(self.transpose_output(weights @ values))


class AddNorm(nn.Module):
    dropout: float

    def setup(self):
        self.ln = nn.LayerNorm()
        self.drop = nn.Dropout(self.dropout)

    def __call__(self, X, Y, train):
        return self.ln(self.drop(Y, deterministic=not train) + X)


class PositionWiseFFN(nn.Module):
    ffn_num_hiddens: int
    ffn_num_outputs: int

    def setup(self):
        self.dense1 = nn.Dense(self.ffn_num_hiddens)
        self.dense2 = nn.Dense(self.ffn_num_outputs)

    def __call__(self, X):
        return self.dense2(nn.relu(self.dense1(X)))


class TransformerEncoderBlock(nn.Module):
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    dropout: float

    def setup(self):
        self.attention = MultiHeadAttention(self.num_hiddens, self.num_heads, self.dropout)
        self.addnorm1 = AddNorm(self.dropout)
        self.ffn = PositionWiseFFN(self.ffn_num_hiddens, self.num_hiddens)
        self.addnorm2 = AddNorm(self.dropout)

    def __call__(self, X, valid_lens, train):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens, train), train)
        return self.addnorm2(Y, self.ffn(Y), train)


class BERTEncoder(nn.Module):
    vocab_size: int
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int
    dropout: float
    max_len: int

    def setup(self):
        self.pos_embedding = self.param(
            "pos_embedding", nn.initializers.normal(1.0), (1, self.max_len, self.num_hiddens)
        )
        self.token_embedding = nn.Embed(self.vocab_size, self.num_hiddens)
        self.segment_embedding = nn.Embed(2, self.num_hiddens)
        self.blks = [
            TransformerEncoderBlock(self.num_hiddens, self.ffn_num_hiddens, self.num_heads, self.dropout)
            for _ in range(self.num_blks)
        ]

    def __call__(self, tokens, segments, valid_lens, train):
        X = self.token_embedding(tokens) + self.segment_embedding(segments)
        X = X + self.pos_embedding[:, : X.shape[1], :]
        for blk in self.blks:
            X = blk(X, valid_lens, train)
        return X


class MaskLM(nn.Module):
    vocab_size: int
    num_hiddens: int

    def setup(self):
        self.mlp = nn.Sequential([nn.Dense(self.num_hiddens), nn.relu, nn.LayerNorm(), nn.Dense(self.vocab_size)])

    def __call__(self, X, pred_positions):
        num_pred_positions = pred_positions.shape[1]
        pred_positions = pred_positions.reshape(-1)
        batch_idx = jnp.repeat(jnp.arange(X.shape[0]), num_pred_positions)
        masked_X = X[batch_idx, pred_positions].reshape(X.shape[0], num_pred_positions, -1)
        return self.mlp(masked_X)


class NextSentencePred(nn.Module):
    def setup(self):
        self.dense = nn.Dense(2)

    def __call__(self, X):
        return self.dense(X)


class BERTModel(nn.Module):
    vocab_size: int
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int
    dropout: float
    max_len: int = 1000

    def setup(self):
        self.encoder = BERTEncoder(self.vocab_size, self.num_hiddens, self.ffn_num_hiddens, self.num_heads,
                                   self.num_blks, self.dropout, self.max_len)  # fmt: skip
        self.mlm = MaskLM(self.vocab_size, self.num_hiddens)
        self.hidden = nn.Dense(self.num_hiddens)
        self.nsp = NextSentencePred()

    def __call__(self, tokens, segments, valid_lens=None, pred_positions=None, train=True):
        encoded_X = self.encoder(tokens, segments, valid_lens, train)
        mlm_Y_hat = self.mlm(encoded_X, pred_positions) if pred_positions is not None else None
        nsp_Y_hat = self.nsp(jnp.tanh(self.hidden(encoded_X[:, 0, :])))
        return encoded_X, mlm_Y_hat, nsp_Y_hat


def build(config):
    """The notebook's model and the variables its ``init`` made (dropout 0.2, as the chapter's run)."""
    model = BERTModel(config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads,
                      config.num_blks, 0.2, config.max_len)  # fmt: skip
    tokens = jnp.zeros((2, 8), dtype=jnp.int32)
    keys = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    return model, model.init(keys, tokens, tokens, jnp.array([8, 6]), jnp.zeros((2, 1), dtype=jnp.int32))
