"""The map file: a user's own rules for where each canonical tensor lives in their model, for what
``bert-multi verify`` cannot place alone (``mapping.py``), and the file ``--write-map`` writes.

JSON ``{"names": {canonical pattern: placement}, "ignore": [names], "absent": [canonical patterns],
"pooler_output": module}``: a pattern's ``{i}`` stands for a block's index and ``{p}`` for weight or bias;
a placement is ``name``, ``name.T`` (transposed) or ``name[k/n]`` (the k-th of n equal parts along the
first axis, as in a fused QKV); ``ignore`` lists the user's parameters that are no canonical tensor's,
``absent`` the canonical tensors the model lacks (a head's: the part they belong to is then not checked,
and the report says so), ``pooler_output`` the module whose output is the pooler's, tanh included (where
no NSP classifier reads it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError, WeightsError
from ..safe_files import open_regular, replace_text
from .placement import Placement

MAX_MAP_BYTES = 1 << 20
# A fused tensor has a few parts (3 for a QKV, 3 per block where blocks are fused too); the count sizes
# what is checked, so it is bounded where it is read.
MAX_PARTS = 1024
MAX_MODULE_PATH = 1000

_PLACE = re.compile(
    r"(?P<name>[^\[\]\x00-\x1f\x7f]+?)(?P<t>\.T)?(?:\[(?P<k>\d{1,9})/(?P<n>\d{1,9})\]|\[(?P<rows>\d{1,9}):\])?(?P<t2>\.T)?"
)
# A pattern's fields: each stands for the same text wherever it appears in one pattern.
FIELDS = {"i": r"\d+", "p": "weight|bias"}


def parse_placement(text: str) -> Placement:
    """``name``, ``name.T`` (transposed), ``name[k/n]`` (the k-th of n equal parts along the first axis),
    ``name[r:]`` (its rows from r on: the rows before are the model's own, a padding row)."""
    match = _PLACE.fullmatch(text.strip())
    if not match:
        raise UsageError(
            f"{text!r} is not a parameter name, NAME.T, NAME[k/n] or NAME[r:] (numbers of at most 9 digits)"
        )
    part = (int(match["k"]), int(match["n"])) if match["n"] else None
    if part and part[1] > MAX_PARTS:
        raise UsageError(f"{text!r}: a tensor cut into {part[1]} parts; expected at most {MAX_PARTS}")
    if part and not 0 <= part[0] < part[1]:
        raise UsageError(f"{text!r}: part {part[0]} of {part[1]} does not exist (parts count from 0)")
    return Placement(match["name"], bool(match["t"] or match["t2"]), part, int(match["rows"] or 0))


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression of a canonical pattern: its text literally, ``{i}`` a block's index and
    ``{p}`` weight or bias, each the same wherever it appears again."""
    regex = re.escape(pattern)
    for field, matches in FIELDS.items():
        placeholder = re.escape("{" + field + "}")
        regex = regex.replace(placeholder, f"(?P<{field}>{matches})", 1).replace(placeholder, f"(?P={field})")
    return re.compile(regex)


@dataclass(frozen=True)
class MapFile:
    """A map file's rules: canonical pattern ({i} a block, {p} weight or bias) -> the user's placement
    pattern, and user parameters that are no canonical tensor's (``ignore``)."""

    rules: dict[str, str]
    ignore: tuple[str, ...]
    source: str
    absent: tuple[str, ...] = ()
    pooler_output: str | None = None  # the user's module whose output is the pooler's

    def declared(self) -> dict[str, object]:
        """What this map file says beside its placements (``absent``, ``pooler_output``, where given), as a
        map file's contents: ``--write-map`` keeps it with the placement it writes."""
        declared: dict[str, object] = {"absent": list(self.absent)} if self.absent else {}
        return declared | ({"pooler_output": self.pooler_output} if self.pooler_output is not None else {})

    def lacking(self, canonical: Iterable[str]) -> list[str]:
        """The canonical tensors the map file declares absent."""
        found = []
        for pattern in self.absent:
            matched = [name for name in canonical if pattern_regex(pattern).fullmatch(name)]
            if not matched:
                raise UsageError(f"{self.source}: absent {pattern!r} names no canonical tensor of this config")
            found += [name for name in matched if name not in found]
        return found

    def expand(self, canonical: Iterable[str]) -> dict[str, Placement]:
        found = {}
        for pattern, target in self.rules.items():
            regex = pattern_regex(pattern)
            matched = False
            for name in canonical:
                match = regex.fullmatch(name)
                if match:
                    matched = True
                    found[name] = parse_placement(target.replace("{i}", match.groupdict().get("i") or "")
                                                  .replace("{p}", match.groupdict().get("p") or ""))  # fmt: skip
            if not matched:
                raise UsageError(f"{self.source}: {pattern!r} names no canonical tensor of this config")
        return found


def read_map(path: str | Path) -> MapFile:
    """A map file: JSON ``{"names": {canonical pattern: placement}, "ignore": [names], "absent": [canonical
    patterns], "pooler_output": module}``, each optional. Anything else is a ``WeightsError`` naming the file
    (it is read like every other file: size first, then parsed)."""
    path = Path(path)
    with open_regular(path, "map file", WeightsError) as file:
        data = file.read(MAX_MAP_BYTES + 1)
    if len(data) > MAX_MAP_BYTES:
        raise WeightsError(f"{path}: a map file of over {MAX_MAP_BYTES} bytes is not one; expected a small JSON file")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise WeightsError(f"{path}: not a JSON map file ({str(error)[:200]})") from None
    if not isinstance(document, dict) or set(document) - {"names", "ignore", "absent", "pooler_output"}:
        raise WeightsError(
            f'{path}: expected an object with "names" (and optionally "ignore", "absent" and "pooler_output"), got '
            f"{str(document)[:100]}"
        )
    rules, ignore, absent = document.get("names", {}), document.get("ignore", []), document.get("absent", [])
    if not isinstance(rules, dict) or not all(isinstance(v, str) for v in rules.values()):
        raise WeightsError(f'{path}: "names" must map canonical names to strings')
    for key, listed in (("ignore", ignore), ("absent", absent)):
        if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
            raise WeightsError(f'{path}: "{key}" must be a list of names')
    pooler = document.get("pooler_output")
    if pooler is not None and not (
        isinstance(pooler, str) and 0 < len(pooler) <= MAX_MODULE_PATH and pooler.isprintable()
    ):
        raise WeightsError(f'{path}: "pooler_output" must be a module\'s path, got {str(pooler)[:100]!r}')
    for target in rules.values():
        try:
            parse_placement(target.replace("{i}", "0").replace("{p}", "weight"))
        except UsageError as error:
            raise WeightsError(f"{path}: {error}") from None
    return MapFile(rules, tuple(ignore), str(path), tuple(absent), pooler)


def write_map(path: str | Path, contents: dict[str, object]) -> None:
    """A map file of ``contents`` (``ParameterMap.as_map_file``, ``MappingError.suggested``), replaced whole
    or not at all."""
    replace_text(path, json.dumps(contents, indent=2) + "\n")
