"""Backends in another Python environment: a worker process of that interpreter runs the backend, and
weights go in and outputs come back through files (``.npz`` arrays, read without pickle, in a
directory of the caller's own), so one run compares frameworks that cannot share an environment (MXNet 1.9.1 needs
NumPy < 1.24; JAX needs more).

The registry uses this when a built-in backend's framework cannot import here: it looks for the
interpreter of the environment where the project installs that framework (``Registration.environment``,
beside the source tree or the working directory), or the one named by ``BERT_MULTI_PYTHON_<NAME>``
(``BERT_MULTI_PYTHON_JAX=/path/to/python``; ``none``: never elsewhere) or ``use_python``. The worker is
``python -m bert_multi.backend.worker``, with this source tree first on its path, reached through
``channel`` (which bounds every exchange). A remote backend offers what conformance needs (building,
running with activations, exporting weights, its devices and eps), its framework's checkpoint files
(written and read there) and its ``Pretrainer`` (``RemoteTrainer``), driven step by step from here (so
the batches, seeds and checkpoints are the caller's own); data-parallel workers and users' models stay
in the framework's own environment. What the worker sends back is checked against what was asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from .. import errors
from ..errors import BackendUnavailable, UsageError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.loss import BatchTotals, LossValues, check_batch
from ..spec.optimizer import adam_stepped, check_optimizer_state
from ..spec.schema import SUPPORTED_DTYPES, param_shapes, validate_weights
from .channel import SOURCE_ROOT, WORKER_VARIABLE, RemoteFailure, Worker
from .contract import BackendModel, BERTOutput, CaseGroups, parse_device, read_only

_chosen: dict[str, str] = {}


def variable(name: str) -> str:
    """The environment variable naming the interpreter for backend ``name``."""
    return f"BERT_MULTI_PYTHON_{name.upper().replace('-', '_')}"


def use_python(name: str, python: str | os.PathLike) -> None:
    """Run backend ``name`` with the interpreter ``python`` whenever it cannot load here (as
    ``BERT_MULTI_PYTHON_<NAME>`` does); takes effect for backends not yet loaded."""
    if not Path(python).is_file():
        raise UsageError(f"no Python interpreter at {python} (for backend {name!r}); expected the path of a python")
    _chosen[name] = str(python)


def interpreter(name: str, environment: str) -> Path | None:
    """The Python that runs backend ``name`` elsewhere: the configured one, else ``environment``'s beside
    the source tree or the working directory, unless that is this interpreter's own; None if none."""
    configured = _chosen.get(name) or os.environ.get(variable(name))
    if configured == "none":
        return None
    if configured:
        if not Path(configured).is_file():
            raise BackendUnavailable(f"{variable(name)}={configured} is not a Python interpreter")
        return Path(configured)
    if not environment:
        return None
    for root in dict.fromkeys((SOURCE_ROOT, Path.cwd().resolve())):
        python = root / environment / "bin" / "python"
        if python.is_file() and (root / environment).resolve() != Path(sys.prefix).resolve():
            return python
    return None


def load_elsewhere(name: str, environment: str, unavailable: BackendUnavailable) -> RemoteBackend:
    """Backend ``name`` run by a worker in another environment, since it is ``unavailable`` here; else
    a ``BackendUnavailable`` saying how to provide it."""
    if os.environ.get(WORKER_VARIABLE):
        raise unavailable
    python = interpreter(name, environment)
    if python is None:
        raise BackendUnavailable(f"{unavailable}; or point {variable(name)} at a Python that has it") from None
    try:
        return RemoteBackend(name, python)
    except RemoteFailure as error:
        raise BackendUnavailable(f"{unavailable}; nor can it run in {python}: {error}") from None


class RemoteBackend:
    """Backend ``name`` as the worker's interpreter loads it, meeting the contract here."""

    def __init__(self, name: str, python: Path) -> None:
        self.worker = Worker(python)
        try:
            described = self.worker.call("load", backend=name)
        except BackendUnavailable as error:
            self.worker.close()
            raise RemoteFailure(str(error)) from None
        except RemoteFailure:
            self.worker.close()
            raise
        field = functools.partial(self.worker.field, described, "load")
        self.NAME, self.ROLE = name, field("role", _is_text, "a role's name")
        self.LABEL = field("label", _is_text, "a framework's name")
        rules = field("name_rules", lambda v: _texts(v, pairs=True), "a list of [pattern, replacement] pairs")
        self.NAME_RULES = [tuple(rule) for rule in rules]
        self.ENVIRONMENT = str(python)
        self._devices: list[str] = field("devices", _texts, "a list of device names")
        if field("checkpoints", _is_flag, "true or false"):  # its framework's own files, written and read there
            self.save_checkpoint, self.read_checkpoint = self._save_checkpoint, self._read_checkpoint
        if described.get("prepares"):  # it compiles ahead, while this process works on other backends
            self.prepare = self._prepare
        if field("trains", _is_flag, "true or false"):  # a Pretrainer that offers what the worker's does
            offers = {"MIXED_PRECISION": tuple(field("mixed_precisions", _texts, "a list of dtype names"))}
            self.Pretrainer = type("RemoteTrainer", (RemoteTrainer,), offers)

    def devices(self) -> list[str]:
        return list(self._devices)

    def supports(self, config: BERTConfig, device: str = "cpu") -> str | None:
        reply = self.worker.call("supports", config=config.to_dict(), device=device)
        return self.worker.field(reply, "supports", "reason", lambda v: v is None or _is_text(v), "null or a reason")

    def kernel_eps(self, eps: float) -> float:
        reply = self.worker.call("kernel_eps", eps=eps)
        return float(self.worker.field(reply, "kernel_eps", "eps", _is_epsilon, "a LayerNorm epsilon, 0 < eps < 1"))

    def build(
        self, config: BERTConfig, weights: dict[str, np.ndarray], device: str = "cpu", dtype: object = None, **options
    ) -> RemoteModel:
        """The worker's model of ``config`` holding ``weights``."""
        dtype = None if dtype is None else str(np.dtype(dtype))  # type: ignore[call-overload]
        reply, _ = self.worker.exchange(
            "build", {"weights": weights}, False, config=config.to_dict(), device=device, dtype=dtype, options=options
        )
        return RemoteModel(self, config, reply)

    def _prepare(self, config: BERTConfig, groups: CaseGroups, dtypes: list[str], device: str) -> None:
        """The worker's ``prepare``: the batches go as one file, and how they group as the request's layout."""
        arrays: dict[str, np.ndarray] = {}
        layout: list[Any] = []
        for g, (max_len, batches) in enumerate(groups):
            fields = []
            for b, batch in enumerate(batches):
                given = {field: array for field, array in batch.items() if array is not None}
                fields.append(list(given))
                arrays.update({f"{g}/{b}/{field}": array for field, array in given.items()})
            layout.append([max_len, fields])
        self.worker.exchange(  # compiling ahead: the run's own requests go first
            "prepare",
            {"inputs": arrays},
            False,
            background=True,
            config=config.to_dict(),
            layout=layout,
            dtypes=dtypes,
            device=device,
        )

    def train_data_parallel(self, workers: int, threads_per_worker: int = 1, **arguments: Any) -> Any:
        raise self._in_its_environment(f"--workers {workers}")

    def join_data_parallel(self, **arguments: Any) -> Any:
        raise self._in_its_environment("--join")

    def _in_its_environment(self, option: str) -> UsageError:
        """Data-parallel workers start from the framework's own environment, never through a worker."""
        return UsageError(
            f"data-parallel workers of {self.NAME!r} start from its own environment: run "
            f"{Path(self.ENVIRONMENT).parent / 'bert-multi'} pretrain --backend {self.NAME} {option}"
        )

    def _save_checkpoint(self, path: str | os.PathLike, config: BERTConfig, weights: dict[str, np.ndarray]) -> None:
        where = str(Path(path).absolute())
        self.worker.exchange("save_checkpoint", {"weights": weights}, False, path=where, config=config.to_dict())

    def _read_checkpoint(
        self, path: str | os.PathLike, key: str | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
        reply, arrays = self.worker.exchange("read_checkpoint", {}, True, path=str(Path(path).absolute()), key=key)
        dtypes, notes = reply.get("dtypes"), reply.get("notes")
        if not (isinstance(dtypes, dict) and list(dtypes) == list(arrays) and all(map(_is_text, dtypes.values()))):
            raise self.worker.failure(f"its reply to 'read_checkpoint' gives dtypes {str(dtypes)[:200]} for arrays "
                                      f"{list(arrays)[:5]}")  # fmt: skip
        if not (isinstance(notes, list) and all(map(_is_text, notes))):
            raise self.worker.failure(f"its reply to 'read_checkpoint' gives notes {str(notes)[:200]}")
        return arrays, dtypes, notes


class RemoteModel(BackendModel):
    """A model living in a worker; inputs are checked here, before the worker sees them."""

    module = None

    def __init__(self, backend: RemoteBackend, config: BERTConfig, reply: dict[str, Any], op: str = "build") -> None:
        recorded = reply.get("recorded")
        if not (
            type(reply.get("model")) is int
            and reply.get("dtype") in SUPPORTED_DTYPES
            and _is_text(reply.get("device"))
            and (recorded is None or (isinstance(recorded, list) and all(map(_is_text, recorded))))
            and isinstance(reply.get("info"), dict)
        ):
            raise backend.worker.failure(f"its reply to {op!r} describes no model: {str(reply)[:200]}")
        super().__init__(config, reply["dtype"], parse_device(reply["device"]))
        self.remote, self.backend, self.worker, self.id = backend, backend.NAME, backend.worker, int(reply["model"])
        self.recorded = None if reply["recorded"] is None else tuple(reply["recorded"])
        self.info: dict[str, object] = {**reply["info"], "python": backend.ENVIRONMENT}
        weakref.finalize(self, self.worker.drop, self.id)

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        given = {name: array for name, array in inputs._asdict().items() if array is not None}
        reply, arrays = self.worker.exchange(
            "forward", {"inputs": given}, True, model=self.id, intermediates=intermediates
        )
        names = reply.get("intermediates")
        if names is not None and not (isinstance(names, list) and all(map(_is_text, names))):
            raise self.worker.failure(f"its reply to 'forward' names intermediates {str(names)[:200]}")
        record = None if names is None else {name: arrays.get(f"intermediates/{name}") for name in names}
        if "encoded" not in arrays:
            raise self.worker.failure(f"its reply to 'forward' holds no encoded output, only {_first(arrays)}")
        output = BERTOutput(arrays["encoded"], arrays.get("mlm"), arrays.get("nsp"), record)
        problem = self._misshapen(inputs, output)
        if problem:
            raise self.worker.failure(f"its reply to 'forward' {problem}")
        return output

    def _misshapen(self, inputs: ModelInputs, output: BERTOutput) -> str | None:
        """What is wrong with the outputs the worker sent for ``inputs``, if anything: each is there or
        not as the model's heads and the inputs say, of its shape, in the model's dtype."""
        batch, length = inputs.tokens.shape
        c = self.config
        mlm = None if inputs.pred_positions is None or "mlm" not in c.heads else (batch, inputs.pred_positions.shape[1])
        expected = {
            "encoded": (batch, length, c.num_hiddens),
            "mlm": None if mlm is None else (*mlm, c.vocab_size),
            "nsp": (batch, 2) if "nsp" in c.heads else None,
        }
        for name, shape in expected.items():
            array = getattr(output, name)
            got = None if array is None else (array.shape, array.dtype.name)
            if got != (None if shape is None else (shape, self.dtype)):
                wanted = "none" if shape is None else f"{self.dtype} {shape}"
                return f"holds {name} as {'none' if got is None else f'{got[1]} {got[0]}'}; expected {wanted}"
        return None

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        _, weights = self.worker.exchange("export", {}, True, model=self.id)
        try:
            if validate_weights(self.config, weights) != self.dtype:
                raise errors.WeightsError(f"its weights are not {self.dtype}")
        except errors.WeightsError as error:
            raise self.worker.failure(f"its reply to 'export' does not hold the model's weights: {error}") from None
        return {name: read_only(array) for name, array in weights.items()} if share else weights

    def save(self, path: str | os.PathLike) -> None:
        """The worker writes the file: the weights do not cross, and its environment's NumPy writes what
        this one reads."""
        self.worker.call("save", model=self.id, path=os.fspath(path))

    def cut(self, max_len: int) -> RemoteModel | None:
        """The worker's own model cut from this one, where its backend makes one: no weights cross."""
        reply = self.worker.call("cut", model=self.id, max_len=int(max_len))
        if reply.get("model") is None:
            return None
        return RemoteModel(self.remote, dataclasses.replace(self.config, max_len=int(max_len)), reply, "cut")

    def framework_info(self) -> dict[str, object]:
        return dict(self.info)


class RemoteTrainer:
    """The worker's ``Pretrainer`` of a ``RemoteModel``: each call sends its batch and returns what the
    trainer there returned (losses, canonical gradients, the optimizer state)."""

    MIXED_PRECISION: tuple[str, ...] = ()

    def __init__(self, model: RemoteModel, **options: Any) -> None:
        self.model, self.config, self.worker = model, model.config, model.worker
        self.optimizer, self.steps = options.get("optimizer"), 0
        reply = self.worker.call("trainer", model=model.id, options=options)
        self.id = self.worker.field(reply, "trainer", "trainer", lambda v: type(v) is int, "a trainer's number")
        weakref.finalize(self, self.worker.drop, self.id)
        # The parameters' shapes and dtype, which every gradient and moment the worker sends must have.
        self.parameters = {
            name: np.broadcast_to(np.zeros((), model.dtype), shape) for name, shape in param_shapes(self.config).items()
        }

    def seed(self, value: int) -> None:
        self.worker.call("seed", trainer=self.id, value=int(value))

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        reply, _ = self.worker.exchange("loss", {"batch": self._checked(batch)}, False, trainer=self.id)
        return self._losses("loss", reply)

    def step(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None) -> LossValues:
        sent = {"batch": self._checked(batch)}
        reply, _ = self.worker.exchange("step", sent, False, trainer=self.id, totals=_plain_totals(totals))
        self.steps += 1
        return self._losses("step", reply)

    def gradients(
        self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None
    ) -> tuple[LossValues, dict[str, np.ndarray]]:
        sent = {"batch": self._checked(batch)}
        reply, arrays = self.worker.exchange("gradients", sent, True, trainer=self.id, totals=_plain_totals(totals))
        wrong = [name for name, array in arrays.items() if not _like(array, self.parameters.get(name))]
        if list(arrays) != list(self.parameters) or wrong:
            raise self.worker.failure(
                f"its reply to 'gradients' holds {_first(arrays)}{f', {wrong[0]!r} misshapen' if wrong else ''}; "
                f"expected a gradient of each of the {len(self.parameters)} parameters, {_first(self.parameters)}"
            )
        return self._losses("gradients", reply), arrays

    def state(self) -> dict[str, np.ndarray]:
        arrays = self.worker.exchange("state", {}, True, trainer=self.id)[1]
        try:
            check_optimizer_state(self.parameters, arrays, adam_stepped(self.optimizer, self.steps))
        except errors.WeightsError as error:
            raise self.worker.failure(f"its reply to 'state' is no state of this trainer: {error}") from None
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray], steps: int) -> None:
        self.worker.exchange("load_state", {"state": arrays}, False, trainer=self.id, steps=int(steps))
        self.steps = int(steps)

    def _losses(self, op: str, reply: dict[str, Any]) -> LossValues:
        """The losses of a reply: as many numbers as ``LossValues`` has fields."""
        values = reply.get("losses")
        if not (isinstance(values, list) and len(values) == len(LossValues._fields) and all(map(_is_number, values))):
            raise self.worker.failure(f"its reply to {op!r} gives losses {str(values)[:200]}")
        return LossValues(*map(float, values))

    def _checked(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return check_batch(self.config, batch)  # here, before the worker sees it


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _is_flag(value: object) -> bool:
    return isinstance(value, bool)


def _texts(value: object, pairs: bool = False) -> bool:
    """A JSON list of strings (of two-string lists, with ``pairs``)."""
    if not isinstance(value, list):
        return False
    if pairs:
        return all(isinstance(item, list) and len(item) == 2 and all(map(_is_text, item)) for item in value)
    return all(map(_is_text, value))


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _is_epsilon(value: object) -> bool:
    return _is_number(value) and 0 < value < 1  # type: ignore[operator]  # a number, checked just before


def _first(names: dict[str, Any]) -> str:
    """The first few of ``names`` and how many in all, for a message."""
    return f"{list(names)[:3]}{f' ({len(names)} in all)' if len(names) > 3 else ''}"


def _like(array: np.ndarray, parameter: np.ndarray | None) -> bool:
    """Whether ``array`` has ``parameter``'s shape and dtype."""
    return parameter is not None and (array.shape, array.dtype) == (parameter.shape, parameter.dtype)


def _plain_totals(totals: BatchTotals | None) -> list[float] | None:
    return None if totals is None else [float(value) for value in totals]
