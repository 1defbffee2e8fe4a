"""A "BERT from scratch" in Gluon, written as such notebooks are: pre-norm blocks (``x + sublayer(norm(x))``,
no LayerNorm at the end), Gluon's ``nn.LayerNorm(epsilon=1e-6)``, the tanh GELU written out, a fixed
sinusoidal table for the positions (a constant, no parameter), attention written out with the heads split
by hand, and no pooler, masked-LM transform or NSP head. Its own names and module order, deferred shapes.
No bert_multi import."""

import math

import numpy as onp
from mxnet import np, npx
from mxnet.gluon import nn

npx.set_np()


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


class Attention(nn.Block):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Dense(width, flatten=False) for _ in range(3))
        self.o = nn.Dense(width, flatten=False)

    def forward(self, x, lens):
        b, t, w = x.shape

        def split(y):
            return y.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = np.matmul(q, k.transpose(0, 1, 3, 2)) / math.sqrt(w // self.heads)
        if lens is not None:
            keep = (np.arange(t, dtype=lens.dtype)[None, :] < lens[:, None]).astype(x.dtype)[:, None, None, :]
            scores = scores * keep - 1e6 * (1 - keep)
        mixed = np.matmul(npx.softmax(scores), v)
        return self.o(mixed.transpose(0, 2, 1, 3).reshape(b, t, w))


class Block(nn.Block):
    def __init__(self, width, heads, hidden):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(epsilon=1e-6), Attention(width, heads)
        self.ln2 = nn.LayerNorm(epsilon=1e-6)
        self.fc1, self.fc2 = nn.Dense(hidden, flatten=False), nn.Dense(width, flatten=False)

    def forward(self, x, lens):
        x = x + self.attn(self.ln1(x), lens)
        return x + self.fc2(gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Block):
    def __init__(self, vocab, width, heads, hidden, depth, max_len):
        super().__init__()
        angles = onp.arange(max_len)[:, None] / 10000 ** (onp.arange(0, width, 2) / width)
        self.table = onp.zeros((max_len, width))
        self.table[:, 0::2], self.table[:, 1::2] = onp.sin(angles), onp.cos(angles)
        self.tok, self.seg = nn.Embedding(vocab, width), nn.Embedding(2, width)
        self.blocks = nn.Sequential()
        for _ in range(depth):
            self.blocks.add(Block(width, heads, hidden))

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        x = self.tok(tokens) + self.seg(segments)
        x = x + np.array(self.table[: tokens.shape[1]], dtype=x.dtype, ctx=x.ctx)
        for block in self.blocks:
            x = block(x, valid_lens)
        return x, None, None


def build(config):
    return Encoder(
        config.vocab_size, config.num_hiddens, config.num_heads, config.ffn_num_hiddens, config.num_blks,
        config.max_len,
    )  # fmt: skip
