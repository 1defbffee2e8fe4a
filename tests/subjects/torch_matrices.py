"""d2l's BERT in PyTorch as someone would write it from the maths rather than from the book: the attention's
projections are bare matrices stored (in, out), as ``x W`` is written on paper, the keys are computed
before the queries, and nothing is named as d2l names it. No bert_multi import."""

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, hidden, heads, full_width=False):
        super().__init__()
        self.heads, self.full_width = heads, full_width
        self.wk, self.bk = nn.Parameter(torch.randn(hidden, hidden)), nn.Parameter(torch.zeros(hidden))
        self.wq, self.bq = nn.Parameter(torch.randn(hidden, hidden)), nn.Parameter(torch.zeros(hidden))
        self.wv, self.bv = nn.Parameter(torch.randn(hidden, hidden)), nn.Parameter(torch.zeros(hidden))
        self.wo, self.bo = nn.Parameter(torch.randn(hidden, hidden)), nn.Parameter(torch.zeros(hidden))

    def heads_of(self, x):
        b, t, h = x.shape
        return x.reshape(b, t, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x, valid_lens):
        k = self.heads_of(x @ self.wk + self.bk)
        q = self.heads_of(x @ self.wq + self.bq)
        v = self.heads_of(x @ self.wv + self.bv)
        scores = q @ k.transpose(-1, -2) / math.sqrt(x.shape[-1] if self.full_width else q.shape[-1])
        if valid_lens is not None:
            lens = valid_lens.reshape(scores.shape[0], -1)[:, None, :].expand(-1, self.heads, -1)
            keep = torch.arange(scores.shape[-1]) < lens[..., None]
            scores = scores.masked_fill(~keep, -1e6)
        mixed = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(x.shape)
        return mixed @ self.wo + self.bo


class Block(nn.Module):
    def __init__(self, hidden, ffn, heads, full_width=False):
        super().__init__()
        self.attention = Attention(hidden, heads, full_width)
        self.first_norm = nn.LayerNorm(hidden)
        self.expand, self.contract = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.second_norm = nn.LayerNorm(hidden)

    def forward(self, x, valid_lens):
        y = self.first_norm(x + self.attention(x, valid_lens))
        return self.second_norm(y + self.contract(torch.relu(self.expand(y))))


class Encoder(nn.Module):
    def __init__(self, vocab, hidden, ffn, heads, blocks, max_len, full_width=False):
        super().__init__()
        self.words = nn.Embedding(vocab, hidden)
        self.sentences = nn.Embedding(2, hidden)
        self.where = nn.Parameter(torch.randn(1, max_len, hidden))
        self.blocks = nn.ModuleList(Block(hidden, ffn, heads, full_width) for _ in range(blocks))
        self.classify_transform = nn.Linear(hidden, hidden)
        self.classify_norm = nn.LayerNorm(hidden)
        self.classify_words = nn.Linear(hidden, vocab)
        self.pool = nn.Linear(hidden, hidden)
        self.next_sentence = nn.Linear(hidden, 2)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        x = self.words(tokens) + self.sentences(segments) + self.where[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x, valid_lens)
        mlm = None
        if pred_positions is not None:
            picked = x[torch.arange(x.shape[0])[:, None], pred_positions]
            mlm = self.classify_words(self.classify_norm(torch.relu(self.classify_transform(picked))))
        return x, mlm, self.next_sentence(torch.tanh(self.pool(x[:, 0])))


def build(config, full_width=False):
    return Encoder(config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks,
                   config.max_len, full_width)  # fmt: skip


def build_faulty(config):
    """The scores divided by the square root of the full width, not a head's."""
    return build(config, full_width=True)
