"""The libm-free log and exp of calpipe/kernels/numeric.py against libm, ulp by ulp."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from calpipe.kernels import numeric as N


@settings(max_examples=60, deadline=None)
@given(x=st.floats(min_value=2.3e-308, max_value=1e308, allow_subnormal=False))
def test_log10_at_is_within_2_ulp_of_libm_log10(x):
    got = _log10_at([x])[0]
    expected = np.log10(x)
    assert abs(got - expected) <= 2 * np.spacing(abs(expected)) or got == expected


def test_log10_at_on_the_martingale_range_and_exact_points():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(0.5, 2.0, 2000), 1.0 + rng.normal(0, 1e-9, 500),
                        np.exp(rng.uniform(-12, 8, 2000))])  # fmt: skip
    got, expected = _log10_at(x), np.log10(x)
    np.testing.assert_array_less(np.abs(got - expected), 2.01 * np.spacing(np.abs(expected)))
    assert _log10_at([1.0])[0] == 0.0  # log10 S does not drift while forecasts equal the base
    np.testing.assert_allclose(_log10_at([10.0, 0.1, 1e5]), [1.0, -1.0, 5.0], rtol=1e-15)
    assert N.is_normal(np.float64(1.0).view(np.int64))
    for bad in (0.0, 5e-324, np.inf, np.nan):
        assert not N.is_normal(np.float64(bad).view(np.int64))


def test_exp_fast_is_within_1_ulp_of_libm_exp_on_a_dense_grid():
    """fdlibm's exp (e_exp.c) keeps its error below 1 ulp; against libm (also < 1 ulp) that is at
    most 1 ulp apart, on the whole range of the fast path and densely where the kernel uses it
    (-Brier in [-2, 0]; ln(10) x of log10 CJ), including the reduction's boundaries k ln2 / 2."""
    rng = np.random.default_rng(0)
    x = np.concatenate([
        np.linspace(-N.EXP_ARG_MAX, N.EXP_ARG_MAX, 400_001),
        np.linspace(-2.0, 0.0, 200_001),
        rng.uniform(-1e-6, 1e-6, 20_000),
        np.log(2.0) * (np.arange(-2040, 2041) / 2.0),  # ties of the rounding of x / ln 2
        np.nextafter(np.log(2.0) * (np.arange(-2040, 2041) / 2.0), np.inf),
    ])  # fmt: skip
    x = x[np.abs(x) <= N.EXP_ARG_MAX]
    got, expected = _exp_fast_all(x), np.exp(x)
    assert np.all(np.isfinite(got)) and np.all(got > 0)
    ulp = _ulps(got, expected)
    assert ulp.max() <= 1.0
    # And < 1 ulp from the exact value (80-bit long double as the reference, where available).
    if np.finfo(np.longdouble).nmant > 52:
        exact = np.exp(x.astype(np.longdouble))
        err = np.abs(got.astype(np.longdouble) - exact) / np.spacing(expected).astype(np.longdouble)
        assert float(err.max()) < 1.0


def test_exp_fast_edge_cases_and_libm_fallback():
    assert N.exp_fast(0.0) == 1.0 and N.exp_fast(-0.0) == 1.0  # log10 CJ's e^0 terms
    assert N.exp_core(0.0) == 1.0
    assert N.exp_fast(1.0) == pytest.approx(np.e, rel=2.3e-16)
    assert N.exp_fast(5e-324) == 1.0 and N.exp_fast(-5e-324) == 1.0
    outside = np.array(
        [-np.inf, -1000.0, -745.2, -709.0, -708.0001, 708.0001, 709.7, 710.0, np.inf]
    )
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_exp_fast_all(outside), np.exp(outside))  # libm's exactly
    assert np.isnan(N.exp_fast(np.nan))


@settings(max_examples=60, deadline=None)
@given(x=st.floats(min_value=-N.EXP_ARG_MAX, max_value=N.EXP_ARG_MAX))
def test_exp_fast_is_within_1_ulp_of_libm_exp(x):
    got, expected = N.exp_fast(x), math.exp(x)
    assert abs(got - expected) <= np.spacing(expected)


def test_ln_fast_is_fdlibm_log_of_log10_at_and_within_1_ulp_of_libm():
    """_ln_fast * (1 / ln 10) is _log10_at bit for bit (the same operations, bit casts in
    registers); _ln_fast is within 1 ulp of libm's log; outside the positive normals it is
    libm's."""
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.uniform(0.05, 1.5, 20_000), np.exp(rng.uniform(-700, 700, 20_000)),
        1.0 + rng.normal(0, 1e-9, 2000), [1.0, 2.0, 0.5, np.sqrt(2.0)],
    ])  # fmt: skip
    got = _ln_fast_all(x)
    np.testing.assert_array_equal(got * N.INV_LN10, _log10_at(x))
    ulp = _ulps(got, np.log(x))
    assert ulp[np.log(x) != 0].max() <= 1.0
    assert N.ln_fast(1.0) == 0.0
    odd = np.array([0.0, -0.0, 5e-324, 2e-310, -1.0, np.inf, -np.inf, np.nan])
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(_ln_fast_all(odd), np.log(odd))
    assert all(N.ln_ok(v) for v in (1.0, 2.3e-308, 1e308)) and not any(
        N.ln_ok(v) for v in (0.0, -0.0, 5e-324, -1.0, np.inf, np.nan)
    )


def _log10_at(values) -> np.ndarray:
    x = np.ascontiguousarray(values, dtype=np.float64)
    return np.array([N.log10_core(x[i]) for i in range(x.size)])


# ----------------------------------------------------------------------------------------------
# Brier compatibility, binary: the libm-free exp / log, the two-class kernel against the
# generic K-class kernel and the package's recursion, its two engines (one stream at a time, SIMD
# lanes) and their bit-for-bit determinism
# ----------------------------------------------------------------------------------------------
@njit(error_model="numpy")
def _exp_fast_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = N.exp_fast(x[i])
    return out


@njit(error_model="numpy")
def _ln_fast_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = N.ln_fast(x[i])
    return out


def _ulps(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|got - expected| in units of the spacing of the doubles at ``expected``."""
    return np.abs(got - expected) / np.spacing(np.abs(expected))
