"""The JAX/Flax backend behind the common interface: canonical weights in and out as a Flax parameter
tree, devices, dtypes without a process-wide switch, a compiled forward, and the named activations.

Parallel to ``bert_multi/torch/backend.py`` and ``bert_multi/mxnet/backend.py``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import flax
import jax
import numpy as np

from ..backend.contract import BackendModel, BERTOutput, Device, intermediate_names, parse_device, prepare_weights
from ..errors import CannotRunHere
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.schema import param_specs
from .model import BERTModel

NAME = "jax"


def kernel_eps(eps: float) -> float:
    """The LayerNorm epsilon the kernels really use when asked for ``eps``: Flax keeps it as a Python
    float and adds it in the computation's dtype, as torch does, so exactly ``eps`` in float64."""
    return eps


@contextlib.contextmanager
def precision(dtype: str) -> Iterator[None]:
    """float64 for the duration, on this thread only. Framework difference: JAX computes in 32 bits
    unless 64-bit mode is on, a process-wide switch by default (``jax_enable_x64``); ``jax.enable_x64``
    sets it for a block, so a float64 model leaves a user's float32 JAX code as it was."""
    # jax.enable_x64 is the context manager in JAX 0.10; earlier releases kept it in jax.experimental.
    switch = getattr(jax, "enable_x64", None)
    if switch is None:
        switch = jax.experimental.enable_x64
    with switch(dtype == "float64"):
        yield


def to_framework_device(device: Device) -> jax.Device:
    # Framework difference: JAX lists its devices by platform, "cpu" and "gpu" (CUDA or ROCm).
    if device.kind == "cpu":
        return jax.devices("cpu")[0]
    try:
        gpus = jax.devices("gpu")
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


# Canonical name -> the Flax parameter path: "blks.0" is blks_0, a Sequential's "mlp.2" is mlp_2, the
# pooler's "hidden.0" is hidden; a dense weight is the kernel, transposed, a LayerNorm's weight its
# scale, an embedding's weight its embedding table.
PATH_RULES: list[tuple[str, str]] = [(r"\.(blks|mlp)\.(\d+)\.", r".\1_\2."), (r"^hidden\.0\.", "hidden.")]
LEAF = {"dense_weight": "kernel", "ln_gamma": "scale", "embedding": "embedding", "tied_embedding": "embedding"}


def flax_paths(config: BERTConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Canonical name -> (its path in the Flax parameter tree, whether it is stored transposed)."""
    paths: dict[str, tuple[tuple[str, ...], bool]] = {}
    for name, spec in param_specs(config).items():
        own = name
        for pattern, replacement in PATH_RULES:
            own = re.sub(pattern, replacement, own)
        parts = own.split(".")
        if name == "encoder.pos_embedding":
            paths[name] = (("encoder", "pos_embedding"), False)
            continue
        leaf = LEAF.get(spec.role, parts[-1])
        paths[name] = ((*parts[:-1], leaf), spec.role == "dense_weight")
    return paths


def to_flax(config: BERTConfig, weights: dict[str, np.ndarray]) -> dict[str, Any]:
    """The canonical weights as a Flax parameter tree (NumPy arrays, dense kernels transposed)."""
    tree: dict[str, Any] = {}
    for name, (path, transposed) in flax_paths(config).items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = np.ascontiguousarray(weights[name].T) if transposed else weights[name]
    return tree


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


@functools.partial(jax.jit, static_argnums=(0, 1))
def apply(module: BERTModel, record: bool, params: Any, *inputs: Any) -> Any:
    """The module's forward on ``params``, compiled once per module, input shapes and dtypes, and shared
    by every model of that module (a conformance run builds many). With ``record``, also Flax's
    ``intermediates`` collection. Framework difference: the parameters live outside the module and are
    passed to every call; jit traces the function on the first call of each shape, then runs it compiled."""
    if record:
        return module.apply({"params": params}, *inputs, mutable=["intermediates"])
    return module.apply({"params": params}, *inputs)


class JaxBERT(BackendModel):
    """A Flax ``BERTModel`` (``.module``) with its parameters (``.params``) on a device; the forward is
    compiled with ``jax.jit`` (once per input shape)."""

    backend = NAME

    def __init__(self, config: BERTConfig, module: BERTModel, params: Any, dtype: str, device: Device) -> None:
        super().__init__(config, dtype, device)
        self.module, self.params = module, params

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        with precision(self.dtype):
            arrays = [None if a is None else jax.device_put(a, to_framework_device(self.device)) for a in inputs]
            if intermediates:
                (encoded, mlm, nsp), state = apply(self.module, True, self.params, *arrays)
                found = _activations(state["intermediates"])
                record = OrderedDict((name, found.get(name)) for name in intermediate_names(self.config))
            else:
                encoded, mlm, nsp = apply(self.module, False, self.params, *arrays)
                record = None
            return BERTOutput(np.asarray(encoded), _to_numpy(mlm), _to_numpy(nsp), record)

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        weights = {}
        for name, (path, transposed) in flax_paths(self.config).items():
            node = self.params
            for part in path:
                node = node[part]
            array = np.asarray(node)
            weights[name] = np.ascontiguousarray(array.T) if transposed else np.array(array)
        return weights

    def framework_info(self) -> dict[str, object]:
        info: dict[str, object] = {"framework": f"jax {jax.__version__} (flax {flax.__version__})"}
        info["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "unset")
        if self.device.kind == "gpu":
            info["gpu"] = to_framework_device(self.device).device_kind
        return info


def _to_numpy(array: Any) -> np.ndarray | None:
    return None if array is None else np.asarray(array)


def build(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    device: str = "cpu",
    dtype: object = "float32",
    gradients: bool = True,
    share: bool = False,
) -> JaxBERT:
    """A Flax d2l ``BERTModel`` holding exactly ``weights``, computing in ``dtype`` on ``device``.
    ``gradients`` and ``share`` change nothing: JAX arrays are immutable copies, and gradients are taken
    by transforming a function, not kept on the parameters."""
    dtype, weights = prepare_weights(config, weights, dtype)
    target = parse_device(device)
    place = to_framework_device(target)
    module = BERTModel(*config.d2l_args(), semantics=config.semantics, heads=config.heads)
    with precision(dtype):
        params = jax.device_put(to_flax(config, weights), place)
    return JaxBERT(config, module, params, dtype, target)
