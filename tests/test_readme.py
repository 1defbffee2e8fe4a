"""The README's Python example runs as written."""

import re
from pathlib import Path

import pytest

from bert_multi import backends

README = Path(__file__).parent.parent / "README.md"


@pytest.mark.skipif(not backends()["torch"].available, reason="the example uses the torch backend")
def test_python_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)  # it writes bert.npz
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["report"].passed
    assert namespace["out"].mlm.shape == (1, 2, 10000)


BACKENDS_PAGE = Path(__file__).parent.parent / "docs" / "backends.md"


def test_the_backends_page_shows_what_the_backends_command_prints(capsys):
    from bert_multi.cli import main

    if not all(status.available for status in backends().values()):
        pytest.skip("the page shows a machine where every built-in backend can run")
    assert main(["backends"]) == 0
    printed = capsys.readouterr().out.strip()
    shown = re.search(r"```\n(backend .*?)```", BACKENDS_PAGE.read_text(), flags=re.S)
    assert shown and shown[1].strip() == printed
