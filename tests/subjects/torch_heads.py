"""A user's PyTorch port whose heads are one module each (``lm``, ``pooler``, ``classifier``), run in its own
order (the NSP classifier before the masked LM), no bert_multi import. ``temperature`` divides the masked
LM's logits, as a port tuned for sampling does: a mistake no catalogue knows, in a head whose first dense
layer only the oracle can tell from the pooler's."""

import torch
from subjects.torch_port import Layer
from torch import nn


class HeadsBERT(nn.Module):
    def __init__(self, vocab, hidden, ffn, heads, layers, max_len, temperature=1.0):
        super().__init__()
        self.temperature = temperature
        self.word = nn.Embedding(vocab, hidden)
        self.segment = nn.Embedding(2, hidden)
        self.position = nn.Parameter(torch.randn(1, max_len, hidden))
        self.blocks = nn.ModuleList(Layer(hidden, ffn, heads) for _ in range(layers))
        self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        self.classifier = nn.Linear(hidden, 2)
        self.lm = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.LayerNorm(hidden), nn.Linear(hidden, vocab))

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        x = self.word(tokens) + self.segment(segments) + self.position[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x, valid_lens)
        nsp = self.classifier(self.pooler(x[:, 0]))
        mlm = None
        if pred_positions is not None:
            picked = x[torch.arange(x.shape[0])[:, None], pred_positions]
            mlm = self.lm(picked) / self.temperature
        return x, mlm, nsp


def build(config, temperature=1.0):
    return HeadsBERT(
        config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks,
        config.max_len, temperature,
    )  # fmt: skip
