"""The HuggingFace hub's cache folder of one model, where ``from_pretrained`` downloads it
(``~/.cache/huggingface/hub/models--org--name``): ``refs/main`` holds the revision downloaded, and
``snapshots/<revision>/`` its files, as links into ``blobs/``. bert_multi reads the snapshot ``refs/main``
names, or the folder's only one, as the HuggingFace directory it is.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from ...errors import WeightsError
from ...safe_files import open_regular, reason
from .base import is_directory, some

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
