"""The backend contract as docs/backends.md states it is enough to write a backend: the page's own
example, taken from the page's text, saved outside the package and registered, passes the conformance
engine in both dtypes, and its model reports what the engine reads."""

import importlib.util
import re
from pathlib import Path

import bert_multi as bm
from bert_multi.engine.cases import CASES

PAGE = Path(__file__).resolve().parents[1] / "docs" / "backends.md"


def test_a_backend_written_from_the_page_alone_passes_conformance(tmp_path):
    (code,) = re.findall(r"```python\n(\"\"\"my_backend\.py:.*?)```", PAGE.read_text(), flags=re.S)
    path = tmp_path / "my_backend.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("my_backend", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bm.register_backend(module)
    try:
        config = bm.CONFIGS["tiny"]
        targets = [bm.Target("mine", dtype) for dtype in ("float32", "float64")]
        report = bm.run_conformance(
            config, bm.random_weights(config, seed=2), targets, [c.input(config) for c in CASES]
        )
        assert report.passed and len(report.checks) == 2 * len(CASES), report.failures()
        info = report.runtime["mine float32 cpu"]
        assert info["backend"] == "mine" and info["framework"].startswith("numpy ")
        skipped = bm.run_conformance(
            config, bm.random_weights(config), [bm.Target("mine", "float32", "cuda")], [CASES[0].input(config)]
        )
        assert "computes on the CPU only" in next(iter(skipped.skipped.values()))
    finally:
        bm.unregister_backend("mine")
