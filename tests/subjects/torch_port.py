"""A user's PyTorch port of d2l 1.0's BERT, written the way users write them: its own names, one class per
idea, no bert_multi import. ``fault`` plants one of the bugs that hurt d2l's readers, so that the tests
can check that ``bert-multi verify`` catches each and names where it lives."""

import math

import torch
from torch import nn

# Each of the catalogue's mistakes (bert_multi.verify.mistakes), as a port would make it, and two mistakes of
# the gradient alone: d2l 0.16-0.17's detached positions and a hand-written ReLU backward.
FAULTS = (
    "scale", "inf_mask", "tiled_valid_lens", "detached_positions", "eps", "gelu", "no_bias", "transposed_query",
    "pre_norm", "positions_offset", "no_segments", "last_position", "dropout_on", "zero_fill", "unscaled",
    "empty_rows_zero", "padded_zero", "std_eps",
    "ffn_doubled",  # one no catalogue knows
    "updates_weights",  # its forward writes to a parameter: nothing a catalogue entry computes
    "relu_backward",
)  # fmt: skip


class PassingReLU(torch.autograd.Function):
    """ReLU with a hand-written backward that forgets to zero the gradient where the input was negative."""

    @staticmethod
    def forward(ctx, x):
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        return grad


class Projection(nn.Linear):
    """A dense layer of the port's own, where a fault can hide."""

    def __init__(self, hidden, outputs, fault=None):
        super().__init__(hidden, outputs)
        self.fault = fault

    def forward(self, x):
        if self.fault == "no_bias":  # the bias is there, but never added
            return nn.functional.linear(x, self.weight)
        if self.fault == "transposed":
            return nn.functional.linear(x, self.weight.T, self.bias)
        return super().forward(x)


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, fault=None, fused=False):
        super().__init__()
        self.heads, self.fault, self.fused = heads, fault, fused
        if fused:
            self.qkv = nn.Linear(hidden, 3 * hidden)
        else:
            no_bias = "no_bias" if fault == "no_bias" else None
            self.query = Projection(hidden, hidden, "transposed" if fault == "transposed_query" else no_bias)
            self.key, self.value = Projection(hidden, hidden, no_bias), Projection(hidden, hidden, no_bias)
        self.out = Projection(hidden, hidden, "no_bias" if fault == "no_bias" else None)

    def split(self, x):
        b, t, h = x.shape
        if self.fault == "view_heads":  # (B, heads, T, H/heads) straight from the memory of (B, T, H)
            return x.reshape(b, self.heads, t, h // self.heads)
        return x.reshape(b, t, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x, valid_lens):
        if self.fused:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = self.split(q), self.split(k), self.split(v)
        scale = math.sqrt(x.shape[-1]) if self.fault == "scale" else math.sqrt(q.shape[-1])
        scores = q @ k.transpose(-1, -2) / (1.0 if self.fault == "unscaled" else scale)
        if self.fault == "token_mask":  # what it was given is the keys' mask, made from the tokens
            scores = scores.masked_fill(~valid_lens[:, None, None, :], -1e9)
        elif valid_lens is not None:
            b = scores.shape[0]
            per_row = valid_lens.reshape(b, -1)  # (B, 1), or (B, T) with a length per query
            if self.fault == "tiled_valid_lens":  # d2l 0.12-0.15: lengths tiled, row b*heads + h gets (b*heads + h) % B
                lens = per_row[torch.arange(b * self.heads, device=x.device) % b].reshape(b, self.heads, -1)
            else:
                lens = per_row[:, None, :].expand(-1, self.heads, -1)
            positions = torch.arange(scores.shape[-1], device=x.device)
            keep = positions <= lens[..., None] if self.fault == "mask_le" else positions < lens[..., None]
            if self.fault == "additive_mask":  # -1e4 added where masked, as transformers' BERT once did
                scores = scores + (~keep).to(scores.dtype) * -1e4
            else:
                fill = {"inf_mask": -math.inf, "zero_fill": 0.0}.get(self.fault, -1e6)
                scores = scores.masked_fill(~keep, fill)
        weights = torch.softmax(scores, dim=-2 if self.fault == "softmax_queries" else -1)
        if self.fault == "empty_rows_zero" and valid_lens is not None:  # a row with no valid key attends to none
            weights = weights * (lens > 0)[..., None]
        if self.fault == "dropout_on":
            weights = nn.functional.dropout(weights, 0.1, training=True)
        if self.fault == "updates_weights":  # as an in-place weight normalisation or a stray optimizer step does
            with torch.no_grad():
                self.out.weight.mul_(1.01)
        mixed = weights @ v
        return self.out(mixed.transpose(1, 2).reshape(x.shape))


class StdLayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm: eps (1e-6) added to torch.std's unbiased deviation."""

    def __init__(self, features, eps=None):
        super().__init__()
        self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features)), 1e-6

    def forward(self, x):
        return self.a_2 * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps) + self.b_2


class Layer(nn.Module):
    def __init__(self, hidden, ffn, heads, fault=None, fused=False):
        super().__init__()
        self.fault = fault
        self.attn = SelfAttention(hidden, heads, fault, fused)
        eps = 1e-12 if fault == "eps" else 1e-5
        norm = StdLayerNorm if fault == "std_eps" else nn.LayerNorm
        self.norm1 = norm(hidden, eps=eps)
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        if fault != "ffn_unwrapped":  # forgotten, with the residual connection around the FFN
            self.norm2 = norm(hidden, eps=eps)

    def forward(self, x, valid_lens):
        activation = {"gelu": nn.functional.gelu, "relu_backward": PassingReLU.apply}.get(self.fault, torch.relu)
        if self.fault == "pre_norm":
            y = x + self.attn(self.norm1(x), valid_lens)
            return y + self.down(activation(self.up(self.norm2(y))))
        y = self.norm1(x + self.attn(x, valid_lens))
        hidden = activation(self.up(y))
        if self.fault == "float32_hidden":  # a .float() left from a mixed-precision experiment
            hidden = hidden.float().to(y.dtype)
        ffn = self.down(hidden)
        if self.fault == "ffn_unwrapped":
            return ffn
        return self.norm2(y + (2 * ffn if self.fault == "ffn_doubled" else ffn))


class MyBERT(nn.Module):
    def __init__(self, vocab, hidden, ffn, heads, layers, max_len, fault=None, fused=False, types=2):
        super().__init__()
        self.fault = fault
        if fault == "sinusoidal":  # a fixed table, as the Transformer's: a buffer, no parameter
            exponents = torch.arange(0, hidden, 2, dtype=torch.float64) / hidden
            angles = torch.arange(max_len, dtype=torch.float64)[:, None] / 10000**exponents
            table = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(max_len, hidden)
            self.register_buffer("positions", table[None])
        else:
            self.positions = nn.Parameter(torch.randn(1, max_len, hidden))
        self.tokens = nn.Embedding(vocab, hidden)
        self.segments = nn.Embedding(types, hidden)
        self.layers = nn.ModuleList(Layer(hidden, ffn, heads, fault, fused) for _ in range(layers))
        self.pool = nn.Linear(hidden, hidden)
        self.mlm_hidden, self.mlm_norm = nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.mlm_out = nn.Linear(hidden, vocab)
        self.nsp_out = nn.Linear(hidden, 2)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        positions = self.positions.data if self.fault == "detached_positions" else self.positions  # d2l 0.16-0.17
        start = 1 if self.fault == "positions_offset" else 0  # counted from 1, and round past the end
        x = self.tokens(tokens) + positions[:, (torch.arange(tokens.shape[1]) + start) % positions.shape[1]].to(
            self.tokens.weight.dtype
        )
        if self.fault != "no_segments":
            x = x + self.segments(segments)
        keys = tokens != 0 if self.fault == "token_mask" else valid_lens  # token id 0 taken for padding
        for layer in self.layers:
            x = layer(x, keys)
        if self.fault == "padded_zero" and valid_lens is not None and valid_lens.dim() == 1:
            x = x * (torch.arange(x.shape[1]) < valid_lens[:, None])[..., None]
        mlm = None
        if pred_positions is not None:
            rows = torch.arange(x.shape[0], device=x.device)[:, None]
            picked = x[rows, pred_positions]
            mlm = self.mlm_out(self.mlm_norm(torch.relu(self.mlm_hidden(picked))))
        pooled = self.pool(x[:, -1 if self.fault == "last_position" else 0])
        nsp = self.nsp_out(pooled if self.fault == "no_tanh" else torch.tanh(pooled))
        return x, mlm, nsp


def make(config, fault=None, fused=False, types=2):
    return MyBERT(
        config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks,
        config.max_len, fault, fused, types,
    )  # fmt: skip


def build(config):
    return make(config)


def build_wrong_backward(config):
    return make(config, fault="relu_backward")


def build_fused(config):
    return make(config, fused=True)


def build_three_types(config):
    """Room for three segment types where d2l's BERT has two: no canonical tensor fits that table."""
    return make(config, types=3)


class Wrapper(nn.Module):
    """What DataParallel or a training framework does to names: every parameter under a prefix."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, *args):
        return self.module(*args)


def build_wrapped_d2l(config):
    import bert_multi.torch as d2l_port  # d2l's own classes, under a wrapper's prefix

    return Wrapper(d2l_port.BERTModel(*config.d2l_args(), semantics=config.semantics))


FUSED_MAP = {
    "names": {
        "encoder.blks.{i}.attention.W_q.{p}": "layers.{i}.attn.qkv.{p}[0/3]",
        "encoder.blks.{i}.attention.W_k.{p}": "layers.{i}.attn.qkv.{p}[1/3]",
        "encoder.blks.{i}.attention.W_v.{p}": "layers.{i}.attn.qkv.{p}[2/3]",
    }
}


def d2l_batch_loss(net, loss, vocab_size, tokens_X, segments_X, valid_lens_x, pred_positions_X, mlm_weights_X,
                   mlm_Y, nsp_y):  # fmt: skip
    """d2l's ``_get_batch_loss_bert``, as the PyTorch chapter wrote it (with ``nn.CrossEntropyLoss()``, a mean)."""
    _, mlm_Y_hat, nsp_Y_hat = net(tokens_X, segments_X, valid_lens_x.reshape(-1), pred_positions_X)
    mlm_l = loss(mlm_Y_hat.reshape(-1, vocab_size), mlm_Y.reshape(-1)) * mlm_weights_X.reshape(-1, 1)
    mlm_l = mlm_l.sum() / (mlm_weights_X.sum() + 1e-8)
    nsp_l = loss(nsp_Y_hat, nsp_y)
    return mlm_l, nsp_l, mlm_l + nsp_l


def fixed_batch_loss(net, loss, vocab_size, tokens_X, segments_X, valid_lens_x, pred_positions_X, mlm_weights_X,
                     mlm_Y, nsp_y):  # fmt: skip
    """The same with the per-slot losses kept (reduction='none'), so that the weights mask the padding."""
    _, mlm_Y_hat, nsp_Y_hat = net(tokens_X, segments_X, valid_lens_x.reshape(-1), pred_positions_X)
    per_slot = nn.functional.cross_entropy(mlm_Y_hat.reshape(-1, vocab_size), mlm_Y.reshape(-1), reduction="none")
    mlm_l = (per_slot * mlm_weights_X.reshape(-1)).sum() / (mlm_weights_X.sum() + 1e-8)
    nsp_l = loss(nsp_Y_hat, nsp_y)
    return mlm_l, nsp_l, mlm_l + nsp_l


def build_faulty(config):
    return make(config, fault="scale")
