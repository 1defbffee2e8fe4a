"""A user's own Flax BERT, wrapped for ``bert-multi verify`` (``bert_multi.verify.subject.Subject``):
its parameters under their own dotted paths, activations seen by Flax's method interception at its
modules, its gradients by ``jax.grad``.

Parallel to ``bert_multi/torch/user.py`` and ``bert_multi/mxnet/user.py``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import flax
import jax
import numpy as np
from flax import linen as nn

from ..backend.contract import parse_device
from ..errors import UsageError, UserCodeError
from ..files.formats.flax import nested
from ..spec.inputs import ModelInputs
from ..verify.subject import (
    Cotangents,
    Forced,
    Gradients,
    Outputs,
    Shape,
    Taps,
    call_user,
    in_call_order,
    outputs_of,
)
from .backend import precision, quick_options, to_framework_device

# The classes whose instances this framework wraps (most derived first wins across frameworks).
USER_MODELS = ("flax.linen.module.Module",)


def _to_numpy(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """A parameter tree as {dotted path: array}, in the tree's order."""
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = np.asarray(value)
    return flat


# The keywords a module's __call__ may take to switch its dropout off, and the values that do.
INFERENCE_FLAGS = {"deterministic": True, "train": False, "training": False, "is_training": False}


def inference_flags(module: nn.Module) -> dict[str, bool]:
    """The keywords that put the user's module in inference mode, those its ``__call__`` takes. Framework
    difference: a Flax module has no eval(); dropout is off when its call says so."""
    try:
        taken = inspect.signature(module.__call__).parameters
    except (TypeError, ValueError):
        return {}
    return {name: value for name, value in INFERENCE_FLAGS.items() if name in taken}


@jax.custom_vjp
def _with_gradient(x: jax.Array, gradient: jax.Array) -> jax.Array:
    """``x``, whose gradient is ``gradient`` whatever flows back into it."""
    return x


def _with_gradient_forward(x: jax.Array, gradient: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x, gradient


def _with_gradient_backward(gradient: jax.Array, _: jax.Array) -> tuple[jax.Array, jax.Array]:
    return gradient, jax.numpy.zeros_like(gradient)


_with_gradient.defvjp(_with_gradient_forward, _with_gradient_backward)


def _forced(x: jax.Array, value: jax.Array, gradient: jax.Array) -> jax.Array:
    """The oracle's ``value`` on ``x``'s gradient path, the oracle's ``gradient`` flowing into it."""
    return _with_gradient(value + (x - jax.lax.stop_gradient(x)), gradient)


@contextlib.contextmanager
def _explained() -> Iterator[None]:
    """A module that asks for a random key in its forward, as a line saying why and what to do."""
    try:
        yield
    except UserCodeError as error:
        if not isinstance(error.error, flax.errors.InvalidRngError):
            raise
        flags = " or ".join(f"{name}={value}" for name, value in INFERENCE_FLAGS.items())
        raise UsageError(
            "your Flax module draws random numbers in its forward (dropout left on?): verify computes in inference "
            f"mode, by passing {flags} where its __call__ takes one; give it such a keyword (docs/verify.md)"
        ) from None


class WrappedModel:
    """A user's linen ``Module`` with its parameters, called the d2l way (tokens, segments, valid_lens,
    pred_positions) -> (encoded, mlm, nsp), at one dtype on one device. Given as ``(module, variables)``
    (what ``init`` returns, or its ``params``), as a bound module (``module.bind(variables)``), or as a
    module alone, whose ``init`` on a small batch makes the parameters."""

    def __init__(self, model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> None:
        target = parse_device(device)
        self.place = to_framework_device(target)
        self.quick = quick_options(target.kind)  # a checked model: a few calls a shape, compiled quickly
        self.dtype = dtype
        self.framework = f"Flax {flax.__version__} (JAX {jax.__version__})"
        # Framework difference: the parameters live outside the module, so the user hands both over (a
        # bound module carries them); JAX arrays are immutable, so nothing of the user's is ever changed.
        if isinstance(model, tuple):
            module, variables = model
        elif model.scope is not None:
            module, variables = model.unbind()
        else:
            module, variables = model, None
        self.flags = inference_flags(module)
        if variables is None:
            # Compiled whole: run as it is, init compiles each operation at each shape it meets (over a
            # hundred compilations for d2l's BERT, most of a verify's time).
            init = jax.jit(functools.partial(module.init, **self.flags), compiler_options=self.quick)
            with precision(dtype), _explained():
                variables = call_user("your module's init", init, jax.random.key(0), *self._arrays(example))
        variables = flax.core.unfreeze(variables)
        self.module: nn.Module = module
        params = variables.get("params", variables)
        self.flat = {name: array.astype(dtype) for name, array in _flatten(params).items()}
        # Compiled once per set of taps (and, by jit, per input shape): a first call on a shape costs one
        # compilation instead of one per operation.
        self.forwards: dict[tuple, Any] = {}
        self.gradient = jax.jit(jax.grad(self._projected), compiler_options=self.quick)
        self.isolated: dict[tuple, Any] = {}  # isolated_vjp's gradient, compiled once per set of taps

    def _arrays(self, inputs: ModelInputs) -> list[jax.Array | None]:
        return [None if array is None else jax.device_put(array, self.place) for array in inputs]

    def _tree(self, flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return nested({name: jax.device_put(array, self.place) for name, array in flat.items()})

    def parameters(self) -> list[tuple[str, Shape]]:
        return [(name, tuple(array.shape)) for name, array in self.flat.items()]

    def modules(self) -> set[str]:
        """Every module holding parameters, and the modules around them, as dotted paths."""
        return {".".join(name.split(".")[:depth]) for name in self.flat for depth in range(1, name.count(".") + 1)}

    def used_parameters(self, inputs: ModelInputs) -> list[str]:
        """Its parameters in the order a forward pass first calls the modules that hold them (Flax's method
        interception, while the forward is traced: no compiling needed)."""
        order: list[str] = []

        def seen(call: Any, args: tuple, kwargs: dict, context: Any) -> Any:
            order.append(".".join(context.module.path))
            return call(*args, **kwargs)

        self._traced(inputs, seen)
        return in_call_order(self.parameters(), order)

    def _traced(self, inputs: ModelInputs, interceptor: Any) -> None:
        """The forward traced, not run (nothing compiled), with every module method call intercepted."""

        def forward(params: Any, *arrays: Any) -> Any:
            with nn.intercept_methods(interceptor):
                return self.module.apply({"params": params}, *arrays, **self.flags)

        with precision(self.dtype), _explained():
            call_user("your model", jax.eval_shape, forward, self._tree(self.flat), *self._arrays(inputs))

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            if name in self.flat:
                self.flat[name] = np.asarray(array, dtype=self.dtype)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: array.copy() for name, array in self.flat.items()}

    def run(self, inputs: ModelInputs, taps: Taps) -> tuple[Outputs, dict[str, np.ndarray | None]]:
        key = tuple(sorted(taps.items()))
        if key not in self.forwards:
            self.forwards[key] = self._compiled_forward(taps)
        with precision(self.dtype), _explained():
            returned, record = call_user("your model", self.forwards[key], self._tree(self.flat), *self._arrays(inputs))
        return outputs_of(returned, _to_numpy), {name: _to_numpy(value) for name, value in record.items()}

    def _compiled_forward(self, taps: Taps) -> Any:
        """The user's forward, compiled, returning the tapped activations beside its outputs."""
        wanted: dict[str, list[tuple[str, str]]] = {}
        for activation, (path, side) in taps.items():
            wanted.setdefault(path, []).append((activation, side))

        def forward(params: Any, *arrays: Any) -> tuple[Any, dict[str, Any]]:
            record: dict[str, Any] = {}

            def keep(call: Any, args: tuple, kwargs: dict, context: Any) -> Any:
                # Framework difference: no hooks; Flax lets a function intercept every module method call
                # (here while jit traces, so what it keeps becomes an output of the compiled function).
                output = call(*args, **kwargs)
                if context.method_name == "__call__":
                    for activation, side in wanted.get(".".join(context.module.path), []):
                        record.setdefault(activation, args[0] if side == "input" else output)  # first call
                return output

            with nn.intercept_methods(keep):
                returned = self.module.apply({"params": params}, *arrays, **self.flags)
            return returned, record

        return jax.jit(forward, compiler_options=self.quick)

    def vjp(self, inputs: ModelInputs, cotangents: Cotangents) -> Gradients:
        """Each parameter's gradient of sum(cotangent * output), by ``jax.grad`` of that sum as a function
        of the parameters (a parameter the outputs do not depend on gets zeros, as in Gluon)."""
        with precision(self.dtype):
            grads = self.gradient(self._tree(self.flat), self._arrays(inputs), tuple(cotangents))
            return {name: np.asarray(array) for name, array in _flatten(grads).items()}

    def _projected(self, params: Any, arrays: list[Any], cotangents: tuple[Any, ...]) -> jax.Array:
        returned = self.module.apply({"params": params}, *arrays, **self.flags)
        pairs = [(o, c) for o, c in zip(returned, cotangents) if o is not None and c is not None]
        return sum((o * c.astype(o.dtype)).sum() for o, c in pairs)

    def isolated_vjp(
        self, inputs: ModelInputs, taps: Taps, forced: Forced, cotangents: Cotangents
    ) -> tuple[Gradients, dict[str, np.ndarray | None]]:
        """``vjp`` with each tapped activation made the oracle's (``forced``: its value, its gradient), and
        each activation as its module computed it (the outputs' heads included) from the oracle's."""
        key = tuple(sorted((activation, *place) for activation, place in taps.items() if activation in forced))
        if key not in self.isolated:
            self.isolated[key] = self._isolated_gradient(inputs, taps, forced)
        with precision(self.dtype), _explained():
            arrays = {name: tuple(jax.device_put(a, self.place) for a in pair) for name, pair in forced.items()}
            grads, (computed, mlm, nsp) = call_user(
                "your model", self.isolated[key], self._tree(self.flat), self._arrays(inputs), arrays, tuple(cotangents)
            )
        found = {name: _to_numpy(value) for name, value in {**computed, "mlm": mlm, "nsp": nsp}.items()}
        return {name: np.asarray(array) for name, array in _flatten(grads).items()}, found

    def _isolated_gradient(self, inputs: ModelInputs, taps: Taps, forced: Forced) -> Any:
        """``isolated_vjp``'s gradient, compiled: of the projected outputs, with the forced activations made
        the arrays it is given, by value and gradient."""
        places: dict[str, list[tuple[str, str]]] = {}
        readers = self._first_readers(inputs, taps)
        for activation, (path, side) in taps.items():
            if activation in forced:
                places.setdefault(readers.get(activation, path), []).append((activation, side))

        def projected(params: Any, arrays: list[Any], made: Any, cotangents: tuple[Any, ...]) -> Any:
            computed: dict[str, Any] = {}

            def force(call: Any, args: tuple, kwargs: dict, context: Any) -> Any:
                # Framework difference: no hooks; the interceptor swaps the arrays a module call takes or
                # gives, and a custom_vjp identity swaps the gradient flowing back.
                here = places.get(".".join(context.module.path), []) if context.method_name == "__call__" else []
                for activation, side in here:
                    value, gradient = made[activation]
                    if side == "input" and activation not in computed and args and args[0].shape == value.shape:
                        computed[activation] = args[0]
                        args = (_forced(args[0], value, gradient), *args[1:])
                output = call(*args, **kwargs)
                for activation, side in here:
                    value, gradient = made[activation]
                    tensor = output[0] if isinstance(output, (tuple, list)) else output
                    if side == "output" and activation not in computed and tensor.shape == value.shape:
                        computed[activation] = tensor
                        tensor = _forced(tensor, value, gradient)
                        output = (tensor, *output[1:]) if isinstance(output, (tuple, list)) else tensor
                return output

            with nn.intercept_methods(force):
                returned = self.module.apply({"params": params}, *arrays, **self.flags)
            pairs = [(o, c) for o, c in zip(returned, cotangents) if o is not None and c is not None]
            return sum((o * c.astype(o.dtype)).sum() for o, c in pairs), (computed, returned[1], returned[2])

        return jax.jit(jax.grad(projected, has_aux=True), compiler_options=self.quick)

    def _first_readers(self, inputs: ModelInputs, taps: Taps) -> dict[str, str]:
        """For each activation tapped at a module's input, the module whose call first takes that very
        array (the block around the layer, say): forced there, every reader inside sees the oracle's."""
        wanted = {path: activation for activation, (path, side) in taps.items() if side == "input"}
        calls: list[tuple[str, Any]] = []
        readers: dict[str, str] = {}

        def seen(call: Any, args: tuple, kwargs: dict, context: Any) -> Any:
            if context.method_name == "__call__" and args:
                path = ".".join(context.module.path)
                calls.append((path, args[0]))
                activation = wanted.get(path)
                if activation is not None and activation not in readers:
                    readers[activation] = next(p for p, array in calls if array is args[0])
            return call(*args, **kwargs)

        self._traced(inputs, seen)
        return readers


def wrap_user_model(model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> WrappedModel:
    """``model`` (a linen ``Module`` with its variables, or bound to them) wrapped for verify at ``dtype``
    on ``device``; ``example`` inputs make the parameters of a module given alone."""
    return WrappedModel(model, dtype, device, example, copied)
