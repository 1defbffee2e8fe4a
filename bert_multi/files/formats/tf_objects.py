"""TensorFlow 2's checkpoints of the TF Model Garden's ``BertEncoder`` (whose exports are TF Hub's BERTs),
read without TensorFlow.

TensorFlow 2 saves objects, not names: a SavedModel's ``variables/variables.index`` (beside its
``saved_model.pb``, which is not read) or a training run's ``ckpt-1.index`` holds each variable under its
place in the object graph (``model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE``), and the
graph itself, a protocol buffer in the string tensor ``_CHECKPOINTABLE_OBJECT_GRAPH``, gives each
variable's own name (``word_embeddings/embeddings``, ``transformer/layer_0/self_attention/query/kernel``).
Those names map to the canonical ones (``NAMES``); the bundle's index and data are parsed by
``tensorflow.py``. The encoder's Keras layers store their kernels as KerasHub's do (a Dense's (in, out), an
attention's heads an axis of their own), turned into the canonical layout by ``keras_hub.canonical_array``.

The files record no config: the sizes are the tensors', the head count the attention kernels' heads axis,
and the computation the ``BertEncoder``'s own (GELU's tanh form, LayerNorm eps 1e-12), said in a note. An
optimizer's state (Adam's moments of each weight, its step) and ``save_counter`` are left out, and said.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...safe_files import file_size, open_regular, reason
from ...spec.config import BERTConfig
from ...spec.schema import param_shapes
from .base import CheckpointFormat, Probe, Raw, is_directory, no_key, some, task_head_left_out, translated
from .keras_hub import SEMANTICS, canonical_array
from .tensorflow import (
    INDEX_SUFFIX,
    Entry,
    Malformed,
    checkpoint_prefix,
    latest_prefix,
    proto_fields,
    read_index,
    read_tensors,
    shard_path,
    varint,
)

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
SAVED_VARIABLES = Path("variables") / "variables"  # a SavedModel's checkpoint prefix, in its directory
MAX_GRAPH_BYTES = 16 << 20  # a BERT-large's object graph with Adam's state is about 100 KB
# The BertEncoder's variable names, {p} its weight (kernel, gamma, embeddings) or bias (bias, beta), ->
# the canonical ones.
NAMES: list[tuple[str, str]] = [
    ("word_embeddings/weight", "encoder.token_embedding.weight"),
    ("position_embedding/weight", "encoder.pos_embedding"),  # (P, H) there, (1, P, H) here
    ("type_embeddings/weight", "encoder.segment_embedding.weight"),
    ("embeddings/layer_norm/{p}", "encoder.embedding_norm.{p}"),
    ("transformer/layer_{i}/self_attention/query/{p}", "encoder.blks.{i}.attention.W_q.{p}"),
    ("transformer/layer_{i}/self_attention/key/{p}", "encoder.blks.{i}.attention.W_k.{p}"),
    ("transformer/layer_{i}/self_attention/value/{p}", "encoder.blks.{i}.attention.W_v.{p}"),
    ("transformer/layer_{i}/self_attention/attention_output/{p}", "encoder.blks.{i}.attention.W_o.{p}"),
    ("transformer/layer_{i}/self_attention_layer_norm/{p}", "encoder.blks.{i}.addnorm1.ln.{p}"),
    ("transformer/layer_{i}/intermediate/{p}", "encoder.blks.{i}.ffn.dense1.{p}"),
    ("transformer/layer_{i}/output/{p}", "encoder.blks.{i}.ffn.dense2.{p}"),
    ("transformer/layer_{i}/output_layer_norm/{p}", "encoder.blks.{i}.addnorm2.ln.{p}"),
    ("pooler_transform/{p}", "hidden.0.{p}"),
]
LEAVES = {"kernel": "weight", "gamma": "weight", "embeddings": "weight", "beta": "bias", "bias": "bias"}
# A training run's state, not the model: the optimizer's step and learning rate, the checkpoint's counter.
STATE = ("iteration", "learning_rate", "save_counter")
# BertPretrainerV2's MLM head (layers.MaskedLM): its activation is an argument of the model's constructor
# (mlm_activation: none by default, GELU in TF Hub's pretraining), which no file records.
MLM_HEAD = r"(\w+/)?cls/predictions/.+"
# The heads of the Model Garden's fine-tuning models: BertClassifier's (sentence_prediction), BertSpanLabeler's
# and BertTokenClassifier's (predictions/transform).
TASK_HEADS = r"(sentence_prediction|predictions/transform)/logits/(kernel|bias)"
HEADS = {"mlm": MLM_HEAD, "task": TASK_HEADS}


def canonical_name(full_name: str) -> str | None:
    """The canonical name of a BertEncoder's variable (``transformer/layer_3/intermediate/kernel``), or None."""
    stem, _, leaf = full_name.removesuffix(":0").rpartition("/")
    return translated(f"{stem}/{LEAVES[leaf]}", NAMES) if stem and leaf in LEAVES else None


def read_text(prefix: Path, shards: int, entry: Entry) -> bytes:
    """The bytes of a scalar string tensor of the bundle: its length (a varint), a checksum of the lengths (4
    bytes), then the bytes, as TensorFlow writes a string tensor."""
    if entry.shape != () or not 0 < entry.size <= MAX_GRAPH_BYTES or entry.shard >= shards:
        raise WeightsError(
            f"{prefix}: its object graph is of shape {entry.shape} and {entry.size} bytes, where it is one string "
            f"of at most {MAX_GRAPH_BYTES >> 20} MiB, in one of the {shards} data shards"
        )
    path = shard_path(prefix, entry.shard, shards)
    with open_regular(path, "TensorFlow checkpoint data", WeightsError) as file:
        if entry.offset + entry.size > file_size(file):
            raise WeightsError(f"{path}: the object graph's {entry.size} bytes at {entry.offset} lie past its end")
        file.seek(entry.offset)
        data = file.read(entry.size)
    try:
        length, at = varint(data, 0, len(data))
    except Malformed as error:
        raise WeightsError(f"{path}: its object graph is malformed: {error}") from None
    if at + 4 + length != len(data):
        raise WeightsError(f"{path}: its object graph says {length} bytes, in a tensor of {len(data)}")
    return data[at + 4 :]


def full_names(graph: bytes, path: Path) -> dict[str, str]:
    """Each checkpoint key's variable name, from a ``TrackableObjectGraph``: its nodes (1), each node's
    attributes (2), each a ``SerializedTensor``: name (1), full_name (2), checkpoint_key (3)."""
    names: dict[str, str] = {}
    try:
        for number, node in proto_fields(graph):
            if number != 1 or not isinstance(node, bytes):
                continue
            for field, attribute in proto_fields(node):
                if field == 2 and isinstance(attribute, bytes):
                    parts = {n: v for n, v in proto_fields(attribute) if isinstance(v, bytes)}
                    key, full = (parts.get(n, b"").decode("utf-8") for n in (3, 2))
                    names[key] = full
    except (Malformed, UnicodeDecodeError) as error:
        raise WeightsError(f"{path}: its object graph is malformed: {reason(error)}") from None
    return names


def read_object_checkpoint(prefix: Path, how: str = "") -> Raw:
    """The config and canonical tensors of the BertEncoder saved at ``prefix`` (``variables/variables``,
    ``ckpt-1``), with notes of how it was read (``how``: which checkpoint of a directory) and what read past."""
    index = prefix.with_name(prefix.name + INDEX_SUFFIX)
    entries, shards = read_index(index)
    if OBJECT_GRAPH not in entries:
        raise WeightsError(f"{index}: no {OBJECT_GRAPH}: a TensorFlow 1 checkpoint, which names its variables itself")
    names = full_names(read_text(prefix, shards, entries.pop(OBJECT_GRAPH)), index)
    wanted: dict[str, str] = {}
    heads: dict[str, list[str]] = {kind: [] for kind in HEADS}
    rest: list[str] = []
    for key in entries:
        full = names.get(key, "")
        ours = canonical_name(full)
        if ours is not None:
            wanted[key] = ours
        elif head := next((kind for kind, pattern in HEADS.items() if re.fullmatch(pattern, full)), None):
            heads[head].append(full)
        else:
            rest.append(full or key)
    held = {names[key] for key in wanted} | set(heads["mlm"]) | set(heads["task"])
    # The optimizer's step, the checkpoint's counter, and a slot of a variable saved (Adam/m/<its name>).
    state = [full for full in rest if full in STATE or full.split("/", 2)[-1] in held]
    unknown = [full for full in rest if full not in STATE and full.split("/", 2)[-1] not in held]
    if unknown:
        raise WeightsError(f"{index}: variables of no BertEncoder layer bert_multi knows: {some(unknown)}")
    twice = sorted(name for name, count in Counter(wanted.values()).items() if count > 1)
    if twice:  # two variables of one name, or two names TensorFlow gives one weight (gamma, kernel)
        saved = [names[key] for key, name in wanted.items() if name == twice[0]]
        raise WeightsError(f"{index}: {saved[0]!r} and {saved[1]!r} are both {twice[0]}")
    read, dtypes = read_tensors(prefix, shards, {key: entries[key] for key in wanted})
    arrays = {wanted[key]: read.pop(key) for key in list(read)}  # each freed below once turned
    config = _config(index, arrays)
    canonical: dict[str, np.ndarray] = {}
    kinds: dict[str, str] = {}
    order = {name: at for at, name in enumerate(param_shapes(config))}  # the schema's, not the file's
    for key, name in sorted(wanted.items(), key=lambda item: order.get(item[1], len(order))):
        try:
            canonical[name] = canonical_array(name, arrays.pop(name), config.num_heads)
        except ValueError as error:
            raise WeightsError(f"{index}: {names[key]!r} ({name}): {error}") from None
        kinds[name] = dtypes[key]
    notes = [
        f"read {index.name}{how}: TensorFlow 2's object graph, the variables of a TF Model Garden BertEncoder "
        "(Keras's kernels transposed, its attention's heads folded)",
        "its config is not in the file: the sizes are the tensors', the heads the attention kernels', and the "
        "computation the BertEncoder's (GELU's tanh form, LayerNorm eps 1e-12)",
    ]
    if heads["task"]:
        notes.append(
            task_head_left_out(
                heads["task"], "the task head of a Model Garden BertClassifier, BertSpanLabeler or BertTokenClassifier"
            )
        )
    if heads["mlm"]:
        notes.append(
            f"left out the MLM head of BertPretrainerV2 ({some(sorted(heads['mlm']))}): its activation is an "
            "argument of the model's constructor (mlm_activation: none by default, GELU in TF Hub's pretraining) "
            "that the file does not record, so neither compared nor converted"
        )
    if state:
        tensors = f"{len(state)} tensor{'s' if len(state) > 1 else ''}"
        notes.append(f"left out {tensors} of training state (the optimizer's, the checkpoint's counter)")
    return Raw(FORMAT.kind, None, canonical, kinds, notes, config=config)


def _config(index: Path, arrays: dict[str, np.ndarray]) -> BERTConfig:
    """The config the tensors imply: every size, the heads of the first block's query kernel (in, heads,
    head size); refused where a tensor the sizes come from is missing or of another rank."""
    blocks = {int(found[1]) for name in arrays if (found := re.match(r"encoder\.blks\.(\d+)\.", name))}
    try:
        vocab_size, num_hiddens = arrays["encoder.token_embedding.weight"].shape
        max_len = arrays["encoder.pos_embedding"].shape[0]
        ffn_num_hiddens = arrays["encoder.blks.0.ffn.dense1.weight"].shape[1]
        num_heads = arrays["encoder.blks.0.attention.W_q.weight"].shape[1]
        segments = arrays["encoder.segment_embedding.weight"].shape[0]
        if segments != 2:
            raise ValueError(f"type_embeddings has {segments} rows; bert_multi computes BERT with 2 segments")
        if blocks != set(range(len(blocks))):
            raise ValueError(f"it holds the blocks {some(sorted(blocks))}")
        heads = ("pooler",) if "hidden.0.weight" in arrays else ()
        return BERTConfig(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, len(blocks), 0.1, max_len,
                          semantics=SEMANTICS, heads=heads)  # fmt: skip
    except KeyError as missing:
        raise WeightsError(f"{index}: no {missing.args[0]}, whose shape gives a size") from None
    except (IndexError, TypeError, ValueError) as error:  # UsageError too: BERTConfig's own checks
        raise WeightsError(f"{index}: the tensors give no usable BERT config: {reason(error)}") from None


def saved_prefix(path: Path) -> tuple[Path, str] | None:
    """The checkpoint prefix of a SavedModel directory (``variables/variables``) or of a TensorFlow 2
    checkpoint ``path`` names (a prefix, its ``.index``, or a training run's directory: its latest), and
    how it was chosen; None when ``path`` is none of these, or a TensorFlow 1 checkpoint."""
    if is_directory(path) and os.path.lexists(path / SAVED_VARIABLES.with_suffix(INDEX_SUFFIX)):  # read, or refused
        return path / SAVED_VARIABLES, " (a SavedModel's variables)"
    prefix: Path | None
    try:
        if is_directory(path):
            prefix, how = latest_prefix(path, "")
        else:
            prefix, how = checkpoint_prefix(path), ""
        if prefix is None or OBJECT_GRAPH not in read_index(prefix.with_name(prefix.name + INDEX_SUFFIX))[0]:
            return None
    except WeightsError:  # not a checkpoint, or a damaged one: Google's reader says which
        return None
    return prefix, how


class ObjectCheckpoint(CheckpointFormat):
    kind = "tf2-checkpoint"
    description = (
        "TensorFlow 2 checkpoint of a TF Model Garden BertEncoder (a SavedModel's variables/, as TF Hub's BERTs, "
        "or a training run's ckpt-N.index and data)"
    )
    directory = True
    marker_files = (SAVED_VARIABLES.with_suffix(INDEX_SUFFIX).name,)

    def recognizes(self, probe: Probe) -> bool:
        return saved_prefix(probe.path) is not None

    def names_checkpoint(self, path: Path) -> bool:
        return not is_directory(path) and saved_prefix(path) is not None

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        found = saved_prefix(path)
        if found is None:
            raise WeightsError(f"{path}: not a TensorFlow 2 checkpoint (no {OBJECT_GRAPH} in its index)")
        return read_object_checkpoint(*found)


FORMAT = ObjectCheckpoint()
