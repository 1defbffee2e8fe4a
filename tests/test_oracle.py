"""The NumPy oracle, checked independently: hand-worked values and properties, never itself."""

import math

import numpy as np
import pytest

from bert_multi import BERTConfig, CannotRunHere, intermediate_names, load_backend, param_shapes, random_weights
from bert_multi.backend.oracle import masked_softmax, merge_heads, repeat_over_heads, split_heads

E = math.e


def test_masked_softmax_masks_keys_at_and_beyond_valid_len():
    scores = np.array([[[1.0, 2.0, 3.0]]])
    got = masked_softmax(scores, np.array([2]))
    assert got == pytest.approx(np.array([[[E / (E + E**2), E**2 / (E + E**2), 0.0]]]), abs=1e-15)


def test_masked_softmax_with_valid_len_zero_is_uniform():
    # Every key is masked to -1e6, so softmax sees equal scores: d2l's -1e6 (not -inf) gives 1/3 each, not NaN.
    got = masked_softmax(np.array([[[5.0, -2.0, 0.5]]]), np.array([0]))
    assert got == pytest.approx(np.full((1, 1, 3), 1 / 3), abs=1e-15)


def test_masked_softmax_with_2d_valid_lens_masks_each_query_row():
    got = masked_softmax(np.zeros((1, 2, 4)), np.array([[1, 3]]))
    assert got == pytest.approx(np.array([[[1, 0, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0]]]), abs=1e-15)


def test_masked_softmax_without_valid_lens_is_plain_softmax():
    got = masked_softmax(np.array([[[0.0, math.log(3.0)]]]), None)
    assert got == pytest.approx(np.array([[[0.25, 0.75]]]), abs=1e-15)


def test_valid_lens_repeat_interleaved_over_heads():
    assert repeat_over_heads(np.array([1, 3]), 2).tolist() == [1, 1, 3, 3]
    assert repeat_over_heads(np.array([[1, 2], [3, 4]]), 2).tolist() == [[1, 2], [1, 2], [3, 4], [3, 4]]


def test_head_split_layout():
    B, T, h, d = 2, 3, 4, 5
    X = np.arange(B * T * h * d, dtype=float).reshape(B, T, h * d)
    split = split_heads(X, h)
    assert split.shape == (B * h, T, d)
    for b in range(B):
        for j in range(h):  # row b*h + j is batch b, head j: features j*d .. j*d + d - 1
            assert np.array_equal(split[b * h + j], X[b, :, j * d : (j + 1) * d])
    assert np.array_equal(merge_heads(split, h), X)


# A one-head, one-block model on H=2 whose every step can be worked by hand. W_q = W_k = 0 makes every
# attention score 0, so attention averages the valid value rows; every other dense layer is the identity.
TINY = BERTConfig(vocab_size=3, num_hiddens=2, ffn_num_hiddens=2, num_heads=1, num_blks=1, max_len=3)
EPS = 1e-5


def hand_weights():
    identity = np.eye(2)
    w = {
        "encoder.pos_embedding": np.array([[[0.0, 0.0], [0.0, 0.0], [5.0, 5.0]]]),  # row 2 unused at T=2
        "encoder.token_embedding.weight": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
        "encoder.segment_embedding.weight": np.array([[0.0, 0.0], [1.0, -1.0]]),
    }
    for name, shape in param_shapes(TINY).items():
        if name.endswith("W_q.weight") or name.endswith("W_k.weight"):
            w[name] = np.zeros((2, 2))
        elif name.endswith("ln.weight") or name == "mlm.mlp.2.weight":
            w[name] = np.ones(2)
        elif name.endswith(".weight") and name not in w:
            w[name] = identity
        elif name.endswith(".bias"):
            w[name] = np.zeros(shape)
    w["mlm.mlp.3.weight"] = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w["nsp.output.bias"] = np.array([0.0, 0.5])
    return w


def test_one_head_one_block_model_worked_by_hand():
    model = load_backend("numpy").build(TINY, hand_weights())
    out = model(np.array([[0, 1]]), np.array([[0, 0]]), np.array([2]), np.array([[1, 1, 0]]), intermediates=True)
    # Embedding: token rows [1, 0] and [0, 1], segment 0 adds nothing, positions 0 and 1 add nothing.
    assert out.intermediates["embedding"][0] == pytest.approx(np.array([[1, 0], [0, 1]]), abs=1e-15)
    # Uniform attention over both keys: each row is the mean [0.5, 0.5].
    assert out.intermediates["blks.0.attention"][0] == pytest.approx(np.full((2, 2), 0.5), abs=1e-15)
    # X + A = [[1.5, 0.5], [0.5, 1.5]]: mean 1, variance 0.25, so LayerNorm gives +-a.
    a = 0.5 / math.sqrt(0.25 + EPS)
    assert out.intermediates["blks.0.addnorm1"][0] == pytest.approx(np.array([[a, -a], [-a, a]]), abs=1e-14)
    assert out.intermediates["blks.0.ffn"][0] == pytest.approx(np.array([[a, 0], [0, a]]), abs=1e-14)  # ReLU
    # Y + FFN(Y) = [[2a, -a], [-a, 2a]]: deviations +-1.5a, variance 2.25a^2.
    b = 1.5 * a / math.sqrt(2.25 * a * a + EPS)
    assert out.encoded[0] == pytest.approx(np.array([[b, -b], [-b, b]]), abs=1e-14)
    # Pooler tanh(<cls>) and NSP = pooler + [0, 0.5].
    assert out.nsp[0] == pytest.approx(np.array([math.tanh(b), -math.tanh(b) + 0.5]), abs=1e-14)
    # MLM at positions 1, 1, 0: ReLU keeps one coordinate (b), LayerNorm maps [0, b] to [-c, c].
    c = (b / 2) / math.sqrt(b * b / 4 + EPS)
    expected_mlm = np.array([[-c, c, 0.0], [-c, c, 0.0], [c, -c, 0.0]])  # logits x0, x1, x0 + x1
    assert out.mlm[0] == pytest.approx(expected_mlm, abs=1e-14)


def test_hand_model_with_valid_len_one_and_segment_b():
    model = load_backend("numpy").build(TINY, hand_weights())
    out = model(np.array([[0, 1]]), np.array([[0, 1]]), np.array([1]), intermediates=True)
    # Segment B adds [1, -1] to the second token: [0, 1] -> [1, 0].
    assert out.intermediates["embedding"][0] == pytest.approx(np.array([[1, 0], [1, 0]]), abs=1e-15)
    # Only key 0 is valid: every row attends to [1, 0]. X + A = [[2, 0], [2, 0]] -> LayerNorm [d, -d].
    d = 1 / math.sqrt(1 + EPS)
    assert out.intermediates["blks.0.addnorm1"][0] == pytest.approx(np.array([[d, -d], [d, -d]]), abs=1e-14)
    e = 1.5 * d / math.sqrt(2.25 * d * d + EPS)
    assert out.encoded[0] == pytest.approx(np.array([[e, -e], [e, -e]]), abs=1e-14)
    assert out.mlm is None


# Properties on random weights, with several heads so that the head layout matters.
CONFIG = BERTConfig(vocab_size=23, num_hiddens=12, ffn_num_hiddens=7, num_heads=3, num_blks=2, max_len=10)


@pytest.fixture(scope="module")
def oracle():
    return load_backend("numpy").build(CONFIG, random_weights(CONFIG, seed=5))


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CONFIG.vocab_size, (3, 8))
    segments = (np.arange(8) >= 4).astype(int)[None].repeat(3, 0)
    return tokens, segments


def test_tokens_beyond_valid_len_never_change_valid_positions(oracle, batch):
    tokens, segments = batch
    valid_lens = np.array([3, 8, 5])
    before = oracle(tokens, segments, valid_lens)
    noisy = tokens.copy()
    for b, n in enumerate(valid_lens):
        noisy[b, n:] = (noisy[b, n:] + 7) % CONFIG.vocab_size
    after = oracle(noisy, segments, valid_lens)
    for b, n in enumerate(valid_lens):
        np.testing.assert_allclose(after.encoded[b, :n], before.encoded[b, :n], rtol=0, atol=1e-13)
    np.testing.assert_allclose(after.nsp, before.nsp, rtol=0, atol=1e-13)
    assert not np.allclose(after.encoded[0, 3:], before.encoded[0, 3:])  # the padding itself did change


def test_segments_change_the_outputs(oracle, batch):
    tokens, segments = batch
    base = oracle(tokens, segments)
    flipped = oracle(tokens, 1 - segments)
    assert np.abs(base.encoded - flipped.encoded).min() > 0
    assert not np.allclose(base.nsp, flipped.nsp)


def test_pred_positions_select_exactly_the_gathered_rows(oracle, batch):
    tokens, segments = batch
    positions = np.array([[0, 7, 7, 2], [5, 0, 1, 7], [3, 3, 3, 3]])
    out = oracle(tokens, segments, np.array([4, 8, 6]), positions)
    assert out.mlm.shape == (3, 4, CONFIG.vocab_size)
    np.testing.assert_array_equal(out.mlm[0, 1], out.mlm[0, 2])  # a repeated position predicts the same
    for b in range(3):
        for k in range(4):  # each slot equals a call that asks for that position alone
            alone = oracle(tokens, segments, np.array([4, 8, 6]), np.full((3, 1), positions[b, k]))
            np.testing.assert_allclose(out.mlm[b, k], alone.mlm[b, 0], rtol=0, atol=1e-13)
    reversed_slots = oracle(tokens, segments, np.array([4, 8, 6]), positions[:, ::-1])
    np.testing.assert_allclose(reversed_slots.mlm, out.mlm[:, ::-1], rtol=0, atol=1e-13)


def test_each_batch_item_is_computed_as_if_alone(oracle, batch):
    # Fails if valid_lens were tiled over heads (b0, b1, ..., b0, b1) instead of interleaved (d2l <= 0.15).
    tokens, segments = batch
    for valid_lens in (np.array([2, 8, 5]), np.array([[1, 2, 3, 4, 5, 6, 7, 8], [8] * 8, [0, 1, 0, 1, 0, 1, 0, 1]])):
        together = oracle(tokens, segments, valid_lens, np.array([[1], [2], [3]]))
        for b in range(3):
            alone = oracle(tokens[b : b + 1], segments[b : b + 1], valid_lens[b : b + 1], np.array([[b + 1]]))
            np.testing.assert_allclose(together.encoded[b], alone.encoded[0], rtol=0, atol=1e-12)
            np.testing.assert_allclose(together.mlm[b], alone.mlm[0], rtol=0, atol=1e-12)


def test_equivalent_valid_lens_agree(oracle, batch):
    tokens, segments = batch
    T = tokens.shape[1]
    full = oracle(tokens, segments, np.full(3, T))
    np.testing.assert_allclose(oracle(tokens, segments).encoded, full.encoded, rtol=0, atol=1e-13)
    per_row = oracle(tokens, segments, np.array([3, 8, 5])[:, None].repeat(T, 1))
    np.testing.assert_allclose(
        per_row.encoded, oracle(tokens, segments, np.array([3, 8, 5])).encoded, rtol=0, atol=1e-13
    )


def test_intermediates_are_named_and_shaped(oracle, batch):
    tokens, segments = batch
    out = oracle(tokens, segments, intermediates=True)
    assert list(out.intermediates) == intermediate_names(CONFIG)
    assert out.intermediates["pooler"].shape == (3, CONFIG.num_hiddens)
    np.testing.assert_array_equal(out.intermediates["blks.1.output"], out.encoded)
    assert oracle(tokens, segments).intermediates is None


def test_float32_oracle_is_close_to_float64(batch):
    tokens, segments = batch
    weights = random_weights(CONFIG, seed=5, dtype="float64")
    out64 = load_backend("numpy").build(CONFIG, weights)(tokens, segments, [3, 8, 5], [[1], [2], [3]])
    out32 = load_backend("numpy").build(CONFIG, weights, dtype="float32")(tokens, segments, [3, 8, 5], [[1], [2], [3]])
    assert out32.encoded.dtype == np.float32 and out64.encoded.dtype == np.float64
    np.testing.assert_allclose(out32.encoded, out64.encoded, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out32.mlm, out64.mlm, rtol=0, atol=1e-5)


def test_oracle_keeps_float64_weights_exact():
    weights = random_weights(CONFIG, seed=1, dtype="float64")
    exported = load_backend("numpy").build(CONFIG, weights).export_weights()
    assert all(exported[k].tobytes() == weights[k].tobytes() for k in weights)


def test_the_oracle_copies_the_callers_weights_unless_it_shares_them(batch):
    """Like every backend: a model built without ``share`` is unchanged by what the caller then does to
    their arrays; with it, the oracle reads the caller's arrays (read-only ones too: it never writes)."""
    weights = random_weights(CONFIG, seed=1, dtype="float64")
    owned = load_backend("numpy").build(CONFIG, weights)
    before = owned(*batch).encoded
    shared = load_backend("numpy").build(CONFIG, weights, share=True)
    weights["encoder.token_embedding.weight"] += 1.0
    assert np.array_equal(owned(*batch).encoded, before)
    assert not np.array_equal(shared(*batch).encoded, before)
    weights["encoder.token_embedding.weight"].flags.writeable = False
    lent = load_backend("numpy").build(CONFIG, weights, share=True).export_weights(share=True)
    assert all(np.shares_memory(lent[name], array) for name, array in weights.items())


def test_oracle_is_cpu_only():
    with pytest.raises(CannotRunHere, match="CPU only"):
        load_backend("numpy").build(CONFIG, random_weights(CONFIG), device="cuda")
