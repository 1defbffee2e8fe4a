"""A user's own Gluon BERT, wrapped for ``bert-multi verify`` (``bert_multi.verify.subject.Subject``):
its parameters under their structural names, hooks at its blocks, its gradients by autograd.

Parallel to ``bert_multi/torch/user.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..backend.contract import parse_device
from ..spec.inputs import ModelInputs
from ..verify.subject import Cotangents, Outputs, Shape, Taps, call_user, in_call_order, outputs_of
from .backend import _parameters, _submodule, to_framework_device

# The classes whose instances this framework wraps (most derived first wins across frameworks).
USER_MODELS = ("mxnet.gluon.block.Block",)


def _to_numpy(value: Any) -> np.ndarray | None:
    value = value[0] if isinstance(value, (tuple, list)) else value
    return value.asnumpy() if hasattr(value, "asnumpy") else None


def _array_maker() -> Any:
    # Framework difference: Gluon code runs on mx.np arrays in NumPy mode (d2l's npx.set_np()), on
    # legacy mx.nd arrays otherwise; the user's model decides which, so its inputs follow.
    return mx.np.array if mx.util.is_np_array() else mx.nd.array


class WrappedModel:
    """A user's Gluon ``Block``, called the d2l way (tokens, segments, valid_lens, pred_positions) ->
    (encoded, mlm, nsp), at one dtype on one device."""

    def __init__(self, module: gluon.Block, dtype: str, device: str, example: ModelInputs, copied: bool) -> None:
        self.context = to_framework_device(parse_device(device))
        self.dtype = dtype
        # Framework difference: cast() changes a Gluon block in place, as torch's .to() does, so a model
        # the user handed over is copied first; Gluon parameters may also still be uninitialised (d2l
        # initialises in its training function), and their shapes deferred to the first forward.
        self.module = copy.deepcopy(module) if copied else module
        params = _parameters(self.module)
        self.dtype = next((p.dtype for p in params.values()), "float32")  # its own, until it is cast
        if any(p._data is None for p in params.values()):
            self.module.initialize(ctx=self.context)  # in its own dtype: Gluon's initialisers draw float32
            if any(d <= 0 for p in params.values() for d in p.shape):  # unknown: 0, or -1 in NumPy mode
                call_user("your model's first forward (creating its deferred parameters)", self._call, example)
        self.module.collect_params().reset_ctx(self.context)
        self.module.cast(dtype)
        self.dtype = dtype
        self.framework = f"MXNet {mx.__version__}"

    def _arrays(self, inputs: ModelInputs) -> list[Any]:
        # d2l's Gluon code passes valid_lens in the data's float dtype (sequence_mask wants it so).
        maker = _array_maker()
        dtypes = [None, None, self.dtype, None]
        return [
            None if array is None else maker(array, dtype=dtype or array.dtype, ctx=self.context)
            for array, dtype in zip(inputs, dtypes)
        ]

    def _call(self, inputs: ModelInputs) -> Any:
        return self.module(*self._arrays(inputs))

    def parameters(self) -> list[tuple[str, Shape]]:
        return [(name, tuple(p.shape)) for name, p in _parameters(self.module).items()]

    def modules(self) -> set[str]:
        found = {""}
        stack: list[tuple[str, gluon.Block]] = [("", self.module)]
        while stack:  # Framework difference: Gluon has no named_modules; its children are _children
            path, block = stack.pop()
            for name, child in block._children.items():
                child = child() if callable(child) and not isinstance(child, gluon.Block) else child  # a weakref
                found.add(f"{path}{name}")
                stack.append((f"{path}{name}.", child))
        return found

    def used_parameters(self, inputs: ModelInputs) -> list[str]:
        """Its parameters in the order a forward pass first calls the blocks that hold them (a pre-hook on
        each block)."""
        order: list[str] = []
        blocks = {path: _submodule(self.module, path) if path else self.module for path in self.modules()}
        removers = [
            block.register_forward_pre_hook(lambda block, args, path=path: order.append(path))
            for path, block in blocks.items()
        ]
        try:
            self.run(inputs, {})
        finally:
            for remover in removers:
                remover.detach()
        return in_call_order(self.parameters(), order)

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        maker = _array_maker()
        for name, parameter in _parameters(self.module).items():
            if name in arrays:
                parameter.set_data(maker(arrays[name], dtype=self.dtype, ctx=self.context))

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: p.data(self.context).asnumpy() for name, p in _parameters(self.module).items()}

    def _hooks(self, taps: Taps, record: dict[str, np.ndarray | None]) -> list[Callable[[], object]]:
        removers: list[Callable[[], object]] = []
        for activation, (path, side) in taps.items():

            def keep(block: Any, args: Any, output: Any, activation: str = activation, side: str = side) -> None:
                if record.get(activation) is None:  # a block called twice is recorded at its first call
                    record[activation] = _to_numpy(args if side == "input" else output)

            removers.append(_submodule(self.module, path).register_forward_hook(keep).detach)
        return removers

    def run(self, inputs: ModelInputs, taps: Taps) -> tuple[Outputs, dict[str, np.ndarray | None]]:
        record: dict[str, np.ndarray | None] = {}
        removers = self._hooks(taps, record)
        try:
            # Framework difference: outside autograd.record() Gluon computes no gradients and its Dropout
            # is off; torch needs eval() and no_grad() for the same.
            returned = self._call(inputs)
        finally:
            for remove in removers:
                remove()
        return outputs_of(returned, _to_numpy), record

    def vjp(self, inputs: ModelInputs, cotangents: Cotangents) -> dict[str, np.ndarray | None]:
        """Each parameter's gradient of sum(cotangent * output); None for a parameter whose grad_req is
        'null'. Framework difference: a parameter the graph never reaches keeps a zero gradient in
        Gluon, where torch gives None."""
        params = _parameters(self.module)
        for parameter in params.values():
            if parameter.grad_req != "null":
                parameter.grad(self.context)[:] = 0  # zero_grad() takes only legacy arrays in NumPy mode
        maker = _array_maker()
        with autograd.record(train_mode=False):  # dropout off: the function the forward check compared
            returned = self._call(inputs)
        pairs = [
            (output, maker(cotangent, dtype=self.dtype, ctx=self.context))
            for output, cotangent in zip(returned, cotangents)
            if output is not None and cotangent is not None
        ]
        autograd.backward([o for o, _ in pairs], head_grads=[c for _, c in pairs])
        return {name: None if p.grad_req == "null" else p.grad(self.context).asnumpy() for name, p in params.items()}

    def batch_loss(self, function: Callable[..., Any], batch: Mapping[str, np.ndarray], vocab_size: int) -> Any:
        """The user's ``_get_batch_loss_bert`` on ``batch``, with the loss object d2l passes. Framework
        difference: d2l's Gluon version takes lists of shards (one per GPU) and returns lists; it gets one
        shard each here, and its first results are taken."""
        maker = _array_maker()
        floats = {"valid_lens": self.dtype, "mlm_weights": self.dtype}
        shards = {name: [maker(a, dtype=floats.get(name, a.dtype), ctx=self.context)] for name, a in batch.items()}
        returned = function(
            self.module, gluon.loss.SoftmaxCELoss(), vocab_size, shards["tokens"], shards["segments"],
            shards["valid_lens"], shards["pred_positions"], shards["mlm_weights"], shards["mlm_labels"],
            shards["nsp_labels"],
        )  # fmt: skip
        return [float(np.asarray(_to_numpy(value)).reshape(-1)[0]) for value in returned]


def wrap_user_model(model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> WrappedModel:
    """``model`` (a Gluon ``Block``) wrapped for verify at ``dtype`` on ``device``; ``example`` inputs
    finish deferred initialisation; ``copied``: the caller's own object, so work on a copy."""
    return WrappedModel(model, dtype, device, example, copied)
