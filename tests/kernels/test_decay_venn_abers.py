"""calpipe.kernels.decay_venn_abers.ivap_table, the O(B) refit (Vovk, Petej & Fedorova 2015's
prefix and suffix PAV stacks), against the O(B^2) one it replaced (:func:`ivap_table_quadratic`:
one full PAV pass per bin and test label, ``pav_value_at``) and, where that one's
cross-multiplied comparisons underflow (weights whose products fall below ~1e-308), against
an exact PAV in rational arithmetic. The two orders of summation agree to rounding, not to the
bit: max |difference| <= 1e-12 (seen: < 1e-15)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from calpipe.kernels import decay_venn_abers as DVA

TOL = 1e-12


@njit(cache=True)
def ivap_table_quadratic(pos, neg, out, s_sum, s_w, s_last):
    """The refit before #33 (2B PAV passes, O(B^2)), verbatim: the oracle."""
    for b in range(pos.shape[0]):
        p0 = DVA.pav_value_at(pos, neg, b, 0.0, 1.0, s_sum, s_w, s_last)
        p1 = DVA.pav_value_at(pos, neg, b, 1.0, 0.0, s_sum, s_w, s_last)
        out[b] = p1 / (1.0 - p0 + p1)


def quadratic(pos, neg):
    n = pos.size
    out = np.empty(n)
    ivap_table_quadratic(pos, neg, out, np.empty(n), np.empty(n), np.empty(n, np.int64))
    return out


def linear(pos, neg, spare=0):
    """The new table; ``spare`` extra scratch columns (the lanes pass their widest input's)."""
    n = pos.size
    out = np.full(n, np.nan)
    work = np.full((DVA.IVAP_ROWS, n + spare), np.nan)
    iwork = np.full((DVA.IVAP_IROWS, n + spare), -7, np.int64)
    DVA.ivap_table(np.ascontiguousarray(pos), np.ascontiguousarray(neg), out, work, iwork)
    return out


def exact(pos, neg):
    """The IVAP table in rational arithmetic: PAV by the same pooling rule, no rounding."""
    pos = [Fraction(float(v)) for v in pos]
    neg = [Fraction(float(v)) for v in neg]

    def fit(b, ap, an):
        blocks = []  # [label sum, weight, last bin]
        for k in range(len(pos)):
            sp, sw = pos[k] + (ap if k == b else 0), pos[k] + neg[k] + (ap + an if k == b else 0)
            if sw == 0:
                continue
            blocks.append([sp, sw, k])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > sp / sw:
                s2, w2, _ = blocks.pop()
                blocks[-1][0] += s2
                blocks[-1][1] += w2
                blocks[-1][2] = k
                sp, sw = blocks[-1][0], blocks[-1][1]
        return next(s / w for s, w, last in blocks if last >= b)

    out = []
    for b in range(len(pos)):
        p0, p1 = fit(b, 0, 1), fit(b, 1, 0)
        out.append(float(p1 / (1 - p0 + p1)))
    return np.array(out)


def vectors(rng, n_bins, kind):
    """Count vectors of one kind: small integers (ties), exponential counts with empty bins,
    one class only, constant, a decayed profile (bulk and tails forgotten to 1e-80), and
    counts that are all far below the test event's weight."""
    if kind == "ties":
        return rng.integers(0, 3, n_bins).astype(float), rng.integers(0, 3, n_bins).astype(float)
    if kind == "sparse":
        keep = rng.random((2, n_bins)) < 0.5
        return rng.exponential(1, n_bins) * keep[0], rng.exponential(1, n_bins) * keep[1]
    if kind == "one-class":
        w = rng.exponential(1, n_bins) * (rng.random(n_bins) < 0.8)
        return (w, np.zeros(n_bins)) if rng.random() < 0.5 else (np.zeros(n_bins), w)
    if kind == "constant":
        return np.full(n_bins, rng.choice([0.0, 0.5, 3.0])), np.full(n_bins, rng.choice([0.0, 1.0]))
    if kind == "decayed":
        z = np.linspace(-4, 4, n_bins)
        w = 500 * np.exp(-(z**2) / 2) * rng.exponential(1, n_bins)
        w *= np.where(np.abs(z) > 2.5, 10.0 ** rng.uniform(-80, 0, n_bins), 1.0)
        p = 1 / (1 + np.exp(-z + rng.normal(0, 1, n_bins)))
        return w * p, w * (1 - p)
    assert kind == "small"
    return rng.random(n_bins) * 1e-3, rng.random(n_bins) * 1e-3


KINDS = ["ties", "sparse", "one-class", "constant", "decayed", "small"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 30, 100])
def test_it_equals_the_quadratic_refit(kind, n_bins):
    rng = np.random.default_rng(n_bins * 100 + KINDS.index(kind))
    for _ in range(200):
        pos, neg = vectors(rng, n_bins, kind)
        np.testing.assert_allclose(linear(pos, neg), quadratic(pos, neg), rtol=0, atol=TOL)


def test_scratch_wider_than_the_bins_is_fine():
    """The lanes pass scratch as wide as their widest input's bins."""
    rng = np.random.default_rng(3)
    pos, neg = vectors(rng, 12, "sparse")
    np.testing.assert_allclose(linear(pos, neg, spare=30), quadratic(pos, neg), rtol=0, atol=TOL)


def test_empty_bins_and_one_bin():
    """With no count at all every bin has the test event alone: p0 = 0, p1 = 1, merge 1/2."""
    assert linear(np.zeros(5), np.zeros(5)).tolist() == [0.5] * 5
    assert (
        linear(np.array([2.0]), np.array([1.0])).tolist()
        == quadratic(np.array([2.0]), np.array([1.0])).tolist()
    )


HUGE_TINY = [0.0, 1e-300, 1e-200, 1e-10, 0.3, 1.0, 7.0, 1e100]


@pytest.mark.parametrize("seed", range(4))
def test_huge_and_tiny_weights_against_exact_arithmetic(seed):
    """Weights from 1e-300 to 1e100 in one vector: no block sum is a difference (none cancels),
    so the table is the exact one to rounding."""
    rng = np.random.default_rng(seed)
    for _ in range(150):
        n = int(rng.integers(1, 9))
        pos, neg = rng.choice(HUGE_TINY, n), rng.choice(HUGE_TINY, n)
        np.testing.assert_allclose(linear(pos, neg), exact(pos, neg), rtol=0, atol=TOL)


@pytest.mark.parametrize("n_bins", [2, 30, 100])
def test_huge_and_tiny_weights_against_the_quadratic_refit(n_bins):
    """1e-150..1e100: the old comparisons' cross-products stay above the underflow."""
    rng = np.random.default_rng(n_bins)
    for _ in range(100):
        keep = rng.random((2, n_bins)) < 0.6
        pos = 10.0 ** rng.uniform(-150, 100, n_bins) * keep[0]
        neg = 10.0 ** rng.uniform(-150, 100, n_bins) * keep[1]
        np.testing.assert_allclose(linear(pos, neg), quadratic(pos, neg), rtol=0, atol=TOL)


def test_where_the_old_comparison_underflowed_the_new_one_is_exact():
    """Bins 2 (3e-222) and 3 (8.7e-126) pool in exact arithmetic (mean 1 before mean 0), but the
    old cross-products 3e-222 * 8.7e-126 underflow to 0 and did not pool them, which kept a
    1e67-weighted block of mean 1 from the test event's 0 in bin 4: p0 of bin 4 went from 1 to 0."""
    pos = np.array([2.7e12, 8.0e67, 3.0e-222, 0.0, 1.3e-90])
    neg = np.array([3.5e-102, 0.0, 0.0, 8.7e-126, 2.6e-261])
    want = exact(pos, neg)
    np.testing.assert_allclose(linear(pos, neg), want, rtol=0, atol=TOL)
    assert abs(quadratic(pos, neg)[4] - want[4]) > 0.4


def test_a_block_whose_weight_dwarfs_the_rest_is_dropped_when_due():
    """Bins 1-5 pool into one block of weight 7e100 and mean 4/7; the test event's 1 in the
    empty bin 6 stays out of it (p1 = 1), though the block's mean and the block's mean with
    the event are the same double: the drop is decided on the rest of the block."""
    pos = np.array([0.0, 1e100, 1e100, 1e100, 0.0, 1e100, 0.0])
    neg = np.array([1.0, 0.0, 1e100, 0.0, 1e100, 1e100, 0.0])
    got = linear(pos, neg)
    np.testing.assert_allclose(got, quadratic(pos, neg), rtol=0, atol=TOL)
    assert got[6] == pytest.approx(1 / (1 - 4 / 7 + 1), rel=1e-15)


counts = st.lists(
    st.tuples(
        st.one_of(st.just(0.0), st.floats(1e-6, 1e6), st.sampled_from([1.0, 2.0, 0.5])),
        st.one_of(st.just(0.0), st.floats(1e-6, 1e6), st.sampled_from([1.0, 2.0, 0.5])),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(counts)
def test_property_linear_equals_quadratic(pairs):
    pos = np.array([p for p, _ in pairs])
    neg = np.array([q for _, q in pairs])
    np.testing.assert_allclose(linear(pos, neg), quadratic(pos, neg), rtol=0, atol=TOL)


def test_the_sweep_rarely_needs_the_direct_merge_on_decayed_counts():
    """The direct merge (O(B) at worst) is only for rounding at near-ties: on decayed counts
    it is rare, so a refit stays O(B)."""
    rng = np.random.default_rng(11)
    n_direct = 0
    for _ in range(200):
        pos, neg = vectors(rng, 100, "decayed")
        work, iwork = np.empty((DVA.IVAP_ROWS, 100)), np.empty((DVA.IVAP_IROWS, 100), np.int64)
        n_direct += DVA.ivap_table(pos, neg, np.empty(100), work, iwork)
    assert n_direct <= 200 * 2 * 100 // 100  # <= 1% of the 2B sweep steps
