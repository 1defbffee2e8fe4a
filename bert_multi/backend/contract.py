"""The backend contract, written once: what a backend provides and what its models return.

A backend is a module (or any object) with ``NAME`` and ``build``; ``Backend`` below states both and
every optional capability, and ``bert_multi.backend.loaded.LoadedBackend`` is the one place where each
capability is looked up, with its default. The project's own backends register in
``bert_multi.backend.registry``; other packages add theirs through the ``bert_multi.backends``
entry-point group.
``BackendModel.__call__`` runs the shared input checks before the backend's ``_forward`` sees anything,
so bad input fails the same way, with the same message, in every framework.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..errors import UsageError
from ..spec.config import ATTENTIONS, BERTConfig
from ..spec.inputs import ModelInputs, check_inputs
from ..spec.schema import normalize_dtype, nsp_layers, param_shapes, validate_weights
from ..spec.weight_file import save_weights


class Option(NamedTuple):
    """A standard option of ``build``: its default, whether a backend whose ``build`` does not take it may
    ignore it, and what it asks for."""

    default: object
    may_ignore: bool  # a permission ("need not", "may"); else a demand, which a backend without it refuses
    doc: str


# The standard options of every backend's build, named once. A backend takes those its build's signature
# names; one it does not take is dropped when it may be ignored or has its default, and otherwise
# refused with ``CannotRunHere`` (tf32=True on a backend with no TF32 switch).
BUILD_OPTIONS: dict[str, Option] = {
    "gradients": Option(True, True, "False: the model is only run, so the framework need keep no gradients"),
    "share": Option(
        False, True, "True: the model may keep the caller's arrays as its storage instead of copies (shareable)"
    ),
    "tf32": Option(False, False, "True: float32 matrix products on NVIDIA GPUs in TF32 (10 mantissa bits)"),
    "compile": Option(
        False, True, "True: run the forward through the framework's compiler where it has one and it is opt-in"
    ),
    "mixed_precision": Option(
        None, False, "'bfloat16': matrix products in bfloat16 with float32 weights and sums, in all the model computes"
    ),
    "optimize": Option(
        False, True, "True: the compiler takes its time to make fast code, for a model run many times (XLA's defaults)"
    ),
    "attention": Option(
        "d2l", False, "'sdpa': the same attention through the framework's fused kernel (spec.config.ATTENTIONS)"
    ),
}
# What is run for speed on a GPU (bench, pretrain) computes its attention through the framework's fused
# kernel where it has one: the same function, without the (B*heads, T, T) scores in memory.
FUSED_ON_GPU: dict[str, object] = {"attention": "sdpa"}
# The precisions mixed_precision may name: float32 weights, their products in this dtype.
MIXED_PRECISIONS = ("bfloat16",)

ROLES = {
    "oracle": "the float64 NumPy specification every other backend is held to",
    "framework": "an implementation of d2l's BERT in a framework: checked by default, trained, benchmarked",
    "reference": "an independent implementation of the original BERT, compared when asked (--reference)",
    "subject": "a user's own model under bert-multi verify, registered for that run only",
}


# What a run asks of a backend, for ``prepare``: (max_len of the model, the batches it runs) per group.
CaseGroups = list[tuple[int, list[Mapping[str, "np.ndarray | None"]]]]


class Backend(Protocol):
    """The backend contract. Required: ``NAME`` and ``build``. Optional, each with the default that
    ``LoadedBackend`` gives when a backend leaves it out:

    - ``ROLE``: a key of ``ROLES`` (default "framework"); ``LABEL``: how people call it (default ``NAME``).
    - ``supports(config, device) -> str | None``: why it cannot compute ``config`` on ``device``, or None
      (default: it computes every config on every device its ``build`` accepts).
    - ``devices() -> list[str]``: the devices it can use here (default ``["cpu"]``).
    - ``kernel_eps(eps) -> float``: the LayerNorm epsilon its kernels really use when asked for ``eps``
      (default: exactly ``eps``).
    - ``NAME_RULES``: (regex, replacement) rules from canonical parameter names to its own, applied in
      turn (default none: it uses the canonical names).
    - ``save_checkpoint(path, config, weights)``, ``load_checkpoint(path, config=None, **statements)``,
      ``read_checkpoint(path, key=None)``: its framework's own checkpoint file (default: none).
    - ``Pretrainer(model, **options)``: training (loss, gradients, optimizer step and state), a
      ``bert_multi.training.Trainer`` (default: it cannot train).
    - ``train_data_parallel``, ``join_data_parallel``, ``end_worker``: data-parallel workers on the
      framework's own engine (default: none; ``end_worker(code)`` returns ``code``).
    - ``USER_MODELS`` (class names, module.qualname) and ``wrap_user_model(model, dtype, device, example,
      copied)``: a user's own model of those classes as a ``bert_multi.verify.subject.Subject``, for
      ``bert-multi verify`` (default: it wraps none).
    - ``gemm(dtype, m, k, n) -> callable`` and ``synchronize()``: ``bench``'s timing helpers, a matrix
      product as its dense layers compute one, and waiting for queued work (default: NumPy's product,
      and nothing to wait for); ``BENCH_VARIANTS``: {name: build options} that ``bench`` also times
      (default none; a build that takes ``compile`` is timed compiled too).
    - ``prepare(config, groups, dtypes, device)``: compile ahead the forward a conformance run will ask
      for, each group a (max_len, batches) pair, so that the run's models find it compiled; the engine
      calls it on a thread of its own from the start of a run, beside the other backends' work, one dtype
      and group at a time until the run ends (default: nothing to compile ahead).
    """

    NAME: str

    def build(
        self,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        device: str = "cpu",
        dtype: object = "float32",
        **options: Any,
    ) -> BackendModel:
        """A ``BackendModel`` of ``config`` on ``device`` computing in ``dtype``, holding exactly ``weights``
        (the canonical dict), taking the ``BUILD_OPTIONS`` its signature names. Raises ``CannotRunHere``
        for what it cannot do on this machine, ``ValueError`` for a request that is wrong anywhere."""
        ...


@dataclass(frozen=True)
class BERTOutput:
    """What a model returns, as NumPy arrays: d2l's (encoded_X, mlm_Y_hat, nsp_Y_hat) plus activations."""

    encoded: np.ndarray  # (B, T, H)
    mlm: np.ndarray | None  # (B, P, V), None without pred_positions
    nsp: np.ndarray | None  # (B, 2), None without an NSP head
    # see intermediate_names(); an activation a backend never recorded is None (a failing comparison)
    intermediates: Mapping[str, np.ndarray | None] | None = None


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


Hook = Callable[[Any, Any, Any], None]  # (module, its inputs, its output), as both frameworks call a forward hook


@contextlib.contextmanager
def recorded_activations(
    config: BERTConfig,
    wanted: bool,
    rules: list[tuple[str, str]],
    attach: Callable[[str, Hook], Callable[[], object]],
    to_numpy: Callable[[Any], np.ndarray | None],
) -> Iterator[OrderedDict[str, np.ndarray | None] | None]:
    """The activations of ``intermediate_names(config)``, in order, recorded while the block runs a
    forward (None unless ``wanted``): ``attach(path, hook)`` puts a forward hook on the framework's module
    at ``path`` (in its own names, from ``rules``) and returns what removes it; each is removed after."""
    if not wanted:
        yield None
        return
    sources = intermediate_sources(config)
    record: OrderedDict[str, np.ndarray | None] = OrderedDict.fromkeys(sources)  # filled by the hooks, in order
    removers = []
    try:
        for name, (path, side) in sources.items():

            def keep(module: Any, args: Any, output: Any, name: str = name, side: str = side) -> None:
                record[name] = to_numpy(args[0] if side == "input" else output)

            removers.append(attach(framework_module(path, rules), keep))
        yield record
    finally:
        for remove in removers:
            remove()


def intermediate_names(config: BERTConfig) -> list[str]:
    """Names of the activations ``model(..., intermediates=True)`` returns, in computation order."""
    return list(intermediate_sources(config))


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "gpu"
    index: int

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"


def parse_device(device: str) -> Device:
    """'cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N' (CUDA and GPU are synonyms in every backend)."""
    match = re.fullmatch(r"(cpu|cuda|gpu)(?::(\d+))?", str(device).strip().lower())
    if not match or (match[1] == "cpu" and match[2] is not None):
        raise UsageError(f"unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N'")
    if match[1] == "cpu":
        return Device("cpu", 0)
    return Device("gpu", int(match[2] or 0))


def matmul_precision(
    dtype: str, device: Device, tf32: bool = False, mixed_precision: str | None = None
) -> dict[str, object]:
    """What a model's ``runtime_info`` states of its matrix products, in every backend that can compute on
    a GPU: the TF32 setting it was built with, and the precision its products have: its mixed precision
    where it has one, else "tf32" for a float32 model on a GPU asked for it (a CPU computes float32
    products in full whatever the setting), else its dtype."""
    reduced = tf32 and dtype == "float32" and device.kind == "gpu"
    return {"tf32": tf32, "matmul precision": mixed_precision or ("tf32" if reduced else dtype)}


def check_mixed_precision_option(mixed_precision: object, dtype: str) -> None:
    """A ``mixed_precision`` build option names one of ``MIXED_PRECISIONS``, for float32 weights."""
    if mixed_precision is None:
        return
    if mixed_precision not in MIXED_PRECISIONS:
        raise UsageError(f"unknown mixed_precision {mixed_precision!r}: expected one of {list(MIXED_PRECISIONS)}")
    if dtype != "float32":
        raise UsageError(f"mixed precision ({mixed_precision}) is for float32 weights, not {dtype} ones")


def check_attention(attention: object) -> None:
    """An ``attention`` build option names one of ``ATTENTIONS``."""
    if attention not in ATTENTIONS:
        raise UsageError(f"unknown attention {attention!r}: expected one of {list(ATTENTIONS)}")


class BackendModel(abc.ABC):
    """A BERT model of one backend, called on NumPy arrays: what every ``build`` returns.

    Called as d2l's ``BERTModel`` is (tokens, segments, valid_lens, pred_positions), it returns a
    ``BERTOutput`` of NumPy arrays in the dtype it computes in; with ``intermediates=True``, every
    activation of ``intermediate_names(config)``, in that order. Subclasses implement ``_forward`` on
    checked inputs, ``export_weights`` and ``framework_info``, and call ``__init__`` with the config, the
    dtype and the ``Device`` (``parse_device``); ``backend``, the name of the backend that built it, is set
    by the registry when the class leaves it out; ``module`` is the framework's own model object (an
    ``nn.Module``, a Gluon ``Block``) for users' own code, None where there is none.
    """

    backend: str  # the building backend's NAME: a class attribute, or set by the registry's build
    module: Any = None  # the framework's own model object, where it has one (the oracle has none)
    # The named activations it records (None: every one of intermediate_names); only those are compared.
    recorded: tuple[str, ...] | None = None

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

    def save(self, path: str | os.PathLike) -> None:
        """Write the weights it exports (``export_weights``) to a canonical weight file, atomically; a
        model in another environment's worker writes it there."""
        save_weights(path, self.config, self.export_weights(share=True))

    @abc.abstractmethod
    def framework_info(self) -> dict[str, object]:
        """The framework's version and the settings that move numbers or timings (threads, TF32)."""

    def on_device(self, inputs: ModelInputs) -> Callable[[], object] | None:
        """The forward (no activations) on ``inputs`` moved to the model's device once: a call that returns
        once its outputs are computed there and leaves them there, for ``bench`` to time the device apart
        from the common interface's NumPy round trip; or None (the default) where there is none."""
        return None

    def at_precision(self, tf32: bool = False, mixed_precision: str | None = None) -> BackendModel | None:
        """This model with its products in another precision (``tf32``, ``mixed_precision``, as ``build``
        takes them), sharing every weight, where its framework applies the precision at call time; or None
        (the default) where the caller is to build it so."""
        return None

    def cut(self, max_len: int) -> BackendModel | None:
        """This model on its first ``max_len`` positions, as its backend builds it from the weights
        ``schema.cut_max_len`` cuts, made from this one and sharing every weight the cut leaves whole; or
        None (the default) where the caller is to build it so."""
        return None

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
    config: BERTConfig, weights: Mapping[str, np.ndarray], dtype: object = None
) -> tuple[str, dict[str, np.ndarray]]:
    """Validate canonical weights and cast them, explicitly, to the dtype the model will compute in
    (``None``: keep theirs), as C-contiguous arrays in native byte order: any layout NumPy accepts
    (reversed strides, big-endian) then suits every framework."""
    dtype, arrays = stream_weights(config, weights, dtype)
    return dtype, {name: array for name, _, array in arrays}


def stream_weights(
    config: BERTConfig, weights: Mapping[str, np.ndarray], dtype: object = None
) -> tuple[str, Iterator[tuple[str, np.ndarray, np.ndarray]]]:
    """``prepare_weights`` one tensor at a time, for a build: all validated first, then each cast as the
    build reaches it, as (name, the array given, the cast one). A build that copies each into its
    framework holds one copy at a time; from a mapping that reads each tensor when asked for (an open
    ``.npz``), it never holds every tensor it was given either."""
    own_dtype = validate_weights(config, weights)
    dtype = normalize_dtype(own_dtype if dtype is None else dtype)

    def cast() -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for name in weights:
            given = weights[name]
            yield name, given, _plain(given, dtype)

    return dtype, cast()


def shareable(array: np.ndarray, given: np.ndarray, share: bool, gradients: bool) -> bool:
    """Whether a model built with ``share`` may keep ``array`` (the cast of the caller's ``given``, as
    ``stream_weights`` yields them) as its storage: always if the cast made it (nobody else holds it);
    the caller's own array only if the caller shares it, and a read-only one only for a model that is
    only run, since a framework's tensors cannot be read-only, and training would write to memory its
    owner protects."""
    return array is not given or (share and (array.flags.writeable or not gradients))


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
