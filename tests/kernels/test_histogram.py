"""Histogram binning (calpipe.kernels.histogram) against a slow loop from the definition.

The definition (Zadrozny & Elkan 2001 §3, with the module's tie rule): sort the calibration
scores; the candidate cuts are the scores at ranks floor(j n / B), j = 1..B-1; keep the distinct
ones above the minimum; a score's bin is the number of cuts <= it; a bin's value is
(k + m r) / (n_b + m). Multiclass: the same per class column on the indicator of the class, then
each row divided by its sum (the base row where that sum is 0). Properties checked besides:
equal mass with distinct scores, ties never split, no empty bin, outer bins unbounded.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe import config
from calpipe.kernels import histogram as H

SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(max_examples=50, deadline=None)


# ----------------------------------------------------------------------------------------------
# Slow oracle
# ----------------------------------------------------------------------------------------------
def naive_cuts(cal: list[float], n_bins: int) -> list[float]:
    srt = sorted(cal)
    n = len(srt)
    cuts: list[float] = []
    for j in range(1, n_bins):
        v = srt[(j * n) // n_bins]
        if v > srt[0] and v not in cuts:
            cuts.append(v)
    return sorted(cuts)


def naive_bin(x: float, cuts: list[float]) -> int:
    return sum(1 for v in cuts if v <= x)


def naive_binary(cal, hit, n_bins, m, test) -> list[float]:
    cal, hit = list(map(float, cal)), list(map(float, hit))
    cuts = naive_cuts(cal, n_bins)
    rate = sum(hit) / len(hit)
    out = []
    for x in map(float, test):
        b = naive_bin(x, cuts)
        members = [h for s, h in zip(cal, hit, strict=True) if naive_bin(s, cuts) == b]
        out.append((sum(members) + m * rate) / (len(members) + m))
    return out


def naive_multiclass(cal, labels, n_bins, m, test) -> np.ndarray:
    k = cal.shape[1]
    raw = np.array(
        [naive_binary(cal[:, c], labels == c, n_bins, m, test[:, c]) for c in range(k)]
    ).T
    out = np.empty_like(raw)
    for i in range(raw.shape[0]):
        tot = sum(raw[i])
        out[i] = test[i] if tot == 0 else raw[i] / tot
    return out


def _binary(seed: int, n: int, tied: bool):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 6, n) / 5.0 if tied else rng.uniform(0, 1, n)
    s[rng.random(n) < 0.1] = rng.choice([0.0, 1.0])
    y = (rng.random(n) < 0.2 + 0.6 * s**2).astype(np.int64)
    return s, y


# ----------------------------------------------------------------------------------------------
# Binary
# ----------------------------------------------------------------------------------------------
@FEW
@given(
    seed=SEEDS,
    n=st.integers(1, 60),
    n_bins=st.integers(1, 15),
    tied=st.booleans(),
    m=st.sampled_from([0.0, 2.0, 10.0]),
)
def test_binary_matches_slow_loop(seed, n, n_bins, tied, m):
    s, y = _binary(seed, n, tied)
    test = np.r_[-0.5, 0.0, 1.0, 1.5, s, np.random.default_rng(seed).uniform(0, 1, 30)]
    fitted = H.fit(s, y, n_bins=n_bins, prior_strength=m)
    assert fitted.dtype == np.float64 and fitted.ndim == 1 and np.all(np.isfinite(fitted))
    got = H.predict(fitted, test)
    assert got.p_lower is None and got.p.shape == test.shape
    np.testing.assert_allclose(got.p, naive_binary(s, y, n_bins, m, test), rtol=1e-14, atol=0)
    assert np.all((got.p >= 0) & (got.p <= 1))
    np.testing.assert_array_equal(H.fit(s, y, n_bins=n_bins, prior_strength=m), fitted)


@FEW
@given(seed=SEEDS, n=st.integers(1, 80), n_bins=st.integers(1, 15), tied=st.booleans())
def test_bins_equal_mass_ties_whole_no_empty(seed, n, n_bins, tied):
    s, y = _binary(seed, n, tied)
    fitted = H.fit(s, y, n_bins=n_bins)
    n_blocks, b = int(fitted[0]), int(fitted[1])
    cuts = fitted[2 : 1 + b]
    assert n_blocks == 1 and fitted.size == 2 * b + 1
    assert np.all(np.diff(cuts) > 0) and (b == 1 or cuts[0] > s.min())
    assert 1 <= b <= min(n_bins, np.unique(s).size)
    idx = np.searchsorted(cuts, s, side="right")
    counts = np.bincount(idx, minlength=b)
    assert np.all(counts >= 1)  # no empty bin
    for v in np.unique(s):  # a tie block is never split
        assert np.unique(idx[s == v]).size == 1
    if np.unique(s).size == n and n >= n_bins:  # distinct scores: exactly B equal-mass bins
        assert b == n_bins
        assert set(counts.tolist()) <= {n // n_bins, -(-n // n_bins)}


def test_outer_bins_and_cut_values():
    s = np.array([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    y = np.array([0, 0, 1, 0, 1, 1])
    fitted = H.fit(s, y, n_bins=3)
    np.testing.assert_array_equal(fitted, [1, 3, 0.4, 0.6, 0.0, 0.5, 1.0])
    p = H.predict(fitted, np.array([-1.0, 0.0, 0.39, 0.4, 0.59, 0.6, 1.0, 2.0])).p
    np.testing.assert_array_equal(p, [0.0, 0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0])


def test_degenerate_sets():
    # n = 1: one bin, the label
    np.testing.assert_array_equal(H.fit(np.array([0.3]), np.array([1])), [1, 1, 1.0])
    # all tied: one bin, the mean label, whatever n_bins
    fitted = H.fit(np.full(20, 0.7), (np.arange(20) < 5).astype(np.int64), n_bins=10)
    np.testing.assert_array_equal(fitted, [1, 1, 0.25])
    np.testing.assert_array_equal(H.predict(fitted, np.array([0.0, 0.7, 1.0])).p, 0.25)
    # one class: zeros (the m-estimate's prior rate is 0 too)
    fitted = H.fit(np.linspace(0, 1, 30), np.zeros(30, np.int64), prior_strength=5.0)
    assert np.all(H.predict(fitted, np.linspace(-1, 2, 7)).p == 0.0)
    # scores exactly 0 and 1
    fitted = H.fit(np.array([0.0, 0.0, 1.0, 1.0, 1.0]), np.array([0, 1, 1, 1, 0]), n_bins=5)
    np.testing.assert_allclose(H.predict(fitted, np.array([0.0, 0.5, 1.0])).p, [0.5, 0.5, 2 / 3])


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        H.fit(np.zeros(3), np.zeros(2, np.int64))
    with pytest.raises(ValueError):
        H.fit(np.zeros(3), np.array([0, 1, 2]))
    with pytest.raises(ValueError):
        H.fit(np.zeros(0), np.zeros(0, np.int64))
    with pytest.raises(ValueError):
        H.fit(np.zeros(3), np.zeros(3, np.int64), n_bins=0)
    fitted = H.fit(np.zeros((4, 3)) + 1 / 3, np.array([0, 1, 2, 0]))
    with pytest.raises(ValueError):
        H.predict(fitted, np.zeros(4))
    with pytest.raises(ValueError):
        H.predict(fitted, np.zeros((4, 2)))
    with pytest.raises(ValueError):
        H.predict(fitted[:-1], np.zeros((4, 3)))
    with pytest.raises(ValueError):
        H.predict(H.fit(np.zeros(3), np.zeros(3, np.int64)), np.zeros((3, 2)))


def test_default_bins():
    s = np.random.default_rng(0).uniform(0, 1, 1000)
    fitted = H.fit(s, (s > 0.5).astype(np.int64))
    assert int(fitted[1]) == config.HISTOGRAM_N_BINS


# ----------------------------------------------------------------------------------------------
# Multiclass (one-vs-rest, renormalised)
# ----------------------------------------------------------------------------------------------
@FEW
@given(
    seed=SEEDS,
    n=st.integers(1, 40),
    k=st.integers(2, 4),
    n_bins=st.integers(1, 8),
    m=st.sampled_from([0.0, 3.0]),
    tied=st.booleans(),
)
def test_multiclass_matches_slow_loop(seed, n, k, n_bins, m, tied):
    rng = np.random.default_rng(seed)
    s = rng.dirichlet(np.ones(k), n)
    if tied:
        s = np.round(s * 3) + 0.1
        s /= s.sum(axis=1, keepdims=True)
    s[rng.random(n) < 0.1] = np.eye(k)[0]
    y = rng.integers(0, k, n).astype(np.int64)
    test = np.r_[s, rng.dirichlet(np.ones(k), 20), np.eye(k)]
    fitted = H.fit(s, y, n_bins=n_bins, prior_strength=m)
    assert int(fitted[0]) == k and np.all(np.isfinite(fitted))
    p = H.predict(fitted, test).p
    assert p.shape == test.shape
    np.testing.assert_allclose(p, naive_multiclass(s, y, n_bins, m, test), rtol=1e-12, atol=1e-15)
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)


def test_multiclass_all_zero_row_keeps_base():
    # each class occurs only where its own score is 0.9: bins [0.9, inf) have frequency 1,
    # bins (-inf, 0.9) frequency 0, so a row with every p_c < 0.9 has raw values all 0
    s = np.array([[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.05, 0.05, 0.9]])
    fitted = H.fit(s, np.array([0, 1, 2]), n_bins=3)
    probe = np.array([[0.2, 0.3, 0.5], [0.95, 0.03, 0.02]])
    np.testing.assert_array_equal(H.predict(fitted, probe).p, [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    # a prior (m-estimate towards the class frequencies 1/3) removes the all-zero rows
    fitted = H.fit(s, np.array([0, 1, 2]), n_bins=3, prior_strength=1.0)
    np.testing.assert_allclose(H.predict(fitted, probe[:1]).p, [[1 / 3, 1 / 3, 1 / 3]])


def test_binary_cuts_refuse_a_multiclass_fit():
    import numpy as np
    import pytest

    from calpipe.kernels import histogram

    s = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    with pytest.raises(ValueError, match="not a binary histogram-binning fitted vector"):
        histogram.binary_cuts(histogram.fit(s, np.array([0, 1, 2, 1]), n_bins=2))
