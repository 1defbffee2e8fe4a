"""A user's own PyTorch BERT, wrapped for ``bert-multi verify`` (``bert_multi.verify.subject.Subject``):
its parameters under their own names, hooks at its modules, its gradients by autograd.

Parallel to ``bert_multi/mxnet/user.py``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..backend.contract import parse_device
from ..spec.inputs import ModelInputs
from ..verify.subject import Cotangents, Forced, Gradients, Outputs, Shape, Taps, call_user, outputs_of
from .backend import TORCH_DTYPES, tf32_enabled, to_framework_device

# The classes whose instances this framework wraps (most derived first wins across frameworks).
USER_MODELS = ("torch.nn.modules.module.Module",)

# PyTorch's own blocks as ports use them, under their own names (map-file rules: {i} a block, {p} weight or
# bias): the layers of an nn.TransformerEncoder, each an nn.TransformerEncoderLayer whose self_attn is an
# nn.MultiheadAttention, its query, key and value projections fused in in_proj_weight (or kept apart where
# their widths differ, the biases still fused).
_LAYER = {
    "encoder.blks.{i}.attention.W_o.{p}": "layers.{i}.self_attn.out_proj.{p}",
    "encoder.blks.{i}.addnorm1.ln.{p}": "layers.{i}.norm1.{p}",
    "encoder.blks.{i}.ffn.dense1.{p}": "layers.{i}.linear1.{p}",
    "encoder.blks.{i}.ffn.dense2.{p}": "layers.{i}.linear2.{p}",
    "encoder.blks.{i}.addnorm2.ln.{p}": "layers.{i}.norm2.{p}",
    **{
        f"encoder.blks.{{i}}.attention.W_{role}.bias": f"layers.{{i}}.self_attn.in_proj_bias[{k}/3]"
        for k, role in enumerate("qkv")
    },
}
NATIVE_NAMES = {
    "PyTorch's nn.TransformerEncoderLayer": {
        **_LAYER,
        **{
            f"encoder.blks.{{i}}.attention.W_{role}.weight": f"layers.{{i}}.self_attn.in_proj_weight[{k}/3]"
            for k, role in enumerate("qkv")
        },
    },  # fmt: skip
    "PyTorch's nn.TransformerEncoderLayer, projections apart": {
        **_LAYER,
        **{
            f"encoder.blks.{{i}}.attention.W_{role}.weight": f"layers.{{i}}.self_attn.{role}_proj_weight"
            for role in "qkv"
        },
    },
}
# Layers a PyTorch block uses without calling them: an nn.MultiheadAttention applies its out_proj's weight
# functionally, so what out_proj computes is the attention's own output (its first).
USED_UNCALLED = {nn.MultiheadAttention: "out_proj"}
# The blocks with a fast path in inference (fused kernels, and nested tensors for padded sequences), which
# runs none of their submodules, so that nothing in them could be observed.
FAST_PATH = (nn.TransformerEncoderLayer, nn.MultiheadAttention)


def _to_numpy(value: Any) -> np.ndarray | None:
    value = value[0] if isinstance(value, (tuple, list)) else value
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else None


class _Uses(TorchFunctionMode):
    """While active, the names of the parameters (by identity, from ``names``) that torch functions are
    given, in the order they are first given; and a parameter that is none of them (a layer made inside
    ``forward``) under a name of its own, "<module> (made in forward: k)", after the innermost of
    ``modules`` running (by identity), with its shape in ``made``. Torch function modes are per thread."""

    def __init__(self, names: dict[int, str], modules: dict[int, str]) -> None:
        super().__init__()
        self.names: dict[int, str] = names
        self.modules, self.running = modules, [""]
        self.order: list[str] = []
        self.made: dict[str, Shape] = {}
        self.kept: list[nn.Parameter] = []  # the parameters made in forward, alive while named by identity

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in _leaves((args, kwargs or {})):
            name = self.names.get(id(value))
            # Made, not yet used, while a layer made in forward initialises its weights in place (fill_ ...).
            if name is None and isinstance(value, nn.Parameter) and not getattr(func, "__name__", "").endswith("_"):
                name = f"{self.running[-1] or 'the model'} (made in forward: {len(self.made)})"
                self.names[id(value)], self.made[name] = name, tuple(value.shape)
                self.kept.append(value)
            if name is not None and name not in self.order:
                self.order.append(name)
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def watching_modules(self) -> Iterator[None]:
        """Which of ``modules`` runs, kept in ``running`` (a module made in forward is none of them)."""

        def enter(module: nn.Module, args: Any) -> None:
            self.running.append(self.modules.get(id(module), self.running[-1]))

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            self.running.pop()

        handles = [
            nn.modules.module.register_module_forward_pre_hook(enter),
            nn.modules.module.register_module_forward_hook(leave),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


class WrappedModel:
    """A user's ``nn.Module``, called the d2l way (tokens, segments, valid_lens, pred_positions) ->
    (encoded, mlm, nsp), at one dtype on one device."""

    def __init__(self, module: nn.Module, dtype: str, device: str, example: ModelInputs, copied: bool) -> None:
        self.device = to_framework_device(parse_device(device))
        self.dtype = TORCH_DTYPES[dtype]
        # Framework difference: .to() changes a torch module in place, so a model the user handed over
        # is copied first; a factory's model is verify's own.
        self.module = (copy.deepcopy(module) if copied else module).to(self.device, self.dtype)
        self.framework = f"PyTorch {torch.__version__}"
        # torch's blocks' names place the weights where the model is built of those blocks.
        native = any(isinstance(module, nn.TransformerEncoderLayer) for module in self.module.modules())
        self.native_names = NATIVE_NAMES if native else {}
        self.made_in_forward: dict[str, Shape] = {}  # weights its forward makes anew on every call (``_Uses``)
        self.pooled_at: str | None = None  # set by a wrapper whose class says where its pooler's output is
        # Framework difference: only PyTorch's embedding says which row is padding (``padding_idx``).
        self.padded_tables = {
            f"{path}.weight" if path else "weight"
            for path, module in self.module.named_modules()
            if isinstance(module, nn.Embedding) and module.padding_idx == 0
        }
        # A model with a fast path is observed with it off, and its outputs are also taken as it runs by
        # itself, with it on: observing never changes what is checked of it.
        self.fast_path = any(isinstance(m, FAST_PATH) for m in self.module.modules())
        if self.fast_path:
            self.framework += " (observed with its fast path off; outputs with it on, as it runs by itself)"
        if any(isinstance(p, nn.parameter.UninitializedParameter) for p in self.module.parameters()):
            # d2l 1.0's LazyLinear layers learn their input width on the first forward.
            with torch.no_grad():
                call_user("your model's first forward (creating its lazy parameters)", self._call, example)
            self.module.to(self.device, self.dtype)

    def _tensors(self, inputs: ModelInputs) -> list[torch.Tensor | None]:
        return [None if array is None else torch.from_numpy(array).to(self.device) for array in inputs]

    def _call(self, inputs: ModelInputs) -> Any:
        return self.module(*self._tensors(inputs))

    def parameters(self) -> list[tuple[str, Shape]]:
        return [(name, tuple(p.shape)) for name, p in self.module.named_parameters()]

    def modules(self) -> set[str]:
        return {name for name, _ in self.module.named_modules()}

    def used_parameters(self, inputs: ModelInputs) -> list[str]:
        """Its parameters in the order a forward pass first uses them, each seen wherever it is used (a
        parameter read by a parent, or a layer's weight used without calling the layer, included)."""
        uses = _Uses(
            {id(parameter): name for name, parameter in self.module.named_parameters()},
            {id(module): name for name, module in self.module.named_modules()},
        )
        with uses, uses.watching_modules():
            self.run(inputs, {})
        self.made_in_forward = uses.made
        return uses.order

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name, parameter in self.module.named_parameters():
                if name in arrays:
                    parameter.copy_(torch.from_numpy(np.asarray(arrays[name])))

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: p.detach().cpu().numpy().copy() for name, p in self.module.named_parameters()}

    def _called(self, path: str) -> nn.Module:
        """The module a tap at ``path`` hooks: the module itself, or the block that uses it without calling
        it (``USED_UNCALLED``: an nn.MultiheadAttention's out_proj), whose first output is what it computes."""
        parent, _, last = path.rpartition(".")
        holder = self.module.get_submodule(parent) if parent else self.module
        if any(isinstance(holder, kind) and last == used for kind, used in USED_UNCALLED.items()):
            return holder
        return self.module.get_submodule(path)

    def _hooks(self, taps: Taps, record: dict[str, np.ndarray | None]) -> list[Callable[[], object]]:
        removers: list[Callable[[], object]] = []
        for activation, (path, side) in taps.items():

            def keep(module: nn.Module, args: Any, output: Any, activation: str = activation, side: str = side) -> None:
                if record.get(activation) is None:  # a module called twice is recorded at its first call
                    record[activation] = _to_numpy(args if side == "input" else output)

            removers.append(self._called(path).register_forward_hook(keep).remove)
        return removers

    def run(self, inputs: ModelInputs, taps: Taps) -> tuple[Outputs, dict[str, np.ndarray | None]]:
        record: dict[str, np.ndarray | None] = {}
        was_training = self.module.training
        self.module.eval()
        removers = self._hooks(taps, record)
        try:
            with torch.no_grad(), tf32_enabled(False), _fast_path(not (taps and self.fast_path)):
                returned = self._call(inputs)
            for remove in removers:
                remove()
            removers = []
            if taps and self.fast_path:  # the outputs as the model computes them by itself
                with torch.no_grad(), tf32_enabled(False):
                    returned = self._call(inputs)
        finally:
            for remove in removers:
                remove()
            self.module.train(was_training)
        return outputs_of(returned, _to_numpy), record

    def vjp(self, inputs: ModelInputs, cotangents: Cotangents) -> Gradients:
        """Each parameter's gradient of sum(cotangent * output); None where autograd gives none (a
        parameter that does not require gradients, or one the graph never reaches, as through ``.data``)."""
        return self.isolated_vjp(inputs, {}, {}, cotangents)[0]

    def isolated_vjp(
        self, inputs: ModelInputs, taps: Taps, forced: Forced, cotangents: Cotangents
    ) -> tuple[Gradients, dict[str, np.ndarray | None]]:
        """``vjp`` with each tapped activation made the oracle's (``forced``: its value, its gradient), and
        each activation as its module computed it (the outputs' heads included) from the oracle's."""
        named = dict(self.module.named_parameters())
        trained = [name for name, p in named.items() if p.requires_grad]
        computed: dict[str, np.ndarray | None] = {}
        self.module.eval()  # dropout off: the gradient of the function the forward check compared
        removers = self._forcing(taps, forced, computed)
        try:
            with torch.enable_grad(), tf32_enabled(False):
                returned = self._call(inputs)
        finally:
            for remove in removers:
                remove()
        with torch.enable_grad(), tf32_enabled(False):
            pairs = [
                (output, torch.from_numpy(np.ascontiguousarray(cotangent)).to(self.device, self.dtype))
                for output, cotangent in zip(returned, cotangents)
                if output is not None and cotangent is not None
            ]
            grads = torch.autograd.grad(
                [o for o, _ in pairs], [named[n] for n in trained], [c for _, c in pairs], allow_unused=True
            )
        found = dict(zip(trained, grads))
        _, computed["mlm"], computed["nsp"] = outputs_of(returned, _to_numpy)
        return {name: _to_numpy(found.get(name)) for name in named}, computed

    def _forcing(
        self, taps: Taps, forced: Forced, computed: dict[str, np.ndarray | None]
    ) -> list[Callable[[], object]]:
        """Hooks making each tapped activation the oracle's at its module's first call, keeping what the
        module computed into ``computed``: an output takes the oracle's value, its gradient flowing into
        the module that made it replaced by the oracle's; an input (a tensor other modules read too) has
        its whole gradient replaced."""
        removers: list[Callable[[], object]] = []
        for activation, (path, side) in taps.items():
            if activation not in forced:
                continue
            value, gradient = (torch.from_numpy(np.ascontiguousarray(a)).to(self.device, self.dtype)
                               for a in forced[activation])  # fmt: skip

            def output_hook(module: nn.Module, args: Any, output: Any, activation: str = activation,
                            value: torch.Tensor = value, gradient: torch.Tensor = gradient) -> Any:  # fmt: skip
                tensor = output[0] if isinstance(output, (tuple, list)) else output
                if activation in computed or not isinstance(tensor, torch.Tensor) or tensor.shape != value.shape:
                    return None
                computed[activation] = _to_numpy(tensor)
                made = value + (tensor - tensor.detach())  # the oracle's value on the module's gradient path
                if made.requires_grad:
                    made.register_hook(lambda _: gradient)
                return made if not isinstance(output, (tuple, list)) else (made, *output[1:])

            def input_hook(module: nn.Module, args: Any, activation: str = activation,
                           value: torch.Tensor = value, gradient: torch.Tensor = gradient) -> None:  # fmt: skip
                tensor = args[0] if args else None
                if activation in computed or not isinstance(tensor, torch.Tensor) or tensor.shape != gradient.shape:
                    return
                computed[activation] = _to_numpy(tensor)
                if not tensor.is_leaf:  # every reader sees the oracle's value (a parameter is left as it is)
                    tensor.data.copy_(value)
                if tensor.requires_grad:
                    tensor.register_hook(lambda _: gradient)

            module = self._called(path)
            if side == "output":
                removers.append(module.register_forward_hook(output_hook).remove)
            else:
                removers.append(module.register_forward_pre_hook(input_hook).remove)
        return removers

    def batch_loss(self, function: Callable[..., Any], batch: Mapping[str, np.ndarray], vocab_size: int) -> Any:
        """The user's ``_get_batch_loss_bert(net, loss, vocab_size, tokens_X, segments_X, valid_lens_x,
        pred_positions_X, mlm_weights_X, mlm_Y, nsp_y)`` on ``batch``, with the loss object d2l passes."""
        # d2l's data loader gives valid_lens and mlm_weights as float32 tensors; the labels as int64.
        floats = {"valid_lens": torch.float32, "mlm_weights": self.dtype}
        tensors = {name: torch.from_numpy(np.asarray(a)).to(self.device, floats.get(name)) for name, a in batch.items()}
        self.module.eval()
        with torch.no_grad(), tf32_enabled(False):
            returned = function(
                self.module, nn.CrossEntropyLoss(), vocab_size, tensors["tokens"], tensors["segments"],
                tensors["valid_lens"], tensors["pred_positions"], tensors["mlm_weights"], tensors["mlm_labels"],
                tensors["nsp_labels"],
            )  # fmt: skip
        return [float(value) for value in returned]


@contextlib.contextmanager
def _fast_path(enabled: bool) -> Iterator[None]:
    """PyTorch's fast path of its transformer blocks on or off for the duration (``torch.backends.mha``),
    then as it was."""
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled and was)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(was)


def wrap_user_model(model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> WrappedModel:
    """``model`` (an ``nn.Module``) wrapped for verify at ``dtype`` on ``device``; ``example`` inputs
    create lazy parameters; ``copied``: the caller's own object, so work on a copy."""
    return WrappedModel(model, dtype, device, example, copied)
