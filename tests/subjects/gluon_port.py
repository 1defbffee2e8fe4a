"""A user's Gluon port of d2l 1.0's BERT, in d2l's MXNet style (NumPy mode, deferred shapes), with its own
names and no bert_multi import. ``fault`` plants a bug, as in ``torch_port``."""

import math

from mxnet import np, npx
from mxnet.gluon import loss as gloss
from mxnet.gluon import nn

npx.set_np()


class SelfAttention(nn.Block):
    def __init__(self, hidden, heads, fault=None):
        super().__init__()
        self.heads, self.fault = heads, fault
        self.query = nn.Dense(hidden, flatten=False)
        self.key = nn.Dense(hidden, flatten=False)
        self.value = nn.Dense(hidden, flatten=False)
        self.out = nn.Dense(hidden, flatten=False)

    def forward(self, x, valid_lens):
        b, t, h = x.shape

        def split(y):
            return y.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scale = math.sqrt(h if self.fault == "scale" else h // self.heads)
        scores = np.matmul(q, k.transpose(0, 1, 3, 2)) / scale
        if valid_lens is not None:
            lens = valid_lens.reshape(b, -1)  # (B, 1), or (B, T) with a length per query
            keep = (np.arange(t, dtype=lens.dtype)[None, None, None, :] < lens[:, None, :, None]).astype(x.dtype)
            scores = scores * keep - 1e6 * (1 - keep)
        mixed = np.matmul(npx.softmax(scores), v)
        return self.out(mixed.transpose(0, 2, 1, 3).reshape(b, t, h))


class Layer(nn.Block):
    def __init__(self, hidden, ffn, heads, fault=None):
        super().__init__()
        self.attn = SelfAttention(hidden, heads, fault)
        self.norm1 = nn.LayerNorm()
        self.up = nn.Dense(ffn, flatten=False, activation="relu")
        self.down = nn.Dense(hidden, flatten=False)
        self.norm2 = nn.LayerNorm()

    def forward(self, x, valid_lens):
        y = self.norm1(x + self.attn(x, valid_lens))
        return self.norm2(y + self.down(self.up(y)))


class MyBERT(nn.Block):
    def __init__(self, vocab, hidden, ffn, heads, layers, max_len, fault=None):
        super().__init__()
        self.positions = self.params.get("positions", shape=(1, max_len, hidden))
        self.tokens = nn.Embedding(vocab, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.layers = nn.Sequential()
        for _ in range(layers):
            self.layers.add(Layer(hidden, ffn, heads, fault))
        self.pool = nn.Dense(hidden, activation="tanh")
        self.mlm_hidden = nn.Dense(hidden, flatten=False, activation="relu")
        self.mlm_norm = nn.LayerNorm()
        self.mlm_out = nn.Dense(vocab, flatten=False)
        self.nsp_out = nn.Dense(2)

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        x = self.tokens(tokens) + self.segments(segments) + self.positions.data()[:, : tokens.shape[1], :]
        for layer in self.layers:
            x = layer(x, valid_lens)
        mlm = None
        if pred_positions is not None:
            b, p = pred_positions.shape
            rows = np.repeat(np.arange(b), p)
            picked = x[rows, pred_positions.reshape(-1)].reshape(b, p, -1)
            mlm = self.mlm_out(self.mlm_norm(self.mlm_hidden(picked)))
        return x, mlm, self.nsp_out(self.pool(x[:, 0, :]))


def build(config):
    return MyBERT(config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks,
                  config.max_len)  # fmt: skip


def build_faulty(config):
    return MyBERT(config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_heads, config.num_blks,
                  config.max_len, fault="scale")  # fmt: skip


def d2l_batch_loss(net, loss, vocab_size, tokens_X_shards, segments_X_shards, valid_lens_x_shards,
                   pred_positions_X_shards, mlm_weights_X_shards, mlm_Y_shards, nsp_y_shards):  # fmt: skip
    """d2l's Gluon ``_get_batch_loss_bert``: shards in, lists out; the weights go to the loss per sample."""
    mlm_ls, nsp_ls, ls = [], [], []
    for tokens, segments, valid_lens, positions, weights, mlm_y, nsp_y in zip(
        tokens_X_shards, segments_X_shards, valid_lens_x_shards, pred_positions_X_shards, mlm_weights_X_shards,
        mlm_Y_shards, nsp_y_shards,
    ):  # fmt: skip
        _, mlm_y_hat, nsp_y_hat = net(tokens, segments, valid_lens.reshape(-1), positions)
        mlm_l = loss(mlm_y_hat.reshape((-1, vocab_size)), mlm_y.reshape(-1), weights.reshape((-1, 1)))
        mlm_l = mlm_l.sum() / (weights.sum() + 1e-8)
        nsp_l = loss(nsp_y_hat, nsp_y).mean()
        mlm_ls.append(mlm_l)
        nsp_ls.append(nsp_l)
        ls.append(mlm_l + nsp_l)
    return mlm_ls, nsp_ls, ls


LOSS = gloss.SoftmaxCELoss  # what d2l passes as ``loss``
