"""Fixtures shared by tests/ and conformance/: the framework backends as a parameter, each skipped with
its reason where it cannot run here."""

import pytest

from bert_multi import backends, load_backend

FRAMEWORKS = ("torch", "mxnet")


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """Each framework backend module in turn; the tests written against it run for both."""
    status = backends()[request.param]
    if not status.available:
        pytest.skip(status.reason)
    return load_backend(request.param)
