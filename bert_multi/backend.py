"""The common interface every backend implements, and the registry that finds backends lazily.

A backend is a module with ``NAME`` and ``build(config, weights, device, dtype, gradients, share) -> BackendModel``
(``gradients=False``: the model is only run, so a framework need not keep gradient buffers; ``share=True``:
the model may keep the caller's arrays as its own storage instead of copying them, see ``shareable``).
``BackendModel.__call__`` runs the shared input checks before the backend's ``_forward`` sees anything,
so bad input fails the same way, with the same message, in every framework.
"""

from __future__ import annotations

import abc
import importlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

import numpy as np

from .config import BERTConfig
from .errors import BackendUnavailable
from .inputs import ModelInputs, check_inputs
from .schema import normalize_dtype, nsp_layers, param_shapes, validate_weights

# name -> (module, what to install when it is missing). The NumPy oracle needs nothing extra.
_BACKENDS: dict[str, tuple[str, str]] = {
    "numpy": ("bert_multi.oracle", "numpy"),
    "torch": ("bert_multi.torch", "pip install 'bert_multi[torch]' (torch==2.13.0 is the tested CPU build)"),
    "mxnet": ("bert_multi.mxnet", "pip install 'bert_multi[mxnet]' (mxnet==1.9.1, which needs numpy<1.24)"),
    "transformers": ("bert_multi.transformers_reference", "pip install 'bert_multi[torch,reference]' (transformers)"),
}
BACKEND_NAMES = tuple(_BACKENDS)
FRAMEWORKS = ("torch", "mxnet")  # the two implementations this project writes
REFERENCES = ("transformers",)  # independent implementations of the original BERT, to compare with


@dataclass(frozen=True)
class BERTOutput:
    """What a model returns, as NumPy arrays: d2l's (encoded_X, mlm_Y_hat, nsp_Y_hat) plus activations."""

    encoded: np.ndarray  # (B, T, H)
    mlm: np.ndarray | None  # (B, P, V), None without pred_positions
    nsp: np.ndarray | None  # (B, 2), None without an NSP head
    intermediates: OrderedDict[str, np.ndarray] | None = None  # see intermediate_names()


def intermediate_sources(config: BERTConfig) -> OrderedDict[str, tuple[str, str]]:
    """Each named activation, in computation order, with where a framework hook finds it.

    The value is (submodule path, "input" or "output"); the paths are the canonical (PyTorch) module
    names, which ``framework_module`` turns into a framework's own. ``embedding`` is the token + segment
    + positional sum (the first block's input); per block, ``attention`` is the multi-head attention
    output, ``addnorm1`` the first residual + LayerNorm, ``ffn`` the feed-forward output and ``output``
    the block's output; ``pooler`` is tanh(dense(<cls>)), the input of the NSP classifier, when the model
    has a pooler.
    """
    sources = OrderedDict(embedding=("encoder.blks.0", "input"))
    for i in range(config.num_blks):
        blk = f"encoder.blks.{i}"
        sources[f"blks.{i}.attention"] = (f"{blk}.attention", "output")
        sources[f"blks.{i}.addnorm1"] = (f"{blk}.addnorm1", "output")
        sources[f"blks.{i}.ffn"] = (f"{blk}.ffn", "output")
        sources[f"blks.{i}.output"] = (blk, "output")
    if "pooler" in config.heads:
        # d2l >= 0.12's pooler is BERTModel.hidden (its output is the tanh's); 0.11's is the first half of
        # the NSP head's MLP, so the classifier's input is the one place to find it.
        pooled = config.semantics.nsp_head == "pooler"
        sources["pooler"] = ("hidden", "output") if pooled else (nsp_layers(config)[1], "input")
    return sources


def intermediate_names(config: BERTConfig) -> list[str]:
    """Names of the activations ``model(..., intermediates=True)`` returns, in computation order."""
    return list(intermediate_sources(config))


class Device(NamedTuple):
    kind: str  # "cpu" or "gpu"
    index: int

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


def parse_device(device: str) -> Device:
    """'cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N' (CUDA and GPU are synonyms in every backend)."""
    match = re.fullmatch(r"(cpu|cuda|gpu)(?::(\d+))?", str(device).strip().lower())
    if not match or (match[1] == "cpu" and match[2] is not None):
        raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N'")
    if match[1] == "cpu":
        return Device("cpu", 0)
    return Device("gpu", int(match[2] or 0))


class BackendModel(abc.ABC):
    """A BERT model of one backend, called on NumPy arrays.

    Subclasses implement ``_forward`` on checked inputs and ``export_weights``; ``module`` is the
    framework's own model object (an ``nn.Module``, a Gluon ``Block``) for users' own code.
    """

    backend: str

    def __init__(self, config: BERTConfig, dtype: str, device: Device) -> None:
        self.config = config
        self.dtype = dtype
        self.device = device

    def __call__(
        self,
        tokens: object,
        segments: object,
        valid_lens: object = None,
        pred_positions: object = None,
        intermediates: bool = False,
    ) -> BERTOutput:
        inputs = check_inputs(self.config, tokens, segments, valid_lens, pred_positions)
        return self._forward(inputs, intermediates)

    @abc.abstractmethod
    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        """Inference (dropout off) on checked inputs."""

    @abc.abstractmethod
    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        """The model's weights as a canonical dict (schema names and order, NumPy arrays): copies, or with
        ``share`` read-only views of the model's own storage where the framework lends them (valid until
        the model changes), which cost no memory."""

    @abc.abstractmethod
    def framework_info(self) -> dict[str, object]:
        """The framework's version and the settings that move numbers or timings (threads, TF32)."""

    def runtime_info(self) -> dict[str, object]:
        """Everything a report needs to say how this model ran."""
        return {"backend": self.backend, "dtype": self.dtype, "device": str(self.device), **self.framework_info()}

    def __repr__(self) -> str:
        c = self.config
        return (
            f"<{self.backend} BERT {c.num_blks} blocks, {c.num_hiddens} hidden, {c.num_heads} heads, "
            f"vocab {c.vocab_size}; {self.dtype} on {self.device}>"
        )


def prepare_weights(
    config: BERTConfig, weights: dict[str, np.ndarray], dtype: object = None
) -> tuple[str, dict[str, np.ndarray]]:
    """Validate canonical weights and cast them, explicitly, to the dtype the model will compute in
    (``None``: keep theirs), as C-contiguous arrays in native byte order: any layout NumPy accepts
    (reversed strides, big-endian) then suits every framework."""
    own_dtype = validate_weights(config, weights)
    dtype = normalize_dtype(own_dtype if dtype is None else dtype)
    return dtype, {name: _plain(array, dtype) for name, array in weights.items()}


def shareable(array: np.ndarray, weights: dict[str, np.ndarray], name: str, share: bool, gradients: bool) -> bool:
    """Whether a model built with ``share`` may keep ``array`` (``weights[name]`` as ``prepare_weights``
    returned it) as its storage: always if the cast made it (nobody else holds it); the caller's own
    array only if the caller shares it, and a read-only one only for a model that is only run, since a
    framework's tensors cannot be read-only, and training would write to memory its owner protects."""
    return array is not weights[name] or (share and (array.flags.writeable or not gradients))


def read_only(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` that cannot be written through: what ``export_weights(share=True)`` lends."""
    view = array.view()
    view.flags.writeable = False
    return view


def _plain(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` as ``dtype`` in native byte order, C-contiguous with no negative stride (a reversed
    axis of length 1 is "contiguous" to NumPy but refused by torch); copied only if it is not already."""
    array = np.asarray(array, dtype=dtype)
    if array.flags.c_contiguous and min(array.strides, default=0) >= 0:
        return array
    return np.array(array, order="C")


def _rename(name: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        name = re.sub(pattern, replacement, name)
    return name


def framework_names(config: BERTConfig, rules: list[tuple[str, str]]) -> dict[str, str]:
    """Canonical name -> a framework's structural name, applying each (regex, replacement) rule in turn."""
    return {name: _rename(name, rules) for name in param_shapes(config)}


def framework_module(path: str, rules: list[tuple[str, str]]) -> str:
    """A canonical module path in a framework's names (the rules are written for parameter names)."""
    return _rename(f"{path}.weight", rules).rsplit(".", 1)[0]


def load_backend(name: str) -> ModuleType:
    """The backend module called ``name``; ``BackendUnavailable`` says what to install if it cannot load."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}: expected one of {list(_BACKENDS)}")
    module_name, install = _BACKENDS[name]
    try:
        return importlib.import_module(module_name)
    except BackendUnavailable:
        raise
    except ImportError as error:
        raise BackendUnavailable(f"backend {name!r} is unavailable ({error}); to install it: {install}") from error


class BackendStatus(NamedTuple):
    available: bool
    reason: str | None  # why it is unavailable, with what to install


def backends() -> dict[str, BackendStatus]:
    """Every known backend name, with whether it loads here and, if not, why."""
    status: dict[str, BackendStatus] = {}
    for name in _BACKENDS:
        try:
            load_backend(name)
            status[name] = BackendStatus(True, None)
        except BackendUnavailable as error:
            status[name] = BackendStatus(False, str(error))
    return status
