"""The framework-differences guide as Jupyter notebooks (``bert-multi lessons --notebooks DIR``): one per
section and framework, the section's prose as markdown cells and that framework's samples as code cells
with the outputs they printed when run, in the framework's own environment, by ``lessons.run``. A sample
that changes the process (tagged ``fresh``) gets a notebook of its own, since a notebook's cells share
one process. Written with nbformat (version 4), which validates each one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..backend.registry import label_of
from ..errors import UsageError
from ..safe_files import replace_text
from .kernels import kernel_for
from .lessons import Outcome, Sample, Section, run


def _nbformat() -> Any:
    try:
        import nbformat
    except ImportError:
        raise UsageError("writing notebooks needs nbformat: pip install 'bert_multi[notebooks]'") from None
    return nbformat


def slug(text: str) -> str:
    """A file-name form of a title: lower case, words joined by hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("`", "")).strip("-")


def notebook_plan(section: Section) -> list[tuple[str, str, list[Sample]]]:
    """(file stem, framework, samples) for each notebook of ``section``: a framework's samples together,
    each ``fresh`` one alone."""
    plan = []
    stem = f"{section.number:02d}-{slug(section.title)}"
    for framework in dict.fromkeys(sample.framework for sample in section.samples):
        samples = [sample for sample in section.samples if sample.framework == framework]
        shared = [sample for sample in samples if not sample.fresh]
        if shared:
            plan.append((f"{stem}-{framework}", framework, shared))
        plan += [
            (f"{stem}-{framework}-fresh-{index}", framework, [sample])
            for index, sample in enumerate((sample for sample in samples if sample.fresh), start=1)
        ]
    return plan


def write_notebooks(
    sections: list[Section], directory: str | Path, runner: Callable[[list[Sample]], list[Outcome]] = run
) -> list[Path]:
    """A notebook per section, framework and fresh sample in ``directory``, its code cells' outputs what
    the samples printed when ``runner`` ran them; the paths written, in order."""
    nbformat = _nbformat()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    kernels: dict[str, tuple[str, str]] = {}  # framework -> its kernel's name and display name, asked once
    for section in sections:
        for stem, framework, samples in notebook_plan(section):
            printed = {outcome.sample.line: outcome.printed for outcome in runner(samples)}
            notebook = nbformat.v4.new_notebook()
            if framework not in kernels:  # the environment its framework needs (``bert-multi kernels``)
                kernels[framework] = kernel_for(framework)
            name, shown = kernels[framework]
            notebook.metadata["kernelspec"] = {"name": name, "display_name": shown, "language": "python"}
            notebook.metadata["language_info"] = {"name": "python"}
            title = f"# {section.number}. {section.title}\n\nIn {label_of(framework)}."
            cells = [nbformat.v4.new_markdown_cell(title)]
            count = 0
            leads = section.leads()
            for index, part in enumerate(section.parts):
                if isinstance(part, str):
                    led = leads.get(index)
                    if led is None or led.framework == framework:  # another framework's note is its own
                        cells.append(nbformat.v4.new_markdown_cell(part))
                elif part in samples:
                    count += 1
                    output = nbformat.v4.new_output("stream", name="stdout", text=printed[part.line])
                    cells.append(nbformat.v4.new_code_cell(part.code, execution_count=count, outputs=[output]))
            notebook.cells = cells
            path = directory / f"{stem}.ipynb"
            replace_text(path, nbformat.writes(notebook))  # validated against the nbformat 4 schema first
            written.append(path)
    return written
