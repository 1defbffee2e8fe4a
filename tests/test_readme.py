"""The README and the docs stay true: the README's Python example runs as written, the backends page shows
what the command prints, and every link between pages leads somewhere in the repository."""

import re
from pathlib import Path

import pytest

from bert_multi import backends

README = Path(__file__).parent.parent / "README.md"


@pytest.mark.skipif(not backends()["torch"].available, reason="the examples use the torch backend")
@pytest.mark.parametrize("page", [README, README.parent / "docs" / "python-api.md"], ids=lambda page: page.name)
def test_the_python_example_runs_as_written(page, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks, f"{page.name} has no Python example"
    monkeypatch.chdir(tmp_path)  # an example may write bert.npz
    namespace: dict = {}
    exec(compile(blocks[0], page.name, "exec"), namespace)
    assert namespace["report"].passed
    assert namespace["out"].mlm.shape == (1, 2, 10000)


VERIFY_PAGE = README.parent / "docs" / "verify.md"


@pytest.mark.skipif(not backends()["torch"].available, reason="the example verifies a PyTorch model")
def test_the_verify_pages_examples_run_as_written(capsys):
    masking, verifying = re.findall(r"```python\n(.*?)```", VERIFY_PAGE.read_text(), flags=re.S)
    namespace: dict = {}
    exec(compile(masking, VERIFY_PAGE.name, "exec"), namespace)
    assert namespace["report"].passed and "follows BERT's rule" in capsys.readouterr().out
    exec(compile(verifying, VERIFY_PAGE.name, "exec"), namespace)
    assert namespace["report"].passed and capsys.readouterr().out.startswith("PASS: build computes")


BACKENDS_PAGE = Path(__file__).parent.parent / "docs" / "backends.md"


def test_the_backends_page_shows_what_the_backends_command_prints(capsys):
    from bert_multi.cli import main

    if not all(status.available for status in backends().values()):
        pytest.skip("the page shows a machine where every built-in backend can run")
    assert main(["backends"]) == 0
    printed = capsys.readouterr().out.strip()
    shown = re.search(r"```\n(backend .*?)```", BACKENDS_PAGE.read_text(), flags=re.S)
    assert shown and shown[1].strip() == printed


PAGES = [README, *sorted((README.parent / "docs").glob("*.md"))]


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.once  # the pages read as text
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_between_pages_leads_somewhere_in_the_repository(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"https?://", target):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or README.parent.resolve() not in file.parents:
            broken.append(f"{target}: no such file in the repository")
        elif fragment and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if fragment not in {anchor(heading) for heading in headings}:
                broken.append(f"{target}: no heading #{fragment}")
    assert not broken, "\n".join(broken)


def _prose(text):
    """A page's text outside code blocks, code spans and link targets."""
    text = re.sub(r"^(`{3,}).*?^\1\s*$", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


@pytest.mark.once
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_a_page_that_names_another_links_to_it(page):
    """A reference to another page is a link (the link test above then checks it), never plain text a
    reader of the site cannot follow."""
    text = _prose(page.read_text())
    plain = [m.group() for m in re.finditer(r"[\w./-]*\b[\w-]+\.md\b", text) if text[m.start() - 1 : m.start()] != "["]
    assert not plain, f"{page.name} names {plain} in plain text; make each a link"
