"""Sphinx's settings for the documentation site: ``make docs`` builds ``docs/`` into ``site/``.

The framework-differences guide is read from the page ``python -m bert_multi.tools.site`` writes (its
samples run when the site is built), not from ``docs/framework-differences.md`` itself; the API
reference imports the framework-free core, with the frameworks stood in for by Sphinx's mocks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GUIDE_PAGE = Path(os.environ.get("BERT_MULTI_GUIDE_PAGE", ROOT / "build" / "docs" / "guide.md"))
MAKE_PAGE = f"python -m bert_multi.tools.site {GUIDE_PAGE} (make docs does it)"

project = "bert_multi"
author = "the bert_multi authors"
copyright = "2026, the bert_multi authors; bert_multi is free software under the MIT licence"  # the footer
extensions = ["myst_parser", "sphinx_design", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
myst_heading_anchors = 3
html_theme = "furo"
html_title = "bert_multi"
html_static_path = ["_static"]
html_css_files = ["side-by-side.css"]  # with its script, a button that shows the frameworks side by side
html_js_files = ["side-by-side.js"]
autodoc_mock_imports = ["torch", "mxnet", "jax", "flax", "optax", "transformers", "matplotlib"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"


def _guide_with_outputs(app: Any, docname: str, source: list[str]) -> None:
    from sphinx.errors import ExtensionError

    from bert_multi.tools.site import stamp

    if docname != "framework-differences":
        return
    if not GUIDE_PAGE.is_file():
        raise ExtensionError(f"{GUIDE_PAGE} is missing: the guide's page, its samples run, comes first: {MAKE_PAGE}")
    page = GUIDE_PAGE.read_text()
    if not page.startswith(stamp(Path(app.srcdir) / "framework-differences.md")):
        raise ExtensionError(f"{GUIDE_PAGE} was built from another text of the guide: {MAKE_PAGE}")
    source[0] = page


def setup(app: Any) -> None:
    app.connect("source-read", _guide_with_outputs)
