"""Backends in another Python environment: a worker process of that interpreter runs the backend, and
weights go in and outputs come back through files (``.npz`` arrays, read without pickle, in a
directory of the caller's own), so one run compares frameworks that cannot share an environment (MXNet 1.9.1 needs
NumPy < 1.24; JAX needs more).

The registry uses this when a built-in backend's framework cannot import here: it looks for the
interpreter of the environment where the project installs that framework (``Registration.environment``,
beside the source tree or the working directory), or the one named by ``BERT_MULTI_PYTHON_<NAME>``
(``BERT_MULTI_PYTHON_JAX=/path/to/python``; ``none``: never elsewhere) or ``use_python``. The worker is ``python -m
bert_multi.backend.worker``, with this source tree first on its path. A remote backend offers what
conformance needs (building, running with activations, exporting weights, its devices and eps), its
framework's checkpoint files (written and read there) and its ``Pretrainer`` (``RemoteTrainer``),
driven step by step from here (so the batches, seeds and checkpoints are the caller's own);
data-parallel workers and users' models stay in the framework's own environment.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from .. import errors
from ..errors import BackendUnavailable, UsageError
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.loss import BatchTotals, LossValues, check_batch
from .contract import BackendModel, BERTOutput, parse_device, read_only

# Set in a worker: a backend that cannot load there is unavailable, never sent on to yet another process.
WORKER_VARIABLE = "BERT_MULTI_WORKER"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the bert_multi package
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


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` the worker or its caller wrote, in order, without pickle."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


class RemoteFailure(RuntimeError):
    """What a worker raised that is not one of bert_multi's own exceptions, with its traceback there."""


def worker_environment() -> dict[str, str]:
    """The environment of a process run in another environment on this one's behalf: this source tree
    first on its path, and marked as such (``WORKER_VARIABLE``: it never sends work on again)."""
    path = os.pathsep.join([str(SOURCE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, WORKER_VARIABLE: "1"}


class Worker:
    """One worker process: a JSON request per line on its stdin, a JSON reply per line on its stdout,
    arrays in files of a private directory. Its stderr goes to a log, quoted when it fails."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.directory = tempfile.TemporaryDirectory(prefix="bert_multi-worker-")
        self.log = open(Path(self.directory.name) / "stderr.log", "w+b")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [str(python), "-m", "bert_multi.backend.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=worker_environment(),
            text=True,
        )
        self.lock = threading.Lock()
        self.files = itertools.count()
        atexit.register(self.close)

    def path(self, kind: str) -> Path:
        """A new file name in the worker's directory."""
        return Path(self.directory.name) / f"{kind}-{next(self.files)}.npz"

    def exchange(
        self, op: str, sent: dict[str, dict[str, np.ndarray]], received: bool, **arguments: Any
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``call`` with arrays: each of ``sent`` written to a file named by that argument, and, if
        ``received``, the arrays the worker writes to the file named by ``out``; the files removed after."""
        paths = {argument: self.path(argument) for argument in sent}
        if received:
            paths["out"] = self.path("out")
        try:
            for argument, arrays in sent.items():
                np.savez(paths[argument], **arrays)
            reply = self.call(op, **arguments, **{argument: str(path) for argument, path in paths.items()})
            return reply, read_arrays(paths["out"]) if received else {}
        finally:
            for path in paths.values():
                path.unlink(missing_ok=True)

    def call(self, op: str, **arguments: Any) -> dict[str, Any]:
        """Send one request and return its reply; the worker's exception raised here as the same
        bert_multi exception, or a ``RemoteFailure`` with its traceback."""
        assert self.process.stdin is not None and self.process.stdout is not None
        with self.lock:
            try:
                self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
                self.process.stdin.flush()
                line = self.process.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
        if not line:
            raise RemoteFailure(f"the worker ({self.python}) ended: {self._log_tail()}")
        reply = json.loads(line)
        if reply.get("ok"):
            return dict(reply)
        raise _exception(reply)

    def drop(self, model: int) -> None:
        """Forget a model the worker holds (its memory is freed there)."""
        if self.process.poll() is None:
            try:
                self.call("drop", model=model)
            except RemoteFailure:
                pass

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()  # end of requests: the worker exits
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.log.close()
        self.directory.cleanup()

    def _log_tail(self) -> str:
        self.process.poll()
        self.log.flush()
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        return " / ".join(lines[-3:]) or f"exit code {self.process.returncode}, nothing on stderr"


def _exception(reply: dict[str, Any]) -> Exception:
    """The exception a worker's error reply stands for: bert_multi's own class where it is one."""
    kind, message = str(reply.get("type")), str(reply.get("message"))
    own = getattr(errors, kind, None)
    if isinstance(own, type) and issubclass(own, Exception) and own.__module__ == errors.__name__:
        return own(message)
    return RemoteFailure(f"{kind}: {message}\nin the worker:\n{reply.get('traceback', '')}")


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
        self.NAME, self.ROLE, self.LABEL = name, described["role"], described["label"]
        self.NAME_RULES = [tuple(rule) for rule in described["name_rules"]]
        self.ENVIRONMENT = str(python)
        self._devices: list[str] = described["devices"]
        if described["checkpoints"]:  # its framework's own files, written and read there
            self.save_checkpoint, self.read_checkpoint = self._save_checkpoint, self._read_checkpoint
        if described["trains"]:  # a Pretrainer that offers what the worker's does
            offers = {"MIXED_PRECISION": tuple(described["mixed_precisions"])}
            self.Pretrainer = type("RemoteTrainer", (RemoteTrainer,), offers)

    def devices(self) -> list[str]:
        return list(self._devices)

    def supports(self, config: BERTConfig, device: str = "cpu") -> str | None:
        reason = self.worker.call("supports", config=config.to_dict(), device=device)["reason"]
        return None if reason is None else str(reason)

    def kernel_eps(self, eps: float) -> float:
        return float(self.worker.call("kernel_eps", eps=eps)["eps"])

    def build(
        self, config: BERTConfig, weights: dict[str, np.ndarray], device: str = "cpu", dtype: object = None, **options
    ) -> RemoteModel:
        """The worker's model of ``config`` holding ``weights``."""
        dtype = None if dtype is None else str(np.dtype(dtype))  # type: ignore[call-overload]
        reply, _ = self.worker.exchange(
            "build", {"weights": weights}, False, config=config.to_dict(), device=device, dtype=dtype, options=options
        )
        return RemoteModel(self, config, reply)

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
        return arrays, dict(reply["dtypes"]), list(reply["notes"])


class RemoteModel(BackendModel):
    """A model living in a worker; inputs are checked here, before the worker sees them."""

    module = None

    def __init__(self, backend: RemoteBackend, config: BERTConfig, reply: dict[str, Any]) -> None:
        super().__init__(config, reply["dtype"], parse_device(reply["device"]))
        self.backend, self.worker, self.id = backend.NAME, backend.worker, int(reply["model"])
        self.recorded = None if reply["recorded"] is None else tuple(reply["recorded"])
        self.info: dict[str, object] = {**reply["info"], "python": backend.ENVIRONMENT}
        weakref.finalize(self, self.worker.drop, self.id)

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        given = {name: array for name, array in inputs._asdict().items() if array is not None}
        reply, arrays = self.worker.exchange(
            "forward", {"inputs": given}, True, model=self.id, intermediates=intermediates
        )
        record = None
        if reply["intermediates"] is not None:
            record = {name: arrays.get(f"intermediates/{name}") for name in reply["intermediates"]}
        return BERTOutput(arrays["encoded"], arrays.get("mlm"), arrays.get("nsp"), record)

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        _, weights = self.worker.exchange("export", {}, True, model=self.id)
        return {name: read_only(array) for name, array in weights.items()} if share else weights

    def framework_info(self) -> dict[str, object]:
        return dict(self.info)


class RemoteTrainer:
    """The worker's ``Pretrainer`` of a ``RemoteModel``: each call sends its batch and returns what the
    trainer there returned (losses, canonical gradients, the optimizer state)."""

    MIXED_PRECISION: tuple[str, ...] = ()

    def __init__(self, model: RemoteModel, **options: Any) -> None:
        self.model, self.config, self.worker = model, model.config, model.worker
        self.id = int(self.worker.call("trainer", model=model.id, options=options)["trainer"])
        weakref.finalize(self, self.worker.drop, self.id)

    def seed(self, value: int) -> None:
        self.worker.call("seed", trainer=self.id, value=int(value))

    def loss(self, batch: dict[str, np.ndarray]) -> LossValues:
        reply, _ = self.worker.exchange("loss", {"batch": self._checked(batch)}, False, trainer=self.id)
        return LossValues(*reply["losses"])

    def step(self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None) -> LossValues:
        sent = {"batch": self._checked(batch)}
        reply, _ = self.worker.exchange("step", sent, False, trainer=self.id, totals=_plain_totals(totals))
        return LossValues(*reply["losses"])

    def gradients(
        self, batch: dict[str, np.ndarray], totals: BatchTotals | None = None
    ) -> tuple[LossValues, dict[str, np.ndarray]]:
        sent = {"batch": self._checked(batch)}
        reply, arrays = self.worker.exchange("gradients", sent, True, trainer=self.id, totals=_plain_totals(totals))
        return LossValues(*reply["losses"]), arrays

    def state(self) -> dict[str, np.ndarray]:
        return self.worker.exchange("state", {}, True, trainer=self.id)[1]

    def load_state(self, arrays: dict[str, np.ndarray], steps: int) -> None:
        self.worker.exchange("load_state", {"state": arrays}, False, trainer=self.id, steps=int(steps))

    def _checked(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return check_batch(self.config, batch)  # here, before the worker sees it


def _plain_totals(totals: BatchTotals | None) -> list[float] | None:
    return None if totals is None else [float(value) for value in totals]
