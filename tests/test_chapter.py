"""The chapter runs unchanged: every seed's code cells, with only the import line changed, in each
framework the seed shows; each cell's last expression has the shape the seed shows; and the BERTModel
the chapter itself defines computes, given the same weights, what the oracle computes for that
generation. The cells come from ``tests/chapter/cells.json`` (``tests/chapter/extract_cells.py``)."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from bert_multi import BERTConfig, load_backend, random_weights
from bert_multi.backend import BERTOutput, framework_names
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.cases import CASES
from bert_multi.engine.results import assert_conforms

CHAPTER = Path(__file__).parent / "chapter"
SEEDS = json.loads((CHAPTER / "cells.json").read_text(encoding="utf-8"))
SHAPE = re.compile(r"torch\.Size\(\[[\d, ]*\]\)|\(\d+(?:, \d+)*,?\)")
FRAMEWORK = {"pytorch": "torch", "mxnet": "mxnet"}

# The one line each generation's code imports d2l with, and what replaces it.
IMPORTS = {
    ("0.11", "mxnet"): ("import d2l", "from bert_multi.mxnet import d2l_0_11 as d2l"),
    ("0.17", "mxnet"): ("from d2l import mxnet as d2l", "from bert_multi.mxnet import d2l_0_17 as d2l"),
    ("0.17", "pytorch"): ("from d2l import torch as d2l", "from bert_multi.torch import d2l_0_17 as d2l"),
    ("1.0", "mxnet"): ("from d2l import mxnet as d2l", "import bert_multi.mxnet as d2l"),
    ("1.0", "pytorch"): ("from d2l import torch as d2l", "import bert_multi.torch as d2l"),
}
# How the BERTModel each generation's chapter defines is built: its signature changed over the releases.
MODELS = {
    ("0.11", "mxnet"): "BERTModel(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout)",
    ("0.17", "mxnet"): "BERTModel(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout)",
    ("0.17", "pytorch"): (
        "BERTModel(vocab_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads, num_layers, dropout)"
    ),
    ("1.0", "mxnet"): "BERTModel(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout)",
    ("1.0", "pytorch"): "BERTModel(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout)",
}
PRESETS = {"0.11": "d2l-0.11", "0.17": "d2l", "1.0": "d2l"}
RUNS = [(seed, tab) for seed, data in SEEDS.items() for tab in data["tabs"]]


def run_cell(code, namespace):
    """Run a cell as a notebook does: its last expression's value is returned."""
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    return None if last is None else eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)


@pytest.fixture(params=RUNS, ids=[f"{seed}-{tab}" for seed, tab in RUNS])
def chapter(request):
    """A seed's cells run in one namespace; returns (seed, tab, namespace)."""
    seed, tab = request.param
    if not_in_process(FRAMEWORK[tab]):  # the chapter's cells run in this process
        pytest.skip(not_in_process(FRAMEWORK[tab]))
    generation = SEEDS[seed]["d2l"]
    original, replacement = IMPORTS[(generation, tab)]
    namespace = {"__name__": f"seed_{seed}"}
    replaced = 0
    for number, cell in enumerate(SEEDS[seed]["tabs"][tab]):
        lines = [replacement if line.strip() == original else line for line in cell["code"].splitlines()]
        replaced += sum(line == replacement for line in lines)
        value = run_cell("\n".join(lines) + "\n", namespace)
        shown = SHAPE.findall(repr(value)) if cell["expect"] else []
        assert shown == cell["expect"], f"cell {number} shows {shown}, the seed {cell['expect']}:\n{cell['code']}"
    assert replaced == 1, "exactly one line, the d2l import, is changed"
    return seed, tab, namespace


def test_the_chapter_runs_and_its_model_computes_the_oracles_numbers(chapter):
    seed, tab, namespace = chapter
    generation = SEEDS[seed]["d2l"]
    backend = load_backend(FRAMEWORK[tab])
    net = eval(MODELS[(generation, tab)], namespace)
    sizes = [namespace[name] for name in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads")]
    num_blks = namespace.get("num_blks", namespace.get("num_layers"))
    config = BERTConfig(*sizes, num_blks, namespace["dropout"], semantics=PRESETS[generation])
    weights = random_weights(config, seed=int(seed), dtype="float32")
    batch = CASES[0].batch(config, seed=1)
    if tab == "pytorch":
        import torch

        net.eval()  # dropout off, as the oracle
        inputs = [torch.from_numpy(batch[name]) for name in ("tokens", "segments", "valid_lens", "pred_positions")]
        net(*inputs)  # lazy layers (d2l 1.0) take their shapes
        net.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()}, strict=True)
        with torch.no_grad():
            outputs = [tensor.numpy() for tensor in net(*inputs)]
    else:
        import mxnet as mx

        inputs = [mx.np.array(batch[name]) for name in ("tokens", "segments", "pred_positions")]
        inputs.insert(2, mx.np.array(batch["valid_lens"], dtype="float32"))  # MXNet's masks want data's dtype
        net.initialize()
        net(*inputs)  # deferred shapes are known after a first forward
        params = net._collect_params_with_prefix()
        names = framework_names(config, backend.NAME_RULES)
        assert set(params) == set(names.values())
        for name, array in weights.items():
            params[names[name]].set_data(mx.np.array(array))
        outputs = [array.asnumpy() for array in net(*inputs)]
    reference = load_backend("numpy").build(config, weights)(**batch)
    assert_conforms(BERTOutput(*outputs), reference, "float32")


def test_the_cells_are_the_seeds():
    seeds = Path(__file__).resolve().parents[2] / "shared" / "seeds"
    if not seeds.is_dir():
        pytest.skip(f"the seeds are not beside this checkout ({seeds}); cells.json was extracted from them")
    sys.path.insert(0, str(CHAPTER))
    from extract_cells import extract

    assert extract(seeds) == SEEDS, "run `python tests/chapter/extract_cells.py` after changing the seeds"
