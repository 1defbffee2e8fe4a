"""The comparison that decides PASS and FAIL, checked on values worked out by hand."""

import math

import numpy as np
import pytest

from bert_multi import Tolerance, compare_arrays, tolerance_for
from bert_multi.arrays import all_finite, contiguous_transpose, same_bits
from bert_multi.engine.compare import POLICY


def test_the_relative_tolerance_is_taken_against_the_reference():
    # |101 - 100| = 1 against atol 0 + rtol * |expected|: 0.995 fails; against |actual| (1.00495) it would pass.
    comparison = compare_arrays("x", np.array([101.0]), np.array([100.0]), Tolerance(atol=0.0, rtol=0.00995))
    assert not comparison.passed
    assert comparison.ratio == pytest.approx(1 / 0.995, rel=1e-12)
    # ... and from the other side: the same pair swapped passes, since now |expected| is 101.
    assert compare_arrays("x", np.array([100.0]), np.array([101.0]), Tolerance(0.0, 0.00995)).passed


def test_statistics_of_a_worked_example():
    expected = np.array([[0.0, 2.0], [-4.0, 10.0]])
    actual = np.array([[1e-6, 2.0 + 1e-5], [-4.0, 10.0 - 3e-4]])
    comparison = compare_arrays("x", actual, expected, Tolerance(atol=1e-5, rtol=1e-5))
    # Element limits: 1e-5, 3e-5, 5e-5, 1.1e-4; errors: 1e-6, 1e-5, 0, 3e-4.
    assert comparison.max_abs == pytest.approx(3e-4)
    assert comparison.max_rel == pytest.approx(3e-5)  # 3e-4 / 10; the zero reference is left out
    assert comparison.mean_abs == pytest.approx((1e-6 + 1e-5 + 3e-4) / 4)
    assert comparison.worst_index == (1, 1)
    assert comparison.ratio == pytest.approx(3e-4 / 1.1e-4)
    assert not comparison.passed and comparison.margin == pytest.approx(1.1e-4 / 3e-4)
    assert comparison.needed.atol == pytest.approx(1e-5 * 3e-4 / 1.1e-4)


def test_the_boundary_passes_and_the_next_float_fails():
    tolerance = Tolerance(atol=0.25, rtol=0.0)
    assert compare_arrays("x", np.array([1.25]), np.array([1.0]), tolerance).passed  # exactly at the limit
    assert not compare_arrays("x", np.array([np.nextafter(1.25, 2.0)]), np.array([1.0]), tolerance).passed


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_failures_never_close(bad):
    comparison = compare_arrays("x", np.array([1.0, bad]), np.array([1.0, 2.0]), Tolerance(1e3, 1e3))
    assert not comparison.passed and comparison.nonfinite == 1 and comparison.worst_index == (1,)
    both = compare_arrays("x", np.array([bad]), np.array([bad]), Tolerance(1e3, 1e3))
    assert not both.passed and both.nonfinite == 1  # NaN == NaN is not agreement
    in_the_reference = compare_arrays("x", np.array([1.0, 2.0]), np.array([1.0, bad]), Tolerance(1e3, 1e3))
    assert not in_the_reference.passed and in_the_reference.nonfinite == 1


def test_an_error_too_large_for_float64_fails_without_calling_finite_values_non_finite():
    comparison = compare_arrays("x", np.array([0.0, 1e308]), np.array([0.0, -1e308]), Tolerance(1e3, 1e3))
    assert not comparison.passed and comparison.nonfinite == 0 and comparison.max_abs == math.inf


def test_a_zero_tolerance_passes_only_exact_equality():
    assert compare_arrays("x", np.array([3.0]), np.array([3.0]), Tolerance(0.0, 0.0)).passed
    comparison = compare_arrays("x", np.array([3.0 + 2**-51]), np.array([3.0]), Tolerance(0.0, 0.0))
    assert not comparison.passed and comparison.ratio == math.inf


def test_a_missing_side_or_another_shape_is_a_failure_that_says_so():
    missing = compare_arrays("blks.0.ffn", None, np.zeros(3), Tolerance(1.0, 1.0))
    assert not missing.passed and "no value" in missing.problem
    assert missing.describe().startswith("blks.0.ffn: FAIL, the compared side has no value")
    shaped = compare_arrays("mlm", np.zeros((2, 3)), np.zeros((3, 2)), Tolerance(1.0, 1.0))
    assert not shaped.passed and shaped.problem == "shape (2, 3) differs from the reference's (3, 2)"


def test_the_policy_can_fail_each_dtype():
    """No tolerance is vacuous: float64 rounding passes float64's, float32 rounding does not; float32
    rounding passes float32's, an error of 1e-3 (TF32's size) does not."""
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(1000)
    rounded32 = reference.astype(np.float32).astype(np.float64)
    for kind in ("cpu", "gpu"):
        assert compare_arrays("x", reference + 1e-13, reference, tolerance_for("float64", kind)).passed
        assert not compare_arrays("x", rounded32, reference, tolerance_for("float64", kind)).passed
        assert compare_arrays("x", rounded32, reference, tolerance_for("float32", kind)).passed
        assert not compare_arrays("x", reference + 1e-3, reference, tolerance_for("float32", kind)).passed
    assert set(POLICY) == {(d, k) for d in ("float32", "float64") for k in ("cpu", "gpu")}


def test_pairs_get_twice_the_oracle_tolerance():
    for dtype in ("float32", "float64"):
        single, pair = tolerance_for(dtype), tolerance_for(dtype, pair=True)
        assert (pair.atol, pair.rtol) == (2 * single.atol, 2 * single.rtol)


def test_all_finite_looks_past_a_sum_that_overflows():
    assert all_finite(np.array([1e308, 1e308, -1e308]))  # the sum overflows; every element is finite
    assert all_finite(np.zeros(0))
    for bad in (np.nan, np.inf, -np.inf):
        assert not all_finite(np.array([1e308, 1e308, bad]))
        assert not all_finite(np.array([0.0, bad]))
    assert not all_finite(np.array([np.inf, -np.inf]))  # their sum is NaN, and so is the verdict


@pytest.mark.parametrize("shape", [(300, 7), (128, 256), (1, 5), (0, 3), (10**15, 0), (5,), (2, 3, 4)])
def test_a_contiguous_transpose_is_the_transpose(shape):
    array = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)  # (10**15, 0): a hostile file's, at once
    turned = contiguous_transpose(array)
    assert turned.flags.c_contiguous and turned.dtype == array.dtype
    np.testing.assert_array_equal(turned, array.T)
    assert not np.shares_memory(turned, array)


def test_same_bits_means_every_bit():
    """What lets a pair's target stand for its rebuilt model: equal values are not enough."""
    weights = {"a": np.linspace(-1, 1, 12).reshape(3, 4), "b": np.arange(5, dtype=np.float32)}
    assert same_bits(weights, {name: array.copy() for name, array in weights.items()})
    assert same_bits(weights, {"a": np.asfortranarray(weights["a"]), "b": weights["b"]})  # layout is not value
    one_ulp = weights["a"].copy()
    one_ulp[1, 2] = np.nextafter(one_ulp[1, 2], 2.0)
    zeros, negative_zeros = np.zeros(3), -np.zeros(3)
    nan = np.array([np.nan, 1.0])
    for given, expected in (
        ({**weights, "a": one_ulp}, weights),
        ({**weights, "a": weights["a"].astype(np.float32)}, weights),  # the same values in another dtype
        ({**weights, "a": weights["a"].reshape(4, 3)}, weights),
        ({"a": weights["a"]}, weights),  # a name missing
        ({**weights, "c": zeros}, weights),  # one too many
        ({"z": negative_zeros}, {"z": zeros}),  # equal, not the same bits
        ({"n": nan}, {"n": -nan}),  # a NaN of another sign
    ):
        assert not same_bits(given, expected) and not same_bits(expected, given)
    assert same_bits({"n": nan}, {"n": nan.copy()})  # the same NaN is the same bits
