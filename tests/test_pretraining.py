"""Training agrees across frameworks: losses against the oracle, gradients against each other and
against finite differences, optimizer steps, and a short run that learns."""

import itertools
import math

import numpy as np
import pytest

from bert_multi import BERTConfig, UsageError, backends, init_weights, load_backend, random_weights
from bert_multi.backend.oracle import pretraining_loss
from bert_multi.backend.registry import not_in_process
from bert_multi.training import (
    ADAM_EPSILON_STYLES,
    PretrainingData,
    builtin_corpus,
    check_batch,
    paragraphs_from_lines,
    run_pretraining,
)
from conftest import runs_here

pytestmark = pytest.mark.needs("Pretrainer")  # training: each framework's own Pretrainer


def pairs_here():
    """Each pair of frameworks, skipped where the two do not both run in this process."""
    for pair in itertools.combinations(("torch", "mxnet", "jax"), 2):
        missing = [name for name in pair if not_in_process(name)]
        reason = f"needs {' and '.join(missing)} in this process"
        yield pytest.param(pair, id="-".join(pair), marks=pytest.mark.skipif(bool(missing), reason=reason))


pairs = pytest.mark.parametrize("pair", list(pairs_here()))

# Hyper-parameters that float32 represents exactly: MXNet hands its optimizer kernels lr, betas and
# epsilon as C floats, so 0.01 or 0.999 would differ from PyTorch's doubles before anything else does.
EXACT_ADAM = dict(optimizer="adam", lr=2**-7, adam_betas=(0.875, 1 - 2**-9), adam_epsilon=2**-27)


@pytest.fixture(scope="module")
def data():
    return PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(300)), max_len=32, seed=0)


@pytest.fixture(scope="module")
def config(data):
    return BERTConfig(len(data.vocab), num_hiddens=16, ffn_num_hiddens=24, num_heads=2, num_blks=2, max_len=32)


@pytest.fixture(scope="module")
def batch(data):
    return next(data.batches(16, seed=0))


@pytest.mark.parametrize("normalization", ["real_slots", "all_slots"])
def test_loss_matches_the_oracle(framework, config, batch, normalization):
    weights = random_weights(config, seed=1, dtype="float64")
    expected = pretraining_loss(config, weights, check_batch(config, batch), normalization)
    trainer = framework.Pretrainer(framework.build(config, weights, dtype="float64"), mlm_normalization=normalization)
    assert np.allclose(trainer.loss(batch), expected, rtol=0, atol=1e-9)
    trainer32 = framework.Pretrainer(framework.build(config, weights, dtype="float32"), mlm_normalization=normalization)
    assert np.allclose(trainer32.loss(batch), expected, rtol=0, atol=1e-4)


def test_d2l_pytorch_normalisation_averages_padding_in(config, batch):
    weights = random_weights(config, seed=1, dtype="float64")
    checked = check_batch(config, batch)
    real = pretraining_loss(config, weights, checked, "real_slots")
    padded = pretraining_loss(config, weights, checked, "all_slots")
    assert (checked["mlm_weights"] == 0).any()  # the batch has padded slots ...
    assert abs(real.mlm - padded.mlm) > 1e-3  # ... so the two normalisations differ
    assert real.nsp == padded.nsp
    full = {**checked, "mlm_weights": np.ones_like(checked["mlm_weights"])}  # without padding they agree
    assert pretraining_loss(config, weights, full, "real_slots").mlm == pytest.approx(
        pretraining_loss(config, weights, full, "all_slots").mlm, abs=1e-12
    )


@pairs
def test_gradients_agree_between_frameworks(config, batch, pair):
    weights = random_weights(config, seed=2, dtype="float64")
    first, second = (
        load_backend(name).Pretrainer(load_backend(name).build(config, weights, dtype="float64")).gradients(batch)[1]
        for name in pair
    )
    assert list(first) == list(second) == list(weights)
    for name in weights:
        assert np.abs(first[name] - second[name]).max() <= 1e-9, name
    assert np.abs(first["encoder.pos_embedding"]).max() > 0  # it trains (d2l 0.16-0.17 detached it)


def test_gradients_match_finite_differences_of_the_oracle(framework, config, batch):
    weights = random_weights(config, seed=3, dtype="float64")
    checked = check_batch(config, batch)
    _, gradients = framework.Pretrainer(framework.build(config, weights, dtype="float64")).gradients(batch)
    rng = np.random.default_rng(0)
    names = [
        "encoder.pos_embedding",
        "encoder.token_embedding.weight",
        "encoder.segment_embedding.weight",
        "encoder.blks.0.attention.W_q.weight",
        "encoder.blks.1.attention.W_v.bias",
        "encoder.blks.0.addnorm1.ln.weight",
        "encoder.blks.1.ffn.dense2.weight",
        "hidden.0.bias",
        "mlm.mlp.0.weight",
        "mlm.mlp.2.bias",
        "mlm.mlp.3.weight",
        "nsp.output.weight",
    ]
    step = 1e-6
    for name in names:
        for _ in range(2):
            flat = np.flatnonzero(np.abs(gradients[name]) > 1e-4)  # an element the batch touches
            index = np.unravel_index(rng.choice(flat), weights[name].shape)
            nudged = {}
            for sign in (1, -1):
                moved = {**weights, name: weights[name].copy()}
                moved[name][index] += sign * step
                nudged[sign] = pretraining_loss(config, moved, checked).total
            numeric = (nudged[1] - nudged[-1]) / (2 * step)
            assert gradients[name][index] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, index)


def run_both(pair, config, weights, batches, dtype, **options):
    trainers = [
        load_backend(name).Pretrainer(load_backend(name).build(config, weights, dtype=dtype), **options)
        for name in pair
    ]
    for batch in batches:
        for trainer in trainers:
            trainer.step(batch)
    return [trainer.model.export_weights() for trainer in trainers]


def largest_difference(a, b):
    return max(float(np.abs(a[name] - b[name]).max()) for name in a)


# (options, dtype, the largest weight difference allowed after 5 steps). Measured: SGD 5.6e-13 (float64)
# and 2.8e-8 (float32); Adam with epsilon placed alike 3.5e-8 (float64) and 1.3e-5 (float32). Adam
# divides each gradient by its own running RMS, so where a gradient is tiny, the 1e-12 differences
# between the frameworks' gradients become relative ones; that sets its float64 floor.
STEP_CASES = {
    "sgd-float64": (dict(optimizer="sgd", lr=2**-7), "float64", 1e-9),
    "sgd-float32": (dict(optimizer="sgd", lr=2**-7), "float32", 1e-6),
    "adam-float64": ({**EXACT_ADAM, "adam_epsilon_style": "torch"}, "float64", 1e-6),
    "adam-float32": ({**EXACT_ADAM, "adam_epsilon_style": "torch"}, "float32", 1e-4),
}


@pairs
@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_optimizer_steps_give_the_same_weights(config, data, case, pair):
    options, dtype, bound = STEP_CASES[case]
    weights = init_weights(config, seed=4, dtype=dtype)
    batches = data.batches(16, seed=1)
    first, second = run_both(pair, config, weights, [next(batches) for _ in range(5)], dtype, **options)
    assert largest_difference(first, second) <= bound
    assert largest_difference(first, weights) > 1e-3  # the steps did move the weights


# Each framework's own place for Adam's epsilon: torch.optim.Adam and optax's adam add it to
# sqrt(v / (1 - beta2^t)); MXNet folds the bias correction into the learning rate and adds it to sqrt(v).
NATIVE_EPSILON = {"torch": "torch", "mxnet": "mxnet", "jax": "torch"}


@pairs
def test_where_adam_puts_epsilon_is_a_real_difference(config, data, pair):
    """Left to their own ways, two frameworks that place epsilon differently drift apart; matched, they agree."""
    weights = init_weights(config, seed=4, dtype="float64")
    batches = [next(data.batches(16, seed=1))]
    native = largest_difference(
        *run_both(pair, config, weights, batches, "float64", **{**EXACT_ADAM, "adam_epsilon": 1e-4})
    )
    for style in ADAM_EPSILON_STYLES:
        matched = largest_difference(
            *run_both(
                pair,
                config,
                weights,
                batches,
                "float64",
                **{**EXACT_ADAM, "adam_epsilon": 1e-4, "adam_epsilon_style": style},
            )
        )
        # What remains when matched is MXNet rounding each step's learning rate to a C float (~2e-10).
        assert matched < 1e-9, (style, matched)
    if NATIVE_EPSILON[pair[0]] != NATIVE_EPSILON[pair[1]]:
        assert native > 1e-6, native
    else:
        assert native < 1e-9, native


@pairs
def test_a_short_run_learns_and_the_curves_agree(config, data, pair):
    weights = init_weights(config, seed=5, dtype="float64")
    runs = [
        run_pretraining(
            name, config, weights, data, steps=8, batch_size=32, seed=2, dtype="float64", optimizer="sgd", lr=0.5
        )
        for name in pair
    ]
    # Learning, judged on 512 examples rather than on the noisy last batch: the masked-LM loss falls well
    # below ln(vocab_size), what guessing uniformly scores (measured: 0.59 to 0.81 below it over 12
    # data and batch seeds; a single batch's loss drop ranged from 0.38 to 1.07).
    held_out = next(data.batches(512, seed=99))
    for run in runs:
        backend = load_backend(run.backend)
        after = backend.Pretrainer(backend.build(config, run.weights, dtype="float64")).loss(held_out)
        assert after.mlm < math.log(config.vocab_size) - 0.25, (run.backend, after)
        assert run.tokens_per_second > 0 and run.runtime["threads"] >= 1
    gaps = [abs(a.total - b.total) for a, b in zip(runs[0].losses, runs[1].losses)]
    assert max(gaps) < 1e-8


def numpy_update(weights, gradients, state, optimizer, lr, betas, epsilon, style):
    """One SGD or Adam step written out in NumPy, Adam with epsilon where ``style`` puts it: "torch" adds
    it to sqrt of the bias-corrected second moment, "mxnet" to sqrt of the raw one (with the bias
    correction folded into the learning rate)."""
    if optimizer == "sgd":
        return {name: weights[name] - lr * gradients[name] for name in weights}
    beta1, beta2 = betas
    state["t"] = t = state.get("t", 0) + 1
    updated = {}
    for name, g in gradients.items():
        m = state[f"m.{name}"] = beta1 * state.get(f"m.{name}", 0.0) + (1 - beta1) * g
        v = state[f"v.{name}"] = beta2 * state.get(f"v.{name}", 0.0) + (1 - beta2) * g * g
        if style == "torch":
            step = lr * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + epsilon)
        else:
            step = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t) * m / (np.sqrt(v) + epsilon)
        updated[name] = weights[name] - step
    return updated


@pytest.mark.parametrize("optimizer, style", [("sgd", "torch"), ("adam", "torch"), ("adam", "mxnet")])
def test_each_optimizer_step_is_the_update_written_out_in_numpy(framework, config, data, optimizer, style):
    """Each framework's step against the formula, with gradients from the framework itself. Epsilon is
    2**-10, large enough that the two placements differ by far more than the tolerance."""
    options = {**EXACT_ADAM, "optimizer": optimizer, "adam_epsilon": 2**-10, "adam_epsilon_style": style}
    weights = init_weights(config, seed=6, dtype="float64")
    trainer = framework.Pretrainer(framework.build(config, weights, dtype="float64"), **options)
    expected, state = weights, {}
    for batch in itertools.islice(data.batches(16, seed=3), 3):
        probe = framework.Pretrainer(framework.build(config, expected, dtype="float64"))
        _, gradients = probe.gradients(batch)
        expected = numpy_update(
            expected, gradients, state, optimizer, options["lr"], options["adam_betas"], 2**-10, style
        )
        trainer.step(batch)
        got = trainer.model.export_weights()
        # MXNet hands its kernels the learning rate and epsilon as C floats: about 1e-10 here.
        assert largest_difference(got, expected) < 1e-8, (optimizer, style)
    assert largest_difference(got, weights) > 1e-3


def test_training_steps_run_in_training_mode(framework, config, batch):
    """With dropout configured, the loss of a training step is a random draw (dropout on); the loss
    in inference is one fixed number (dropout off)."""
    dropped = BERTConfig(**{**config.to_dict(), "dropout": 0.5})
    trainer = framework.Pretrainer(framework.build(dropped, random_weights(dropped, seed=1, dtype="float64")))
    inference = {trainer.loss(batch).total for _ in range(2)}
    training = {trainer.gradients(batch)[0].total for _ in range(2)}
    assert len(inference) == 1 and len(training) == 2 and not inference & training


def test_the_oracle_cannot_train(config, data):
    with pytest.raises(ValueError, match="cannot train"):
        run_pretraining("numpy", config, init_weights(config), data, steps=1, batch_size=4)


@pytest.mark.parametrize("preset", ["d2l-0.12", "d2l-0.11"])
def test_every_generations_loss_matches_the_oracle(framework, data, preset):
    config = BERTConfig(len(data.vocab), num_hiddens=16, ffn_num_hiddens=24, num_heads=2, num_blks=2, max_len=32)
    config = config.with_semantics(preset)
    batch = next(data.batches(16, seed=0))
    weights = random_weights(config, seed=1, dtype="float64")
    expected = pretraining_loss(config, weights, check_batch(config, batch))
    trainer = framework.Pretrainer(framework.build(config, weights, dtype="float64"))
    assert np.allclose(trainer.loss(batch), expected, rtol=0, atol=1e-9)
    trainer.step(batch)
    assert largest_difference(trainer.model.export_weights(), weights) > 1e-4  # and it trains


def test_frozen_positions_never_move_while_the_rest_trains(framework, config, data):
    """d2l 0.16-0.17's PyTorch code added pos_embedding.data, so its positions never trained;
    train_positions=False reproduces that in either framework."""
    weights = init_weights(config, seed=7, dtype="float64")
    for train_positions in (False, True):
        trainer = framework.Pretrainer(
            framework.build(config, weights, dtype="float64"), optimizer="adam", train_positions=train_positions
        )
        for batch in itertools.islice(data.batches(16, seed=2), 2):
            trainer.step(batch)
        after = trainer.model.export_weights()
        moved = np.abs(after["encoder.pos_embedding"] - weights["encoder.pos_embedding"]).max()
        assert (moved > 1e-4) == train_positions, (train_positions, moved)
        assert np.abs(after["encoder.token_embedding.weight"] - weights["encoder.token_embedding.weight"]).max() > 1e-4


def test_frozen_positions_have_a_zero_gradient_and_the_rest_are_unchanged(framework, config, batch):
    """``gradients`` names every parameter: one that does not train reports zeros, not an error, and
    freezing it changes no other gradient (the forward is the same)."""
    weights = random_weights(config, seed=2, dtype="float64")
    trained = framework.Pretrainer(framework.build(config, weights, dtype="float64")).gradients(batch)[1]
    frozen = framework.Pretrainer(framework.build(config, weights, dtype="float64"), train_positions=False)
    gradients = frozen.gradients(batch)[1]
    assert list(gradients) == list(trained)
    assert not gradients["encoder.pos_embedding"].any() and trained["encoder.pos_embedding"].any()
    assert all(np.array_equal(gradients[name], trained[name]) for name in trained if name != "encoder.pos_embedding")


def test_the_d2l_0_17_pytorch_twin_leaves_the_positions_without_a_gradient(config, batch):
    torch = pytest.importorskip("torch")
    from bert_multi.torch import d2l_0_17

    H = config.num_hiddens
    net = d2l_0_17.BERTModel(
        config.vocab_size, H, [H], H, config.ffn_num_hiddens, config.num_heads, config.num_blks, 0.0,
        max_len=config.max_len, key_size=H, query_size=H, value_size=H,
        hid_in_features=H, mlm_in_features=H, nsp_in_features=H,
    )  # fmt: skip
    tensors = [torch.from_numpy(batch[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions")]
    encoded, mlm, nsp = net(*tensors)
    (encoded.sum() + mlm.sum() + nsp.sum()).backward()
    assert net.encoder.pos_embedding.grad is None
    assert net.encoder.token_embedding.weight.grad is not None


@runs_here("torch")
def test_mixed_precision_computes_the_products_in_bfloat16_and_keeps_float32_weights(config, data, batch):
    """Asked for bfloat16, PyTorch's dense layers compute in it (seen by a hook), the loss stays near the
    oracle's (bfloat16 keeps 8 significant bits: within 1%), and the weights, their gradients and Adam's
    moments stay float32."""
    torch_backend = load_backend("torch")
    weights = random_weights(config, seed=1, dtype="float64")
    expected = pretraining_loss(config, weights, check_batch(config, batch), "real_slots")
    model = torch_backend.build(config, weights, dtype="float32")
    trainer = torch_backend.Pretrainer(model, mixed_precision="bfloat16")
    seen = set()
    model.module.encoder.blks[0].ffn.dense1.register_forward_hook(lambda _, __, out: seen.add(str(out.dtype)))
    assert abs(trainer.loss(batch).total - expected.total) < 1e-2 * expected.total
    losses, gradients = trainer.gradients(batch)
    assert seen == {"torch.bfloat16"}
    assert abs(losses.total - expected.total) < 1e-2 * expected.total
    trainer.step(batch)
    assert {a.dtype for a in gradients.values()} == {np.dtype("float32")}
    assert {a.dtype for a in trainer.state().values()} == {np.dtype("float32")}
    assert {a.dtype for a in model.export_weights().values()} == {np.dtype("float32")}
    assert largest_difference(model.export_weights(), weights) > 1e-3


@pytest.mark.parametrize("framework_name", ["mxnet", "jax"])
def test_mixed_precision_is_refused_where_it_is_not_offered(config, data, framework_name, monkeypatch):
    """The same message from every backend, naming the one that offers it, before a model is built;
    float64 weights and unknown precisions are refused too."""
    for name in ("torch", framework_name):
        if not backends()[name].available:
            pytest.skip(backends()[name].reason)
    weights = init_weights(config)
    monkeypatch.setattr(load_backend(framework_name), "build", None)  # never reached
    expected = rf"backend '{framework_name}' trains in its weights' dtype only; mixed precision \(bfloat16\) is "
    expected += r"offered by \['torch'\]"
    with pytest.raises(UsageError, match=expected):
        run_pretraining(framework_name, config, weights, data, steps=1, batch_size=4, mixed_precision="bfloat16")
    with pytest.raises(UsageError, match=r"mixed precision \(bfloat16\) is for float32 weights, not float64 ones"):
        run_pretraining("torch", config, weights, data, 1, 4, dtype="float64", mixed_precision="bfloat16")
    with pytest.raises(UsageError, match=r"unknown mixed_precision 'float16': expected one of \['bfloat16'\]"):
        run_pretraining("torch", config, weights, data, 1, 4, mixed_precision="float16")
