"""The suite must be able to fail. Each test injects one known fault into a backend (by monkeypatching
here, never by editing the product), runs the conformance engine, and checks that the fault is caught
and that localisation names the layer where it lives. Most faults come from d2l's own history.

The faults are the catalogue of known mistakes (``bert_multi.verify.mistakes``), which ``verify``'s
diagnosis tries on users' models: every framework plants every entry, and the catalogue says which case
catches it and where.
"""

import dataclasses
import importlib
import inspect
import math

import numpy as np
import pytest

from bert_multi import BERTConfig, random_weights
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.cases import CASES
from bert_multi.engine.conform import run_conformance
from bert_multi.engine.results import Target
from bert_multi.spec.semantics import sinusoidal_positions
from bert_multi.verify.mistakes import CATALOGUE
from bert_multi.verify.session import verify

# Several heads (so the head layout matters) and dropout configured (so a dropout left on shows).
CONFIG = BERTConfig(vocab_size=31, num_hiddens=12, ffn_num_hiddens=16, num_heads=3, num_blks=2, dropout=0.1, max_len=10)


# --- What PyTorch and Gluon plant alike: their d2l blocks have the same parts under the same names -----


def _marking_roles(init):
    """``MultiHeadAttention.__init__`` that also marks each projection with its role, for ``_projections``."""

    def marked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for role in ("W_q", "W_k", "W_v", "W_o"):
            getattr(self, role).role = role

    return marked


def _unwrapped_forward(self, X, valid_lens):
    """``TransformerEncoderBlock.forward`` whose FFN has no residual connection and no LayerNorm around it."""
    return self.ffn(self.addnorm1(X, self.attention(X, X, X, valid_lens)))


def _reshaped_heads(mp, attention):
    """d2l's ``transpose_qkv`` and ``transpose_output`` as a reshape alone, without their transposes."""
    mp.setattr(attention, "transpose_qkv", lambda self, X: X.reshape(-1, X.shape[1], X.shape[2] // self.num_heads))
    mp.setattr(attention, "transpose_output", lambda self, X: X.reshape(-1, X.shape[1], X.shape[2] * self.num_heads))


def _lengths_one_longer(mp, model):
    """``masked_softmax`` given each valid length plus one (JAX's model module has it too, so JAX plants this)."""
    original = model.masked_softmax
    mp.setattr(
        model, "masked_softmax", lambda X, valid_lens: original(X, None if valid_lens is None else valid_lens + 1)
    )


def _tokens_seen(mp, model):
    """``BERTEncoder.forward`` planted to keep, in the dict it returns, where each token id is not 0: what a
    mask made from the tokens reads, for the ``masked_softmax`` planted beside it."""
    seen = {}
    encode = model.BERTEncoder.forward

    def forward(self, tokens, segments, valid_lens):
        seen["keep"] = tokens != 0
        return encode(self, tokens, segments, valid_lens)

    mp.setattr(model.BERTEncoder, "forward", forward)
    return seen


def _pre_norm_forward(self, X, valid_lens):
    """``TransformerEncoderBlock.forward`` with pre-norm: each sublayer reads the normalised input, the
    residual adds the raw one."""
    normed = self.addnorm1.ln(X)
    Y = X + self.attention(normed, normed, normed, valid_lens)
    return Y + self.ffn(self.addnorm2.ln(Y))


# --- PyTorch faults ---------------------------------------------------------------------------------


def torch_faults():
    import torch
    from torch import nn

    import bert_multi.torch.model as model

    def tiled_valid_lens(mp):  # d2l <= 0.15: valid_lens tiled (b0, b1, b0, b1) over heads
        def forward(self, queries, keys, values, valid_lens):
            queries, keys, values = (
                self.transpose_qkv(W(x)) for W, x in ((self.W_q, queries), (self.W_k, keys), (self.W_v, values))
            )
            if valid_lens is not None:
                valid_lens = valid_lens.repeat(self.num_heads, *([1] * (valid_lens.dim() - 1)))
            return self.W_o(self.transpose_output(self.attention(queries, keys, values, valid_lens)))

        mp.setattr(model.MultiHeadAttention, "forward", forward)

    def layer_norm_eps(mp):  # BERT's original TensorFlow epsilon
        init = model.AddNorm.__init__

        def small_eps(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.ln.eps = 1e-12

        mp.setattr(model.AddNorm, "__init__", small_eps)

    def layer_norm_form(mp):  # the Annotated Transformer's: eps added to torch.std's unbiased deviation
        def forward(self, X):
            centred = X - X.mean(-1, keepdim=True)
            return self.weight * centred / (X.std(-1, keepdim=True) + 1e-6) + self.bias

        init = model.AddNorm.__init__

        def unbiased(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.ln.forward = forward.__get__(self.ln)

        mp.setattr(model.AddNorm, "__init__", unbiased)

    def activation(mp):  # BERT's GELU, not d2l's ReLU
        mp.setattr(model.PositionWiseFFN, "forward", lambda self, X: self.dense2(nn.functional.gelu(self.dense1(X))))

    def _row_lens(X, valid_lens):  # each (example, query) row's valid length, as d2l's masked_softmax has it
        return torch.repeat_interleave(valid_lens, X.shape[1]) if valid_lens.dim() == 1 else valid_lens.reshape(-1)

    def _keys_masked(mp, fill, axis=-1):  # a masked_softmax: the scores ``fill(rows, keep)``, normalised on axis
        def masked_softmax(X, valid_lens):
            if valid_lens is not None:
                rows = X.reshape(-1, X.shape[-1])
                keep = torch.arange(X.shape[-1], device=X.device)[None, :] < _row_lens(X, valid_lens)[:, None]
                X = fill(rows, keep).reshape(X.shape)
            return nn.functional.softmax(X, dim=axis)

        mp.setattr(model, "masked_softmax", masked_softmax)

    def mask_fill(mp):  # -inf where d2l fills -1e6
        _keys_masked(mp, lambda rows, keep: rows.masked_fill(~keep, -math.inf))

    def additive_mask(mp):  # -1e6 added to the masked scores, where d2l puts it in their place
        _keys_masked(mp, lambda rows, keep: torch.where(keep, rows, rows - 1e6))

    def mask_off_by_one(mp):  # one key past each valid length attended to (<= written for <)
        _lengths_one_longer(mp, model)

    def softmax_axis(mp):  # the weights normalised over the queries
        _keys_masked(mp, lambda rows, keep: rows.masked_fill(~keep, -1e6), axis=1)

    def heads_reshaped(mp):  # the heads split and merged by a reshape alone, as view(B, heads, T, -1) does
        _reshaped_heads(mp, model.MultiHeadAttention)

    def mask_from_tokens(mp):  # the keys whose token id is not 0 attended to, whatever valid_lens says
        seen = _tokens_seen(mp, model)

        def masked_softmax(X, valid_lens):
            keep = seen["keep"].repeat_interleave(X.shape[0] // seen["keep"].shape[0], dim=0)[:, None, :]
            return nn.functional.softmax(X.masked_fill(~keep, -1e6), dim=-1)

        mp.setattr(model, "masked_softmax", masked_softmax)

    def masked_rows_zero(mp):  # a row whose every key is masked attends to nothing, as key_padding_mask does
        original = model.masked_softmax

        def masked_softmax(X, valid_lens):
            weights = original(X, valid_lens)
            if valid_lens is None:
                return weights
            return weights * (_row_lens(X, valid_lens) > 0).reshape(X.shape[0], X.shape[1], 1)

        mp.setattr(model, "masked_softmax", masked_softmax)

    def score_scale(mp):  # by the full width, not a head's
        def forward(self, queries, keys, values, valid_lens=None):
            scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(queries.shape[-1] * CONFIG.num_heads)
            return torch.bmm(self.dropout(model.masked_softmax(scores, valid_lens)), values)

        mp.setattr(model.DotProductAttention, "forward", forward)

    def segments_ignored(mp):
        original = model.BERTEncoder.forward
        mp.setattr(
            model.BERTEncoder,
            "forward",
            lambda self, tokens, segments, valid_lens: original(self, tokens, torch.zeros_like(segments), valid_lens),
        )

    def pooler_position(mp):  # the NSP path reads the last position, not <cls>
        def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
            encoded_X = self.encoder(tokens, segments, valid_lens)
            mlm_Y_hat = None if pred_positions is None else self.mlm(encoded_X, pred_positions)
            return encoded_X, mlm_Y_hat, self.nsp(self.hidden(encoded_X[:, -1, :]))

        mp.setattr(model.BERTModel, "forward", forward)

    def pooler_activation(mp):  # the pooler's tanh left out
        init = model.BERTModel.__init__

        def without_tanh(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.hidden[1] = nn.Identity()

        mp.setattr(model.BERTModel, "__init__", without_tanh)

    def padded_positions_zero(mp):  # the encoder's output zero past each valid_len, as nested tensors give
        original = model.BERTEncoder.forward

        def forward(self, tokens, segments, valid_lens):
            X = original(self, tokens, segments, valid_lens)
            if valid_lens is None or valid_lens.dim() != 1:
                return X
            return X * (torch.arange(X.shape[1])[None, :] < valid_lens[:, None])[:, :, None]

        mp.setattr(model.BERTEncoder, "forward", forward)

    def dropout_at_inference(mp):
        mp.setattr(nn.Dropout, "forward", lambda self, X: nn.functional.dropout(X, self.p, training=True))

    def _projections(mp, project):  # W_q, W_k, W_v and W_o computed by ``project``, still called as layers
        linear, init = nn.Linear.forward, model.MultiHeadAttention.__init__

        def forward(self, X):
            role = getattr(self, "role", None)
            return linear(self, X) if role is None else project(self, X, role)

        mp.setattr(nn.Linear, "forward", forward)
        mp.setattr(model.MultiHeadAttention, "__init__", _marking_roles(init))

    def attention_bias(mp):  # the projections' biases never added
        _projections(mp, lambda layer, X, role: nn.functional.linear(X, layer.weight))

    def transposed_weight(mp):  # W_q used transposed
        _projections(mp, lambda layer, X, role: nn.functional.linear(X, layer.weight.T if role == "W_q" else
                                                                     layer.weight, layer.bias))  # fmt: skip

    def pre_norm(mp):
        mp.setattr(model.TransformerEncoderBlock, "forward", _pre_norm_forward)

    def sublayer_unwrapped(mp):
        mp.setattr(model.TransformerEncoderBlock, "forward", _unwrapped_forward)

    def positions_offset(mp):  # positions counted from 1 (and round, past the table's end)
        def forward(self, tokens, segments, valid_lens):
            X = self.token_embedding(tokens) + self.segment_embedding(segments)
            X = X + self.pos_embedding[:, (torch.arange(X.shape[1]) + 1) % self.pos_embedding.shape[1], :]
            for blk in self.blks:
                X = blk(X, valid_lens)
            return X

        mp.setattr(model.BERTEncoder, "forward", forward)

    def fixed_positions(mp):  # a fixed sinusoidal table (a buffer) where d2l learns its positions
        def forward(self, tokens, segments, valid_lens):
            X = self.token_embedding(tokens) + self.segment_embedding(segments)
            X = X + torch.as_tensor(sinusoidal_positions(*X.shape[1:]), dtype=X.dtype, device=X.device)
            for blk in self.blks:
                X = blk(X, valid_lens)
            return X

        mp.setattr(model.BERTEncoder, "forward", forward)

    return locals()


# --- MXNet faults, the same list ----------------------------------------------------------------------


def mxnet_faults():
    import mxnet as mx
    from mxnet import np, npx

    import bert_multi.mxnet.model as model

    def tiled_valid_lens(mp):
        def forward(self, queries, keys, values, valid_lens):
            queries, keys, values = (
                self.transpose_qkv(W(x)) for W, x in ((self.W_q, queries), (self.W_k, keys), (self.W_v, values))
            )
            if valid_lens is not None:
                valid_lens = np.concatenate([valid_lens] * self.num_heads, axis=0)
            return self.W_o(self.transpose_output(self.attention(queries, keys, values, valid_lens)))

        mp.setattr(model.MultiHeadAttention, "forward", forward)

    def layer_norm_eps(mp):
        init = model.AddNorm.__init__

        def small_eps(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.ln._epsilon = 1e-12  # what Gluon's LayerNorm hands its operator

        mp.setattr(model.AddNorm, "__init__", small_eps)

    def layer_norm_form(mp):  # the Annotated Transformer's: eps added to the unbiased standard deviation
        def hybrid_forward(self, F, X, gamma, beta):
            centred = X - X.mean(axis=-1, keepdims=True)
            std = np.sqrt((centred**2).sum(axis=-1, keepdims=True) / (X.shape[-1] - 1))
            return gamma * centred / (std + 1e-6) + beta

        mp.setattr(mx.gluon.nn.LayerNorm, "hybrid_forward", hybrid_forward)

    def activation(mp):  # BERT's GELU, not d2l's ReLU
        def forward(self, X):
            dense1 = self.dense1
            hidden = npx.fully_connected(
                X, dense1.weight.data(X.ctx), dense1.bias.data(X.ctx), num_hidden=dense1._units, flatten=False
            )
            return self.dense2(npx.leaky_relu(hidden, act_type="gelu"))

        mp.setattr(model.PositionWiseFFN, "forward", forward)

    def _row_lens(X, valid_lens):  # each (example, query) row's valid length, as d2l's masked_softmax has it
        return valid_lens.repeat(X.shape[1]) if valid_lens.ndim == 1 else valid_lens.reshape(-1)

    def _keys_masked(mp, fill, axis=-1):  # a masked_softmax: the scores ``fill(rows, keep)``, normalised on axis
        def masked_softmax(X, valid_lens):
            if valid_lens is not None:
                rows = X.reshape(-1, X.shape[-1])
                keep = npx.sequence_mask(np.ones_like(rows), _row_lens(X, valid_lens), True, value=0, axis=1)
                X = fill(rows, keep).reshape(X.shape)
            return npx.softmax(X, axis=axis)

        mp.setattr(model, "masked_softmax", masked_softmax)

    def mask_fill(mp):  # -inf where d2l fills -1e6
        _keys_masked(mp, lambda rows, keep: np.where(keep, rows, -math.inf))

    def additive_mask(mp):  # -1e6 added to the masked scores, where d2l puts it in their place
        _keys_masked(mp, lambda rows, keep: rows - (1 - keep) * 1e6)

    def mask_off_by_one(mp):  # one key past each valid length attended to (<= written for <)
        _lengths_one_longer(mp, model)

    def softmax_axis(mp):  # the weights normalised over the queries
        _keys_masked(mp, lambda rows, keep: np.where(keep, rows, -1e6), axis=1)

    def heads_reshaped(mp):  # the heads split and merged by a reshape alone, as view(B, heads, T, -1) does
        _reshaped_heads(mp, model.MultiHeadAttention)

    def mask_from_tokens(mp):  # the keys whose token id is not 0 attended to, whatever valid_lens says
        seen = _tokens_seen(mp, model)

        def masked_softmax(X, valid_lens):
            keep = np.repeat(seen["keep"], X.shape[0] // seen["keep"].shape[0], axis=0)[:, None, :]
            return npx.softmax(np.where(keep, X, -1e6))

        mp.setattr(model, "masked_softmax", masked_softmax)

    def masked_rows_zero(mp):  # a row whose every key is masked attends to nothing, as key_padding_mask does
        original = model.masked_softmax

        def masked_softmax(X, valid_lens):
            weights = original(X, valid_lens)
            if valid_lens is None:
                return weights
            return weights * (_row_lens(X, valid_lens) > 0).astype(weights.dtype).reshape(X.shape[0], X.shape[1], 1)

        mp.setattr(model, "masked_softmax", masked_softmax)

    def score_scale(mp):  # by the full width, not a head's
        def forward(self, queries, keys, values, valid_lens=None):
            scores = npx.batch_dot(queries, keys, transpose_b=True) / math.sqrt(queries.shape[-1] * CONFIG.num_heads)
            return npx.batch_dot(self.dropout(model.masked_softmax(scores, valid_lens)), values)

        mp.setattr(model.DotProductAttention, "forward", forward)

    def segments_ignored(mp):
        original = model.BERTEncoder.forward
        mp.setattr(
            model.BERTEncoder,
            "forward",
            lambda self, tokens, segments, valid_lens: original(self, tokens, np.zeros_like(segments), valid_lens),
        )

    def pooler_position(mp):  # the NSP path reads the last position, not <cls>
        def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
            encoded_X = self.encoder(tokens, segments, valid_lens)
            mlm_Y_hat = None if pred_positions is None else self.mlm(encoded_X, pred_positions)
            return encoded_X, mlm_Y_hat, self.nsp(self.hidden(encoded_X[:, -1, :]))

        mp.setattr(model.BERTModel, "forward", forward)

    def pooler_activation(mp):  # the pooler's tanh left out (Gluon's Dense holds its activation: made without)
        dense = model._dense

        def without_tanh(*args, activation=None, **kwargs):
            return dense(*args, activation=None if activation == "tanh" else activation, **kwargs)

        mp.setattr(model, "_dense", without_tanh)

    def padded_positions_zero(mp):  # the encoder's output zero past each valid_len, as nested tensors give
        original = model.BERTEncoder.forward

        def forward(self, tokens, segments, valid_lens):
            X = original(self, tokens, segments, valid_lens)
            if valid_lens is None or valid_lens.ndim != 1:
                return X
            keep = np.arange(X.shape[1], ctx=X.ctx, dtype=X.dtype)[None, :] < valid_lens[:, None].astype(X.dtype)
            return X * keep.astype(X.dtype)[:, :, None]

        mp.setattr(model.BERTEncoder, "forward", forward)

    def dropout_at_inference(mp):
        mp.setattr(
            mx.gluon.nn.Dropout, "hybrid_forward", lambda self, F, x: F.npx.dropout(x, p=self._rate, mode="always")
        )

    def _projections(mp, project):  # W_q, W_k, W_v and W_o computed by ``project``, still called as layers
        dense, init = mx.gluon.nn.Dense.hybrid_forward, model.MultiHeadAttention.__init__

        def forward(self, F, x, weight, bias=None):
            role = getattr(self, "role", None)
            if role is None:
                return dense(self, F, x, weight, bias)
            weight, bias = project(weight, bias, role)
            return F.npx.fully_connected(x, weight, bias, no_bias=bias is None, num_hidden=self._units, flatten=False)

        mp.setattr(mx.gluon.nn.Dense, "hybrid_forward", forward)
        mp.setattr(model.MultiHeadAttention, "__init__", _marking_roles(init))

    def attention_bias(mp):  # the projections' biases never added
        _projections(mp, lambda weight, bias, role: (weight, None))

    def transposed_weight(mp):  # W_q used transposed
        _projections(mp, lambda weight, bias, role: (weight.T if role == "W_q" else weight, bias))

    def pre_norm(mp):
        mp.setattr(model.TransformerEncoderBlock, "forward", _pre_norm_forward)

    def sublayer_unwrapped(mp):
        mp.setattr(model.TransformerEncoderBlock, "forward", _unwrapped_forward)

    def positions_offset(mp):  # positions counted from 1 (and round, past the table's end)
        def forward(self, tokens, segments, valid_lens):
            X = self.token_embedding(tokens) + self.segment_embedding(segments)
            table = self.pos_embedding.data(ctx=X.ctx)
            X = X + table[:, (np.arange(X.shape[1]) + 1) % table.shape[1], :]
            for blk in self.blks:
                X = blk(X, valid_lens)
            return X

        mp.setattr(model.BERTEncoder, "forward", forward)

    def fixed_positions(mp):  # a fixed sinusoidal table (a buffer) where d2l learns its positions
        def forward(self, tokens, segments, valid_lens):
            X = self.token_embedding(tokens) + self.segment_embedding(segments)
            X = X + np.array(sinusoidal_positions(*X.shape[1:]), ctx=X.ctx, dtype=X.dtype)
            for blk in self.blks:
                X = blk(X, valid_lens)
            return X

        mp.setattr(model.BERTEncoder, "forward", forward)

    return locals()


# --- JAX faults, the same list ----------------------------------------------------------------------


def _plant_flax(mp, **classes):
    """Put fault classes where the Flax model looks its classes up, with a fresh compiled forward.
    Framework difference: Flax modules are dataclasses whose methods Flax wraps when the class is made, so
    a fault is a subclass, not a patched method; and the forward is compiled once per module, so a fault
    needs a forward of its own (restored with everything else)."""
    import bert_multi.jax.backend as backend
    import bert_multi.jax.model as model

    for name, cls in classes.items():
        mp.setattr(model, name, cls)
    traced = backend._apply

    def apply(*arguments):  # a function of its own: jit caches compiled code by the function it wraps
        return traced(*arguments)

    mp.setattr(backend, "apply", backend.Jitted(apply, static_argnums=(0, 1)))


def jax_faults():
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    import bert_multi.jax.backend as backend
    import bert_multi.jax.model as model

    def tiled_valid_lens(mp):
        class Tiled(model.MultiHeadAttention):
            def __call__(self, queries, keys, values, valid_lens, training=False):
                queries, keys, values = (self.transpose_qkv(W(x)) for W, x in
                                         ((self.W_q, queries), (self.W_k, keys), (self.W_v, values)))  # fmt: skip
                if valid_lens is not None:
                    valid_lens = jnp.tile(valid_lens, (self.num_heads,) + (1,) * (valid_lens.ndim - 1))
                return self.W_o(self.transpose_output(self.attention(queries, keys, values, valid_lens, training)))

        _plant_flax(mp, MultiHeadAttention=Tiled)

    def layer_norm_eps(mp):
        class Eps(model.AddNorm):
            def setup(self):
                self.ln = nn.LayerNorm(epsilon=1e-12)
                self.drop = nn.Dropout(self.dropout)

        _plant_flax(mp, AddNorm=Eps)

    def layer_norm_form(mp):  # the Annotated Transformer's: eps added to the unbiased standard deviation
        class UnbiasedLayerNorm(nn.Module):
            @nn.compact
            def __call__(self, X):
                scale = self.param("scale", nn.initializers.ones, (X.shape[-1],))
                bias = self.param("bias", nn.initializers.zeros, (X.shape[-1],))
                centred = X - X.mean(-1, keepdims=True)
                return scale * centred / (jnp.std(X, axis=-1, ddof=1, keepdims=True) + 1e-6) + bias

        class Unbiased(model.AddNorm):
            def setup(self):
                self.ln = UnbiasedLayerNorm()
                self.drop = nn.Dropout(self.dropout)

        _plant_flax(mp, AddNorm=Unbiased)

    def activation(mp):  # BERT's GELU, not d2l's ReLU
        class GELU(model.PositionWiseFFN):
            def __call__(self, X):
                return self.dense2(nn.gelu(self.dense1(X), approximate=False))

        _plant_flax(mp, PositionWiseFFN=GELU)

    def _query_lens(valid_lens):  # each (example, query)'s valid length: 1-D valid_lens holds for every query
        return valid_lens[:, None] if valid_lens.ndim == 1 else valid_lens

    def _keys_masked(mp, fill, axis=-1):  # a masked_softmax: the scores ``fill(X, keep)``, normalised on axis
        def masked_softmax(X, valid_lens):
            if valid_lens is not None:
                X = fill(X, jnp.arange(X.shape[-1])[None, None, :] < _query_lens(valid_lens)[:, :, None])
            return nn.softmax(X, axis=axis)

        mp.setattr(model, "masked_softmax", masked_softmax)
        _plant_flax(mp)

    def mask_fill(mp):  # -inf where d2l fills -1e6
        _keys_masked(mp, lambda X, keep: jnp.where(keep, X, -jnp.inf))

    def additive_mask(mp):  # -1e6 added to the masked scores, where d2l puts it in their place
        _keys_masked(mp, lambda X, keep: jnp.where(keep, X, X - 1e6))

    def mask_off_by_one(mp):  # one key past each valid length attended to (<= written for <)
        _lengths_one_longer(mp, model)
        _plant_flax(mp)

    def softmax_axis(mp):  # the weights normalised over the queries
        _keys_masked(mp, lambda X, keep: jnp.where(keep, X, -1e6), axis=1)

    def heads_reshaped(mp):  # the heads split and merged by a reshape alone, as view(B, heads, T, -1) does
        class Reshaped(model.MultiHeadAttention):
            def transpose_qkv(self, X):
                return X.reshape(-1, X.shape[1], X.shape[2] // self.num_heads)

            def transpose_output(self, X):
                return X.reshape(-1, X.shape[1], X.shape[2] * self.num_heads)

        _plant_flax(mp, MultiHeadAttention=Reshaped)

    def mask_from_tokens(mp):  # the keys whose token id is not 0 attended to, whatever valid_lens says
        seen = {}

        class FromTokens(model.BERTEncoder):
            def __call__(self, tokens, segments, valid_lens, training=False):
                seen["keep"] = tokens != 0  # read by the softmax below, in the same trace
                return super().__call__(tokens, segments, valid_lens, training)

        def masked_softmax(X, valid_lens):
            keep = jnp.repeat(seen["keep"], X.shape[0] // seen["keep"].shape[0], axis=0)[:, None, :]
            return nn.softmax(jnp.where(keep, X, -1e6), axis=-1)

        mp.setattr(model, "masked_softmax", masked_softmax)
        _plant_flax(mp, BERTEncoder=FromTokens)

    def masked_rows_zero(mp):  # a row whose every key is masked attends to nothing, as key_padding_mask does
        original = model.masked_softmax

        def masked_softmax(X, valid_lens):
            weights = original(X, valid_lens)
            if valid_lens is None:
                return weights
            return weights * (_query_lens(valid_lens) > 0)[:, :, None]

        mp.setattr(model, "masked_softmax", masked_softmax)
        _plant_flax(mp)

    def score_scale(mp):  # by the full width, not a head's
        class FullWidth(model.DotProductAttention):
            def __call__(self, queries, keys, values, valid_lens=None, training=False):
                scores = queries @ keys.swapaxes(1, 2) / math.sqrt(queries.shape[-1] * CONFIG.num_heads)
                return model.masked_softmax(scores, valid_lens) @ values

        _plant_flax(mp, DotProductAttention=FullWidth)

    def segments_ignored(mp):
        class NoSegments(model.BERTEncoder):
            def __call__(self, tokens, segments, valid_lens, training=False):
                return super().__call__(tokens, jnp.zeros_like(segments), valid_lens, training)

        _plant_flax(mp, BERTEncoder=NoSegments)

    def pooler_position(mp):  # the NSP path reads the last position, not <cls>
        class LastPosition(model.BERTModel):
            def __call__(self, tokens, segments, valid_lens=None, pred_positions=None, training=False):
                encoded_X = self.encoder(tokens, segments, valid_lens, training)
                mlm_Y_hat = None if pred_positions is None else self.mlm(encoded_X, pred_positions)
                pooled = jnp.tanh(self.hidden(encoded_X[:, -1, :]))
                self.sow("intermediates", "pooler", pooled)
                return encoded_X, mlm_Y_hat, self.nsp(pooled)

        _plant_flax(mp)
        mp.setattr(backend, "BERTModel", LastPosition)

    def pooler_activation(mp):  # the pooler's tanh left out
        class NoTanh(model.BERTModel):
            def __call__(self, tokens, segments, valid_lens=None, pred_positions=None, training=False):
                encoded_X = self.encoder(tokens, segments, valid_lens, training)
                mlm_Y_hat = None if pred_positions is None else self.mlm(encoded_X, pred_positions)
                pooled = self.hidden(encoded_X[:, 0, :])
                self.sow("intermediates", "pooler", pooled)
                return encoded_X, mlm_Y_hat, self.nsp(pooled)

        _plant_flax(mp)
        mp.setattr(backend, "BERTModel", NoTanh)

    def padded_positions_zero(mp):  # the encoder's output zero past each valid_len, as nested tensors give
        class Zeroed(model.BERTEncoder):
            def __call__(self, tokens, segments, valid_lens, training=False):
                X = super().__call__(tokens, segments, valid_lens, training)
                if valid_lens is None or valid_lens.ndim != 1:
                    return X
                return X * (jnp.arange(X.shape[1])[None, :] < valid_lens[:, None])[:, :, None]

        _plant_flax(mp, BERTEncoder=Zeroed)

    def dropout_at_inference(mp):  # JAX's way to leave dropout on: the call says training=True
        def apply(module, record, params, *inputs):
            mutable = {"mutable": ["intermediates"]} if record else {}
            return module.apply({"params": params}, *inputs, True, rngs={"dropout": jax.random.key(0)}, **mutable)

        mp.setattr(backend, "apply", backend.Jitted(apply, static_argnums=(0, 1)))

    def _projections(mp, project):  # W_q, W_k, W_v and W_o computed by ``project``: layers of their own
        class Projection(nn.Module):  # a Dense's parameters, kernel and bias, with another product
            features: int
            role: str

            @nn.compact
            def __call__(self, X):
                kernel = self.param("kernel", nn.initializers.lecun_normal(), (X.shape[-1], self.features))
                bias = self.param("bias", nn.initializers.zeros, (self.features,))
                return project(X, kernel, bias, self.role)

        class Projected(model.MultiHeadAttention):
            def setup(self):
                self.attention = model.DotProductAttention(self.dropout)
                for role in ("W_q", "W_k", "W_v", "W_o"):
                    setattr(self, role, Projection(self.num_hiddens, role))

        _plant_flax(mp, MultiHeadAttention=Projected)

    def attention_bias(mp):  # the projections' biases never added
        _projections(mp, lambda X, kernel, bias, role: X @ kernel)

    def transposed_weight(mp):  # W_q used transposed
        _projections(mp, lambda X, kernel, bias, role: X @ (kernel.T if role == "W_q" else kernel) + bias)

    def pre_norm(mp):  # each sublayer reads the normalised input, the residual adds the raw one
        class PreNorm(model.TransformerEncoderBlock):
            def __call__(self, X, valid_lens, training=False):
                normed = self.addnorm1.ln(X)
                attention = self.attention(normed, normed, normed, valid_lens, training)
                Y = X + attention
                out = Y + self.ffn(self.addnorm2.ln(Y))
                for name, value in (("attention", attention), ("addnorm1", normed), ("ffn", out), ("output", out)):
                    self.sow("intermediates", f"{name}_out", value)
                return out

        _plant_flax(mp, TransformerEncoderBlock=PreNorm)

    def sublayer_unwrapped(mp):  # no residual connection and no LayerNorm around the FFN
        class Unwrapped(model.TransformerEncoderBlock):
            def __call__(self, X, valid_lens, training=False):
                attention = self.attention(X, X, X, valid_lens, training)
                Y = self.addnorm1(X, attention, training)
                out = self.ffn(Y)
                for name, value in (("attention", attention), ("addnorm1", Y), ("ffn", out), ("output", out)):
                    self.sow("intermediates", f"{name}_out", value)
                return out

        _plant_flax(mp, TransformerEncoderBlock=Unwrapped)

    def positions_offset(mp):  # positions counted from 1 (and round, past the table's end)
        class Offset(model.BERTEncoder):
            def __call__(self, tokens, segments, valid_lens, training=False):
                X = self.token_embedding(tokens) + self.segment_embedding(segments)
                table = self.pos_embedding
                X = X + table[:, (jnp.arange(X.shape[1]) + 1) % table.shape[1], :].astype(X.dtype)
                self.sow("intermediates", "embedding", X)
                for blk in self.blks:
                    X = blk(X, valid_lens, training)
                return X

        _plant_flax(mp, BERTEncoder=Offset)

    def fixed_positions(mp):  # a fixed sinusoidal table (a buffer) where d2l learns its positions
        class Fixed(model.BERTEncoder):
            def __call__(self, tokens, segments, valid_lens, training=False):
                X = self.token_embedding(tokens) + self.segment_embedding(segments)
                X = X + jnp.asarray(sinusoidal_positions(*X.shape[1:]), dtype=X.dtype)
                self.sow("intermediates", "embedding", X)
                for blk in self.blks:
                    X = blk(X, valid_lens, training)
                return X

        _plant_flax(mp, BERTEncoder=Fixed)

    return locals()


FAULT_SETS = {"torch": torch_faults, "mxnet": mxnet_faults, "jax": jax_faults}

# fault -> (the case that must catch it, the layer localisation must name): the catalogue's.
EXPECTED = {mistake.name: (mistake.caught_by, mistake.shows_at) for mistake in CATALOGUE}


@pytest.mark.parametrize("backend", sorted(FAULT_SETS))
def test_every_framework_plants_the_whole_catalogue_and_nothing_else(backend):
    if not_in_process(backend):  # the plantings import the framework
        pytest.skip(not_in_process(backend))
    found = FAULT_SETS[backend]().items()
    planted = {name for name, value in found if inspect.isfunction(value) and not name.startswith("_")}
    assert planted == set(EXPECTED)


@pytest.mark.parametrize("fault", sorted(EXPECTED))
@pytest.mark.parametrize("backend", sorted(FAULT_SETS))
def test_each_known_fault_is_caught_and_localised(backend, fault, monkeypatch):
    if not_in_process(backend):  # the faults are planted in this process
        pytest.skip(not_in_process(backend))
    FAULT_SETS[backend]()[fault](monkeypatch)
    catching_case, layer = EXPECTED[fault]
    cases = [(case.name, case.batch(CONFIG, seed=2)) for case in CASES]
    report = run_conformance(
        CONFIG, random_weights(CONFIG, seed=2, dtype="float64"), [Target(backend, "float64")], cases, pairs=False
    )
    failing = {check.case: check.first_divergence for check in report.failures()}
    assert catching_case in failing, f"{fault} went unnoticed by {catching_case}"
    assert failing[catching_case].name == layer, failing[catching_case].describe()
    if fault == "mask_fill":  # NaN/Inf is its own failure, never "close"
        assert failing[catching_case].nonfinite > 0
    # Every case that fails blames the same layer: localisation does not depend on the input.
    assert {c.name for c in failing.values()} == {layer}


def _seed_for(fault):
    """The seed of the batch verify's diagnosis reads: 2, as the other tests', or for a mask made from the
    tokens the first whose case holds a token id 0 (where none is 0 it computes what ignoring valid_lens
    computes, and is said so)."""
    if fault != "mask_from_tokens":
        return 2
    case = next(case for case in CASES if case.name == EXPECTED[fault][0])
    return next(seed for seed in range(2, 100) if (case.batch(CONFIG, seed=seed)["tokens"] == 0).any())


@pytest.mark.parametrize("fault", sorted(EXPECTED))
@pytest.mark.parametrize("backend", sorted(FAULT_SETS))
def test_verify_names_each_planted_mistake_in_its_diagnosis(backend, fault, monkeypatch):
    """The same plantings, in d2l's classes of each framework taken as a user's model: ``verify`` names the
    catalogue's entry at the module where it lives, from that module's own input."""
    if not_in_process(backend):  # the faults are planted in this process
        pytest.skip(not_in_process(backend))
    if (backend, fault) == ("jax", "dropout_at_inference"):
        pytest.skip("JAX's planting is in the backend's forward; a user's Flax model is run with its training flag "
                    "set by verify itself (tests/test_verify.py covers a model without one)")  # fmt: skip
    FAULT_SETS[backend]()[fault](monkeypatch)
    framework = importlib.import_module(f"bert_multi.{backend}.backend")  # where a planting puts its classes
    caught_by, _ = EXPECTED[fault]

    def build(config):
        return framework.BERTModel(*config.d2l_args(), semantics=config.semantics)

    report = verify(build, CONFIG, dtypes=["float64"], cases=[caught_by], seed=_seed_for(fault), label=fault)
    assert not report.passed and report.diagnoses, report.failures()
    named = [d.mistake.name for d in report.diagnoses if d.mistake is not None]
    assert named and named[0] == fault, report.failures()


@pytest.mark.parametrize("backend", sorted(FAULT_SETS))
def test_without_faults_the_same_run_passes(backend):
    if not_in_process(backend):  # the faults are planted in this process
        pytest.skip(not_in_process(backend))
    cases = [(case.name, case.batch(CONFIG, seed=2)) for case in CASES]
    report = run_conformance(
        CONFIG, random_weights(CONFIG, seed=2, dtype="float64"), [Target(backend, "float64")], cases, pairs=False
    )
    assert report.passed and len(report.checks) == len(CASES)
    assert not np.isnan([c.max_abs for check in report.checks for c in check.outputs]).any()


# --- Generations: each preset must be told apart from the others' rules --------------------------------


def generation_faults(backend):
    """Faults that compute another generation's rule; all but dropping biases are the same code in both
    frameworks, since the two model modules have the same classes."""
    model = importlib.import_module(f"bert_multi.{backend}.model")

    def interleaved_valid_lens(mp):  # d2l >= 0.16's layout where the preset tiles (d2l <= 0.15)
        original = model.MultiHeadAttention.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.valid_lens_over_heads = "interleaved"

        mp.setattr(model.MultiHeadAttention, "__init__", init)

    def biases_dropped(mp):  # d2l 0.11's unbiased projections where the preset has biases
        original = model.MultiHeadAttention.forward
        layers = ("W_q", "W_k", "W_v", "W_o")

        def forward(self, *args):
            saved = {name: read_bias(getattr(self, name)) for name in layers}
            for name in layers:
                write_bias(getattr(self, name), 0 * saved[name])
            try:
                return original(self, *args)
            finally:
                for name in layers:
                    write_bias(getattr(self, name), saved[name])

        mp.setattr(model.MultiHeadAttention, "forward", forward)

    def bias_added(mp):  # a bias where d2l 0.11 has none: W_v(values + 0.1) = W_v values + a constant
        original = model.MultiHeadAttention.forward
        mp.setattr(
            model.MultiHeadAttention,
            "forward",
            lambda self, queries, keys, values, valid_lens: original(self, queries, keys, values + 0.1, valid_lens),
        )

    def sinusoidal_positions(mp):  # d2l 0.11's fixed table where the preset learns its positions
        def forward(self, tokens, segments, valid_lens):
            X = self.token_embedding(tokens) + self.segment_embedding(segments)
            X = model.PositionalEncoding(X.shape[-1], 0.0, max_len=X.shape[1])(X)
            for blk in self.blks:
                X = blk(X, valid_lens)
            return X

        mp.setattr(model.BERTEncoder, "forward", forward)

    def no_sinusoidal_table(mp):  # positions left out, as a learned table at zero would add nothing
        mp.setattr(model.PositionalEncoding, "forward", lambda self, X: self.dropout(X))

    def embedding_norm_dropped(mp):  # d2l's plain embedding sum where original BERT normalises it
        original = model.BERTEncoder.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.embedding_norm.forward = lambda X: X

        mp.setattr(model.BERTEncoder, "__init__", init)

    def eps_of_d2l(mp):  # LayerNorm eps 1e-5 (both frameworks' default) where original BERT uses 1e-12
        original = model.BERTModel.__init__

        def init(self, *args, semantics, **kwargs):
            original(self, *args, semantics=dataclasses.replace(semantics, layer_norm_eps=1e-5), **kwargs)

        mp.setattr(model.BERTModel, "__init__", init)

    if backend == "torch":
        import torch

        def relu_for_gelu(mp):  # d2l's ReLU where original BERT has GELU
            mp.setattr(model, "_activation", lambda kind: torch.nn.ReLU())

        def tanh_for_erf(mp):  # GELU's tanh approximation where the checkpoint uses the exact erf form
            mp.setattr(model, "_activation", lambda kind: torch.nn.GELU(approximate="tanh"))

        def untied_decoder(mp):  # a decoder that is not the token embedding (here: its rows reversed)
            mp.setattr(model.TiedDecoder, "forward", lambda self, X: X @ self.embedding.weight.flip(0).T + self.bias)

        def read_bias(layer):
            return layer.bias.detach().clone()

        def write_bias(layer, value):
            with torch.no_grad():
                layer.bias.copy_(value)
    else:
        from mxnet import np as mx_np

        def relu_for_gelu(mp):  # d2l's ReLU where original BERT has GELU
            mp.setattr(model, "gelu", lambda X, approximate=False: mx_np.maximum(X, 0))

        def tanh_for_erf(mp):  # GELU's tanh approximation where the checkpoint uses the exact erf form
            original = model.gelu
            mp.setattr(model, "gelu", lambda X, approximate=False: original(X, approximate=True))

        def untied_decoder(mp):  # a decoder that is not the token embedding (here: its rows reversed)
            def forward(self, X):
                return mx_np.dot(X, self.embedding.weight.data(ctx=X.ctx)[::-1].T) + self.bias.data(ctx=X.ctx)

            mp.setattr(model.TiedDecoder, "forward", forward)

        def read_bias(layer):
            return layer.bias.data().copy()

        def write_bias(layer, value):
            layer.bias.data()[:] = value

    return locals()


# preset -> {fault: (the case that must catch it, the layer localisation must name)}
GENERATION_EXPECTED = {
    "d2l": {
        "biases_dropped": ("full_valid_len", "blks.0.attention"),
        "sinusoidal_positions": ("batch_one", "embedding"),
    },
    "d2l-0.12": {
        "interleaved_valid_lens": ("mixed_valid_lens", "blks.0.attention"),
        "biases_dropped": ("no_valid_lens", "blks.0.attention"),
        "sinusoidal_positions": ("single_segment", "embedding"),
    },
    "d2l-0.11": {
        "interleaved_valid_lens": ("mixed_valid_lens", "blks.0.attention"),
        "bias_added": ("full_valid_len", "blks.0.attention"),
        "no_sinusoidal_table": ("batch_one", "embedding"),
    },
    "bert": {
        "embedding_norm_dropped": ("batch_one", "embedding"),
        "relu_for_gelu": ("batch_one", "blks.0.ffn"),
        "tanh_for_erf": ("batch_one", "blks.0.ffn"),
        "eps_of_d2l": ("batch_one", "embedding"),
        "untied_decoder": ("edge_pred_positions", "mlm"),
    },
}
GENERATION_RUNS = [(preset, fault) for preset, faults in GENERATION_EXPECTED.items() for fault in faults]
# The generation faults patch the classes' __init__ and forward: PyTorch's and Gluon's (Flax's are dataclasses).
GENERATION_FAULT_SETS = ["mxnet", "torch"]


@pytest.mark.parametrize("preset, fault", GENERATION_RUNS)
@pytest.mark.parametrize("backend", GENERATION_FAULT_SETS)
def test_another_generations_rule_is_caught_and_localised(backend, preset, fault, monkeypatch):
    if not_in_process(backend):  # the faults are planted in this process
        pytest.skip(not_in_process(backend))
    config = CONFIG.with_semantics(preset)
    generation_faults(backend)[fault](monkeypatch)
    catching_case, layer = GENERATION_EXPECTED[preset][fault]
    cases = [(case.name, case.batch(config, seed=2)) for case in CASES]
    report = run_conformance(
        config, random_weights(config, seed=2, dtype="float64"), [Target(backend, "float64")], cases, pairs=False
    )
    failing = {check.case: check.first_divergence for check in report.failures()}
    assert catching_case in failing, f"{fault} went unnoticed by {catching_case} in {preset}"
    assert {c.name for c in failing.values()} == {layer}


@pytest.mark.parametrize("preset", sorted(GENERATION_EXPECTED))
@pytest.mark.parametrize("backend", sorted(FAULT_SETS))
def test_each_generation_passes_without_faults(backend, preset):
    if not_in_process(backend):  # the faults are planted in this process
        pytest.skip(not_in_process(backend))
    config = CONFIG.with_semantics(preset)
    cases = [(case.name, case.batch(config, seed=2)) for case in CASES]
    report = run_conformance(
        config, random_weights(config, seed=2, dtype="float64"), [Target(backend, "float64")], cases, pairs=False
    )
    assert report.passed and len(report.checks) == len(CASES)
