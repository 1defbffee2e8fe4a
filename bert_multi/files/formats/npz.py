"""bert_multi's own files as checkpoint formats: the weight file (an ``.npz`` with a manifest,
``bert_multi.spec.weight_file``), which records the whole config, so nothing needs stating; and the
training state ``bert-multi pretrain`` keeps (``--checkpoint-dir``: ``state.npz``,
``bert_multi.spec.training_state``), the file or its directory, whose weights and config are read and its
optimizer's state left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...errors import WeightsError
from ...spec.config import BERTConfig
from ...spec.training_state import STATE_FILE, is_training_state, read_training_state
from ...spec.weight_file import MANIFEST_KEY, load_weights, save_weights
from .base import CheckpointFormat, Probe, Raw, is_regular_file, no_key


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
        try:
            config, weights = load_weights(path)
        except WeightsError:
            if is_training_state(path):  # a run's state.npz, or a copy: the same file format, another manifest
                return _weights_of_state(self.kind, path)
            raise
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


class PretrainingRun(CheckpointFormat):
    kind = "pretrain-run"
    description = "bert-multi pretrain's checkpoint directory (--checkpoint-dir: state.npz)"
    directory = True
    marker_files = (STATE_FILE,)

    def recognizes(self, probe: Probe) -> bool:
        return is_regular_file(probe.path / STATE_FILE)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        return _weights_of_state(self.kind, path / STATE_FILE)


def _weights_of_state(kind: str, path: Path) -> Raw:
    """The weights and config of the training state at ``path``, its optimizer's state said to be left out."""
    state = read_training_state(path)
    note = (
        f"read the weights of bert-multi pretrain's training state at step {state.step}; its optimizer's state "
        f"({len(state.optimizer)} arrays) left out"
    )
    return Raw(kind, None, state.weights, {}, [note], config=state.config)


FORMAT = CanonicalWeights()
RUN = PretrainingRun()
