"""A checkpoint directory shipped as a zip, read as the directory it holds once extracted: Google's BERTs are
published so (``uncased_L-12_H-768_A-12.zip``), and a HuggingFace, KerasHub or PaddleNLP directory, or a
pretraining run's, is often passed around so.

The zip is recognized by a file that marks one of the directory formats (each format's ``marker_files``),
then extracted into a scratch directory: at most ``MAX_MEMBERS`` members, each name a plain relative path
(no absolute path, no ``..``), each member's expansion bounded as every zip's is (``base.extract``), and
all of them together too. The
directory read is the zip's one top-level folder, or its root.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from ...errors import WeightsError
from .base import MAX_ZIP_RATIO, CheckpointFormat, Probe, Raw, control_character, extract, some, zip_errors

MAX_MEMBERS = 1000  # Google's BERT zips hold 5 files; a SavedModel's directory a handful more


class ZippedDirectory(CheckpointFormat):
    kind = "zipped-dir"
    description = "zip of a checkpoint directory (Google's BERT zips: bert_config.json and bert_model.ckpt)"
    zip_marker = "a zip of a checkpoint directory bert_multi reads (one with its config)"

    def __init__(self, markers: Callable[[], set[str]], directory_format: Callable[[Path], CheckpointFormat | None]):
        self.markers = markers  # the file names that mark a directory format, from the registry
        self.directory_format = directory_format  # the registry's: the format that recognizes a directory

    def recognizes(self, probe: Probe) -> bool:
        markers = self.markers()
        return any(PurePosixPath(name).name in markers for name in probe.members)

    def framework_of(self, path: Path) -> str | None:
        return None  # that of the directory inside, known once read

    def read(self, path: Path, key: str | None) -> Raw:
        with tempfile.TemporaryDirectory(prefix="bert_multi-") as scratch:
            folder = _extracted(path, Path(scratch))
            own = self.directory_format(folder)
            if own is None:
                held = sorted(str(inner.relative_to(scratch)) for inner in folder.iterdir())
                raise WeightsError(
                    f"{path}: a zip holding {some(held)}, which is no checkpoint directory bert_multi reads"
                )
            try:
                raw = own.read(folder, key)
            except WeightsError as error:  # name the zip the user gave, not the scratch copy
                raise WeightsError(str(error).replace(scratch, str(path))) from None
        inside = f"its {folder.name}/" if folder != Path(scratch) else "its files"
        raw.notes.insert(0, f"extracted the zip and read {inside}: {own.description}")
        return raw


def _extracted(path: Path, scratch: Path) -> Path:
    """The zip at ``path`` extracted into ``scratch``, its names checked first; the directory it holds."""
    with zip_errors(path), zipfile.ZipFile(path) as archive:
        members = [member for member in archive.infolist() if not member.is_dir()]
        if len(members) > MAX_MEMBERS:
            raise WeightsError(f"{path}: a zip of {len(members)} files; a checkpoint directory holds far fewer")
        claimed, bound = sum(member.file_size for member in members), MAX_ZIP_RATIO * os.stat(path).st_size + (1 << 20)
        if claimed > bound:
            raise WeightsError(f"{path}: its files claim to expand to {claimed} bytes, more than {bound}")
        for member in members:
            parts = PurePosixPath(member.filename).parts
            if member.filename.startswith("/") or "\\" in member.filename or ".." in parts or not parts:
                raise WeightsError(f"{path}: holds {member.filename!r:.200}, a name outside the zip's own directory")
            if bad := control_character(member.filename):
                raise WeightsError(f"{path}: holds {member.filename!r:.200}, with the control character {bad}")
        for member in members:
            target = scratch.joinpath(*PurePosixPath(member.filename).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            extract(archive, member, target, path)
    tops = {PurePosixPath(member.filename).parts[0] for member in members}
    nested = all(len(PurePosixPath(member.filename).parts) > 1 for member in members)
    return scratch / tops.pop() if len(tops) == 1 and nested else scratch
