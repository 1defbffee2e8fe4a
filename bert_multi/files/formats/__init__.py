"""Checkpoint formats, one module each behind one registry: what a file is (``sniff``), which format a
path asks for when writing (``for_output``), and each format's reading, writing and description."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from ...errors import UsageError, WeightsError
from ...safe_files import NPY_MAGIC, ZIP_MAGIC, describe_format, open_regular, reason
from . import (
    alone,
    d2l,
    deepspeed,
    exported,
    flax,
    gluon,
    huggingface,
    keras_hub,
    npz,
    orbax,
    paddle,
    paddlenlp,
    peft,
    pytorch,
    tensorflow,
    tf_objects,
    torch_distributed,
    zipped,
)
from .base import (
    PARAMS_FILE,
    VOCAB_FILE,
    CheckpointFormat,
    Probe,
    Raw,
    is_directory,
    is_regular_file,
    listed,
    natural_order,
    some,
)

# d2l's directory holds a framework's file, whose format this registry tells (sniffed when it is read,
# by --framework's name when it is written).
DIRECTORY = d2l.Directory(lambda path: sniff(path), lambda framework: D2L_PUBLISHED[framework])
ZIP = d2l.Zip(DIRECTORY)
# Any other directory format's directory, zipped: its marker files (the registry's) say to extract it.
ZIPPED = zipped.ZippedDirectory(
    lambda: {name for own in FORMATS for name in own.marker_files}, lambda path: _directory_format(path)
)
# Every format, in the order a file is tried against them.
FORMATS: tuple[CheckpointFormat, ...] = (
    npz.ARRAYS,  # before the canonical file's: an .npz without a manifest
    npz.FORMAT,
    pytorch.FORMAT,
    exported.FORMAT,
    gluon.FORMAT,
    paddle.FORMAT,  # after PyTorch's: any other pickle is tried as Paddle's
    flax.FORMAT,
    alone.SAFETENSORS,
    alone.KERAS,
    paddlenlp.FORMAT,
    npz.RUN,
    huggingface.FORMAT,
    keras_hub.FORMAT,
    keras_hub.FILE,
    tf_objects.FORMAT,
    tensorflow.FORMAT,
    deepspeed.FORMAT,  # after HuggingFace's: transformers' Trainer saves DeepSpeed's beside its own
    DIRECTORY,
    ZIP,
    ZIPPED,
)
# Formats recognized and not read, after every format read: each says what a path is, and how to make it a file
# bert_multi reads.
NAMED_ONLY = (orbax.refusal, torch_distributed.refusal, peft.refusal)
BY_KIND = {own.kind: own for own in FORMATS}
DESCRIPTIONS = {own.kind: own.description for own in FORMATS}  # what bert_multi reads and writes, for people
FRAMEWORK_FORMATS = {own.kind: own for own in FORMATS if own.framework is not None}  # a framework's own file
# The files d2l published pretrained models in, by the name --framework gives each: its backend's, or Paddle's.
D2L_PUBLISHED: dict[str, CheckpointFormat] = {own.framework or own.kind: own for own in FORMATS if own.d2l_published}
# The directories that a library's own code loads, by the name --framework gives each: HuggingFace's, PaddleNLP's.
LIBRARY_DIRECTORIES = {own.framework_option: own for own in FORMATS if own.framework_option}
# What a directory written by save_checkpoint holds: a d2l one of those files, or a library's.
DIRECTORY_FRAMEWORKS = [*D2L_PUBLISHED, *LIBRARY_DIRECTORIES]


def sniff(path: Path) -> CheckpointFormat:
    """The format of the file or directory at ``path``, from its first bytes and, for a zip, its member
    names; a ``WeightsError`` saying what it looks like when it is none of them."""
    for own in FORMATS:
        if own.names_checkpoint(path):
            return own
    if is_directory(path) and (found := _directory_format(path)):
        return found
    for refusal in NAMED_ONLY:
        if told := refusal(path):
            raise WeightsError(told)
    if is_directory(path):
        if held := _held_inside(path):
            raise WeightsError(
                f"{path}: is a directory of no format bert_multi reads, but it holds {some(held)}, which bert_multi "
                "reads, or names with what to do: name one (a training run's output holds a checkpoint per save: "
                "transformers' Trainer's checkpoint-N/, a PEFT adapter's under PEFT, PyTorch Lightning's .ckpt files, "
                "flax.training.checkpoints' checkpoint_N files; accelerate's save_state a model.safetensors beside "
                "its optimizer's)"
            )
        needs = "; ".join(own.description for own in FORMATS if own.directory)
        raise WeightsError(f"{path}: is a directory, but none bert_multi reads, which are: {needs}")
    problem = None
    with open_regular(path, "checkpoint", WeightsError) as file:
        head = file.read(8)
        members: tuple[str, ...] = ()
        if head.startswith(ZIP_MAGIC) and path.suffix.lower() != ".npz":
            file.seek(0)
            try:
                members = tuple(zipfile.ZipFile(file).namelist())
            except Exception as error:  # noqa: BLE001 - zipfile raises many types on hostile input
                problem = f"a damaged zip archive: {reason(error)}"
    for own in FORMATS:
        if not own.directory and own.recognizes(Probe(path, head, members)):
            return own
    raise WeightsError(f"{path}: {problem or _what_it_is(path, head, members)}")


huggingface.FORMAT.sniff = sniff  # a hub cache's snapshot may hold another library's model


def _directory_format(path: Path) -> CheckpointFormat | None:
    """The directory format that recognizes the directory at ``path``, if any."""
    return next((own for own in FORMATS if own.directory and own.recognizes(Probe(path, b"", ()))), None)


# A training run's checkpoint files, by the names their tools give them: PyTorch Lightning's (torch.save files
# under a suffix of their own), flax.training.checkpoints' from before Orbax (checkpoint_N, Flax's own file),
# and the model's file of accelerate's save_state (model.safetensors, or pytorch_model.bin; _1 for a second).
RUN_FILES = re.compile(r".+\.ckpt|checkpoint_\d+|(model|pytorch_model)(_\d+)?\.(safetensors|bin)", re.IGNORECASE)


def _held_inside(path: Path) -> list[str]:
    """The checkpoints among the first ``LISTED`` entries of a directory: the directories a format reads
    and the files a run's checkpoints are named as, in natural order (checkpoint-2 before checkpoint-10). A
    library's file beside the rest of its directory is not one: the directory is read whole or not at all."""
    held = []
    try:
        for name in listed(path):  # unreadable: none, and the message lists the formats instead
            inner = path / name
            if is_directory(inner):
                if _directory_format(inner) or peft.refusal(inner):  # a Trainer's checkpoint-N/ under PEFT
                    held.append(f"{name}/")
            elif RUN_FILES.fullmatch(name) and is_regular_file(inner):
                held.append(name)
    except OSError:
        return []
    return natural_order(held)


def _what_it_is(path: Path, head: bytes, members: tuple[str, ...]) -> str:
    if unread := exported.unread_archive(path, members):
        return unread
    if head.startswith(ZIP_MAGIC):
        markers = [own.zip_marker for own in FORMATS if own.zip_marker]
        return f"a zip archive, but neither {', '.join(markers[:-1])} nor {markers[-1]}; it holds {some(list(members))}"
    if head.startswith(b"\x80"):  # a pickle of a protocol neither torch.save nor paddle.save writes
        return (
            f"{describe_format(head)} of protocol {head[1] if len(head) > 1 else '?'}: bert_multi reads torch.save's "
            "pickles, whose sizes it checks before torch unpickles anything, and paddle.save's (protocols 2 to 4), "
            "which it parses without unpickling, and no other pickle"
        )
    if head.startswith(NPY_MAGIC):
        return (
            "a single NumPy .npy array (np.save), not named arrays: np.savez(path, **weights) saves each under its "
            "name, which bert_multi reads (np.save of a dict pickles it, and bert_multi unpickles nothing)"
        )
    return f"{describe_format(head)}; expected one of: " + "; ".join(DESCRIPTIONS.values())


def for_output(path: str | Path, framework: str | None = None) -> CheckpointFormat:
    """The format a path asks for: by suffix (.npz, or a framework format's), else a directory: d2l's, or
    a library's (``framework="huggingface"``, ``"paddlenlp"``: ``LIBRARY_DIRECTORIES``). With a ``framework``,
    a name whose suffix is no format's is a directory's (d2l names its directories bert.small, bert.base)."""
    suffix = Path(path).suffix.lower()
    for own in FORMATS:
        if suffix in own.suffixes:
            return own
    if suffix and framework is None and not Path(path).is_dir():
        known = [suffix for own in FORMATS for suffix in own.suffixes]
        raise UsageError(
            f"{path}: unknown output suffix {suffix!r}: expected {', '.join(known)}, or a directory (a d2l "
            "pretrained-model directory or a library's), its kind given with framework= (--framework), one of "
            f"{DIRECTORY_FRAMEWORKS}"
        )
    return LIBRARY_DIRECTORIES.get(framework or "", DIRECTORY)


def of_framework(framework: str) -> CheckpointFormat:
    """The format of ``framework``'s own files."""
    return next(own for own in FRAMEWORK_FORMATS.values() if own.framework == framework)


__all__ = [
    "BY_KIND",
    "D2L_PUBLISHED",
    "DESCRIPTIONS",
    "DIRECTORY",
    "DIRECTORY_FRAMEWORKS",
    "FORMATS",
    "FRAMEWORK_FORMATS",
    "LIBRARY_DIRECTORIES",
    "PARAMS_FILE",
    "VOCAB_FILE",
    "ZIP",
    "CheckpointFormat",
    "Probe",
    "Raw",
    "for_output",
    "of_framework",
    "sniff",
]
