"""A user's own Flax BERT, linen or NNX, wrapped for ``bert-multi verify`` (``bert_multi.verify.subject.Subject``):
its parameters under their own dotted paths, activations seen at its modules by intercepting their calls
(linen's method interception; for NNX, its classes' ``__call__`` while a forward is traced), its
gradients by ``jax.grad``.

Parallel to ``bert_multi/torch/user.py`` and ``bert_multi/mxnet/user.py``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import flax
import jax
import numpy as np
from flax import linen as nn
from flax import nnx

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
USER_MODELS = ("flax.linen.module.Module", "flax.nnx.module.Module")


def _to_numpy(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value)


def _flatten(tree: Mapping[Any, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """A parameter tree as {dotted path: array}, in the tree's order (an NNX list's items by index)."""
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
        self.flat = {name: array.astype(dtype) for name, array in _flatten(self._parameters_of(model, example)).items()}
        # Compiled once per set of taps (and, by jit, per input shape): a first call on a shape costs one
        # compilation instead of one per operation.
        self.forwards: dict[tuple, Any] = {}
        self.gradient = jax.jit(jax.grad(self._projected), compiler_options=self.quick)
        self.isolated: dict[tuple, Any] = {}  # isolated_vjp's gradient, compiled once per set of taps

    def _parameters_of(self, model: Any, example: ModelInputs) -> Mapping[str, Any]:
        """The parameter tree of the model given, the module kept (and the flags that put it in inference)."""
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
            with precision(self.dtype), _explained():
                variables = call_user("your module's init", init, jax.random.key(0), *self._arrays(example))
        variables = flax.core.unfreeze(variables)
        self.module: Any = module
        return variables.get("params", variables)

    def _call(self, params: Any, arrays: list[Any], interceptor: Callable | None = None) -> Any:
        """The user's forward on ``params``, every module call passed through ``interceptor`` where one is
        given (as ``nn.intercept_methods`` passes it: the call, its arguments, a context naming the module)."""
        with nn.intercept_methods(interceptor) if interceptor else contextlib.nullcontext():
            return self.module.apply({"params": params}, *arrays, **self.flags)

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
            return self._call(params, list(arrays), interceptor)

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

            return self._call(params, list(arrays), keep), record

        return jax.jit(forward, compiler_options=self.quick)

    def vjp(self, inputs: ModelInputs, cotangents: Cotangents) -> Gradients:
        """Each parameter's gradient of sum(cotangent * output), by ``jax.grad`` of that sum as a function
        of the parameters (a parameter the outputs do not depend on gets zeros, as in Gluon)."""
        with precision(self.dtype):
            grads = self.gradient(self._tree(self.flat), self._arrays(inputs), tuple(cotangents))
            return {name: np.asarray(array) for name, array in _flatten(grads).items()}

    def _projected(self, params: Any, arrays: list[Any], cotangents: tuple[Any, ...]) -> jax.Array:
        returned = self._call(params, arrays)
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

            returned = self._call(params, arrays, force)
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


class NnxModel(WrappedModel):
    """A user's NNX ``Module``, which holds its own parameters (``nnx.Param``): run as a function of them, on
    a copy put in inference mode by its ``eval()``, so nothing of the user's is changed."""

    def _parameters_of(self, model: Any, example: ModelInputs) -> Mapping[Any, Any]:
        # Framework difference: an NNX module is an object with its weights, as a torch module is; jit and
        # grad take it apart into its structure and its state, and it is merged again in each trace.
        running = nnx.merge(*nnx.split(model))
        running.eval()
        for _, module in nnx.iter_modules(running):
            _cast(module, self.dtype)
        self.module, self.flags = model, inference_flags(running)
        self.graphdef, self.template, self.rest = nnx.split(running, nnx.Param, ...)
        return nnx.to_pure_dict(self.template)

    def _call(self, params: Any, arrays: list[Any], interceptor: Callable | None = None) -> Any:
        state = jax.tree.map(lambda leaf: leaf, self.template)  # filled afresh in each trace
        # The tree of dotted names (``nested``) has "0" where an NNX list has 0: NNX takes either.
        nnx.replace_by_pure_dict(state, params)
        model = nnx.merge(self.graphdef, state, self.rest)
        with _intercepting(model, interceptor):
            return model(*arrays, **self.flags)


def _cast(module: Any, dtype: str) -> None:
    """A module's own computing dtypes made ``dtype``. Framework difference: an NNX layer keeps the dtype it
    computes in as an attribute (``nnx.Embed`` takes its parameters' when made), where linen's follows
    the parameters it is given and torch's ``.to`` casts both."""
    for attribute in ("dtype", "param_dtype"):
        try:
            floating = np.issubdtype(np.dtype(getattr(module, attribute, None)), np.floating)
        except TypeError:  # None (follow the inputs), or not a dtype at all
            continue
        if floating:
            setattr(module, attribute, np.dtype(dtype))


@contextlib.contextmanager
def _intercepting(model: Any, interceptor: Callable | None) -> Iterator[None]:
    """Every call of an NNX ``model``'s modules passed to ``interceptor``, as linen's interception passes it.
    Framework difference: NNX has no interception; while the forward is traced, each module class's
    ``__call__`` is one that reports the call, and it is put back after."""
    if interceptor is None:
        yield
        return
    modules = list(nnx.iter_modules(model))
    paths = {id(module): tuple(map(str, path)) for path, module in modules}
    own = {type(module): type(module).__dict__.get("__call__") for _, module in modules}
    for cls in own:
        cls.__call__ = _reporting(cls.__call__, paths, interceptor)
    try:
        yield
    finally:
        for cls, call in own.items():
            if call is None:
                del cls.__call__
            else:
                cls.__call__ = call


def _reporting(call: Callable, paths: Mapping[int, tuple[str, ...]], interceptor: Callable) -> Callable:
    def reported(self: Any, *args: Any, **kwargs: Any) -> Any:
        if type(self).__call__ is not reported or id(self) not in paths:  # a superclass's __call__ inside it
            return call(self, *args, **kwargs)
        context = SimpleNamespace(module=SimpleNamespace(path=paths[id(self)]), method_name="__call__")
        return interceptor(functools.partial(call, self), args, kwargs, context)

    return reported


def wrap_user_model(model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> WrappedModel:
    """``model`` (a linen ``Module`` with its variables, or bound to them; or an NNX ``Module``) wrapped for
    verify at ``dtype`` on ``device``; ``example`` inputs make the parameters of a linen module given alone."""
    wrapper = NnxModel if isinstance(model, nnx.Module) else WrappedModel
    return wrapper(model, dtype, device, example, copied)
