"""The shared input checks, driven by Hypothesis with random valid and invalid batches."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_multi import BERTConfig, InputError, check_inputs, get_tokens_and_segments

CONFIG = BERTConfig(vocab_size=17, num_hiddens=4, ffn_num_hiddens=4, num_heads=2, num_blks=1, max_len=8)


def test_get_tokens_and_segments_follows_d2l():
    assert get_tokens_and_segments(["a", "b"]) == (["<cls>", "a", "b", "<sep>"], [0, 0, 0, 0])
    assert get_tokens_and_segments(["a"], ["c", "d"]) == (
        ["<cls>", "a", "<sep>", "c", "d", "<sep>"],
        [0, 0, 0, 1, 1, 1],
    )


@st.composite
def valid_batches(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, CONFIG.max_len))

    def ints(low, high, shape):
        size = int(np.prod(shape))
        return iter(draw(st.lists(st.integers(low, high), min_size=size, max_size=size)))

    tokens = np.fromiter(ints(0, CONFIG.vocab_size - 1, (B, T)), dtype=np.int64).reshape(B, T)
    segments = np.fromiter(ints(0, 1, (B, T)), dtype=np.int32).reshape(B, T)
    valid_lens = draw(
        st.one_of(
            st.none(),
            st.just(np.fromiter(ints(0, T, (B,)), dtype=np.int64)),
            st.just(np.fromiter(ints(0, T, (B,)), dtype=np.float32)),  # d2l passes float32 lengths
            st.just(np.fromiter(ints(0, T, (B, T)), dtype=np.int64).reshape(B, T)),
        )
    )
    P = draw(st.integers(1, 5))
    pred_positions = draw(
        st.one_of(st.none(), st.just(np.fromiter(ints(0, T - 1, (B, P)), dtype=np.int64).reshape(B, P)))
    )
    return dict(tokens=tokens, segments=segments, valid_lens=valid_lens, pred_positions=pred_positions)


@settings(max_examples=150, deadline=None)
@given(valid_batches())
def test_valid_inputs_pass_unchanged(batch):
    checked = check_inputs(CONFIG, **batch)
    for name, value in batch.items():
        got = getattr(checked, name)
        if value is None:
            assert got is None
        else:
            assert got.dtype == np.int64 and np.array_equal(got, value)


def _set(array, index, value):
    array = array.astype(np.result_type(array.dtype, type(value)) if isinstance(value, float) else array.dtype)
    array[index] = value
    return array


# Each breaks one argument of a valid batch in one way; the error must name that argument.
BREAKERS = {
    "token above the vocabulary": ("tokens", lambda b, i: {**b, "tokens": _set(b["tokens"], i, CONFIG.vocab_size)}),
    "negative token": ("tokens", lambda b, i: {**b, "tokens": _set(b["tokens"], i, -1)}),
    "float tokens": ("tokens", lambda b, i: {**b, "tokens": b["tokens"].astype(np.float32)}),
    "1-D tokens": ("tokens", lambda b, i: {**b, "tokens": b["tokens"][0]}),
    "too long": (
        "tokens",
        lambda b, i: {
            **b,
            "tokens": np.zeros((1, CONFIG.max_len + 1), np.int64),
            "segments": np.zeros((1, CONFIG.max_len + 1), np.int64),
        },
    ),
    "segment 2": ("segments", lambda b, i: {**b, "segments": _set(b["segments"], i, 2)}),
    "segment -1": ("segments", lambda b, i: {**b, "segments": _set(b["segments"], i, -1)}),
    "bool segments": ("segments", lambda b, i: {**b, "segments": b["segments"].astype(bool)}),
    "segments shape": ("segments", lambda b, i: {**b, "segments": b["segments"][:, :-1]}),
    "valid_len above T": (
        "valid_lens",
        lambda b, i: {**b, "valid_lens": _set(np.full(b["tokens"].shape[0], 1), i[0], b["tokens"].shape[1] + 1)},
    ),
    "negative valid_len": (
        "valid_lens",
        lambda b, i: {**b, "valid_lens": _set(np.full(b["tokens"].shape[0], 1), i[0], -1)},
    ),
    "fractional valid_len": (
        "valid_lens",
        lambda b, i: {**b, "valid_lens": _set(np.full(b["tokens"].shape[0], 1.0), i[0], 0.5)},
    ),
    "nan valid_len": (
        "valid_lens",
        lambda b, i: {**b, "valid_lens": _set(np.full(b["tokens"].shape[0], 1.0), i[0], np.nan)},
    ),
    "valid_lens shape": ("valid_lens", lambda b, i: {**b, "valid_lens": np.ones(b["tokens"].shape[0] + 1)}),
    "pred_position T": (
        "pred_positions",
        lambda b, i: {
            **b,
            "pred_positions": _set(np.zeros((b["tokens"].shape[0], 2), np.int64), (i[0], 1), b["tokens"].shape[1]),
        },
    ),
    "negative pred_position": (
        "pred_positions",
        lambda b, i: {**b, "pred_positions": _set(np.zeros((b["tokens"].shape[0], 2), np.int64), (i[0], 0), -1)},
    ),
    "float pred_positions": (
        "pred_positions",
        lambda b, i: {**b, "pred_positions": np.zeros((b["tokens"].shape[0], 2))},
    ),
    "pred_positions batch": (
        "pred_positions",
        lambda b, i: {**b, "pred_positions": np.zeros((b["tokens"].shape[0] + 1, 2), np.int64)},
    ),
    "no pred_positions slots": (
        "pred_positions",
        lambda b, i: {**b, "pred_positions": np.zeros((b["tokens"].shape[0], 0), np.int64)},
    ),
}


@settings(max_examples=300, deadline=None)
@given(valid_batches(), st.sampled_from(sorted(BREAKERS)), st.data())
def test_each_invalid_input_raises_naming_the_argument(batch, breaker, data):
    argument, breaks = BREAKERS[breaker]
    B, T = batch["tokens"].shape
    index = (data.draw(st.integers(0, B - 1)), data.draw(st.integers(0, T - 1)))
    with pytest.raises(InputError, match=f"^{argument}"):
        check_inputs(CONFIG, **breaks(batch, index))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(tokens=[[1, 17]], segments=[[0, 0]]),
            r"^tokens\[0, 1\] = 17 is out of range: expected token ids in \[0, 17\) \(vocab_size\)$",
        ),
        (
            dict(tokens=[[1, 2]], segments=[[0, 3]]),
            r"^segments\[0, 1\] = 3 is out of range: expected segment ids in \{0, 1\}$",
        ),
        (
            dict(tokens=[[1, 2]], segments=[[0, 0]], valid_lens=[3]),
            r"^valid_lens\[0\] = 3 is out of range: expected lengths in \[0, 2\] \(num_steps\)$",
        ),
        (
            dict(tokens=[[1, 2]], segments=[[0, 0]], pred_positions=[[0, 2]]),
            r"^pred_positions\[0, 1\] = 2 is out of range: expected positions in \[0, 2\) \(num_steps\)$",
        ),
        (
            dict(tokens=np.zeros((1, 9), int), segments=np.zeros((1, 9), int)),
            "^tokens has 9 steps, more than max_len=8",
        ),
        (dict(tokens=[["a"]], segments=[[0]]), "^tokens has dtype <U1: expected an integer dtype"),
        (dict(tokens=[[1, 2], [3]], segments=[[0, 0], [0]]), "^tokens is not a rectangular array"),
    ],
)
def test_messages_say_what_is_wrong_and_what_was_expected(kwargs, message):
    with pytest.raises(InputError, match=message):
        check_inputs(CONFIG, **kwargs)
