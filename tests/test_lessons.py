"""The framework-differences guide is true in the installed frameworks: every sample runs and prints
what the guide says it prints (``bert_multi.tools.lessons``), and the runner catches a guide that lies."""

import re

import pytest

from bert_multi import backends, frameworks
from bert_multi.backend.registry import label_of, not_in_process
from bert_multi.cli import main
from bert_multi.tools import lessons

SECTIONS = lessons.read_guide()


# The sections JAX has of its own, where PyTorch is the framework it is set against.
JAX_SECTIONS = range(21, 28)


def test_every_section_sets_pytorch_beside_another_framework():
    """Sections 1 to 20 show PyTorch and MXNet (and JAX where it differs); JAX's own show PyTorch and JAX."""
    assert [section.number for section in SECTIONS] == list(range(1, len(SECTIONS) + 1))
    assert [section.number for section in SECTIONS if section.number in JAX_SECTIONS] == list(JAX_SECTIONS)
    for section in SECTIONS:
        shown = sorted(sample.framework for sample in section.samples)
        expected = (
            [["jax", "torch"]] if section.number in JAX_SECTIONS else [["mxnet", "torch"], ["jax", "mxnet", "torch"]]
        )
        assert shown in expected, (section.title, shown)
    assert sum(1 for s in SECTIONS for sample in s.samples if sample.framework == "jax") >= 20


@pytest.mark.parametrize("framework", frameworks())
def test_every_sample_prints_what_the_guide_says(framework, tmp_path, monkeypatch):
    if not_in_process(framework):  # the samples run in this process
        pytest.skip(not_in_process(framework))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the samples' children make their temporary files
    outcomes = lessons.check(SECTIONS, (framework,))
    if not outcomes:
        pytest.skip(f"the guide has no {framework} samples yet")
    wrong = [o for o in outcomes if not o.as_written]
    assert not wrong, "\n".join(
        f"guide line {o.sample.line}: printed\n{o.printed}\nwhere the guide says\n{o.sample.expected}" for o in wrong
    )
    # A reader who runs a sample is left nothing to clean up (Inductor's cache is PyTorch's own, kept on purpose).
    left = sorted(path.name for path in tmp_path.iterdir() if not path.name.startswith("torchinductor_"))
    assert not left, f"the {framework} samples left {left} in the temporary directory"


def test_a_false_claim_in_the_guide_fails(tmp_path):
    guide = tmp_path / "guide.md"
    text = lessons.GUIDE.read_text()
    # Claim that PyTorch's repeat interleaves, as NumPy's does: it tiles.
    guide.write_text(text.replace("[3, 5, 3, 5]\n[3, 3, 5, 5]", "[3, 3, 5, 5]\n[3, 3, 5, 5]", 1))
    section = next(s for s in lessons.read_guide(guide) if s.title.startswith("`repeat`"))
    outcomes = lessons.check([section], ("torch",)) if backends()["torch"].available else []
    if not outcomes:
        pytest.skip(backends()["torch"].reason)
    assert [o.as_written for o in outcomes] == [False]


def test_a_sample_without_its_output_is_refused(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text("## 1. A claim\n\n```python torch\nprint(1)\n```\n\nNo output block.\n")
    with pytest.raises(ValueError, match="followed at once by a 'text' block"):
        lessons.read_guide(guide)


def test_a_sample_that_raises_is_reported_not_crashed():
    sample = lessons.Sample("torch", "raise KeyError('no such layer')", "", 1, 5)
    (outcome,) = lessons.run([sample])
    assert outcome.printed.strip() == "the sample raised KeyError: 'no such layer'" and not outcome.as_written


def test_a_sample_runs_once_per_environment_and_then_what_it_printed_is_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_MULTI_CACHE_DIR", str(tmp_path / "cache"))
    samples = [
        lessons.Sample("torch", "print(6 * 7)", "42", 1, 3),
        lessons.Sample("torch", "print('b' * 2)", "bb", 5, 7),
    ]
    section = lessons.Section(1, "Two samples", samples)
    ran: list[str] = []
    real_run = lessons.run

    def counted(samples, timeout=300):
        ran.extend(sample.code for sample in samples)
        return real_run(samples, timeout)

    monkeypatch.setattr(lessons, "run", counted)

    def shown(**asked):
        (outcomes,) = lessons.run_every([section], keep=True, **asked).values()
        return [(outcome.printed, outcome.kept) for outcome in outcomes]

    assert shown() == [("42\n", False), ("bb\n", False)] and len(ran) == 2
    # Run again: nothing runs, not even the check of which frameworks can run here.
    real_backends = lessons.backends
    monkeypatch.setattr(lessons, "backends", lambda: pytest.fail("asked which backends run, with nothing to run"))
    said: list[str] = []
    assert shown(told=said.append) == [("42\n", True), ("bb\n", True)] and len(ran) == 2
    assert said == ["the 2 PyTorch samples ran here before: shown as they printed then"]
    monkeypatch.setattr(lessons, "backends", real_backends)
    # A damaged entry is said, ignored and its sample run again; the other stays kept.
    (entry, _) = sorted((tmp_path / "cache" / "lessons").glob("*.sealed"))
    entry.write_bytes(entry.read_bytes()[:-1] + b"!")
    again = shown()
    assert sorted(again) == [("42\n", False), ("bb\n", True)] or sorted(again) == [("42\n", True), ("bb\n", False)]
    assert len(ran) == 3 and "lessons' cache: ignored the entry" in capsys.readouterr().err
    # Another environment (another version of a package) runs them again; so does the cache turned off.
    monkeypatch.setattr(lessons, "environment_of", lambda python: "another environment")
    assert shown() == [("42\n", False), ("bb\n", False)] and len(ran) == 5
    monkeypatch.setenv("BERT_MULTI_CACHE_DIR", "none")
    assert shown() == [("42\n", False), ("bb\n", False)] and len(ran) == 7
    assert lessons.run_every([section]) and len(ran) == 9  # without keep, as the tests and the site run them


def test_the_lessons_command_lists_and_runs_a_section(capsys):
    assert main(["lessons"]) == 0
    listing = capsys.readouterr().out
    assert " 5. repeat means opposite things" in listing and "21. Random numbers" in listing
    available = [f for f in frameworks() if backends()[f].available]
    assert main(["lessons", "5"]) == 0
    shown = capsys.readouterr().out
    assert "valid_lens.repeat(2)" in shown and ("[3, 5, 3, 5]" in shown) == ("torch" in available)
    prose = " ".join(shown.split())  # wrapped to the terminal's width, whatever it is
    assert "Multi-head attention needs each sample's valid length" in prose  # the prose, not only the code
    assert "guide says" not in shown and "as written" not in shown  # words for the test suite, not people
    assert main(["lessons", "99"]) == 2


def test_several_sections_by_number_links_as_their_text_and_code_whole_off_a_terminal(capsys, monkeypatch):
    from bert_multi.cli import lessons as command

    monkeypatch.setattr(command, "run_samples", lambda sections: {})  # what is shown, not what runs
    assert main(["lessons", "3", "5"]) == 0
    shown = capsys.readouterr().out
    assert shown.index("3. A switch for the whole process") < shown.index("5. repeat means opposite things")
    assert "64-bit mode (section 25)" in " ".join(shown.split()) and "](#" not in shown  # a link, as its text
    section = next(
        section for section in SECTIONS if any(len(line) > 40 for s in section.samples for line in s.code.splitlines())
    )
    code = [line for sample in section.samples for line in sample.code.splitlines()]
    pasted = command.render(section, {}, 40, cut=False)  # a log, a file, a pipe: code is copied from there
    assert all(line in pasted.splitlines() for line in code)
    assert main(["lessons", "5", "99"]) == 2


def test_notebooks_to_a_directory_that_cannot_be_made_are_refused_before_any_sample_runs(capsys, monkeypatch):
    from bert_multi.cli import lessons as command

    monkeypatch.setattr(command.lessons, "check", lambda *_, **__: pytest.fail("the samples ran first"))
    assert main(["lessons", "--notebooks", "/proc/no-such-place", "5"]) == 2
    assert "--notebooks /proc/no-such-place: cannot make that directory" in capsys.readouterr().err


def test_a_section_is_found_by_a_word_of_its_title_and_several_matches_are_listed(capsys, monkeypatch):
    from bert_multi.cli import lessons as command

    monkeypatch.setattr(command, "run_samples", lambda sections: {})  # what is chosen, not what runs
    assert main(["lessons", "repeat"]) == 0
    assert capsys.readouterr().out.startswith("5. repeat means opposite things\n")
    assert main(["lessons", "optimizer"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("2 sections have 'optimizer' in their titles; name one by its number:\n")
    assert "\n  12. The optimizer step" in listed and "\n  26. The optimizer state is a value" in listed
    assert main(["lessons", "the", "module"]) == 0 and "22. Parameters live outside" in capsys.readouterr().out
    # Then a framework's own sections, then the sections' text; nothing found is exit 1, as in every command.
    assert main(["lessons", "jax"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("7 sections have 'jax' as their framework's own")
    assert [int(n) for n in re.findall(r"^ +(\d+)\. ", listed, flags=re.M)] == list(JAX_SECTIONS)
    assert main(["lessons", "DLPack"]) == 0 and "20. Lending memory to NumPy" in capsys.readouterr().out
    assert main(["lessons", "no-such-thing"]) == 1
    assert "bert-multi: nothing found: no section has 'no-such-thing'" in capsys.readouterr().err
    assert main(["lessons", "--all"]) == 0
    titles = [re.match(r"(\d+)\. ", line) for line in capsys.readouterr().out.splitlines()]
    assert [int(title[1]) for title in titles if title] == [section.number for section in SECTIONS]


@pytest.mark.parametrize("columns", [60, 101, 102, 220])
def test_a_section_fits_the_terminal_side_by_side_where_it_can(capsys, monkeypatch, columns):
    from bert_multi.cli import lessons as command

    section = next(s for s in SECTIONS if s.number == 5)
    printed = {sample.line: sample.expected for sample in section.samples}
    text = command.render(section, printed, columns)
    assert max(len(line) for line in text.splitlines()) <= columns
    side_by_side = any(line.count("prints:") == 2 for line in text.splitlines())
    assert side_by_side == (columns >= 102)  # the two samples need 102 columns side by side
    assert all(line in text for sample in section.samples for line in sample.expected.splitlines())


def test_a_sample_must_print_exactly_what_the_guide_shows():
    """Whitespace, alignment and line breaks are part of what a sample prints (issue 26)."""
    sample = lessons.Sample("torch", "", "x  y\n[1, 2]", 1, 6)
    assert lessons.Outcome(sample, "x  y\n[1, 2]\n").as_written  # only the end's newline is not compared
    for printed in ("x y\n[1, 2]", "x  y\n[1,2]", "x  y [1, 2]", "x  y\n\n[1, 2]", " x  y\n[1, 2]"):
        assert not lessons.Outcome(sample, printed).as_written, printed


def test_a_samples_output_is_the_block_right_after_it_not_a_later_one(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text(
        "## 1. A claim\n\n```python torch\nprint(1)\n```\n\n```python mxnet\nprint(1)\n```\n\n```text\n1\n```\n"
    )
    with pytest.raises(ValueError, match=r"guide.md:4: .*followed at once by a 'text' block"):
        lessons.read_guide(guide)


def test_notebooks_hold_the_prose_and_each_samples_output_and_a_fresh_sample_has_its_own(tmp_path):
    import nbformat

    from bert_multi.tools import notebooks

    chosen = [section for section in SECTIONS if section.number in (3, 5)]
    written = notebooks.write_notebooks(
        chosen, tmp_path, lambda samples: [lessons.Outcome(s, s.expected) for s in samples]
    )
    names = [path.name for path in written]
    # section 3's samples each change the process, so each has a notebook of its own; section 5's share one
    assert names == [
        "03-a-switch-for-the-whole-process-torch-fresh-1.ipynb",
        "03-a-switch-for-the-whole-process-mxnet-fresh-1.ipynb",
        "03-a-switch-for-the-whole-process-jax-fresh-1.ipynb",
        "05-repeat-means-opposite-things-torch.ipynb",
        "05-repeat-means-opposite-things-mxnet.ipynb",
        "05-repeat-means-opposite-things-jax.ipynb",
    ]
    notebook = nbformat.read(str(tmp_path / names[-1]), as_version=4)
    nbformat.validate(notebook)
    kinds = [cell.cell_type for cell in notebook.cells]
    # title, the two paragraphs, JAX's sample, and PyTorch's and MXNet's for the same step
    assert kinds == ["markdown", "markdown", "markdown", "code", "markdown"]
    assert "Multi-head attention needs each sample's valid length" in notebook.cells[1].source
    (code,) = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert "jnp.repeat" in code.source and code.outputs[0].text == "[3, 3, 5, 5]\n[3, 5, 3, 5]"
    # The comparison is kept: after the code, the other frameworks' code for the step and what it printed.
    compared = notebook.cells[notebook.cells.index(code) + 1]
    torch_sample = next(sample for sample in chosen[1].samples if sample.framework == "torch")
    assert compared.cell_type == "markdown" and "In PyTorch:" in compared.source
    assert torch_sample.code.rstrip() in compared.source and torch_sample.expected.rstrip() in compared.source
    index = nbformat.read(str(tmp_path / "index.ipynb"), as_version=4).cells[0].source
    assert all(f"]({name})" in index for name in names)  # every notebook, linked from the index


def test_a_paragraph_leading_into_one_frameworks_sample_is_in_that_frameworks_notebook_only(tmp_path):
    """Section 11's note on JAX comes after PyTorch's and MXNet's samples, right before JAX's: it is in
    the JAX notebook, before its code, and in neither of the others."""
    import nbformat

    from bert_multi.tools import notebooks

    section = next(section for section in SECTIONS if section.number == 11)
    (index, led), *_ = section.leads().items()
    assert led.framework == "jax"
    lead = " ".join(str(section.parts[index]).split()[:6])
    notebooks.write_notebooks([section], tmp_path, lambda samples: [lessons.Outcome(s, s.expected) for s in samples])
    for path in sorted(set(tmp_path.glob("*.ipynb")) - {tmp_path / notebooks.INDEX}):
        cells = nbformat.read(str(path), as_version=4).cells
        text = [" ".join(cell.source.split()) for cell in cells]
        if path.stem.endswith("-jax"):
            at = next(number for number, words in enumerate(text) if lead in words)
            assert cells[at + 1].cell_type == "code", path.name
        else:
            assert not any(lead in words for words in text), path.name
            # it ends with its own sample, then the other frameworks' code for that step (JAX's among them)
            assert cells[-2].cell_type == "code" and cells[-1].source.startswith("In "), path.name
            assert "In JAX/Flax:" in cells[-1].source, path.name


def test_the_lessons_command_writes_executed_notebooks(tmp_path, capsys, monkeypatch):
    import nbformat

    from bert_multi.tools import notebooks

    monkeypatch.setenv("BERT_MULTI_CACHE_DIR", str(tmp_path / "cache"))  # nothing kept: every sample runs
    assert main(["lessons", "2", "--notebooks", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert f"notebooks written to {tmp_path}" in captured.out
    # Progress, a line as each framework's samples finish: the samples of section 2, one of each framework.
    ran = sorted(re.findall(r"^lessons: ran the 1 (.+) samples \(\d+\.\d s\)$", captured.err, flags=re.M))
    assert ran == sorted(label_of(s.framework) for s in SECTIONS[1].samples), captured.err
    written = sorted(set(tmp_path.glob("*.ipynb")) - {tmp_path / notebooks.INDEX})
    for path in written:
        notebook = nbformat.read(str(path), as_version=4)
        nbformat.validate(notebook)
        framework = path.stem.rsplit("-", 1)[1]
        sample = next(s for s in SECTIONS[1].samples if s.framework == framework)
        (code,) = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code.outputs[0].text.rstrip() == sample.expected.rstrip(), path.name  # what it printed when run
    assert len(written) == len(SECTIONS[1].samples) and (tmp_path / notebooks.INDEX).is_file()
