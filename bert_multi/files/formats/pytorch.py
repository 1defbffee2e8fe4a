"""PyTorch's ``torch.save(net.state_dict())`` as a checkpoint format: a zip holding a pickle of the
structure (``data.pkl``) and the raw tensors, or (before PyTorch 1.6) the legacy format, pickles followed
by the tensors' bytes (``torch_legacy.py``). Reading it needs torch, whose reader the torch backend runs
with ``weights_only=True`` once the file's sizes are checked; its names are the canonical ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...backend.registry import load_backend
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
        return load_backend(BACKEND).read_checkpoint(path, key)


FORMAT = StateDict()
