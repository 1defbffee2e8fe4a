"""Checkpoints of any d2l generation and framework: what a file is, what it implies, and loading and
converting it without guessing.

A d2l checkpoint is a framework's own file (a PyTorch ``state_dict``, Gluon ``.params``, or d2l's
pretrained-model directory holding one plus ``vocab.json``). Its tensor names say which generation
and which heads it has, and its shapes give every size but one: the number of attention heads, which
no weight reveals. Nor can a file tell d2l 0.12-0.15 (valid_lens tiled over heads) from 0.16+
(interleaved): same names, same shapes. Both compute a different function when wrong, so both are
required statements, never defaults. Every failure is a ``WeightsError`` that says what to do.

Gluon files and canonical ``.npz`` files are read without any framework; PyTorch files need torch,
whose reader runs with ``weights_only=True``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.contract import framework_names
from ..backend.registry import label_of, registrations
from ..errors import StatementsMissing, UsageError, WeightsError
from ..safe_files import written_together
from ..spec.config import BERTConfig
from ..spec.schema import SUPPORTED_DTYPES, normalize_dtype, param_shapes, validate_weights
from ..spec.semantics import PRESETS, Semantics, described, releases_of, semantics_for
from .formats import (
    BY_KIND,
    DESCRIPTIONS,
    DIRECTORY,
    DIRECTORY_FRAMEWORKS,
    PARAMS_FILE,
    VOCAB_FILE,
    ZIP,
    CheckpointFormat,
    Probe,
    Raw,
    for_output,
    huggingface,
    of_framework,
    sniff,
)
from .formats.base import StateDictInside, control_character, some
from .formats.transformers_names import is_transformers_state_dict, read_state_dict, relative_of
from .layout import D2L_0_11_MAX_LEN, MODEL_PARTS, STATED_BY, Layout, interpret, told_inside, unknowns


def _reader(framework: str | None) -> str:
    """The call that reads a framework's files on purpose (a canonical file's, for None)."""
    return "bert_multi.load_weights" if framework is None else f"{registrations()[framework].where}.load_checkpoint"


SIZES = ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_blks", "max_len")  # what weights reveal


@dataclass(frozen=True)
class Tensor:
    """One tensor as the file stores it."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class CheckpointInfo:
    """What a checkpoint file is and what it implies, before anything is stated about it."""

    path: str
    format: str  # a format's kind (formats.DESCRIPTIONS)
    framework: str | None  # the backend whose own file it is, or None
    tensors: list[Tensor]  # under the file's own names, in its order
    sizes: dict[str, int]  # vocab_size, num_hiddens, ffn_num_hiddens, num_blks and, if stored, max_len
    heads: tuple[str, ...]
    presets: tuple[str, ...]  # the generations whose names and shapes the tensors fit
    config: BERTConfig | None  # complete only when the file records it (a canonical file)
    vocab: list[str] | None = None
    ignored: list[str] = field(default_factory=list)  # tensors that are not d2l BERT's (a task head)
    notes: list[str] = field(default_factory=list)  # what was done to read it
    unknowns: dict[str, str] = field(default_factory=dict)  # what the file cannot tell -> how to state it
    settings: dict[str, Any] = field(default_factory=dict)  # recorded beyond the model (``Raw.settings``)

    def describe(self) -> str:
        """A report for people: the file, its tensors as a table, what it implies and what it cannot tell."""
        from ..display import format_table

        lines = [f"{self.path}: {DESCRIPTIONS[self.format]}"]
        if self.framework:
            lines[0] += f", {label_of(self.framework)}"
        rows = [[t.name, "x".join(map(str, t.shape)) or "scalar", t.dtype] for t in self.tensors]
        lines += ["", format_table(["tensor", "shape", "dtype"], rows), ""]
        total = sum(int(np.prod(t.shape)) for t in self.tensors)
        lines.append(f"{len(self.tensors)} tensors, {total:,} numbers")
        lines.append("sizes: " + ", ".join(f"{name}={value}" for name, value in self.sizes.items()))
        lines.append(f"heads: {', '.join(self.heads) or 'none (encoder only)'}")
        fits = [
            f"{name} ({described(self.config.semantics, self.framework)})"
            if name == "custom" and self.config is not None
            else f"{name} ({releases_of(name, self.framework)})"
            for name in self.presets
        ]
        lines.append(f"fits: {'; '.join(fits)}")
        if self.config is not None:
            lines.append(f"config (recorded in the file): {self.config}")
        if self.vocab is not None:
            lines.append(f"vocab: {len(self.vocab)} tokens, starting {self.vocab[:5]}")
        lines += [f"ignored: {name}" for name in self.ignored]
        lines += [f"note: {note}" for note in self.notes]
        for topic, why in self.unknowns.items():
            stated = f"; state it with {' / '.join(STATED_BY[topic])}" if topic in STATED_BY else ""
            lines.append(f"cannot tell {topic}: {why}{stated}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "framework": self.framework,
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in self.tensors],
            "sizes": self.sizes,
            "heads": list(self.heads),
            "presets": list(self.presets),
            "config": None if self.config is None else self.config.to_dict(),
            "vocab_size": None if self.vocab is None else len(self.vocab),
            "ignored": self.ignored,
            "notes": self.notes,
            "unknowns": self.unknowns,
        }


@dataclass
class Checkpoint:
    """A loaded checkpoint: the config (the file's sizes plus what was stated), canonical weights, and
    the vocabulary when the file came with one."""

    config: BERTConfig
    weights: dict[str, np.ndarray]
    info: CheckpointInfo

    @property
    def vocab(self) -> list[str] | None:
        return self.info.vocab


# --- Reading a file's tensors under its own names ----------------------------------------------------


def _checked_prefix(prefix: str | None) -> str | None:
    """A stated prefix as the names begin with it (``model`` and ``model.`` alike), or a ``UsageError``."""
    if prefix is None:
        return None
    stem = prefix.removesuffix(".")
    if not stem or control_character(stem) or any(not part for part in stem.split(".")):
        raise UsageError(
            f"prefix={prefix!r}: expected the attribute path the model's tensors are under, such as 'model.'"
        )
    return stem + "."


def _read(path: Path, key: str | None, own: CheckpointFormat | None = None, prefix: str | None = None) -> Raw:
    own = own or sniff(path)
    try:
        raw = own.read(path, key)
    except StateDictInside as inside:
        raise WeightsError(told_inside(path, inside)) from None
    for name in raw.arrays:
        if bad := control_character(name):
            raise WeightsError(
                f"{path}: the tensor name {name!r:.200} holds the control character {bad}, "
                "which no framework writes in a name"
            )
    raw.dtypes = {name: raw.dtypes.get(name, array.dtype.name) for name, array in raw.arrays.items()}
    if prefix is not None:
        _take_prefix(path, raw, prefix)
    if raw.config is None:
        _strip_wrappers(raw.arrays, raw.dtypes, raw.notes)
        # Whether transformers' names are read as such: the format that read the tensors says (a zip's, the one inside)
        if BY_KIND[raw.format].holds_transformers_names and is_transformers_state_dict(raw.arrays):
            if huggingface.in_its_directory(path):  # alone, it would compute with defaults, not with its config
                raise WeightsError(
                    f"{path}: a transformers BERT's weights, in the directory of their config: name the directory, "
                    f"{path.parent}, read as one"
                )
            read_state_dict(path, raw)
    return raw


def _take_prefix(path: Path, raw: Raw, prefix: str) -> None:
    """Only the tensors under the stated ``prefix`` (a wrapper's attribute: a LightningModule's ``model.``),
    named without it; the wrapper's others are left out, said in a note."""
    if raw.config is not None:
        raise WeightsError(
            f"{path}: a {DESCRIPTIONS[raw.format]} names its tensors as its model does; prefix={prefix!r} applies to "
            "a file that holds a model under a wrapper's attribute"
        )
    under = [name for name in raw.arrays if name.startswith(prefix)]
    if not under:
        tops = sorted({name.split(".")[0] + "." for name in raw.arrays})
        raise WeightsError(f"{path}: no tensor name begins with {prefix!r}; the file's names begin with {some(tops)}")
    if kin := relative_of(under):  # RoBERTa's under 'roberta.' would read as a BERT's
        raise WeightsError(f"{path}: the tensors under {prefix!r} are {kin}")
    others = [name for name in raw.arrays if not name.startswith(prefix)]
    raw.arrays = {name.removeprefix(prefix): raw.arrays[name] for name in under}
    raw.dtypes = {name.removeprefix(prefix): raw.dtypes[name] for name in under}
    left_out = f", leaving out the wrapper's {some(others)}" if others else ""
    raw.notes.append(f"read the tensors under the prefix {prefix!r} without it{left_out}")


def _file_tensors(raw: Raw) -> list[Tensor]:
    return [Tensor(name, tuple(array.shape), raw.dtypes[name]) for name, array in raw.arrays.items()]


def _stated_info(path: Path, raw: Raw, config: BERTConfig) -> CheckpointInfo:
    """The description of a file whose config is known: recorded in it, or stated in full."""
    sizes = {name: getattr(config, name) for name in SIZES}
    info = CheckpointInfo(str(path), raw.format, raw.framework, _file_tensors(raw), sizes, config.heads, (), None)
    info.presets, info.vocab, info.notes, info.settings = (config.semantics.name,), raw.vocab, raw.notes, raw.settings
    if raw.config is not None:
        info.config = config
    return info


def _describe(path: Path, raw: Raw) -> tuple[CheckpointInfo, Layout | None]:
    """What a file's tensors imply, and the layout they were read with (none for a canonical file)."""
    if raw.config is not None:
        return _stated_info(path, raw, raw.config), None
    layout = interpret(path, raw.framework, raw.arrays)
    info = CheckpointInfo(
        str(path),
        raw.format,
        raw.framework,
        _file_tensors(raw),
        layout.sizes,
        layout.heads,
        layout.presets,
        None,
        raw.vocab,
        layout.ignored,
        raw.notes,
        unknowns(layout),
    )
    return info, layout


def inspect_checkpoint(path: str | Path, key: str | None = None, prefix: str | None = None) -> CheckpointInfo:
    """What the file at ``path`` is: its format, tensors, the sizes and generations they imply, and what
    it cannot tell. ``key`` picks the state_dict out of a PyTorch wrapper dict, ``prefix`` the model's
    tensors out of a wrapper's."""
    path = Path(path)
    prefix = _checked_prefix(prefix)
    return _describe(path, _read(path, key, prefix=prefix))[0]


# --- Loading: the file plus what was stated ---------------------------------------------------------


# The prefix PyTorch's own wrappers put before every name of the model they hold: unambiguous, so stripped.
WRAPPER_PREFIXES = {
    "module.": "a model wrapped in nn.DataParallel or DistributedDataParallel",
    "_orig_mod.": "a model compiled with torch.compile",
}


def _strip_wrappers(arrays: dict[str, np.ndarray], dtypes: dict[str, str], notes: list[str]) -> None:
    """Every wrapper's prefix, in whichever order the wrappers were nested, each said in a note."""
    while arrays and (prefix := next((p for p in WRAPPER_PREFIXES if all(n.startswith(p) for n in arrays)), None)):
        # Renamed all at once: one by one, 'module.module.x' would take the place of 'module.x' before it moved.
        stripped = {name.removeprefix(prefix): (array, dtypes[name]) for name, array in arrays.items()}
        arrays.clear()
        dtypes.clear()
        for name, (array, dtype) in stripped.items():
            arrays[name], dtypes[name] = array, dtype
        notes.append(f"stripped the prefix {prefix!r} from every name ({WRAPPER_PREFIXES[prefix]})")


def _cast(path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str], dtype: str | None) -> dict:
    """The arrays as ``dtype``, or, without it, unchanged once each is float32 or float64."""
    if dtype is not None:
        return {name: np.asarray(array, dtype=dtype) for name, array in arrays.items()}
    for name, own in dtypes.items():
        if own in ("float16", "bfloat16"):
            raise WeightsError(
                f"{path}: tensor {name!r} is {own}; bert_multi computes in {' or '.join(SUPPORTED_DTYPES)}, and "
                "casts only when asked: pass dtype='float32' (--cast float32)"
            )
        if own not in SUPPORTED_DTYPES:
            raise WeightsError(f"{path}: tensor {name!r} has dtype {own}; expected floating-point weights")
    return arrays


def _names_error(path: Path, have: set[str], expected: set[str]) -> WeightsError:
    """The file's own names next to the expected ones, and what differs."""
    differences = [
        f"{what} {some(names)}"
        for what, names in (("missing", expected - have), ("unexpected", have - expected))
        if names
    ]
    return WeightsError(
        f"{path}: its tensor names do not match the stated config. The file has {some(have)}; the config "
        f"expects {some(expected)}; {', '.join(differences)}"
    )


def _statement(preset: str | Semantics | None, d2l_version: str | None) -> Semantics | None:
    if preset is not None and d2l_version is not None:
        raise UsageError("state the generation once: preset= or d2l_version=, not both")
    stated = preset if preset is not None else d2l_version
    return None if stated is None else semantics_for(stated)


def _check_framework(path: Path, kind: str, found: str | None, wanted: str) -> None:
    """A framework's reader refuses the other framework's files (and canonical ones), naming the reader."""
    if found != wanted:
        written = f", written by {label_of(found)}" if found else ""
        # a reader of its own: a framework's, a canonical file's, HuggingFace's; the other formats have none
        own = "bert_multi.from_huggingface" if kind == "hf-dir" else _reader(found) if found or kind == "npz" else None
        raise WeightsError(
            f"{path}: this is a {DESCRIPTIONS[kind]}{written}, not a {label_of(wanted)} checkpoint: read it "
            f"with {own + ' or ' if own else ''}bert_multi.load_checkpoint (any format), or convert it: "
            f"bert-multi convert {path} OUT"
        )


def _config_from_layout(path: Path, layout: Layout, num_heads: int | None, semantics: Semantics | None) -> BERTConfig:
    cannot_tell = unknowns(layout)
    missing = ["num_heads"] if num_heads is None else []
    if semantics is None and len(layout.presets) > 1:
        missing.append("the generation")
    if missing or num_heads is None:  # all of them in one message
        raise StatementsMissing(path, {what: (*STATED_BY[what], cannot_tell[what]) for what in missing})
    if semantics is None:
        semantics = PRESETS[layout.presets[0]]
    elif semantics.name not in layout.presets:
        fits = ", ".join(f"{name} ({releases_of(name, layout.framework)})" for name in layout.presets)
        raise WeightsError(
            f"{path}: the stated generation {semantics.name!r} does not fit the file, whose tensor names fit {fits}"
        )
    sizes = dict(layout.sizes)
    sizes.setdefault("max_len", D2L_0_11_MAX_LEN)
    try:
        return BERTConfig(num_heads=num_heads, semantics=semantics, heads=layout.heads, **sizes)
    except UsageError as error:  # the file's sizes and what was stated make no model together
        raise WeightsError(f"{path}: the file's sizes with num_heads={num_heads} make no BERT: {error}") from None


def load_checkpoint(
    path: str | os.PathLike,
    config: BERTConfig | None = None,
    *,
    num_heads: int | None = None,
    preset: str | Semantics | None = None,
    d2l_version: str | None = None,
    dtype: object = None,
    key: str | None = None,
    prefix: str | None = None,
    framework: str | None = None,
) -> Checkpoint:
    """A checkpoint in any format bert_multi reads (``FORMATS``), as a config and canonical weights.

    The sizes come from the file; what it cannot reveal is stated: ``num_heads``, and ``preset`` or
    ``d2l_version`` when the tensors fit more than one generation (a canonical file records both).
    A ``config`` states everything at once. ``dtype`` casts the weights explicitly (half-precision files
    need it); ``key`` names the entry of a PyTorch wrapper dict that holds the state_dict, and ``prefix``
    the attribute of a wrapper (a LightningModule) whose tensors are the model's. The prefixes of
    PyTorch's own wrappers (``module.``, ``_orig_mod.``) are stripped and a task head is ignored, each said
    in ``info.notes``. ``framework`` (a backend with a format of its own, ``FRAMEWORK_FORMATS``) refuses
    other files, naming the reader they need.
    """
    path = Path(path)
    dtype = None if dtype is None else normalize_dtype(dtype)
    semantics = _statement(preset, d2l_version)
    prefix = _checked_prefix(prefix)
    own = sniff(path)
    if framework is not None and own is not ZIP:  # a zip's framework is that of the file inside
        _check_framework(path, own.kind, own.framework_of(path), framework)
    raw = _read(path, key, own, prefix)
    if framework is not None and own is ZIP:
        _check_framework(path, raw.format, raw.framework, framework)
    if raw.config is not None:
        info = _describe(path, raw)[0]
        if config is None:
            config = raw.config
            if num_heads is not None and num_heads != config.num_heads:
                raise WeightsError(f"{path}: the file records num_heads={config.num_heads}; {num_heads} was stated")
            if semantics is not None and semantics != config.semantics:
                stated = config.with_semantics(semantics)
                try:
                    validate_weights(stated, raw.arrays)
                except WeightsError as error:
                    raise WeightsError(
                        f"{path}: the file's weights ({config.semantics.name}) do not fit the stated generation "
                        f"{semantics.name!r}: {error}"
                    ) from None
                config = stated
        weights = _cast(path, raw.arrays, raw.dtypes, dtype)
    else:
        if config is None:
            info, layout = _describe(path, raw)
            assert layout is not None
            config = _config_from_layout(path, layout, num_heads, semantics)
        else:  # everything is stated: the file is only checked against it
            info = _stated_info(path, raw, config)
        expected = framework_names(config, of_framework(raw.framework).name_rules if raw.framework else [])
        leftover = set(raw.arrays) - set(expected.values())
        if not set(expected.values()) <= set(raw.arrays) or any(n.split(".")[0] in MODEL_PARTS for n in leftover):
            raise _names_error(path, set(raw.arrays), set(expected.values()))
        info.ignored = sorted(leftover)
        arrays = {name: raw.arrays[own] for name, own in expected.items()}
        weights = _cast(path, arrays, {name: raw.dtypes[own] for name, own in expected.items()}, dtype)
    try:
        validate_weights(config, weights)
    except WeightsError as error:
        raise WeightsError(f"{path}: {error} (config: {config})") from None
    if info.vocab is not None and len(info.vocab) != config.vocab_size:
        raise WeightsError(
            f"{path}: {VOCAB_FILE} has {len(info.vocab)} tokens, but the token embedding has {config.vocab_size} rows"
        )
    return Checkpoint(config, {name: weights[name] for name in param_shapes(config)}, info)


# --- Writing any format --------------------------------------------------------------------------------


def output_format(path: str | Path, framework: str | None = None) -> str:
    """The format a path asks for: by suffix (.npz, .pt/.pth, .params, .msgpack ...), else a directory
    (``for_output``)."""
    return for_output(path, framework).kind


def save_checkpoint(
    path: str | Path,
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    *,
    framework: str | None = None,
    vocab: list[str] | None = None,
    settings: dict[str, Any] | None = None,
) -> str:
    """Write ``weights`` in the format ``path`` asks for (``output_format``); return that format.

    Each framework's file is what its own d2l code loads with its own strict call (``load_state_dict``,
    ``load_parameters``). A d2l pretrained-model directory needs ``framework`` (whose
    ``pretrained.params`` it holds) and ``vocab`` (its ``vocab.json``), as d2l's ``load_pretrained_model``
    reads both; ``framework="huggingface"`` writes a HuggingFace directory instead, keeping ``settings``
    (``CheckpointInfo.settings`` of the directory it was read from), and ``"paddlenlp"`` a PaddleNLP one.
    Every file is written atomically, and a directory's files together (``written_together``): a save that
    fails leaves every earlier file as it was.
    """
    own = for_output(path, framework)
    validate_weights(config, weights)
    if own is DIRECTORY and framework not in DIRECTORY_FRAMEWORKS:
        raise UsageError(
            f"{path}: a directory is a d2l pretrained-model directory, holding one framework's {PARAMS_FILE}, "
            f"or a library's (HuggingFace's, PaddleNLP's): say which with framework= (--framework), one of "
            f"{DIRECTORY_FRAMEWORKS}"
        )
    with written_together():
        own.write(Path(path), config, weights, framework=framework, vocab=vocab, settings=settings)
    return own.kind


def convert(
    source: str | Path,
    target: str | Path,
    *,
    framework: str | None = None,
    vocab: list[str] | None = None,
    **statements: Any,
) -> Checkpoint:
    """Read ``source`` in any format (``statements`` as for ``load_checkpoint``) and write it to
    ``target`` in the format its name asks for; the vocabulary travels when the source has one, and so do
    the settings a HuggingFace directory records."""
    output_format(target, framework)  # refuse a bad output name before reading anything
    checkpoint = load_checkpoint(source, **statements)
    save_checkpoint(
        target,
        checkpoint.config,
        checkpoint.weights,
        framework=framework,
        vocab=vocab or checkpoint.vocab,
        settings=checkpoint.info.settings,
    )
    return checkpoint


def from_huggingface(path: str | Path, dtype: object = None) -> Checkpoint:
    """A HuggingFace BERT directory (``config.json`` beside weights of one of ``huggingface.WEIGHT_FILES``) as
    a ``Checkpoint`` of the ``bert`` preset: its config says everything, so nothing needs stating."""
    if not huggingface.FORMAT.recognizes(Probe(Path(path), b"", ())):
        raise WeightsError(
            f"{path}: not a HuggingFace model directory: expected {huggingface.CONFIG_FILE} and "
            f"{', '.join(huggingface.WEIGHT_FILES[:-1])} or {huggingface.WEIGHT_FILES[-1]}"
        )
    return load_checkpoint(path, dtype=dtype)
