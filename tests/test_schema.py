import dataclasses
from collections.abc import Mapping

import numpy as np
import pytest

from bert_multi import (
    BERTConfig,
    WeightsError,
    init_weights,
    load_backend,
    param_shapes,
    random_weights,
    validate_weights,
)
from bert_multi.backend.contract import shareable, stream_weights
from bert_multi.engine.cases import CUT_MAX_LEN, get_case
from bert_multi.spec.schema import cut_max_len

CONFIGS = [
    BERTConfig(vocab_size=10000, num_hiddens=768, ffn_num_hiddens=1024, num_heads=4, num_blks=2),
    BERTConfig(vocab_size=11, num_hiddens=6, ffn_num_hiddens=5, num_heads=1, num_blks=1, max_len=7),
    BERTConfig(vocab_size=20, num_hiddens=12, ffn_num_hiddens=8, num_heads=3, num_blks=3, max_len=4),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_schema_matches_design(config):
    shapes = param_shapes(config)
    H, F, V, L = config.num_hiddens, config.ffn_num_hiddens, config.vocab_size, config.num_blks
    assert len(shapes) == 3 + 16 * L + 2 + 6 + 2  # 45 for two blocks, as docs/design.md says
    assert shapes["encoder.pos_embedding"] == (1, config.max_len, H)
    assert shapes["encoder.token_embedding.weight"] == (V, H)
    assert shapes["encoder.segment_embedding.weight"] == (2, H)
    for i in range(L):
        for p in "qkvo":
            assert shapes[f"encoder.blks.{i}.attention.W_{p}.weight"] == (H, H)
            assert shapes[f"encoder.blks.{i}.attention.W_{p}.bias"] == (H,)
        assert shapes[f"encoder.blks.{i}.ffn.dense1.weight"] == (F, H)
        assert shapes[f"encoder.blks.{i}.ffn.dense2.weight"] == (H, F)
        for n in (1, 2):
            assert shapes[f"encoder.blks.{i}.addnorm{n}.ln.weight"] == (H,)
    assert shapes["hidden.0.weight"] == (H, H)
    assert shapes["mlm.mlp.0.weight"] == (H, H)
    assert shapes["mlm.mlp.2.weight"] == (H,)  # the LayerNorm
    assert shapes["mlm.mlp.3.weight"] == (V, H)
    assert shapes["mlm.mlp.3.bias"] == (V,)
    assert shapes["nsp.output.weight"] == (2, H)
    # torch's state_dict order: the encoder's own parameter first, then its children in order.
    names = list(shapes)
    assert names[:4] == [
        "encoder.pos_embedding",
        "encoder.token_embedding.weight",
        "encoder.segment_embedding.weight",
        "encoder.blks.0.attention.W_q.weight",
    ]
    assert names[-2:] == ["nsp.output.weight", "nsp.output.bias"]


def test_two_block_schema_has_45_tensors():
    assert len(param_shapes(CONFIGS[0])) == 45


@pytest.mark.parametrize("make", [init_weights, random_weights])
def test_weights_are_deterministic_and_follow_the_schema(make):
    config = CONFIGS[2]
    a, b, other = make(config, seed=3), make(config, seed=3), make(config, seed=4)
    assert list(a) == list(param_shapes(config))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["encoder.token_embedding.weight"], other["encoder.token_embedding.weight"])
    assert validate_weights(config, a) == "float32"
    assert validate_weights(config, make(config, dtype="float64")) == "float64"


def test_init_weights_follow_berts_recipe():
    w = init_weights(CONFIGS[0], seed=0)
    assert np.all(w["encoder.blks.0.attention.W_q.bias"] == 0)
    assert np.all(w["encoder.blks.1.addnorm2.ln.weight"] == 1) and np.all(w["mlm.mlp.2.bias"] == 0)
    assert abs(w["encoder.token_embedding.weight"].std() - 0.02) < 1e-3
    assert abs(w["encoder.blks.0.ffn.dense1.weight"].mean()) < 1e-3


def test_random_weights_make_every_tensor_matter():
    w = random_weights(CONFIGS[0], seed=0, dtype="float64")
    for name, array in w.items():
        assert np.unique(array).size > 1, f"{name} is constant, so a backend mistake on it would go unseen"
    assert abs(w["encoder.blks.0.ffn.dense2.weight"].std() - 1 / np.sqrt(1024)) < 1e-3


def test_init_weights_rejects_an_unsupported_dtype():
    with pytest.raises(ValueError, match="unsupported dtype 'float16'"):
        init_weights(CONFIGS[1], dtype="float16")


def corrupt(weights, name, value):
    return {**weights, name: value}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda w: {k: v for k, v in w.items() if k != "hidden.0.bias"}, r"missing tensor\(s\) \['hidden.0.bias'\]"),
        (lambda w: {**w, "pooler.weight": w["hidden.0.weight"]}, r"unexpected tensor\(s\) \['pooler.weight'\]"),
        (
            lambda w: corrupt(w, "mlm.mlp.3.bias", w["mlm.mlp.3.bias"][:-1]),
            r"'mlm.mlp.3.bias' has shape \(10,\), expected \(11,\)",
        ),
        (
            lambda w: corrupt(w, "nsp.output.bias", w["nsp.output.bias"].astype("float64")),
            "expected float32 like the others",
        ),
        (lambda w: corrupt(w, "nsp.output.bias", w["nsp.output.bias"].astype("int32")), "has dtype int32"),
        (lambda w: corrupt(w, "nsp.output.bias", list(w["nsp.output.bias"])), "must be a numpy.ndarray"),
        (
            lambda w: corrupt(
                w, "mlm.mlp.0.weight", np.where(np.eye(6) > 0, np.nan, w["mlm.mlp.0.weight"]).astype("float32")
            ),
            r"'mlm.mlp.0.weight' has a non-finite value nan at index \(0, 0\)",
        ),
    ],
)
def test_validate_weights_names_the_problem(mutate, message):
    weights = init_weights(CONFIGS[1])
    with pytest.raises(WeightsError, match=message):
        validate_weights(CONFIGS[1], mutate(weights))


@pytest.mark.parametrize("preset", ["d2l", "d2l-0.11", "bert"])
def test_a_model_cut_to_a_shorter_max_len_computes_what_the_whole_one_does(preset):
    """The max_len case runs on a model cut to its first positions (cases.CUT_MAX_LEN): that model is the
    same computation on every input it accepts, from views of the same weights."""
    config = BERTConfig(vocab_size=23, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=2, max_len=40)
    config = config.with_semantics(preset)
    weights = random_weights(config, seed=5, dtype="float64")
    cut_config, cut = cut_max_len(config, weights, 6)
    assert cut_config == dataclasses.replace(config, max_len=6)
    assert {name: array.shape for name, array in cut.items()} == param_shapes(cut_config)
    assert all(np.shares_memory(cut[name], weights[name]) for name in weights)  # views, never copies
    oracle = load_backend("numpy")
    batch = get_case("max_len").batch(cut_config, seed=5)  # T = 6, the cut model's max_len
    whole, part = (oracle.build(c, w)(**batch, intermediates=True) for c, w in ((config, weights), (cut_config, cut)))
    for name in ("encoded", "mlm", "nsp"):
        np.testing.assert_array_equal(getattr(part, name), getattr(whole, name))
    assert cut_max_len(config, weights, config.max_len) == (config, weights)
    for bad in (0, config.max_len + 1):
        with pytest.raises(ValueError, match="cannot cut"):
            cut_max_len(config, weights, bad)


def test_the_max_len_case_is_cut_only_where_max_len_is_longer_than_the_cut():
    long = BERTConfig(vocab_size=23, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=1, max_len=1000)
    name, batch, max_len = get_case("max_len").input(long)
    assert (name, max_len, batch["tokens"].shape[1]) == ("max_len", CUT_MAX_LEN, CUT_MAX_LEN)
    short = dataclasses.replace(long, max_len=CUT_MAX_LEN - 1)
    _, batch, max_len = get_case("max_len").input(short)
    assert max_len is None and batch["tokens"].shape[1] == short.max_len
    _, batch, max_len = get_case("mixed_valid_lens").input(long)  # the other cases never are
    assert max_len is None


class CountedReads(Mapping):
    """A mapping that hands out a fresh copy of each tensor each time one is asked for, as an open .npz
    does, and counts the reads."""

    def __init__(self, weights):
        self.weights, self.reads = weights, []

    def __getitem__(self, name):
        self.reads.append(name)
        return self.weights[name].copy()

    def __iter__(self):
        return iter(self.weights)

    def __len__(self):
        return len(self.weights)


def test_stream_weights_checks_every_tensor_before_it_yields_one_and_reads_each_twice():
    """A build fed tensor by tensor must not have built half a model from weights whose last tensor is
    bad; after the check, each tensor is read once more as it is reached, and the cast one is the read
    one where no cast is needed (a fresh read is the model's own to keep)."""
    weights = init_weights(CONFIGS[1])
    last = list(weights)[-1]
    with pytest.raises(WeightsError, match=f"tensor '{last}' has a non-finite value"):
        stream_weights(CONFIGS[1], CountedReads({**weights, last: np.full_like(weights[last], np.inf)}))
    reads = CountedReads(weights)
    dtype, arrays = stream_weights(CONFIGS[1], reads)
    assert dtype == "float32" and reads.reads == list(weights)
    for number, (name, given, cast) in enumerate(arrays, start=1):
        assert len(reads.reads) == len(weights) + number and reads.reads[-1] == name
        assert cast is given and shareable(cast, given, share=False, gradients=True) is False
        assert np.array_equal(cast, weights[name])
    _, arrays = stream_weights(CONFIGS[1], reads, "float64")
    name, given, cast = next(arrays)
    assert cast.dtype == np.float64 and shareable(cast, given, share=False, gradients=True)  # the cast's own
