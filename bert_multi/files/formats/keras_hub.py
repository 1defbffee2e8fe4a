"""KerasHub's BERT presets (Keras 3's model library, KerasNLP before it), read without Keras.

``save_to_preset`` writes a directory holding ``config.json``, the backbone's class and arguments, and
``model.weights.h5``, Keras 3's HDF5 weights file (parsed by ``hdf5.py``). Keras 3 names a weight by where
it is in the model, as its own ``load_weights`` matches them: a layer by its class (``transformer_encoder``,
``transformer_encoder_1``, ... in the order the model holds them), a sublayer by its attribute
(``_self_attention_layer/query_dense``), a variable by its place (``vars/0``, ``vars/1``). ``LAYERS`` and
``SUBLAYERS`` map them to the canonical ones. A Dense's kernel is (in, out), transposed here; Keras's
attention keeps the heads as an axis of their own (a query's kernel is (hidden, heads, head size)), folded
here into the canonical (out, in), the heads checked against the config's.

``model.save`` writes the same two files in one zip (a ``.keras`` file); there, a task's ``config.json``
holds its backbone's, and its weights hold the backbone as a layer of the task, whose group alone is read.

KerasHub's ``BertBackbone`` computes the original BERT with GELU's tanh approximation (Google's). A task
saved with it (``task.json`` and ``task.weights.h5``, or in a ``.keras`` file) has its head left out, and a
note says why.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...safe_files import open_regular, reason, size_field
from ...spec.config import BERTConfig
from ...spec.schema import param_shapes
from ...spec.semantics import PRESETS
from .base import (
    CheckpointFormat,
    Member,
    Probe,
    Raw,
    extract,
    is_directory,
    no_key,
    some,
    stored_member,
    task_head_left_out,
    zip_errors,
)
from .hdf5 import read_hdf5
from .huggingface import read_config

CONFIG_FILE, WEIGHTS_FILE, TASK_FILE, TASK_WEIGHTS = "config.json", "model.weights.h5", "task.json", "task.weights.h5"
TASK_BACKBONE = "bert_backbone"  # a task's layer holding its BertBackbone, named (as Keras names layers) by its class
SHARDED_FILE = "model.weights.json"  # the index of a preset saved in shards (over 10 GB: no BERT is)
BACKBONE = "BertBackbone"
# The original BERT as KerasHub's BertBackbone computes it: its FFN's GELU is the tanh approximation.
SEMANTICS = dataclasses.replace(PRESETS["bert"], activation="gelu_tanh")
# BertBackbone's argument -> bert_multi's size.
SIZE_FIELDS = {
    "vocabulary_size": "vocab_size",
    "hidden_dim": "num_hiddens",
    "intermediate_dim": "ffn_num_hiddens",
    "num_heads": "num_heads",
    "num_layers": "num_blks",
    "max_sequence_length": "max_len",
}
# Keras's path of a BertBackbone's layer -> the canonical names of what it holds, its vars/0 and vars/1; a
# block's layers are under BLOCK's path.
LAYERS = {
    "reversible_embedding": ("encoder.token_embedding.weight",),
    "position_embedding": ("encoder.pos_embedding",),  # (P, H) there, (1, P, H) here
    "embedding": ("encoder.segment_embedding.weight",),
    "layer_normalization": ("encoder.embedding_norm.weight", "encoder.embedding_norm.bias"),
    "dense": ("hidden.0.weight", "hidden.0.bias"),
}
BLOCK = re.compile(r"transformer_encoder(?:_(?P<i>[1-9]\d*))?/(?P<sublayer>.+)")  # the first has no number
# A Dense's kernel, (in, out) in Keras.
KERNELS = r"hidden\.0\.weight|encoder\.blks\.\d+\.ffn\.dense[12]\.weight"
SUBLAYERS = {
    "_self_attention_layer/query_dense": "attention.W_q",
    "_self_attention_layer/key_dense": "attention.W_k",
    "_self_attention_layer/value_dense": "attention.W_v",
    "_self_attention_layer/output_dense": "attention.W_o",
    "_self_attention_layer_norm": "addnorm1.ln",
    "_feedforward_intermediate_dense": "ffn.dense1",
    "_feedforward_output_dense": "ffn.dense2",
    "_feedforward_layer_norm": "addnorm2.ln",
}
# Why a BertMaskedLM's head is left out: it is the original BERT's, but computed otherwise than its encoder.
MASKED_LM_HEAD = (
    "left out the MLM head of KerasHub's 'BertMaskedLM' ({where}): it computes GELU's erf form and "
    "LayerNorm eps 1e-5 where its encoder computes the tanh form and 1e-12, and bert_multi (as transformers) "
    "computes one of each for the whole model, so neither compared nor converted"
)


def canonical_name(path: str) -> str | None:
    """The canonical name of a BertBackbone's weight under its path in ``model.weights.h5``, or None."""
    match = re.fullmatch(r"layers/(?P<layer>.+)/vars/(?P<var>[01])", path)
    if match is None:
        return None
    layer, var = match["layer"], int(match["var"])
    if layer in LAYERS:
        return LAYERS[layer][var] if var < len(LAYERS[layer]) else None
    block = BLOCK.fullmatch(layer)
    if block is None or block["sublayer"] not in SUBLAYERS:
        return None
    return f"encoder.blks.{block['i'] or 0}.{SUBLAYERS[block['sublayer']]}.{('weight', 'bias')[var]}"


def canonical_array(name: str, array: np.ndarray, num_heads: int) -> np.ndarray:
    """``array`` as the canonical ``name`` holds it: a Dense's (in, out) kernel transposed; an attention's
    (hidden, heads, head size) kernels and (heads, head size) biases folded (its output's kernel is
    (heads, head size, hidden)); a ``ValueError`` where the array is not of the rank Keras gives it."""
    attention = re.search(r"attention\.W_(?P<which>[qkvo])\.(?P<leaf>weight|bias)$", name)
    if attention is None:
        if name == "encoder.pos_embedding":
            return _ranked(array, 2)[None]
        return np.ascontiguousarray(_ranked(array, 2).T) if re.fullmatch(KERNELS, name) else array
    output, bias = attention["which"] == "o", attention["leaf"] == "bias"
    rank = 1 if output and bias else 2 if bias else 3
    _ranked(array, rank)
    heads = array.shape[0 if output or bias else 1]
    if rank > 1 and heads != num_heads:
        raise ValueError(f"it holds {heads} heads, where config.json's num_heads is {num_heads}")
    if bias:
        return array.reshape(-1)
    folded = array.reshape(-1, array.shape[-1]) if output else array.reshape(array.shape[0], -1)
    return np.ascontiguousarray(folded.T)


def _ranked(array: np.ndarray, rank: int) -> np.ndarray:
    if array.ndim != rank:
        raise ValueError(f"it is of shape {array.shape}, where Keras saves it with {rank} axes")
    return array


def read_backbone_config(path: Path) -> tuple[BERTConfig, str | None]:
    """The config of the BertBackbone a ``config.json`` describes, alone or as a task's backbone (as a
    ``.keras`` file's does), and the task's class; a ``WeightsError`` naming another class (a RoBERTa's, a
    DistilBERT's) or what is wrong, before any tensor is read."""
    saved = read_config(path, "KerasHub config")
    task, backbone, whose = None, saved, "its"
    held = saved["config"].get("backbone") if isinstance(saved.get("config"), dict) else None
    if saved.get("class_name") != BACKBONE and isinstance(held, dict):  # a task's: its backbone is in it
        task, backbone = str(saved.get("class_name"))[:80], held
        whose = f"its task {task!r} holds a backbone whose"
    name, arguments = backbone.get("class_name"), backbone.get("config")
    if name != BACKBONE:
        raise WeightsError(f"{path}: {whose} class_name is {name!r:.80}; bert_multi reads KerasHub's {BACKBONE}")
    if not isinstance(arguments, dict):
        raise WeightsError(f"{path}: its config is {arguments!r:.80}, where a {BACKBONE}'s arguments are an object")
    try:
        sizes = {ours: size_field(arguments.get(theirs), theirs, 1, 1 << 31) for theirs, ours in SIZE_FIELDS.items()}
        segments = arguments.get("num_segments", 2)
        if type(segments) is not int or segments != 2:
            raise ValueError(f"num_segments is {segments!r:.80}; bert_multi computes BERT with 2 segments")
        dropout = arguments.get("dropout", 0.1)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"dropout is {dropout!r:.80}; expected a number in [0, 1)")
        config = BERTConfig(**sizes, semantics=SEMANTICS, heads=("pooler",), dropout=float(dropout))
    except (TypeError, ValueError) as error:  # UsageError too: BERTConfig's own checks
        raise WeightsError(f"{path}: not a usable {BACKBONE} config: {reason(error)}") from None
    return config, task


def read_weights(
    path: Path, config: BERTConfig, within: str, member: Member | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(canonical arrays, in the schema's order, and their dtypes) of the BertBackbone saved in the HDF5
    file at ``path`` (or its zip's ``member``), in its group ``within`` (a task's backbone is its layer
    ``bert_backbone``)."""
    arrays, dtypes = read_hdf5(path, within, member)
    path = path / member.name if member else path
    if not arrays:
        raise WeightsError(f"{path}: no weights in {within or 'it'!r}, where its config says the {BACKBONE}'s are")
    prefix = f"{within}/" if within else ""
    names = {name: canonical_name(name.removeprefix(prefix)) for name in arrays}
    unknown = [name for name, canonical in names.items() if canonical is None]
    if unknown:
        raise WeightsError(f"{path}: weights of no BertBackbone layer bert_multi knows: {some(unknown)}")
    # Checked before any list of the config's tensors is made: its num_layers is the file's to bound.
    blocks = sorted(
        {int(found[1]) for name in names.values() if (found := re.match(r"encoder\.blks\.(\d+)\.", str(name)))}
    )
    if blocks != list(range(config.num_blks)):
        raise WeightsError(
            f"{path}: it holds the blocks {some(blocks)}, where its config's num_layers is {config.num_blks}"
        )
    canonical: dict[str, np.ndarray] = {}
    kinds: dict[str, str] = {}
    for name in list(arrays):  # each of the file's arrays freed once turned into the canonical one
        array, ours = arrays.pop(name), names[name]
        assert ours is not None
        try:
            canonical[ours] = canonical_array(ours, array, config.num_heads)
        except ValueError as error:
            raise WeightsError(f"{path}: {name!r} ({ours}): {error}") from None
        kinds[ours] = dtypes[name]
    order = [name for name in param_shapes(config) if name in canonical]  # the schema's, not the file's
    return {name: canonical[name] for name in [*order, *(name for name in canonical if name not in order)]}, kinds


def notes_for(task: str | None, where: str) -> list[str]:
    """What reading a BertBackbone says: how its weights were read, and the head of its ``task`` (saved in
    ``where``) left out, and why."""
    notes = [f"read {WEIGHTS_FILE} and {CONFIG_FILE} (KerasHub's {BACKBONE}; Keras's kernels transposed, "
             "its attention's heads folded)"]  # fmt: skip
    if task == "BertMaskedLM":
        notes.append(MASKED_LM_HEAD.format(where=where))
    elif task is not None:
        notes.append(task_head_left_out([where], f"the head of KerasHub's {task!r}"))
    return notes


def read_saved(
    config_file: Path, weights_file: Path, member: Member | None = None
) -> tuple[BERTConfig, str | None, dict[str, np.ndarray], dict[str, str]]:
    """(config, task class or None, canonical arrays, their dtypes) of a ``config.json`` and its
    ``model.weights.h5`` (or the ``member`` of the zip ``weights_file`` holding it): a backbone's, or a task's,
    whose weights hold its backbone as the layer ``bert_backbone``."""
    config, task = read_backbone_config(config_file)
    within = "" if task is None else f"layers/{TASK_BACKBONE}"
    return config, task, *read_weights(weights_file, config, within, member)


def read_preset(path: Path) -> Raw:
    """The config and canonical tensors of a KerasHub BERT preset, with notes of what was read past."""
    if os.path.lexists(path / SHARDED_FILE) and not os.path.lexists(path / WEIGHTS_FILE):
        raise WeightsError(f"{path}: a preset saved in shards ({SHARDED_FILE}), which bert_multi does not read")
    config, task, arrays, kinds = read_saved(path / CONFIG_FILE, path / WEIGHTS_FILE)
    where = WEIGHTS_FILE
    if task is None and os.path.lexists(path / TASK_FILE):  # the task's config and weights beside its backbone's
        task, where = str(read_config(path / TASK_FILE, "KerasHub task config").get("class_name"))[:80], TASK_WEIGHTS
    return Raw(FORMAT.kind, None, arrays, kinds, notes_for(task, where), config=config)


def is_preset(path: Path) -> bool:
    """Whether ``path`` is a directory KerasHub's ``save_to_preset`` wrote (a config beside its weights; either
    a dangling link or no regular file is refused by name when read)."""
    return all(os.path.lexists(path / name) for name in (CONFIG_FILE, WEIGHTS_FILE)) or (
        os.path.lexists(path / CONFIG_FILE) and os.path.lexists(path / SHARDED_FILE)
    )


class Preset(CheckpointFormat):
    kind = "keras-hub"
    description = "KerasHub BERT preset (config.json + model.weights.h5, as save_to_preset writes it)"
    directory = True
    marker_files = (CONFIG_FILE,)

    def recognizes(self, probe: Probe) -> bool:
        return is_directory(probe.path) and is_preset(probe.path)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        return read_preset(path)


class KerasFile(CheckpointFormat):
    kind = "keras-file"
    description = (
        "Keras model file of a KerasHub BERT (.keras: config.json + model.weights.h5, as model.save writes it)"
    )
    zip_marker = f"a Keras model file (no {WEIGHTS_FILE} beside {CONFIG_FILE})"

    def recognizes(self, probe: Probe) -> bool:
        return {CONFIG_FILE, WEIGHTS_FILE} <= set(probe.members)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        with tempfile.TemporaryDirectory(prefix="bert_multi-") as scratch:
            config_file, weights_file = Path(scratch) / CONFIG_FILE, Path(scratch) / WEIGHTS_FILE
            with zip_errors(path), open_regular(path, "Keras model file", WeightsError) as file:
                with zipfile.ZipFile(file) as archive:
                    extract(archive, archive.getinfo(CONFIG_FILE), config_file, path)
                    member = stored_member(file, archive.getinfo(WEIGHTS_FILE), path)  # read in place, or copied
                    if member is None:
                        extract(archive, archive.getinfo(WEIGHTS_FILE), weights_file, path)
            try:
                config, task, arrays, kinds = read_saved(config_file, path if member else weights_file, member)
            except WeightsError as error:  # name the file the user gave, not a scratch copy
                raise WeightsError(str(error).replace(scratch, str(path))) from None
        return Raw(
            self.kind, None, arrays, kinds, notes_for(task, f"{WEIGHTS_FILE}, beside its backbone"), config=config
        )


FORMAT, FILE = Preset(), KerasFile()
