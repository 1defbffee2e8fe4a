"""Rules no other test pinned down (issues 26 and 40): each of these tests fails when its rule is broken."""

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


def test_a_fused_tensor_mapped_as_a_transposed_part_reads_back_exactly_the_part_written():
    """``qkv[k/3].T``: the user's (H, 3H) tensor holds W_q, W_k and W_v transposed, side by side."""
    from bert_multi.verify.map_file import parse_placement
    from bert_multi.verify.mapping import ParameterMap

    rng = np.random.default_rng(0)
    parts = {f"W_{x}": rng.standard_normal((6, 4)) for x in "qkv"}  # canonical (out, in)
    placements = {name: parse_placement(f"qkv[{k}/3].T") for k, name in enumerate(parts)}
    mapping = ParameterMap(placements, {"qkv": (4, 18)}, "a map file")
    fused = mapping.to_user(parts)["qkv"]
    np.testing.assert_array_equal(fused, np.concatenate(list(parts.values())).T)  # by hand: stacked, transposed
    back = mapping.to_canonical({"qkv": fused}, {name: (6, 4) for name in parts})
    assert all(np.array_equal(back[name], parts[name]) for name in parts)
    assert parse_placement("qkv.T[1/3]") == parse_placement("qkv[1/3].T")  # either order says the same


def test_a_repeated_field_of_a_map_pattern_stands_for_the_same_text():
    from bert_multi.verify.map_file import MapFile

    rules = MapFile({"encoder.blks.{i}.ln{i}.{p}": "b{i}.{p}"}, (), "map.json")
    found = rules.expand(["encoder.blks.1.ln1.weight", "encoder.blks.1.ln2.weight", "encoder.blks.2.ln2.bias"])
    assert {name: placement.name for name, placement in found.items()} == {
        "encoder.blks.1.ln1.weight": "b1.weight",
        "encoder.blks.2.ln2.bias": "b2.bias",
    }


def test_verify_masking_reports_a_function_that_changes_cls_or_sep():
    from subjects.masking import get_mlm_data_from_tokens

    from bert_multi.verify.masking import verify_masking

    def changes(special):
        def masking(tokens, vocab):
            ids, positions, labels = get_mlm_data_from_tokens(tokens, vocab)
            at = tokens.index(special)
            return [vocab["<mask>"] if i == at else token for i, token in enumerate(ids)], positions, labels

        return masking

    assert verify_masking(get_mlm_data_from_tokens, calls=300).passed
    for special in ("<cls>", "<sep>"):
        report = verify_masking(changes(special), calls=300)
        assert not report.passed and "a token that is not predicted was changed" in report.checks[0].detail


def test_a_backend_that_breaks_the_contract_is_refused_and_leaves_its_name_free():
    from types import SimpleNamespace

    from bert_multi import BackendContractError, register_backend, unregister_backend

    def build(config, weights, device="cpu", dtype=None):
        return bm.load_backend("numpy").build(config, weights, device=device, dtype=dtype)

    with pytest.raises(BackendContractError):
        register_backend(SimpleNamespace(NAME="pinned", build="not callable"))
    assert "pinned" not in bm.backends()
    register_backend(SimpleNamespace(NAME="pinned", build=build))  # the name is free again
    try:
        assert "pinned" in bm.backends()
    finally:
        unregister_backend("pinned")


@pytest.mark.parametrize("device", ["cpu:0", "cpu:1", "tpu", "tpu:0", "cuda:x", ""])
def test_a_device_string_outside_the_grammar_is_refused(device):
    from bert_multi.backend.contract import parse_device

    with pytest.raises(bm.UsageError, match=f"unknown device {device!r}: expected 'cpu', 'cuda'"):
        parse_device(device)


@pytest.mark.parametrize("p", [0.1, 0.2, 1 / 3, 0.5, 0.9])
def test_the_cpu_dropout_drops_exactly_its_share_of_the_possible_draws(monkeypatch, p):
    """Fed each of the 2**16 values a draw can take once, torch's CPU dropout drops round(p * 2**16) of
    the elements and scales the others by 2**16 / (2**16 - dropped): the expectation is exact."""
    framework("torch")
    torch = importlib.import_module("torch")
    from bert_multi.torch.model import Dropout

    every_draw = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)[torch.randperm(2**16)]

    def random_(tensor, *args):
        tensor.view(torch.int16).copy_(every_draw)
        return tensor

    monkeypatch.setattr(torch.Tensor, "random_", random_)
    dropout = Dropout(p).train()
    out = dropout(torch.ones(2**16, dtype=torch.float64))
    dropped = round(p * 2**16)
    assert int((out == 0).sum()) == dropped
    assert torch.all(out[out != 0] == 2**16 / (2**16 - dropped))
