"""PyTorch's distributed checkpoints, recognized and not read: what ``torch.distributed.checkpoint`` saves
(``dcp.save``; FSDP's sharded state dicts, accelerate's ``save_state`` under FSDP, torchtitan's).

Such a checkpoint is a directory: ``.metadata``, a pickle of torch's own classes that says which chunk of
which tensor lies where, beside ``__R_N.distcp`` files of chunks, each one ``torch.save``'s. bert_multi
unpickles nothing, so it says what the directory is, and the lines of torch's own that write it as one
``torch.save`` file, which bert_multi reads (the model's state_dict under the key the run saved it with).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .base import is_directory, is_regular_file, listed, natural_order, some

METADATA = ".metadata"  # the plan: which chunk of which tensor is where
CHUNKS = re.compile(r"__\d+_\d+\.distcp")  # a rank's file of chunks


def refusal(path: Path) -> str | None:
    """Why bert_multi does not read the distributed checkpoint at ``path`` (or the file of one ``path`` names),
    and what to do instead; None when it is none, nor a directory holding one."""
    if (path.name == METADATA or CHUNKS.fullmatch(path.name)) and is_regular_file(path):
        path = path.parent
    if not is_directory(path):
        return None
    if is_checkpoint(path):
        at = repr(os.path.abspath(path))
        return (
            f"{path}: is a PyTorch distributed checkpoint (torch.distributed.checkpoint: FSDP's, accelerate's "
            f"sharded state, torchtitan's), which bert_multi does not read: its plan, {METADATA}, is a pickle of "
            "torch's classes, and bert_multi unpickles nothing. torch writes it as one torch.save file, which "
            "bert_multi reads (the model's state_dict under the key the run saved it with): "
            f"from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; dcp_to_torch_save({at}, "
            "'bert.pt')"
        )
    held = natural_order([f"{name}/" for name in listed(path) if is_checkpoint(path / name)])
    if held:
        return (
            f"{path}: holds PyTorch distributed checkpoints, {some(held)}, which bert_multi does not read: name one, "
            "and it says how to make it one torch.save file"
        )
    return None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is one distributed checkpoint: its plan beside a file of chunks."""
    return is_regular_file(path / METADATA) and any(CHUNKS.fullmatch(name) for name in listed(path))
