"""A BERT as a tutorial writes one, with its slips: the attention's output projection and the first
LayerNorm are built inside ``forward``, so each call makes fresh random layers (float32, on the CPU) that
are no parameters of the model; the FFN has no residual connection and no LayerNorm around it. Its own
names and module order. No bert_multi import."""

import math

import torch
from torch import nn
from torch.nn import functional as F


class MultiHeadAttention(nn.Module):
    def __init__(self, heads, d_model):
        super().__init__()
        self.heads, self.d_model = heads, d_model
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e6)
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, self.d_model)
        return nn.Linear(self.d_model, self.d_model)(context)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.d_model = d_model
        self.attn = MultiHeadAttention(heads, d_model)
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x, mask):
        x = nn.LayerNorm(self.d_model)(x + self.attn(x, mask))
        return self.ff2(F.relu(self.ff1(x)))


class TutorialBERT(nn.Module):
    def __init__(self, vocab_size, d_model, heads, d_ff, n_layers, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.seg = nn.Embedding(2, d_model)
        self.pos = nn.Parameter(torch.randn(1, max_len, d_model))
        self.layers = nn.ModuleList([EncoderLayer(d_model, heads, d_ff) for _ in range(n_layers)])

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.seg(segments) + self.pos[:, :t]
        mask = None
        if valid_lens is not None:
            mask = (torch.arange(t)[None, :] < valid_lens[:, None])[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x, None, None


def build(config):
    return TutorialBERT(
        config.vocab_size, config.num_hiddens, config.num_heads, config.ffn_num_hiddens, config.num_blks,
        config.max_len,
    )  # fmt: skip
