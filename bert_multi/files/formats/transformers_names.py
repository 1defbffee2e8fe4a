"""transformers' BERT tensor names and the canonical ones: one table (``NAMES``), read both ways, and a BERT's
tensors under transformers' names turned canonical (``canonical_arrays``), whatever file holds them."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...errors import WeightsError
from .base import SHOWN, Raw, some, task_head_left_out, translated, weight_and_bias

# (HuggingFace name without the "bert." prefix, canonical name), read both ways: {i} is a block, {p}
# weight or bias.
NAMES: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "encoder.token_embedding.weight"),
    ("embeddings.position_embeddings.weight", "encoder.pos_embedding"),  # (P, H) there, (1, P, H) here
    ("embeddings.token_type_embeddings.weight", "encoder.segment_embedding.weight"),
    ("embeddings.LayerNorm.{p}", "encoder.embedding_norm.{p}"),
    ("encoder.layer.{i}.attention.self.query.{p}", "encoder.blks.{i}.attention.W_q.{p}"),
    ("encoder.layer.{i}.attention.self.key.{p}", "encoder.blks.{i}.attention.W_k.{p}"),
    ("encoder.layer.{i}.attention.self.value.{p}", "encoder.blks.{i}.attention.W_v.{p}"),
    ("encoder.layer.{i}.attention.output.dense.{p}", "encoder.blks.{i}.attention.W_o.{p}"),
    ("encoder.layer.{i}.attention.output.LayerNorm.{p}", "encoder.blks.{i}.addnorm1.ln.{p}"),
    ("encoder.layer.{i}.intermediate.dense.{p}", "encoder.blks.{i}.ffn.dense1.{p}"),
    ("encoder.layer.{i}.output.dense.{p}", "encoder.blks.{i}.ffn.dense2.{p}"),
    ("encoder.layer.{i}.output.LayerNorm.{p}", "encoder.blks.{i}.addnorm2.ln.{p}"),
    ("pooler.dense.{p}", "hidden.0.{p}"),
    ("cls.predictions.transform.dense.{p}", "mlm.mlp.0.{p}"),
    ("cls.predictions.transform.LayerNorm.{p}", "mlm.mlp.2.{p}"),
    ("cls.predictions.bias", "mlm.mlp.3.bias"),
    ("cls.predictions.decoder.weight", "mlm.mlp.3.weight"),  # only when not tied to the word embeddings
    ("cls.seq_relationship.{p}", "nsp.output.{p}"),
]

# A Flax or Keras leaf's name -> PyTorch's: a Dense's kernel is its weight (transposed); a LayerNorm's scale
# (Flax) and an embedding's table (Flax's embedding, Keras's embeddings) are their weights. Keras's LayerNorm
# gamma and beta are read as TensorFlow-era names (canonical_name).
LEAVES = {"kernel": "weight", "scale": "weight", "embedding": "weight", "embeddings": "weight"}


def flax_name(name: str) -> tuple[str, bool]:
    """(the PyTorch name of a leaf of a transformers Flax BERT's tree, dotted, whether it is a kernel)."""
    stem, dot, leaf = name.rpartition(".")
    return stem + dot + LEAVES.get(leaf, leaf), leaf == "kernel"


# Buffers, not weights.
IGNORED = (r"(bert\.)?embeddings\.position_ids",)
# transformers' fine-tuning heads (its ForSequenceClassification, ForTokenClassification, ForMultipleChoice:
# classifier; ForQuestionAnswering: qa_outputs): a BERT fine-tuned is read with its head left out, and said.
TASK_HEADS = ("classifier", "qa_outputs")
DECODER_BIAS, BIAS = "cls.predictions.decoder.bias", "cls.predictions.bias"


class Relative(NamedTuple):
    """A model of transformers' named as BERT is, or nearly, that computes another function."""

    name: str
    prefix: str  # its base_model_prefix: where its models with heads put the encoder's names
    differs: str  # how it computes otherwise than BERT, as a clause


# transformers' BERT-like models by model_type (config.json's): a state_dict of one, alone, is named for what
# it is, not read as a BERT under a wrapper's prefix (RoBERTa's names under "roberta." are BERT's).
RELATIVES = {
    "roberta": Relative("RoBERTa", "roberta", "its positions counted from the padding index + 1"),
    "xlm-roberta": Relative("XLM-RoBERTa", "roberta", "a RoBERTa"),
    "camembert": Relative("CamemBERT", "roberta", "a RoBERTa"),
    "data2vec-text": Relative("data2vec-text", "data2vec_text", "a RoBERTa"),
    "roberta-prelayernorm": Relative("RoBERTa-PreLayerNorm", "roberta_prelayernorm", "LayerNorm before each sublayer"),
    "longformer": Relative("Longformer", "longformer", "a RoBERTa attending within a sliding window"),
    "distilbert": Relative("DistilBERT", "distilbert", "no segment embedding and no pooler"),
    "albert": Relative("ALBERT", "albert", "one block's weights shared by every block, narrower embeddings"),
    "electra": Relative("ELECTRA", "electra", "its embeddings projected where narrower, a discriminator's head"),
    "ernie": Relative("ERNIE", "ernie", "a task-type embedding too where its config sets use_task_id"),
    "megatron-bert": Relative("MegatronBERT", "bert", "LayerNorm before each sublayer rather than after"),
    "deberta": Relative("DeBERTa", "deberta", "attention with disentangled relative positions"),
    "deberta-v2": Relative("DeBERTa-v2", "deberta", "attention with disentangled relative positions"),
    "mpnet": Relative("MPNet", "mpnet", "a relative-position bias in attention"),
    "layoutlm": Relative("LayoutLM", "layoutlm", "2-D positions of the words on a page"),
    "big_bird": Relative("BigBird", "bert", "block-sparse attention"),
}
# Where a relative's names begin: its prefix (after a wrapper's, if any) before the embeddings, which BERT's
# prefix "bert." is not; or MegatronBERT's layer of its own, a LayerNorm inside the attention.
RELATIVE_EMBEDDINGS = re.compile(r"(?:\w+\.)*?(\w+)\.embeddings\.word_embeddings\.")
MEGATRON_LAYER = re.compile(r"(?:\w+\.)*?encoder\.layer\.\d+\.attention\.ln\.")


def relative_of(names: Iterable[str]) -> str | None:
    """Which of BERT's relatives in transformers tensors of these names are, as a clause, or None."""
    for name in names:
        if MEGATRON_LAYER.match(name):
            return "transformers' " + described_relative(RELATIVES["megatron-bert"])
        if (found := RELATIVE_EMBEDDINGS.match(name)) and found[1] != "bert":
            kin = [relative for relative in RELATIVES.values() if relative.prefix == found[1]]
            if kin:
                return "transformers' " + described_relative(*kin)
    return None


def described_relative(relative: Relative, *alike: Relative) -> str:
    """A relative (and those named alike) for a message: what it is and how it differs from BERT (PaddleNLP's
    config.json names its ERNIE as transformers' does)."""
    names = " or ".join([relative.name, *(other.name for other in alike)])
    return f"{names} ({relative.differs}), which bert_multi does not read as BERT"


def canonical_name(name: str) -> str | None:
    """The canonical name of a transformers BERT's tensor (with or without ``bert.``), or None."""
    bare = name.removeprefix("bert.")
    return translated(weight_and_bias(bare), NAMES)  # TensorFlow-era names: a LayerNorm's gamma and beta


def canonical_arrays(
    where: Path, own: dict[str, np.ndarray], dtypes: dict[str, str], file_names: dict[str, str] | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str], bool, list[str]]:
    """(canonical arrays, their own dtypes, whether the MLM decoder is the word embeddings, the task head's
    names) of a BERT's tensors under transformers' names (``own``; where the file names them otherwise, by
    ``file_names``), read from ``where``. A decoder equal to the word embeddings is the tie."""
    file_names = file_names or {}
    decoder = own.get("cls.predictions.decoder.weight")
    embedding = own.get("bert.embeddings.word_embeddings.weight", own.get("embeddings.word_embeddings.weight"))
    tied = decoder is None or (embedding is not None and np.array_equal(decoder, embedding))
    if decoder is not None and tied:
        del own["cls.predictions.decoder.weight"]  # the same numbers as the word embeddings, saved twice
    if DECODER_BIAS in own:  # the bias the decoder really adds; transformers may also keep its twin
        own[BIAS] = own.pop(DECODER_BIAS)
        dtypes[BIAS] = dtypes[DECODER_BIAS]
    arrays, kinds, unknown, task_head = {}, {}, [], []
    named: dict[str, str] = {}  # canonical name -> the file's name for it
    for name, array in own.items():
        canonical = canonical_name(name)
        if canonical is None:
            if any(re.fullmatch(rf"{head}\.(weight|bias)", name) for head in TASK_HEADS):
                task_head.append(name)
            elif not any(re.fullmatch(pattern, name) for pattern in IGNORED):
                unknown.append(file_names.get(name, name))
            continue
        if canonical in named:  # gamma beside weight, or a name with and without "bert.": which is meant?
            raise WeightsError(f"{where}: {named[canonical]!r} and {file_names.get(name, name)!r} are both {canonical}")
        named[canonical] = file_names.get(name, name)
        arrays[canonical] = array[None] if canonical == "encoder.pos_embedding" and array.ndim == 2 else array
        kinds[canonical] = dtypes[name]
    if unknown:
        raise WeightsError(f"{where}: tensors of no BERT layer bert_multi knows: {some(unknown)}")
    return arrays, kinds, tied, task_head


# A transformers BERT's word embeddings under its own name: what marks a state_dict as one, unless its blocks
# are named as PaddleNLP's BERT names them, whose embeddings share the name.
WORD_EMBEDDINGS = re.compile(r"(bert\.)?embeddings\.word_embeddings\.weight")
PADDLENLP_BLOCK = re.compile(r"(bert\.)?encoder\.layers\.\d+\.")


def is_transformers_state_dict(names: Iterable[str]) -> bool:
    """Whether tensors of these names are a transformers BERT's state_dict (a PaddleNLP one's are not)."""
    names = list(names)
    return any(WORD_EMBEDDINGS.fullmatch(name) for name in names) and not any(
        PADDLENLP_BLOCK.match(name) for name in names
    )


def read_state_dict(path: Path, raw: Raw) -> None:
    """``raw``, a file holding a transformers BERT's state_dict and no config (``torch.save(model.state_dict())``,
    a safetensors file alone), under the canonical names, which tell the sizes but not the heads (stated) nor what
    no tensor shows: transformers' defaults, GELU's erf form and LayerNorm eps 1e-12 (the "bert" preset's),
    said in a note."""
    if kin := relative_of(raw.arrays):  # MegatronBERT's names are BERT's, but for its own LayerNorms
        raise WeightsError(f"{path}: its tensors are {kin}")
    arrays, kinds, tied, task_head = canonical_arrays(path, raw.arrays, raw.dtypes)
    missing = [translated(name, NAMES, reverse=True) for name in _lacking(arrays)]
    if missing:
        shown = f"{missing[:SHOWN]}{' and more' if len(missing) > SHOWN else ''}"
        raise WeightsError(
            f"{path}: its names are a transformers BERT's, but it lacks {shown} (under 'bert.' in a model with "
            "heads); a BERT's state_dict holds every one"
        )
    if not tied:
        raise WeightsError(
            f"{path}: a transformers BERT whose MLM decoder is not its word embeddings (tie_word_embeddings "
            "false), which only its config.json says: name the directory holding the file and its config.json"
        )
    raw.arrays, raw.dtypes = arrays, kinds
    if task_head:
        raw.notes.append(task_head_left_out(task_head, "the task head"))
    raw.notes.append(
        "read as a transformers BERT's state_dict, its names turned to the canonical ones; with no config.json "
        "beside it, it computes with transformers' defaults for what no tensor shows (GELU's erf form, LayerNorm "
        "eps 1e-12): a BERT configured otherwise is read from its directory, the file beside its config.json"
    )


def _lacking(arrays: dict[str, np.ndarray]) -> list[str]:
    """The canonical names that ``arrays`` lacks of the embeddings and of every encoder block up to the last it
    has a tensor of (what any BERT's state_dict holds), block by block until more than ``SHOWN`` are found. A
    block's index in a name sizes no work: a block checked is whole in ``arrays`` or adds to what is found."""
    blocks = [int(found[1]) for name in arrays if (found := re.match(r"encoder\.blks\.(\d+)\.", name))]
    layer = [canonical for _, canonical in NAMES if canonical.startswith("encoder.blks.")]
    embeddings = [canonical for _, canonical in NAMES if canonical.startswith("encoder.") and canonical not in layer]
    lacking: list[str] = []
    for patterns, i in itertools.chain([(embeddings, 0)], ((layer, i) for i in range(max(blocks, default=0) + 1))):
        for canonical in patterns:
            for p in ("weight", "bias") if "{p}" in canonical else [""]:
                if canonical.format(i=i, p=p) not in arrays:
                    lacking.append(canonical.format(i=i, p=p))
        if len(lacking) > SHOWN:
            break
    return lacking
