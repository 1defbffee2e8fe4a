"""Shared fixtures: the framework backends as a parameter, skipped with a reason where not installed."""

import numpy as np
import pytest

from bert_multi import backends, load_backend
from bert_multi.compare import compare_arrays, tolerance_for

FRAMEWORKS = ("torch", "mxnet")


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    """Each framework backend module in turn; the tests written against it run for both."""
    status = backends()[request.param]
    if not status.available:
        pytest.skip(status.reason)
    return load_backend(request.param)


def assert_close(actual, expected, tolerance, name="output"):
    comparison = compare_arrays(name, actual, expected, tolerance)
    assert comparison.passed, comparison.describe()
    return comparison


def assert_outputs_match(out, ref, dtype, device_kind="cpu", pair=False):
    """Every output and intermediate of ``out`` within the policy's tolerance of ``ref``."""
    tolerance = tolerance_for(dtype, device_kind, pair)
    assert (out.mlm is None) == (ref.mlm is None)
    for name in ("encoded", "mlm", "nsp"):
        if getattr(ref, name) is not None:
            assert getattr(out, name).dtype == np.dtype(dtype)
            assert_close(getattr(out, name), getattr(ref, name), tolerance, name)
    if ref.intermediates is not None:
        assert list(out.intermediates) == list(ref.intermediates)
        for name, value in ref.intermediates.items():
            assert_close(out.intermediates[name], value, tolerance, name)
