"""Fixtures shared by tests/ and conformance/: the framework backends (every one the registry knows) as a
parameter, each skipped with its reason where it cannot run in this process."""

import os

import pytest
from hypothesis import settings

from bert_multi import frameworks, load_backend
from bert_multi.backend.registry import not_in_process, share_the_process

# CI runs the same Hypothesis examples every time, so a red run can be reproduced; locally each run
# explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
# The tests run every framework in one process, on one GPU where there is one (pytest -m cuda).
share_the_process()


@pytest.fixture(params=frameworks())
def framework(request):
    """Each framework backend in turn, in the environment where it runs in this process (one run by
    another environment's worker is tested there, and the worker by tests/test_environments.py); those
    marked ``needs("Pretrainer", ...)`` only for a backend offering those capabilities of the contract."""
    reason = not_in_process(request.param)
    if reason:
        pytest.skip(reason)
    backend = load_backend(request.param)
    for marker in request.node.iter_markers("needs"):
        lacking = [capability for capability in marker.args if getattr(backend.module, capability, None) is None]
        if lacking:
            pytest.skip(f"backend {backend.name!r} has no {', '.join(lacking)} (capabilities of the backend contract)")
    return backend
