"""PaddleNLP's BERTs (``save_pretrained``: ``config.json`` and ``model_state.pdparams``; with
``safe_serialization=True``, PaddleNLP 3's ``model.safetensors``; either in shards beside an index), read
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

import os
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from .base import CheckpointFormat, Probe, Raw, is_directory, is_regular_file, no_key, translated
from .huggingface import CONFIG_FILE, from_transformers_names, read_config, torch_names
from .paddle import LINEAR_WEIGHT, bfloat16_from_bits, read_pdparams
from .safetensors import read_metadata, read_safetensors
from .shards import INDEX_SUFFIX, read_shards

WEIGHTS_FILE, SAFETENSORS_FILE = "model_state.pdparams", "model.safetensors"
# Each weight file, or the index of its shards, in the order PaddleNLP's from_pretrained looks for them.
WEIGHT_FILES = [SAFETENSORS_FILE + INDEX_SUFFIX, SAFETENSORS_FILE, WEIGHTS_FILE + INDEX_SUFFIX, WEIGHTS_FILE]
PADDLENLP_FORMAT = "np"  # a safetensors file's metadata format when PaddleNLP wrote its own layout
OLD_CONFIG_FILE = "model_config.json"  # PaddleNLP before 2.5: its own layout, which is not read
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


def transformers_name(name: str) -> tuple[str, bool]:
    """(transformers' name for a PaddleNLP tensor, whether it is an nn.Linear weight, held (in, out))."""
    prefix = "bert." if name.startswith("bert.") else ""
    bare = name.removeprefix(prefix)
    return prefix + (translated(bare, NAMES) or bare), LINEAR_WEIGHT.search(name) is not None


def read_directory(path: Path) -> Raw:
    """A PaddleNLP BERT directory as canonical weights and the config its ``config.json`` asks for."""
    if not is_regular_file(path / CONFIG_FILE):
        raise WeightsError(
            f"{path}: holds {WEIGHTS_FILE} but no {CONFIG_FILE}; PaddleNLP before 2.5 wrote {OLD_CONFIG_FILE} "
            f"in a layout of its own, which bert_multi does not read: load the model in PaddleNLP and "
            "save_pretrained it again"
        )
    hf = read_config(path / CONFIG_FILE, "PaddleNLP config")
    source = next((name for name in WEIGHT_FILES if os.path.lexists(path / name)), None)
    if source is None:
        raise WeightsError(f"{path}: a PaddleNLP {CONFIG_FILE} but no weights: expected one of {WEIGHT_FILES}")
    kind = source.removesuffix(INDEX_SUFFIX)  # the file, or the file an index names shards of
    read = _read_safetensors if kind == SAFETENSORS_FILE else _read_pdparams
    arrays, dtypes = read(path / source) if kind == source else read_shards(path / source, read)
    own, kinds, file_names = torch_names(path / source, arrays, dtypes, transformers_name)
    notes: list[str] = []
    config, canonical, canonical_dtypes = from_transformers_names(
        path / source, path / CONFIG_FILE, own, kinds, hf, notes, file_names
    )
    what = source if kind == source else f"the shards {source} names"
    bits = sum(dtype == "bfloat16" for dtype in dtypes.values())
    notes[:0] = [
        f"read {what} and {CONFIG_FILE} (PaddleNLP's BERT: its names turned to transformers', Paddle's (in, out) "
        "Linear weights transposed)",
        *([f"read {bits} bfloat16 arrays from the uint16 bits Paddle saves them as"] if bits else []),
    ]
    return Raw(FORMAT.kind, None, canonical, canonical_dtypes, notes, config=config)


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
    """Whether ``path`` is a directory PaddleNLP wrote: its weights file (PaddleNLP's own name), or a
    ``config.json`` recording ``paddlenlp_version`` (2.8 and 3.0 write it, null or a version), which
    transformers' never does. Never raises: a config that does not read is the reader's to refuse."""
    if not is_directory(path):
        return False
    if os.path.lexists(path / WEIGHTS_FILE) or os.path.lexists(path / (WEIGHTS_FILE + INDEX_SUFFIX)):
        return True
    try:
        return is_regular_file(path / CONFIG_FILE) and "paddlenlp_version" in read_config(path / CONFIG_FILE)
    except WeightsError:
        return False


class ModelDirectory(CheckpointFormat):
    kind = "paddlenlp-dir"
    description = (
        f"PaddleNLP BERT directory ({CONFIG_FILE} + {WEIGHTS_FILE} or {SAFETENSORS_FILE}, as save_pretrained writes it)"
    )
    directory = True

    def recognizes(self, probe: Probe) -> bool:
        # A weights file that is a dangling link or no regular file is refused by name when read.
        return written_by_paddlenlp(probe.path)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        return read_directory(path)


FORMAT = ModelDirectory()
