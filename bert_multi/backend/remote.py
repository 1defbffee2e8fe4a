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
import collections
import itertools
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from .. import errors
from ..errors import BackendUnavailable, UsageError, WorkerFailed
from ..files.safe import NpzReader, open_regular
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..spec.loss import BatchTotals, LossValues, check_batch
from ..spec.optimizer import check_optimizer_state
from ..spec.schema import param_shapes, validate_weights
from .contract import BackendModel, BERTOutput, parse_device, read_only

# Set in a worker: a backend that cannot load there is unavailable, never sent on to yet another process.
WORKER_VARIABLE = "BERT_MULTI_WORKER"
# How long one request may take, in seconds ("none": no limit), and how often a working worker says it is
# alive: one that says nothing for SILENCE_S is stopped before its deadline (stopped, or stuck holding
# the interpreter). A hung worker costs at most the shorter of the two.
TIMEOUT_VARIABLE = "BERT_MULTI_WORKER_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
HEARTBEAT_VARIABLE = "BERT_MULTI_WORKER_HEARTBEAT"
HEARTBEAT_S = 5.0
SILENCE_S = 60.0
# What a reply may hold: its JSON line, the end of the worker's stderr kept for messages, and its arrays
# (uncompressed, as np.savez writes them, so their size is bounded by the files' real sizes).
MAX_REPLY_LINE_BYTES = 4 << 20
STDERR_TAIL_BYTES = 64 << 10
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


class DamagedFile(Exception):
    """An array file between a worker and its caller that is not what ``np.savez`` writes (its reader
    turns it into a ``RemoteFailure`` naming the worker)."""


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` the worker or its caller wrote, in order: a regular file, read like any
    other file (no pickle, no compression, every size checked before it is allocated)."""
    with open_regular(path, "array file", DamagedFile) as file:
        archive = NpzReader(file, path, DamagedFile)
        return {name: archive.read(name, archive.header(name)) for name in archive.names}


class RemoteFailure(WorkerFailed):
    """A worker of another environment failed: it raised what is not one of bert_multi's own exceptions
    (with its traceback there), died, hung past its deadline, or sent a reply that does not check out."""


def worker_timeout() -> float | None:
    """The longest one request may take, from ``BERT_MULTI_WORKER_TIMEOUT`` (seconds, or "none")."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UsageError(f"{TIMEOUT_VARIABLE}={text!r}: expected a number of seconds above 0, or 'none'")
    return value


def worker_environment() -> dict[str, str]:
    """The environment of a process run in another environment on this one's behalf: this source tree
    first on its path, and marked as such (``WORKER_VARIABLE``: it never sends work on again)."""
    path = os.pathsep.join([str(SOURCE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, WORKER_VARIABLE: "1"}


class Worker:
    """One worker process: a JSON request per line on its stdin, a JSON reply per line on its stdout
    (``{"alive": true}`` lines while it works), arrays in files of a private directory. Every exchange is
    bounded: in time (``worker_timeout``, and ``SILENCE_S`` without a sign of life), in size (a reply
    line, the arrays its files hold, the end of its stderr kept for messages) and in kind (regular
    files). A worker that fails any bound, dies, or is interrupted (Ctrl-C) is stopped and its directory
    removed; every later request is refused at once, saying why."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.timeout = worker_timeout()
        self.directory = tempfile.TemporaryDirectory(prefix="bert_multi-worker-")
        heartbeat = str(HEARTBEAT_S if self.timeout is None else min(HEARTBEAT_S, self.timeout / 4))
        self.process = subprocess.Popen(
            [str(python), "-m", "bert_multi.backend.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**worker_environment(), HEARTBEAT_VARIABLE: heartbeat},
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self.stopped: str | None = None  # why the worker was stopped, once it is
        self.pending = b""  # what the worker wrote past the last reply line read
        self.stderr_tail: collections.deque[bytes] = collections.deque()
        self.stderr_reader = threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True)
        self.stderr_reader.start()
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
            if not received:
                return reply, {}
            try:
                return reply, read_arrays(paths["out"])
            except DamagedFile as error:
                raise self.failure(f"its reply to {op!r} is damaged: {error}") from None
        finally:
            for path in paths.values():
                path.unlink(missing_ok=True)

    def call(self, op: str, **arguments: Any) -> dict[str, Any]:
        """Send one request and return its reply; the worker's exception raised here as the same
        bert_multi exception, or a ``RemoteFailure`` with its traceback."""
        with self.lock:
            if self.stopped:
                raise RemoteFailure(f"the worker ({self.python}) was stopped: {self.stopped}")
            try:
                reply = self._request(op, json.dumps({"op": op, **arguments}).encode() + b"\n")
            except BaseException as error:  # Ctrl-C or a failure: the worker's state is unknown, so it goes
                self.stop(f"interrupted while running {op!r}" if isinstance(error, KeyboardInterrupt) else str(error))
                raise
        if reply.get("ok") is True:
            return reply
        if reply.get("ok") is False:
            raise _exception(reply)
        raise self.failure(f"its reply to {op!r} is not one: {str(reply)[:200]}")

    def failure(self, what: str) -> RemoteFailure:
        """A ``RemoteFailure`` naming the worker; the worker, no longer trusted, is stopped."""
        error = RemoteFailure(f"the worker ({self.python}) failed: {what}")
        self.stop(what)
        return error

    def _request(self, op: str, line: bytes) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(line)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RemoteFailure(self._ended()) from None
        started = last_sign = time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in self.pending:
                    text, self.pending = self.pending.split(b"\n", 1)
                    try:
                        message = json.loads(text)
                    except ValueError:
                        raise RemoteFailure(
                            f"the worker ({self.python}) sent a line that is not JSON in reply to {op!r}: "
                            f"{text[:200]!r}"
                        ) from None
                    if not isinstance(message, dict):
                        raise RemoteFailure(f"the worker ({self.python}) sent {str(message)[:200]} in reply to {op!r}")
                    if message.get("alive") is not True:
                        return message
                    last_sign = time.monotonic()
                if len(self.pending) > MAX_REPLY_LINE_BYTES:
                    raise RemoteFailure(
                        f"the worker ({self.python}) sent a reply to {op!r} of over {MAX_REPLY_LINE_BYTES} bytes"
                    )
                now = time.monotonic()
                waits = [last_sign + SILENCE_S - now]
                if self.timeout is not None:
                    waits.append(started + self.timeout - now)
                if min(waits) <= 0:
                    raise RemoteFailure(self._overdue(op, now - started, now - last_sign))
                if selector.select(min(waits)):
                    chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                    if not chunk:
                        raise RemoteFailure(self._ended())
                    self.pending += chunk

    def _overdue(self, op: str, running: float, silent: float) -> str:
        if silent >= SILENCE_S:
            return f"the worker ({self.python}) said nothing for {silent:.0f} s while running {op!r}; it was stopped"
        return (
            f"the worker ({self.python}) took over {self.timeout:g} s to run {op!r} ({TIMEOUT_VARIABLE}); "
            "it was stopped"
        )

    def _ended(self) -> str:
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.stderr_reader.join(timeout=5)
        return f"the worker ({self.python}) ended: {self._log_tail()}"

    def _drain(self, stream: Any) -> None:
        """Keep the last ``STDERR_TAIL_BYTES`` the worker writes to stderr (it may write without end)."""
        kept = 0
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            self.stderr_tail.append(chunk)
            kept += len(chunk)
            while kept - len(self.stderr_tail[0]) >= STDERR_TAIL_BYTES:
                kept -= len(self.stderr_tail.popleft())

    def drop(self, model: int) -> None:
        """Forget a model the worker holds (its memory is freed there)."""
        if self.process.poll() is None and not self.stopped:
            try:
                self.call("drop", model=model)
            except RemoteFailure:
                pass

    def stop(self, why: str) -> None:
        """End the worker now and remove its directory; later requests are refused, saying ``why``."""
        self.stopped = self.stopped or why
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.directory.cleanup()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()  # end of requests: the worker exits
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.stopped = self.stopped or "it was closed"
        self.directory.cleanup()

    def _log_tail(self) -> str:
        """The last lines of the worker's stderr, each cut short, or how it ended."""
        text = b"".join(self.stderr_tail)[-STDERR_TAIL_BYTES:].decode(errors="replace")
        lines = [line if len(line) <= 300 else line[:300] + " ..." for line in text.strip().splitlines()[-3:]]
        return " / ".join(lines) or f"exit code {self.process.returncode}, nothing on stderr"


def _exception(reply: dict[str, Any]) -> Exception:
    """The exception a worker's error reply stands for: bert_multi's own class where it is one."""
    kind, message = str(reply.get("type")), str(reply.get("message"))
    return errors.carried(kind, message) or RemoteFailure(
        f"{kind}: {message}\nin the worker:\n{reply.get('traceback', '')}"
    )


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

    def framework_info(self) -> dict[str, object]:
        return dict(self.info)


class RemoteTrainer:
    """The worker's ``Pretrainer`` of a ``RemoteModel``: each call sends its batch and returns what the
    trainer there returned (losses, canonical gradients, the optimizer state)."""

    MIXED_PRECISION: tuple[str, ...] = ()

    def __init__(self, model: RemoteModel, **options: Any) -> None:
        self.model, self.config, self.worker = model, model.config, model.worker
        self.optimizer, self.steps = options.get("optimizer"), 0
        self.id = int(self.worker.call("trainer", model=model.id, options=options)["trainer"])
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
            check_optimizer_state(self.parameters, arrays, self.optimizer == "adam" and self.steps > 0)
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


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _first(names: dict[str, Any]) -> str:
    """The first few of ``names`` and how many in all, for a message."""
    return f"{list(names)[:3]}{f' ({len(names)} in all)' if len(names) > 3 else ''}"


def _like(array: np.ndarray, parameter: np.ndarray | None) -> bool:
    """Whether ``array`` has ``parameter``'s shape and dtype."""
    return parameter is not None and (array.shape, array.dtype) == (parameter.shape, parameter.dtype)


def _plain_totals(totals: BatchTotals | None) -> list[float] | None:
    return None if totals is None else [float(value) for value in totals]
