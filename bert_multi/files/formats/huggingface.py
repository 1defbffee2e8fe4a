"""HuggingFace BERT checkpoints, read and written without transformers.

A HuggingFace BERT is a directory holding ``config.json`` and its weights, ``model.safetensors`` or (older)
``pytorch_model.bin``, or, saved by transformers' TensorFlow and Flax classes (gone since transformers 5),
``tf_model.h5`` or ``flax_model.msgpack``. Its config says every size, the number of heads included, so
nothing needs stating. Names map to the canonical ones by one table (``transformers_names.py``); buffers
such as ``position_ids`` and the decoder weight tied to the word embeddings are ignored by name (the tie
is checked). safetensors is parsed by ``safetensors.py``, every size checked against the file before anything
is read; ``pytorch_model.bin`` goes to torch with ``weights_only=True``; ``tf_model.h5`` is parsed by
``hdf5.py`` and ``flax_model.msgpack`` by ``flax.py``, their names turned into those transformers' PyTorch
classes give. Google's TensorFlow checkpoints use the same names and config (``tensorflow.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...arrays import contiguous_transpose
from ...backend.registry import load_backend
from ...errors import UsageError, WeightsError
from ...safe_files import open_regular, reason, replace_text, size_field
from ...spec.config import HEADS, BERTConfig
from ...spec.schema import param_shapes
from ...spec.semantics import PRESETS, Semantics
from .base import (
    CheckpointFormat,
    Probe,
    Raw,
    is_directory,
    is_regular_file,
    no_key,
    task_head_left_out,
    translated,
)
from .flax import read_tree
from .hdf5 import read_hdf5
from .hub_cache import another_librarys, is_cache_folder, snapshot
from .peft import CONFIG as ADAPTER_CONFIG
from .safetensors import read_metadata, read_safetensors, write_safetensors
from .shards import INDEX_SUFFIX, read_shards
from .transformers_names import (
    BIAS,
    DECODER_BIAS,
    LEAVES,
    NAMES,
    RELATIVES,
    canonical_arrays,
    described_relative,
    flax_name,
)

CONFIG_FILE, SAFETENSORS_FILE, TORCH_FILE = "config.json", "model.safetensors", "pytorch_model.bin"
# pytorch-pretrained-bert (transformers' name until mid-2019) named the config as Google did.
OLD_CONFIG_FILE = "bert_config.json"
TF_FILE, FLAX_FILE = "tf_model.h5", "flax_model.msgpack"
# The first a directory holds is read; a checkpoint saved in shards has an index in place of its file.
WEIGHT_FILES = (
    SAFETENSORS_FILE,
    SAFETENSORS_FILE + INDEX_SUFFIX,
    TORCH_FILE,
    TORCH_FILE + INDEX_SUFFIX,
    TF_FILE,
    FLAX_FILE,
)
MAX_CONFIG_BYTES = 1 << 20

# The transformers class holding exactly each set of heads: all but BertModel hold a BertModel as ``bert``.
CLASSES = {
    HEADS: "BertForPreTraining",
    ("mlm",): "BertForMaskedLM",
    ("pooler", "nsp"): "BertForNextSentencePrediction",
    ("pooler",): "BertModel",
    (): "BertModel",
}

# bert_multi's size -> config.json's: each a whole number in a sane range, never converted from anything else.
SIZE_FIELDS = {
    "vocab_size": "vocab_size",
    "num_hiddens": "hidden_size",
    "ffn_num_hiddens": "intermediate_size",
    "num_heads": "num_attention_heads",
    "num_blks": "num_hidden_layers",
    "max_len": "max_position_embeddings",
}

# hidden_act -> semantics.activation: HuggingFace's "gelu" is the erf form, its tanh forms have 3 names.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def is_model_directory(path: Path) -> bool:
    """Whether ``path`` is a HuggingFace model directory (a config and weights in a format read here; a
    weights file that is a dangling link or no regular file is refused by name when read)."""
    configs = (CONFIG_FILE, OLD_CONFIG_FILE)
    return any(is_regular_file(path / name) for name in configs) and any(
        os.path.lexists(path / name) for name in WEIGHT_FILES
    )


def in_its_directory(path: Path) -> bool:
    """Whether ``path`` is the weights, or a shard of them, of the HuggingFace directory it is in: read alone,
    they would lose what its config says."""
    shard = re.fullmatch(
        r"(model|pytorch_model|flax_model|tf_model)-\d+-of-\d+\.(safetensors|bin|msgpack|h5)", path.name
    )
    own = path.name in (SAFETENSORS_FILE, TORCH_FILE, FLAX_FILE, TF_FILE) or shard is not None
    return own and is_model_directory(path.parent)


# --- Directories ------------------------------------------------------------------------------------------


def read_config(path: Path, what: str = "HuggingFace config") -> dict[str, Any]:
    """A BERT's JSON config (transformers' config.json, Google's bert_config.json) as a dict. Asked before any
    tensor is read: a model of another architecture (RoBERTa, DistilBERT) is named as such, not listed as
    tensors of no known layer."""
    with open_regular(path, what, WeightsError) as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    try:
        hf = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise WeightsError(f"{path}: not valid JSON: {reason(error)}") from None
    if not isinstance(hf, dict) or len(data) > MAX_CONFIG_BYTES:
        raise WeightsError(f"{path}: expected a JSON object of at most {MAX_CONFIG_BYTES} bytes")
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        if isinstance(model_type, str) and model_type in RELATIVES:
            raise WeightsError(f"{path}: model_type is {model_type!r}: {described_relative(RELATIVES[model_type])}")
        raise WeightsError(f"{path}: model_type is {model_type!r:.80}; bert_multi reads BERT (model_type 'bert')")
    return hf


def _semantics(hf: dict[str, Any], tied: bool) -> Semantics:
    """The switches a HuggingFace BERT config asks for, or a ``ValueError`` naming what bert_multi lacks."""
    for key, wanted in (("position_embedding_type", "absolute"), ("type_vocab_size", 2), ("is_decoder", False)):
        value = hf.get(key, wanted)
        if type(value) is not type(wanted) or value != wanted:  # 2.0 is no count, 0 no false
            raise ValueError(f"{key} is {value!r:.80}; bert_multi computes BERT with {key} {wanted!r}")
    act = hf.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r:.80} is not one bert_multi computes: {sorted(ACTIVATIONS)}")
    eps = hf.get("layer_norm_eps", 1e-12)
    return dataclasses.replace(
        PRESETS["bert"], activation=ACTIVATIONS[act], layer_norm_eps=eps, mlm_decoder="tied" if tied else "own"
    )


def read_directory(
    path: str | Path,
) -> tuple[BERTConfig, dict[str, np.ndarray], dict[str, str], list[str], dict[str, Any]]:
    """(config, canonical arrays, their own dtypes, notes, settings) of a HuggingFace BERT directory: the
    settings are config.json as read, so that what bert_multi does not compute from the model (any field
    but ``COMPUTED``) is written again unchanged, in its place (``write_directory``); its hidden dropout is
    the config's."""
    path = Path(path)
    config_file = path / (CONFIG_FILE if os.path.lexists(path / CONFIG_FILE) else OLD_CONFIG_FILE)
    hf = read_config(config_file)
    present = [name for name in WEIGHT_FILES if os.path.lexists(path / name)]  # a FIFO too: refused when read
    if not present:
        raise WeightsError(f"{path}: no weights: expected {', '.join(WEIGHT_FILES[:-1])} or {WEIGHT_FILES[-1]}")
    source = present[0]
    file_names: dict[str, str] = {}  # where the file names a tensor otherwise than transformers' PyTorch classes
    kind = source.removesuffix(INDEX_SUFFIX)  # the file, or the file an index names shards of
    read = {SAFETENSORS_FILE: read_safetensors, TORCH_FILE: _read_torch, TF_FILE: read_hdf5, FLAX_FILE: read_tree}[kind]
    own, dtypes = read(path / source) if kind == source else read_shards(path / source, read)
    names = {TF_FILE: "keras", FLAX_FILE: "flax"}.get(kind, "pt")
    if source == SAFETENSORS_FILE:  # transformers 4's TensorFlow and Flax classes wrote their own names in it
        names = read_metadata(path / source).get("format", "pt")
    if names in TO_TORCH_NAMES:
        own, dtypes, file_names = torch_names(path / source, own, dtypes, TO_TORCH_NAMES[names])
    framework = NAMED_BY.get(names)
    what = source if kind == source else f"the shards {source} names"
    notes = [f"read {what} and {config_file.name}" + (f" ({framework}'s kernels transposed)" if framework else "")]
    config, arrays, kinds = from_transformers_names(path / source, config_file, own, dtypes, hf, notes, file_names)
    return config, arrays, kinds, notes, hf


def _read_torch(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    own, dtypes, _ = load_backend("torch").read_checkpoint(path)
    return own, dtypes


def keras_name(name: str, scopes: int) -> tuple[str, bool]:
    """(the PyTorch name of a weight of a transformers TensorFlow BERT, whether it is a kernel), read past its
    first ``scopes``: in ``tf_model.h5``, Keras's layer group and the model's scope; in ``model.safetensors``,
    none. Then transformers' own scopes, where ``layer_._3`` is a list's item and ``mlm___cls`` is ``cls``."""
    parts = [part.rpartition("___")[2] for part in re.sub(r":\d+$", "", name).split("/")[scopes:]]
    stem, dot, leaf = ".".join(parts).replace("_._", ".").rpartition(".")
    return stem + dot + LEAVES.get(leaf, leaf), leaf == "kernel"


# Whose names each of them is, for notes.
NAMED_BY = {"tf": "TensorFlow", "keras": "TensorFlow", "flax": "Flax"}
# Each framework's names of a transformers BERT read as its PyTorch classes': in model.safetensors (its metadata's
# format: tf, flax), tf_model.h5 (keras) and flax_model.msgpack (flax).
TO_TORCH_NAMES: dict[str, Callable[[str], tuple[str, bool]]] = {
    "tf": partial(keras_name, scopes=0),
    "keras": partial(keras_name, scopes=2),
    "flax": flax_name,
}


def torch_names(
    path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, str], torch_name: Callable[[str], tuple[str, bool]]
) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, str]]:
    """A Flax, Keras or PaddleNLP file's ``arrays`` under their PyTorch names (``torch_name``), (in, out)
    kernels transposed to (out, in); their own dtypes; and the file's name of each. A tensor saved under two names
    is read once (Keras saves a shared weight under each layer using it) if their numbers are the same.
    ``arrays`` is emptied as it is read, so that each kernel is freed once transposed."""
    own: dict[str, np.ndarray] = {}
    kinds: dict[str, str] = {}
    file_names: dict[str, str] = {}
    for name in list(arrays):
        array = arrays.pop(name)
        renamed, kernel = torch_name(name)
        array = contiguous_transpose(array) if kernel and array.ndim == 2 else array
        if renamed in own:
            if own[renamed].shape == array.shape and np.array_equal(own[renamed], array):
                continue
            raise WeightsError(f"{path}: {file_names[renamed]!r} and {name!r} are both {renamed}, with other numbers")
        file_names[renamed], own[renamed], kinds[renamed] = name, array, dtypes[name]
    return own, kinds, file_names


def from_transformers_names(
    source: Path,
    config_file: Path,
    own: dict[str, np.ndarray],
    dtypes: dict[str, str],
    hf: dict[str, Any],
    notes: list[str],
    file_names: dict[str, str] | None = None,
) -> tuple[BERTConfig, dict[str, np.ndarray], dict[str, str]]:
    """(config, canonical arrays, their own dtypes) of a BERT's tensors under transformers' names (``own``,
    read from ``source``, where the file names them otherwise, by ``file_names``) and its config (``hf``,
    read from ``config_file``). A task head is left out, and ``notes`` says so; a decoder equal to the word
    embeddings is the tie."""
    arrays, kinds, tied, task_head = canonical_arrays(source, own, dtypes, file_names)
    if task_head:
        notes.append(left_out(hf, task_head))
    heads = tuple(
        head
        for head, probe in zip(HEADS, ("hidden.0.weight", "mlm.mlp.0.weight", "nsp.output.weight"))
        if probe in arrays
    )
    try:
        sizes = {ours: size_field(hf.get(theirs), theirs, 1, 1 << 31) for ours, theirs in SIZE_FIELDS.items()}
        # Checked against what the file holds before anything of that size is built (each layer has tensors).
        if sizes["num_blks"] > len(arrays):
            raise ValueError(f"num_hidden_layers is {sizes['num_blks']}, but the weights hold {len(arrays)} tensors")
        config = BERTConfig(**sizes, semantics=_semantics(hf, tied), heads=heads, dropout=_dropout(hf))
    except (KeyError, TypeError, ValueError) as error:  # UsageError too: BERTConfig's own checks
        raise WeightsError(f"{config_file}: not a usable BERT config: {reason(error)}") from None
    return config, arrays, kinds


def left_out(hf: dict[str, Any], names: list[str]) -> str:
    """The note for a fine-tuning head read past, naming the model class config.json records."""
    architectures = hf.get("architectures")
    named = architectures[0] if isinstance(architectures, list) and architectures else None
    whose = f" of {named[:80]!r}" if isinstance(named, str) else ""
    return task_head_left_out(names, f"the task head{whose}")


def _dropout(hf: dict[str, Any]) -> float:
    """config.json's hidden dropout (transformers' default where it has none), a number in [0, 1)."""
    value = hf.get(DROPOUT_FIELDS[0], TRANSFORMERS_DROPOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{DROPOUT_FIELDS[0]} is {value!r:.80}; expected a number in [0, 1)")
    return float(value)


def hf_names(config: BERTConfig, inside: bool | None = None) -> dict[str, str]:
    """Canonical name -> transformers' name, in the schema's order: ``bert.`` prefixed where the BertModel is
    ``inside`` a class with heads (``BertForPreTraining`` ... hold it as ``bert``; by default, where the
    model's heads are more than a BertModel's), and without the heads' (``cls.``) names where it is not."""
    inside = CLASSES.get(config.heads, "") != "BertModel" if inside is None else inside
    names = {}
    for name in param_shapes(config):
        hf_name = translated(name, NAMES, reverse=True)
        assert hf_name is not None, name  # every canonical name of the original BERT has a row
        if not hf_name.startswith("cls."):
            names[name] = f"bert.{hf_name}" if inside else hf_name
        elif inside:
            names[name] = hf_name
    return names


def expressible(config: BERTConfig) -> str | None:
    """Why a HuggingFace BERT cannot express ``config``, or None if it can."""
    reason = inexpressible_semantics(config)
    if reason is None and config.heads not in CLASSES:
        return f"transformers has no BERT class with exactly the heads {list(config.heads)}"
    return reason


def inexpressible_semantics(config: BERTConfig, whose: str = "a HuggingFace BERT") -> str | None:
    """Why no HuggingFace BERT (or ``whose``: another library's BERT that computes the original one) computes
    ``config``'s semantics, or None if one does (whatever its heads)."""
    semantics = config.semantics
    if (semantics.embedding_norm and semantics.positions == "learned" and semantics.attention_bias
            and semantics.valid_lens_over_heads == "interleaved" and semantics.nsp_head == "pooler"):  # fmt: skip
        return None
    return (
        f"{whose} computes the original BERT; this model computes {semantics!r}, which it cannot "
        "express (it needs the embedding LayerNorm, learned positions, biased attention, interleaved heads)"
    )


def to_huggingface(config: BERTConfig, weights: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json's fields, arrays under transformers' names) of a model transformers can compute, as the
    class holding its heads (``CLASSES``); else a ``UsageError``."""
    reason = expressible(config)
    if reason is not None:
        raise UsageError(reason)
    semantics = config.semantics
    inverse = hf_names(config)
    arrays = {
        inverse[name]: (array[0] if name == "encoder.pos_embedding" else array) for name, array in weights.items()
    }
    if BIAS in arrays:  # under both names, as transformers keeps it when the decoder is untied
        arrays[DECODER_BIAS] = arrays[BIAS]
    hf = {
        "architectures": [CLASSES[config.heads]],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.num_hiddens,
        "num_hidden_layers": config.num_blks,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.ffn_num_hiddens,
        "hidden_act": {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[semantics.activation],
        "max_position_embeddings": config.max_len,
        "type_vocab_size": 2,
        "layer_norm_eps": semantics.layer_norm_eps,
        "tie_word_embeddings": semantics.mlm_decoder == "tied",
        **dict.fromkeys(DROPOUT_FIELDS, config.dropout),
        "dtype": next(iter(weights.values())).dtype.name,
    }
    return hf, arrays


# config.json's fields that bert_multi computes from the model (``to_huggingface``): every other field of a
# directory read is written again unchanged. ``torch_dtype`` is what transformers now calls dtype.
COMPUTED = (
    *("architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
    *("intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps"),
    *("tie_word_embeddings", "dtype", "torch_dtype"),
)
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
TRANSFORMERS_DROPOUT = 0.1  # BertConfig's default for both


def config_json(config: BERTConfig, hf: dict[str, Any], settings: dict[str, Any] | None) -> dict[str, Any]:
    """The config.json to write: the config.json read (``settings``), in its order, with what ``hf``
    (``to_huggingface``) computes from the model written over it, but its dropout; with none, the dropout
    only where it is known (a config's non-zero one), else left to transformers' default, since d2l's files
    do not record it."""
    if not settings:
        return {key: value for key, value in hf.items() if key not in DROPOUT_FIELDS or config.dropout > 0}
    written = {key: value for key, value in settings.items() if key != "torch_dtype"}
    written.update({key: value for key, value in hf.items() if key not in DROPOUT_FIELDS or key not in settings})
    return written


def config_notes(config: BERTConfig, settings: dict[str, Any] | None) -> list[str]:
    """What a written config.json kept, changed or left out, for the person converting."""
    if not settings:
        if config.dropout > 0:
            return [f"config.json: dropout {config.dropout:g}, the config's"]
        return [
            "config.json: the source records no dropout, so hidden_dropout_prob and attention_probs_dropout_prob "
            f"are left out: transformers trains it with its default, {TRANSFORMERS_DROPOUT}"
        ]
    kept = [key for key in settings if key not in COMPUTED]
    shown = ", ".join(kept[:20]) + (f" and {len(kept) - 20} more" if len(kept) > 20 else "")
    notes = [f"config.json: kept the source's {shown} unchanged"] if kept else []
    if "torch_dtype" in settings:
        notes.append("config.json: torch_dtype written as dtype, as transformers writes it now")
    return notes


def write_directory(
    path: str | Path, config: BERTConfig, weights: dict[str, np.ndarray], settings: dict[str, Any] | None = None
) -> None:
    """A HuggingFace BERT directory (``config.json``, ``model.safetensors``) that transformers loads with
    ``from_pretrained`` (see ``to_huggingface`` for which models it can hold), keeping the ``settings`` of
    the directory it was read from (``config_json``)."""
    hf, arrays = to_huggingface(config, weights)
    hf = config_json(config, hf, settings)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory / SAFETENSORS_FILE, arrays, {"format": "pt"})
    replace_text(directory / CONFIG_FILE, json.dumps(hf, indent=2) + "\n")


class ModelDirectory(CheckpointFormat):
    kind = "hf-dir"
    framework_option = "huggingface"
    sniff: Callable[[Path], CheckpointFormat] | None = None  # the registry's, set there: for a cache's snapshot
    description = (
        "HuggingFace BERT directory (config.json + model.safetensors, pytorch_model.bin, tf_model.h5 or "
        "flax_model.msgpack; or the hub cache's folder of one, models--org--name)"
    )
    directory = True
    marker_files = (CONFIG_FILE, OLD_CONFIG_FILE)

    def recognizes(self, probe: Probe) -> bool:
        return is_directory(probe.path) and (is_model_directory(probe.path) or is_cache_folder(probe.path))

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        which = None
        if not is_model_directory(path):  # the hub cache's folder: one of its snapshots is the directory
            path, which = snapshot(path)
            if not is_model_directory(path):
                expected = f"{CONFIG_FILE} beside its weights ({', '.join(WEIGHT_FILES)})"
                return another_librarys(path, which, self.sniff, expected)
        config, arrays, dtypes, notes, settings = read_directory(path)
        if which:
            notes.insert(0, f"read the HuggingFace cache folder's snapshot {path.name[:12]} ({which})")
        if is_regular_file(path / ADAPTER_CONFIG):  # PEFT saved an adapter beside the model it adapts
            notes.append(
                f"read the model without the PEFT adapter beside it ({ADAPTER_CONFIG}), which it does not merge"
            )
        return Raw(self.kind, None, arrays, dtypes, notes, config=config, settings=settings)

    def write(
        self,
        path: Path,
        config: BERTConfig,
        weights: dict[str, np.ndarray],
        framework: str | None = None,
        vocab: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        write_directory(path, config, weights, settings)


FORMAT = ModelDirectory()
