"""Fixtures shared by tests/ and conformance/: the framework backends (every one the registry knows) as a
parameter, each skipped with its reason where it cannot run here."""

import os

import pytest
from hypothesis import settings

from bert_multi import backends, frameworks, load_backend

# CI runs the same Hypothesis examples every time, so a red run can be reproduced; locally each run
# explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(params=frameworks())
def framework(request):
    """Each framework backend in turn; the tests written against it run for every one, but those marked
    ``needs("Pretrainer", ...)`` only for a backend offering those capabilities of the contract."""
    status = backends()[request.param]
    if not status.available:
        pytest.skip(status.reason)
    backend = load_backend(request.param)
    for marker in request.node.iter_markers("needs"):
        lacking = [capability for capability in marker.args if getattr(backend.module, capability, None) is None]
        if lacking:
            pytest.skip(f"backend {backend.name!r} has no {', '.join(lacking)} (capabilities of the backend contract)")
    return backend
