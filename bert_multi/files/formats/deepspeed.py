"""DeepSpeed's checkpoint directory, as its engine's ``save_checkpoint(directory)`` writes it: ``latest`` names
the tag of the last save (``global_stepN``), a folder holding the model's states (a ``torch.save`` dict, the
model's state_dict under ``module``) beside the optimizer's. The model's states are read by PyTorch's reader
and the optimizer's passed over. At ZeRO stage 3 the model's states hold empty tensors, each rank keeping its
part of the weights among its optimizer's states: that checkpoint is named, with DeepSpeed's own command that
gathers the weights into a file bert_multi reads."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ...backend.registry import load_backend
from ...errors import WeightsError
from ...safe_files import open_regular
from .base import CheckpointFormat, Probe, Raw, control_character, is_directory, is_regular_file, no_key

LATEST = "latest"  # the tag of the last save, which DeepSpeed's own load_checkpoint reads too
MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO stages 0 to 2: the whole model, of model-parallel rank 0
PARTITIONED_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"  # stage 3: data-parallel rank 0's, empty
MODEL_PARALLEL = ("mp_rank_01_model_states.pt", "zero_pp_rank_0_mp_rank_01_model_states.pt")  # a second rank's
GATHERER = "zero_to_fp32.py"  # what DeepSpeed copies beside latest; also deepspeed.utils.zero_to_fp32
MAX_TAG_BYTES = 255  # a tag is a folder's name


class Checkpoint(CheckpointFormat):
    kind = "deepspeed"
    description = (
        "DeepSpeed checkpoint directory (save_checkpoint: latest and its global_stepN/ with "
        f"{MODEL_STATES}; or that folder)"
    )
    directory = True
    marker_files = (MODEL_STATES, PARTITIONED_STATES)
    holds_transformers_names = True  # DeepSpeed's users train transformers' models as often as their own

    def recognizes(self, probe: Probe) -> bool:
        # latest whatever it is but a folder (a run's "latest" link to its last checkpoint's, in other tools)
        path = probe.path
        latest = os.path.lexists(path / LATEST) and not is_directory(path / LATEST)
        return latest or any(is_regular_file(path / name) for name in (MODEL_STATES, PARTITIONED_STATES))

    def framework_of(self, path: Path) -> str | None:
        return "torch"  # its model's states are PyTorch's file

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)  # DeepSpeed's is always 'module'
        run, tag = _saved(path)
        folder = run / tag
        if any(is_regular_file(folder / name) for name in MODEL_PARALLEL):
            raise WeightsError(
                f"{path}: DeepSpeed's save {tag!r} splits its model among ranks of model parallelism "
                f"({MODEL_PARALLEL[0]} beside {MODEL_STATES}), which bert_multi does not join"
            )
        if not is_regular_file(folder / MODEL_STATES):
            if is_regular_file(folder / PARTITIONED_STATES):
                raise WeightsError(_partitioned(path, run, tag))
            raise WeightsError(f"{path}: DeepSpeed's save {tag!r} holds no {MODEL_STATES}, the model's states")
        arrays, dtypes, _ = load_backend("torch").read_checkpoint(folder / MODEL_STATES, "module")
        note = (
            f"read DeepSpeed's save {tag!r}: the model's state_dict under 'module' in its {MODEL_STATES}, the "
            "optimizer's states left out"
        )
        return Raw(self.kind, "torch", arrays, dtypes, [note])


def _saved(path: Path) -> tuple[Path, str]:
    """(the run's directory, the tag of the save to read): the one ``latest`` names, or the folder named."""
    if not os.path.lexists(path / LATEST):
        return path.parent, path.name
    with open_regular(path / LATEST, "DeepSpeed's latest", WeightsError) as file:
        data = file.read(MAX_TAG_BYTES + 1)
    try:
        tag = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        tag = ""
    bad = len(data) > MAX_TAG_BYTES or tag in ("", ".", "..") or "/" in tag or "\\" in tag or control_character(tag)
    if bad:
        raise WeightsError(
            f"{path / LATEST}: expected the tag of DeepSpeed's last save, a folder's name beside it (global_stepN); "
            f"it holds {data[:80]!r}"
        )
    if not is_directory(path / tag):
        raise WeightsError(f"{path / LATEST}: names the save {tag!r}, but {path} holds no folder of that name")
    return path, tag


def _partitioned(path: Path, run: Path, tag: str) -> str:
    """What a ZeRO stage 3 save is, and DeepSpeed's command that gathers its weights into one file."""
    script = run / GATHERER
    gather = (
        f"python {shlex.quote(str(script))}" if is_regular_file(script) else "python -m deepspeed.utils.zero_to_fp32"
    )
    command = f"{gather} {shlex.quote(str(run))} OUT --tag {shlex.quote(tag)}"
    return (
        f"{path}: DeepSpeed's save {tag!r} is of ZeRO stage 3: each rank keeps its part of the weights among its "
        f"optimizer's states, and the model's states ({PARTITIONED_STATES}) hold none. DeepSpeed gathers them: "
        f"{command}, then read OUT/pytorch_model.bin"
    )


def model_states(path: Path, keys: list[str]) -> str:
    """What a dict's top-level ``keys`` add to the message naming its state_dict, where it is DeepSpeed's model
    states (``ds_version`` beside ``module``): the directory that reads as DeepSpeed's checkpoint."""
    if not {"module", "ds_version"} <= set(keys):
        return ""
    return f"; it is DeepSpeed's model states: name its save's directory, {path.parent}, as DeepSpeed's checkpoint"


FORMAT = Checkpoint()
