"""A "BERT from scratch" in Flax, written as such notebooks are: pre-norm blocks (``x + sublayer(norm(x))``,
no LayerNorm at the end), ``nn.LayerNorm()`` with its own epsilon (1e-6), ``nn.gelu``'s tanh approximation,
a fixed sinusoidal table for the positions, attention written out with the heads split by hand, and no
pooler, masked-LM transform or NSP head. Its own names and module order. No bert_multi import. The factory
returns the module and the variables ``init`` made."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn


def sinusoids(length, width):
    angles = np.arange(length)[:, None] / 10000 ** (np.arange(0, width, 2) / width)
    table = np.zeros((length, width))
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return jnp.asarray(table)


class Attention(nn.Module):
    width: int
    heads: int

    @nn.compact
    def __call__(self, x, keep):
        b, t, _ = x.shape

        def heads(y):
            return y.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = (heads(nn.Dense(self.width, name=name)(x)) for name in ("q", "k", "v"))
        scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1])
        if keep is not None:
            scores = jnp.where(keep[:, None, None, :], scores, -1e6)
        mixed = jax.nn.softmax(scores, axis=-1) @ v
        return nn.Dense(self.width, name="o")(mixed.transpose(0, 2, 1, 3).reshape(b, t, -1))


class Block(nn.Module):
    width: int
    heads: int
    hidden: int

    @nn.compact
    def __call__(self, x, keep):
        x = x + Attention(self.width, self.heads, name="attn")(nn.LayerNorm(name="ln1")(x), keep)
        h = nn.LayerNorm(name="ln2")(x)
        return x + nn.Dense(self.width, name="fc2")(nn.gelu(nn.Dense(self.hidden, name="fc1")(h)))


class Encoder(nn.Module):
    vocab: int
    width: int
    heads: int
    hidden: int
    depth: int
    max_len: int

    @nn.compact
    def __call__(self, tokens, segments, valid_lens=None, pred_positions=None):
        t = tokens.shape[1]
        x = nn.Embed(self.vocab, self.width, name="tok")(tokens) + nn.Embed(2, self.width, name="seg")(segments)
        x = x + sinusoids(self.max_len, self.width)[:t].astype(x.dtype)
        keep = None if valid_lens is None else jnp.arange(t)[None, :] < valid_lens[:, None]
        for i in range(self.depth):
            x = Block(self.width, self.heads, self.hidden, name=f"block{i}")(x, keep)
        return x, None, None


def build(config):
    """The module and its variables, at ``config``'s sizes."""
    module = Encoder(
        config.vocab_size, config.num_hiddens, config.num_heads, config.ffn_num_hiddens, config.num_blks,
        config.max_len,
    )  # fmt: skip
    tokens = jnp.zeros((1, 4), dtype=jnp.int32)
    return module, module.init(jax.random.key(0), tokens, tokens, jnp.array([4]))
