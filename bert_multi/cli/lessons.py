"""``bert-multi lessons``: how the frameworks differ, at a terminal: a section of the guide, its prose and
each framework's samples run here, side by side where the terminal is wide enough."""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import sys
import textwrap
from pathlib import Path

from ..backend.registry import label_of
from ..display import ProgressBar
from ..errors import UsageError
from ..tools import lessons, notebooks
from .common import NOTHING_FOUND, check_output

GAP = 4  # spaces between side-by-side samples
PROSE = 100  # the widest a paragraph is wrapped, however wide the terminal


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "lessons",
        help="how the frameworks differ: the guide's sections, each run in every framework",
        description="The framework-differences guide (docs/framework-differences.md) at a terminal: a "
        "section's prose with each framework's samples run here, side by side where the terminal is wide "
        "enough.",
    )
    parser.add_argument(
        "section", nargs="*", help="a section's number, or words of its title (default: list the sections)"
    )
    parser.add_argument("--all", action="store_true", help="every section, in order")
    parser.add_argument(
        "--notebooks",
        metavar="DIR",
        help="write Jupyter notebooks of the sections asked for (default every one) to DIR instead: per section "
        "and framework, the prose and the samples with what they printed",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """List the guide's sections, or show the ones asked for with their samples run."""
    sections = lessons.read_guide()
    chosen = sections
    if args.notebooks:  # made before minutes of samples, not after them
        check_output(args.notebooks, "--notebooks", directory=True)
        try:
            Path(args.notebooks).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--notebooks {args.notebooks}: cannot make that directory ({error.strerror})") from None
    if args.section and not args.all and all(word.isdigit() for word in args.section):
        numbers = [int(word) for word in args.section]  # sections by number, in the order asked
        unknown = [number for number in numbers if not 1 <= number <= len(sections)]
        if unknown:
            raise UsageError(f"no section {unknown[0]}: the guide has sections 1 to {len(sections)}")
        chosen = [sections[number - 1] for number in numbers]
    elif args.section and not args.all:
        asked = " ".join(args.section)
        chosen, where = lessons.search(sections, asked)
        if where == "number" and not chosen:
            raise UsageError(f"no section {asked}: the guide has sections 1 to {len(sections)}")
        if not chosen:
            print(f"bert-multi: nothing found: no section has {asked!r} in its title or its text, nor is any "
                  "that framework's own", file=sys.stderr)  # fmt: skip
            return NOTHING_FOUND
        if len(chosen) > 1 and not args.notebooks:
            places = {"title": "in their titles", "framework": "as their framework's own", "text": "in their text"}
            print(f"{len(chosen)} sections have {asked!r} {places[where]}; name one by its number:")
            print("\n".join(f"  {section.number:>2}. {section.title.replace('`', '')}" for section in chosen))
            return 0
    if args.notebooks:
        return write_all(chosen, args.notebooks)
    if not args.all and not args.section:
        for listed in sections:
            print(f"{listed.number:>2}. {listed.title.replace('`', '')}")
        print("\nbert-multi lessons N (or a word of a title) shows a section, --all every one; the guide is")
        print(f"{lessons.GUIDE}")
        return 0
    printed = run_samples(chosen)
    width = shutil.get_terminal_size((100, 24)).columns
    for index, section in enumerate(chosen):
        if index:
            print()
        print(render(section, printed, width, cut=sys.stdout.isatty()))
    return 0


def _told(line: str) -> None:
    """A line of progress, on standard error (``ProgressBar.note``): what a long run has done so far."""
    ProgressBar().note(f"lessons: {line}")


def write_all(sections: list[lessons.Section], directory: str) -> int:
    """The notebooks of ``sections`` in ``directory``: every sample run first (one child per framework,
    side by side), then a notebook at a time from what they printed, each said as it is written."""
    outcomes = {outcome.sample.line: outcome for outcome in lessons.check(sections, told=_told, keep=True)}
    written = notebooks.write_notebooks(sections, directory, lambda samples: [outcomes[s.line] for s in samples])
    print(f"{len(written)} notebooks written to {directory}; {notebooks.INDEX} lists them")
    return 0


def run_samples(sections: list[lessons.Section]) -> dict[int, str]:
    """What each sample of ``sections`` printed here, by its line in the guide; for a framework that cannot
    run here, why not. Every framework's samples run at once, side by side, but for those that ran before
    in the same environment: what they printed then is kept (said on standard error)."""
    printed: dict[int, str] = {}
    told = _told if len(sections) > 1 else lambda line: None
    kept = 0
    for framework, ran in lessons.run_every(sections, told, keep=True).items():
        if isinstance(ran, str):
            samples = [sample for section in sections for sample in section.samples if sample.framework == framework]
            printed.update({sample.line: f"({ran})" for sample in samples})
            continue
        kept += sum(outcome.kept for outcome in ran)
        for outcome in ran:
            shown = outcome.printed.rstrip()
            if not outcome.as_written:  # another version of the framework than the guide's
                shown += "\n(the guide shows otherwise:\n" + outcome.sample.expected.rstrip() + ")"
            printed[outcome.sample.line] = shown
    if kept:
        print(f"lessons: {kept} of the {len(printed)} outputs are what those samples printed when they last ran in "
              "this environment (--no-cache runs them again)", file=sys.stderr)  # fmt: skip
    return printed


def render(section: lessons.Section, printed: dict[int, str], width: int, cut: bool = True) -> str:
    """The section for a terminal ``width`` columns wide: paragraphs wrapped to it (a link shown as its
    text), each run of samples side by side if they fit, else one after another, their long lines cut
    only where ``cut`` (a terminal: elsewhere code is copied, and must stay whole)."""
    title = f"{section.number}. {section.title.replace('`', '')}"
    out = [title, "=" * min(len(title), width)]
    for is_sample, group in itertools.groupby(section.parts, key=lambda part: isinstance(part, lessons.Sample)):
        out.append("")
        if not is_sample:
            text = [re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", str(part)).replace("`", "") for part in group]
            out += ["\n\n".join(textwrap.fill(paragraph, min(width, PROSE)) for paragraph in text)]
        else:
            out += _samples([part for part in group if isinstance(part, lessons.Sample)], printed, width, cut)
    return "\n".join(out)


def _samples(samples: list[lessons.Sample], printed: dict[int, str], width: int, cut: bool = True) -> list[str]:
    """A run of samples, each its label, code and what it printed: in columns whose "prints:" lines
    align, if they fit in ``width``; else one after another, long lines cut."""
    code = [[label_of(s.framework), "-" * len(label_of(s.framework)), *s.code.splitlines()] for s in samples]
    height = max(len(lines) for lines in code)
    columns = [
        [*lines, *[""] * (height - len(lines)), "", "prints:", *printed.get(sample.line, "").splitlines()]
        for sample, lines in zip(samples, code)
    ]
    widths = [max(len(line) for line in column) for column in columns]
    if sum(widths) + GAP * (len(columns) - 1) <= width:
        rows = itertools.zip_longest(*columns, fillvalue="")
        return ["".join(f"{cell:<{w + GAP}}" for cell, w in zip(row, widths)).rstrip() for row in rows]
    out: list[str] = []
    for sample, lines in zip(samples, code):
        if out:
            out.append("")
        for line in [*lines, "", "prints:", *printed.get(sample.line, "").splitlines()]:
            out += _wrap_code(line, width) if cut else [line]
    return out


def _wrap_code(line: str, width: int) -> list[str]:
    """A line of code or output cut to ``width``, its continuations indented."""
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent="    ", drop_whitespace=False, replace_whitespace=False)
