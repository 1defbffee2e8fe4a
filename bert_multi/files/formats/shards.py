"""A HuggingFace checkpoint saved in shards (``save_pretrained(max_shard_size=...)``): an index,
``model.safetensors.index.json`` (or ``pytorch_model.bin.index.json``), whose ``weight_map`` names the
shard of each tensor, beside the shards (``model-00001-of-00002.safetensors`` ...). Every shard the map
names is read, each a plain file of the directory, and each tensor must be where the map says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...safe_files import open_regular, reason
from .base import MAX_TENSORS, control_character, some

INDEX_SUFFIX = ".index.json"
MAX_INDEX_BYTES = 1 << 20  # a BERT-large's index is 20 KB
MAX_SHARDS = 1000

Reader = Callable[[Path], tuple[dict[str, np.ndarray], dict[str, str]]]


def read_shards(index: Path, read: Reader) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of the shards ``index`` names, each read by ``read``, and each one's own dtype."""

    def fail(message: str) -> WeightsError:
        return WeightsError(f"{index}: not a usable shard index: {message}")

    with open_regular(index, "HuggingFace shard index", WeightsError) as file:
        data = file.read(MAX_INDEX_BYTES + 1)
    try:
        weight_map = json.loads(data).get("weight_map") if len(data) <= MAX_INDEX_BYTES else None
    except (ValueError, AttributeError, RecursionError) as error:
        raise fail(f"not a JSON object: {reason(error)}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise fail(f"expected a JSON object of at most {MAX_INDEX_BYTES} bytes whose weight_map maps names to files")
    shards = sorted(set(weight_map.values()))
    if len(weight_map) > MAX_TENSORS or len(shards) > MAX_SHARDS:
        raise fail(f"{len(weight_map)} tensors in {len(shards)} shards; a BERT has hundreds of tensors")
    for shard in shards:  # a file of this directory: no path, no hidden or parent name, no control character
        if not shard or Path(shard).name != shard or shard.startswith(".") or control_character(shard):
            raise fail(f"a shard is named {shard!r:.80}, which is not a file name of its directory")
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for shard in shards:
        own, kinds = read(index.parent / shard)
        elsewhere = [name for name in own if weight_map.get(name) != shard]
        if elsewhere:
            raise fail(f"{shard} holds {some(elsewhere)}, which its weight_map places elsewhere or nowhere")
        arrays.update(own)
        dtypes.update(kinds)
    missing = [name for name in weight_map if name not in arrays]
    if missing:
        raise fail(f"its weight_map names {some(missing)}, which no shard holds")
    return arrays, dtypes
