"""What a checkpoint's tensor names and shapes imply without anything stated: the d2l generations and
heads they fit, their canonical names, every size but the number of heads, and what the file cannot
tell (the heads; the generation where the tensors fit more than one; d2l 0.11's max_len)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend.contract import framework_module, framework_names
from ..errors import WeightsError
from ..spec.config import HEADS, BERTConfig
from ..spec.schema import SEGMENTS
from ..spec.semantics import PRESETS, Semantics, releases_of
from .formats import deepspeed, of_framework
from .formats.base import StateDictInside, some
from .formats.peft import lora_clause
from .formats.transformers_names import RELATIVES, described_relative, relative_of

# The top-level modules of d2l's BERTModel; a file's other tensors belong to something else (a task head).
MODEL_PARTS = ("encoder", "hidden", "mlm", "nsp")
BLOCK_SENTINEL = 987654321  # a block number no file has, to find how a format writes encoder.blks.N
D2L_0_11_MAX_LEN = 1000  # d2l 0.11 computes its sinusoidal table up to BERTEncoder's default max_len


@dataclass
class Layout:
    """What a file's tensors imply: the generations and heads they fit, their canonical names, sizes."""

    presets: tuple[str, ...]
    heads: tuple[str, ...]
    canonical: dict[str, str]  # canonical name -> the file's name
    ignored: list[str]
    sizes: dict[str, int]
    framework: str | None = None  # whose own file it is, for stating what it fits in its terms


def _head_choices(semantics: Semantics) -> Iterator[tuple[str, ...]]:
    for count in range(len(HEADS), -1, -1):
        for heads in itertools.combinations(HEADS, count):
            try:
                BERTConfig(2, 2, 2, 1, 1, semantics=semantics, heads=heads)
            except ValueError:
                continue
            yield heads


def _under(names: set[str], marker: str, own_prefix: str) -> str | None:
    """The prefix under which one of ``names`` has the name ``marker`` (a pattern, after the family's own
    optional ``own_prefix``) begins: '' for none, None where no name has it."""
    for name in sorted(names):
        if found := re.match(rf"((?:\w+\.)*?)(?:{own_prefix})?{marker}", name):
            return found[1]
    return None


# Where each family's names begin (a pattern), after its own optional prefix: a PaddleNLP BERT's and a
# transformers one's after ``bert.``; d2l's, which have no prefix of their own.
PADDLENLP_NAMES = (r"encoder\.layers\.\d+\.self_attn\.q_proj\.", r"bert\.")
TRANSFORMERS_NAMES = (r"embeddings\.word_embeddings\.", r"bert\.")
D2L_NAMES = (r"encoder\.token_embedding\.", "")
FAMILY_MARKERS = (PADDLENLP_NAMES, TRANSFORMERS_NAMES, D2L_NAMES)


def wrapper_prefix(names: set[str]) -> str:
    """The prefix a wrapper's attribute puts before a BERT's ``names`` (a LightningModule's ``net.``), or ''."""
    return next((prefix for marker, own in FAMILY_MARKERS if (prefix := _under(names, marker, own))), "")


def told_inside(path: Path, inside: StateDictInside) -> str:
    """What a file whose state_dict is an entry of a dict around it says: the key and, in one message, the prefix
    its BERT's names are under; or the relative of BERT they are, whose prefix is no wrapper's. DeepSpeed's
    model states also name the directory that reads as DeepSpeed's checkpoint."""
    if kin := relative_of(inside.names):
        return f"{path}: the state_dict under the key {inside.holders[0]!r} is {kin}"
    return inside.telling(wrapper_prefix(set(inside.names))) + deepspeed.model_states(path, inside.keys)


def _wrapped(prefix: str) -> str:
    """What a message says of a prefix no library writes (a LightningModule's attribute: ``model.``)."""
    if not prefix:
        return ""
    return (
        f"; its names are under {prefix!r}, as a wrapper's (a LightningModule's attribute) are, which the library "
        f"does not load: state it, prefix={prefix!r} (--prefix {prefix})"
    )


def _family(names: set[str]) -> str:
    """Which other model family a set of tensor names looks like, if any, as a clause for a message."""
    if kin := relative_of(names):  # before BERT's own: a relative's prefix is no wrapper's
        return f" (they are {kin})"
    if lora := lora_clause(names):  # a PEFT model's prefix, base_model.model., is no wrapper's either
        return f" ({lora})"
    prefix = _under(names, *PADDLENLP_NAMES)
    if prefix is not None:
        return (
            " (they look like PaddleNLP's BERT: the original BERT in Paddle's names and layouts; name the directory "
            "holding the file and its config.json, or PaddleNLP 2's model_config.json (which its download cache "
            "holds beside the file too), read as one; where neither is beside it, load it with PaddleNLP's "
            f"from_pretrained and save_pretrained it{_wrapped(prefix)})"
        )
    prefix = _under(names, *TRANSFORMERS_NAMES)
    if prefix is not None:
        return (
            " (they look like a HuggingFace transformers BERT: the original BERT, whose names and layers differ "
            f"from d2l's; name the directory holding the file and its config.json, read as one{_wrapped(prefix)})"
        )
    if any(name.startswith("encoder.transformer_cells.") for name in names):  # BERT's are read (formats/gluon.py)
        return (
            " (they look like GluonNLP's RoBERTa or DistilBERT: GluonNLP's names without a segment embedding, "
            "another model than BERT)"
        )
    if "encoder.embedding.weight" in names or any(name.startswith("decoder.") for name in names):
        return " (they look like d2l's Transformer for machine translation, not its BERT)"
    prefix = _under(names, *D2L_NAMES)
    if prefix:
        return f" (they look like a d2l BERT{_wrapped(prefix)})"
    return ""


def interpret(path: Path, framework: str | None, arrays: dict[str, np.ndarray]) -> Layout:
    """Which generations and heads a file's names fit, its canonical names, and its sizes."""
    names = set(arrays)
    rules = of_framework(framework).name_rules if framework else []
    # A block's prefix in the file's names: encoder.blks.N (encoder.blks_N in Flax's tree).
    prefix = framework_module(f"encoder.blks.{BLOCK_SENTINEL}", rules).split(str(BLOCK_SENTINEL))[0]
    blocks = {int(m[1]) for name in names if (m := re.match(re.escape(prefix) + r"(\d+)\.", name))}
    fits: list[tuple[str, tuple[str, ...], dict[str, str]]] = []
    nearest: tuple[int, list[str]] | None = None  # the closest candidate's names, in schema order
    for preset, semantics in PRESETS.items():
        for heads in _head_choices(semantics):
            proto = BERTConfig(2, 2, 2, 1, max(len(blocks), 1), max_len=1, semantics=semantics, heads=heads)
            expected = framework_names(proto, rules)
            missing = set(expected.values()) - names
            if nearest is None or len(missing) < nearest[0]:
                nearest = (len(missing), list(expected.values()))
            leftover = names - set(expected.values())
            if not missing and not any(name.split(".")[0] in MODEL_PARTS for name in leftover):
                fits.append((preset, heads, expected))
    if not blocks or not fits:
        assert nearest is not None
        expected_names = nearest[1]
        raise WeightsError(
            f"{path}: its tensor names are not those of a d2l BERT{_family(names)}. The file has "
            f"{some(names)}; a d2l BERT{' of ' + str(len(blocks)) + ' blocks' if blocks else ''} has "
            f"{some(expected_names)}; missing {some(set(expected_names) - names)}, "
            f"unexpected {some(names - set(expected_names))}"
        )
    largest = max(len(expected) for _, _, expected in fits)
    fits = [fit for fit in fits if len(fit[2]) == largest]
    presets = tuple(dict.fromkeys(preset for preset, _, _ in fits))
    heads, expected = fits[0][1], fits[0][2]
    ignored = sorted(names - set(expected.values()))

    def shape(canonical: str, ndim: int) -> tuple[int, ...]:
        array = arrays[expected[canonical]]
        if array.ndim != ndim:
            raise WeightsError(f"{path}: tensor {expected[canonical]!r} has shape {array.shape}; expected {ndim} axes")
        return array.shape

    # Every size below is read from a shape, and a shape with an axis of 0 costs no bytes whatever its
    # other axes claim: no tensor of a BERT is empty, so an empty one is refused before any size is used.
    for name in sorted(set(expected.values())):
        if arrays[name].size == 0:
            raise WeightsError(
                f"{path}: tensor {name!r} has shape {arrays[name].shape}, which holds no values; every tensor of "
                "a d2l BERT holds at least one"
            )

    vocab_size, num_hiddens = shape("encoder.token_embedding.weight", 2)
    segments = shape("encoder.segment_embedding.weight", 2)[0]
    if segments != SEGMENTS:  # a RoBERTa base model (one segment in its releases) has BERT's very names
        roberta = f" (one, as transformers' {described_relative(RELATIVES['roberta'])})" if segments == 1 else ""
        raise WeightsError(
            f"{path}: its segment embedding, {expected['encoder.segment_embedding.weight']!r}, has {segments} "
            f"row{'s' if segments > 1 else ''}; a BERT's has {SEGMENTS}, one per segment id"
            f"{roberta}"
        )
    sizes = {
        "vocab_size": vocab_size,
        "num_hiddens": num_hiddens,
        "ffn_num_hiddens": shape("encoder.blks.0.ffn.dense1.weight", 2)[0],
        "num_blks": len(blocks),
    }
    if "encoder.pos_embedding" in expected:
        sizes["max_len"] = shape("encoder.pos_embedding", 3)[1]
    return Layout(presets, heads, expected, ignored, sizes, framework)


# What a reader states that a file cannot tell: its Python argument and its command-line flag.
STATED_BY = {
    "num_heads": ("num_heads=", "--num-heads"),
    "the generation": ("preset= or d2l_version=", "--preset or --d2l-version"),
}


def _divisors(number: int) -> list[int]:
    """Every divisor of ``number``, ascending, in sqrt(number) steps (a file's numbers size the loop)."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return small + [number // d for d in reversed(small) if d * d != number]


def unknowns(layout: Layout) -> dict[str, str]:
    """What the file cannot tell -> why it matters (``STATED_BY`` says how a reader states it)."""
    hiddens = layout.sizes["num_hiddens"]
    divisors = _divisors(hiddens)
    unknowns = {
        "num_heads": f"no weight reveals how num_hiddens={hiddens} is split into heads (any of {some(divisors)} "
        "fits), and a wrong count loads and computes a different function"
    }
    if len(layout.presets) > 1:
        fits = " and ".join(f"{name} ({releases_of(name, layout.framework)})" for name in layout.presets)
        unknowns["the generation"] = (
            f"the tensors fit {fits}, which copy valid_lens over the heads differently (interleaved in 0.16+, "
            "tiled in 0.12-0.15) and so differ when a batch mixes lengths"
        )
    if "max_len" not in layout.sizes:
        unknowns["max_len"] = (
            f"d2l 0.11 computes its sinusoidal position table, so the file holds none; {D2L_0_11_MAX_LEN}, "
            "d2l 0.11's default, is assumed (it only bounds the sequence length)"
        )
    return unknowns
