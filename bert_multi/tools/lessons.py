"""The framework-differences guide (``docs/framework-differences.md``), executable.

Each ``## `` section of the guide holds samples: a fenced block tagged ``python NAME``, NAME a framework
backend (``python torch``), followed at once by a ``text`` block with exactly what it prints. ``run``
executes the samples of one framework in a child process, each in a namespace of its own; a sample that
changes the process itself (``npx.set_np()``, ``torch.set_default_dtype``) is tagged ``fresh`` and gets a
process of its own. ``check`` compares what they print with what the guide says they print.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..backend.registry import backends, frameworks, label_of, load_backend
from ..errors import BackendUnavailable, UsageError

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "framework-differences.md"
REFERENCE = "torch"  # the framework every section sets the others against

# Runs in the child: every sample from stdin, each with its own namespace and captured stdout.
_CHILD = """
import contextlib, io, json, sys, traceback
results = []
for code in json.load(sys.stdin):
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, "<sample>", "exec"), {"__name__": "__sample__"})
    except BaseException:
        buffer.write("the sample raised " + traceback.format_exc().strip().splitlines()[-1] + "\\n")
    results.append(buffer.getvalue())
sys.stdout.write("\\n" + json.dumps(results))
"""


@dataclass(frozen=True)
class Sample:
    framework: str
    code: str
    expected: str  # what the guide says it prints
    line: int  # where the code starts in the guide
    last: int  # the line closing its output block
    fresh: bool = False  # needs a Python process of its own


@dataclass
class Section:
    number: int
    title: str
    samples: list[Sample] = field(default_factory=list)
    parts: list[str | Sample] = field(default_factory=list)  # its paragraphs and samples, in the guide's order

    def matches(self, words: str) -> bool:
        """Whether each of ``words`` is a word of the title (any case, markdown's backticks ignored)."""
        return _has_all(words, self.title)

    def own_to(self, words: str) -> bool:
        """Whether the section is one framework's own, set against PyTorch alone (JAX's sections 21 on),
        and ``words`` name that framework (``jax``, ``Flax``)."""
        others = {sample.framework for sample in self.samples} - {REFERENCE}
        return len(others) == 1 and _has_all(words, " ".join([*others, label_of(next(iter(others)))]))

    def leads(self) -> dict[int, Sample]:
        """The paragraphs that lead into one framework's sample: index in ``parts`` -> that sample. A
        paragraph between samples, right before the first sample of a framework the section has not shown
        yet (JAX's note, after PyTorch's and MXNet's samples), is that framework's: in its tab on the site
        (``site.render_guide``) and in its notebook only."""
        leads: dict[int, Sample] = {}
        shown = set()
        for index, part in enumerate(self.parts):
            if isinstance(part, Sample):
                shown.add(part.framework)
                continue
            following = self.parts[index + 1] if index + 1 < len(self.parts) else None
            if shown and isinstance(following, Sample) and following.framework not in shown:
                leads[index] = following
        return leads

    def says(self, words: str) -> bool:
        """Whether each of ``words`` is a word of the section's text: its title, prose and samples."""
        return _has_all(words, " ".join([self.title, *(str(p) if isinstance(p, str) else p.code for p in self.parts)]))


def _has_all(words: str, text: str) -> bool:
    found = set(re.findall(r"[\w-]+", text.lower().replace("/", " ")))
    return all(word in found for word in re.findall(r"[\w-]+", words.lower()))


def search(sections: list[Section], words: str) -> tuple[list[Section], str]:
    """The sections ``words`` name, and where they were found: a number; else the sections whose title
    has every word; else those that are one framework's own, when the words name it; else those whose
    text has every word. None found is an empty list."""
    if words.strip().isdigit():
        return [section for section in sections if section.number == int(words)], "number"
    for where, test in (("title", Section.matches), ("framework", Section.own_to), ("text", Section.says)):
        found = [section for section in sections if test(section, words)]
        if found:
            return found, where
    return [], "nowhere"


@dataclass(frozen=True)
class Outcome:
    sample: Sample
    printed: str

    @property
    def as_written(self) -> bool:
        return self.printed.rstrip() == self.sample.expected.rstrip()


def read_guide(path: str | Path = GUIDE) -> list[Section]:
    """The guide's sections and samples; a sample without its output block is a ``ValueError``."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: the framework-differences guide is not there (it ships with the repository)")
    lines = path.read_text().splitlines()
    sections: list[Section] = []
    # (section, info, body, first line of the body, closing line) per fenced block
    blocks: list[tuple[Section | None, str, str, int, int]] = []
    paragraph: list[str] = []
    placed: dict[int, list[tuple[int, str | Sample]]] = {}  # per section: (line, paragraph or sample)

    def end_paragraph() -> None:
        if paragraph and sections:
            placed.setdefault(sections[-1].number, []).append((index + 1 - len(paragraph), " ".join(paragraph)))
        paragraph.clear()

    index = 0
    while index < len(lines):
        heading = re.match(r"## (\d+)\. (.+)", lines[index])
        if heading or lines[index].startswith("```") or not lines[index].strip():
            end_paragraph()
        else:
            paragraph.append(lines[index].strip())
        if heading:
            sections.append(Section(int(heading[1]), heading[2]))
        elif lines[index].startswith("```"):
            start = index + 1
            end = next((j for j in range(start, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise UsageError(f"{path}:{index + 1}: a fenced block that never closes")
            current = sections[-1] if sections else None
            blocks.append((current, lines[index][3:].strip(), "\n".join(lines[start:end]), start + 1, end + 1))
            index = end
        index += 1
    end_paragraph()
    for position, (section, info, body, line, _) in enumerate(blocks):
        tagged = re.fullmatch(r"python (\w+)( fresh)?", info)
        if not tagged:
            continue
        following = blocks[position + 1] if position + 1 < len(blocks) else None
        if (
            tagged[1] not in frameworks()
            or section is None
            or following is None
            or following[1] != "text"
            or following[0] is not section
        ):
            tags = " or ".join(f"'python {name}'" for name in frameworks())
            raise UsageError(
                f"{path}:{line}: a sample must be tagged {tags}, sit in a numbered section, and be followed "
                "at once by a 'text' block of what it prints"
            )
        sample = Sample(tagged[1], body, following[2], line, following[4], fresh=bool(tagged[2]))
        section.samples.append(sample)
        placed.setdefault(section.number, []).append((line, sample))
    for section in sections:  # the samples in their place among the paragraphs
        section.parts = [part for _, part in sorted(placed.get(section.number, []), key=lambda entry: entry[0])]
    return sections


def python_for(framework: str) -> str:
    """The Python whose environment has ``framework``: this one, or the one the project installs it in
    (``bert_multi.backend.remote``)."""
    return load_backend(framework).elsewhere or sys.executable


def run(samples: list[Sample], timeout: float = 300) -> list[Outcome]:
    """Run samples of one framework in a fresh Python of the environment that has it, each in its own
    namespace (a ``fresh`` one in a Python of its own); what each printed, in order."""
    if not samples:
        return []
    if any(sample.fresh for sample in samples) and len(samples) > 1:
        shared = run([sample for sample in samples if not sample.fresh], timeout)
        alone = {sample.line: run([sample], timeout)[0] for sample in samples if sample.fresh}
        by_line = {outcome.sample.line: outcome for outcome in shared} | alone
        return [by_line[sample.line] for sample in samples]
    child = subprocess.run(
        [python_for(samples[0].framework), "-c", _CHILD],
        input=json.dumps([sample.code for sample in samples]),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if child.returncode != 0 or not child.stdout.strip():
        raise RuntimeError(f"the samples' Python failed (exit {child.returncode}): {child.stderr[-2000:]}")
    printed = json.loads(child.stdout.strip().splitlines()[-1])
    return [Outcome(sample, text) for sample, text in zip(samples, printed)]


def run_every(
    sections: list[Section], told: Callable[[str], None] = lambda line: None, only: Sequence[str] | None = None
) -> dict[str, list[Outcome] | str]:
    """Every sample of ``sections`` (of the frameworks ``only``, default all) run, one child per
    framework, the frameworks side by side (each child computes on its own, so the whole costs the
    slowest framework, not the sum); a line to ``told`` as each framework finishes. Framework -> its
    outcomes, or why it cannot run here."""
    status = backends()
    wanted = dict.fromkeys(
        s.framework for section in sections for s in section.samples if only is None or s.framework in only
    )
    results: dict[str, list[Outcome] | str] = {
        framework: f"not run here: {status[framework].reason}"
        for framework in wanted
        if not status[framework].available
    }
    runnable = [framework for framework in wanted if framework not in results]

    def one(framework: str) -> tuple[str, list[Outcome], float]:
        started = time.perf_counter()
        samples = [sample for section in sections for sample in section.samples if sample.framework == framework]
        return framework, run(samples), time.perf_counter() - started

    with concurrent.futures.ThreadPoolExecutor(max(len(runnable), 1)) as pool:
        running = [pool.submit(one, framework) for framework in runnable]
        for finished in concurrent.futures.as_completed(running):
            framework, outcomes, seconds = finished.result()
            told(f"ran the {len(outcomes)} {label_of(framework)} samples ({seconds:.1f} s)")
            results[framework] = outcomes
    return results


def check(
    sections: list[Section], only: Sequence[str] | None = None, told: Callable[[str], None] = lambda line: None
) -> list[Outcome]:
    """Every sample of the frameworks ``only`` (default: every framework backend) in ``sections`` run
    (``run_every``); all outcomes, a ``BackendUnavailable`` for a framework that cannot run here."""
    outcomes = []
    for framework, ran in run_every(sections, told, only).items():
        if isinstance(ran, str):
            raise BackendUnavailable(f"the {framework} samples cannot run here: {ran}")
        outcomes += ran
    return outcomes
