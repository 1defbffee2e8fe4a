"""Golden fixtures: small weights, the conformance inputs and their float64 oracle outputs, on disk.

With them a machine that has one framework only (a GPU box with PyTorch alone, say) proves conformance
without the oracle having to agree with anything else there. ``bert-multi fixtures`` rewrites them.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend.contract import BERTOutput, intermediate_names
from ..backend.registry import LoadedBackend, load_backend
from ..engine.cases import CASES, Batch
from ..engine.results import OUTPUT_NAMES, assert_conforms, shifted
from ..safe_files import atomic_path
from ..spec.config import BERTConfig
from ..spec.schema import random_weights
from ..spec.semantics import PRESETS
from ..spec.weight_file import load_weights, save_weights

DEFAULT_DIRECTORY = Path("conformance") / "fixtures"
SEED = 0
# Small on purpose (the files stay in the tens of kilobytes): two heads and two blocks, and one head,
# one block with a width that is not a power of two; then each earlier d2l generation, with two heads
# so that tiling valid_lens over them matters, and the original BERT.
FIXTURE_CONFIGS: dict[str, BERTConfig] = {
    "two_blocks": BERTConfig(vocab_size=23, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=2, max_len=8),
    "one_head": BERTConfig(vocab_size=19, num_hiddens=6, ffn_num_hiddens=10, num_heads=1, num_blks=1, max_len=7),
    "d2l_0_12": BERTConfig(17, 4, 6, 2, 1, max_len=7, semantics=PRESETS["d2l-0.12"]),
    "d2l_0_11": BERTConfig(17, 4, 6, 2, 1, max_len=7, semantics=PRESETS["d2l-0.11"]),
    "bert": BERTConfig(17, 4, 6, 2, 1, max_len=7, semantics=PRESETS["bert"]),
}
INPUT_FIELDS = ("tokens", "segments", "valid_lens", "pred_positions")


@dataclass(frozen=True)
class Fixture:
    name: str
    config: BERTConfig
    weights: dict[str, np.ndarray]
    cases: dict[str, tuple[Batch, BERTOutput]]  # case name -> (inputs, float64 oracle outputs)


def write_fixtures(directory: str | os.PathLike = DEFAULT_DIRECTORY) -> list[Path]:
    """Write each fixture config's weights and cases (inputs and oracle outputs); return the files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, config in FIXTURE_CONFIGS.items():
        weights = random_weights(config, seed=SEED, dtype="float64")
        written.append(save_weights(directory / f"{name}.weights.npz", config, weights))
        oracle = load_backend("numpy").build(config, weights)
        arrays: dict[str, np.ndarray] = {}
        for case in CASES:
            batch = case.batch(config, SEED)
            out = oracle(**batch, intermediates=True)
            arrays.update({f"{case.name}/inputs/{k}": v for k, v in batch.items() if v is not None})
            arrays.update(
                {f"{case.name}/outputs/{k}": getattr(out, k) for k in OUTPUT_NAMES if getattr(out, k) is not None}
            )
            recorded = out.intermediates or {}
            arrays.update({f"{case.name}/intermediates/{k}": v for k, v in recorded.items() if v is not None})
        path = directory / f"{name}.cases.npz"
        with atomic_path(path) as tmp_path, open(tmp_path, "wb") as file:
            np.savez_compressed(file, **arrays)
        written.append(path)
    return written


def read_fixtures(directory: str | os.PathLike = DEFAULT_DIRECTORY) -> list[Fixture]:
    """Every fixture in ``directory``, checked (weights) and read without unpickling anything."""
    fixtures = []
    for name in FIXTURE_CONFIGS:
        config, weights = load_weights(Path(directory) / f"{name}.weights.npz")
        with np.load(Path(directory) / f"{name}.cases.npz", allow_pickle=False) as archive:
            stored = {key: archive[key] for key in archive.files}
        cases = {}
        for case_name in sorted({key.split("/")[0] for key in stored}):
            part = {
                kind: {
                    key.split("/")[2]: value for key, value in stored.items() if key.startswith(f"{case_name}/{kind}/")
                }
                for kind in ("inputs", "outputs", "intermediates")
            }
            batch = {field: part["inputs"].get(field) for field in INPUT_FIELDS}
            intermediates = OrderedDict((k, part["intermediates"][k]) for k in intermediate_names(config))
            found = part["outputs"]
            outputs = BERTOutput(found["encoded"], found.get("mlm"), found.get("nsp"), intermediates)
            cases[case_name] = (batch, outputs)
        fixtures.append(Fixture(name, config, weights, cases))
    return fixtures


def fixture_failures(
    backend: LoadedBackend,
    fixtures: list[Fixture],
    device: str,
    dtype: str,
    progress: Callable[[int, int, str], None] | None = None,
    cases: Sequence[str] | None = None,
) -> list[str]:
    """Where ``backend`` on ``device`` in ``dtype`` misses the fixtures (their ``cases``, default all): one
    line per case out of the policy's tolerance (none: it matches them all). ``CannotRunHere`` if it cannot
    run there. The fixtures hold the oracle at the stated LayerNorm eps; for a framework whose kernels use
    another (MXNet's C float), the oracle's own difference between the two is added, as the engine does for
    pairs. ``progress(done, planned, label)`` hears of each fixture as it starts."""
    oracle = load_backend("numpy")
    failures = []
    for number, fixture in enumerate(fixtures):
        if progress:
            progress(number, len(fixtures), f"fixtures {dtype}: {fixture.name}")
        model = backend.build(fixture.config, fixture.weights, device=device, dtype=dtype)
        stated = fixture.config.semantics.layer_norm_eps
        own, at_stated = (
            oracle.build(fixture.config, fixture.weights, layer_norm_eps=eps)
            for eps in (backend.kernel_eps(stated), stated)
        )
        for case, (batch, expected) in fixture.cases.items():
            if cases is not None and case not in cases:
                continue
            if backend.kernel_eps(stated) != stated:
                expected = shifted(expected, own(**batch, intermediates=True), at_stated(**batch, intermediates=True))
            try:
                assert_conforms(model(**batch, intermediates=True), expected, dtype, device=device)
            except AssertionError as error:
                failures.append(f"{fixture.name}/{case} on {model}: {error}")
    return failures
