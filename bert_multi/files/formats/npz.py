"""bert_multi's own weight file (an ``.npz`` with a manifest, ``bert_multi.spec.weight_file``) as a
checkpoint format: it records the whole config, so nothing needs stating."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...spec.config import BERTConfig
from ...spec.weight_file import MANIFEST_KEY, load_weights, save_weights
from .base import CheckpointFormat, Probe, Raw, no_key


class CanonicalWeights(CheckpointFormat):
    kind = "npz"
    description = "bert_multi canonical weights (.npz with a manifest)"
    suffixes = (".npz",)
    zip_marker = f"a bert_multi .npz (no {MANIFEST_KEY})"

    def recognizes(self, probe: Probe) -> bool:
        # A file named .npz is read as canonical weights: that reader says precisely what is wrong with one.
        return probe.path.suffix.lower() == ".npz" or f"{MANIFEST_KEY}.npy" in probe.members

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        config, weights = load_weights(path)
        return Raw(self.kind, None, weights, {}, config=config)

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        save_weights(path, config, weights)


FORMAT = CanonicalWeights()
