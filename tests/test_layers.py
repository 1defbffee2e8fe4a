"""The house rules of bert_multi/: the core's layers show in its tree, each module imports only from its
own layer and those below (docs/design.md, "Layers"), and no unit grows too long to read."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bert_multi"

# Bottom to top. The framework backends use the layers below them; nothing below imports them by name
# (the registry loads them), and the command line and the tools reach them only through the registry.
LAYERS = [
    # files.safe (reading hostile files, writing atomically) needs nothing of bert_multi: every layer reads
    # and writes files through it.
    (
        "base",
        (
            "bert_multi.errors",
            "bert_multi.arrays",
            "bert_multi.display",
            "bert_multi.cache",
            "bert_multi.ending",
            "bert_multi.files.safe",
        ),
    ),
    # The canonical weight file is the schema on disk: every layer that holds weights may write one (a
    # worker writes its model's, in its own environment).
    ("spec", ("bert_multi.spec", "bert_multi.files.weights")),
    ("backend", ("bert_multi.backend",)),
    ("files", ("bert_multi.files",)),
    ("verify", ("bert_multi.verify", "bert_multi.testing")),
    ("training", ("bert_multi.training",)),
    ("frameworks", ("bert_multi.torch", "bert_multi.mxnet", "bert_multi.jax", "bert_multi.transformers")),
    ("tools", ("bert_multi.tools",)),
    ("cli", ("bert_multi.cli",)),
]
FRAMEWORKS = LAYERS[6][1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    """The index of the layer ``module`` belongs to; None for the package itself (the public API)."""
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every bert_multi module ``path`` imports, relative or not, lazily or not."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("bert_multi")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("bert_multi"):
                continue
            if node.module is None:  # from . import x: x is a module of the package
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, module))
    return found


MODULES = sorted(path for path in PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    lost = [
        module_name(path) for path in MODULES if path != PACKAGE / "__init__.py" and layer_of(module_name(path)) is None
    ]
    assert not lost, f"modules in no layer: {lost}; add them to a layer's package"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_a_module_imports_only_from_its_layer_and_those_below(path):
    own = layer_of(module_name(path))
    if own is None:  # bert_multi/__init__.py: the public API gathers every layer
        return
    upward = [
        f"line {line}: {target} ({LAYERS[layer_of(target)][0]}) from {LAYERS[own][0]}"
        for line, target in imports(path)
        if (layer_of(target) or 0) > own
    ]
    by_name = [
        f"line {line}: {target}, a framework backend, imported by name (ask the registry)"
        for line, target in imports(path)
        if own != LAYERS.index(LAYERS[6]) and any(target.startswith(name) for name in FRAMEWORKS)
    ]
    assert not upward + by_name, "\n".join(upward + by_name)


def test_the_check_sees_an_import_that_reaches_up(tmp_path, monkeypatch):
    """The check above can fail: a spec module importing the verification engine is caught."""
    spec = PACKAGE / "spec" / "config.py"
    fake = tmp_path / "bert_multi" / "spec" / "config.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(spec.read_text() + "\n\ndef late():\n    from ..verify.conform import Report\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "bert_multi")
    with pytest.raises(AssertionError, match=r"bert_multi\.verify\.conform \(verify\) from spec"):
        test_a_module_imports_only_from_its_layer_and_those_below(fake)


MAX_FUNCTION_LINES, MAX_MODULE_LINES = 80, 500


def test_no_function_is_over_80_lines_and_no_module_over_500():
    """Long units are where readers get lost: split them where they change subject."""
    long = []
    for path in MODULES:
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{module_name(path)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{module_name(path)}.{node.name} (line {node.lineno}): {length} lines")
    assert not long, "\n".join(long)


# Helpers one framework needs and the others do not, named: Gluon's Dense fuses its activation but has
# no GELU, and MXNet 1.9's own is not the exact (erf) one; torch's CPU dropout masks cost a third of a
# training step; MXNet 1.9 has no fused attention kernel for attention="sdpa" to call.
FRAMEWORK_ONLY = {
    "torch": ("Dropout", "FusedDotProductAttention"),
    "mxnet": ("gelu", "GELUDense"),
    "jax": ("FusedDotProductAttention",),
}


def public_definitions(path: Path) -> list[str]:
    """The public classes and functions a module defines, in order."""
    nodes = ast.parse(path.read_text()).body
    return [node.name for node in nodes if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name[0] != "_"]


# What every framework's pretrain.py offers, in this order; each may add helpers of its own between them.
PRETRAINING = ["pretraining_loss", "Pretrainer", "join_data_parallel", "end_worker", "train_data_parallel"]


def test_the_framework_packages_are_parallel_file_for_file_and_class_for_class():
    torch, mxnet, jax = PACKAGE / "torch", PACKAGE / "mxnet", PACKAGE / "jax"
    assert sorted(p.name for p in torch.glob("*.py")) == sorted(p.name for p in mxnet.glob("*.py"))
    assert sorted(p.name for p in jax.glob("*.py")) == sorted(p.name for p in torch.glob("*.py"))
    for package in (torch, mxnet, jax):
        defined = public_definitions(package / "pretrain.py")
        assert [name for name in defined if name in PRETRAINING] == PRETRAINING, package.name
    orders = {
        name: [d for d in public_definitions(PACKAGE / name / "model.py") if d not in FRAMEWORK_ONLY[name]]
        for name in ("torch", "mxnet", "jax")
    }
    assert orders["torch"] == orders["mxnet"] == orders["jax"], orders
    assert orders["torch"][-1] == "BERTModel" and "masked_softmax" in orders["torch"]
