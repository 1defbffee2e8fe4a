"""The PyTorch backend behind the common interface: canonical weights in and out, devices, dtypes, hooks.

Parallel to ``bert_multi/mxnet/backend.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TypeGuard, overload

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..backend.contract import (
    BackendModel,
    BERTOutput,
    Device,
    Hook,
    check_attention,
    check_mixed_precision_option,
    framework_names,
    matmul_precision,
    parse_device,
    prepare_weights,
    read_only,
    recorded_activations,
    shareable,
    stream_weights,
)
from ..cache import cache_for, described
from ..errors import CannotRunHere, WeightsError
from ..files import checkpoints
from ..files.checkpoints import Checkpoint
from ..files.formats.base import state_dict_in
from ..files.formats.torch_legacy import check_legacy, is_legacy
from ..safe_files import ZIP_MAGIC, atomic_path, describe_format, file_size, open_regular, reason
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from .model import BERTModel

NAME = "torch"
# How a compiled forward is run: up to 64 graphs of it (torch's default, 8, counts every model of the
# class: shapes, dtypes, configs and the activations' hooks each make another), and with the hooks in its
# guards (torch skips them by default, and a graph compiled without hooks then runs where hooks were
# added, never calling them).
COMPILED_RUN = {"recompile_limit": 64, "skip_nnmodule_hook_guards": False}


def compiled_run(compiled: bool) -> contextlib.AbstractContextManager[object]:
    """``COMPILED_RUN`` for a compiled call; nothing for an eager one (importing torch._dynamo takes a
    second and 70 MB)."""
    return torch._dynamo.config.patch(COMPILED_RUN) if compiled else contextlib.nullcontext()


# (regex, replacement) rules from canonical names to this framework's structural names: none, since
# the canonical names are d2l's PyTorch state_dict keys.
NAME_RULES: list[tuple[str, str]] = []


def kernel_eps(eps: float) -> float:
    """The LayerNorm epsilon the kernels really use when asked for ``eps``: torch keeps it as a Python
    float (a double), so exactly ``eps``."""
    return eps


LAYER_NORM_EPS = kernel_eps(1e-5)  # d2l's

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
TORCH_MIXED_DTYPES = {"bfloat16": torch.bfloat16}


def to_framework_device(device: Device) -> torch.device:
    # Framework difference: torch calls a GPU "cuda:N"; MXNet calls it gpu(N).
    if device.kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise CannotRunHere(
            f"device cuda:{device.index} asked for, but this PyTorch ({torch.__version__}) sees no CUDA GPU"
        )
    if device.index >= torch.cuda.device_count():
        raise CannotRunHere(
            f"device cuda:{device.index} asked for, but only {torch.cuda.device_count()} CUDA GPU(s) are visible"
        )
    return torch.device("cuda", device.index)


def devices() -> list[str]:
    """The devices this PyTorch can use here: the CPU and each visible CUDA GPU."""
    return ["cpu"] + [f"cuda:{index}" for index in range(torch.cuda.device_count())]


@contextlib.contextmanager
def tf32_enabled(enabled: bool) -> Iterator[None]:
    """Set TF32 for matmuls and convolutions for the duration, then restore the caller's setting.

    TF32 rounds float32 matmul inputs to 10 mantissa bits on Ampere and later GPUs, moving outputs by
    about 1e-3; conformance runs switch it off.
    """
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def gpu_info(device: Device) -> dict[str, object]:
    """What a model's runtime info says of the GPU it runs on (nothing on the CPU)."""
    if device.kind != "gpu":
        return {}
    properties = torch.cuda.get_device_properties(device.index)
    memory = round(properties.total_memory / 2**30, 1)
    return {"gpu": properties.name, "gpu memory GiB": memory, "CUDA": torch.version.cuda}


@overload
def to_numpy(tensor: torch.Tensor) -> np.ndarray: ...
@overload
def to_numpy(tensor: None) -> None: ...
def to_numpy(tensor: torch.Tensor | None) -> np.ndarray | None:
    """A result as NumPy; one that autocast left in bfloat16 (which NumPy lacks) as float32, exactly."""
    if tensor is None:
        return None
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).cpu().numpy()


def autocast(device: torch.device, mixed_precision: str | None) -> contextlib.AbstractContextManager[object]:
    """The matrix products in ``mixed_precision`` for the duration (``torch.autocast``), or nothing."""
    if mixed_precision is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, TORCH_MIXED_DTYPES[mixed_precision])


def _kept(tensor: Any) -> Any:
    """A compiled graph's activation, kept as a tensor: NumPy conversion cannot be traced."""
    return tensor


class TorchBERT(BackendModel):
    """A d2l ``BERTModel`` (``.module``) holding canonical weights, run in eval mode without gradients."""

    backend = NAME

    def __init__(
        self,
        config: BERTConfig,
        module: BERTModel,
        dtype: str,
        device: Device,
        torch_device: torch.device,
        tf32: bool,
        compiled: Callable[..., Any] | None = None,
        mixed_precision: str | None = None,
        attention: str = "d2l",
    ) -> None:
        super().__init__(config, dtype, device)
        self.module = module
        self.torch_device = torch_device
        self.tf32 = tf32
        self.compiled = compiled  # torch.compile's module, sharing the parameters of ``module``
        self.mixed_precision = mixed_precision
        self.attention = attention

    def _to_tensor(self, array: np.ndarray | None) -> torch.Tensor | None:
        return None if array is None else torch.from_numpy(array).to(self.torch_device)

    def _attach(self, path: str, hook: Hook) -> Callable[[], object]:
        # Framework difference: torch finds a submodule by its dotted path; a hook's handle is removed.
        return self.module.get_submodule(path).register_forward_hook(hook).remove

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        was_training = self.module.training
        self.module.eval()
        run, keep = (self.module, to_numpy) if self.compiled is None else (self.compiled, _kept)
        try:
            with (
                recorded_activations(self.config, intermediates, NAME_RULES, self._attach, keep) as record,
                torch.no_grad(),
                tf32_enabled(self.tf32),
                autocast(self.torch_device, self.mixed_precision),
                compiled_run(self.compiled is not None),
            ):
                encoded, mlm, nsp = run(*(self._to_tensor(array) for array in inputs))
        finally:
            self.module.train(was_training)  # leave a module the user is training as it was
        if record is not None and self.compiled is not None:
            kept: dict[str, Any] = dict(record)  # tensors, as _kept left them
            record.update((name, to_numpy(tensor)) for name, tensor in kept.items())
        return BERTOutput(to_numpy(encoded), to_numpy(mlm), to_numpy(nsp), record)

    def on_device(self, inputs: ModelInputs) -> Callable[[], object]:
        tensors = [self._to_tensor(array) for array in inputs]
        run = self.module if self.compiled is None else self.compiled

        def forward() -> object:
            self.module.eval()
            with (
                torch.no_grad(),
                tf32_enabled(self.tf32),
                autocast(self.torch_device, self.mixed_precision),
                compiled_run(self.compiled is not None),
            ):
                outputs = run(*tensors)
            synchronize()
            return outputs

        return forward

    def at_precision(self, tf32: bool = False, mixed_precision: str | None = None) -> TorchBERT:
        # Framework difference: TF32 and autocast are switched around each call, so the module is shared.
        check_mixed_precision_option(mixed_precision, self.dtype)
        return TorchBERT(self.config, self.module, self.dtype, self.device, self.torch_device, tf32, self.compiled,
                         mixed_precision, self.attention)  # fmt: skip

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        state = self.module.state_dict()
        arrays = {
            name: state[torch_name].detach().cpu().numpy()  # a view on the CPU, a copy from a GPU
            for name, torch_name in framework_names(self.config, NAME_RULES).items()
        }
        return {name: read_only(array) if share else array.copy() for name, array in arrays.items()}

    def framework_info(self) -> dict[str, object]:
        info: dict[str, object] = {"framework": f"torch {torch.__version__}", "threads": torch.get_num_threads()}
        info["compiled"] = self.compiled is not None
        if self.compiled is not None:
            info["compilation cache"] = described(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        info.update(matmul_precision(self.dtype, self.device, self.tf32, self.mixed_precision))
        info["attention"] = self.attention
        return info | gpu_info(self.device)


def save_checkpoint(path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> None:
    """Write canonical weights as a d2l PyTorch checkpoint: a ``state_dict`` saved by ``torch.save``."""
    _, weights = prepare_weights(config, weights)
    names = framework_names(config, NAME_RULES)
    with atomic_path(path) as tmp_path:
        torch.save({names[name]: torch.from_numpy(array) for name, array in weights.items()}, tmp_path)


def _check_archive(file: BinaryIO, path: str | os.PathLike) -> None:
    """Refuse what ``torch.load`` would trust too far: sizes it allocates before reading, which are zip
    members' declared sizes in the format of PyTorch >= 1.6 and the storages' in the legacy one
    (``torch_legacy``), adding up to more than the file holds; a TorchScript archive, which torch's own
    refusal advises loading with weights_only=False; and any other format."""
    head = file.read(8)
    file.seek(0)
    if is_legacy(head):
        return check_legacy(file, path)
    if not head.startswith(ZIP_MAGIC):
        raise WeightsError(
            f"{path}: not a readable PyTorch state_dict checkpoint: it looks like {describe_format(head)}"
        )
    try:
        records = zipfile.ZipFile(file).infolist()
    except Exception as error:  # noqa: BLE001 - zipfile raises many types on hostile input
        raise WeightsError(f"{path}: not a readable PyTorch state_dict checkpoint: {reason(error)}") from None
    if any(info.filename.endswith("/constants.pkl") for info in records):  # a program's constants
        raise WeightsError(
            f"{path}: a TorchScript archive (torch.jit.save, or a traced or scripted module's save), not a "
            "state_dict: its weights are part of a program, which bert_multi never loads. Load it with "
            "torch.jit.load in code you trust, then save module.state_dict()"
        )
    declared = sum(info.file_size for info in records)
    if declared > file_size(file):
        raise WeightsError(
            f"{path}: not a readable PyTorch state_dict checkpoint: its records declare {declared} bytes, "
            f"more than the file's {file_size(file)}"
        )
    file.seek(0)


def _to_numpy_checked(path: str | os.PathLike, name: str, tensor: torch.Tensor) -> np.ndarray:
    """A checkpoint tensor's values as a NumPy array, or a ``WeightsError`` saying why it has none.
    bfloat16, which NumPy lacks, comes back as float32 (exactly: every bfloat16 is a float32)."""
    if tensor.is_quantized or tensor.layout != torch.strided or tensor.is_meta:
        kind = "quantized" if tensor.is_quantized else "on the meta device" if tensor.is_meta else str(tensor.layout)
        raise WeightsError(f"{path}: tensor {name!r} is {kind}; expected a dense tensor of values")
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    # detach: a saved nn.Parameter (named_parameters()) requires grad. A tensor that is all of its storage
    # lends that memory to NumPy; a view of part of one is copied, so as not to keep the rest alive.
    whole = tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    try:
        return tensor.detach().numpy() if whole else tensor.detach().numpy().copy()
    except TypeError as error:  # a dtype NumPy has no equivalent of (complex32, float8, ...)
        raise WeightsError(
            f"{path}: tensor {name!r} has dtype {tensor.dtype}, which NumPy cannot hold ({error})"
        ) from None


def _load_failure(error: Exception) -> str:
    """Why ``torch.load`` failed, in a line that says what to do. Its weights_only refusal runs to a
    page and advises ``weights_only=False``: the one thing never to do with a file of unknown origin."""
    text = str(error)
    if "Weights only load failed" not in text:
        return reason(error)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found and found[1].startswith("torch.nn.parameter.Uninitialized"):
        return (
            "it was saved before the model's first forward pass: d2l 1.0's lazy layers (nn.LazyLinear) had "
            "no shapes yet, so it holds no weights. Run one forward pass on a batch, then save "
            "net.state_dict() again"
        )
    if found:
        return (
            f"it is a pickled object ({found[1]}), not a state_dict of tensors: torch.save(net) stores "
            "classes by reference, and unpickling them would run code, which bert_multi never does. Load it "
            "with the code that saved it, then save net.state_dict() instead"
        )
    detail = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()[0]
    return f"its pickle asks for more than tensors and containers ({detail}); only those are ever unpickled"


def _is_state_dict(value: object) -> TypeGuard[dict[str, torch.Tensor]]:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def _state_dict_or_none(value: object) -> dict[str, torch.Tensor] | None:
    return value if _is_state_dict(value) else None


def read_checkpoint(
    path: str | os.PathLike, key: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """The named tensors of a PyTorch checkpoint as NumPy arrays under the file's own names, their own
    dtypes (bfloat16 arrives as float32), and notes on how they were found (``key``: the entry of a
    wrapper dict holding the state_dict). Gluon's counterpart is ``bert_multi.files.formats.gluon.read_params``,
    which needs no MXNet.

    Read with ``weights_only=True``: tensors and containers only, nothing else is unpickled. The
    archive's sizes are checked before torch reads it, and any failure is a ``WeightsError``.
    """
    with open_regular(path, "PyTorch checkpoint", WeightsError) as file:
        size = file_size(file)
        # Framework difference: torch's reader gets the file once its zip layout is checked; Gluon's
        # format is parsed by bert_multi itself, since MXNet's C++ reader trusts every size in it.
        _check_archive(file, path)
        try:
            loaded = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - a corrupt archive escapes torch.load as many types
            raise WeightsError(
                f"{path}: not a readable PyTorch state_dict checkpoint: {_load_failure(error)}"
            ) from None
    state, notes = state_dict_in(path, loaded, key, _state_dict_or_none)
    views = _distinct_views(path, state, size)
    copies: dict[tuple, np.ndarray] = {}  # a view saved under two names (tied weights) is read once
    arrays = {}
    for name, tensor in state.items():
        view = views[str(name)]
        if view not in copies:
            copies[view] = _to_numpy_checked(path, str(name), tensor)
        arrays[str(name)] = copies[view]
    dtypes = {str(name): str(tensor.dtype).removeprefix("torch.") for name, tensor in state.items()}
    return arrays, dtypes, notes


MATERIALISED_FACTOR = 2  # what the arrays may take, as a multiple of the file's size (bfloat16 doubles)
MATERIALISED_SLACK = 1 << 20  # and beyond it: a tiny file of many small tensors


def _distinct_views(path: str | os.PathLike, state: dict, size: int) -> dict[str, tuple]:
    """Each tensor's view of its storage, checked before anything is copied: no view larger than its
    storage (an expanded tensor, stride 0), and the distinct views together no larger than a stated
    multiple of the file (a storage shared by tied weights counts once; many overlapping views of one
    storage would multiply it)."""
    views: dict[str, tuple] = {}
    seen: set[tuple] = set()
    total = 0
    for name, tensor in state.items():
        if tensor.is_quantized or tensor.layout != torch.strided or tensor.is_meta:
            views[str(name)] = (id(tensor),)  # refused, saying why, when it is read
            continue
        nbytes = tensor.numel() * tensor.element_size()
        expanded = any(stride == 0 and length > 1 for stride, length in zip(tensor.stride(), tensor.shape))
        if expanded or nbytes > tensor.untyped_storage().nbytes():
            raise WeightsError(
                f"{path}: tensor {str(name)!r} of shape {tuple(tensor.shape)} is an expanded view of "
                f"{tensor.untyped_storage().nbytes()} stored bytes; expected a tensor of its own values"
            )
        storage = tensor.untyped_storage().data_ptr()
        view = (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if view not in seen:
            seen.add(view)
            total += nbytes * (2 if tensor.dtype == torch.bfloat16 else 1)
        views[str(name)] = view
    if total > MATERIALISED_FACTOR * size + MATERIALISED_SLACK:
        raise WeightsError(
            f"{path}: its tensors would take {total} bytes from a file of {size}: views that overlap or repeat "
            "one storage; expected each tensor's own values"
        )
    return views


def gemm(dtype: str, m: int, k: int, n: int) -> Callable[[], object]:
    """One (m, k) x (k, n) product as the dense layers compute it (``linear``), for ``bench``'s peak."""
    a, w = torch.ones(m, k, dtype=TORCH_DTYPES[dtype]), torch.ones(n, k, dtype=TORCH_DTYPES[dtype])
    return lambda: torch.nn.functional.linear(a, w)


def synchronize() -> None:
    """Wait for queued work: none on the CPU, where torch returns once an operation is done; CUDA
    kernels run after their launch returns."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def load_checkpoint(path: str | os.PathLike, config: BERTConfig | None = None, **statements: Any) -> Checkpoint:
    """A PyTorch checkpoint of any d2l generation (``torch.save(net.state_dict())``, or a d2l
    pretrained-model directory of PyTorch's), as a ``Checkpoint``: config, canonical weights, vocab.

    Without ``config`` the sizes come from the file, and what it cannot reveal is stated: ``num_heads``,
    and ``preset`` or ``d2l_version`` where the tensors fit more than one generation (see
    ``bert_multi.load_checkpoint``, which reads every format, for all the options). Any problem is a
    ``WeightsError`` that says what to do; another framework's file names the reader it needs.
    """
    return checkpoints.load_checkpoint(path, config, framework=NAME, **statements)


class SkipInitialisers(TorchFunctionMode):
    """While active, ``torch.nn.init``'s functions leave tensors as they are: modules get storage that is
    never drawn from a distribution, since the weights replace it. (Building on the meta device skips
    the numbers too, but the first meta ``normal_`` or ``randn`` imports torch._dynamo: 1.1 s.) Torch
    function modes are per thread, so other threads' modules initialise as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def build(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    device: str = "cpu",
    dtype: object = "float32",
    tf32: bool = False,
    gradients: bool = True,
    share: bool = False,
    compile: bool = False,
    mixed_precision: str | None = None,
    attention: str = "d2l",
) -> TorchBERT:
    """A PyTorch d2l ``BERTModel`` on ``device`` computing in ``dtype``, holding exactly ``weights``.

    The weights are cast to ``dtype`` before the module takes them, so float64 weights are never rounded
    through float32. ``tf32`` only matters on CUDA; it is off unless asked for. ``gradients=False``
    builds a model that is only run: its parameters do not require gradients. With ``share`` the
    parameters on the CPU are the caller's own arrays where no cast is needed, not copies (read-only
    ones only with ``gradients=False``); the caller then leaves them unchanged while the model lives,
    and training the model changes them. ``compile`` runs the forward through ``torch.compile``
    (TorchInductor; on the CPU it needs a C++ compiler), compiled on the first call of each new kind of
    input (shape, dtype, optional inputs present or not) and reused after; ``.module`` stays eager.
    ``mixed_precision="bfloat16"`` runs the forward, and training, under ``torch.autocast``: the
    products in bfloat16, the weights float32; the outputs come back float32. ``attention="sdpa"``
    computes the attention through ``scaled_dot_product_attention`` (``ATTENTIONS``).
    """
    check_attention(attention)
    dtype, arrays = stream_weights(config, weights, dtype)
    target = parse_device(device)
    torch_device = to_framework_device(target)
    # No time goes into torch's initialisers, and load_state_dict(assign=True) makes the weights the
    # parameters' storage instead of copying them in. An array stream_weights had to cast is already the
    # model's own; the caller's own arrays are copied, once, unless shared.
    with SkipInitialisers():
        module = BERTModel(*config.d2l_args(), semantics=config.semantics, heads=config.heads, attention=attention)
    names = framework_names(config, NAME_RULES)
    state = {}
    with warnings.catch_warnings():
        # A read-only array is shared only with a model that never writes it (shareable says when).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, given, array in arrays:
            if torch_device.type == "cpu" and not shareable(array, given, share, gradients):
                array = array.copy()  # moving to a GPU copies anyway
            state[names[name]] = torch.from_numpy(array).to(torch_device)
    module.load_state_dict(state, strict=True, assign=True)
    module.requires_grad_(gradients)
    # fullgraph: a graph break would run part of the model eagerly, and a forward past the recompile
    # limit all of it, both silently; with fullgraph either is an error.
    if compile and cache_for(NAME) is not None:  # Inductor's cache, in bert_multi's unless one is set
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_for(NAME)))
    compiled = torch.compile(module, fullgraph=True) if compile else None
    return TorchBERT(config, module, dtype, target, torch_device, tf32, compiled, mixed_precision, attention)
