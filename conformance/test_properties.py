"""Hypothesis drives random small configurations and inputs, anywhere within the validated bounds:
every backend agrees with the oracle, in float64 and float32 (where float32 arithmetic itself cannot
meet the policy, within what it needs)."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_multi import BERTConfig, load_backend, random_weights
from bert_multi.engine.compare import tolerance_for
from bert_multi.engine.results import assert_conforms, compare_outputs
from bert_multi.spec.semantics import PRESETS


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


def float32_slack(config, weights, batch, reference, eps):
    """How many times the float32 policy float32 arithmetic itself needs here: the float32 oracle's worst
    error against the float64 one, with room for a different order of operations (4x), and never less
    than the policy. A model this small can be ill-conditioned: a LayerNorm over 3 nearly equal values,
    with the original BERT's eps of 1e-12, turns float32 rounding into errors of 1e-4."""
    oracle32 = load_backend("numpy").build(config, weights, dtype="float32", layer_norm_eps=eps)
    outputs, intermediates = compare_outputs(oracle32(**batch, intermediates=True), reference, tolerance_for("float32"))
    return max(1.0, 4 * max(comparison.ratio for comparison in outputs + intermediates))


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
    out64 = framework.build(config, weights, dtype="float64")(**batch, intermediates=True)
    assert_conforms(out64, reference, "float64")
    out32 = framework.build(config, weights, dtype="float32")(**batch, intermediates=True)
    slack = float32_slack(config, weights, batch, reference, eps)
    outputs, intermediates = compare_outputs(out32, reference, tolerance_for("float32").scaled(slack))
    failing = [c.describe() for c in intermediates + outputs if not c.passed]
    assert out32.encoded.dtype == np.float32 and not failing, f"(policy x {slack:.3g})\n" + "\n".join(failing)


def test_the_float32_slack_is_the_policy_where_float32_is_well_conditioned():
    """The slack cannot hide a fault: on a model of ordinary width it is 1, the policy itself."""
    config = BERTConfig(vocab_size=30, num_hiddens=16, ffn_num_hiddens=24, num_heads=2, num_blks=2, max_len=8)
    weights = random_weights(config, seed=3, dtype="float64")
    rng = np.random.default_rng(3)
    batch = {"tokens": rng.integers(0, 30, (2, 8)), "segments": rng.integers(0, 2, (2, 8)), "valid_lens": None,
             "pred_positions": rng.integers(0, 8, (2, 3))}  # fmt: skip
    reference = load_backend("numpy").build(config, weights)(**batch, intermediates=True)
    assert float32_slack(config, weights, batch, reference, 1e-5) == 1.0
