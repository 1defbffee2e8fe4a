"""PyTorch's ``torch.save(net.state_dict())`` as a checkpoint format: a zip holding a pickle of the
structure (``data.pkl``) and the raw tensors, or (before PyTorch 1.6) the legacy format, pickles followed
by the tensors' bytes (``torch_legacy.py``). Reading it needs torch, whose reader the torch backend runs
with ``weights_only=True`` once the file's sizes are checked; its names are the canonical ones."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from ...backend.registry import load_backend
from ...errors import WeightsError
from .base import FrameworkFile, Probe
from .torch_legacy import is_legacy

BACKEND = "torch"  # whose own file it is


class StateDict(FrameworkFile):
    kind = "torch"
    description = "PyTorch state_dict file (torch.save)"
    framework = BACKEND
    suffixes = (".pt", ".pth")
    zip_marker = "a PyTorch checkpoint (no data.pkl)"
    holds_transformers_names = True

    def recognizes(self, probe: Probe) -> bool:
        return is_legacy(probe.head) or any(name.endswith("/data.pkl") or name == "data.pkl" for name in probe.members)

    def read_arrays(self, path: Path, key: str | None) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
        if _is_torchscript(path):  # torch.load's own refusal of one advises weights_only=False
            raise WeightsError(
                f"{path}: a TorchScript archive (torch.jit.save, or a traced or scripted module's save), not a "
                "state_dict: its weights are part of a program, which bert_multi never loads. Load it with "
                "torch.jit.load in code you trust, then save module.state_dict()"
            )
        return load_backend(BACKEND).read_checkpoint(path, key)


def _is_torchscript(path: Path) -> bool:
    """Whether the file is a TorchScript archive: a zip whose records hold a program's constants."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/constants.pkl") for name in archive.namelist())
    except Exception:  # noqa: BLE001 - not a zip, or a damaged one: the reader says which
        return False


FORMAT = StateDict()
