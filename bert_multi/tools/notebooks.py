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

INDEX = "index.ipynb"  # the notebook that lists the others


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
    the samples printed when ``runner`` ran them, each followed by the other frameworks' code for the same
    step and what it printed, so that the comparison is kept; a link to another section leads to its
    notebook, and ``index.ipynb`` lists them all. The notebooks' paths, in order (the index apart)."""
    nbformat = _nbformat()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    kernels: dict[str, tuple[str, str]] = {}  # framework -> its kernel's name and display name, asked once
    stems = {section.number: notebook_plan(section) for section in sections}
    for section in sections:
        printed = {
            outcome.sample.line: outcome.printed
            for _, _, samples in stems[section.number]
            for outcome in runner(samples)
        }
        for stem, framework, samples in stems[section.number]:
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
                        cells.append(nbformat.v4.new_markdown_cell(_linked(part, stems, framework)))
                elif part in samples:
                    count += 1
                    output = nbformat.v4.new_output("stream", name="stdout", text=printed[part.line])
                    cells.append(nbformat.v4.new_code_cell(part.code, execution_count=count, outputs=[output]))
                    others = _beside(section, part)
                    if others:
                        cells.append(nbformat.v4.new_markdown_cell(_compared(others, printed)))
            notebook.cells = cells
            path = directory / f"{stem}.ipynb"
            replace_text(path, nbformat.writes(notebook))  # validated against the nbformat 4 schema first
            written.append(path)
    index = nbformat.v4.new_notebook()
    index.metadata["language_info"] = {"name": "python"}
    lines = ["# How the frameworks differ: the notebooks", ""]
    for section in sections:
        links = ", ".join(f"[{_label(framework, stem)}]({stem}.ipynb)" for stem, framework, _ in stems[section.number])
        lines.append(f"{section.number}. {section.title}: {links}")
    index.cells = [nbformat.v4.new_markdown_cell("\n".join(lines))]
    replace_text(directory / INDEX, nbformat.writes(index))
    return written


def _label(framework: str, stem: str) -> str:
    return label_of(framework) + (
        f" ({stem.rsplit('-', 2)[-2]} {stem.rsplit('-', 1)[-1]})" if "-fresh-" in stem else ""
    )


def _beside(section: Section, sample: Sample) -> list[Sample]:
    """The other frameworks' samples of the same step: those in the run of samples ``sample`` is in (a
    paragraph leading into one framework's sample is part of the run, not its end)."""
    runs: list[list[Sample]] = [[]]
    leads = section.leads()
    for index, part in enumerate(section.parts):
        if isinstance(part, Sample):
            runs[-1].append(part)
        elif runs[-1] and index not in leads:
            runs.append([])
    run_of = next(run for run in runs if sample in run)
    return [other for other in run_of if other.framework != sample.framework]


def _compared(others: list[Sample], printed: dict[int, str]) -> str:
    """The other frameworks' code for the same step and what it printed, as markdown."""
    parts = []
    for other in others:
        parts.append(
            f"In {label_of(other.framework)}:\n\n```python\n{other.code.rstrip()}\n```\n\nprints\n\n"
            f"```\n{printed.get(other.line, other.expected).rstrip()}\n```"
        )
    return "\n\n".join(parts)


def _linked(text: str, stems: dict[int, list[tuple[str, str, list[Sample]]]], framework: str) -> str:
    """A paragraph whose links to other sections (``#25-64-bit-mode``) lead to their notebooks: the one of
    ``framework`` where the section has one, else its first; a section not written keeps its words only."""

    def target(match: re.Match[str]) -> str:
        plans = stems.get(int(match[2]), [])
        own = [stem for stem, name, _ in plans if name == framework] or [stem for stem, _, _ in plans]
        return f"[{match[1]}]({own[0]}.ipynb)" if own else match[1]

    return re.sub(r"\[([^\]]+)\]\(#(\d+)-[^)]*\)", target, text)
