"""Fixtures shared by tests/ and conformance/: the framework backends as a parameter, each skipped with
its reason where it cannot run here."""

import os

import pytest
from hypothesis import settings

from bert_multi import backends, load_backend

# CI runs the same Hypothesis examples every time, so a red run can be reproduced; locally each run
# explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

FRAMEWORKS = ("torch", "mxnet")


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """Each framework backend module in turn; the tests written against it run for both."""
    status = backends()[request.param]
    if not status.available:
        pytest.skip(status.reason)
    return load_backend(request.param)
