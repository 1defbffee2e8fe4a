"""bert_multi's own files as checkpoint formats: the weight file (an ``.npz`` with a manifest,
``bert_multi.spec.weight_file``), which records the whole config, so nothing needs stating; and the
training state ``bert-multi pretrain`` keeps (``--checkpoint-dir``: ``state.npz``,
``bert_multi.spec.training_state``), the file or its directory, whose weights and config are read and its
optimizer's state left out. And an ``.npz`` of named arrays without a manifest (``np.savez(path,
**state_dict)``, how a model's weights are often carried between frameworks), read as a state_dict is."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import WeightsError
from ...safe_files import NpzReader, file_size, open_regular
from ...spec.config import BERTConfig
from ...spec.training_state import STATE_FILE, is_training_state, read_training_state
from ...spec.weight_file import MANIFEST_KEY, load_weights, save_weights
from .alone import by_their_names
from .base import MAX_TENSORS, MAX_ZIP_RATIO, CheckpointFormat, Probe, Raw, is_regular_file, no_key

NUMERIC = "fiub"  # the dtype kinds a state_dict holds: weights, and integer buffers (transformers' position_ids)


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


class NamedArrays(CheckpointFormat):
    kind = "npz-arrays"
    description = "NumPy .npz of named arrays (np.savez of a state_dict; no bert_multi manifest)"
    holds_transformers_names = True

    def recognizes(self, probe: Probe) -> bool:
        # Any other .npz is the canonical reader's, which says precisely what is wrong with it.
        return probe.path.suffix.lower() == ".npz" and _holds_arrays_alone(probe.path)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        with open_regular(path, "NumPy .npz", WeightsError) as file:
            bound = MAX_ZIP_RATIO * file_size(file) + (1 << 20)  # np.savez_compressed's too, bounded
            archive = NpzReader(file, path, WeightsError, max_compressed_bytes=bound)
            if len(archive.names) > MAX_TENSORS:
                raise WeightsError(f"{path}: {len(archive.names)} arrays; a BERT's state_dict holds hundreds")
            arrays, dtypes = {}, {}
            for name in archive.names:
                header = archive.header(name)
                if header.dtype.kind not in NUMERIC:
                    raise WeightsError(f"{path}: array {name!r} has dtype {header.dtype}; a state_dict holds numbers")
                array = archive.read(name, header)
                arrays[name], dtypes[name] = array.astype(array.dtype.newbyteorder("="), copy=False), header.dtype.name
        note = "read the .npz's arrays by their names, as a state_dict's: it has no bert_multi manifest, nor a config"
        return by_their_names(self.kind, arrays, dtypes, [note])


def _holds_arrays_alone(path: Path) -> bool:
    """Whether the zip at ``path`` holds .npy members and no manifest: np.savez's, not bert_multi's."""
    try:
        with open_regular(path, "NumPy .npz", WeightsError) as file, zipfile.ZipFile(file) as archive:
            names = archive.namelist()
    except Exception:  # noqa: BLE001 - zipfile raises many types on hostile input; the canonical reader explains
        return False
    return bool(names) and f"{MANIFEST_KEY}.npy" not in names and all(name.endswith(".npy") for name in names)


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
ARRAYS = NamedArrays()
RUN = PretrainingRun()
