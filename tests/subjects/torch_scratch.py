"""A "BERT from scratch" as tutorials write one: d2l's maths in its own classes, but no pooler, no NSP
classifier and no masked-LM transform (the encoding goes straight to the vocabulary), and a mask that
takes one length per sequence only. No bert_multi import. ``float32_only``: a model that refuses any other
dtype, as one whose code fixes it."""

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, lens):
        b, t, d = x.shape

        def split(y):
            return y.view(b, t, self.h, d // self.h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        s = q @ k.transpose(-1, -2) / math.sqrt(d // self.h)
        if lens is not None:
            s = s.masked_fill(torch.arange(t)[None, None, None, :] >= lens[:, None, None, None], -1e6)
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class Layer(nn.Module):
    def __init__(self, d, h, f):
        super().__init__()
        self.attn, self.ln1 = Attention(d, h), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, f), nn.ReLU(), nn.Linear(f, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x, lens):
        x = self.ln1(x + self.attn(x, lens))
        return self.ln2(x + self.ff(x))


class ScratchBERT(nn.Module):
    def __init__(self, vocab, d, h, f, n, max_len, float32_only=False):
        super().__init__()
        self.word, self.segment = nn.Embedding(vocab, d), nn.Embedding(2, d)
        self.position = nn.Parameter(torch.zeros(1, max_len, d))
        self.layers = nn.ModuleList(Layer(d, h, f) for _ in range(n))
        self.lm = nn.Linear(d, vocab)  # straight to the vocabulary
        self.float32_only = float32_only

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        x = self.word(tokens) + self.segment(segments) + self.position[:, : tokens.shape[1]]
        if self.float32_only and x.dtype != torch.float32:
            raise TypeError(f"this model computes in float32, not {x.dtype}")
        if valid_lens is not None and valid_lens.dim() == 2:
            raise ValueError("per-query lengths are not supported")
        for layer in self.layers:
            x = layer(x, valid_lens)
        mlm = None if pred_positions is None else self.lm(x[torch.arange(x.shape[0])[:, None], pred_positions])
        return x, mlm, None


def build(config, float32_only=False):
    return ScratchBERT(config.vocab_size, config.num_hiddens, config.num_heads, config.ffn_num_hiddens,
                       config.num_blks, config.max_len, float32_only)  # fmt: skip
