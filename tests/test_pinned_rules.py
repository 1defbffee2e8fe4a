"""Rules no other test pinned down (issue 26): each of these tests fails when its rule is broken."""

import importlib
import json

import numpy as np
import pytest

import bert_multi as bm
from bert_multi import WeightsError
from bert_multi.backend.registry import not_in_process


def framework(name):
    """The framework's package in this process, else a skip saying why (a backend run by a worker in
    another environment has no classes here)."""
    reason = not_in_process(name)
    if reason:
        pytest.skip(reason)
    return importlib.import_module(f"bert_multi.{name}")


@pytest.mark.parametrize("name", ["torch", "mxnet", "jax"])
def test_d2l_0_11s_sinusoidal_positions_are_followed_by_dropout_in_training(name):
    framework(name)
    d2l = importlib.import_module(f"bert_multi.{name}.d2l_0_11")
    # No blocks: the encoder's output is dropout(token + segment + positions), so dropout shows exactly.
    encoder = d2l.BERTEncoder(vocab_size=5, num_hiddens=8, ffn_num_hiddens=4, num_heads=2, num_layers=0, dropout=0.5)
    tokens, segments = np.array([[1, 2, 3, 4] * 8]), np.zeros((1, 32), dtype=np.int64)
    if name == "torch":
        import torch

        encoder.train()
        train = encoder(torch.from_numpy(tokens), torch.from_numpy(segments), None).detach().numpy()
        encoder.eval()
        infer = encoder(torch.from_numpy(tokens), torch.from_numpy(segments), None).detach().numpy()
    elif name == "jax":
        import jax

        params = encoder.init(jax.random.key(0), tokens, segments, None)
        # Framework difference: dropout is on for a call that says training=True, with its own random key.
        train = np.asarray(encoder.apply(params, tokens, segments, None, True, rngs={"dropout": jax.random.key(1)}))
        infer = np.asarray(encoder.apply(params, tokens, segments, None))
    else:
        from mxnet import autograd
        from mxnet import np as mnp

        encoder.initialize()
        with autograd.record(train_mode=True):
            train = encoder(mnp.array(tokens), mnp.array(segments), None).asnumpy()
        infer = encoder(mnp.array(tokens), mnp.array(segments), None).asnumpy()
    dropped = train == 0
    assert 0.3 < dropped.mean() < 0.7  # about half, at p = 0.5 (256 elements: 7 standard deviations apart)
    np.testing.assert_allclose(train[~dropped], 2 * infer[~dropped], rtol=1e-6)  # the rest scaled by 1 / (1 - p)


@pytest.mark.parametrize("name", ["torch", "mxnet", "jax"])
@pytest.mark.parametrize("generation", ["d2l_0_11", "d2l_0_12", "d2l_0_17"])
def test_an_earlier_generations_attention_honours_its_own_bias_argument(name, generation):
    framework(name)
    d2l = importlib.import_module(f"bert_multi.{name}.{generation}")
    sized = name == "torch" and generation == "d2l_0_17"  # (key_size, query_size, value_size, num_hiddens, ...)
    keyword = "bias" if sized else "use_bias"
    if generation == "d2l_0_11" and not sized:
        keyword = "use_bias"  # 0.11 had no such argument; bert_multi's adapter takes it, default False
    head = (8, 8, 8) if sized else ()
    default = d2l.MultiHeadAttention(*head, 8, 2, 0.0)
    with_bias = d2l.MultiHeadAttention(*head, 8, 2, 0.0, **{keyword: True})
    assert _biases(default, name) == 0 and _biases(with_bias, name) == 4


def _biases(attention, name):
    if name == "torch":
        return sum(1 for n, _ in attention.named_parameters() if n.endswith("bias"))
    if name == "jax":
        import jax

        X = np.ones((1, 3, 8), dtype=np.float32)
        params = attention.init(jax.random.key(0), X, X, X, None)
        return sum(1 for path, _ in jax.tree_util.tree_leaves_with_path(params) if path[-1].key == "bias")
    return sum(1 for n in attention._collect_params_with_prefix() if n.endswith("bias"))


def test_the_module_prefix_is_stripped_only_when_every_name_has_it(tmp_path):
    torch = framework("torch") and importlib.import_module("torch")
    config = bm.BERTConfig(11, 4, 6, 2, 1, max_len=6)
    weights = bm.random_weights(config)
    everything = {f"module.{n}": torch.from_numpy(a) for n, a in weights.items()}
    torch.save(everything, tmp_path / "wrapped.pt")
    assert set(bm.load_checkpoint(tmp_path / "wrapped.pt", num_heads=2, preset="d2l").weights) == set(weights)
    mixed = dict(everything)
    first = next(iter(weights))
    mixed[first] = mixed.pop(f"module.{first}")  # one name without the prefix: refused, not merged
    torch.save(mixed, tmp_path / "mixed.pt")
    with pytest.raises(WeightsError, match="not those of a d2l BERT") as caught:
        bm.load_checkpoint(tmp_path / "mixed.pt", num_heads=2, preset="d2l")
    assert "module." in str(caught.value)


@pytest.mark.parametrize(
    "act, expected", [("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu")]
)
def test_huggingface_activation_names_mean_what_transformers_computes(tmp_path, act, expected):
    config = bm.BERTConfig(11, 4, 6, 2, 1, max_len=6, semantics="bert")
    bm.save_checkpoint(tmp_path / "hf", config, bm.random_weights(config), framework="huggingface")
    document = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**document, "hidden_act": act}))
    assert bm.load_checkpoint(tmp_path / "hf").config.semantics.activation == expected
