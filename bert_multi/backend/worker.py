"""The worker that runs a backend for a process in another Python environment (``remote``):
``python -m bert_multi.backend.worker``. One JSON request per line on stdin, one JSON reply per line
on stdout; arrays travel in the files the requests name. It ends when its stdin closes.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

import numpy as np

from ..ending import end_process
from ..spec.config import BERTConfig
from ..spec.loss import BatchTotals
from .channel import HEARTBEAT_VARIABLE, read_arrays
from .contract import BackendModel, CaseGroups
from .memory import release_memory
from .registry import LoadedBackend, load_backend


class Session:
    """The backend this worker serves and the models it holds, by number."""

    def __init__(self) -> None:
        self.backend: LoadedBackend | None = None
        self.models: dict[int, BackendModel] = {}
        self.trainers: dict[int, Any] = {}
        self.numbers = itertools.count()

    def load(self, backend: str) -> dict[str, Any]:
        self.backend = load_backend(backend)
        # The framework, imported for the worker's life, is left out of every later collection, as the
        # engine leaves what existed before its run: each then takes microseconds, not 45 ms (JAX).
        gc.freeze()
        rules = [list(rule) for rule in self.backend.name_rules]
        files = all(callable(getattr(self.backend.module, own, None)) for own in ("save_checkpoint", "read_checkpoint"))
        return {
            "checkpoints": files,
            "prepares": self.backend.prepares,
            "trains": self.backend.can_train,
            "mixed_precisions": list(self.backend.mixed_precisions),
            "role": self.backend.role,
            "label": self.backend.label,
            "devices": self.backend.devices(),
            "name_rules": rules,
        }

    def supports(self, config: dict[str, Any], device: str) -> dict[str, Any]:
        return {"reason": self._loaded().supports(BERTConfig.from_dict(config), device)}

    def kernel_eps(self, eps: float) -> dict[str, Any]:
        return {"eps": self._loaded().kernel_eps(eps)}

    def prepare(
        self, config: dict[str, Any], inputs: str, layout: list[Any], dtypes: list[str], device: str
    ) -> dict[str, Any]:
        arrays = read_arrays(inputs)
        groups: CaseGroups = [
            (int(max_len), [{name: arrays[f"{g}/{b}/{name}"] for name in names} for b, names in enumerate(batches)])
            for g, (max_len, batches) in enumerate(layout)
        ]
        # Nothing to give back: compiling holds no weights, and collecting after each took 15 ms (JAX).
        self._loaded().prepare(BERTConfig.from_dict(config), groups, dtypes, device)
        return {}

    def build(
        self, config: dict[str, Any], weights: str, device: str, dtype: str | None, options: dict[str, Any]
    ) -> dict[str, Any]:
        # An open .npz reads each tensor when the build asks for it, so a build that copies each into its
        # framework (JAX: every one) holds the copies and one received tensor at a time, never both sets.
        with np.load(weights, allow_pickle=False) as received:
            model = self._loaded().build(BERTConfig.from_dict(config), received, device, dtype, **options)
        release_memory()  # the weights received, where the model copied them
        return self._held(model)

    def cut(self, model: int, max_len: int) -> dict[str, Any]:
        made = self.models[model].cut(max_len)
        return {"model": None} if made is None else self._held(made)

    def _held(self, model: BackendModel) -> dict[str, Any]:
        """A model now held here, under a number of its own, as the caller's ``RemoteModel`` knows it."""
        number = next(self.numbers)
        self.models[number] = model
        recorded = None if model.recorded is None else list(model.recorded)
        info = {key: _plain(value) for key, value in model.framework_info().items()}
        return {"model": number, "dtype": model.dtype, "device": str(model.device), "recorded": recorded, "info": info}

    def forward(self, model: int, inputs: str, out: str, intermediates: bool) -> dict[str, Any]:
        result = self.models[model](**read_arrays(inputs), intermediates=intermediates)
        arrays = {name: a for name, a in (("encoded", result.encoded), ("mlm", result.mlm), ("nsp", result.nsp))}
        names = None
        if result.intermediates is not None:
            names = list(result.intermediates)
            arrays.update({f"intermediates/{name}": a for name, a in result.intermediates.items()})
        np.savez(out, **{name: array for name, array in arrays.items() if array is not None})
        return {"intermediates": names}

    def export(self, model: int, out: str) -> dict[str, Any]:
        np.savez(out, **self.models[model].export_weights(share=True))
        return {}

    def save(self, model: int, path: str) -> dict[str, Any]:
        self.models[model].save(path)
        return {}

    def save_checkpoint(self, path: str, config: dict[str, Any], weights: str) -> dict[str, Any]:
        self._loaded().save_checkpoint(path, BERTConfig.from_dict(config), read_arrays(weights))
        return {}

    def read_checkpoint(self, path: str, key: str | None, out: str) -> dict[str, Any]:
        arrays, dtypes, notes = self._loaded().read_checkpoint(path, key)
        np.savez(out, **arrays)
        return {"dtypes": dtypes, "notes": notes}

    def trainer(self, model: int, options: dict[str, Any]) -> dict[str, Any]:
        number = next(self.numbers)
        self.trainers[number] = self._loaded().trainer(self.models[model], **options)
        return {"trainer": number}

    def seed(self, trainer: int, value: int) -> dict[str, Any]:
        self.trainers[trainer].seed(value)
        return {}

    def loss(self, trainer: int, batch: str) -> dict[str, Any]:
        return {"losses": list(self.trainers[trainer].loss(read_arrays(batch)))}

    def step(self, trainer: int, batch: str, totals: list[float] | None) -> dict[str, Any]:
        return {"losses": list(self.trainers[trainer].step(read_arrays(batch), _totals(totals)))}

    def gradients(self, trainer: int, batch: str, totals: list[float] | None, out: str) -> dict[str, Any]:
        losses, gradients = self.trainers[trainer].gradients(read_arrays(batch), _totals(totals))
        np.savez(out, **gradients)
        return {"losses": list(losses)}

    def state(self, trainer: int, out: str) -> dict[str, Any]:
        np.savez(out, **self.trainers[trainer].state())
        return {}

    def load_state(self, trainer: int, state: str, steps: int) -> dict[str, Any]:
        self.trainers[trainer].load_state(read_arrays(state), steps)
        return {}

    def drop(self, model: int) -> dict[str, Any]:
        self.models.pop(model, None)
        self.trainers.pop(model, None)
        release_memory()  # as the engine does in its own process: without it JAX's worker peaked at 3.3 GB
        return {}

    def _loaded(self) -> LoadedBackend:
        if self.backend is None:
            raise RuntimeError("no backend loaded: the first request must be 'load'")
        return self.backend


OPERATIONS = (
    "load",
    "prepare",
    "supports",
    "kernel_eps",
    "build",
    "cut",
    "forward",
    "export",
    "save",
    "save_checkpoint",
    "read_checkpoint",
    "trainer",
    "seed",
    "loss",
    "step",
    "gradients",
    "state",
    "load_state",
    "drop",
)


def _totals(values: list[float] | None) -> BatchTotals | None:
    """The ``BatchTotals`` a request carries as a list."""
    return None if values is None else BatchTotals(float(values[0]), int(values[1]), int(values[2]))


def _plain(value: object) -> object:
    """A value a JSON reply can carry."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


MAX_ERROR_TEXT = 64 << 10  # of an error's message and of its traceback, each: the caller bounds a reply


@contextlib.contextmanager
def heartbeat(reply: Callable[[dict[str, Any]], None], interval: float) -> Iterator[None]:
    """While a request runs, say every ``interval`` seconds that the worker is alive, so that its caller
    tells a long build or step from a worker that hangs."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval):
            reply({"alive": True})

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        yield
    finally:
        done.set()
        beating.join()


def serve(requests: Iterable[str], reply: Callable[[dict[str, Any]], None], interval: float = 5.0) -> None:
    """Answer each request line until they end."""
    session = Session()
    for line in requests:
        number = None  # the request's number, which its reply carries: a reply is never taken for another's
        try:
            request = json.loads(line)
            number = request.pop("id", None)
            op = request.pop("op")
            if op not in OPERATIONS:
                raise ValueError(f"unknown request {op!r}: expected one of {OPERATIONS}")
            with heartbeat(reply, interval):
                answer = getattr(session, op)(**request)
            reply({"ok": True, "id": number, **answer})
        except Exception as error:  # noqa: BLE001 - every error goes back to the caller, who decides
            reply(
                {
                    "id": number,
                    "ok": False,
                    "type": type(error).__name__,
                    "message": str(error)[:MAX_ERROR_TEXT],
                    "traceback": traceback.format_exc()[-MAX_ERROR_TEXT:],
                }
            )


def main() -> None:
    os.environ["BERT_MULTI_WORKER"] = "1"
    # The protocol has stdout to itself: whatever else writes there (a framework's notices) goes to stderr.
    channel: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    lock = threading.Lock()  # a heartbeat and a reply never share a line

    def reply(message: dict[str, Any]) -> None:
        with lock:
            channel.write(json.dumps(message) + "\n")

    serve(sys.stdin, reply, float(os.environ.get(HEARTBEAT_VARIABLE, "5")))
    end_process(0)


if __name__ == "__main__":
    main()
