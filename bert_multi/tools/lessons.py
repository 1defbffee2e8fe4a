"""The framework-differences guide (``docs/framework-differences.md``), executable.

Each ``## `` section of the guide holds samples: a fenced block tagged ``python NAME``, NAME a framework
backend (``python torch``), followed at once by a ``text`` block with exactly what it prints. ``run``
executes the samples of one framework in a child process, each in a namespace of its own; a sample that
changes the process itself (``npx.set_np()``, ``torch.set_default_dtype``) is tagged ``fresh`` and gets a
process of its own. ``check`` compares what they print with what the guide says they print.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..backend.registry import backends, frameworks, interpreter_of, label_of
from ..cache import SealedEntries, cache_for
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
    kept: bool = False  # shown as it printed when run before in this environment (``run_kept``), not run now

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
    """The Python whose environment has ``framework``, known without loading it (``interpreter_of``): this
    one, or the one the project installs it in."""
    return interpreter_of(framework) or sys.executable


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


# Prints what the environment holds, to the version: what a sample prints there depends on nothing else.
_ENVIRONMENT = """
import importlib.metadata, sys
print(sys.version)
print(sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()))
"""
MAX_KEPT_BYTES = 16 << 20  # every sample's output, kept; the guide's come to a few kilobytes


def environment_of(python: str) -> str:
    """The digest of ``python`` and of every package its environment holds."""
    listed = subprocess.run([python, "-c", _ENVIRONMENT], capture_output=True, text=True, timeout=120, check=True)
    return hashlib.sha256(f"{python}\n{listed.stdout}".encode()).hexdigest()


class KeptOutputs:
    """What the guide's samples printed, kept in the user's cache (``bert_multi.cache``) by each sample's
    code and the environment that ran it, so that a sample runs once per environment. A damaged entry is
    ignored (said once) and its sample run again; with the cache off, nothing is kept."""

    def __init__(self) -> None:
        directory = cache_for("lessons")
        entries = (
            None if directory is None else SealedEntries(directory, MAX_KEPT_BYTES, "lessons' cache", "running it")
        )
        self.entries = entries if entries is not None and entries.usable else None
        self._environments: dict[str, str | None] = {}

    def get(self, samples: list[Sample]) -> dict[int, str]:
        """What those of ``samples`` that ran before printed, by line."""
        found: dict[int, str] = {}
        for sample in samples:
            key = self._key(sample)
            value = None if key is None or self.entries is None else self.entries.get(key)
            with contextlib.suppress(UnicodeDecodeError):  # not text: no sample's output, so it runs again
                found.update({} if value is None else {sample.line: value.decode()})
        return found

    def put(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            key = self._key(outcome.sample)
            if key is not None and self.entries is not None:
                self.entries.put(key, outcome.printed.encode())

    def _key(self, sample: Sample) -> str | None:
        if sample.framework not in self._environments:
            self._environments[sample.framework] = None
            # An environment that cannot say what it holds keeps nothing: its samples run, as without a cache.
            with contextlib.suppress(BackendUnavailable, OSError, subprocess.SubprocessError):
                if self.entries is not None:
                    self._environments[sample.framework] = environment_of(python_for(sample.framework))
        environment = self._environments[sample.framework]
        if environment is None:
            return None
        digest = hashlib.sha256(f"{environment}\0{sample.fresh}\0{sample.code}".encode()).hexdigest()
        return f"{sample.framework}-{digest}"


def run_every(
    sections: list[Section],
    told: Callable[[str], None] = lambda line: None,
    only: Sequence[str] | None = None,
    keep: bool = False,
) -> dict[str, list[Outcome] | str]:
    """Every sample of ``sections`` (of the frameworks ``only``, default all) run, one child per
    framework, the frameworks side by side (each child computes on its own, so the whole costs the
    slowest framework, not the sum); a line to ``told`` as each framework finishes. With ``keep``, a
    sample that ran before in the same environment is not run again: what it printed then is kept
    (``KeptOutputs``; its outcome says so). Framework -> its outcomes, or why it cannot run here."""
    samples_of: dict[str, list[Sample]] = {}
    for sample in (sample for section in sections for sample in section.samples):
        if only is None or sample.framework in only:
            samples_of.setdefault(sample.framework, []).append(sample)
    kept = KeptOutputs() if keep else None
    found: dict[str, dict[int, str]] = {framework: {} for framework in samples_of}
    if kept is not None:
        with concurrent.futures.ThreadPoolExecutor(max(len(samples_of), 1)) as pool:  # each asks its environment
            found = dict(zip(samples_of, pool.map(kept.get, samples_of.values())))
    results: dict[str, list[Outcome] | str] = {
        framework: [Outcome(sample, found[framework][sample.line], kept=True) for sample in samples]
        for framework, samples in samples_of.items()
        if len(found[framework]) == len(samples)
    }
    for framework, outcomes in results.items():
        told(f"the {len(outcomes)} {label_of(framework)} samples ran here before: shown as they printed then")
    if len(results) < len(samples_of):  # the frameworks that must run something: can they run here?
        status = backends()
        results |= {
            framework: f"not run here: {status[framework].reason}"
            for framework in samples_of
            if framework not in results and not status[framework].available
        }
    runnable = [framework for framework in samples_of if framework not in results]

    def one(framework: str) -> tuple[str, list[Outcome], float]:
        started = time.perf_counter()
        ran = run([sample for sample in samples_of[framework] if sample.line not in found[framework]])
        if kept is not None:
            kept.put(ran)
        by_line = {outcome.sample.line: outcome for outcome in ran}
        outcomes = [by_line.get(sample.line) or Outcome(sample, found[framework][sample.line], kept=True)
                    for sample in samples_of[framework]]  # fmt: skip
        return framework, outcomes, time.perf_counter() - started

    with concurrent.futures.ThreadPoolExecutor(max(len(runnable), 1)) as pool:
        running = [pool.submit(one, framework) for framework in runnable]
        for finished in concurrent.futures.as_completed(running):
            framework, outcomes, seconds = finished.result()
            again = sum(outcome.kept for outcome in outcomes)
            shown = f", {again} of them shown as they printed before" if again else ""
            told(f"ran the {len(outcomes)} {label_of(framework)} samples{shown} ({seconds:.1f} s)")
            results[framework] = outcomes
    return results


def check(
    sections: list[Section],
    only: Sequence[str] | None = None,
    told: Callable[[str], None] = lambda line: None,
    keep: bool = False,
) -> list[Outcome]:
    """Every sample of the frameworks ``only`` (default: every framework backend) in ``sections`` run
    (``run_every``, ``keep`` as there); all outcomes, a ``BackendUnavailable`` for a framework that
    cannot run here."""
    outcomes = []
    for framework, ran in run_every(sections, told, only, keep).items():
        if isinstance(ran, str):
            raise BackendUnavailable(f"the {framework} samples cannot run here: {ran}")
        outcomes += ran
    return outcomes
