"""An original BERT written the way Flax users write one, from Flax's own blocks and defaults: an
``nn.MultiHeadDotProductAttention`` (its query, key, value and out kernels keep the heads as an axis of
their own), ``nn.LayerNorm()`` (eps 1e-6), ``nn.gelu`` (the tanh approximation), a mask from
``nn.make_attention_mask``, the decoder tied to the word embedding through ``attend``. No bert_multi
import. The factory returns the module and the variables ``init`` made. Against the original BERT its
differences are Flax's defaults: every LayerNorm's epsilon, and the approximate GELU."""

import jax
import jax.numpy as jnp
from flax import linen as nn


class Block(nn.Module):
    heads: int
    hidden: int
    ffn: int

    @nn.compact
    def __call__(self, x, mask):
        y = nn.MultiHeadDotProductAttention(num_heads=self.heads, deterministic=True)(x, mask=mask)
        x = nn.LayerNorm()(x + y)
        h = nn.Dense(self.hidden)(nn.gelu(nn.Dense(self.ffn)(x)))
        return nn.LayerNorm()(x + h)


class FlaxBert(nn.Module):
    vocab: int
    hidden: int
    heads: int
    ffn: int
    layers: int
    max_len: int

    @nn.compact
    def __call__(self, tokens, segments, valid_lens=None, pred_positions=None):
        T = tokens.shape[1]
        words = nn.Embed(self.vocab, self.hidden)
        x = words(tokens) + nn.Embed(2, self.hidden)(segments)
        x = nn.LayerNorm()(x + nn.Embed(self.max_len, self.hidden)(jnp.arange(T))[None])
        mask = None
        if valid_lens is not None:
            keep = jnp.arange(T)[None, :] < valid_lens[:, None]
            mask = nn.make_attention_mask(jnp.ones_like(tokens, bool), keep)
        for _ in range(self.layers):
            x = Block(self.heads, self.hidden, self.ffn)(x, mask)
        mlm = None
        if pred_positions is not None:
            picked = x[jnp.arange(x.shape[0])[:, None], pred_positions]
            transformed = nn.LayerNorm(name="mlm_norm")(nn.gelu(nn.Dense(self.hidden, name="mlm_dense")(picked)))
            mlm = words.attend(transformed)
            mlm = mlm + self.param("mlm_bias", nn.initializers.zeros, (self.vocab,))
        pooled = jnp.tanh(nn.Dense(self.hidden, name="pooler")(x[:, 0]))
        return x, mlm, nn.Dense(2, name="nsp")(pooled)


def build(config):
    """The module and its variables, at ``config``'s sizes."""
    module = FlaxBert(
        config.vocab_size, config.num_hiddens, config.num_heads, config.ffn_num_hiddens, config.num_blks,
        config.max_len,
    )  # fmt: skip
    tokens = jnp.zeros((1, 4), dtype=jnp.int32)
    return module, module.init(jax.random.key(0), tokens, tokens, jnp.array([4]), tokens[:, :1])
