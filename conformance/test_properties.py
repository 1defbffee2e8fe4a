"""Hypothesis drives random small configurations and inputs, anywhere within the validated bounds:
every backend agrees with the oracle, in float64 and float32."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_multi import BERTConfig, load_backend, random_weights
from bert_multi.spec.semantics import PRESETS
from bert_multi.verify.results import assert_conforms


@st.composite
def configs(draw):
    """Any small config, of any d2l generation (sinusoidal positions need an even width)."""
    preset = draw(st.sampled_from(sorted(PRESETS)))
    num_heads = draw(st.integers(1, 4))
    width_factor = 2 if PRESETS[preset].positions == "sinusoidal" else 1
    return BERTConfig(
        vocab_size=draw(st.integers(2, 40)),
        num_hiddens=num_heads * width_factor * draw(st.integers(1, 5)),
        ffn_num_hiddens=draw(st.integers(1, 12)),
        num_heads=num_heads,
        num_blks=draw(st.integers(1, 3)),
        max_len=draw(st.integers(1, 9)),
        semantics=preset,
    )


@st.composite
def batches(draw, config):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, config.max_len))
    valid_lens = draw(st.sampled_from(["none", "1d_int", "1d_float", "2d"]))
    valid_lens = {
        "none": None,
        "1d_int": rng.integers(0, T + 1, size=B),
        "1d_float": rng.integers(0, T + 1, size=B).astype(np.float32),  # as d2l passes them
        "2d": rng.integers(0, T + 1, size=(B, T)),
    }[valid_lens]
    pred_positions = rng.integers(0, T, size=(B, draw(st.integers(1, 4)))) if draw(st.booleans()) else None
    return {
        "tokens": rng.integers(0, config.vocab_size, size=(B, T)),
        "segments": rng.integers(0, 2, size=(B, T)),
        "valid_lens": valid_lens,
        "pred_positions": pred_positions,
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_configs_and_inputs_agree_with_the_oracle(framework, data):
    config = data.draw(configs(), label="config")
    batch = data.draw(batches(config), label="batch")
    weights = random_weights(config, seed=data.draw(st.integers(0, 1000)), dtype="float64")
    # Against the oracle run with the LayerNorm eps this framework really uses (MXNet: a float32).
    eps = framework.kernel_eps(config.semantics.layer_norm_eps)
    oracle = load_backend("numpy").build(config, weights, layer_norm_eps=eps)
    reference = oracle(**batch, intermediates=True)
    for dtype in ("float64", "float32"):
        assert_conforms(framework.build(config, weights, dtype=dtype)(**batch, intermediates=True), reference, dtype)
