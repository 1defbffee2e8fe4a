"""A "BERT from scratch" repository as such repositories are written, with their names and module order:
pre-LN sublayers, their own LayerNorm (the unbiased standard deviation, eps 1e-6 added to it), the tanh
GELU written out, a fixed sinusoidal position buffer, a 3-row segment table whose row 0 is padding
(segments 1 and 2), a mask made from token id 0, -1e9 for masked scores, no pooler and no masked-LM
transform, log-probabilities out. ``build`` wraps it in the thin adapter a user writes to give it d2l's
call. No bert_multi import."""

import math

import torch
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class PositionalEmbedding(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        pe = torch.zeros(max_len, d_model).float()
        position = torch.arange(0, max_len).float().unsqueeze(1)
        div_term = (torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model)).exp()
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.pe[:, : x.size(1)]


class BERTEmbedding(nn.Module):
    def __init__(self, vocab_size, embed_size, max_len):
        super().__init__()
        self.token = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.position = PositionalEmbedding(embed_size, max_len)
        self.segment = nn.Embedding(3, embed_size, padding_idx=0)

    def forward(self, sequence, segment_label):
        return self.token(sequence) + self.position(sequence) + self.segment(segment_label)


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linear_layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.output_linear = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        batch_size = query.size(0)
        query, key, value = [
            layer(x).view(batch_size, -1, self.h, self.d_k).transpose(1, 2)
            for layer, x in zip(self.linear_layers, (query, key, value))
        ]
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        x = torch.matmul(scores.softmax(dim=-1), value)
        return self.output_linear(x.transpose(1, 2).contiguous().view(batch_size, -1, self.h * self.d_k))


class SublayerConnection(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.norm = LayerNorm(size)

    def forward(self, x, sublayer):
        return x + sublayer(self.norm(x))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_1, self.w_2, self.activation = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), GELU()

    def forward(self, x):
        return self.w_2(self.activation(self.w_1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, hidden, attn_heads, feed_forward_hidden):
        super().__init__()
        self.attention = MultiHeadedAttention(attn_heads, hidden)
        self.feed_forward = PositionwiseFeedForward(hidden, feed_forward_hidden)
        self.input_sublayer = SublayerConnection(hidden)
        self.output_sublayer = SublayerConnection(hidden)

    def forward(self, x, mask):
        x = self.input_sublayer(x, lambda _x: self.attention(_x, _x, _x, mask=mask))
        return self.output_sublayer(x, self.feed_forward)


class BERT(nn.Module):
    def __init__(self, vocab_size, hidden=768, n_layers=12, attn_heads=12, ff=3072, max_len=512):
        super().__init__()
        self.embedding = BERTEmbedding(vocab_size, hidden, max_len)
        self.transformer_blocks = nn.ModuleList([TransformerBlock(hidden, attn_heads, ff) for _ in range(n_layers)])

    def forward(self, x, segment_info):
        mask = (x > 0).unsqueeze(1).repeat(1, x.size(1), 1).unsqueeze(1)
        x = self.embedding(x, segment_info)
        for transformer in self.transformer_blocks:
            x = transformer.forward(x, mask)
        return x


class BERTLM(nn.Module):
    def __init__(self, bert, vocab_size):
        super().__init__()
        self.bert = bert
        self.next_sentence = nn.Linear(bert.embedding.token.embedding_dim, 2)
        self.mask_lm = nn.Linear(bert.embedding.token.embedding_dim, vocab_size)

    def forward(self, x, segment_label):
        x = self.bert(x, segment_label)
        return x, self.next_sentence(x[:, 0]).log_softmax(-1), self.mask_lm(x).log_softmax(-1)


class Adapter(nn.Module):
    """d2l's call: segments 0/1 are the repository's 1/2; the masked LM read at ``pred_positions``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        encoded, nsp, mlm = self.model(tokens, segments + 1)
        if pred_positions is not None:
            mlm = mlm[torch.arange(tokens.shape[0])[:, None], pred_positions]
        else:
            mlm = None
        return encoded, mlm, nsp


def build(config):
    bert = BERT(
        config.vocab_size, config.num_hiddens, config.num_blks, config.num_heads, config.ffn_num_hiddens,
        config.max_len,
    )  # fmt: skip
    return Adapter(BERTLM(bert, config.vocab_size))
