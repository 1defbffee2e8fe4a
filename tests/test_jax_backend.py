"""The JAX/Flax backend (in the NumPy-2 environment): every preset against the oracle in both dtypes and
paired with PyTorch, float64 without switching the process to 64 bits, weights out bit-identical, and
Flax's own parameter files written byte for byte as Flax writes them."""

import collections
import contextlib
import re

import numpy as np
import pytest

from bert_multi import (
    CONFIGS,
    BERTConfig,
    CannotRunHere,
    Target,
    backends,
    load_backend,
    load_checkpoint,
    random_weights,
    run_conformance,
)
from bert_multi.engine.cases import CASE_NAMES, CASES, KERNEL_PATHS
from bert_multi.engine.results import assert_conforms
from bert_multi.spec.schema import cut_max_len, param_shapes
from bert_multi.spec.semantics import PRESETS

jax = pytest.importorskip("jax", reason="JAX lives in the NumPy-2 environment (.venv-numpy2)")
pytest.importorskip("flax", reason="JAX lives in the NumPy-2 environment (.venv-numpy2)")
import jax.numpy as jnp  # noqa: E402

import bert_multi.jax  # noqa: E402
from bert_multi.jax.backend import quick_options  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    from bert_multi.jax.backend import quick_options

    # The compiler options are tried once a process, by its first quick compile: here, before the tests
    # that count what a step compiles.
    quick_options("cpu")
    return load_backend("jax")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_conforms_in_both_dtypes_and_pairs_with_torch(backend, preset):
    config = CONFIGS["tiny"].with_semantics(preset)
    weights = random_weights(config, seed=1, dtype="float64")
    paired = preset == "d2l" and backends()["torch"].available  # pairs once: they test moving weights
    names = ["jax"] + (["torch"] if paired else [])
    targets = [Target(name, dtype) for name in names for dtype in ("float32", "float64")]
    report = run_conformance(config, weights, targets, [case.input(config) for case in CASES])
    assert report.passed, report.failures()
    assert {check.target.backend for check in report.checks} == set(names)
    assert all(check.intermediates for check in report.checks)  # every activation compared


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_compiling_ahead_leaves_the_runs_own_models_nothing_to_compile(backend, device):
    # prepare compiles from shapes alone; only if it lowers for the device, dtypes and inputs a built model
    # calls with does the run find its executables in jit's cache. A fresh config, so nothing is compiled yet.
    config = BERTConfig(vocab_size=23, num_hiddens=12, ffn_num_hiddens=7, num_heads=3, num_blks=1, max_len=70)
    # On a GPU, where each program costs a second, the cases of distinct kernel paths and the cut model's.
    kept = CASE_NAMES if device == "cpu" else (*KERNEL_PATHS, "max_len")
    cases = [case.input(config, seed=2) for case in CASES if case.name in kept]
    groups = {}
    for case in cases:
        groups.setdefault(case.max_len or config.max_len, []).append(case.batch)
    assert len(groups) == 2  # the max_len case runs on a model cut to 64 positions
    compiled = collections.Counter()

    def count(event, seconds, **_):
        compiled[event] += event.endswith("backend_compile_duration")

    if device != "cpu" and len(backend.devices()) > 1:  # the GPU's compiler options, tried at its first compile
        quick_options("gpu")
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        try:
            backend.prepare(config, sorted(groups.items(), reverse=True), ["float32", "float64"], device)
        except CannotRunHere as error:  # no such device here: say why
            pytest.skip(str(error))
        ahead = sum(compiled.values())
        for dtype in ("float32", "float64"):
            weights = random_weights(config, seed=2, dtype=dtype)
            for case in cases:
                cut, cut_weights = cut_max_len(config, weights, case.max_len or config.max_len)
                backend.build(cut, cut_weights, device, dtype)(**case.batch, intermediates=True)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    # Padded to buckets, every case shares one of 5 shapes (tests/test_buckets.py counts them by hand); on a
    # GPU its 4 cases differ in kind (KERNEL_PATHS) or max_len, so each is a shape of its own.
    assert ahead == 2 * (5 if device == "cpu" else 4)
    assert sum(compiled.values()) == ahead, "the run compiled again what prepare compiled"


def test_a_model_cut_from_another_keeps_every_option_it_was_built_with(backend):
    """Each option away from its default, so that a cut that rebuilt with a default would show."""
    config = CONFIGS["tiny"]
    model = backend.build(config, random_weights(config), tf32=True, optimize=True, attention="sdpa")
    cut = model.cut(5)
    kept = {name: value for name, value in vars(model).items() if name not in ("config", "module", "params")}
    assert {name: vars(cut)[name] for name in kept} == kept and cut.config.max_len == 5
    assert cut.module.attention == model.module.attention == "sdpa"


@pytest.mark.parametrize("preset", ["d2l", "d2l-0.11"])  # a learned positional table; sinusoidal positions
def test_a_model_cut_from_another_shares_its_weights_and_is_the_model_built_from_cut_weights(backend, preset):
    # The conformance engine makes a case's shorter model so; built from weights, a worker's would take
    # every weight again. A config no other test uses, so that what the cut model compiles is counted.
    config = BERTConfig(vocab_size=19, num_hiddens=8, ffn_num_hiddens=5, num_heads=2, num_blks=1, max_len=15)
    config = config.with_semantics(preset)
    weights = random_weights(config, seed=5, dtype="float64")
    model = backend.build(config, weights, dtype="float64")
    cut = model.cut(9)
    built = backend.build(*cut_max_len(config, weights, 9), dtype="float64")
    assert cut.config == built.config and model.cut(16) is None
    compiled = collections.Counter()

    def count(event, seconds, **_):
        compiled[event] += event.endswith("backend_compile_duration")

    batch = CASES[0].batch(cut.config, seed=5)
    got = cut(**batch, intermediates=True)
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        expected = built(**batch, intermediates=True)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert not compiled, "the cut model's executable is not the one a built model calls"
    assert np.array_equal(got.encoded, expected.encoded) and np.array_equal(got.nsp, expected.nsp)
    assert all(np.array_equal(got.intermediates[name], a) for name, a in expected.intermediates.items())

    # Every parameter but the positional table is the model's own array, not a copy.
    def leaf(params, path):
        for part in path:
            params = params[part]
        return params

    paths = bert_multi.jax.backend.flax_paths(config)
    apart = [name for name, (path, _) in paths.items() if leaf(model.params, path) is not leaf(cut.params, path)]
    assert apart == (["encoder.pos_embedding"] if PRESETS[preset].positions == "learned" else [])


def test_a_users_flax_module_given_alone_is_initialised_by_one_compilation(backend):
    # Run operation by operation, Flax's init compiles each operation at each new shape: over a hundred
    # compilations for d2l's BERT, most of a verify's time. A config no other test uses, so nothing is
    # compiled yet, and a model of it is what verify wraps.
    from bert_multi.jax import wrap_user_model
    from bert_multi.spec.inputs import check_inputs

    config = BERTConfig(vocab_size=29, num_hiddens=10, ffn_num_hiddens=9, num_heads=5, num_blks=2, max_len=11)
    module = backend.BERTModel(*config.d2l_args(), semantics=config.semantics, heads=config.heads)
    example = check_inputs(config, **CASES[0].batch(config))
    compiled = collections.Counter()

    def count(event, seconds, **_):
        compiled[event] += event.endswith("backend_compile_duration")

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        wrapped = wrap_user_model(module, "float64", "cpu", example, copied=False)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert sum(compiled.values()) <= 3  # the init, and what jax.random.key(0) compiles once a process
    shapes = param_shapes(config)  # the canonical ones; Flax stores a Dense kernel (in, out)
    expected = {".".join(path): shapes[name][::-1] if turned else shapes[name] for name, (path, turned) in
                bert_multi.jax.backend.flax_paths(config).items()}  # fmt: skip
    assert dict(wrapped.parameters()) == expected


def test_float64_leaves_the_process_in_32_bits(backend):
    config = CONFIGS["tiny"]
    model = backend.build(config, random_weights(config), dtype="float64")
    batch = CASES[0].batch(config)
    assert model(**batch).encoded.dtype == np.float64
    assert not jax.config.jax_enable_x64 and jnp.ones(1).dtype == jnp.float32


def test_weights_come_back_bit_identical_and_a_gpu_missing_here_is_a_skip(backend):
    config = CONFIGS["tiny"].with_semantics("bert")
    weights = random_weights(config, seed=2, dtype="float64")
    exported = backend.build(config, weights, dtype="float64").export_weights()
    assert list(exported) == list(weights) and all(np.array_equal(exported[n], weights[n]) for n in weights)
    if backend.devices() == ["cpu"]:
        with pytest.raises(CannotRunHere, match="sees 0 GPU"):
            backend.build(config, weights, device="gpu")


def test_the_forward_is_compiled_once_per_shape(backend):
    config = CONFIGS["tiny"]
    model = backend.build(config, random_weights(config), dtype="float32")
    batch = CASES[0].batch(config)
    from bert_multi.jax.backend import apply

    forward = apply["cpu"]  # compiled quickly for the CPU unless optimize=True
    forward.clear_cache()
    model(**batch)
    model(**batch)
    backend.build(config, random_weights(config, seed=3), dtype="float32")(**batch)  # another model, same module
    assert forward._cache_size() == 1
    model(**{**batch, "pred_positions": None})  # another input structure: traced again
    assert forward._cache_size() == 2


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_tree_is_the_one_flax_makes_and_its_file_the_bytes_flax_writes(backend, preset, tmp_path):
    import flax

    from bert_multi.files.formats.flax import pack_tree

    config = CONFIGS["tiny"].with_semantics(preset)
    weights = random_weights(config, seed=4)
    batch = CASES[0].batch(config)
    model = backend.build(config, weights)
    made = flax.core.unfreeze(model.module.init(jax.random.key(0), *batch.values())["params"])
    tree = bert_multi.jax.to_flax(config, weights)
    assert jax.tree_util.tree_structure(made) == jax.tree_util.tree_structure(tree)
    assert jax.tree_util.tree_map(np.shape, made) == jax.tree_util.tree_map(np.shape, tree)
    assert pack_tree(tree) == flax.serialization.to_bytes(tree)
    backend.save_checkpoint(tmp_path / "ours.msgpack", config, weights)
    restored = flax.serialization.msgpack_restore((tmp_path / "ours.msgpack").read_bytes())
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, restored, tree))
    # What a Flax user saves (the variables dict), read back as the canonical weights.
    (tmp_path / "theirs.msgpack").write_bytes(flax.serialization.to_bytes({"params": tree}))
    stated = {"num_heads": config.num_heads} | ({"preset": preset} if preset in ("d2l", "d2l-0.12") else {})
    loaded = load_checkpoint(tmp_path / "theirs.msgpack", **stated)
    assert loaded.config.semantics.name == preset
    assert all(np.array_equal(loaded.weights[name], weights[name]) for name in weights)


@pytest.mark.parametrize("entries", [15, 16, 17])
@pytest.mark.parametrize("key_bytes", [31, 32, 33])
def test_the_flax_writer_gives_flaxs_bytes_at_msgpacks_fixed_form_boundaries(tmp_path, entries, key_bytes):
    """MessagePack writes a map of under 16 entries and a string of under 32 bytes in a shorter form:
    the writer's bytes are Flax's on both sides of each boundary, and the reader reads them back."""
    import flax

    from bert_multi.files.formats.flax import pack_tree, read_tree

    rng = np.random.default_rng(entries)
    leaves = {f"{index:0{key_bytes}d}": rng.standard_normal(3).astype(np.float32) for index in range(entries)}
    tree = {"params": {"block": leaves, "k" * key_bytes: {"kernel": np.ones((2, 3), np.float32)}}}
    assert pack_tree(tree) == flax.serialization.to_bytes(tree)
    (tmp_path / "w.msgpack").write_bytes(pack_tree(tree))
    arrays, dtypes = read_tree(tmp_path / "w.msgpack")
    assert list(arrays) == [f"block.{key}" for key in leaves] + [f"{'k' * key_bytes}.kernel"]
    assert all(np.array_equal(arrays[f"block.{key}"], leaf) for key, leaf in leaves.items())
    assert set(dtypes.values()) == {"float32"}


def test_a_training_step_leaves_weights_lent_to_numpy_as_they_were(backend):
    """The update donates the parameters' buffers to XLA; one that a NumPy view still reads must not be
    written over (JAX copies instead), or exported weights would change under the caller."""
    from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(100)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 12, 20, 3, 2, max_len=16)
    weights = random_weights(config, seed=2, dtype="float32")
    model = backend.build(config, weights, dtype="float32")
    lent = model.export_weights(share=True)
    trainer = backend.Pretrainer(model, optimizer="sgd", lr=0.5)
    for batch in [next(data.batches(8, seed=step)) for step in range(2)]:
        trainer.step(batch)
    assert all(np.array_equal(lent[name], weights[name]) for name in weights)  # as lent
    after = model.export_weights()
    assert max(float(np.abs(after[name] - weights[name]).max()) for name in weights) > 1e-3  # and it trained


def test_built_from_an_open_npz_it_holds_one_received_tensor_at_a_time(backend, tmp_path):
    """The other environment's worker hands the build the .npz it received, open: JAX copies every tensor
    (a kernel into Flax's (in, out) layout), so the build must read, copy and drop them one at a time.
    NumPy's and Python's allocations are traced: beyond what the model keeps, the peak is a few times
    the largest tensor (reading one from the archive, checking it, transposing it), not the whole set
    (sixteen blocks of alike tensors make the set 70 times the largest)."""
    import tracemalloc

    config = BERTConfig(vocab_size=40, num_hiddens=32, ffn_num_hiddens=64, num_heads=2, num_blks=16, max_len=16)
    weights = random_weights(config, seed=3, dtype="float64")
    np.savez(tmp_path / "w.npz", **weights)
    largest, total = max(a.nbytes for a in weights.values()), sum(a.nbytes for a in weights.values())
    with np.load(tmp_path / "w.npz", allow_pickle=False) as received:  # its index read before tracing
        tracemalloc.start()
        try:
            model = backend.build(config, received, dtype="float64", share=True)
            kept, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert total > 60 * largest
    assert peak - kept < 12 * largest, (peak - kept, largest, total)
    exported = model.export_weights()
    assert list(exported) == list(weights) and all(np.array_equal(exported[n], weights[n]) for n in weights)


@contextlib.contextmanager
def compiled_modules(directory):
    """Every module JAX compiles in the block, written to ``directory`` as StableHLO (``jax_dump_ir_to``),
    from empty caches so that nothing compiled before is reused unseen."""
    jax.clear_caches()
    jax.config.update("jax_dump_ir_to", str(directory))
    try:
        yield
    finally:
        jax.config.update("jax_dump_ir_to", "")


def dot_precisions(directory, function):
    """The operand precisions of every matrix product in the compiled modules of ``function``."""
    found = collections.Counter()
    for path in directory.glob(f"*jit_{function}_compile.mlir"):
        found.update(re.findall(r"stablehlo\.dot_general .*?precision = \[(\w+), \w+\]", path.read_text()))
    return found


@pytest.fixture
def a_user_default():
    """A user's own process-wide matmul precision, as JAX's TF32-class GPU default would be: the lowest."""
    jax.config.update("jax_default_matmul_precision", "bfloat16")
    yield "bfloat16"
    jax.config.update("jax_default_matmul_precision", None)


def test_float32_products_are_full_float32_in_the_compiled_code_unless_tf32_is_asked_for(
    backend, a_user_default, tmp_path
):
    """Whether a GPU computes float32 products in TF32 is decided in the compiled code: every product of
    the forward and of the training step carries HIGHEST (full float32), or HIGH (TF32) with tf32=True,
    whatever the process's own default, and the user's own code keeps that default."""
    from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(100)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), 12, 20, 3, 2, max_len=16)
    weights = random_weights(config, seed=2, dtype="float32")
    batch = CASES[0].batch(config)
    for tf32, expected in ((False, "HIGHEST"), (True, "HIGH")):
        with compiled_modules(tmp_path / str(tf32)):
            model = backend.build(config, weights, dtype="float32", tf32=tf32)
            model(**batch, intermediates=True)
            backend.Pretrainer(model, optimizer="sgd").step(next(data.batches(4, seed=0)))
            jax.jit(jnp.matmul)(jnp.ones((2, 2)), jnp.ones((2, 2)))  # the user's own code
        forward, step = (dot_precisions(tmp_path / str(tf32), name) for name in ("_apply", "_loss_and_gradients"))
        assert set(forward) == set(step) == {expected} and forward[expected] >= 4 * config.num_blks
        assert set(dot_precisions(tmp_path / str(tf32), "matmul")) == {"DEFAULT"}  # bfloat16's
        info = model.runtime_info()
        assert (info["tf32"], info["matmul precision"]) == (tf32, "float32")  # a CPU computes them in full
    assert jax.config.jax_default_matmul_precision == a_user_default


def test_every_model_states_its_matmul_precision(backend):
    config = CONFIGS["tiny"]
    for dtype in ("float32", "float64"):
        info = backend.build(config, random_weights(config), dtype=dtype).runtime_info()
        assert (info["tf32"], info["matmul precision"]) == (False, dtype)


OPTIMIZED_AND_NOT = """
import json
from bert_multi import CONFIGS, load_backend, random_weights
from bert_multi.engine.cases import CASE_NAMES, CASES, KERNEL_PATHS
backend, config = load_backend("jax"), CONFIGS["tiny"]
models = [backend.build(config, random_weights(config), optimize=optimize) for optimize in (False, True, False)]
print(json.dumps([model(**CASES[0].batch(config)).mlm.tolist() for model in models]))
"""


def test_a_model_is_compiled_quickly_unless_asked_to_optimize(backend, tmp_path):
    """Compiler options are part of the key of JAX's persistent cache, so a forward compiled quickly and
    one optimised are two entries there, and a second quick model finds the first's executable (in a
    process of its own, with a cache of its own). Both hold to the policy in both dtypes, activations
    included, and each model says how it was compiled."""
    import json
    import os
    import subprocess
    import sys

    environment = {**os.environ, "BERT_MULTI_CACHE_DIR": str(tmp_path)}
    printed = subprocess.run([sys.executable, "-c", OPTIMIZED_AND_NOT], env=environment, capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    quick, optimized, again = json.loads(printed.stdout)
    assert quick == again and np.allclose(quick, optimized, rtol=1e-5, atol=1e-5)
    assert len({path.name.rsplit("-", 1)[0] for path in (tmp_path / "jax").glob("jit__apply-*")}) == 2
    config = BERTConfig(vocab_size=29, num_hiddens=12, ffn_num_hiddens=5, num_heads=2, num_blks=1, max_len=9)
    weights, batch = random_weights(config, seed=4, dtype="float64"), CASES[1].batch(config)
    reference = load_backend("numpy").build(config, weights)(**batch, intermediates=True)
    options = (
        "xla_backend_optimization_level 0",
        "xla_cpu_use_fusion_emitters False",
        "xla_cpu_parallel_codegen_split_count 1",
    )
    quickly = f"quickly ({', '.join(options)})"
    for optimize, compiled in ((False, quickly), (True, "with XLA's defaults")):
        forward = bert_multi.jax.backend.apply[bert_multi.jax.backend.compiled_as(optimize, "cpu")]
        before = forward._cache_size()  # a config of its own: nothing compiled for it yet
        for dtype in ("float32", "float64"):
            model = backend.build(config, weights, dtype=dtype, optimize=optimize)
            assert_conforms(model(**batch, intermediates=True), reference, dtype)
            assert model.runtime_info()["compiled"] == compiled
        assert forward._cache_size() == before + 2


def test_a_compiler_option_this_xla_does_not_know_is_left_out_not_fatal(backend):
    """XLA refuses to compile with an option it does not know: one a later XLA retires must cost speed,
    not every quick compile."""
    from bert_multi.jax.backend import options_xla_takes

    known = {"xla_backend_optimization_level": 0, "xla_cpu_parallel_codegen_split_count": 1}
    assert options_xla_takes(known) == known
    assert options_xla_takes({"xla_cpu_no_such_option": True, **known}) == known
    assert options_xla_takes({"xla_cpu_no_such_option": True}) == {}


def test_a_users_flax_model_runs_at_full_float32_and_the_report_says_so(a_user_default, tmp_path):
    from subjects import flax_port

    from bert_multi.verify.session import verify

    with compiled_modules(tmp_path):
        report = verify(flax_port.build, CONFIGS["tiny"], dtypes=["float32"], cases=["mixed_valid_lens"])
    assert report.passed
    assert set(dot_precisions(tmp_path, "forward")) == {"HIGHEST"}
    assert [info["matmul precision"] for info in report.forward.runtime.values()] == ["float32"]
