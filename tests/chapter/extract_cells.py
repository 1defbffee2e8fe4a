"""Extract the code cells of the BERT chapter, in each version of it we hold, into
``tests/chapter/cells.json``.

    python tests/chapter/extract_cells.py DIRECTORY    # the chapter's versions as text, NNN_*.txt

For each version (a "seed", numbered 000 to 004) and framework tab: the cells in order, verbatim (the
test changes only the import line), and the shapes each cell's last expression must have: the seed's
own output where it shows one (001, 002), otherwise the shapes the chapter states for its sizes. The
seeds come in four formats: d2l's markdown (000, 003, 004), a notebook exported as text (001), and
reStructuredText with the newlines lost (002), whose cells are formatted by hand in ``seed_002.py``
and checked here token for token.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from seed_002 import CELLS as SEED_002_CELLS  # noqa: E402

# seed prefix -> (format, the d2l code it shows)
SEEDS = {
    "000": ("markdown", "0.17"),
    "001": ("notebook", "1.0"),  # d2l-zh 2.0: TransformerEncoderBlock and num_blks, PyTorch only
    "002": ("flattened", "1.0"),
    "003": ("markdown", "0.17"),
    "004": ("markdown", "0.11"),
}
# The shapes the chapter states for its demo (batch 2, 8 tokens, 768 hidden, vocab 10000, 3 positions).
CHAPTER_SHAPES = {
    "encoded_X.shape": (2, 8, 768),
    "mlm_Y_hat.shape": (2, 3, 10000),
    "mlm_l.shape": (6,),
    "nsp_Y_hat.shape": (2, 2),
    "nsp_l.shape": (2,),
}
SHAPE = re.compile(r"torch\.Size\(\[[\d, ]*\]\)|\(\d+(?:, \d+)*,?\)")


def shape_text(shape: tuple, tab: str) -> str:
    """How a notebook shows ``shape``: torch.Size([2, 8]) for PyTorch, (2, 8) for MXNet."""
    return f"torch.Size({list(shape)})" if tab == "pytorch" else repr(tuple(shape))


def cell(code: str, tab: str, shown: list[str] | None) -> dict:
    last = code.strip().splitlines()[-1].strip()
    if shown is None and last in CHAPTER_SHAPES:
        return {"code": code, "expect": [shape_text(CHAPTER_SHAPES[last], tab)], "expect_from": "chapter sizes"}
    return {"code": code, "expect": shown or [], "expect_from": "seed output" if shown else None}


def markdown_cells(text: str) -> dict[str, list[dict]]:
    """d2l's source: ```{.python .input} fences; a first line '#@tab pytorch' or '#@tab all' picks the tab,
    none means MXNet (d2l's default)."""
    tabs: dict[str, list[dict]] = {"mxnet": [], "pytorch": []}
    for code in re.findall(r"```\{\.python \.input[^}]*\}\n(.*?)```", text, re.S):
        first = code.splitlines()[0].strip()
        targets = {"#@tab pytorch": ["pytorch"], "#@tab all": ["mxnet", "pytorch"]}.get(first, ["mxnet"])
        for tab in targets:
            tabs[tab].append(cell(code, tab, None))
    return {tab: cells for tab, cells in tabs.items() if cells}


def notebook_cells(text: str) -> dict[str, list[dict]]:
    """'In [n]:' then the code, which ends at a blank line followed by an unindented line; what follows,
    up to the next cell, is output, from which the shapes shown are read."""
    cells = []
    for chunk in re.split(r"^In \[\d*\]:\n", text, flags=re.M)[1:]:
        lines = chunk.splitlines()
        end = len(lines)
        for i, line in enumerate(lines):
            following = next((later for later in lines[i + 1 :] if later.strip()), "")
            if not line.strip() and not following.startswith((" ", "\t")):
                end = i
                break
        code = "\n".join(lines[:end]) + "\n"
        shown = re.findall(r"torch\.Size\(\[[\d, ]*\]\)", "\n".join(lines[end:]))
        cells.append(cell(code, "pytorch", shown))
    return {"pytorch": cells}


def normalized(code: str) -> str:
    """Code as the flattened seed has it: one line, and HTML-like tokens such as '<cls>' stripped."""
    return " ".join(re.sub(r"<[a-z]+>", "", code).split())


def flattened_cells(text: str) -> dict[str, list[dict]]:
    """Input cells and output blocks in the order they appear; each output belongs to the input before it."""
    pieces = re.findall(
        r"\\diilbookstyleinputcell \.\. code:: python (.*?) \.\. raw:: |"
        r"\.\. parsed-literal:: :class: output (.*?) \.\. raw::",
        text,
        re.S,
    )
    inputs: list[tuple[str, list[str]]] = []
    for code, output in pieces:
        if code:
            inputs.append((code, []))
        elif inputs and SHAPE.fullmatch(output.strip()):
            inputs[-1][1].append(output.strip())
    if len(inputs) != len(SEED_002_CELLS):
        raise SystemExit(f"seed 002 has {len(inputs)} code cells; seed_002.py formats {len(SEED_002_CELLS)}")
    tabs: dict[str, list[dict]] = {"mxnet": [], "pytorch": []}
    for number, ((flat, shown), (tab, code)) in enumerate(zip(inputs, SEED_002_CELLS)):
        if normalized(code) != normalized(flat):
            raise SystemExit(
                f"seed_002.py cell {number} differs from the seed:\n{normalized(code)}\n{normalized(flat)}"
            )
        tabs[tab].append(cell(code, tab, shown))
    return tabs


def extract(seeds: Path) -> dict:
    """Every seed's cells, as ``cells.json`` holds them."""
    parse = {"markdown": markdown_cells, "notebook": notebook_cells, "flattened": flattened_cells}
    extracted = {}
    for prefix, (layout, code) in SEEDS.items():
        [path] = seeds.glob(f"{prefix}_*.txt")
        extracted[prefix] = {"file": path.name, "d2l": code, "tabs": parse[layout](path.read_text(encoding="utf-8"))}
    return extracted


def main(seeds: Path) -> None:
    extracted = extract(seeds)
    out = HERE / "cells.json"
    out.write_text(json.dumps(extracted, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for prefix, seed in extracted.items():
        counts = ", ".join(f"{tab} {len(cells)}" for tab, cells in seed["tabs"].items())
        print(f"{prefix} ({seed['d2l']}): {counts} cells")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else HERE.parents[2] / "shared" / "seeds"))
