"""Jupyter kernels for the project's environments, and the guide's notebooks run in them as a teacher runs
them: each notebook names the kernel of its framework, and executed there (nbclient, a real ipykernel of
that environment's Python) every code cell prints what the guide says it prints."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bert_multi.backend.channel import SOURCE_ROOT
from bert_multi.backend.registry import backends, frameworks, not_in_process
from bert_multi.tools import kernels, lessons

SECTIONS = lessons.read_guide()


def test_each_environment_gets_a_kernel_named_for_its_frameworks(tmp_path):
    pytest.importorskip("ipykernel", reason="the kernels need ipykernel (the [notebooks] extra)")
    written = kernels.write_kernels(tmp_path)
    here = [name for name in frameworks() if backends()[name].available and not not_in_process(name)]
    assert kernels.kernel_name(here) in {folder.name for folder in written}
    for folder in written:
        spec = json.loads((folder / "kernel.json").read_text())
        names = spec["metadata"]["bert_multi"]["frameworks"]
        assert folder.name == kernels.kernel_name(names) and spec["argv"][1:3] == ["-m", "ipykernel_launcher"]
        assert list(kernels.frameworks_of(spec["argv"][0])) == names  # what that Python runs itself
    covered = {
        name
        for f in written
        for name in json.loads((f / "kernel.json").read_text())["metadata"]["bert_multi"]["frameworks"]
    }
    assert covered == {name for name in frameworks() if backends()[name].available}  # every one has a kernel
    for name in covered:  # and a notebook of it names one of them
        assert kernels.kernel_for(name)[0] in {folder.name for folder in written}


@pytest.mark.skipif(bool(not_in_process("mxnet")), reason="run once, from the main environment: it asks the other")
def test_the_kernels_have_the_same_names_whichever_environment_writes_them(tmp_path):
    """From .venv and from .venv-numpy2 alike: a notebook written from either names a kernel ``make
    kernels`` installed."""
    pytest.importorskip("ipykernel", reason="the kernels need ipykernel (the [notebooks] extra)")
    others = {lessons.python_for(name) for name in frameworks() if backends()[name].available} - {sys.executable}
    if not others:
        pytest.skip("one environment here: nothing to compare its kernels with")
    ours = {folder.name for folder in kernels.write_kernels(tmp_path / "ours")}
    for python in others:
        command = [python, "-m", "bert_multi.cli", "kernels", "--dir", str(tmp_path / "theirs")]
        environment = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}  # as a user runs it there
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
        assert done.returncode == 0, done.stderr
        assert {folder.name for folder in (tmp_path / "theirs").iterdir()} == ours


@pytest.mark.skipif(bool(not_in_process("mxnet")), reason="run once, from the main environment: its kernels reach both")
def test_every_notebook_names_its_frameworks_kernel_and_one_of_each_runs_there_printing_what_the_guide_says(
    tmp_path, monkeypatch
):
    """Every notebook names its framework's kernel and holds the guide's samples; one notebook of each
    framework is run in the kernel it names (a kernel that starts the wrong environment, or none, fails
    it). Every sample's output is held to the guide in each environment by test_lessons, without kernels."""
    nbclient = pytest.importorskip("nbclient", reason="executing notebooks needs nbclient (a test dependency)")
    import nbformat

    from bert_multi.tools import notebooks

    unavailable = [name for name in frameworks() if not backends()[name].available]
    if unavailable:
        pytest.skip(f"every framework's environment is needed: {unavailable} cannot run here")
    kernels.write_kernels(tmp_path / "jupyter" / "kernels")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    expected = {sample.code: sample.expected for section in SECTIONS for sample in section.samples}
    written = notebooks.write_notebooks(
        SECTIONS, tmp_path / "notebooks", lambda samples: [lessons.Outcome(s, "(not run)") for s in samples]
    )
    assert len(written) == sum(len(notebooks.notebook_plan(section)) for section in SECTIONS)
    first: dict[str, Path] = {}
    for path in written:
        framework = next(name for name in frameworks() if path.stem.rsplit("-fresh-", 1)[0].endswith(f"-{name}"))
        notebook = nbformat.read(str(path), as_version=4)
        assert notebook.metadata.kernelspec.name == kernels.kernel_for(framework)[0], path.name
        assert all(cell.source in expected for cell in notebook.cells if cell.cell_type == "code"), path.name
        first.setdefault(framework, path)
    assert set(first) == set(frameworks())

    async def execute(path, limit):
        async with limit:
            notebook = nbformat.read(str(path), as_version=4)
            client = nbclient.NotebookClient(notebook, timeout=300, kernel_name=notebook.metadata.kernelspec.name)
            await client.async_execute()
            return path, notebook

    async def each():
        limit = asyncio.Semaphore(max(len(os.sched_getaffinity(0)), 2))
        return await asyncio.gather(*(execute(path, limit) for path in first.values()))

    wrong, ran = [], 0
    for path, notebook in asyncio.run(each()):
        for cell in notebook.cells:
            if cell.cell_type != "code":
                continue
            ran += 1
            printed = "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")
            if printed.rstrip() != expected[cell.source].rstrip():
                wrong.append(f"{path.name}: printed {printed!r}, the guide says {expected[cell.source]!r}")
    assert ran >= len(first) and not wrong, "\n".join(wrong[:5])
