"""PaddleNLP's BERTs (``save_pretrained``: ``config.json`` and ``model_state.pdparams``), read without
Paddle. PaddleNLP's ``bert-base-uncased``, ``bert-base-chinese``, ``bert-wwm-chinese`` ... are Google's
BERTs converted to it.

PaddleNLP's ``BertModel`` computes transformers' BERT under other names: its encoder is Paddle's
``nn.TransformerEncoder`` (``encoder.layers.N.self_attn.q_proj``, ``linear1``, ``norm1`` ...), and its
``config.json`` has transformers' fields, whose GELU (``gelu``: the erf form) and LayerNorm eps
(``layer_norm_eps``, set on every LayerNorm when the model is built) it computes. So its tensors are
renamed to transformers' (``NAMES``), every ``nn.Linear`` weight turned from Paddle's (in, out), and read
as a transformers BERT is. Its MLM decoder is a ``TransposedLinear``, (vocab, hidden) as transformers holds
it, and tied to the word embeddings; its bias is saved under two names (``decoder_bias`` and
``decoder.bias``), read once.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import WeightsError
from .base import CheckpointFormat, Probe, Raw, is_directory, is_regular_file, no_key, translated
from .huggingface import CONFIG_FILE, from_transformers_names, read_config, torch_names
from .paddle import LINEAR_WEIGHT, read_pdparams

WEIGHTS_FILE = "model_state.pdparams"
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
    arrays, dtypes, notes = read_pdparams(path / WEIGHTS_FILE)
    own, kinds, file_names = torch_names(path / WEIGHTS_FILE, arrays, dtypes, transformers_name)
    config, canonical, canonical_dtypes = from_transformers_names(
        path / WEIGHTS_FILE, path / CONFIG_FILE, own, kinds, hf, notes, file_names
    )
    notes.insert(
        0,
        f"read {WEIGHTS_FILE} and {CONFIG_FILE} (PaddleNLP's BERT: its names turned to transformers', Paddle's "
        "(in, out) Linear weights transposed)",
    )
    return Raw(FORMAT.kind, None, canonical, canonical_dtypes, notes, config=config)


class ModelDirectory(CheckpointFormat):
    kind = "paddlenlp-dir"
    description = f"PaddleNLP BERT directory ({CONFIG_FILE} + {WEIGHTS_FILE}, as save_pretrained writes it)"
    directory = True

    def recognizes(self, probe: Probe) -> bool:
        # A weights file that is a dangling link or no regular file is refused by name when read.
        return is_directory(probe.path) and os.path.lexists(probe.path / WEIGHTS_FILE)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        return read_directory(path)


FORMAT = ModelDirectory()
