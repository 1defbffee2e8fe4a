"""Orbax's checkpoints, recognized and not read: what Flax saves with since it moved to Orbax
(``orbax.checkpoint``'s ``StandardCheckpointer``, ``PyTreeCheckpointer`` and ``CheckpointManager``, and
``flax.training.checkpoints.save_checkpoint``).

An Orbax checkpoint is a directory: ``_METADATA`` (JSON) names every leaf of the saved tree, and the
arrays are zarr chunks, each compressed with zstd, in tensorstore's OCDBT key-value store (or in a zarr
directory per array, without OCDBT). Reading them takes a zstd decoder and tensorstore's B-tree, neither of
which the Python standard library has, so bert_multi says what the directory is, which leaves its metadata
names, and the lines of Orbax and Flax that turn it into Flax's own file, which bert_multi reads (a
``TrainState`` included: its parameters are read, its step and optimizer state left out).

A ``CheckpointManager`` saves each step as a directory (``_CHECKPOINT_METADATA``) holding one checkpoint per
item (``default/`` for one); its root holds the steps. Each is named for what it is.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from ...errors import WeightsError
from ...safe_files import file_size, open_regular, reason
from .base import control_character, is_directory, is_regular_file, listed, natural_order, some

METADATA = "_METADATA"  # a checkpoint's tree: each leaf's keys and kind
STEP_METADATA = "_CHECKPOINT_METADATA"  # a CheckpointManager step's, or a checkpoint's own
MANIFEST = "manifest.ocdbt"  # the key-value store's root
MAX_METADATA_BYTES = 16 << 20  # BERT-base's TrainState's tree takes about 250 KB
# Orbax leaves a save that never finished under a temporary name; it is no checkpoint.
UNFINISHED = re.compile(r".*\.orbax-checkpoint-tmp(-\d+)?$")


def refusal(path: Path) -> str | None:
    """Why bert_multi does not read the Orbax directory at ``path`` (or the file of one ``path`` names), and
    what to do instead; None when it is no Orbax directory."""
    if path.name in (METADATA, STEP_METADATA, MANIFEST) and is_regular_file(path):
        path = path.parent
    if not is_directory(path):
        return None
    if is_checkpoint(path):
        return f"{path}: is {_leaves(path)}{_restore(path)}"
    items = _inside(path, is_checkpoint) if is_regular_file(path / STEP_METADATA) else []
    if items:
        first = path / items[0].rstrip("/")
        return (
            f"{path}: is an Orbax CheckpointManager's step; its items {some(items)} are each an Orbax checkpoint, "
            f"and {items[0]} is {_leaves(first)}{_restore(first)}"
        )
    held = _inside(path, lambda inner: is_checkpoint(inner) or is_regular_file(inner / STEP_METADATA))
    if held:
        return (
            f"{path}: holds Orbax checkpoints, {some(held)} (a CheckpointManager's steps, or "
            "flax.training.checkpoints' checkpoint_N/), which bert_multi does not read: name one, and it says how "
            "to make it Flax's own file"
        )
    return None


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is one Orbax checkpoint: a saved tree's metadata, or its key-value store's root."""
    return is_regular_file(path / METADATA) or is_regular_file(path / MANIFEST)


def _inside(path: Path, which: Callable[[Path], bool]) -> list[str]:
    """The directories among the first ``LISTED`` entries of ``path`` that ``which`` says are Orbax's, in
    natural order (step 2 before step 10)."""
    names = [name for name in listed(path) if not UNFINISHED.match(name)]
    held = [f"{name}/" for name in names if is_directory(path / name) and which(path / name)]
    return natural_order(held)


def _leaves(path: Path) -> str:
    """What the checkpoint at ``path`` holds, from its ``_METADATA``, for the message: a ``WeightsError``
    where that file is not what Orbax writes."""
    if not os.path.lexists(path / METADATA):
        return "an Orbax checkpoint (its tensorstore key-value store)"
    names = _tree(path / METADATA)
    params = [name for name in names if name.startswith("params.")]
    shown = f"its parameters {some(params)}" if params else some(names)
    return f"an Orbax checkpoint of {len(names)} leaves, {shown}"


def _tree(path: Path) -> list[str]:
    """The dotted paths of the leaves ``_METADATA`` at ``path`` names."""
    with open_regular(path, "Orbax checkpoint's metadata", WeightsError) as file:
        if file_size(file) > MAX_METADATA_BYTES:
            raise WeightsError(f"{path}: an Orbax _METADATA of over {MAX_METADATA_BYTES} bytes; Orbax writes far less")
        data = file.read(MAX_METADATA_BYTES)
    try:
        tree = json.loads(data)["tree_metadata"]
        names = [".".join(str(key["key"]) for key in leaf["key_metadata"]) for leaf in tree.values()]
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as error:
        raise WeightsError(
            f"{path}: not the metadata Orbax writes (a JSON object whose tree_metadata names each leaf's "
            f"key_metadata): {reason(error)}"
        ) from None
    for name in names:
        if bad := control_character(name):
            raise WeightsError(f"{path}: names a leaf {name!r:.200}, with the control character {bad}")
    return names


def _restore(path: Path) -> str:
    """The rest of the message: why bert_multi does not read it, and the code that makes it a Flax file."""
    at = repr(os.path.abspath(path))
    return (
        ", which bert_multi does not read: Orbax keeps the arrays as zstd-compressed zarr chunks (in "
        "tensorstore's OCDBT store, or a directory per array). Restore it with Orbax, in code you trust, as NumPy "
        "arrays (restored as saved, a GPU's arrays need that GPU), and save them as Flax's own file, which "
        "bert_multi reads: import jax, numpy, orbax.checkpoint, flax.serialization; "
        f"checkpointer = orbax.checkpoint.PyTreeCheckpointer(); tree = checkpointer.metadata({at}).item_metadata.tree; "
        f"state = checkpointer.restore({at}, restore_args=jax.tree.map(lambda _: "
        "orbax.checkpoint.RestoreArgs(restore_type=numpy.ndarray), tree)); "
        "open('bert.msgpack', 'wb').write(flax.serialization.to_bytes(state))"
    )
