"""PEFT's adapters (LoRA's low-rank matrices that fine-tune a model without changing its weights), recognized
and not read: an adapter is no model, and a PEFT model's state_dict holds its base weights apart from the
matrices added to them. Each is named, with PEFT's own call that merges the adapter into its base and saves a
whole model, which bert_multi reads.

An adapter is a directory (``save_pretrained``: ``adapter_config.json`` beside ``adapter_model.safetensors``);
a PEFT model's names put LoRA's ``lora_A`` and ``lora_B`` beside each adapted layer's ``base_layer``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from .base import is_directory, is_regular_file

CONFIG = "adapter_config.json"
LORA_PARTS = re.compile(r"(?:^|\.)(lora_A|lora_B|lora_embedding_A|lora_embedding_B|base_layer)(?:\.|$)")
MERGE = (
    "peft.PeftModel.from_pretrained(base, {adapter}).merge_and_unload().save_pretrained('merged'), base being the "
    "model it adapts (transformers' from_pretrained of its adapter_config.json's base_model_name_or_path)"
)


def refusal(path: Path) -> str | None:
    """Why bert_multi does not read the adapter directory at ``path``, and what to do instead; None when it is
    none (its adapter_model.safetensors, a file bert_multi reads, names itself by its names: ``lora_clause``)."""
    if not (is_directory(path) and is_regular_file(path / CONFIG)):
        return None
    adapter = repr(os.path.abspath(path))
    return (
        f"{path}: is a PEFT adapter ({CONFIG}: low-rank matrices that fine-tune a model they leave unchanged), "
        f"not a model, which bert_multi does not merge: PEFT merges it into the model it adapts and saves the "
        f"whole, which bert_multi reads: {MERGE.format(adapter=adapter)}"
    )


def lora_clause(names: Iterable[str]) -> str | None:
    """What a state's names are, where they hold LoRA's matrices (a PEFT model's, or an adapter's), as a clause."""
    if not any(LORA_PARTS.search(name) for name in names):
        return None
    return (
        "they are a PEFT model's or adapter's: LoRA's lora_A and lora_B beside the layers they adapt, which "
        f"bert_multi does not merge; PEFT merges them and saves a whole model, which bert_multi reads: "
        f"{MERGE.format(adapter='ADAPTER_DIRECTORY')}, or merge_and_unload() on the PeftModel itself"
    )
