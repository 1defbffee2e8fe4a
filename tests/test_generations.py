"""d2l's generations in the oracle, checked by hand and by property: the tiled valid_lens of d2l <= 0.15,
the sinusoidal table, the unbiased attention and the NSP head of d2l 0.11, and the presets' plumbing
(names, config, weight files)."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_multi import BERTConfig, WeightsError, load_backend, load_weights, param_shapes, random_weights, save_weights
from bert_multi.backend.oracle import masked_softmax, multi_head_attention, repeat_over_heads
from bert_multi.spec.inputs import ModelInputs
from bert_multi.spec.semantics import PRESETS, Semantics, described, semantics_for, sinusoidal_positions


def config_for(preset, **sizes):
    base = dict(vocab_size=13, num_hiddens=8, ffn_num_hiddens=6, num_heads=2, num_blks=1, max_len=10)
    return BERTConfig(**{**base, **sizes}, semantics=preset)


# --- Tiled valid_lens (d2l 0.12 - 0.15) -----------------------------------------------------------------


def test_tiled_and_interleaved_layouts_by_hand():
    # Rows are b0h0, b0h1, b1h0, b1h1 (split_heads). Interleaving gives each sample's heads its own
    # length; tiling gives row b*h + j the length of sample (b*h + j) mod B.
    assert repeat_over_heads(np.array([1, 3]), 2, "interleaved").tolist() == [1, 1, 3, 3]
    assert repeat_over_heads(np.array([1, 3]), 2, "tiled").tolist() == [1, 3, 1, 3]
    assert repeat_over_heads(np.array([[1, 2], [3, 4]]), 2, "tiled").tolist() == [[1, 2], [3, 4], [1, 2], [3, 4]]
    assert repeat_over_heads(np.array([5, 6, 7]), 2, "tiled").tolist() == [5, 6, 7, 5, 6, 7]


def test_interleaved_attention_gives_each_sample_its_own_length_and_tiled_does_not():
    config = config_for("d2l-0.12", num_hiddens=4, max_len=4)
    weights = random_weights(config, seed=3, dtype="float64")
    X = np.random.default_rng(0).standard_normal((2, 4, 4))
    prefix = "encoder.blks.0.attention"
    interleaved = multi_head_attention(X, np.array([1, 3]), weights, prefix, 2, PRESETS["d2l"])
    per_sample = [
        multi_head_attention(X[b : b + 1], np.array([length]), weights, prefix, 2, PRESETS["d2l"])[0]
        for b, length in enumerate((1, 3))
    ]
    assert np.allclose(interleaved, np.stack(per_sample), rtol=0, atol=1e-12)
    tiled = multi_head_attention(X, np.array([1, 3]), weights, prefix, 2, config.semantics)
    assert not np.allclose(tiled, interleaved)


def heads_before_output(X, valid_lens, weights, prefix, num_heads, layout):
    """Per-head attention outputs (B, h, T, d) before W_o, with the given layout."""
    from bert_multi.backend.oracle import dense, split_heads

    q, k, v = (split_heads(dense(X, weights, f"{prefix}.{w}"), num_heads) for w in ("W_q", "W_k", "W_v"))
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    attention = masked_softmax(scores, repeat_over_heads(valid_lens, num_heads, layout))
    out = attention @ v
    return out.reshape(X.shape[0], num_heads, *out.shape[1:])


def test_each_tiled_head_is_the_head_computed_with_the_length_the_rule_gives_it():
    config = config_for("d2l-0.12", num_hiddens=6, num_heads=3, max_len=5)
    weights = random_weights(config, seed=4, dtype="float64")
    X = np.random.default_rng(1).standard_normal((2, 5, 6))
    lens = np.array([2, 5])
    tiled = heads_before_output(X, lens, weights, "encoder.blks.0.attention", 3, "tiled")
    for b in range(2):
        for j in range(3):
            length = lens[(b * 3 + j) % 2]
            alone = heads_before_output(
                X[b : b + 1], np.array([length]), weights, "encoder.blks.0.attention", 3, "interleaved"
            )
            assert np.allclose(tiled[b, j], alone[0, j], rtol=0, atol=1e-12), (b, j, length)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_tiled_and_interleaved_agree_exactly_when_and_only_when_valid_lens_are_equal(data):
    B = data.draw(st.integers(2, 4))
    T = data.draw(st.integers(2, 6))
    heads = data.draw(st.sampled_from([2, 3]))
    lens = np.array(data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
    config = config_for("d2l", num_hiddens=2 * heads * 2, num_heads=heads, max_len=T)
    weights = random_weights(config, seed=data.draw(st.integers(0, 5)), dtype="float64")
    batch = ModelInputs(np.random.default_rng(0).integers(0, 13, (B, T)), np.zeros((B, T), dtype=np.int64), lens, None)
    oracle = load_backend("numpy")
    interleaved = oracle.build(config, weights)._forward(batch, False).encoded
    tiled = oracle.build(config.with_semantics("d2l-0.12"), weights)._forward(batch, False).encoded
    if (lens == lens[0]).all():
        assert np.array_equal(tiled, interleaved)
    else:  # some sample then has a head that masks with another sample's length
        assert not np.allclose(tiled, interleaved, rtol=0, atol=1e-9)


# --- d2l 0.11: sinusoidal positions, unbiased attention, the NSP MLP --------------------------------------


def test_the_sinusoidal_table_is_the_closed_form():
    table = sinusoidal_positions(50, 6)
    for pos in (0, 1, 7, 49):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-15)
    with pytest.raises(ValueError, match="even num_hiddens"):
        sinusoidal_positions(5, 3)
    with pytest.raises(ValueError, match="must be even for sinusoidal positions"):
        config_for("d2l-0.11", num_hiddens=9, num_heads=3)


def test_d2l_0_11_adds_the_table_instead_of_a_learned_embedding():
    config = config_for("d2l-0.11")
    weights = random_weights(config, seed=5, dtype="float64")
    tokens, segments = np.array([[1, 2, 3, 4]]), np.array([[0, 0, 1, 1]])
    out = load_backend("numpy").build(config, weights)(tokens, segments, intermediates=True)
    expected = (
        weights["encoder.token_embedding.weight"][tokens]
        + weights["encoder.segment_embedding.weight"][segments]
        + sinusoidal_positions(10, 8)[:4]
    )
    assert np.allclose(out.intermediates["embedding"], expected, rtol=0, atol=1e-15)
    assert "encoder.pos_embedding" not in weights


def test_d2l_0_11_attention_has_no_biases_and_its_nsp_head_is_an_mlp_on_cls():
    config = config_for("d2l-0.11")
    shapes = param_shapes(config)
    assert "encoder.blks.0.attention.W_q.weight" in shapes and "encoder.blks.0.attention.W_q.bias" not in shapes
    assert [name for name in shapes if name.startswith("nsp.")] == [
        "nsp.mlp.0.weight",
        "nsp.mlp.0.bias",
        "nsp.mlp.2.weight",
        "nsp.mlp.2.bias",
    ]
    assert "hidden.0.weight" not in shapes
    weights = random_weights(config, seed=6, dtype="float64")
    out = load_backend("numpy").build(config, weights)(np.array([[3, 1, 4, 1]]), np.zeros((1, 4), int))
    cls = out.encoded[:, 0, :]
    pooled = np.tanh(cls @ weights["nsp.mlp.0.weight"].T + weights["nsp.mlp.0.bias"])
    assert np.allclose(out.nsp, pooled @ weights["nsp.mlp.2.weight"].T + weights["nsp.mlp.2.bias"], rtol=0, atol=1e-14)
    # Without biases, attention maps zero inputs to exactly zero; with d2l >= 0.12's it does not.
    zeros = np.zeros((1, 3, 8))
    assert not multi_head_attention(zeros, None, weights, "encoder.blks.0.attention", 2, config.semantics).any()
    biased = random_weights(config.with_semantics("d2l"), seed=6, dtype="float64")
    assert multi_head_attention(zeros, None, biased, "encoder.blks.0.attention", 2, PRESETS["d2l"]).any()


# --- Presets: names, versions, configs and files ------------------------------------------------------


@pytest.mark.parametrize(
    "version, preset",
    [
        ("0.11.4", "d2l-0.11"),
        ("0.12.0", "d2l-0.12"),
        ("0.15.1", "d2l-0.12"),
        ("0.16.6", "d2l"),
        ("d2l==1.0.3", "d2l"),
        ("d2l-1.0", "d2l"),  # the default preset, spelled as its release
        ("d2l-0.14.4", "d2l-0.12"),
        ("D2L 0.17", "d2l"),
        ("d2l == 0.11.2", "d2l-0.11"),
        ("v1.0.3", "d2l"),
    ],
)
def test_a_d2l_version_picks_its_preset(version, preset):
    assert semantics_for(version) == PRESETS[preset] and semantics_for(version).name == preset


def test_unknown_presets_and_versions_are_explained():
    with pytest.raises(ValueError, match="unknown preset 'bert-large'"):
        semantics_for("bert-large")
    with pytest.raises(ValueError, match=r"d2l 0.10.1 is no release with BERT's chapter \(never released, or before"):
        semantics_for("0.10.1")
    with pytest.raises(ValueError, match="unknown preset 'd2l-one'"):
        semantics_for("d2l-one")
    with pytest.raises(ValueError, match="Semantics.positions is 'rotary'"):
        Semantics(positions="rotary")


def test_switches_no_preset_has_are_described_by_the_nearest_preset_and_what_differs():
    # A BERT with its own MLM decoder is no preset, but the original BERT in all else: not "the original BERT".
    untied = dataclasses.replace(PRESETS["bert"], mlm_decoder="own")
    assert described(untied) == "the original BERT (Devlin et al. 2018; HuggingFace's BertModel) with mlm_decoder='own'"
    two = dataclasses.replace(PRESETS["d2l"], activation="gelu", layer_norm_eps=1e-12)
    assert described(two) == "d2l 0.16 - 1.0 with activation='gelu', layer_norm_eps=1e-12"
    assert described(PRESETS["d2l-0.12"], "torch") == "d2l 0.12 - 0.15's computation, ported: d2l published that " + (
        "generation for MXNet only"
    )


@pytest.mark.parametrize("version", ["0.18", "0.99", "1.5", "1.0.4", "0.13.3", "0.14.4.1", "2.0"])
def test_a_version_d2l_never_released_is_refused_naming_what_each_generation_covers(version):
    with pytest.raises(ValueError, match=f"d2l {re.escape(version)} is no release with BERT's chapter") as caught:
        semantics_for(version)
    assert str(caught.value).endswith(
        "the releases with BERT's chapter are 0.11.0 - 0.11.4 (preset d2l-0.11), 0.12.0 - 0.15.1 (preset "
        "d2l-0.12), 0.16.0 - 1.0.3 (preset d2l)"
    )


def test_every_release_picks_the_preset_whose_span_holds_it():
    from bert_multi.spec.semantics import D2L_RELEASES, RELEASES

    for release in D2L_RELEASES:
        version = tuple(map(int, release.split(".")[:2]))
        (expected,) = [name for name, (first, last) in RELEASES.items() if first <= version <= last]
        assert semantics_for(release).name == expected == semantics_for(".".join(release.split(".")[:2])).name


def test_a_config_records_its_preset_and_round_trips():
    config = config_for("0.14.4")
    assert config.semantics.name == "d2l-0.12" and "semantics='d2l-0.12'" in repr(config)
    assert BERTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert "semantics" not in config_for("d2l").to_dict()  # d2l 1.0 configs read as before generations
    custom = config.with_semantics(Semantics(attention_bias=False))
    assert custom.semantics.name == "custom" and BERTConfig.from_dict(custom.to_dict()) == custom


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_weight_files_carry_the_preset(tmp_path, preset):
    config = config_for(preset)
    weights = random_weights(config, seed=7)
    path = save_weights(tmp_path / "w.npz", config, weights)
    loaded_config, loaded = load_weights(path)
    assert loaded_config == config and list(loaded) == list(param_shapes(config))
    with np.load(path) as archive:
        manifest = json.loads(archive["__manifest__"].tobytes())
    # d2l 1.0 files stay format version 1, readable by bert_multi releases older than generations.
    assert manifest["format_version"] == (1 if preset == "d2l" else 2)


def test_a_reader_that_predates_generations_refuses_their_files(tmp_path, monkeypatch):
    import bert_multi.spec.weight_file as weights_module

    config = config_for("d2l-0.11")
    path = save_weights(tmp_path / "w.npz", config, random_weights(config))
    monkeypatch.setattr(weights_module, "FORMAT_VERSION", 1)
    with pytest.raises(WeightsError, match="format version 2 is newer than this bert_multi reads"):
        load_weights(path)


def test_weights_of_one_generation_do_not_load_as_another():
    config = config_for("d2l-0.11")
    weights = random_weights(config)
    with pytest.raises(WeightsError, match=r"missing tensor\(s\) \['encoder.pos_embedding'"):
        load_backend("numpy").build(config.with_semantics("d2l"), weights)
