"""The whole state of a pretraining run in one file, replaced atomically: weights, the optimizer's
state, the step and the settings, so that a run killed at any moment goes on where it stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import WeightsError
from ..safe_files import NpzReader, open_regular, size_field
from .config import BERTConfig
from .optimizer import adam_stepped, check_optimizer_state
from .schema import validate_weights
from .weight_file import MANIFEST_KEY, read_json_manifest, write_npz

STATE_FILE = "state.npz"
STATE_FORMAT = "bert_multi.training_state"


class TrainingState(NamedTuple):
    """Everything a run needs to go on after ``step`` steps: the weights, the optimizer's state (canonical
    arrays, see each backend's ``Pretrainer.state``) and the settings that drew its batches."""

    step: int
    config: BERTConfig
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    settings: dict


def save_training_state(directory: str | os.PathLike, state: TrainingState) -> Path:
    """``directory/state.npz``, replaced atomically: a run killed at any moment, even while writing it,
    leaves the previous state whole. The batches' position is the step (they are drawn from the seed)."""
    manifest = {"format": STATE_FORMAT, "format_version": 1, "step": state.step, "config": state.config.to_dict()}
    manifest["settings"] = state.settings
    check_optimizer_state(state.weights, state.optimizer, adam_stepped(state.settings.get("optimizer"), state.step))
    arrays = {f"weights.{name}": array for name, array in state.weights.items()}
    arrays.update({f"optimizer.{name}": array for name, array in state.optimizer.items()})
    path = Path(directory) / STATE_FILE
    write_npz(path, manifest, arrays)
    return path


def load_training_state(directory: str | os.PathLike) -> TrainingState | None:
    """The state ``save_training_state`` left in ``directory``, or None if there is none. A file that is
    not one, or is damaged, is a ``WeightsError`` naming it."""
    path = Path(directory) / STATE_FILE
    if not os.path.lexists(path):  # there is none; a link to nothing is a broken state, not none
        return None
    return read_training_state(path)


def is_training_state(path: str | os.PathLike) -> bool:
    """Whether the ``.npz`` at ``path`` says it is a training state (its manifest's format), read no further;
    False for anything that cannot say so."""
    try:
        with open_regular(path, "training state", WeightsError) as file:
            manifest = read_json_manifest(Path(path), NpzReader(file, Path(path), WeightsError), "training state")
    except WeightsError:
        return False
    return manifest.get("format") == STATE_FORMAT


def read_training_state(path: str | os.PathLike) -> TrainingState:
    """The training state in the file at ``path`` (a run's ``state.npz``, or a copy of it), every part
    checked; a ``WeightsError`` naming the file for anything else."""
    path = Path(path)
    with open_regular(path, "training state", WeightsError) as file:
        archive = NpzReader(file, path, WeightsError)
        manifest = read_json_manifest(path, archive, "training state")
        try:
            if manifest.get("format") != STATE_FORMAT or manifest.get("format_version") != 1:
                raise ValueError(f"format {manifest.get('format')!r}, expected {STATE_FORMAT!r} version 1")
            step, settings = size_field(manifest["step"], "its step"), manifest["settings"]
            if not isinstance(settings, dict):
                raise ValueError("its settings are not a dict")
            config = BERTConfig.from_dict(manifest["config"])
        except (ValueError, TypeError, KeyError) as error:
            raise WeightsError(f"{path}: not a readable training state: {error}") from None
        arrays = {name: archive.read(name, archive.header(name)) for name in archive.names if name != MANIFEST_KEY}
    weights = {name[len("weights.") :]: array for name, array in arrays.items() if name.startswith("weights.")}
    optimizer = {name[len("optimizer.") :]: array for name, array in arrays.items() if name.startswith("optimizer.")}
    try:
        validate_weights(config, weights)
        check_optimizer_state(weights, optimizer, adam_stepped(settings.get("optimizer"), step))
    except WeightsError as error:
        raise WeightsError(f"{path}: {error}") from None
    return TrainingState(step, config, weights, optimizer, settings)
