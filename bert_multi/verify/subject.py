"""What a user's model must provide to be verified, written once.

``bert-multi verify`` holds a model the user wrote to the oracle. Each framework wraps its own kind of
model into a ``Subject`` (``bert_multi/torch/user.py``, ``bert_multi/mxnet/user.py``,
``bert_multi/transformers/user.py``): its parameters under their own names, setting them, running it
with hooks at its modules, and its gradients. Any other model (TensorFlow, ONNX Runtime, C++ behind a
binding) is verified through the smaller ``NumpyProtocol``: it loads canonical weights and runs on
NumPy arrays, and ``ProtocolSubject`` makes a ``Subject`` of it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..errors import CannotRunHere, InputError, UsageError, UserCodeError, WeightsError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.schema import nsp_layers, param_shapes

Shape = tuple[int, ...]
Outputs = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]  # encoded, mlm, nsp
Taps = Mapping[str, tuple[str, str]]  # activation -> (the user's module path, "input" or "output")
Forced = Mapping[str, tuple[np.ndarray, np.ndarray]]  # activation -> (the oracle's value, the oracle's gradient)
Gradients = dict[str, np.ndarray | None]  # the user's parameter name -> its gradient (None: it gets none)


class Cotangents(NamedTuple):
    """What each output is multiplied by before summing to the scalar whose gradient is taken."""

    encoded: np.ndarray
    mlm: np.ndarray | None
    nsp: np.ndarray | None


class Subject(Protocol):
    """A user's model at one dtype and device, wrapped by its framework.

    Optional: ``vjp(inputs, cotangents)`` (``verify --gradients``) gives each parameter's gradient of
    sum(cotangent * output); ``isolated_vjp(inputs, taps, forced, cotangents)`` gives them with every
    tapped activation made the oracle's (``forced``: its value, and its gradient in place of the one that
    flows back into it), so each module's backward is checked alone, beside the activations as its
    modules computed them from the oracle's values; ``batch_loss`` (``--loss``);
    ``used_parameters(inputs)``: its parameters' names in the order a forward pass on ``inputs`` first uses
    them (as its framework can tell: each use, or each call of the module holding it), by which the
    weights are placed where names do not place them; and ``native_names``: the names its framework's own
    blocks give the canonical tensors (a family's label -> map-file rules: PyTorch's
    ``nn.TransformerEncoderLayer``), which place them as d2l's names do; ``padded_tables``: its tables
    whose row 0 is padding, where its framework says so (PyTorch's ``padding_idx=0``); ``pooled_at``: the
    path of the module whose output is the pooler's, tanh included, where the model's class says so
    (transformers' ``BertPooler``), at which the pooler is observed where no NSP classifier reads it."""

    framework: str  # the framework and its version, for the report

    def parameters(self) -> list[tuple[str, Shape]]:
        """Every parameter's own name and shape, in registration order."""
        ...

    def modules(self) -> set[str]:
        """The paths of its modules, where ``run`` can record an activation."""
        ...

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Set every parameter named in ``arrays`` (the user's names, the model's dtype)."""
        ...

    def arrays(self) -> dict[str, np.ndarray]:
        """Every parameter's value, as NumPy arrays under the user's names."""
        ...

    def run(self, inputs: ModelInputs, taps: Taps) -> tuple[Outputs, dict[str, np.ndarray | None]]:
        """Inference (dropout off) on checked inputs: (encoded, mlm, nsp) and each tapped activation."""
        ...


def in_call_order(parameters: list[tuple[str, Shape]], called: list[str]) -> list[str]:
    """The names of ``parameters`` (in registration order) in the order a forward pass uses them: by the
    first call of the module each belongs to (its path without the last part; "" for the model itself),
    registration order within a module; those of modules never called are left out."""
    first = {path: index for index, path in enumerate(called)}
    owned = [(first.get(name.rsplit(".", 1)[0] if "." in name else ""), name) for name, _ in parameters]
    used = [(index, name) for index, name in owned if index is not None]
    return [name for _, name in sorted(used, key=lambda item: item[0])]  # stable: registration order within


# Where each named activation is found, by the canonical parameter whose module it enters or leaves:
# attention is W_o's output (before the residual), the add-and-norms are their LayerNorms' outputs, the
# embedding is its LayerNorm's output where the semantics normalise it, else what the first block's W_q
# reads, the pooler what the NSP classifier reads.
def tap_sources(config: BERTConfig) -> dict[str, tuple[str, str]]:
    """Each activation of ``intermediate_names(config)`` -> (canonical parameter, "input" or "output")."""
    normalised = config.semantics.embedding_norm
    sources = {"embedding": ("encoder.embedding_norm.weight", "output") if normalised
               else ("encoder.blks.0.attention.W_q.weight", "input")}  # fmt: skip
    for i in range(config.num_blks):
        blk = f"encoder.blks.{i}"
        sources[f"blks.{i}.attention"] = (f"{blk}.attention.W_o.weight", "output")
        sources[f"blks.{i}.addnorm1"] = (f"{blk}.addnorm1.ln.weight", "output")
        sources[f"blks.{i}.ffn"] = (f"{blk}.ffn.dense2.weight", "output")
        sources[f"blks.{i}.output"] = (f"{blk}.addnorm2.ln.weight", "output")
    if "pooler" in config.heads:
        sources["pooler"] = (f"{nsp_layers(config)[1]}.weight", "input")
    return sources


def input_sources(config: BERTConfig) -> dict[str, tuple[str, str]]:
    """What each block's LayerNorms read ("blks.i.ln1_input", "blks.i.ln2_input"), recorded beside the
    activations where a divergence is diagnosed: a pre-norm block's LayerNorm reads the block's input and
    the residual sum, which no activation of d2l's is."""
    return {
        f"blks.{i}.ln{k}_input": (f"encoder.blks.{i}.addnorm{k}.ln.weight", "input")
        for i in range(config.num_blks)
        for k in (1, 2)
    }


def activation_of(config: BERTConfig, name: str) -> str:
    """The activation computed by the canonical module that holds ``name`` (a parameter's or a module's
    canonical name): its block's part (``intermediate_names``), "embedding", "pooler", "nsp" or "mlm"."""
    block = re.match(r"encoder\.blks\.(\d+)\.(\w+)", name)
    if block:
        return f"blks.{block[1]}.{'output' if block[2] == 'addnorm2' else block[2]}"
    if name.split(".")[0] == "encoder":  # the embeddings' parameters, and the encoder holding the positions
        return "embedding"
    pooler, classifier = nsp_layers(config)
    if name == pooler or name.startswith(f"{pooler}."):
        return "pooler"
    return "nsp" if name == classifier or name.startswith(f"{classifier}.") else "mlm"


@runtime_checkable
class NumpyProtocol(Protocol):
    """Any model, in any language behind Python: ``load_weights(weights)`` takes the canonical dict
    (``bert_multi.param_shapes`` names, NumPy arrays); calling it as d2l's BERTModel (tokens, segments,
    valid_lens, pred_positions as NumPy arrays; valid_lens and pred_positions may be None) returns
    (encoded, mlm, nsp), each a NumPy array or None, optionally with a fourth item: a dict of named
    activations (``bert_multi.intermediate_names``). Optional: ``gradients(tokens, segments,
    valid_lens, pred_positions, d_encoded, d_mlm, d_nsp)`` returns each canonical parameter's gradient
    of sum(d_encoded * encoded) + sum(d_mlm * mlm) + sum(d_nsp * nsp) (None where it gets none)."""

    def load_weights(self, weights: dict[str, np.ndarray]) -> None: ...

    def __call__(self, tokens: np.ndarray, segments: np.ndarray, valid_lens: Any, pred_positions: Any) -> Any: ...


class ProtocolSubject:
    """A ``NumpyProtocol`` model as a ``Subject``: its parameters are the canonical tensors, under their
    own names; its activations are those it returns."""

    framework = "the NumPy protocol"

    def __init__(self, model: NumpyProtocol, config: BERTConfig, dtype: str) -> None:
        self.model, self.config, self.dtype = model, config, dtype
        self.loaded: dict[str, np.ndarray] = {}
        if callable(getattr(model, "gradients", None)):
            self.vjp = self._vjp

    def parameters(self) -> list[tuple[str, Shape]]:
        return list(param_shapes(self.config).items())

    def modules(self) -> set[str]:
        return set()  # nothing to hook: it returns the activations it records

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.loaded = {name: np.asarray(array, dtype=self.dtype) for name, array in arrays.items()}
        self.model.load_weights(dict(self.loaded))

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: array.copy() for name, array in self.loaded.items()}

    def run(self, inputs: ModelInputs, taps: Taps) -> tuple[Outputs, dict[str, np.ndarray | None]]:
        returned = self.model(*inputs)
        if not isinstance(returned, tuple) or len(returned) not in (3, 4):
            raise TypeError(
                f"the model returned {type(returned).__name__}; expected (encoded, mlm, nsp[, activations])"
            )
        activations = dict(returned[3]) if len(returned) == 4 else {}
        encoded, mlm, nsp = (None if value is None else np.asarray(value) for value in returned[:3])
        if encoded is None:
            raise TypeError("the model returned no encoded output (None)")
        return (encoded, mlm, nsp), {name: np.asarray(value) for name, value in activations.items()}

    def _vjp(self, inputs: ModelInputs, cotangents: Cotangents) -> dict[str, np.ndarray | None]:
        grads = self.model.gradients(*inputs, *cotangents)  # type: ignore[attr-defined]
        return {name: None if value is None else np.asarray(value) for name, value in dict(grads).items()}


def outputs_of(returned: Any, to_numpy: Callable[[Any], np.ndarray | None]) -> Outputs:
    """A d2l-style model's return value, (encoded, mlm, nsp), as NumPy arrays (or a ``TypeError``)."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 3:
        raise TypeError(f"your model returned {type(returned).__name__}; d2l's BERTModel returns (encoded, mlm, nsp)")
    encoded, mlm, nsp = (to_numpy(value) for value in returned)
    if encoded is None:
        raise TypeError("your model's first output (encoded) is not an array of its framework")
    return encoded, mlm, nsp


def call_user(what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, where an exception is the user's code's (a ``UserCodeError``) unless
    it is one of the project's own, which say what was asked wrongly or cannot run here. Their code's
    ``sys.exit`` is theirs too: it never ends a run as if it were a verdict; Ctrl-C stays an interrupt."""
    try:
        return function(*args, **kwargs)
    except (UserCodeError, UsageError, InputError, WeightsError, CannotRunHere, KeyboardInterrupt):
        raise
    except BaseException as error:  # noqa: BLE001 - whatever their code raises (SystemExit too) is theirs to see
        raise UserCodeError(what, error) from error


def accepts(function: Callable[..., Any], *names: str) -> bool:
    """Whether ``function`` takes every keyword in ``names``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names) or any(p.kind == p.VAR_KEYWORD for p in parameters.values())
