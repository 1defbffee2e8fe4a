"""The house rules of bert_multi/: the core's layers show in its tree, each module imports only from its
own layer and those below (docs/design.md, "Layers"), and no unit grows too long to read."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bert_multi"
# The source read as text: the same in every environment.
pytestmark = pytest.mark.once

# Bottom to top, each a package (the base: the package's own modules), so that the tree shows the floors.
# The framework backends use the layers below them; nothing below imports them by name (the registry
# loads them), and the command line and the tools reach them only through the registry.
LAYERS = [
    # Exceptions, messages, where compiled code is kept, waits that Ctrl-C ends, and files read as hostile
    # and written atomically (safe_files), which every layer uses.
    (
        "base",
        (
            "bert_multi.errors",
            "bert_multi.arrays",
            "bert_multi.display",
            "bert_multi.cache",
            "bert_multi.ending",
            "bert_multi.waiting",
            "bert_multi.safe_files",
        ),
    ),
    # What the model is, and its canonical weights in memory and on disk (every layer that holds weights
    # may write the file: a worker writes its model's, in its own environment).
    ("spec", ("bert_multi.spec",)),
    ("backend", ("bert_multi.backend",)),
    ("files", ("bert_multi.files",)),
    # The conformance engine, then port verification on top of it: the engine knows a model only through
    # the backend contract.
    ("engine", ("bert_multi.engine",)),
    ("verify", ("bert_multi.verify", "bert_multi.testing")),
    ("training", ("bert_multi.training",)),
    ("frameworks", ("bert_multi.torch", "bert_multi.mxnet", "bert_multi.jax", "bert_multi.transformers")),
    ("tools", ("bert_multi.tools",)),
    ("cli", ("bert_multi.cli",)),
]
FRAMEWORKS = LAYERS[7][1]


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


def test_the_tree_of_architecture_md_names_every_module_of_the_core():
    """The tree in docs/architecture.md shows each package of the core with its modules (and the checkpoint
    formats' modules): one that a change adds, and the page does not name, fails here."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    tree = page.split("```\nbert_multi/\n", 1)[1].split("```", 1)[0]
    named: dict[str, set[str]] = {}
    package = None
    for line in tree.splitlines():
        entry = re.match(r"[├└]── (\w+)/ ", line)
        package = entry[1] if entry else package if line.startswith("│ ") else None
        if package:
            named.setdefault(package, set()).update(re.findall(r"\w+", line))
    missing = {}
    for package in ("spec", "backend", "files", "engine", "verify", "training", "tools"):
        modules = {path.stem for path in (PACKAGE / package).glob("*.py")} - {"__init__"}
        modules |= {path.parent.name for path in (PACKAGE / package).glob("*/__init__.py")}
        if package == "files":
            modules |= {path.stem for path in (PACKAGE / package / "formats").glob("*.py")} - {"__init__"}
        if modules - named.get(package, set()):
            missing[package] = sorted(modules - named.get(package, set()))
    assert not missing, f"docs/architecture.md's tree does not name: {missing}"


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
        if own != LAYERS.index(LAYERS[7]) and any(target.startswith(name) for name in FRAMEWORKS)
    ]
    assert not upward + by_name, "\n".join(upward + by_name)


def test_the_check_sees_an_import_that_reaches_up(tmp_path, monkeypatch):
    """The check above can fail: a spec module importing the conformance engine is caught, and so is the
    engine importing port verification."""
    real = PACKAGE
    for path, late, caught in (
        ("spec/config.py", "from ..engine.conform import Report", r"bert_multi\.engine\.conform \(engine\) from spec"),
        (
            "engine/conform.py",
            "from ..verify.session import verify",
            r"bert_multi\.verify\.session \(verify\) from engine",
        ),
    ):
        fake = tmp_path / "bert_multi" / path
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_text((real / path).read_text() + f"\n\ndef late():\n    {late}\n")
        monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "bert_multi")
        with pytest.raises(AssertionError, match=caught):
            test_a_module_imports_only_from_its_layer_and_those_below(fake)


def import_graph(modules: list[Path]) -> dict[str, set[str]]:
    """Each module of bert_multi and the modules of bert_multi it imports, at the top or lazily (an import
    of a name inside a module is an arrow to that module; of a package, to its ``__init__``)."""
    names = {module_name(path) for path in modules}

    def resolved(target: str) -> str:
        while target not in names and "." in target:
            target = target.rsplit(".", 1)[0]
        return target

    return {
        module_name(path): {resolved(target) for _, target in imports(path)} - {module_name(path)} for path in modules
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each set of modules that reach one another (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_each_other():
    """Whatever a module needs of another goes one way: a circle of imports, even a lazy one, is a sign that
    two modules hold one idea between them."""
    assert not cycles(import_graph(MODULES)), cycles(import_graph(MODULES))


def test_the_cycle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]] and not cycles({"a": {"b"}, "b": set()})


def test_a_frameworks_user_model_wrapper_imports_only_the_ports_contract():
    """A framework's ``user.py`` builds what port verification wraps a user's model into, ``subject``'s
    contract, and nothing else of it; the engine below knows nothing of users' models."""
    reaching = [
        f"{module_name(path)} line {line}: {target}"
        for path in (PACKAGE / name / "user.py" for name in ("torch", "mxnet", "jax", "transformers"))
        for line, target in imports(path)
        if target.startswith("bert_multi.verify") and target != "bert_multi.verify.subject"
    ]
    assert not reaching, reaching


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
