"""The JAX/Flax backend behind the common interface: canonical weights in and out as a Flax parameter
tree, devices, dtypes without a process-wide switch, a compiled forward, and the named activations.

Parallel to ``bert_multi/torch/backend.py`` and ``bert_multi/mxnet/backend.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import flax
import jax
import numpy as np

try:  # where JAX opens its persistent cache: private, so a JAX that moved it runs with no cache at all
    from jax._src import compilation_cache as jax_compilation_cache
except ImportError:  # pragma: no cover - no such JAX yet
    jax_compilation_cache = None

from ..arrays import contiguous_transpose
from ..backend.buckets import distinct_padded, padded
from ..backend.contract import (
    BackendModel,
    BERTOutput,
    CaseGroups,
    Device,
    check_attention,
    check_mixed_precision_option,
    framework_names,
    intermediate_names,
    matmul_precision,
    parse_device,
    read_only,
    shareable,
    stream_weights,
)
from ..cache import cache_for, described, sealed_cache
from ..errors import CannotRunHere
from ..files import checkpoints
from ..files.checkpoints import Checkpoint
from ..files.formats import flax as flax_format
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.schema import param_shapes
from .model import BERTModel

NAME = "jax"


def use_the_compilation_cache() -> None:
    """JAX's persistent compilation cache in bert_multi's cache directory, each entry sealed and checked
    (``bert_multi.cache``), unless JAX has one already (a user's stays theirs) or caching is off. All is kept
    (ours take 0.1 to 2 s each; JAX keeps those over 1 s). JAX opens it through ``get_file_cache``."""
    directory = cache_for(NAME)
    opens = getattr(jax_compilation_cache, "get_file_cache", None)
    if jax.config.jax_compilation_cache_dir or directory is None or not callable(opens):
        return
    kept = sealed_cache(jax_compilation_cache.CacheInterface)
    jax_compilation_cache.get_file_cache = lambda path: (kept(path), path) if path == str(directory) else opens(path)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


use_the_compilation_cache()


def kernel_eps(eps: float) -> float:
    """The LayerNorm epsilon the kernels really use when asked for ``eps``: Flax keeps it as a Python
    float and adds it in the computation's dtype, as torch does, so exactly ``eps`` in float64."""
    return eps


# The precision of float32 matrix products, in jax.default_matmul_precision's names: full float32 unless
# TF32 is asked for (tf32=True), as torch's allow_tf32 is off unless asked for; with mixed_precision,
# bfloat16 products summed in float32, which is what torch.autocast asks of a GPU's matrix units.
MATMUL_PRECISION = {False: "highest", True: "tensorfloat32"}
MIXED_MATMUL_PRECISION = {"bfloat16": "BF16_BF16_F32"}


@contextlib.contextmanager
def precision(dtype: str, tf32: bool = False, mixed_precision: str | None = None) -> Iterator[None]:
    """float64 for the duration, and float32 matrix products in full float32 unless ``tf32`` or
    ``mixed_precision``, on this thread only. Framework difference: JAX computes in 32 bits unless 64-bit
    mode is on, a process-wide switch by default (``jax_enable_x64``); ``jax.enable_x64`` sets it for a
    block, so a float64 model leaves a user's float32 JAX code as it was. And on NVIDIA GPUs JAX's default
    for float32 products is TF32-class (torch's is full float32): ``jax.default_matmul_precision`` sets
    it for a block too, and jit compiles a function again for each precision, so the user's own setting
    stays theirs. There is no autocast: mixed precision is a precision of the products, the arrays stay
    float32."""
    # jax.enable_x64 is the context manager in JAX 0.10; earlier releases kept it in jax.experimental.
    switch = getattr(jax, "enable_x64", None)
    if switch is None:
        switch = jax.experimental.enable_x64
    products = MIXED_MATMUL_PRECISION[mixed_precision] if mixed_precision else MATMUL_PRECISION[tf32]
    with switch(dtype == "float64"), jax.default_matmul_precision(products):
        yield


def to_framework_device(device: Device) -> jax.Device:
    # Framework difference: JAX lists its devices by platform, "cpu" and "gpu" (CUDA or ROCm).
    # jax.local_devices: in a multi-process run jax.devices() lists every process's devices.
    if device.kind == "cpu":
        return jax.local_devices(backend="cpu")[0]
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:
        gpus = []
    if device.index >= len(gpus):
        raise CannotRunHere(f"device {device} asked for, but this JAX ({jax.__version__}) sees {len(gpus)} GPU(s)")
    return gpus[device.index]


def devices() -> list[str]:
    """The devices this JAX can use here: the CPU and each GPU its build sees."""
    try:
        return ["cpu"] + [f"gpu:{index}" for index in range(len(jax.devices("gpu")))]
    except RuntimeError:  # no GPU backend in this build
        return ["cpu"]


# Framework difference: Flax's parameter tree nests dicts by module (blks_0, not blks.0), names a
# LayerNorm's weight scale and a Dense's kernel, stored (in, out); one table says so, beside its file format.
NAME_RULES = flax_format.NAME_RULES
to_flax = flax_format.flax_tree


def flax_paths(config: BERTConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Canonical name -> (its path in the Flax parameter tree, whether it is stored transposed)."""
    names = framework_names(config, NAME_RULES)
    return {name: (tuple(dotted.split(".")), flax_format.transposed(dotted)) for name, dotted in names.items()}


def flax_shapes(config: BERTConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Canonical name -> (its path in the Flax parameter tree, its shape there: a kernel's reversed)."""
    shapes = param_shapes(config)
    return {
        name: (path, shapes[name][::-1] if turned else shapes[name])
        for name, (path, turned) in flax_paths(config).items()
    }


def _module(config: BERTConfig, attention: str = "d2l") -> BERTModel:
    """The d2l ``BERTModel`` of ``config``, every generation's rules included; its parameters live apart."""
    return BERTModel(*config.d2l_args(), semantics=config.semantics, heads=config.heads, attention=attention)


def _leaf(params: Any, path: tuple[str, ...]) -> Any:
    """The parameter at ``path`` in a Flax parameter tree."""
    for part in path:
        params = params[part]
    return params


def _activations(collected: dict[str, Any]) -> OrderedDict[str, np.ndarray]:
    """Flax's intermediates collection as the named activations, in computation order."""
    found: dict[str, np.ndarray] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        for key, value in node.items():
            if isinstance(value, tuple):  # sow appends to a tuple: the first (only) call's value
                found[_activation_name((*path, key))] = np.asarray(value[0])
            else:
                walk(value, (*path, key))

    walk(flax.core.unfreeze(collected), ())
    return OrderedDict(found)


def _activation_name(path: tuple[str, ...]) -> str:
    if path[-1] in ("embedding", "pooler"):
        return path[-1]
    block = next(part for part in path if part.startswith("blks_"))
    return f"blks.{block.removeprefix('blks_')}.{path[-1].removesuffix('_out')}"


# A model built to be checked runs each shape a few times, so it is compiled quickly, by device kind: on a GPU without
# XLA's autotuning (compiling and timing candidate kernels for every matrix product, 10.7 s a forward program of the
# chapter's model on an H100, against 1 s without; the kernels it keeps depend on those timings) and with cuBLAS's
# products rather than Triton-generated ones (half of the rest: 1.9 s for four forward programs there, against 3.8 s);
# on a CPU with XLA's backend at optimisation level 0, its loop emitters rather than its fusion emitters, and its code
# generated in one piece rather than split across threads (a sixth of the CPU time of XLA's defaults to compile the
# chapter's forward, 0.08 s against 0.51 s, and 30% slower to run, 5.5 ms against 4.2 ms, measured on the reference
# VM). Either moves results by rounding only (3.2e-6 at most in float32 on the chapter's outputs). A model built to be
# timed or trained asks for XLA's defaults (optimize=True).
QUICK_CPU = {
    "xla_backend_optimization_level": 0,
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_parallel_codegen_split_count": 1,
}
QUICK_GPU = {"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False}
# A model built to be timed or trained (optimize=True) is compiled with XLA's defaults on a CPU, and on a
# GPU as a checked one is: measured on an H100, the compiled forward ran faster so than with XLA's
# defaults (the Triton kernels its autotuning chose), the chapter's on 512 x 64 tokens in float32 in 16.0
# ms against 49.6 ms, BERT-base's on 64 x 128 with bfloat16 products in 7.5 ms against 17.2 ms.
OPTIMIZED = "optimized"
OPTIMIZED_OPTIONS: dict[str, dict[str, Any]] = {"cpu": {}, "gpu": QUICK_GPU}


def options_xla_takes(options: dict[str, Any], kind: str = "cpu") -> dict[str, Any]:
    """Those of the compiler ``options`` for a device kind that this jaxlib's XLA knows, tried on a program
    of one addition: XLA refuses a compile with an option it does not know, and a later one may retire a flag."""
    lowered = jax.jit(lambda x: x + 1).lower(jax.device_put(np.float32(0), jax.devices(kind)[0]))

    def taken(chosen: dict[str, Any]) -> bool:
        try:
            lowered.compile(compiler_options=chosen)
        except jax.errors.JaxRuntimeError:
            return False
        return True

    if taken(options):
        return options
    return {option: value for option, value in options.items() if taken({option: value})}


@functools.cache
def quick_options(kind: str) -> dict[str, Any]:
    """The compiler options of a model built to be checked on a device kind ("cpu", "gpu"). Asked for at
    the first compile, not at import: trying an option starts XLA's backend, which a process that joins a
    distributed run must not have done before ``jax.distributed.initialize``."""
    return options_xla_takes(QUICK_CPU if kind == "cpu" else QUICK_GPU, kind)


@functools.cache
def optimized_options(kind: str) -> dict[str, Any]:
    """The compiler options of a model built to be timed or trained on a device kind (``OPTIMIZED_OPTIONS``)."""
    return options_xla_takes(OPTIMIZED_OPTIONS[kind], kind) if OPTIMIZED_OPTIONS[kind] else {}


def compiled_as(optimize: bool, kind: str) -> str:
    """Which of each ``Jitted`` function a model calls: "gpu", or "optimized gpu" for one built to be timed."""
    return f"{OPTIMIZED} {kind}" if optimize else kind


class Jitted(dict[str, Any]):
    """A function under ``jax.jit`` for each way a model compiles (``compiled_as``): quickly for a device
    kind (``quick_options``), or to run fast (``optimized_options``), made at its first use, once for all
    threads. Framework difference: compiler options belong to a jitted function (the outermost one), not
    to a call."""

    def __init__(self, function: Callable[..., Any], **arguments: Any) -> None:
        super().__init__()
        self.function, self.arguments = function, arguments
        self.lock = threading.Lock()

    def __missing__(self, way: str) -> Any:
        with self.lock:
            if way not in self:
                optimized, _, kind = way.rpartition(" ")
                options = optimized_options(kind) if optimized else quick_options(kind)
                self[way] = jax.jit(self.function, compiler_options=options, **self.arguments)
            return dict.__getitem__(self, way)


def _apply(module: BERTModel, record: bool, params: Any, *inputs: Any) -> Any:
    """The module's forward on ``params``, compiled once per module, input shapes and dtypes, and shared
    by every model of that module (a conformance run builds many). With ``record``, also Flax's
    ``intermediates`` collection. Framework difference: the parameters live outside the module and are
    passed to every call; jit traces the function on the first call of each shape, then runs it compiled."""
    if record:
        return module.apply({"params": params}, *inputs, mutable=["intermediates"])
    return module.apply({"params": params}, *inputs)


apply = Jitted(_apply, static_argnums=(0, 1))


class JaxBERT(BackendModel):
    """A Flax ``BERTModel`` (``.module``) with its parameters (``.params``) on a device; the forward is
    compiled with ``jax.jit`` (once per input shape, padded to its bucket)."""

    backend = NAME

    def __init__(
        self,
        config: BERTConfig,
        module: BERTModel,
        params: Any,
        dtype: str,
        device: Device,
        place: jax.Device,
        tf32: bool = False,
        mixed_precision: str | None = None,
        optimize: bool = False,
    ) -> None:
        super().__init__(config, dtype, device)
        self.module, self.params, self.place = module, params, place
        self.tf32, self.mixed_precision, self.optimize = tf32, mixed_precision, optimize
        self.attention = module.attention

    @property
    def compiled(self) -> str:
        """Which of each ``Jitted`` function it calls (``compiled_as``)."""
        return compiled_as(self.optimize, self.device.kind)

    def computing(self) -> contextlib.AbstractContextManager[None]:
        """The precision this model computes in (its dtype and its products'), for the duration: every
        call that computes with its parameters runs inside it, training steps included."""
        return precision(self.dtype, self.tf32, self.mixed_precision)

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        # Framework difference: jit compiles for each input shape, so inputs are padded to a few (buckets).
        bucketed = padded(inputs, self.config.semantics)
        with self.computing():
            arrays = [None if a is None else jax.device_put(a, self.place) for a in bucketed.inputs]
            if intermediates:
                (encoded, mlm, nsp), state = apply[self.compiled](self.module, True, self.params, *arrays)
                found = _activations(state["intermediates"])
                record = OrderedDict((name, found.get(name)) for name in intermediate_names(self.config))
            else:
                encoded, mlm, nsp = apply[self.compiled](self.module, False, self.params, *arrays)
                record = None
            return bucketed.cut(BERTOutput(np.asarray(encoded), _to_numpy(mlm), _to_numpy(nsp), record))

    def on_device(self, inputs: ModelInputs) -> Callable[[], object]:
        with self.computing():
            arrays = [None if a is None else jax.device_put(a, self.place) for a in inputs]

        def forward() -> object:
            with self.computing():
                outputs = apply[self.compiled](self.module, False, self.params, *arrays)
            # Framework difference: a call returns once dispatched; its outputs are waited for, not read.
            return jax.block_until_ready(outputs)

        return forward

    def at_precision(self, tf32: bool = False, mixed_precision: str | None = None) -> JaxBERT:
        # Framework difference: the precision is a context around each call (jit compiles once for each),
        # and the parameters live apart from the module, so both are shared.
        check_mixed_precision_option(mixed_precision, self.dtype)
        refuse_mixed_precision_on_cpu(mixed_precision, self.device)
        return JaxBERT(self.config, self.module, self.params, self.dtype, self.device, self.place, tf32,
                       mixed_precision, self.optimize)  # fmt: skip

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        weights = {}
        for name, (path, turned) in flax_paths(self.config).items():
            # On the CPU np.asarray is a read-only view of JAX's own buffer, which it keeps alive.
            array = np.asarray(_leaf(self.params, path))
            if share:
                weights[name] = read_only(array.T if turned else array)
            else:
                weights[name] = contiguous_transpose(array) if turned else np.array(array)
        return weights

    def cut(self, max_len: int) -> JaxBERT | None:
        """Framework difference: the parameters are a tree apart from the module, so the shorter model is
        a module of that max_len with the same tree, its positional table's leaf sliced: every other
        parameter is shared, and nothing is copied or moved."""
        if not 1 <= max_len <= self.config.max_len:
            return None
        config = dataclasses.replace(self.config, max_len=max_len)
        leaves = {}
        with self.computing():  # a float64 table is sliced in float64
            for path, shape in flax_shapes(config).values():
                node = _leaf(self.params, path)
                leaves[".".join(path)] = node if node.shape == shape else node[tuple(slice(n) for n in shape)]
        params = flax_format.nested(leaves)
        return JaxBERT(
            config,
            _module(config, self.attention),
            params,
            self.dtype,
            self.device,
            self.place,
            self.tf32,
            self.mixed_precision,
            self.optimize,
        )

    def framework_info(self) -> dict[str, object]:
        info: dict[str, object] = {"framework": f"jax {jax.__version__} (flax {flax.__version__})"}
        info["threads"] = xla_threads()
        info["compilation cache"] = described(jax.config.jax_compilation_cache_dir)
        info.update(matmul_precision(self.dtype, self.device, self.tf32, self.mixed_precision))
        info["attention"] = self.attention
        quick = ", ".join(f"{option} {value}" for option, value in quick_options(self.device.kind).items())
        if self.optimize:
            changed = ", ".join(f"{option} {value}" for option, value in optimized_options(self.device.kind).items())
            info["compiled"] = "with XLA's defaults" + (f" but {changed}" if changed else "")
        else:
            info["compiled"] = f"quickly ({quick})"
        if self.device.kind == "gpu":
            info["gpu"] = self.place.device_kind
        return info


def prepare(config: BERTConfig, groups: CaseGroups, dtypes: list[str], device: str = "cpu") -> None:
    """Compile ahead the forward with activations that a conformance run asks for, for each dtype, group's
    max_len and batch, from the parameters' shapes alone: no weights are made and nothing runs. Lowered
    for the parameters' device and dtype as a built model's are, it is the executable the run's own calls
    find in jit's cache (``apply`` is shared by every model of a module; the run's compile quickly)."""
    target = parse_device(device)
    place = to_framework_device(target)
    on_place = jax.sharding.SingleDeviceSharding(place)
    for dtype in dtypes:
        for max_len, batches in groups:
            cut = dataclasses.replace(config, max_len=max_len)
            module = _module(cut)
            with precision(dtype):
                shapes = flax_shapes(cut).values()
                leaves = {".".join(path): jax.ShapeDtypeStruct(s, dtype, sharding=on_place) for path, s in shapes}
                params = flax_format.nested(leaves)
                for inputs in distinct_padded(cut, batches):  # as a built model pads them
                    arrays = [None if a is None else jax.device_put(a, place) for a in inputs]
                    apply[target.kind].lower(module, True, params, *arrays).compile()


def xla_threads() -> int:
    """The threads XLA computes on here: one per core this process may run on. Framework difference: XLA's
    CPU client sizes its pool from the CPU affinity when it starts (``taskset``) and nothing changes it
    after; torch and MXNet take a thread count (``torch.set_num_threads``, ``OMP_NUM_THREADS``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def gemm(dtype: str, m: int, k: int, n: int) -> Callable[[], object]:
    """One (m, k) x (k, n) product as a Dense layer computes it (kernel (in, out)), compiled, for ``bench``'s peak."""
    with precision(dtype):
        a, kernel = jax.numpy.ones((m, k), dtype), jax.numpy.ones((k, n), dtype)
    product = jax.jit(jax.numpy.matmul)

    def run() -> object:
        with precision(dtype):
            return product(a, kernel).block_until_ready()

    return run


def synchronize() -> None:
    """Wait for queued work. Framework difference: JAX returns from a call once it is dispatched, and a
    result is computed when it is read; a training step's update is read only by the next step."""
    for array in jax.live_arrays():
        array.block_until_ready()


def _to_numpy(array: Any) -> np.ndarray | None:
    return None if array is None else np.asarray(array)


# Framework difference: Flax's own file (MessagePack) is read and written by bert_multi, byte for byte as Flax does.
save_checkpoint = flax_format.save_checkpoint
read_checkpoint = flax_format.read_checkpoint


def load_checkpoint(path: str | os.PathLike, config: BERTConfig | None = None, **statements: Any) -> Checkpoint:
    """A Flax parameter file (``.msgpack``, ``flax.serialization.to_bytes`` of the tree) as a ``Checkpoint``,
    as ``bert_multi.load_checkpoint`` reads any file (what it cannot reveal stated; a ``WeightsError`` else)."""
    return checkpoints.load_checkpoint(path, config, framework=NAME, **statements)


def refuse_mixed_precision_on_cpu(mixed_precision: str | None, device: Device) -> None:
    if mixed_precision is not None and device.kind == "cpu":
        # Measured: XLA's CPU backend takes BF16_BF16_F32 and computes the products in float32.
        raise CannotRunHere(f"JAX computes {mixed_precision} products on a GPU only: XLA's CPU backend keeps float32")


def build(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    device: str = "cpu",
    dtype: object = "float32",
    tf32: bool = False,
    gradients: bool = True,
    share: bool = False,
    mixed_precision: str | None = None,
    optimize: bool = False,
    attention: str = "d2l",
) -> JaxBERT:
    """A Flax d2l ``BERTModel`` holding exactly ``weights``, computing in ``dtype`` on ``device``. float32
    products are full float32 unless ``tf32`` (a GPU's, JAX's default there) or ``mixed_precision="bfloat16"``
    (bfloat16 products summed in float32, on a GPU). ``gradients`` changes nothing: gradients are taken by
    transforming a function. The forward is always compiled (``jax.jit``), quickly (``quick_options``)
    unless ``optimize``. ``attention="sdpa"``: through ``jax.nn.dot_product_attention`` (``ATTENTIONS``)."""
    check_attention(attention)
    dtype, arrays = stream_weights(config, weights, dtype)
    target = parse_device(device)
    place = to_framework_device(target)
    refuse_mixed_precision_on_cpu(mixed_precision, target)
    module = _module(config, attention)
    paths = flax_paths(config)
    leaves = {}
    with precision(dtype):
        for name, given, array in arrays:  # one at a time: a transposed kernel is a copy
            turned = paths[name][1]
            # JAX never writes a parameter in place, so any array may be shared; on the CPU device_put may
            # keep the NumPy memory itself, so an array the caller still owns is copied unless shared.
            if turned or not shareable(array, given, share, False):
                array = contiguous_transpose(array) if turned else array.copy()
            leaves[name] = jax.device_put(array, place)
    params = flax_format.nested({".".join(paths[name][0]): leaves[name] for name in paths})
    return JaxBERT(config, module, params, dtype, target, place, tf32, mixed_precision, optimize)
