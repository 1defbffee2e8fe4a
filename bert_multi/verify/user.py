"""A user's own model as a backend: made by their factory (or copied from their object), wrapped by its
framework into a ``Subject``, loaded with the canonical weights through its ``ParameterMap``, and run by
the conformance engine like any other backend."""

from __future__ import annotations

import copy
import functools
import inspect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..backend.contract import BackendModel, BERTOutput, Device, matmul_precision, parse_device, prepare_weights
from ..backend.registry import LoadedBackend, imported_backends, wrapper_for
from ..errors import CannotRunHere, UsageError, UserCodeError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.schema import param_shapes
from .map_file import MapFile
from .mapping import map_parameters
from .placement import ParameterMap
from .subject import NumpyProtocol, ProtocolSubject, Shape, Subject, accepts, call_user, input_sources, tap_sources

ROLE = "subject"


@dataclass(frozen=True)
class Given:
    """What verify was given: a factory (``factory(config)`` returns the model) or a model object."""

    label: str
    factory: Callable[..., Any] | None = None
    model: Any = None

    @classmethod
    def of(cls, model_or_factory: Any, label: str | None = None) -> Given:
        """A class, function or method is a factory; anything else is the model itself."""
        is_factory = inspect.isclass(model_or_factory) or inspect.isroutine(model_or_factory)
        is_factory = is_factory or isinstance(model_or_factory, functools.partial)
        name = label or getattr(model_or_factory, "__qualname__", None) or type(model_or_factory).__name__
        return cls(name, model_or_factory, None) if is_factory else cls(name, None, model_or_factory)

    def make(self, config: BERTConfig, dtype: str, device: str) -> tuple[Any, bool]:
        """A model object for ``config``, and whether it is the caller's own (so must be copied to change)."""
        if self.factory is None:
            return self.model, True
        stated = {"dtype": dtype, "device": device} if accepts(self.factory, "dtype", "device") else {}
        return call_user(f"your factory {self.label}(config)", self.factory, config, **stated), False


def example_inputs(config: BERTConfig) -> ModelInputs:
    """A small batch for a model's first forward (lazy layers learn their widths from it)."""
    T = min(4, config.max_len)
    zeros = np.zeros((1, T), dtype=np.int64)
    positions = np.zeros((1, 1), dtype=np.int64) if "mlm" in config.heads else None
    return ModelInputs(zeros, zeros.copy(), np.array([T]), positions)


def subject_of(given: Given, config: BERTConfig, dtype: str, device: str) -> tuple[Subject, LoadedBackend | None]:
    """The user's model for ``config`` at ``dtype`` on ``device``, wrapped by its framework, and the
    backend of that framework (None for a NumPy-protocol model)."""
    imported_backends()  # loaded before the user's code runs, so their settings hold for it (JAX's cache)
    model, copied = given.make(config, dtype, device)
    # A framework that keeps the parameters apart from the model (Flax) is given (model, parameters).
    backend = wrapper_for(model[0] if isinstance(model, tuple) and len(model) == 2 else model)
    if backend is not None:
        example = example_inputs(config)
        wrap = backend.wrap_user_model
        return call_user(f"wrapping {given.label}", wrap, model, dtype, device, example, copied), backend
    if isinstance(model, NumpyProtocol):
        if parse_device(device).kind != "cpu":
            raise CannotRunHere(f"{given.label} is a NumPy-protocol model: verify gives it NumPy arrays, on the CPU")
        return ProtocolSubject(model, config, dtype), None
    raise UsageError(
        f"{given.label} gave a {type(model).__module__}.{type(model).__qualname__}: verify takes a PyTorch "
        "nn.Module, a Gluon Block, a Flax Module with its parameters, a transformers BERT, or any object with "
        "load_weights() and __call__ (the NumPy protocol, docs/verify.md)"
    )


# How many times d2l's largest array for a batch a returned array may hold: room for a port's own layout
# (heads split out, every position's logits), none for an array whose comparison would not fit in memory.
SIZE_MARGIN = 4


def _check_returned(arrays: dict[str, np.ndarray | None], label: str, config: BERTConfig, inputs: ModelInputs) -> None:
    """Refuse, as the user's model's error on this input, an output or activation that is not real floating
    point (complex, strings, integers, booleans, objects), or that holds more values than any array of d2l's
    model for this batch could (a broadcast view of billions): never converted, and never compared, so
    never compared as something it is not, nor at a cost no machine has. Its precision is what the
    comparison's tolerance judges."""
    batch, steps = inputs.tokens.shape
    widest = max(config.num_hiddens, config.ffn_num_hiddens, config.vocab_size, config.num_heads * steps)
    most = SIZE_MARGIN * batch * steps * widest
    for name, array in arrays.items():
        if array is None:
            continue
        if array.dtype.kind != "f":
            problem = f"its {name} is an array of {array.dtype}; expected real floating point numbers"
        elif array.size > most:
            problem = (
                f"its {name} has shape {array.shape}, {array.size} values, more than {SIZE_MARGIN} times d2l's "
                f"largest array for this batch ({most // SIZE_MARGIN} values)"
            )
        else:
            continue
        raise UserCodeError(f"your model {label}", (TypeError if array.dtype.kind != "f" else ValueError)(problem))


def _sublayer_of(activation: str) -> str | None:
    """The sublayer's activation whose add-and-norm ``activation`` is ("blks.0.output" -> "blks.0.ffn"):
    a port that leaves that LayerNorm out returns the sublayer's output there."""
    block, _, part = activation.rpartition(".")
    sublayer = {"addnorm1": "attention", "output": "ffn"}.get(part) if block.startswith("blks.") else None
    return f"{block}.{sublayer}" if sublayer else None


class UserBERT(BackendModel):
    """A user's model behind the backend contract; its activations are recorded at the modules the mapping
    located, and named there in the user's words (``activation_names``)."""

    def __init__(
        self,
        name: str,
        config: BERTConfig,
        subject: Subject,
        mapping: ParameterMap,
        dtype: str,
        device: Device,
        pooler_output: str | None = None,
    ) -> None:
        super().__init__(config, dtype, device)
        self.backend, self.subject, self.mapping = name, subject, mapping
        self.module = getattr(subject, "module", getattr(subject, "model", None))
        modules = subject.modules()
        sources = tap_sources(config)
        self.taps = OrderedDict()
        for activation, (parameter, side) in sources.items():
            sublayer = _sublayer_of(activation)
            if parameter not in mapping.placements and sublayer is not None:  # a block without that LayerNorm
                parameter, side = sources[sublayer]
            module = mapping.module_of(parameter) if parameter in mapping.placements else None
            if module is not None and module in modules:
                self.taps[activation] = (module, side)
        # Where no NSP classifier reads the pooler, its own module shows it, where that is known: named by the
        # map file (which the user may name anyway) or by the model's class.
        pooled_at = pooler_output or (None if "pooler" in self.taps else getattr(subject, "pooled_at", None))
        if "pooler" in config.heads and pooled_at in modules:
            self.taps["pooler"] = (pooled_at, "output")
        # A framework's model is hooked where the mapping located its modules; a NumPy-protocol model
        # records what it returns, known once it has run.
        self.recorded = () if isinstance(subject, ProtocolSubject) else tuple(self.taps)

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        # What the user's code raises is theirs, on this input: the engine reports it as this case's error.
        taps = self.taps if intermediates else {}
        (encoded, mlm, nsp), activations = call_user(f"your model {self.backend}", self.subject.run, inputs, taps)
        _check_returned({"encoded": encoded, "mlm": mlm, "nsp": nsp, **activations}, self.backend, self.config, inputs)
        # What the model computes of a part it lacks in d2l's sense (a decoder without d2l's MLM transform)
        # is not d2l's output: it is left out, and the report says the part was not checked.
        mlm = mlm if "mlm" in self.config.heads else None
        nsp = nsp if "nsp" in self.config.heads else None
        if isinstance(self.subject, ProtocolSubject):
            self.recorded = tuple(name for name in tap_sources(self.config) if name in activations)
        record = OrderedDict((name, activations.get(name)) for name in (self.recorded or ()))
        for name, value in record.items():  # a LayerNorm never called: the block gives its sublayer's output
            sublayer = _sublayer_of(name)
            if value is None and sublayer is not None:
                record[name] = activations.get(sublayer)
        return BERTOutput(encoded, mlm, nsp, record if intermediates else None)

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        canonical = self.mapping.to_canonical(self.subject.arrays(), param_shapes(self.config))
        return {name: np.ascontiguousarray(array) for name, array in canonical.items() if array is not None}

    def framework_info(self) -> dict[str, object]:
        info: dict[str, object] = {"framework": self.subject.framework, "parameters placed by": self.mapping.how}
        if not isinstance(self.subject, ProtocolSubject):  # every framework's wrapper runs with TF32 off
            info.update(matmul_precision(self.dtype, self.device))
        return info

    def recording_inputs(self) -> UserBERT:
        """This model, recording what its LayerNorms read too (``input_sources``), for the diagnosis: a
        copy, so that no other check is given taps the oracle does not record."""
        recording = copy.copy(self)
        recording.taps = OrderedDict(self.taps)
        modules = self.subject.modules()
        for activation, (parameter, side) in input_sources(self.config).items():
            module = self.mapping.module_of(parameter) if parameter in self.mapping.placements else None
            if module is not None and module in modules:
                recording.taps[activation] = (module, side)
        recording.recorded = () if isinstance(self.subject, ProtocolSubject) else tuple(recording.taps)
        return recording

    def activation_names(self) -> dict[str, str]:
        """Each recorded activation -> where it is in the user's model, in their names."""
        return {name: f"{path} ({side})" for name, (path, side) in self.taps.items()}


class UserBackend:
    """A user's model registered as a backend for one verify run (role "subject")."""

    ROLE = ROLE

    def __init__(self, given: Given, map_file: MapFile | None, decided: ParameterMap | None = None) -> None:
        self.NAME = self.LABEL = given.label
        self.given, self.map_file = given, map_file
        self.spare: UserBERT | None = None  # a model already built, for the next build of its kind
        self.framework: LoadedBackend | None = None  # the backend that wrapped the model, once known
        # The placements the oracle decided where the order of use only suggested them (``roles``): every
        # later build takes them.
        self.decided = decided
        self.lacking = False  # the config leaves out parts the model lacks: their parameters are ignored
        self.kept: tuple[str, ...] = ()  # canonical tensors the model has no parameter for (``may_lack``)

    def kernel_eps(self, eps: float) -> float:
        """The LayerNorm epsilon the model's framework really computes with (MXNet's is a C float), so
        that the oracle it is held to computes with the same."""
        return eps if self.framework is None else self.framework.kernel_eps(eps)

    def keep_spare(self, model: UserBERT) -> None:
        """Give ``model`` to the next build of its config, dtype and device, instead of making another
        (the user's factory may take longer than the forward: random initialisation)."""
        self.spare = model

    def mapping(self, config: BERTConfig, subject: Subject) -> ParameterMap:
        found = self._found(config, subject)
        if self.decided is None:
            return found
        # Found again for this build's shapes (a shorter max_len cuts the positions), the decisions taken over.
        placements = {
            name: self.decided.placements.get(name, placement) for name, placement in found.placements.items()
        }
        return replace(found, placements=placements, how=self.decided.how)

    def _found(self, config: BERTConfig, subject: Subject) -> ParameterMap:
        used = getattr(subject, "used_parameters", None)

        made: dict[str, Shape] = {}  # the weights that forward makes anew on every call

        def order_of_use() -> list[str]:  # a forward on a small batch, with the model's own weights
            assert used is not None
            order = call_user(f"your model {self.NAME}", used, example_inputs(config))
            made.update(getattr(subject, "made_in_forward", {}))
            return order

        order = order_of_use if used is not None else None
        native = getattr(subject, "native_names", None)
        padded = getattr(subject, "padded_tables", ())
        return map_parameters(
            config, subject.parameters(), self.map_file, order, self.lacking, native, self.kept, padded, made
        )

    def build(
        self,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        device: str = "cpu",
        dtype: object = "float32",
        gradients: bool = True,
        share: bool = False,
    ) -> UserBERT:
        """The user's model of ``config`` holding ``weights`` at ``dtype`` on ``device``."""
        dtype, weights = prepare_weights(config, weights, dtype)
        spare = self.spare
        if spare is not None and (spare.config, spare.dtype, spare.device) == (config, dtype, parse_device(device)):
            self.spare = None
            spare.subject.load(spare.mapping.to_user(weights))
            return spare
        subject, self.framework = subject_of(self.given, config, dtype, device)
        mapping = self.mapping(config, subject)
        subject.load(mapping.to_user(weights))
        return UserBERT(self.NAME, config, subject, mapping, dtype, parse_device(device), self._pooler_output(subject))

    def _pooler_output(self, subject: Subject) -> str | None:
        """The module the map file says outputs the pooler, one of ``subject``'s (else a ``UsageError``)."""
        if self.map_file is None or self.map_file.pooler_output is None:
            return None
        named, modules = self.map_file.pooler_output, subject.modules()
        if named not in modules:
            pooling = sorted(name for name in modules if "pool" in name.lower())[:5]
            hint = f" (its modules named like a pooler: {pooling})" if pooling else ""
            raise UsageError(f"{self.map_file.source}: pooler_output {named!r:.80} is no module of your model{hint}")
        return named
