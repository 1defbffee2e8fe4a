"""The MXNet backend behind the common interface: canonical weights in and out, devices, dtypes, hooks.

Parallel to ``bert_multi/torch/backend.py``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import mxnet as mx
import numpy as np

from ..backend.contract import (
    BackendModel,
    BERTOutput,
    Device,
    Hook,
    framework_names,
    matmul_precision,
    parse_device,
    prepare_weights,
    recorded_activations,
    shareable,
    stream_weights,
)
from ..errors import CannotRunHere
from ..files import checkpoints
from ..files.checkpoints import Checkpoint
from ..files.formats import gluon
from ..safe_files import atomic_path
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from .model import BERTModel

NAME = "mxnet"

# (regex, replacement) rules from canonical names to Gluon's structural names (save_parameters keys).
# Framework difference: LayerNorm calls its parameters gamma/beta, and Gluon fuses activations into its
# Dense layers, so the heads' Sequentials are shorter (the table and why: bert_multi/files/formats/gluon.py,
# which reads Gluon's files without MXNet).
NAME_RULES = gluon.NAME_RULES


def kernel_eps(eps: float) -> float:
    """The LayerNorm epsilon the kernels really use when asked for ``eps``. Framework difference: MXNet
    passes operator parameters as C floats, so even a float64 LayerNorm uses float32(1e-5) =
    9.99999974737875e-06; torch uses 1e-5. The conformance engine compares this backend with the oracle
    run at this value (docs/tolerances.md; docs/framework-differences.md, "Hyper-parameters that become
    C floats")."""
    return float(np.float32(eps))


LAYER_NORM_EPS = kernel_eps(1e-5)  # d2l's


def to_framework_device(device: Device) -> mx.Context:
    # Framework difference: MXNet calls a GPU gpu(N) (a Context); torch calls it "cuda:N".
    if device.kind == "cpu":
        return mx.cpu()
    available = mx.context.num_gpus()
    if device.index >= available:
        raise CannotRunHere(
            f"device {device} asked for, but this MXNet ({mx.__version__}) sees {available} GPU(s); "
            "GPU runs need an mxnet-cu* build and a CUDA version it supports"
        )
    return mx.gpu(device.index)


def devices() -> list[str]:
    """The devices this MXNet can use here: the CPU and each GPU a CUDA build of it sees."""
    return ["cpu"] + [f"gpu:{index}" for index in range(mx.context.num_gpus())]


def _submodule(block: mx.gluon.Block, path: str) -> mx.gluon.Block:
    # Framework difference: Gluon has no get_submodule; attributes and Sequential indices lead there.
    for part in path.split("."):
        block = block[int(part)] if part.isdigit() else getattr(block, part)
    return block


def _parameters(block: mx.gluon.Block) -> dict[str, mx.gluon.Parameter]:
    # Gluon's structural names, as save_parameters writes them (collect_params() is keyed by prefixed
    # names such as bertmodel0_dense0_weight, which depend on how many blocks were made before).
    return block._collect_params_with_prefix()


def _to_numpy(array: mx.np.ndarray | None) -> np.ndarray | None:
    return None if array is None else array.asnumpy()


class _DLPackLender:
    """An MXNet array offered through the DLPack protocol, which NumPy's ``from_dlpack`` reads without a
    copy. Framework difference: torch's CPU tensors have ``.numpy()`` views; MXNet 1.9's ``asnumpy()``
    always copies, and its arrays predate the protocol's ``__dlpack__``, though they export DLPack."""

    def __init__(self, array: mx.np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, stream: object = None) -> object:
        return self.array.to_dlpack_for_read()  # waits for pending writes; the view keeps the memory alive

    def __dlpack_device__(self) -> tuple[int, int]:
        return 1, 0  # DLPack's kDLCPU: only CPU arrays are lent


class _Lent(mx.np.ndarray):
    """An array on NumPy's memory (DLPack, no copy) that a parameter initialised from it on the CPU keeps
    as its data: Gluon's initialisation copies its source to each context, and the array marked
    ``kept`` is its own first copy there. Every other copy (and every array derived from it) is a copy."""

    kept = False

    def copyto(self, other: Any) -> Any:
        if self.kept and isinstance(other, mx.Context) and other == self.ctx:
            self.kept = False
            return self
        return super().copyto(other)


class MXNetBERT(BackendModel):
    """A d2l ``BERTModel`` (``.module``) holding canonical weights, run outside ``autograd.record()``."""

    backend = NAME

    def __init__(self, config: BERTConfig, module: BERTModel, dtype: str, device: Device, context: mx.Context) -> None:
        super().__init__(config, dtype, device)
        self.module = module
        self.context = context

    def _to_array(self, array: np.ndarray | None, dtype: str | None = None) -> mx.np.ndarray | None:
        return None if array is None else mx.np.array(array, dtype=dtype or array.dtype, ctx=self.context)

    def _attach(self, path: str, hook: Hook) -> Callable[[], object]:
        # Framework difference: Gluon reaches a child by attributes and indices; a hook's handle is detached.
        return _submodule(self.module, path).register_forward_hook(hook).detach

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        tokens, segments, valid_lens, pred_positions = inputs
        with recorded_activations(self.config, intermediates, NAME_RULES, self._attach, _to_numpy) as record:
            # Framework difference: outside autograd.record() Gluon computes no gradients and its Dropout
            # is off; torch needs eval() and no_grad() for the same.
            # MXNet's sequence_mask wants the lengths in the data's float dtype (d2l passes float32).
            encoded, mlm, nsp = self.module(
                self._to_array(tokens),
                self._to_array(segments),
                self._to_array(valid_lens, self.dtype),
                self._to_array(pred_positions),
            )
        return BERTOutput(encoded.asnumpy(), _to_numpy(mlm), _to_numpy(nsp), record)

    def on_device(self, inputs: ModelInputs) -> Callable[[], object]:
        tokens, segments, valid_lens, pred_positions = inputs
        arrays = (self._to_array(tokens), self._to_array(segments), self._to_array(valid_lens, self.dtype),
                  self._to_array(pred_positions))  # fmt: skip

        def forward() -> object:
            outputs = self.module(*arrays)
            # Framework difference: MXNet's engine returns before the work is done.
            mx.nd.waitall()
            return outputs

        return forward

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        params = _parameters(self.module)
        arrays = {
            name: params[gluon_name].data(self.context)
            for name, gluon_name in framework_names(self.config, NAME_RULES).items()
        }
        if share and self.device.kind == "cpu":
            return {name: np.from_dlpack(_DLPackLender(array)) for name, array in arrays.items()}
        return {name: array.asnumpy() for name, array in arrays.items()}  # copies

    def framework_info(self) -> dict[str, object]:
        # MXNet offers no getter for its OpenMP thread count; bert_multi.mxnet sets it through
        # OMP_NUM_THREADS before MXNet starts, so the variable tells.
        info: dict[str, object] = {
            "framework": f"mxnet {mx.__version__}",
            "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or "unknown",
            **matmul_precision(self.dtype, self.device),
        }
        # Framework difference: no TF32 switch. MXNet 1.9.1 leaves cuBLAS in its default math mode (full
        # float32) unless this variable lets it round float32 products to float16 on a GPU's tensor cores.
        if self.device.kind == "gpu" and os.environ.get("MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION") == "1":
            info["matmul precision"] = "float16" if self.dtype == "float32" else self.dtype
        return info


def save_checkpoint(path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> None:
    """Write canonical weights as a d2l Gluon checkpoint: what ``Block.save_parameters`` writes."""
    _, weights = prepare_weights(config, weights)
    names = framework_names(config, NAME_RULES)
    with atomic_path(path) as tmp_path:
        # Framework difference: Gluon's parameter file is MXNet's own binary NDArray format (in NumPy
        # mode, npx.save); torch's is a zip of pickled structure plus raw tensor storage.
        mx.npx.save(
            str(tmp_path), {names[name]: mx.np.array(array, dtype=array.dtype) for name, array in weights.items()}
        )


# Framework difference: Gluon's files are parsed by bert_multi itself, without MXNet, whose own reader
# trusts every size in them; torch's reader is torch.load once the file's zip layout is checked.
read_checkpoint = gluon.read_checkpoint


def gemm(dtype: str, m: int, k: int, n: int) -> Callable[[], object]:
    """One (m, k) x (k, n) product as the dense layers compute it: ``fully_connected`` (oneDNN in the pip
    wheel, faster than its ``dot``), waited for, since MXNet returns before the work is done."""
    a, w = mx.np.ones((m, k), dtype=dtype), mx.np.ones((n, k), dtype=dtype)
    return lambda: mx.npx.fully_connected(a, w, num_hidden=n, no_bias=True).wait_to_read()


def synchronize() -> None:
    """Wait for queued work. Framework difference: MXNet's engine returns before the work is done
    (docs/framework-differences.md, "MXNet returns before the work is done"); torch's CPU operations
    return once done."""
    mx.npx.waitall()


def load_checkpoint(path: str | os.PathLike, config: BERTConfig | None = None, **statements: Any) -> Checkpoint:
    """A Gluon checkpoint of any d2l generation (``net.save_parameters(path)``, or a d2l pretrained-model
    directory of MXNet's), as a ``Checkpoint``: config, canonical weights, vocab.

    Without ``config`` the sizes come from the file, and what it cannot reveal is stated: ``num_heads``,
    and ``preset`` or ``d2l_version`` where the tensors fit more than one generation (see
    ``bert_multi.load_checkpoint``, which reads every format, for all the options). Any problem is a
    ``WeightsError`` that says what to do; another framework's file names the reader it needs.
    """
    # Framework difference: MXNet's own reader (npx.load) crashes the process on a header claiming
    # ndim = 0xFFFFFFFF, so bert_multi parses the format itself (bert_multi.files.formats.gluon); torch.load is
    # used once the file's zip layout is checked.
    return checkpoints.load_checkpoint(path, config, framework=NAME, **statements)


def build(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    device: str = "cpu",
    dtype: object = "float32",
    gradients: bool = True,
    share: bool = False,
    compile: bool = False,
) -> MXNetBERT:
    """A Gluon d2l ``BERTModel`` on ``device`` computing in ``dtype``, holding exactly ``weights``.

    The weights are cast to ``dtype`` before the parameters take them, so float64 weights are never
    rounded through float32. ``compile`` hybridizes what Gluon can: its own layers (Dense, LayerNorm,
    Embedding, Dropout) are HybridBlocks; d2l's composite blocks read shapes in forward and stay
    imperative. ``gradients=False`` builds a model that is only run: its parameters' ``grad_req`` is
    'null', so Gluon allocates no gradient buffers (set it to 'write' to train). On the CPU a parameter
    is its array's memory, lent through DLPack, where the cast made the array or the caller ``share``s
    it (a read-only one only with ``gradients=False``), as in the torch backend; otherwise a copy.
    """
    dtype, arrays = stream_weights(config, weights, dtype)
    target = parse_device(device)
    context = to_framework_device(target)
    module = BERTModel(*config.d2l_args(), semantics=config.semantics, heads=config.heads)
    # Framework difference: Gluon parameters have no storage until they are initialised (torch's have it
    # as soon as they exist, so that backend skips their initialisers), and initialising one allocates
    # its gradient too unless grad_req is 'null' (torch allocates a gradient at the first backward).
    # Casting first only records the dtype; each parameter is then initialised from its weight, as
    # load_parameters does, so nothing is drawn, zeroed or cast only to be overwritten: the BERT-base
    # float64 build went from 9 s to 0.5 s.
    module.cast(dtype)
    params = _parameters(module)
    names = framework_names(config, NAME_RULES)
    if set(params) != set(names.values()):
        raise RuntimeError(f"Gluon parameters {sorted(set(params) ^ set(names.values()))} do not match NAME_RULES")
    for name, given, array in arrays:
        param = params[names[name]]
        if not gradients:
            param.grad_req = "null"
        # A view lent to MXNet without a copy (DLPack marks the view, not the array, read-only); the
        # parameter keeps it where it may, and otherwise copies it once, asynchronously.
        source = mx.nd.from_numpy(array.view(), array_cls=_Lent)
        source.kept = target.kind == "cpu" and shareable(array, given, share, gradients)
        param._load_init(source, context)
    for param in params.values():
        param.data(context).wait_to_read()  # the copies are done before the caller may change the weights
    if compile:
        with warnings.catch_warnings():
            # d2l's MaskLM uses nn.Sequential, not HybridSequential; Gluon suggests the swap, needlessly.
            warnings.filterwarnings("ignore", message="All children of this Sequential layer")
            module.hybridize()
    return MXNetBERT(config, module, dtype, target, context)
