"""For users' own test suites: ``assert_model_conforms`` and the pytest fixture ``bert_verify``.

Installing bert_multi registers this module as a pytest plugin (entry point ``pytest11``), so in any
project's tests::

    def test_my_port(bert_verify):
        bert_verify(make_my_bert, "tiny", gradients=True)

fails with the verdict and where the model first diverges, in its own names. Importing this module
imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .verify.map_file import write_map
from .verify.mapping import MappingError
from .verify.session import VerifyReport, verify


def assert_model_conforms(model: Any, config: Any = "tiny", **options: Any) -> VerifyReport:
    """``bert_multi.verify(model, config, **options)``; raises ``AssertionError`` with the verdict and
    where it first diverges unless everything asked for conforms. The report, when it does."""
    __tracebackhide__ = True  # pytest shows the user's test, not this function, as where it failed
    report = verify(model, config, **options)
    if not report.passed:
        raise AssertionError(f"{report.verdict()}\n{report.failures()}")
    return report


try:
    import pytest
except ImportError:  # pragma: no cover - the plugin needs pytest; the assertion does not
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def bert_verify(tmp_path: Path) -> Callable[..., VerifyReport]:
        """``assert_model_conforms``, as a fixture: call it with your model or factory and a config. A
        model whose weights cannot be placed fails the test in one message, the map file guessed for it
        written beside the test's ``tmp_path`` (check it, then pass it as ``map_file=``)."""

        def checked(model: Any, config: Any = "tiny", **options: Any) -> VerifyReport:
            __tracebackhide__ = True
            try:
                return assert_model_conforms(model, config, **options)
            except MappingError as error:
                if error.suggested is None:
                    raise
                path = tmp_path / "bert_verify-map.json"
                write_map(path, error.suggested)
                pytest.fail(f"{error.problem} A map file guessed for it is in {path}: check it, then pass map_file=.",
                            pytrace=False)  # fmt: skip

        return checked
