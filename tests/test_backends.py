"""One suite, run against every framework backend: agreement with the NumPy oracle, edge cases, bad
input, weights in and out, inference and training behaviour."""

import numpy as np
import pytest

from bert_multi import CONFIGS, BERTConfig, CannotRunHere, InputError, init_weights, load_backend, random_weights
from bert_multi.engine.cases import CASE_NAMES, CASES, KERNEL_PATHS
from bert_multi.engine.results import assert_conforms

SMALL_CONFIGS = {
    "one_head_one_block": BERTConfig(
        vocab_size=31, num_hiddens=8, ffn_num_hiddens=16, num_heads=1, num_blks=1, max_len=12
    ),
    "many_heads_odd_width": BERTConfig(
        vocab_size=40, num_hiddens=30, ffn_num_hiddens=14, num_heads=6, num_blks=3, max_len=20
    ),
    "tiny": CONFIGS["tiny"],
}


@pytest.fixture(scope="module")
def chapter_weights():
    return random_weights(CONFIGS["chapter"], seed=0, dtype="float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("config_name", sorted(SMALL_CONFIGS))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_small_configs_match_the_oracle_on_every_case(framework, config_name, case, dtype):
    config = SMALL_CONFIGS[config_name]
    weights = random_weights(config, seed=3, dtype="float64")
    batch = case.batch(config, seed=1)
    ref = load_backend("numpy").build(config, weights)(**batch, intermediates=True)
    out = framework.build(config, weights, dtype=dtype)(**batch, intermediates=True)
    assert_conforms(out, ref, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_chapter_config_matches_the_oracle(framework, chapter_weights, dtype):
    config = CONFIGS["chapter"]
    batch = CASES[0].batch(config, seed=2)
    ref = load_backend("numpy").build(config, chapter_weights)(**batch, intermediates=True)
    out = framework.build(config, chapter_weights, dtype=dtype)(**batch, intermediates=True)
    assert out.encoded.shape == (4, 12, 768) and out.mlm.shape == (4, 3, 10000) and out.nsp.shape == (4, 2)
    assert_conforms(out, ref, dtype)


def test_chapter_config_at_max_len(framework, chapter_weights):
    config = CONFIGS["chapter"]
    batch = [case for case in CASES if case.name == "max_len"][0].batch(config)
    assert batch["tokens"].shape == (1, 1000)
    ref = load_backend("numpy").build(config, chapter_weights)(**batch)
    assert_conforms(framework.build(config, chapter_weights, dtype="float32")(**batch), ref, "float32")


def test_without_pred_positions_there_is_no_mlm_output(framework):
    config = CONFIGS["tiny"]
    out = framework.build(config, init_weights(config))(np.zeros((2, 5), int), np.zeros((2, 5), int))
    assert out.mlm is None and out.nsp.shape == (2, 2)


BAD_INPUTS = {
    "token out of range": dict(tokens=[[1, 50]], segments=[[0, 0]]),
    "segment 2": dict(tokens=[[1, 2]], segments=[[0, 2]]),
    "valid_len above T": dict(tokens=[[1, 2]], segments=[[0, 0]], valid_lens=[3]),
    "negative valid_len": dict(tokens=[[1, 2]], segments=[[0, 0]], valid_lens=[-1.0]),
    "pred_position T": dict(tokens=[[1, 2]], segments=[[0, 0]], pred_positions=[[2]]),
    "negative pred_position": dict(tokens=[[1, 2]], segments=[[0, 0]], pred_positions=[[-1]]),
    "longer than max_len": dict(tokens=np.ones((1, 17), int), segments=np.zeros((1, 17), int)),
    "float tokens": dict(tokens=[[1.0, 2.0]], segments=[[0, 0]]),
    "segments shape": dict(tokens=[[1, 2]], segments=[[0]]),
}


@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_bad_input_fails_before_the_framework_with_the_oracles_message(framework, bad, monkeypatch):
    config = CONFIGS["tiny"]
    weights = init_weights(config)
    model = framework.build(config, weights)
    monkeypatch.setattr(model, "_forward", lambda *args: pytest.fail("the framework saw invalid input"))
    with pytest.raises(InputError) as framework_error:
        model(**BAD_INPUTS[bad])
    with pytest.raises(InputError) as oracle_error:
        load_backend("numpy").build(config, weights)(**BAD_INPUTS[bad])
    assert str(framework_error.value) == str(oracle_error.value)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exported_weights_are_bit_identical(framework, dtype):
    config = SMALL_CONFIGS["many_heads_odd_width"]
    weights = random_weights(config, seed=4, dtype=dtype)
    exported = framework.build(config, weights, dtype=dtype).export_weights()
    assert list(exported) == list(weights)
    for name, array in weights.items():
        assert exported[name].dtype == array.dtype and exported[name].tobytes() == array.tobytes(), name


def test_float64_weights_are_never_rounded_through_float32(framework):
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=5, dtype="float64")
    weights = {name: array + 2.0**-40 for name, array in weights.items()}  # invisible in float32
    exported = framework.build(config, weights, dtype="float64").export_weights()
    assert all(exported[name].tobytes() == weights[name].tobytes() for name in weights)


def test_float32_weights_computed_in_float64_are_cast_exactly(framework):
    config = CONFIGS["tiny"]
    weights32 = random_weights(config, seed=6, dtype="float32")
    model = framework.build(config, weights32, dtype="float64")
    exported = model.export_weights()
    assert all(np.array_equal(exported[n], weights32[n].astype(np.float64)) for n in weights32)
    assert exported["hidden.0.weight"].dtype == np.float64


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_model_owns_its_weights_and_the_caller_keeps_theirs(framework, dtype):
    # Builds take the weights without spare copies (torch: assign=True, MXNet: a zero-copy view), which
    # must never leave the model sharing memory with the caller's arrays, cast or not.
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=7, dtype="float64")
    kept = {name: array.copy() for name, array in weights.items()}
    batch = CASES[0].batch(config)
    model = framework.build(config, weights, dtype=dtype)
    before = model(**batch)
    for array in weights.values():
        array += 1.0
    assert np.array_equal(model(**batch).encoded, before.encoded)
    exported = model.export_weights()
    assert all(np.array_equal(exported[name], kept[name].astype(dtype)) for name in kept)
    assert all(array.flags.writeable for array in weights.values())
    for array in exported.values():
        array += 1.0
    assert np.array_equal(model(**batch).encoded, before.encoded)


@pytest.mark.parametrize("gradients", [True, False])
def test_a_shared_build_and_export_cost_no_copy_where_the_framework_allows(framework, gradients):
    """``share=True`` is how the conformance engine holds one set of weights, not four: torch and Gluon
    keep the caller's arrays as their parameters on the CPU (a read-only one only for a model that is
    only run). Both lend read-only views of their own storage, which outlive the model."""
    import gc

    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=7, dtype="float64")
    protected = {name: array.copy() for name, array in weights.items()}
    for array in protected.values():
        array.flags.writeable = False
    for given in (weights, protected):
        model = framework.build(config, given, dtype="float64", gradients=gradients, share=True)
        lent, copied = model.export_weights(share=True), model.export_weights()
        assert all(lent[name].tobytes() == given[name].tobytes() for name in given)
        assert not any(array.flags.writeable for array in lent.values())
        assert all(array.flags.writeable and not np.shares_memory(array, lent[name]) for name, array in copied.items())
        # Whether the model keeps the caller's arrays: torch and Gluon do; JAX's device_put may keep an
        # aligned one, so it is not pinned here.
        kept = given is weights or not gradients if framework.NAME in ("torch", "mxnet") else None
        if kept is not None:
            assert all(np.shares_memory(lent[name], given[name]) == kept for name in given), (given is weights, kept)
        again = model.export_weights(share=True)
        if framework.elsewhere is None:  # a worker's weights come back as read-only copies
            assert all(np.shares_memory(lent[name], again[name]) for name in given)
        del model, copied, again
        gc.collect()
        assert all(lent[name].tobytes() == given[name].tobytes() for name in given)


def test_a_model_built_without_gradients_computes_the_same(framework):
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=8, dtype="float64")
    batch = CASES[0].batch(config)
    trainable = framework.build(config, weights, dtype="float64")(**batch, intermediates=True)
    run_only = framework.build(config, weights, dtype="float64", gradients=False)(**batch, intermediates=True)
    assert np.array_equal(trainable.encoded, run_only.encoded) and np.array_equal(trainable.mlm, run_only.mlm)


def test_two_inference_calls_are_identical_even_with_dropout_configured(framework):
    config = BERTConfig(
        vocab_size=50, num_hiddens=12, ffn_num_hiddens=20, num_heads=3, num_blks=2, dropout=0.5, max_len=16
    )
    model = framework.build(config, random_weights(config))
    batch = CASES[0].batch(config)
    first, second = model(**batch), model(**batch)
    assert np.array_equal(first.encoded, second.encoded) and np.array_equal(first.mlm, second.mlm)
    ref = load_backend("numpy").build(config, random_weights(config))(**batch)
    assert_conforms(first, ref, "float32")  # dropout is off at inference


def test_gpu_request_without_a_gpu_is_a_clear_error(framework):
    if framework.devices() != ["cpu"]:
        pytest.skip(f"{framework.NAME} sees a GPU here: {framework.devices()}")
    config = CONFIGS["tiny"]
    with pytest.raises(CannotRunHere, match=r"device (cuda|gpu):0 asked for, but this"):
        framework.build(config, init_weights(config), device="cuda")


def test_unknown_device_and_dtype_are_rejected(framework):
    config = CONFIGS["tiny"]
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        framework.build(config, init_weights(config), device="tpu")
    with pytest.raises(ValueError, match="unsupported dtype 'float16'"):
        framework.build(config, init_weights(config), dtype="float16")


def test_runtime_info_reports_framework_and_threads(framework):
    config = CONFIGS["tiny"]
    info = framework.build(config, init_weights(config)).runtime_info()
    assert info["backend"] == framework.NAME and info["device"] == "cpu" and info["dtype"] == "float32"
    assert info["framework"].startswith(framework.NAME + " ")
    assert isinstance(info["threads"], int) and info["threads"] >= 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_runtime_info_states_the_precision_of_matrix_products(framework, dtype):
    """Each framework can compute on a GPU, where float32 products may be TF32: every model says which
    (on a CPU, full precision whatever the setting)."""
    config = CONFIGS["tiny"]
    asks = [False, True] if framework.takes("tf32") else [False]
    for tf32 in asks:
        info = framework.build(config, init_weights(config), dtype=dtype, tf32=tf32).runtime_info()
        assert (info["tf32"], info["matmul precision"]) == (tf32, dtype)


@pytest.mark.cuda
def test_on_a_gpu_float32_products_are_full_float32_unless_tf32_is_asked_for(framework):
    """JAX's own GPU default is TF32-class (3x to 70x the float32 tolerance on the fixtures): every
    framework holds float32 products to full float32 on a GPU, within the policy, and says which. Compiled
    quickly or with its compiler's defaults, the same."""
    gpus = [device for device in framework.devices() if device != "cpu"]
    if not gpus:
        pytest.skip(f"backend {framework.name!r} sees no GPU here")
    config = CONFIGS["chapter"]
    weights = random_weights(config, seed=0, dtype="float64")
    batch = CASES[0].batch(config)
    reference = load_backend("numpy").build(config, weights)(**batch, intermediates=True)
    model = framework.build(config, weights, device=gpus[0], dtype="float32", gradients=False)
    assert (model.runtime_info()["tf32"], model.runtime_info()["matmul precision"]) == (False, "float32")
    assert_conforms(model(**batch, intermediates=True), reference, "float32", device="cuda")
    if framework.takes("tf32"):
        info = framework.build(config, weights, device=gpus[0], dtype="float32", tf32=True).runtime_info()
        assert (info["tf32"], info["matmul precision"]) == (True, "tf32")
    if framework.takes("optimize"):  # on the tiny model: XLA's autotuning takes seconds a product's shape
        tiny = CONFIGS["tiny"]
        weights = random_weights(tiny, seed=0, dtype="float64")
        batch = CASES[0].batch(tiny)
        reference = load_backend("numpy").build(tiny, weights)(**batch, intermediates=True)
        optimized = framework.build(tiny, weights, device=gpus[0], dtype="float32", gradients=False, optimize=True)
        assert_conforms(optimized(**batch, intermediates=True), reference, "float32", device="cuda")


@pytest.mark.cuda
def test_on_a_gpu_the_fused_attention_computes_d2ls_in_every_precision(framework):
    """What bench and pretrain run on a GPU: the fused attention, held to the oracle in float32 and float64
    (every case where nothing is compiled per shape, the cases of distinct kernel paths where it is), and in
    bfloat16 products as far from it as bfloat16 moves outputs, no further."""
    gpus = [device for device in framework.devices() if device != "cpu"]
    if not gpus or not framework.takes("attention"):
        pytest.skip(f"backend {framework.name!r} sees no GPU here or has no fused attention")
    config = CONFIGS["chapter"]
    weights = random_weights(config, seed=0, dtype="float64")
    oracle = load_backend("numpy").build(config, weights)
    # Every case but max_len, a rule of the positional table's, not of attention (and a model cut to 64).
    kept = KERNEL_PATHS if framework.prepares else CASE_NAMES
    cases = [case for case in CASES if case.name in kept and case.name != "max_len"]
    for dtype in ("float32", "float64"):
        model = framework.build(config, weights, device=gpus[0], dtype=dtype, gradients=False, attention="sdpa")
        for case in cases:
            batch = case.batch(config)
            assert_conforms(model(**batch, intermediates=True), oracle(**batch, intermediates=True), dtype, "cuda")
    lower = framework.build(config, weights, device=gpus[0], gradients=False, attention="sdpa",
                            mixed_precision="bfloat16")  # fmt: skip
    batch = CASES[0].batch(config)
    out, expected = lower(**batch), oracle(**batch)
    error = max(float(np.abs(getattr(out, name) - getattr(expected, name)).max()) for name in ("encoded", "nsp"))
    assert 1e-4 < error < 0.25


def test_mixed_precision_computes_bfloat16_products_on_float32_weights_or_is_refused(framework):
    """bfloat16 products move outputs by about 1e-2 (float32's by 1e-6): a model that says it computes
    them so must be that far from the oracle, no further, and keep its float32 weights exactly."""
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=3, dtype="float32")
    batch = CASES[0].batch(config)
    try:
        model = framework.build(config, weights, mixed_precision="bfloat16")
    except CannotRunHere as error:  # MXNet has no such option; XLA's CPU backend keeps float32 products
        assert not framework.takes("mixed_precision") or "GPU only" in str(error)
        return
    oracle = load_backend("numpy").build(config, weights)(**batch)
    out = model(**batch)
    error = max(float(np.abs(getattr(out, name) - getattr(oracle, name)).max()) for name in ("encoded", "mlm", "nsp"))
    assert out.encoded.dtype == out.mlm.dtype == np.float32 and 1e-4 < error < 0.25
    assert model.runtime_info()["matmul precision"] == "bfloat16"
    assert all(np.array_equal(array, weights[name]) for name, array in model.export_weights().items())
    with pytest.raises(ValueError, match=r"mixed precision \(bfloat16\) is for float32 weights, not float64 ones"):
        framework.build(config, weights, dtype="float64", mixed_precision="bfloat16")
    with pytest.raises(ValueError, match=r"unknown mixed_precision 'float16': expected one of \['bfloat16'\]"):
        framework.build(config, weights, mixed_precision="float16")


def test_weights_in_any_numpy_layout_build_and_compute_the_same(framework):
    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=7, dtype="float64")
    big_endian = {name: array.astype(array.dtype.newbyteorder(">")) for name, array in weights.items()}
    reversed_strides = {name: array[::-1].copy()[::-1] for name, array in weights.items()}
    batch = CASES[0].batch(config)
    expected = framework.build(config, weights, dtype="float64")(**batch)
    for odd in (big_endian, reversed_strides):
        model = framework.build(config, odd, dtype="float64")
        got = model(**batch)
        assert np.array_equal(got.encoded, expected.encoded) and np.array_equal(got.mlm, expected.mlm)
        assert all(np.array_equal(model.export_weights()[n], weights[n]) for n in weights)


@pytest.mark.needs("save_checkpoint", "load_checkpoint")
def test_a_big_endian_weights_file_converts_to_a_framework_checkpoint(framework, tmp_path):
    from bert_multi import load_weights, save_weights

    config = CONFIGS["tiny"]
    weights = random_weights(config, seed=8)
    big_endian = {name: array.astype(">f4") for name, array in weights.items()}
    _, loaded = load_weights(save_weights(tmp_path / "w.npz", config, big_endian))
    framework.save_checkpoint(tmp_path / "checkpoint", config, loaded)
    back = framework.load_checkpoint(tmp_path / "checkpoint", config).weights
    assert all(np.array_equal(back[n], weights[n]) for n in weights)
