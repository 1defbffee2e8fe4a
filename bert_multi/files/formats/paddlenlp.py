"""PaddleNLP's BERTs (``save_pretrained``: ``config.json`` and ``model_state.pdparams``; with
``safe_serialization=True``, PaddleNLP 3's ``model.safetensors``; either in shards beside an index; PaddleNLP
2.0 to 2.4.2's ``model_config.json``, the arguments the model was built with, beside its weights), read
without Paddle. PaddleNLP's ``bert-base-uncased``, ``bert-base-chinese``, ``bert-wwm-chinese`` ... are
Google's BERTs converted to it.

PaddleNLP's ``BertModel`` computes transformers' BERT under other names: its encoder is Paddle's
``nn.TransformerEncoder`` (``encoder.layers.N.self_attn.q_proj``, ``linear1``, ``norm1`` ...), and its
``config.json`` has transformers' fields, whose GELU (``gelu``: the erf form) and LayerNorm eps
(``layer_norm_eps``, set on every LayerNorm when the model is built) it computes. So its tensors are
renamed to transformers' (``NAMES``), every ``nn.Linear`` weight turned from Paddle's (in, out), and read
as a transformers BERT is. Its MLM decoder is a ``TransposedLinear``, (vocab, hidden) as transformers holds
it, and tied to the word embeddings; its bias is saved under two names (``decoder_bias`` and
``decoder.bias``), read once.

PaddleNLP's safetensors hold its own names and layouts, which its metadata says (``format``: ``np``,
where transformers writes ``pt``), and bfloat16 as uint16 bits (``U16``), as Paddle's pickles do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...arrays import contiguous_transpose
from ...backend.contract import prepare_weights
from ...errors import UsageError, WeightsError
from ...safe_files import replace_file, replace_text
from ...spec.config import BERTConfig
from .base import CheckpointFormat, Probe, Raw, is_directory, is_regular_file, no_key, translated
from .huggingface import (
    CONFIG_FILE,
    from_transformers_names,
    hf_names,
    inexpressible_semantics,
    read_config,
    torch_names,
)
from .huggingface import WEIGHT_FILES as TRANSFORMERS_WEIGHT_FILES
from .paddle import LINEAR_WEIGHT, bfloat16_from_bits, read_pdparams, write_pickle
from .safetensors import read_metadata, read_safetensors
from .shards import INDEX_SUFFIX, read_shards

WEIGHTS_FILE, SAFETENSORS_FILE = "model_state.pdparams", "model.safetensors"
# Each weight file, or the index of its shards, in the order PaddleNLP's from_pretrained looks for them.
WEIGHT_FILES = [SAFETENSORS_FILE + INDEX_SUFFIX, SAFETENSORS_FILE, WEIGHTS_FILE + INDEX_SUFFIX, WEIGHTS_FILE]
PADDLENLP_FORMAT = "np"  # a safetensors file's metadata format when PaddleNLP wrote its own layout
OLD_CONFIG_FILE = "model_config.json"  # PaddleNLP 2.0 to 2.4.2's: the arguments each model was built with
# PaddleNLP 2.0 to 2.4.2's BertModel(...) arguments in order, with their defaults, which its model_config.json leaves
# out where a model was built without them (vocab_size had none before 2.3; fuse came in 2.3).
OLD_ARGUMENTS: dict[str, Any] = {
    "vocab_size": None,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 16,
    "initializer_range": 0.02,
    "pad_token_id": 0,
    "pool_act": "tanh",
    "fuse": False,
}
OLD_LAYER_NORM_EPS = 1e-12  # what each version's init_weights sets on every LayerNorm, whatever the arguments
# (PaddleNLP's name without "bert.", transformers'): {i} is a block, {p} weight or bias. The word, position
# and token type embeddings, the pooler, the NSP head and a task's classifier have transformers' names.
NAMES: list[tuple[str, str]] = [
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("encoder.layers.{i}.self_attn.q_proj.{p}", "encoder.layer.{i}.attention.self.query.{p}"),
    ("encoder.layers.{i}.self_attn.k_proj.{p}", "encoder.layer.{i}.attention.self.key.{p}"),
    ("encoder.layers.{i}.self_attn.v_proj.{p}", "encoder.layer.{i}.attention.self.value.{p}"),
    ("encoder.layers.{i}.self_attn.out_proj.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.norm1.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.linear1.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.linear2.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.norm2.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
    ("cls.predictions.transform.{p}", "cls.predictions.transform.dense.{p}"),
    ("cls.predictions.layer_norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
    ("cls.predictions.decoder_weight", "cls.predictions.decoder.weight"),  # PaddleNLP before 2.5
    ("cls.predictions.decoder_bias", "cls.predictions.decoder.bias"),
]
# The PaddleNLP class holding exactly each set of heads: its BertModel always holds the pooler.
CLASSES = {
    ("pooler", "mlm", "nsp"): "BertForPretraining",
    ("pooler", "mlm"): "BertForMaskedLM",
    ("pooler",): "BertModel",
}
ACTIVATIONS = ("gelu", "relu")  # Paddle's TransformerEncoderLayer computes paddle.nn.functional's, GELU's erf form
DECODER = "cls.predictions.decoder"  # tied: its weight is the word embeddings', saved again; its bias saved twice
# What PaddleNLP's config.json and transformers' record beyond the model under the same names and meanings: kept
# through a conversion between them (``Raw.settings``). Neither library's own fields go to the other's file.
SHARED_SETTINGS: dict[str, Callable[[Any], bool]] = {  # each with what PaddleNLP computes with
    "pad_token_id": lambda value: type(value) is int and value >= 0,  # not null: it masks by it
    "initializer_range": lambda value: type(value) in (int, float) and value > 0,
}


def renamed(name: str, reverse: bool = False) -> str:
    """A PaddleNLP tensor's name as transformers' (``reverse``: transformers' as PaddleNLP's), ``bert.`` kept."""
    prefix = "bert." if name.startswith("bert.") else ""
    bare = name.removeprefix(prefix)
    return prefix + (translated(bare, NAMES, reverse) or bare)


def transformers_name(name: str) -> tuple[str, bool]:
    """(transformers' name for a PaddleNLP tensor, whether it is an nn.Linear weight, held (in, out))."""
    return renamed(name), LINEAR_WEIGHT.search(name) is not None


def read_old_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """PaddleNLP 2.0 to 2.4.2's ``model_config.json`` as the ``config.json`` that 2.4.3 on writes of the same model:
    the arguments its ``BertModel`` was built with (the file's top level for a ``BertModel``; for a model
    built on one, the argument whose ``init_class`` is ``BertModel``), those given by position named, those
    left out at their defaults, and the top's ``init_class`` as its ``architectures``; and which were left out."""
    top = read_config(path, "PaddleNLP 2 config")

    def is_bert(value: object) -> bool:
        return isinstance(value, dict) and value.get("init_class") == "BertModel"

    arguments = top.get("init_args", [])
    if not isinstance(arguments, list) or not isinstance(top.get("init_class"), str):
        raise WeightsError(f"{path}: expected an init_class (text) and its init_args (a list), as PaddleNLP 2 saves")
    base = top if is_bert(top) else next((value for value in [*arguments, *top.values()] if is_bert(value)), None)
    if base is None:
        raise WeightsError(
            f"{path}: no argument of its {top['init_class']!r:.80} is a BertModel's (init_class 'BertModel'); "
            "bert_multi reads PaddleNLP's BERT"
        )
    positional = base.get("init_args", [])
    if not isinstance(positional, list) or len(positional) > len(OLD_ARGUMENTS):
        raise WeightsError(f"{path}: the BertModel's init_args are not a list of at most {len(OLD_ARGUMENTS)} values")
    named = dict(zip(OLD_ARGUMENTS, positional))
    keywords = {key: value for key, value in base.items() if key not in ("init_args", "init_class")}
    for key in keywords:
        if key not in OLD_ARGUMENTS:
            raise WeightsError(f"{path}: the BertModel's argument {key!r:.80} is not one PaddleNLP 2's BertModel takes")
        if key in named:
            raise WeightsError(f"{path}: the BertModel's argument {key!r:.80} is given both by position and by name")
    fields = {**OLD_ARGUMENTS, **named, **keywords}
    if fields["vocab_size"] is None:
        raise WeightsError(f"{path}: the BertModel's arguments give no vocab_size, which PaddleNLP 2.0 to 2.2 require")
    defaulted = [key for key in OLD_ARGUMENTS if key not in named and key not in keywords]
    return {**fields, "layer_norm_eps": OLD_LAYER_NORM_EPS, "architectures": [top["init_class"]]}, defaulted


def downloaded(path: Path) -> Path:
    """The weights of the model ``path`` is PaddleNLP 2's download cache of (``~/.paddlenlp/models/bert-base-uncased/``:
    ``bert-base-uncased.pdparams``, its URL's name, beside the ``model_config.json`` ``from_pretrained`` writes)."""
    return path / f"{path.absolute().name}.pdparams"


def read_directory(path: Path) -> Raw:
    """A PaddleNLP BERT directory as canonical weights and the config its ``config.json`` (PaddleNLP 2.0 to 2.4.2:
    ``model_config.json``) asks for."""
    config_file, defaulted = path / CONFIG_FILE, list[str]()
    if not os.path.lexists(config_file) and os.path.lexists(path / OLD_CONFIG_FILE):
        config_file = path / OLD_CONFIG_FILE
        hf, defaulted = read_old_config(config_file)
    elif not is_regular_file(config_file):
        raise WeightsError(
            f"{path}: holds {WEIGHTS_FILE} but no {CONFIG_FILE} (PaddleNLP 2.4.3 on) or {OLD_CONFIG_FILE} "
            "(2.0 to 2.4.2): save_pretrained writes one beside it"
        )
    else:
        hf = read_config(config_file, "PaddleNLP config")
    if hf.get("fuse") is True:  # its names pack q, k and v, and only a GPU computes it: nothing here checks it
        raise WeightsError(
            f"{path}: {config_file.name} has fuse true: PaddleNLP's fused encoder layers (Paddle's "
            "FusedTransformerEncoderLayer, which computes on a GPU only: q, k and v packed in one qkv_weight), "
            "which bert_multi does not read; it reads the BertModel PaddleNLP builds with fuse false"
        )
    source = next((name for name in WEIGHT_FILES if os.path.lexists(path / name)), None)
    cache = source is None and config_file.name == OLD_CONFIG_FILE and os.path.lexists(downloaded(path))
    if cache:
        source = downloaded(path).name
    if source is None:
        raise WeightsError(f"{path}: a PaddleNLP {config_file.name} but no weights: expected one of {WEIGHT_FILES}")
    kind = source.removesuffix(INDEX_SUFFIX)  # the file, or the file an index names shards of
    read = _read_safetensors if kind == SAFETENSORS_FILE else _read_pdparams
    arrays, dtypes = read(path / source) if kind == source else read_shards(path / source, read)
    own, kinds, file_names = torch_names(path / source, arrays, dtypes, transformers_name)
    notes: list[str] = []
    config, canonical, canonical_dtypes = from_transformers_names(
        path / source, config_file, own, kinds, hf, notes, file_names
    )
    what = source if kind == source else f"the shards {source} names"
    what += " (PaddleNLP 2's download cache: the weights under their URL's name)" if cache else ""
    bits = sum(dtype == "bfloat16" for dtype in dtypes.values())
    notes[:0] = [
        f"read {what} and {config_file.name} (PaddleNLP's BERT: its names turned to transformers', Paddle's (in, out) "
        "Linear weights transposed)",
        *([f"read {bits} bfloat16 arrays from the uint16 bits Paddle saves them as"] if bits else []),
    ]
    if defaulted:
        left_out = ", ".join(f"{key}={OLD_ARGUMENTS[key]!r}" for key in defaulted)
        notes.insert(1, f"{OLD_CONFIG_FILE} leaves out the BertModel's {left_out}: PaddleNLP 2's defaults")
    settings = {key: hf[key] for key in SHARED_SETTINGS if key in hf}
    return Raw(FORMAT.kind, None, canonical, canonical_dtypes, notes, config=config, settings=settings)


def _read_pdparams(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    arrays, dtypes, _ = read_pdparams(path)
    return arrays, dtypes


def _read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A PaddleNLP safetensors file's arrays and dtypes, refused unless its metadata says PaddleNLP's layout."""
    written = read_metadata(path).get("format")
    if written != PADDLENLP_FORMAT:
        raise WeightsError(
            f"{path}: its metadata's format is {written!r:.40}, where PaddleNLP writes {PADDLENLP_FORMAT!r} for its "
            "own names and (in, out) layout; a transformers file in a PaddleNLP directory is not read as either"
        )
    arrays, dtypes = read_safetensors(path)
    bfloat16_from_bits(arrays, dtypes)
    return arrays, dtypes


def written_by_paddlenlp(path: Path) -> bool:
    """Whether ``path`` is a directory PaddleNLP wrote: a ``config.json`` recording ``paddlenlp_version`` (2.8
    and 3.0 write it, null or a version), which transformers' never does; or, whatever its config, PaddleNLP's
    weights file (or PaddleNLP 2's download cache's, beside its ``model_config.json``) and none of transformers'
    (a directory holding both, under transformers' config, is transformers'). Never raises: a config that does
    not read is the reader's to refuse."""
    if not is_directory(path):
        return False
    try:
        if is_regular_file(path / CONFIG_FILE) and "paddlenlp_version" in read_config(path / CONFIG_FILE):
            return True
    except WeightsError:
        pass
    paddle_weights = any(os.path.lexists(path / name) for name in (WEIGHTS_FILE, WEIGHTS_FILE + INDEX_SUFFIX))
    paddle_weights |= os.path.lexists(path / OLD_CONFIG_FILE) and os.path.lexists(downloaded(path))
    return paddle_weights and not any(os.path.lexists(path / name) for name in TRANSFORMERS_WEIGHT_FILES)


def inexpressible(config: BERTConfig) -> str | None:
    """Why no PaddleNLP BERT computes ``config``, or None if one does."""
    reason = inexpressible_semantics(config, "PaddleNLP's BERT")
    if reason is None and config.heads not in CLASSES:
        reason = (
            f"PaddleNLP has no BERT class with exactly the heads {list(config.heads)}: its BertModel always holds the "
            f"pooler, and its classes hold {' or '.join(str(list(heads)) for heads in CLASSES)}"
        )
    if reason is None and "mlm" in config.heads and config.semantics.mlm_decoder != "tied":
        reason = "PaddleNLP's MLM decoder is the word embeddings (tied); this model's decoder has weights of its own"
    if reason is None and config.semantics.activation not in ACTIVATIONS:
        reason = f"PaddleNLP's BERT computes {' or '.join(ACTIVATIONS)}; this model {config.semantics.activation}"
    return reason


def to_paddlenlp(
    config: BERTConfig, weights: dict[str, np.ndarray], settings: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json's fields, the state_dict's arrays in PaddleNLP's names and layouts) of ``config``'s class in
    ``CLASSES``, as its ``save_pretrained`` writes them, with the ``SHARED_SETTINGS`` of the file it was read from;
    a ``UsageError`` for a model no PaddleNLP BERT computes."""
    reason = inexpressible(config)
    if reason is not None:
        raise UsageError(reason)
    dtype, weights = prepare_weights(config, weights)
    kept = settings or {}
    arrays: dict[str, np.ndarray] = {}
    for name, hf_name in hf_names(config, inside=config.heads != ("pooler",)).items():
        own = renamed(hf_name, reverse=True)
        array = weights[name][0] if name == "encoder.pos_embedding" else weights[name]
        linear = array.ndim == 2 and LINEAR_WEIGHT.search(own) is not None
        arrays[own] = contiguous_transpose(array) if linear else array
    if "mlm" in config.heads:  # PaddleNLP's state_dict holds the tied decoder's weight, and its bias twice
        bias = arrays.pop("cls.predictions.bias")
        word_embeddings = weights["encoder.token_embedding.weight"]
        arrays.update({f"{DECODER}_bias": bias, f"{DECODER}.weight": word_embeddings, f"{DECODER}.bias": bias})
    semantics = config.semantics
    fields = {
        "architectures": [CLASSES[config.heads]],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.num_hiddens,
        "num_hidden_layers": config.num_blks,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.ffn_num_hiddens,
        "hidden_act": semantics.activation,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": 2,
        "layer_norm_eps": semantics.layer_norm_eps,
        "pool_act": "tanh",
        # PaddleNLP trains with 0.1 where config.json has none; d2l's files do not record theirs.
        **(
            {"hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.dropout}
            if config.dropout
            else {}
        ),
        **({"dtype": dtype} if dtype != "float32" else {}),  # as PaddleNLP writes it: only when not its default
        **{key: kept[key] for key, usable in SHARED_SETTINGS.items() if key in kept and usable(kept[key])},
        "paddlenlp_version": None,  # PaddleNLP's config, of no version: what says so beside transformers' files
    }
    return fields, arrays


def write_directory(
    path: Path, config: BERTConfig, weights: dict[str, np.ndarray], settings: dict[str, Any] | None = None
) -> None:
    """A PaddleNLP BERT directory (``config.json``, ``model_state.pdparams``) that PaddleNLP's ``from_pretrained``
    loads (``settings``: as ``to_paddlenlp``); refused where the directory holds a weights file that it would load
    instead."""
    fields, arrays = to_paddlenlp(config, weights, settings)
    first = [name for name in WEIGHT_FILES[: WEIGHT_FILES.index(WEIGHTS_FILE)] if os.path.lexists(path / name)]
    if first:
        raise UsageError(
            f"{path}: holds {first[0]}, which PaddleNLP's from_pretrained loads before the {WEIGHTS_FILE} bert_multi "
            "writes: remove it, or write to another directory"
        )
    path.mkdir(parents=True, exist_ok=True)
    replace_file(path / WEIGHTS_FILE, lambda file: write_pickle(file, arrays))
    replace_text(path / CONFIG_FILE, json.dumps(fields, indent=2) + "\n")


class ModelDirectory(CheckpointFormat):
    kind = "paddlenlp-dir"
    framework_option = "paddlenlp"
    description = (
        f"PaddleNLP BERT directory ({CONFIG_FILE} + {WEIGHTS_FILE} or {SAFETENSORS_FILE}, as save_pretrained "
        f"writes it; PaddleNLP 2.0 to 2.4.2's {OLD_CONFIG_FILE} + {WEIGHTS_FILE}, or NAME.pdparams in its download "
        "cache)"
    )
    directory = True
    marker_files = (CONFIG_FILE, OLD_CONFIG_FILE)

    def recognizes(self, probe: Probe) -> bool:
        # A weights file that is a dangling link or no regular file is refused by name when read.
        return written_by_paddlenlp(probe.path)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        return read_directory(path)

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
