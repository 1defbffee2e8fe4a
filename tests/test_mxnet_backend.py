"""What only the MXNet backend has: Gluon's deferred API, .params checkpoints and structural names,
hybridization, autograd.record, OpenMP threads, and the NumPy version it needs."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bert_multi import BERTConfig, WeightsError, init_weights, load_backend, random_weights
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.cases import CASES
from bert_multi.engine.conform import run_conformance
from bert_multi.engine.results import Target, assert_conforms

if not_in_process("mxnet"):
    pytest.skip(not_in_process("mxnet"), allow_module_level=True)

import mxnet as mx  # noqa: E402
from mxnet import autograd  # noqa: E402
from mxnet import np as mnp  # noqa: E402

import bert_multi.mxnet as bmx  # noqa: E402

CONFIG = BERTConfig(vocab_size=37, num_hiddens=16, ffn_num_hiddens=24, num_heads=4, num_blks=2, dropout=0.3, max_len=12)


def d2l_model(config):
    return bmx.BERTModel(*config.d2l_args())


def as_mx(batch, dtype="float32"):
    return [
        None if value is None else mnp.array(value, dtype=dtype if name == "valid_lens" else value.dtype)
        for name, value in batch.items()
    ]


def test_chapter_code_runs_unchanged_with_deferred_shapes():
    # The d2l chapter's own MXNet cells, with `d2l.` replaced by this backend.
    vocab_size, num_hiddens, ffn_num_hiddens, num_heads = 10000, 768, 1024, 4
    num_blks, dropout = 2, 0.2
    encoder = bmx.BERTEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout)
    encoder.initialize()
    tokens = mnp.random.randint(0, vocab_size, (2, 8))
    segments = mnp.array([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    encoded_X = encoder(tokens, segments, None)
    assert encoded_X.shape == (2, 8, 768)
    mlm = bmx.MaskLM(vocab_size, num_hiddens)
    mlm.initialize()  # deferred: input width inferred on the first call
    mlm_Y_hat = mlm(encoded_X, mnp.array([[1, 5, 2], [6, 1, 5]]))
    assert mlm_Y_hat.shape == (2, 3, 10000)
    nsp = bmx.NextSentencePred()
    nsp.initialize()
    assert nsp(encoded_X).shape == (2, 2)  # Gluon's Dense flattens (2, 8, 768) itself
    attention = bmx.MultiHeadAttention(100, 5, 0.5)
    attention.initialize()
    X, Y = mnp.ones((2, 4, 100)), mnp.ones((2, 6, 100))
    assert attention(X, Y, Y, mnp.array([3, 2])).shape == (2, 4, 100)


def test_structural_names_follow_the_mapping_table(tmp_path):
    module = d2l_model(CONFIG)
    module.initialize()
    module.save_parameters(str(tmp_path / "d2l.params"))
    saved = set(mx.npx.load(str(tmp_path / "d2l.params")))
    expected = {
        "encoder.blks.0.addnorm1.ln.gamma",
        "mlm.mlp.1.beta",
        "mlm.mlp.2.weight",
        "hidden.weight",
        "encoder.pos_embedding",
        "nsp.output.bias",
    }
    assert expected <= saved and len(saved) == 45


def test_a_d2l_params_checkpoint_loads(tmp_path):
    trained = d2l_model(CONFIG)  # stands for a d2l 1.0 model with Gluon's own initialisation
    trained.initialize(mx.init.Normal(0.5))
    trained.save_parameters(str(tmp_path / "d2l.params"))
    weights = bmx.load_checkpoint(tmp_path / "d2l.params", CONFIG).weights
    batch = CASES[0].batch(CONFIG)
    expected = trained(*as_mx(batch))
    got = bmx.build(CONFIG, weights)(**batch)
    np.testing.assert_array_equal(got.encoded, expected[0].asnumpy())
    np.testing.assert_array_equal(got.mlm, expected[1].asnumpy())
    fresh = d2l_model(CONFIG)
    fresh.load_parameters(str(tmp_path / "d2l.params"))  # and Gluon itself still reads it


def test_checkpoint_round_trip_and_errors(tmp_path):
    weights = random_weights(CONFIG, seed=1, dtype="float64")
    bmx.save_checkpoint(tmp_path / "w.params", CONFIG, weights)
    loaded = bmx.load_checkpoint(tmp_path / "w.params", CONFIG).weights
    assert all(loaded[n].tobytes() == weights[n].tobytes() for n in weights)
    with pytest.raises(WeightsError, match=r"missing \['encoder.blks.2"):
        bmx.load_checkpoint(tmp_path / "w.params", BERTConfig(37, 16, 24, 4, 3, max_len=12))
    (tmp_path / "junk.params").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="not a format bert_multi reads"):
        bmx.load_checkpoint(tmp_path / "junk.params", CONFIG)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hybridized_execution_gives_the_same_numbers(dtype):
    weights = random_weights(CONFIG, seed=3)
    batch = CASES[3].batch(CONFIG)
    imperative = bmx.build(CONFIG, weights, dtype=dtype)(**batch, intermediates=True)
    hybrid = bmx.build(CONFIG, weights, dtype=dtype, compile=True)
    for _ in range(2):  # the first call builds the graphs, the second runs them cached
        assert_conforms(hybrid(**batch, intermediates=True), imperative, dtype)


def test_gradients_reach_every_parameter_including_the_positional_embedding():
    module = bmx.build(CONFIG, random_weights(CONFIG, seed=2)).module
    params = module.collect_params()
    params.setattr("grad_req", "write")
    with autograd.record(train_mode=True):
        encoded, mlm, nsp = module(*as_mx(CASES[0].batch(CONFIG)))
        loss = (mlm**2).mean() + (nsp**2).mean() + encoded.mean()
    loss.backward()
    for name, parameter in params.items():
        assert float(mnp.abs(parameter.grad()).sum()) > 0, name


def test_a_model_built_without_gradients_has_no_gradient_buffers():
    trainable = bmx.build(CONFIG, random_weights(CONFIG)).module.collect_params().values()
    assert all(p.grad_req == "write" and p.list_grad() for p in trainable)
    run_only = bmx.build(CONFIG, random_weights(CONFIG), gradients=False).module.collect_params().values()
    assert all(p.grad_req == "null" and p._grad is None for p in run_only)


def test_dropout_acts_only_when_recording_in_train_mode():
    module = bmx.build(CONFIG, random_weights(CONFIG, seed=2)).module
    inputs = as_mx(CASES[1].batch(CONFIG))
    outside = module(*inputs)[0].asnumpy()
    with autograd.record(train_mode=False):
        predicting = module(*inputs)[0].asnumpy()
    with autograd.record(train_mode=True):
        training = module(*inputs)[0].asnumpy()
    np.testing.assert_array_equal(outside, predicting)
    assert not np.allclose(training, outside)


def test_float64_layer_norm_keeps_eps_in_float32():
    """A framework difference the tolerance policy accounts for: MXNet stores LayerNorm's eps as a C
    float, so float64 runs use 9.99999974737875e-06, not 1e-5. At small variance this alone moves
    outputs by 1.3e-13 / variance (about 1e-9 at variance 1e-4)."""
    x = 0.01 * np.random.default_rng(0).standard_normal((8, 64))
    out = mx.npx.layer_norm(
        mnp.array(x, dtype="float64"), mnp.ones(64, dtype="float64"), mnp.zeros(64, dtype="float64"), axis=-1, eps=1e-5
    ).asnumpy()

    def normalise(eps):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)

    assert np.abs(out - normalise(float(np.float32(1e-5)))).max() < 1e-13
    assert np.abs(out - normalise(1e-5)).max() > 1e-10


def run_python(code, env=None):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_openmp_threads_default_to_every_core_for_mxnet_and_torch():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    code = (
        "import os, bert_multi as bm; bm.load_backend('mxnet'); import torch; "
        "print(len(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], torch.get_num_threads())"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    cores, mxnet_threads, torch_threads = result.stdout.split()
    assert cores == mxnet_threads == torch_threads, result.stderr


def test_the_users_thread_count_wins():
    code = (
        "import bert_multi as bm; c = bm.CONFIGS['tiny']; "
        "print(bm.load_backend('mxnet').build(c, bm.init_weights(c)).runtime_info()['threads'])"
    )
    assert run_python(code, {"OMP_NUM_THREADS": "1"}).stdout.strip() == "1"


def test_a_newer_numpy_makes_mxnet_unavailable_with_the_reason():
    code = "import numpy; numpy.__version__ = '1.26.4'\nimport bert_multi\nprint(bert_multi.backends()['mxnet'].reason)"
    result = run_python(code)
    assert "needs numpy<1.24" in result.stdout and "numpy 1.26.4 is installed" in result.stdout, result.stderr


def test_conformance_holds_mxnet_to_the_oracle_at_its_own_layer_norm_eps():
    """Where the LayerNorm input varies little, float32(1e-5) and 1e-5 give visibly different outputs;
    against the oracle run with MXNet's own eps the float64 agreement is back near machine precision."""
    config = BERTConfig(vocab_size=5, num_hiddens=2, ffn_num_hiddens=3, num_heads=1, num_blks=1, max_len=4)
    weights = init_weights(config, seed=0, dtype="float64")
    for name in ("encoder.token_embedding.weight", "encoder.segment_embedding.weight", "encoder.pos_embedding"):
        weights[name] = weights[name] * 0.05  # a tiny variance at the first LayerNorm
    batch = CASES[0].batch(config)
    out = bmx.build(config, weights, dtype="float64")(**batch, intermediates=True)
    plain = load_backend("numpy").build(config, weights)(**batch, intermediates=True)
    adjusted = load_backend("numpy").build(config, weights, layer_norm_eps=bmx.LAYER_NORM_EPS)(
        **batch, intermediates=True
    )
    first_norm = "blks.0.addnorm1"
    assert np.abs(out.intermediates[first_norm] - plain.intermediates[first_norm]).max() > 1e-9  # out of policy
    assert_conforms(out, adjusted, "float64")
    report = run_conformance(config, weights, [Target("mxnet", "float64")], [("mixed", batch)], pairs=False)
    assert report.passed and report.checks[0].reference == "oracle (LayerNorm eps 9.99999975e-06)"


ARRAYS = {
    "float32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "float64": np.linspace(-1, 1, 5),
    "float16": np.array([[0.5, -2.0]], dtype=np.float16),
    "int64": np.array([[[7]], [[-3]]], dtype=np.int64),
    "empty": np.zeros((0, 4), dtype=np.float32),
}


@pytest.mark.parametrize("mode", ["npx.save", "nd.save"])
def test_the_params_reader_reads_what_mxnet_writes(tmp_path, mode):
    """bert_multi reads .params itself (MXNet's reader trusts every size in the file); it must read
    both formats MXNet writes: V3 in NumPy mode (npx.save, d2l 1.0) and V2 in legacy mode (nd.save)."""
    from hostile import V2_MAGIC, V3_MAGIC, params_bytes

    from bert_multi.files.formats.gluon import read_params

    path = tmp_path / "x.params"
    if mode == "npx.save":
        arrays = {**ARRAYS, "scalar": np.array(2.5)}  # NumPy mode has 0-d arrays
        mx.npx.save(str(path), {k: mnp.array(v, dtype=v.dtype) for k, v in arrays.items()})
    else:
        arrays = {k: v for k, v in ARRAYS.items() if v.size}  # legacy mode has no empty or 0-d arrays
        with mx.util.np_array(False), mx.util.np_shape(False):
            mx.nd.save(str(path), {k: mx.nd.array(v, dtype=v.dtype) for k, v in arrays.items()})
    loaded = read_params(path)
    assert list(loaded) == list(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape, name
        assert np.array_equal(loaded[name], array), name
    # The fuzzer's seed files are written by the test suite's own writer: they must be MXNet's bytes.
    assert params_bytes(arrays, V3_MAGIC if mode == "npx.save" else V2_MAGIC) == path.read_bytes()
