"""d2l's BERT written with Flax's NNX API, as its users write one today: the model holds its own
parameters (``nnx.Linear``, ``nnx.Embed``, ``nnx.LayerNorm``, the positions an ``nnx.Param``), dropout is an
``nnx.Dropout`` switched off by ``eval()``, its own names and module order. No bert_multi import.

``build`` is faithful to d2l 1.0; ``build_default_eps`` leaves ``nnx.LayerNorm()`` at Flax's epsilon (1e-6,
where d2l's is 1e-5), the slip a port on Flax's defaults makes; ``build_on_flax_attention`` uses Flax's own
``nnx.MultiHeadAttention`` with a mask from the lengths, whose softmax (``jax.nn.dot_product_attention``'s)
is float32 whatever the dtype."""

import math

import jax
import jax.numpy as jnp
from flax import nnx


class Block(nnx.Module):
    def __init__(self, d, heads, ffn, dropout, eps, rngs):
        self.heads = heads
        self.query, self.key, self.value, self.out = (nnx.Linear(d, d, rngs=rngs) for _ in range(4))
        self.norm1 = nnx.LayerNorm(d, rngs=rngs) if eps is None else nnx.LayerNorm(d, epsilon=eps, rngs=rngs)
        self.up, self.down = nnx.Linear(d, ffn, rngs=rngs), nnx.Linear(ffn, d, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, rngs=rngs) if eps is None else nnx.LayerNorm(d, epsilon=eps, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x, valid_lens):
        b, t, d = x.shape

        def split(y):
            return y.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // self.heads)
        if valid_lens is not None:
            lens = valid_lens.reshape(b, -1)  # (B, 1), or (B, T) with a length per query
            scores = jnp.where(jnp.arange(t)[None, None, None, :] < lens[:, None, :, None], scores, -1e6)
        mixed = self.drop(jax.nn.softmax(scores, axis=-1)) @ v
        x = self.norm1(x + self.drop(self.out(mixed.transpose(0, 2, 1, 3).reshape(b, t, d))))
        return self.norm2(x + self.drop(self.down(jax.nn.relu(self.up(x)))))


class FlaxAttentionBlock(Block):
    def __init__(self, d, heads, ffn, dropout, eps, rngs):
        super().__init__(d, heads, ffn, dropout, eps, rngs)
        del self.query, self.key, self.value, self.out
        self.attention = nnx.MultiHeadAttention(heads, d, decode=False, rngs=rngs)  # no attention dropout

    def __call__(self, x, valid_lens):
        b, t, _ = x.shape
        mask = None
        if valid_lens is not None:
            lens = valid_lens.reshape(b, -1)  # (B, 1), or (B, T) with a length per query
            mask = (jnp.arange(t)[None, None, :] < lens[:, :, None])[:, None, :, :]
        x = self.norm1(
            x + self.drop(self.attention(x, mask=jnp.broadcast_to(mask, (b, 1, t, t)) if mask is not None else None))
        )
        return self.norm2(x + self.drop(self.down(jax.nn.relu(self.up(x)))))


class NnxBERT(nnx.Module):
    def __init__(self, config, eps, rngs, block=Block):
        d = config.num_hiddens
        self.tokens, self.segments = nnx.Embed(config.vocab_size, d, rngs=rngs), nnx.Embed(2, d, rngs=rngs)
        self.positions = nnx.Param(jax.random.normal(rngs.params(), (1, config.max_len, d)))
        self.blocks = nnx.List(
            block(d, config.num_heads, config.ffn_num_hiddens, 0.1, eps, rngs) for _ in range(config.num_blks)
        )
        self.mlm_dense, self.mlm_norm = nnx.Linear(d, d, rngs=rngs), nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
        self.mlm_out = nnx.Linear(d, config.vocab_size, rngs=rngs)
        self.pooler, self.nsp = nnx.Linear(d, d, rngs=rngs), nnx.Linear(d, 2, rngs=rngs)

    def __call__(self, tokens, segments, valid_lens=None, pred_positions=None):
        x = self.tokens(tokens) + self.segments(segments) + self.positions[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x, valid_lens)
        mlm = None
        if pred_positions is not None:
            picked = x[jnp.arange(x.shape[0])[:, None], pred_positions]
            mlm = self.mlm_out(self.mlm_norm(jax.nn.relu(self.mlm_dense(picked))))
        return x, mlm, self.nsp(jnp.tanh(self.pooler(x[:, 0])))


def build(config):
    return NnxBERT(config, 1e-5, nnx.Rngs(0))


def build_default_eps(config):
    return NnxBERT(config, None, nnx.Rngs(0))


def build_on_flax_attention(config):
    return NnxBERT(config, 1e-5, nnx.Rngs(0), FlaxAttentionBlock)
