"""A user's Flax port of d2l 1.0's BERT, written with ``nn.compact`` and its own names, with no bert_multi
import. The factories return the module and the variables ``init`` made. ``fault`` plants a bug."""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn


@jax.custom_vjp
def passing_relu(x):
    """ReLU with a hand-written backward that forgets to zero the gradient where the input was negative."""
    return jnp.maximum(x, 0)


passing_relu.defvjp(lambda x: (jnp.maximum(x, 0), None), lambda _, grad: (grad,))


class SelfAttention(nn.Module):
    hidden: int
    heads: int
    fault: str | None = None

    @nn.compact
    def __call__(self, x, valid_lens):
        b, t, h = x.shape

        def split(y):
            return y.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = (split(nn.Dense(self.hidden, name=name)(x)) for name in ("query", "key", "value"))
        scale = math.sqrt(h if self.fault == "scale" else h // self.heads)
        scores = q @ k.transpose(0, 1, 3, 2) / scale
        if valid_lens is not None:
            lens = valid_lens.reshape(b, -1)  # (B, 1), or (B, T) with a length per query
            keep = jnp.arange(t)[None, None, None, :] < lens[:, None, :, None]
            scores = jnp.where(keep, scores, -1e6)
        mixed = jax.nn.softmax(scores, axis=-1) @ v
        return nn.Dense(self.hidden, name="out")(mixed.transpose(0, 2, 1, 3).reshape(b, t, h))


class Layer(nn.Module):
    hidden: int
    ffn: int
    heads: int
    fault: str | None = None

    @nn.compact
    def __call__(self, x, valid_lens):
        attended = SelfAttention(self.hidden, self.heads, self.fault, name="attn")(x, valid_lens)
        y = nn.LayerNorm(epsilon=1e-5, name="norm1")(x + attended)
        relu = passing_relu if self.fault == "relu_backward" else nn.relu
        up = relu(nn.Dense(self.ffn, name="up")(y))
        return nn.LayerNorm(epsilon=1e-5, name="norm2")(y + nn.Dense(self.hidden, name="down")(up))


class MyBERT(nn.Module):
    vocab: int
    hidden: int
    ffn: int
    heads: int
    layers: int
    max_len: int
    fault: str | None = None

    @nn.compact
    def __call__(self, tokens, segments, valid_lens=None, pred_positions=None, training=False):
        positions = self.param("positions", nn.initializers.normal(1.0), (1, self.max_len, self.hidden))
        x = nn.Embed(self.vocab, self.hidden, name="tokens")(tokens)
        x = x + nn.Embed(2, self.hidden, name="segments")(segments)
        x = x + positions[:, : tokens.shape[1], :]
        for index in range(self.layers):
            x = Layer(self.hidden, self.ffn, self.heads, self.fault, name=f"layer{index}")(x, valid_lens)
        pooled = jnp.tanh(nn.Dense(self.hidden, name="pool")(x[:, 0, :]))
        mlm = None
        if pred_positions is not None:
            b, p = pred_positions.shape
            picked = x[jnp.repeat(jnp.arange(b), p), pred_positions.reshape(-1)].reshape(b, p, -1)
            hidden = nn.relu(nn.Dense(self.hidden, name="mlm_hidden")(picked))
            mlm = nn.Dense(self.vocab, name="mlm_out")(nn.LayerNorm(epsilon=1e-5, name="mlm_norm")(hidden))
        return x, mlm, nn.Dense(2, name="nsp_out")(pooled)


def _made(config, fault=None):
    module = MyBERT(config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks,
                    config.max_len, fault)  # fmt: skip
    tokens = jnp.zeros((1, 4), dtype=jnp.int32)
    return module, module.init(jax.random.key(0), tokens, tokens, jnp.array([4]), jnp.zeros((1, 1), dtype=jnp.int32))


def build(config):
    return _made(config)


def build_bound(config):
    module, variables = _made(config)
    return module.bind(variables)


def build_faulty(config):
    return _made(config, fault="scale")


def build_wrong_backward(config):
    return _made(config, fault="relu_backward")
