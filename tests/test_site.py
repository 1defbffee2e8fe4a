"""The documentation site (``make docs``): the guide's page sets each run of samples out as tabs, one per
framework, with what the samples printed when the site was built (``bert_multi.tools.site``); the built
site holds every page of ``docs/`` and the API reference; and a real headless browser shows the tabs
working and a sample's output painted on the page."""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bert_multi.backend.registry import label_of
from bert_multi.errors import UsageError
from bert_multi.tools import lessons, site

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
SECTIONS = lessons.read_guide()
SAMPLES = [sample for section in SECTIONS for sample in section.samples]
# One site, built once, read the same from every environment.
pytestmark = pytest.mark.once


def as_written(sections):
    """A runner whose samples print exactly what the guide says."""
    return [lessons.Outcome(sample, sample.expected + "\n") for section in sections for sample in section.samples]


def test_each_sample_becomes_a_tab_showing_what_it_printed_when_run():
    outcomes = [lessons.Outcome(sample, f"ran the sample at line {sample.line}\n") for sample in SAMPLES]
    page = site.render_guide(lessons.GUIDE, outcomes)
    assert page.count("{tab-item}") == len(SAMPLES)
    for sample in SAMPLES:
        assert f"ran the sample at line {sample.line}\n" in page
    # Nothing of the guide's own sample blocks is left, and everything else is, in order: the paragraphs
    # that lead into one framework's sample are in that sample's tab.
    assert not re.search(r"^```(python \w+|text)", page, re.MULTILINE)
    guide_prose = [line for line in _outside_samples(lessons.GUIDE.read_text()) if line.strip()]
    page_prose = [line for line in _without_code(page) if line.strip()]
    assert page_prose == [site.stamp(lessons.GUIDE)] + guide_prose


def test_each_sample_run_is_one_tab_set_of_every_framework_that_has_it():
    page = site.render_guide(lessons.GUIDE, as_written(SECTIONS))
    tab_sets = re.findall(r"^`````\{tab-set\}\n(.*?)^`````$", page, re.MULTILINE | re.DOTALL)
    labels = [re.findall(r"^````\{tab-item\} (.+)$", body, re.MULTILINE) for body in tab_sets]
    assert len(tab_sets) == len(SECTIONS) and all(len(set(tabs)) > 1 for tabs in labels)
    # Section 1: PyTorch's and MXNet's samples follow one another, then a paragraph on JAX and JAX's sample:
    # one set of three tabs, the paragraph at the top of JAX's.
    assert labels[0] == [label_of("torch"), label_of("mxnet"), label_of("jax")]
    jax_tab = tab_sets[0].split(f"{{tab-item}} {label_of('jax')}")[1]
    lead = str(SECTIONS[0].parts[next(iter(SECTIONS[0].leads()))])
    words = " ".join(jax_tab.split())
    assert words.index(" ".join(lead.split()[:6])) < words.index("```python")


def test_a_sample_printing_something_else_stops_the_page():
    def one_differs(sections):
        outcomes = as_written(sections)
        outcomes[3] = lessons.Outcome(outcomes[3].sample, "something else\n")
        return outcomes

    with pytest.raises(UsageError, match=rf"(?s)1 of {len(SAMPLES)} samples.*line {SAMPLES[3].line} .*something else"):
        site.guide_page(runner=one_differs)


def test_a_sample_left_unrun_stops_the_page():
    with pytest.raises(UsageError, match=rf"lines \[{SAMPLES[-1].line}\] were not run"):
        site.guide_page(runner=lambda sections: as_written(sections)[:-1])


def _outside_samples(text):
    lines, keep, inside = text.splitlines(), [], None
    for line in lines:
        if inside is None and re.match(r"```(python \w+( fresh)?|text)$", line):
            inside = line
        elif inside is not None and line.startswith("```"):
            inside = None
        elif inside is None:
            keep.append(line)
    return keep


def _without_code(page):
    """The page's lines but its tabs' own: their directives, code and outputs."""
    page = re.sub(r"^```(python|\{code-block\} text)\n.*?^```$", "", page, flags=re.MULTILINE | re.DOTALL)
    return [line for line in page.splitlines() if not re.match(r"^(`{4,5}(\{tab-(set|item)\}.*)?|:sync: \w+)$", line)]


def _outside_tab_sets(page):
    return re.sub(r"^`````\{tab-set\}\n.*?^`````$", "", page, flags=re.MULTILINE | re.DOTALL).splitlines()


# The built site.


@pytest.fixture(scope="module")
def built_site():
    """``site/``, where ``make docs`` builds it; under ``make test`` (which builds it first) its absence is
    a failure, elsewhere a skip."""
    if not (SITE / "framework-differences.html").is_file():
        message = f"{SITE} is not built: make docs"
        if os.environ.get("BERT_MULTI_SITE_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    return SITE


class _Page(HTMLParser):
    """A page's tab labels and the text of its ``pre`` blocks, in order."""

    def __init__(self):
        super().__init__()
        self.labels, self.blocks, self.ids, self.every_id = [], [], set(), []
        self._into = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids.add(attributes["id"])
            self.every_id.append(attributes["id"])
        if tag == "label" and "sd-tab-label" in (attributes.get("class") or ""):
            self._into = self.labels
            self.labels.append("")
        elif tag == "pre":
            self._into = self.blocks
            self.blocks.append("")

    def handle_endtag(self, tag):
        if tag in ("label", "pre"):
            self._into = None

    def handle_data(self, data):
        if self._into is not None:
            self._into[-1] += data


def _read(path):
    page = _Page()
    page.feed(path.read_text())
    return page


def test_the_built_guide_shows_every_sample_in_its_tab_with_its_output(built_site):
    page = _read(built_site / "framework-differences.html")
    assert [label.strip() for label in page.labels] == [label_of(sample.framework) for sample in SAMPLES]
    shown = list(zip(page.blocks[0::2], page.blocks[1::2]))
    assert len(page.blocks) == 2 * len(SAMPLES), "each tab holds its code and its output, nothing else is a block"
    # Each tab's framework is a data-sync-id (the same in every tab set, so that one click changes them all),
    # never an id: no id is repeated on the page.
    assert len(page.every_id) == len(set(page.every_id)), sorted(i for i in page.ids if page.every_id.count(i) > 1)
    for sample, (code, output) in zip(SAMPLES, shown):
        assert code.strip() == sample.code.strip(), f"guide line {sample.line}: the site is older than the guide"
        assert output.strip() == sample.expected.strip(), f"guide line {sample.line}: the site is older than the guide"


def test_the_built_site_has_every_page_of_the_docs_and_the_api_reference(built_site):
    for source in (ROOT / "docs").glob("*.md"):
        assert (built_site / source.with_suffix(".html").name).is_file(), source.name
    reference = _read(built_site / "reference.html")
    import bert_multi

    documented = {name for name in reference.ids if name.startswith("bert_multi.")}
    missing = {f"bert_multi.{name}" for name in bert_multi.__all__ if not name.isupper()} - documented
    assert not missing, f"public names without a reference entry: {sorted(missing)}"
    for framework in ("torch", "mxnet", "jax"):
        assert f"bert_multi.{framework}.BERTModel" in documented
    front = (built_site / "index.html").read_text()
    assert 'id="set-up-and-run"' in front, "the front page is the README"
    assert 'href="framework-differences.html"' in front, "the README's links into docs/ lead to the site's pages"
    footer = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", front[front.index("<footer") :]))
    assert "the bert_multi authors; bert_multi is free software under the MIT licence" in footer, footer[:300]


# A real browser.

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL = "apt install chromium (Debian), or set BERT_MULTI_BROWSER to a Chromium or Chrome binary"

# Run in the page once it has loaded: the first tab set's state before and after its second tab is
# clicked, and where its first output and label lie, as JSON in an attribute of <body>.
PROBE = """
<script>
window.addEventListener("load", () => {
  const set = document.querySelector(".sd-tab-set");
  const labels = [...set.querySelectorAll(":scope > label")];
  const contents = [...set.querySelectorAll(":scope > .sd-tab-content")];
  const rect = (element) => { const r = element.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const state = () => contents.map((content) => {
    const output = content.querySelectorAll("pre")[1];
    return {shown: output.getBoundingClientRect().height > 0, output: output.innerText};
  });
  const before = state();
  const where = {output: rect(contents[0].querySelectorAll("pre")[1]), label: rect(labels[0])};
  labels[1].click();
  const after = state();
  labels[0].click();
  const shown = {labels: labels.map((label) => label.innerText.trim()), before, after, where};
  document.body.setAttribute("data-probe", JSON.stringify(shown));
});
</script>
"""
WIDTH, HEIGHT = 1280, 2400  # room for the guide's introduction above its first samples


# The same page after a click on the side-by-side button: where each framework's label and output lie.
SIDE_BY_SIDE_PROBE = """
<script>
window.addEventListener("load", () => {
  const button = document.querySelector(".side-by-side-toggle");
  const set = document.querySelector(".sd-tab-set");
  const rect = (element) => { const r = element.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const where = () => [...set.querySelectorAll(":scope > .sd-tab-content")].map((content) => ({
    column: rect(content), output: rect(content.querySelectorAll("pre")[1]),
    label: rect(content.previousElementSibling),
  }));
  const shown = {button: button && button.innerText, tabs: where()};
  if (button) { button.click(); shown.pressed = button.innerText; shown.side = where(); }
  document.body.setAttribute("data-probe", JSON.stringify(shown));
});
</script>
"""


def _browser():
    named = os.environ.get("BERT_MULTI_BROWSER")
    if named and not shutil.which(named):
        pytest.fail(f"BERT_MULTI_BROWSER={named} is not a program here")
    return shutil.which(named) if named else next(filter(None, map(shutil.which, BROWSER_NAMES)), None)


def _chromium(browser, profile, *arguments):
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += ["--force-device-scale-factor=1", f"--window-size={WIDTH},{HEIGHT}", f"--user-data-dir={profile}"]
    return subprocess.run(command + list(arguments), capture_output=True, text=True, timeout=120, check=True)


def _probed(built_site, tmp_path, script):
    """The guide's page in a headless browser with ``script`` added: the page file and the JSON the script
    left in ``<body data-probe>``."""
    browser = _browser()
    if browser is None:
        pytest.skip(f"no headless browser here: {INSTALL}")
    guide = (built_site / "framework-differences.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(
        guide.replace("<head>", f'<head><base href="{built_site.as_uri()}/">', 1).replace("</body>", script + "</body>")
    )
    dom = _chromium(browser, tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, "the probe never ran: the page did not load in the browser"
    return probe, json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&"))


def test_a_browser_shows_the_tabs_and_a_samples_output(built_site, tmp_path):
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot (the main environment has it)")
    probe, state = _probed(built_site, tmp_path, PROBE)
    browser = _browser()

    torch_sample, mxnet_sample = SECTIONS[0].samples[:2]
    assert state["labels"] == [label_of("torch"), label_of("mxnet"), label_of("jax")]
    # The first tab shows its output and hides the others'; a click on the second shows it instead.
    assert [tab["shown"] for tab in state["before"]] == [True, False, False]
    assert state["before"][0]["output"].strip() == torch_sample.expected.strip()
    assert [tab["shown"] for tab in state["after"]] == [False, True, False]
    assert state["after"][1]["output"].strip() == mxnet_sample.expected.strip()

    shot = tmp_path / "guide.png"
    _chromium(browser, tmp_path / "profile", f"--screenshot={shot}", probe.as_uri())
    with image.open(shot) as picture:
        assert picture.size == (WIDTH, HEIGHT)
        grey = picture.convert("L")
        for name, (left, top, width, height) in state["where"].items():
            assert top + height <= HEIGHT, f"the {name} lies below the screenshot"
            inked = grey.crop((int(left), int(top), int(left + width), int(top + height))).getextrema()
            assert inked[1] - inked[0] > 100, f"the {name} is not painted (its box is one shade)"


def test_a_button_shows_the_frameworks_side_by_side(built_site, tmp_path):
    _, state = _probed(built_site, tmp_path, SIDE_BY_SIDE_PROBE)
    assert state["button"] == "Show the frameworks side by side", state
    assert state["pressed"] == "Show the frameworks as tabs"
    # As tabs, only the first framework's output takes room; side by side, every one does, in a row of columns
    # (the same top, one after another from the left), each under its own label.
    assert [tab["output"][3] > 0 for tab in state["tabs"]] == [True, False, False]
    side = state["side"]
    assert all(tab["output"][3] > 0 for tab in side) and len(side) == 3
    assert len({tab["label"][1] for tab in side}) == 1 and len({tab["column"][1] for tab in side}) == 1
    lefts = [tab["column"][0] for tab in side]
    assert lefts == sorted(lefts) and len(set(lefts)) == 3
    for tab in side:
        assert abs(tab["label"][0] - tab["output"][0]) < 30, "a label stands over its own column"
        assert tab["output"][2] > 150, "each column is wide enough to read"
