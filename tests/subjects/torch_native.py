"""A BERT written the way most PyTorch users write one, from torch's own blocks: an nn.TransformerEncoder of
nn.TransformerEncoderLayer (post-norm, ReLU, eps 1e-5: d2l's maths), fed a key-padding mask made from the
lengths, with its own names and module order. No bert_multi import. In inference PyTorch's fast path
returns zeros at padded positions (nested tensors, where the number of heads is even), and its
key-padding mask gives a row with no valid key no attention at all: the two real differences from d2l.
``norm_first=True``: the pre-norm layers most BERT-like models built on these blocks use now."""

import torch
from torch import nn


class BertNative(nn.Module):
    def __init__(self, vocab_size, d_model=768, nhead=12, num_layers=12, dim_ff=3072, max_len=512, dropout=0.1,
                 norm_first=False):  # fmt: skip
        super().__init__()
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.seg_embed = nn.Embedding(2, d_model)
        self.pos_embed = nn.Parameter(torch.randn(1, max_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_ff, dropout, activation="relu", batch_first=True, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.pooler = nn.Sequential(nn.Linear(d_model, d_model), nn.Tanh())
        self.mlm_head = nn.Sequential(
            nn.Linear(d_model, d_model), nn.ReLU(), nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size)
        )
        self.nsp_head = nn.Linear(d_model, 2)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        T = tokens.shape[1]
        x = self.tok_embed(tokens) + self.seg_embed(segments) + self.pos_embed[:, :T]
        mask = None
        if valid_lens is not None:
            mask = torch.arange(T, device=tokens.device)[None, :] >= valid_lens[:, None]
        x = self.encoder(x, src_key_padding_mask=mask)
        mlm = None
        if pred_positions is not None:
            rows = torch.arange(x.shape[0], device=x.device)[:, None]
            mlm = self.mlm_head(x[rows, pred_positions])
        return x, mlm, self.nsp_head(self.pooler(x[:, 0]))


def build(config, norm_first=False):
    return BertNative(
        config.vocab_size, config.num_hiddens, config.num_heads, config.num_blks, config.ffn_num_hiddens,
        config.max_len, config.dropout, norm_first,
    )  # fmt: skip
