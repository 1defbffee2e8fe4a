"""What ``bench`` times beside the models: the canonical weight file written and read beside NumPy's own
``.npz`` functions, and what ``verify`` costs beside a plain forward."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ...backend.registry import load_backend
from ...spec.config import BERTConfig
from ...spec.schema import SUPPORTED_DTYPES, random_weights
from ...spec.weight_file import load_weights, save_weights
from .results import Row
from .rounds import Progress, every_round, interleave


def file_rows(config: BERTConfig, shape: str, rounds: int, progress: Progress | None) -> list[Row]:
    """The canonical weight file written and read, beside NumPy's own .npz functions on the same arrays.
    save_weights also checks, hashes and fsyncs (a save that returned survives a power loss), so
    np.savez is timed with an fsync too; load_weights checks every header and hash as it reads."""
    weights = random_weights(config, seed=0, dtype="float32")
    nbytes = sum(array.nbytes for array in weights.values())
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        paths = {name: Path(directory) / f"{index}.npz" for index, name in enumerate(("bert_multi", "numpy", "+fsync"))}

        def savez(path: Path, durable: bool) -> None:
            with open(path, "wb") as file:
                np.savez(file, **weights)
                if durable:
                    file.flush()
                    os.fsync(file.fileno())

        saves = {
            "save_weights": lambda _: save_weights(paths["bert_multi"], config, weights),
            "np.savez + fsync": lambda _: savez(paths["+fsync"], durable=True),
            "np.savez": lambda _: savez(paths["numpy"], durable=False),
        }
        loads = {
            "load_weights": lambda _: load_weights(paths["bert_multi"]),
            "np.load": lambda _: [array for array in np.load(paths["numpy"], allow_pickle=False).values()],
        }
        for verb, calls in (("save", saves), ("load", loads)):
            workload = f"{verb} weights {shape}"
            timings, _ = interleave(calls, rounds, workload, progress)
            rows += [Row(workload, name, "float32", timings[name], 0, 0.0, None, nbytes) for name in calls]
    return rows


def verify_rows(config: BERTConfig, shape: str, rounds: int, progress: Progress | None) -> list[Row]:
    """What ``bert-multi verify`` costs beside a plain forward of the same model: d2l's PyTorch classes
    stand for the user's model (built by a factory, as a user's is), over the conformance cases in float32
    and float64; ``conform`` on the torch backend over the same cases is the engine's own cost."""
    from ...engine.cases import CASES
    from ...engine.conform import run_conformance
    from ...engine.results import Target
    from ...verify.session import verify

    torch_backend = load_backend("torch")
    weights = random_weights(config, seed=0, dtype="float64")
    cases = [case.input(config) for case in CASES]

    def factory(config: BERTConfig) -> Any:
        return torch_backend.BERTModel(*config.d2l_args(), semantics=config.semantics)

    def plain() -> None:  # one model per dtype, every case
        for dtype in SUPPORTED_DTYPES:
            model = torch_backend.build(config, weights, dtype=dtype, gradients=False)
            for case in cases:
                batch = case.batch
                model(batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])

    targets = [Target("torch", dtype) for dtype in SUPPORTED_DTYPES]
    calls = {
        "plain forward (torch)": every_round(plain),
        "conform --no-pairs (torch)": every_round(lambda: run_conformance(config, weights, targets, cases, False)),
        "verify": every_round(lambda: verify(factory, config, weights=weights)),
        "verify --gradients": every_round(lambda: verify(factory, config, weights=weights, gradients=True)),
    }
    workload = f"verify {shape}, {len(cases)} cases, float32+float64"
    timings, _ = interleave(calls, rounds, workload, progress)
    threads = torch_backend.build(config, weights, gradients=False).runtime_info().get("threads")
    return [Row(workload, name, "both", timings[name], 0, 0.0, None, threads=threads) for name in calls]
