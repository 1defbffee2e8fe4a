"""The gradient oracle (``bert_multi.backend.backward``) is the derivative of the forward oracle: checked
element by element against central finite differences of ``oracle.forward`` and of the pretraining loss,
for every generation, and against every framework's autograd."""

import numpy as np
import pytest

from bert_multi import BERTConfig, random_weights
from bert_multi.backend import backward, oracle
from bert_multi.spec.inputs import check_inputs
from bert_multi.spec.semantics import PRESETS
from bert_multi.training import PretrainingData, builtin_corpus, check_batch, paragraphs_from_lines

STEP = 1e-6  # central differences: truncation ~STEP**2, rounding ~1e-16 / STEP


def small(preset: str, vocab_size: int = 7) -> BERTConfig:
    return BERTConfig(
        vocab_size, num_hiddens=4, ffn_num_hiddens=5, num_heads=2, num_blks=2, max_len=6, semantics=preset
    )


def inputs_for(config: BERTConfig, two_d: bool):
    """A batch with every masking rule at work: lengths 4, 2 and 0 (or one per query), repeated and edge
    prediction positions, both segments."""
    rng = np.random.default_rng(5)
    valid_lens = rng.integers(0, 6, size=(3, 5)) if two_d else np.array([4, 2, 0])
    return check_inputs(
        config,
        rng.integers(0, config.vocab_size, size=(3, 5)),
        np.array([[0, 0, 1, 1, 1]] * 3),
        valid_lens,
        np.array([[0, 4, 4], [1, 2, 0], [3, 3, 4]]),
    )


def finite_differences(function, weights: dict) -> dict:
    """d function / d every element of every weight, by central differences."""
    estimates = {}
    for name, array in weights.items():
        estimate = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            saved = array[index]
            array[index] = saved + STEP
            above = function(weights)
            array[index] = saved - STEP
            below = function(weights)
            array[index] = saved
            estimate[index] = (above - below) / (2 * STEP)
        estimates[name] = estimate
    return estimates


def assert_close(analytic: dict, numeric: dict, atol: float = 1e-7) -> None:
    # measured: at most 1.5e-8 apart over every preset and both masks, finite differences' own error
    assert list(analytic) == list(numeric)
    worst = {name: float(np.abs(analytic[name] - numeric[name]).max()) for name in numeric}
    assert max(worst.values()) <= atol, {name: error for name, error in worst.items() if error > atol}
    assert any(np.abs(numeric[name]).max() > 1e-3 for name in numeric)  # the comparison compared something


@pytest.mark.parametrize("two_d", [False, True], ids=["lengths", "lengths_per_query"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_gradients_of_every_output_match_finite_differences(preset, two_d):
    config = small(preset)
    weights = random_weights(config, seed=11, dtype="float64")
    inputs = inputs_for(config, two_d)
    out = oracle.forward(config, weights, inputs)
    rng = np.random.default_rng(12)
    projections = [rng.standard_normal(array.shape) for array in (out.encoded, out.mlm, out.nsp)]

    def projected(current: dict) -> float:
        result = oracle.forward(config, current, inputs)
        return sum(float((p * a).sum()) for p, a in zip(projections, (result.encoded, result.mlm, result.nsp)))

    analytic = backward.gradients(config, weights, inputs, *projections)
    assert_close(analytic, finite_differences(projected, weights))


@pytest.mark.parametrize("normalization", ["real_slots", "all_slots"])
@pytest.mark.parametrize("preset", ["d2l", "bert"])
def test_gradients_of_the_pretraining_loss_match_finite_differences(preset, normalization):
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(20)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 4, 5, 2, 1, max_len=16, semantics=preset)
    weights = random_weights(config, seed=13, dtype="float64")
    batch = check_batch(config, next(data.batches(3, seed=0)))
    # One slot padded, as short sequences leave them (position 0, label 0, weight 0): where the two
    # normalisations differ.
    batch["pred_positions"][0, 1] = batch["mlm_labels"][0, 1] = batch["mlm_weights"][0, 1] = 0

    def loss(current: dict) -> float:
        return oracle.pretraining_loss(config, current, batch, normalization).total

    losses, analytic = backward.pretraining_loss_gradients(config, weights, batch, normalization)
    assert losses == oracle.pretraining_loss(config, weights, batch, normalization)
    assert_close(analytic, finite_differences(loss, weights))


@pytest.mark.needs("Pretrainer")
def test_every_framework_autograd_agrees_with_the_gradient_oracle(framework):
    """float64 gradients of d2l's pretraining loss, taken by each framework's own autograd."""
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 12, 20, 3, 2, max_len=16)
    weights = random_weights(config, seed=14, dtype="float64")
    batch = next(data.batches(8, seed=1))
    eps = framework.kernel_eps(config.semantics.layer_norm_eps)  # MXNet's is a C float
    expected_losses, expected = backward.pretraining_loss_gradients(
        config, weights, check_batch(config, batch), layer_norm_eps=eps
    )
    losses, got = framework.trainer(framework.build(config, weights, dtype="float64")).gradients(batch)
    assert np.allclose(losses, expected_losses, rtol=0, atol=1e-12)
    worst = max(float(np.abs(got[name] - expected[name]).max()) for name in expected)
    # measured over three batches: torch up to 6.7e-16, MXNet up to 1.1e-15; JAX 8.3e-16 on this one
    assert worst <= 1e-10, worst


def test_a_wrong_derivative_is_caught(monkeypatch):
    """The finite-difference check can fail: GELU's derivative without its x phi(x) term is caught."""
    config = small("bert")
    weights = random_weights(config, seed=11, dtype="float64")
    inputs = inputs_for(config, two_d=False)
    real = backward.activation_backward
    monkeypatch.setattr(
        backward, "activation_backward", lambda X, kind, dY: real(X, kind, dY) if kind != "gelu" else dY * (X > 0)
    )
    out = oracle.forward(config, weights, inputs)
    projection = np.random.default_rng(12).standard_normal(out.encoded.shape)
    analytic = backward.gradients(config, weights, inputs, projection)
    numeric = finite_differences(
        lambda current: float((projection * oracle.forward(config, current, inputs).encoded).sum()), weights
    )
    with pytest.raises(AssertionError):
        assert_close(analytic, numeric)


def test_the_gradient_of_each_named_activation_is_torchs():
    """What ``gradients(..., record=)`` says of each activation's gradient (what verify feeds a user's module
    to check its backward alone) against torch's autograd, the activations kept by hooks."""
    torch = pytest.importorskip("torch")
    from bert_multi import load_backend
    from bert_multi.backend.contract import intermediate_sources

    config = small("d2l")
    weights = random_weights(config, seed=13, dtype="float64")
    inputs = inputs_for(config, two_d=False)
    out = oracle.forward(config, weights, inputs)
    rng = np.random.default_rng(15)
    cotangents = [rng.standard_normal(o.shape) for o in (out.encoded, out.mlm, out.nsp)]
    record: dict = {}
    backward.gradients(config, weights, inputs, *cotangents, record=record)
    model = load_backend("torch").build(config, weights, dtype="float64")
    kept = {}

    def keep(name, side):
        def hook(module, args, output):
            value = args[0] if side == "input" else output
            value.retain_grad()
            kept[name] = value

        return hook

    for name, (path, side) in intermediate_sources(config).items():
        model.module.get_submodule(path).register_forward_hook(keep(name, side))
    returned = model.module(*(None if a is None else torch.from_numpy(a) for a in inputs))
    sum((o * torch.from_numpy(c)).sum() for o, c in zip(returned, cotangents)).backward()
    assert set(record) == set(kept)
    for name, gradient in record.items():
        np.testing.assert_allclose(kept[name].grad.numpy(), gradient, rtol=0, atol=1e-12, err_msg=name)
