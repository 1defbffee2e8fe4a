"""d2l's BERT as a PyTorch user writes it with today's idioms: one fused projection for the queries, keys
and values (``nn.Linear(d, 3 * d)``, split by a view), ``F.scaled_dot_product_attention`` with a mask made
the usual way, the positions an ``nn.Embedding``, its own names. No bert_multi import.

``mask="additive"`` adds -1e6 to the masked scores (a float mask, as most ports pass one); ``mask="boolean"``
passes where to attend, and PyTorch gives a row with nothing to attend to no attention at all. Either way a
row whose every key is masked differs from d2l's, which attends to every key alike; and a mask of one
length per sequence cannot take a length per query."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, h, f, mask):
        super().__init__()
        self.h, self.mask = h, mask
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, f), nn.ReLU(), nn.Linear(f, d))
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x, lens):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        mask = None
        if lens is not None:
            keep = (torch.arange(t, device=x.device)[None, :] < lens[:, None])[:, None, None, :]
            mask = keep if self.mask == "boolean" else torch.where(keep, 0.0, -1e6).to(x.dtype)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.norm1(x + self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return self.norm2(x + self.mlp(x))


class FusedBERT(nn.Module):
    def __init__(self, config, mask):
        super().__init__()
        d = config.num_hiddens
        self.tok, self.seg = nn.Embedding(config.vocab_size, d), nn.Embedding(2, d)
        self.pos = nn.Embedding(config.max_len, d)
        self.blocks = nn.ModuleList(
            Block(d, config.num_heads, config.ffn_num_hiddens, mask) for _ in range(config.num_blks)
        )
        self.mlm = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.LayerNorm(d), nn.Linear(d, config.vocab_size))
        self.pool = nn.Sequential(nn.Linear(d, d), nn.Tanh())
        self.nsp = nn.Linear(d, 2)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.seg(segments) + self.pos(positions)[None]
        for block in self.blocks:
            x = block(x, valid_lens)
        mlm = None
        if pred_positions is not None:
            mlm = self.mlm(x[torch.arange(x.shape[0], device=x.device)[:, None], pred_positions])
        return x, mlm, self.nsp(self.pool(x[:, 0]))


def build(config, mask="additive"):
    return FusedBERT(config, mask)
