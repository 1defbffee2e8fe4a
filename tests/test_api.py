"""The public API as a user meets it: imports, the backend registry, the command line."""

import re
import subprocess
import sys

import pytest

import bert_multi
from bert_multi import BackendUnavailable, backends, load_backend
from bert_multi.backend.registry import registrations
from bert_multi.cli import main


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_the_package_imports_no_framework():
    result = run_python(
        "import sys, bert_multi, bert_multi.cli; print(sorted(m for m in ('torch', 'mxnet') if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_public_names_are_exported():
    for name in bert_multi.__all__:
        assert hasattr(bert_multi, name), name


def test_the_engines_modules_import_under_their_old_names_as_the_same_modules():
    """The conformance engine's modules lived in bert_multi.verify: users' imports of them still work, in a
    fresh process (as a user's script runs), and give the engine's own modules, not copies."""
    names = ("cases", "compare", "conform", "lanes", "results", "report")
    code = (
        "import importlib\n"
        "from bert_multi.verify.results import Target\n"
        "from bert_multi.verify.cases import CASES\n"
        "import bert_multi.engine.results, bert_multi.engine.cases\n"
        "assert Target is bert_multi.engine.results.Target and CASES is bert_multi.engine.cases.CASES\n"
        "module = importlib.import_module\n"
        f"same = [module('bert_multi.verify.' + n) is module('bert_multi.engine.' + n) for n in {names!r}]\n"
        "print(all(same), len(same))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "6"]


def test_backends_lists_every_backend_with_its_status():
    status = backends()
    assert list(status) == ["numpy", "torch", "mxnet", "jax", "transformers"]
    assert status["numpy"].available and status["numpy"].reason is None
    for name, state in status.items():
        assert state.available == (state.reason is None), name


def test_unknown_backend_names_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown backend 'tensorflow': expected one of \['numpy', 'torch', 'mxnet', 'jax', 'transformers'\]",
    ):
        load_backend("tensorflow")


@pytest.mark.parametrize("backend, package", [("torch", "torch"), ("mxnet", "mxnet"), ("jax", "jax")])
def test_missing_framework_is_a_clear_error_naming_the_package(backend, package):
    # Hide the framework as if it were not installed, and look for no other environment that has it.
    result = run_python(
        f"import os, sys; sys.modules[{package!r}] = None; os.environ['BERT_MULTI_PYTHON_{backend.upper()}'] = 'none'\n"
        "import bert_multi\n"
        f"print(bert_multi.backends()[{backend!r}])\n"
        f"bert_multi.load_backend({backend!r})\n"
    )
    assert "available=False" in result.stdout
    assert "BackendUnavailable" in result.stderr
    assert registrations()[backend].install.split(" (")[0] in result.stderr  # the command that installs it


def test_backend_unavailable_is_an_import_error():
    assert issubclass(BackendUnavailable, ImportError)


def test_demo_prints_the_chapter_shapes_for_every_backend(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for name, status in backends().items():
        if status.role == "reference":  # it computes the original BERT, not the chapter's
            assert not any(line.startswith(name + " ") for line in out.splitlines())
            continue
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        if status.available:
            assert "(2, 8, 768)" in line and "(2, 3, 10000)" in line and "(2, 2)" in line, line
        else:
            assert "skipped" in line


def test_backends_command_prints_a_table(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^numpy +yes +oracle +cpu +bert_multi.backend.oracle$", out, flags=re.M)
    available = [name for name, status in backends().items() if status.available]
    verdict = f"{len(available)} of {len(backends())} backends can run here: {', '.join(available)}."
    assert out.rstrip().endswith(verdict)
