"""The documentation site's page of the framework-differences guide, made at build time (``make docs``).

The guide's markdown stays as it is written, except that each run of samples (a ``python NAME`` block
and the ``text`` block of what it prints, one after another with only blank lines between them)
becomes a set of tabs, one per framework, as d2l's book shows its frameworks; each tab holds the
sample's code and what it printed when the site was built, run by ``lessons.check`` in the environment
that has its framework. A sample that no longer prints what the guide says stops the build: the page
would otherwise show an output that the prose beside it does not describe.

``python -m bert_multi.tools.site PAGE`` writes the page; ``docs/conf.py`` hands it to Sphinx in place
of ``docs/framework-differences.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..backend.registry import label_of
from ..errors import UsageError
from .lessons import GUIDE, Outcome, Sample, Section, check, read_guide

# Sphinx-design's tab sets, in MyST's fenced syntax: a fence must be longer than every fence it holds.
_TAB_SET = "`````"
_TAB_ITEM = "````"
OUTPUT_CAPTION = "printed when this page was built"


def stamp(guide: Path) -> str:
    """The page's first line: which text of the guide it was built from, so a stale page is refused."""
    return f"<!-- built from {guide.name} sha256:{hashlib.sha256(guide.read_bytes()).hexdigest()} -->"


def _tab(outcome: Outcome, lead: list[str], seen: dict[str, int]) -> list[str]:
    sample = outcome.sample
    seen[sample.framework] = seen.get(sample.framework, 0) + 1
    label = label_of(sample.framework) + (f" ({seen[sample.framework]})" if seen[sample.framework] > 1 else "")
    return [
        f"{_TAB_ITEM}{{tab-item}} {label}",
        f":sync: {sample.framework}",
        "",
        *([*lead, ""] if lead else []),
        "```python",
        sample.code,
        "```",
        "",
        "```{code-block} text",
        f":caption: {OUTPUT_CAPTION}",
        "",
        outcome.printed.rstrip() or "(prints nothing)",
        "```",
        _TAB_ITEM,
    ]


def render_guide(path: Path, outcomes: list[Outcome]) -> str:
    """The guide at ``path`` with each run of samples as one tab set showing ``outcomes``' outputs: the
    samples that follow one another, and a sample that follows them after a paragraph leading into it
    (``Section.leads``: JAX's, after PyTorch's and MXNet's), that paragraph in its tab."""
    lines = path.read_text().splitlines()
    by_start = {outcome.sample.line - 2: outcome for outcome in outcomes}  # keyed by the code fence's index
    # The code fences of the samples a paragraph leads into.
    led = {sample.line - 2 for section in read_guide(path) for sample in section.leads().values()}
    page = [stamp(path)]
    index = 0
    while index < len(lines):
        if index not in by_start:
            page.append(lines[index])
            index += 1
            continue
        run: list[tuple[list[str], Outcome]] = []
        lead: list[str] = []
        while index in by_start:
            run.append((lead, by_start[index]))
            lead, index = [], by_start[index].sample.last  # the line after its output block, counted from 0
            following = index
            while following < len(lines) and not lines[following].strip():
                following += 1
            end = following  # the prose after it, up to the next fence or heading
            while end < len(lines) and not lines[end].startswith(("```", "#")):
                end += 1
            if following in by_start:
                index = following
            elif end in led and end in by_start:
                lead, index = lines[following:end], end
                while lead and not lead[-1].strip():
                    lead.pop()
        seen: dict[str, int] = {}
        tabs = [line for lead_in, outcome in run for line in _tab(outcome, lead_in, seen)]
        page += [f"{_TAB_SET}{{tab-set}}", *tabs, _TAB_SET]
    return "\n".join(page) + "\n"


def guide_page(
    path: str | Path = GUIDE,
    runner: Callable[[list[Section]], list[Outcome]] = check,
) -> str:
    """The guide's page for the site, its samples run by ``runner``; a ``UsageError`` naming every sample
    that printed something other than what the guide says."""
    path = Path(path)
    sections = read_guide(path)
    samples: list[Sample] = [sample for section in sections for sample in section.samples]
    outcomes = runner(sections)
    missing = {sample.line for sample in samples} - {outcome.sample.line for outcome in outcomes}
    if missing:
        raise UsageError(f"{path}: the samples at lines {sorted(missing)} were not run")
    wrong = [outcome for outcome in outcomes if not outcome.as_written]
    if wrong:
        described = "\n".join(
            f"  line {outcome.sample.line} ({label_of(outcome.sample.framework)}): the guide says\n"
            f"{_indented(outcome.sample.expected)}\n  it printed\n{_indented(outcome.printed)}"
            for outcome in wrong
        )
        raise UsageError(
            f"{path}: {len(wrong)} of {len(outcomes)} samples print something other than the guide says, "
            f"so the page would contradict its prose; mend the guide or the sample:\n{described}"
        )
    return render_guide(path, outcomes)


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bert_multi.tools.site",
        description="Write the framework-differences guide's page for the documentation site, every sample "
        "run in its framework's environment.",
    )
    parser.add_argument("page", type=Path, help="the markdown file to write (make docs: build/docs/guide.md)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        page = guide_page()
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    args.page.parent.mkdir(parents=True, exist_ok=True)
    args.page.write_text(page)
    samples = page.count(f":caption: {OUTPUT_CAPTION}")
    print(f"{args.page}: the guide with its {samples} samples' outputs ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
