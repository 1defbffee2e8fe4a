"""The HuggingFace hub's cache folder of one model, where ``from_pretrained`` downloads it
(``~/.cache/huggingface/hub/models--org--name``): ``refs/main`` holds the revision downloaded, and
``snapshots/<revision>/`` its files, as links into ``blobs/``. bert_multi reads the snapshot ``refs/main``
names, or the folder's only one, as the directory it is: a HuggingFace one, or another library's that the
hub holds (``another_librarys``).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from pathlib import Path

from ...errors import WeightsError
from ...safe_files import open_regular, reason
from .base import CheckpointFormat, Raw, is_directory, some

SNAPSHOTS, REFS = "snapshots", "refs"
MAX_SNAPSHOTS = 1000  # listed, at most, for a message


def is_cache_folder(path: Path) -> bool:
    """Whether ``path`` looks like the hub cache's folder of one model (snapshots beside refs or blobs)."""
    return is_directory(path / SNAPSHOTS) and (is_directory(path / REFS) or is_directory(path / "blobs"))


def snapshot(path: Path) -> tuple[Path, str]:
    """(the snapshot directory of a cache folder to read, why that one): the revision ``refs/main`` names,
    else the only snapshot; a ``WeightsError`` where neither says one."""
    ref = path / REFS / "main"
    if os.path.lexists(ref):
        with open_regular(ref, "HuggingFace cache ref", WeightsError) as file:
            revision = file.read(100).decode("ascii", "replace").strip()
        if not re.fullmatch(r"[0-9a-f]{40}", revision):
            raise WeightsError(f"{ref}: expected a commit hash (40 hexadecimal digits), found {revision!r:.60}")
        return path / SNAPSHOTS / revision, "refs/main names it"
    try:
        with os.scandir(path / SNAPSHOTS) as entries:
            found = sorted(itertools.islice((entry.name for entry in entries if entry.is_dir()), MAX_SNAPSHOTS + 1))
    except OSError as error:
        raise WeightsError(f"{path / SNAPSHOTS}: cannot list the snapshots: {reason(error)}") from None
    if len(found) != 1:
        raise WeightsError(
            f"{path}: a HuggingFace cache folder with {len(found)} snapshots and no refs/main naming one: name the "
            f"snapshot's directory ({path / SNAPSHOTS}/...): {some(found)}"
        )
    return path / SNAPSHOTS / found[0], "the only one"


def another_librarys(
    snapshot: Path, which: str, sniff: Callable[[Path], CheckpointFormat] | None, expected: str
) -> Raw:
    """A snapshot that holds no transformers model (``expected``: what one holds), read as the directory it is
    (``sniff``: the registry's): the hub holds other libraries' models too (KerasHub's presets, PaddleNLP's
    BERTs). A snapshot that is itself a cache folder is refused, not followed."""
    try:
        own = None if sniff is None or is_cache_folder(snapshot) else sniff(snapshot)
    except WeightsError:
        own = None
    if own is None or not own.directory:
        raise WeightsError(
            f"{snapshot}: the cache folder's snapshot ({which}) holds no {expected}, nor another library's model "
            "bert_multi reads: from_pretrained downloads them"
        )
    raw = own.read(snapshot, None)
    raw.notes.insert(
        0, f"read the HuggingFace cache folder's snapshot {snapshot.name[:12]} ({which}): {own.description}"
    )
    return raw
