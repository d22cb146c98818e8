"""calpipe.kernels.venn_abers against the definition, the reference package and its invariants.

* the definition (tests/naive_venn_abers.py): one full isotonic refit per test score and label
  (Vovk & Petej 2014), on tiny tie-heavy windows with test scores below, above and equal to
  calibration scores; CVAP merges and multiclass couplings element by element;
* ``venn-abers`` 1.5.4 (dev-only): IVAP through ``calc_p0p1``/``calc_probs`` and ``VennAbers``;
  CVAP and multiclass through its estimator API around a fixed-score "classifier" whose
  ``predict_proba(X)`` returns precomputed score rows ``X[:, 0]``, with the package's own folds
  passed to calpipe; multiclass IVAP through its prefitted path;
* invariants: bounds, monotonicity in the score, rows summing to 1, determinism, degenerate
  windows; the bucket lookup against numpy's searchsorted on arbitrary finite floats;
* the bank reference data (IVAP on the first 5000 events of ``score_rf1000``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calpipe.kernels import venn_abers as va
from tests import naive_venn_abers as naive

pytest.importorskip("venn_abers")
pytest.importorskip("sklearn")

from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.isotonic import IsotonicRegression
from sklearn.model_selection import StratifiedKFold
from venn_abers.venn_abers import (
    VennAbers,
    VennAbersCalibrator,
    VennAbersCV,
    calc_p0p1,
    calc_probs,
)

ATOL = 1e-12
SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
DATA = Path(
    os.environ.get("CALPIPE_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
)

pytestmark = pytest.mark.filterwarnings("ignore")


# ----------------------------------------------------------------------------------------------
# Inputs and helpers
# ----------------------------------------------------------------------------------------------
def _tie_heavy(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Calibration scores rounded to 1-2 decimals, labels of a random rate (often one class),
    and test scores below, inside and above the range, equal to calibration scores and next to
    them."""
    dec = int(rng.integers(1, 3))
    s = np.round(rng.random(n), dec)
    rate = rng.choice([0.0, 1.0, rng.random()])
    y = (rng.random(n) < rate).astype(np.int64)
    t = np.concatenate(
        [
            np.round(rng.uniform(-0.3, 1.3, 8), dec),
            s[: min(n, 6)],
            [s.min() - 1e-9, s.max() + 1e-9, s.min(), s.max()],
        ]
    )
    return s, y, t


def _p0p1(s, y, t):
    pred = va.predict(va.fit(s, y), t)
    return pred.p_lower, pred.p_upper, pred.p


def _package_ivap(s, y, t):
    """(p0, p1, p) of the package's low-level IVAP (calc_p0p1 + calc_probs)."""
    p0, p1, c = calc_p0p1(np.column_stack([1.0 - s, s]), np.asarray(y))
    p_prime, p0_p1 = calc_probs(p0, p1, c, np.column_stack([1.0 - t, t]))
    return p0_p1[:, 0], p0_p1[:, 1], p_prime[:, 1]


class FixedScores(ClassifierMixin, BaseEstimator):
    """A "classifier" whose predict_proba(X) returns precomputed score rows ``table[X[:, 0]]``.

    Binary (1-D table): [1 - s, s]. Multiclass (2-D table) inside the package's one-vs-one
    reduction: fitted on the rows of two classes i < j (read from ``labels``), it returns the
    package's pairwise renormalisation [s_i, s_j] / (s_i + s_j) - the fixed-score analogue of a
    pairwise model.
    """

    def __init__(self, table=None, labels=None):
        self.table = table
        self.labels = labels

    def fit(self, X, y):
        self.classes_ = np.unique(y)
        if self.labels is not None:
            self.pair_ = np.unique(self.labels[np.asarray(X)[:, 0].astype(np.int64)])
        return self

    def predict_proba(self, X):
        rows = self.table[np.asarray(X)[:, 0].astype(np.int64)]
        if rows.ndim == 1:
            return np.column_stack([1.0 - rows, rows])
        pair = rows[:, self.pair_]
        return pair / np.sum(pair, axis=1).reshape(-1, 1)


def _stratified_folds(y: np.ndarray, n_splits: int) -> np.ndarray:
    """Fold id of every point under the package's StratifiedKFold(n_splits, shuffle=False)."""
    out = np.full(y.shape[0], -1, dtype=np.int64)
    x = np.zeros((y.shape[0], 1))
    for f, (_, idx) in enumerate(StratifiedKFold(n_splits=n_splits).split(x, y)):
        out[idx] = f
    assert (out >= 0).all()
    return out


# ----------------------------------------------------------------------------------------------
# The oracle itself: the plain PAV equals scikit-learn's isotonic regression (ties pooled)
# ----------------------------------------------------------------------------------------------
@FEW
@given(seed=SEEDS, n=st.integers(1, 30))
def test_naive_isotonic_equals_sklearn(seed, n):
    rng = np.random.default_rng(seed)
    s, y, _ = _tie_heavy(rng, n)
    fit = naive.isotonic_fit(list(s), list(y.astype(float)))
    ref = IsotonicRegression().fit(s, y).predict(s)
    np.testing.assert_allclose([fit[v] for v in s], ref, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# IVAP = the definition (refit per test score) and = the package
# ----------------------------------------------------------------------------------------------
@FEW
@given(seed=SEEDS, n=st.integers(1, 30))
def test_ivap_equals_definition(seed, n):
    rng = np.random.default_rng(seed)
    s, y, t = _tie_heavy(rng, n)
    p0, p1, p = _p0p1(s, y, t)
    b0, b1 = naive.ivap_p0p1(s, y, t)
    np.testing.assert_allclose(p0, b0, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p1, b1, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p, b1 / (1.0 - b0 + b1), atol=ATOL, rtol=0)
    # Brier merge of one IVAP (VPF 2015, Section 4): p1 + p0^2/2 - p1^2/2
    pb = va.predict(va.fit(s, y, merge="brier"), t).p
    np.testing.assert_allclose(pb, b1 + 0.5 * b0**2 - 0.5 * b1**2, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["continuous", "ties", "tiny", "one_class", "few_distinct"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ivap_equals_package(case, seed):
    rng = np.random.default_rng(seed)
    n = {"continuous": 2000, "ties": 600, "tiny": 3, "one_class": 200, "few_distinct": 400}[case]
    s = rng.beta(2.0, 3.0, n)
    if case == "ties":
        s = np.round(s, 2)
    if case == "few_distinct":
        s = rng.choice([0.1, 0.35, 0.5, 0.9], n)
    y = (rng.random(n) < s**0.7).astype(np.int64)
    if case == "one_class":
        y[:] = seed % 2
    t = np.concatenate([rng.beta(2.0, 3.0, 3000), s[:500], [-1.0, 0.0, 1.0, 2.0]])
    if case in ("ties", "few_distinct"):
        t = np.round(t, 2)
    p0, p1, p = _p0p1(s, y, t)
    r0, r1, rp = _package_ivap(s, y, t)
    np.testing.assert_allclose(p0, r0, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p1, r1, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p, rp, atol=ATOL, rtol=0)
    # and through the package's VennAbers estimator
    p_prime, p0_p1 = (
        VennAbers().fit(np.column_stack([1 - s, s]), y).predict_proba(np.column_stack([1 - t, t]))
    )
    np.testing.assert_allclose(p, p_prime[:, 1], atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.column_stack([p0, p1]), p0_p1, atol=ATOL, rtol=0)


def test_ivap_layout():
    s = np.array([0.5, 0.1, 0.5, 0.9, 0.1, 0.1])
    y = np.array([1, 0, 0, 1, 1, 0])
    f = va.fit(s, y)
    assert f.dtype == np.float64 and f.ndim == 1 and np.isfinite(f).all()
    assert f[:5].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]  # K=1, mode, log, S=1, F=1
    k = int(f[5])
    assert k == 3 and f.shape[0] == 5 + 3 * k + 3
    np.testing.assert_array_equal(f[6 : 6 + k], np.unique(s))
    f0, f1 = f[6 + k : 6 + 2 * k + 1], f[6 + 2 * k + 1 :]
    assert f0[0] == 0.0 and f1[-1] == 1.0
    # F0[i] / F1[i] are p0 / p1 at a test score just above / at the i-th distinct score
    b0, b1 = naive.ivap_p0p1(s, y, [0.1, 0.5, 0.9])
    np.testing.assert_allclose(f0[1:], b0, atol=ATOL)
    np.testing.assert_allclose(f1[:-1], b1, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# CVAP = the definition and = the package (VennAbersCV with the package's folds)
# ----------------------------------------------------------------------------------------------
@FEW
@given(
    seed=SEEDS,
    n=st.integers(1, 30),
    n_folds=st.integers(2, 4),
    how=st.sampled_from(["log", "brier"]),
)
def test_cvap_equals_definition(seed, n, n_folds, how):
    rng = np.random.default_rng(seed)
    s, y, t = _tie_heavy(rng, n)
    folds = rng.integers(0, n_folds, n) * 7 - 3  # arbitrary ids, maybe fewer than n_folds
    pred = va.predict(va.fit(s, y, folds=folds, merge=how), t)
    p, b0, b1 = naive.cvap(s, y, folds, t, how)
    np.testing.assert_allclose(pred.p, p, atol=ATOL, rtol=0)
    np.testing.assert_allclose(pred.p_lower, b0.mean(axis=1), atol=ATOL, rtol=0)
    np.testing.assert_allclose(pred.p_upper, b1.mean(axis=1), atol=ATOL, rtol=0)
    # default folds: point i -> fold i mod min(n_folds, n)
    nf = min(n_folds, n)
    a = va.fit(s, y, cross=True, n_folds=n_folds, merge=how)
    b = va.fit(s, y, folds=np.arange(n) % nf, merge=how)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("how", ["log", "brier"])
@pytest.mark.parametrize(
    ("seed", "n", "n_folds", "ties"), [(0, 500, 5, False), (1, 300, 3, True), (2, 40, 2, True)]
)
def test_cvap_equals_package(how, seed, n, n_folds, ties):
    rng = np.random.default_rng(seed)
    s = rng.beta(2.0, 3.0, n)
    t = np.concatenate([rng.beta(2.0, 3.0, 2000), s[:100], [0.0, 1.0]])
    if ties:
        s, t = np.round(s, 2), np.round(t, 2)
    y = (rng.random(n) < s**0.7).astype(np.int64)
    est = FixedScores(table=np.concatenate([s, t]))
    x_cal = np.arange(n).reshape(-1, 1)
    x_test = np.arange(n, n + t.shape[0]).reshape(-1, 1)
    cv = VennAbersCV(est, inductive=False, n_splits=n_folds)
    cv.fit(x_cal, y)
    p_ref, stacks = cv.predict_proba(x_test, loss=how, p0_p1_output=True)
    pred = va.predict(va.fit(s, y, folds=_stratified_folds(y, n_folds), merge=how), t)
    np.testing.assert_allclose(pred.p, p_ref[:, 1], atol=ATOL, rtol=0)
    np.testing.assert_allclose(pred.p_lower, stacks[:, :n_folds].mean(axis=1), atol=ATOL, rtol=0)
    np.testing.assert_allclose(pred.p_upper, stacks[:, n_folds:].mean(axis=1), atol=ATOL, rtol=0)
    # the package's top-level estimator API on a binary problem (one pair, K = 2 coupling)
    cal = VennAbersCalibrator(estimator=est, inductive=False, n_splits=n_folds, shuffle=False)
    cal.fit(x_cal, y)
    np.testing.assert_allclose(pred.p, cal.predict_proba(x_test, loss=how)[:, 1], atol=ATOL, rtol=0)


def test_log_merge_can_leave_the_mean_bounds():
    """The documented caveat: fold means need not contain the log-loss merge (VPF 2015 eq. 13).

    A hand-made fitted vector of two folds, each one block at 0.5: below it, fold 1 gives
    (p0, p1) = (0.9, 0.95) and fold 2 (0, 0.01).
    """
    fold1 = [1.0, 0.5, 0.9, 0.9, 0.95, 1.0]
    fold2 = [1.0, 0.5, 0.0, 0.0, 0.01, 1.0]
    fitted = np.array([1.0, 0.0, 0.0, 1.0, 2.0, *fold1, *fold2])
    p, lo, hi = va.predict(fitted, np.array([0.4]))
    assert hi[0] == pytest.approx(0.48)
    g1, g0 = np.sqrt(0.95 * 0.01), np.sqrt(0.1 * 1.0)
    assert p[0] == pytest.approx(g1 / (g0 + g1), abs=ATOL)
    assert p[0] < lo[0] == pytest.approx(0.45)
    assert 0.0 <= p[0] <= 0.95  # within [min p0, max p1]
    pb = va.predict(np.array([1.0, 0.0, 1.0, 1.0, 2.0, *fold1, *fold2]), np.array([0.4])).p
    assert pb[0] == pytest.approx((0.96 + (0.81 - 0.95**2 - 0.01**2) / 2) / 2, abs=ATOL)


def test_log_merge_many_folds_does_not_underflow():
    """120 folds with p1 ~ 1e-3: the product of p1 underflows, the log-domain fallback does not."""
    rng = np.random.default_rng(0)
    p0 = rng.uniform(0.0, 1e-3, 120)
    p1 = rng.uniform(5e-4, 2e-3, 120)
    blocks = [[1.0, 0.5, a, a, b, 1.0] for a, b in zip(p0, p1, strict=True)]
    fitted = np.array([1.0, 0.0, 0.0, 1.0, 120.0, *(v for blk in blocks for v in blk)])
    assert np.prod(p1) == 0.0
    got = va.predict(fitted, np.array([0.4, 0.7]))
    ref = naive.merge(p0[None, :], p1[None, :], "log")[0]
    np.testing.assert_allclose(
        got.p, [ref, 1.0 / (1.0 + np.exp(np.mean(np.log1p(-p0))))], rtol=1e-12
    )


# ----------------------------------------------------------------------------------------------
# Multiclass = the definition and = the package
# ----------------------------------------------------------------------------------------------
def _multiclass_data(rng, n, k, dec=None, zeros=False):
    p = rng.dirichlet(np.full(k, 0.8), size=n)
    if dec is not None:
        p = np.round(p, dec)
        p[:, -1] = 1.0 - p[:, :-1].sum(axis=1)
        p = np.clip(p, 0.0, 1.0)
    if zeros:
        hit = rng.random(n) < 0.2
        p[hit] = 0.0
        p[hit, rng.integers(0, k, hit.sum())] = 1.0
    y = np.array([rng.choice(k, p=r / r.sum()) for r in p**0.7], dtype=np.int64)
    return p, y


@FEW
@given(
    seed=SEEDS,
    n=st.integers(1, 25),
    k=st.integers(3, 4),
    mode=st.sampled_from(["ovr", "ovo"]),
    how=st.sampled_from(["log", "brier"]),
    n_folds=st.integers(1, 3),
)
def test_multiclass_equals_definition(seed, n, k, mode, how, n_folds):
    rng = np.random.default_rng(seed)
    p, y = _multiclass_data(rng, n, k, dec=1, zeros=True)  # ties, zero pairs, absent classes
    pt, _ = _multiclass_data(rng, 7, k, dec=1, zeros=True)
    pt = np.vstack([pt, p[:3]])
    folds = np.arange(n) % min(n_folds, n)
    got = va.predict(va.fit(p, y, folds=folds, merge=how, multiclass=mode), pt)
    ref = naive.multiclass(p, y, folds, pt, mode, how)
    np.testing.assert_allclose(got.p, ref, atol=ATOL, rtol=0)
    assert got.p_lower is None and got.p_upper is None


@pytest.mark.parametrize(("mode", "va_type"), [("ovo", "one_vs_one"), ("ovr", "one_vs_rest")])
def test_multiclass_keeps_a_class_absent_from_the_window(mode, va_type):
    # the README's caveat: venn-abers 1.5.4 drops a class without calibration examples (fewer
    # columns); calpipe keeps the stream's K classes, the absent one with a small probability
    rng = np.random.default_rng(3)
    p, y = _multiclass_data(rng, 300, 3, dec=None)
    keep = y != 2
    p, y = p[keep], y[keep]
    pt, _ = _multiclass_data(rng, 50, 3, dec=None)
    ref = VennAbersCalibrator().predict_proba(p_cal=p, y_cal=y, p_test=pt, va_type=va_type)
    assert ref.shape == (50, 2)
    got = va.predict(va.fit(p, y, multiclass=mode), pt).p
    assert got.shape == (50, 3)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=ATOL)
    assert np.all(got[:, 2] > 0) and np.median(got[:, 2]) < np.median(got[:, :2])


@pytest.mark.parametrize(("mode", "va_type"), [("ovo", "one_vs_one"), ("ovr", "one_vs_rest")])
@pytest.mark.parametrize(("seed", "k", "dec"), [(0, 3, None), (1, 4, 2), (2, 5, None)])
def test_multiclass_ivap_equals_package(mode, va_type, seed, k, dec):
    rng = np.random.default_rng(seed)
    p, y = _multiclass_data(rng, 800, k, dec=dec)
    pt, _ = _multiclass_data(rng, 1500, k, dec=dec)
    pt = np.vstack([pt, p[:200]])
    ref = VennAbersCalibrator().predict_proba(p_cal=p, y_cal=y, p_test=pt, va_type=va_type)
    got = va.predict(va.fit(p, y, multiclass=mode), pt).p
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=ATOL)
    # A pair with s_i + s_j = 0 has the pair score 0/0: NaN in the package (sorted above every
    # calibration score), 1/2 here (no finite fitted vector can hold NaN); such rows may differ.
    # No calibration point has one: its label's score is > 0 (labels are drawn from the scores).
    zero = np.zeros(pt.shape[0], dtype=bool)
    if mode == "ovo":
        for i in range(k):
            for j in range(i + 1, k):
                zero |= pt[:, i] + pt[:, j] == 0.0
    if dec is not None and mode == "ovo":
        assert zero.any()  # the 0/0 case is exercised
    np.testing.assert_allclose(got[~zero], ref[~zero], atol=ATOL, rtol=0)


@pytest.mark.parametrize("how", ["log", "brier"])
@pytest.mark.parametrize(("seed", "k", "n_per_class", "n_folds"), [(0, 3, 60, 3), (1, 4, 40, 5)])
def test_multiclass_cvap_equals_package(how, seed, k, n_per_class, n_folds):
    """The package's estimator path (VennAbersCalibrator -> VennAbersMultiClass: one-vs-one, a
    StratifiedKFold CVAP per pair). Its folds are drawn per pair subset; with equal class counts
    divisible by n_folds they agree across pairs (checked), so one fold array reproduces them."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.repeat(np.arange(k), n_per_class)).astype(np.int64)
    p = rng.dirichlet(np.full(k, 0.8), size=y.shape[0])
    p[np.arange(y.shape[0]), y] += 0.3  # informative scores
    p /= p.sum(axis=1, keepdims=True)
    pt = rng.dirichlet(np.full(k, 0.8), size=1000)
    n = y.shape[0]
    folds = np.full(n, -1, dtype=np.int64)
    for i in range(k):
        for j in range(i + 1, k):
            sel = np.flatnonzero((y == i) | (y == j))
            fp = _stratified_folds((y[sel] == j).astype(np.int64), n_folds)
            assert ((folds[sel] == -1) | (folds[sel] == fp)).all()
            folds[sel] = fp
    table = np.vstack([p, pt])
    labels = np.concatenate([y, np.full(pt.shape[0], -1)])
    cal = VennAbersCalibrator(
        estimator=FixedScores(table=table, labels=labels),
        inductive=False,
        n_splits=n_folds,
        shuffle=False,
    )
    cal.fit(np.arange(n).reshape(-1, 1), y)
    ref = cal.predict_proba(np.arange(n, n + pt.shape[0]).reshape(-1, 1), loss=how)
    got = va.predict(va.fit(p, y, folds=folds, merge=how, multiclass="ovo"), pt).p
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# Invariants
# ----------------------------------------------------------------------------------------------
@FEW
@given(seed=SEEDS, n=st.integers(1, 60), how=st.sampled_from(["log", "brier"]), cross=st.booleans())
def test_bounds_and_monotonicity(seed, n, how, cross):
    rng = np.random.default_rng(seed)
    s, y, _ = _tie_heavy(rng, n)
    grid = np.sort(np.concatenate([s, s - 1e-9, s + 1e-9, np.linspace(-0.5, 1.5, 41)]))
    pred = va.predict(va.fit(s, y, cross=cross, n_folds=3, merge=how), grid)
    p, lo, hi = pred
    assert ((lo >= 0) & (hi <= 1) & (lo <= hi)).all()
    assert ((p > 0) & (p < 1)).all()
    if not cross or how == "brier":  # fold means contain the Brier merge, not always the log one
        assert ((lo <= p + 1e-15) & (p <= hi + 1e-15)).all()
    if not cross:  # an IVAP's p0, p1 (and p) are non-decreasing step functions of the score
        assert (np.diff(lo) >= 0).all() and (np.diff(hi) >= 0).all() and (np.diff(p) >= 0).all()
        assert (lo[grid < s.min()] == 0).all() and (hi[grid > s.max()] == 1).all()


@FEW
@given(seed=SEEDS, n=st.integers(1, 40), k=st.integers(2, 5), mode=st.sampled_from(["ovr", "ovo"]))
def test_multiclass_rows_sum_to_one(seed, n, k, mode):
    rng = np.random.default_rng(seed)
    p, y = _multiclass_data(rng, n, k, dec=2, zeros=True)
    pt, _ = _multiclass_data(rng, 30, k, zeros=True)
    out = va.predict(va.fit(p, y, multiclass=mode, cross=bool(seed % 2)), pt).p
    assert out.shape == (30, k)
    assert ((out >= 0) & (out <= 1)).all()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=ATOL)


@FEW
@given(seed=SEEDS, n=st.integers(1, 50))
def test_deterministic_and_order_free(seed, n):
    rng = np.random.default_rng(seed)
    s, y, t = _tie_heavy(rng, n)
    a = va.fit(s, y)
    np.testing.assert_array_equal(a, va.fit(s.copy(), y.copy()))
    perm = rng.permutation(n)
    np.testing.assert_array_equal(a, va.fit(s[perm], y[perm]))  # an IVAP ignores the order
    p1 = va.predict(a, t)
    p2 = va.predict(a.copy(), t.copy())
    for u, v in zip(p1, p2, strict=True):
        np.testing.assert_array_equal(u, v)
    s_in, y_in = s.copy(), y.copy()
    va.fit(s, y, cross=True)
    np.testing.assert_array_equal(s, s_in)
    np.testing.assert_array_equal(y, y_in)


def test_degenerate_windows():
    t = np.array([-1.0, 0.2, 0.5, 0.8, 2.0])
    # n = 0: vacuous [0, 1], p = 1/2, for every merge and reduction
    for how in ("log", "brier"):
        pred = va.predict(va.fit(np.empty(0), np.empty(0, np.int64), merge=how), t)
        assert (pred.p_lower == 0).all() and (pred.p_upper == 1).all() and (pred.p == 0.5).all()
    out = va.predict(va.fit(np.empty((0, 3)), np.empty(0, np.int64)), np.full((2, 3), 1 / 3)).p
    np.testing.assert_allclose(out, 1 / 3, atol=ATOL)
    # n = 1
    for label in (0, 1):
        p0, p1, _ = _p0p1(np.array([0.5]), np.array([label]), t)
        b0, b1 = naive.ivap_p0p1([0.5], [label], t)
        np.testing.assert_array_equal(p0, b0)
        np.testing.assert_array_equal(p1, b1)
    # all labels 0: p0 = 0, p1 = 1 / (1 + #{s_i >= s}); all labels 1: the mirror image
    s = np.array([0.2, 0.2, 0.5, 0.8, 0.8, 0.8])
    p0, p1, _ = _p0p1(s, np.zeros(6, np.int64), t)
    assert (p0 == 0).all()
    np.testing.assert_allclose(p1, 1.0 / (1.0 + (s[None, :] >= t[:, None]).sum(axis=1)))
    p0, p1, _ = _p0p1(s, np.ones(6, np.int64), t)
    assert (p1 == 1).all()
    np.testing.assert_allclose(p0, 1.0 - 1.0 / (1.0 + (s[None, :] <= t[:, None]).sum(axis=1)))
    # all tied: one block
    f = va.fit(np.full(5, 0.3), np.array([0, 1, 1, 0, 1]))
    assert f[5] == 1.0
    b0, b1 = naive.ivap_p0p1(np.full(5, 0.3), [0, 1, 1, 0, 1], t)
    np.testing.assert_allclose(va.predict(f, t).p_lower, b0, atol=ATOL)
    np.testing.assert_allclose(va.predict(f, t).p_upper, b1, atol=ATOL)
    # cross with fewer points than folds
    assert va.fit(np.array([0.3]), np.array([1]), cross=True, n_folds=5)[4] == 1.0


def test_shape_errors():
    with pytest.raises(ValueError):
        va.fit(np.zeros(3), np.zeros(2, np.int64))
    with pytest.raises(ValueError):
        va.fit(np.zeros(3), np.zeros(3, np.int64), merge="nope")
    f = va.fit(np.array([0.1, 0.9]), np.array([0, 1]))
    with pytest.raises(ValueError):
        va.predict(f, np.zeros((2, 2)))
    g = va.fit(np.full((3, 3), 1 / 3), np.array([0, 1, 2]))
    with pytest.raises(ValueError):
        va.predict(g, np.zeros((2, 4)))


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@FEW
@given(
    cal=st.lists(
        st.one_of(finite, st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1.0])),
        min_size=1,
        max_size=40,
    ),
    test=st.lists(
        st.one_of(finite, st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1.0])),
        min_size=1,
        max_size=40,
    ),
    seed=SEEDS,
)
def test_lookup_equals_searchsorted(cal, test, seed):
    """The bucket-index search of predict equals numpy's searchsorted on any finite floats."""
    rng = np.random.default_rng(seed)
    s = np.array(cal)
    t = np.concatenate([np.array(test), s])
    y = rng.integers(0, 2, s.shape[0])
    f = va.fit(s, y)
    k = int(f[5])
    c, f0, f1 = f[6 : 6 + k], f[6 + k : 6 + 2 * k + 1], f[6 + 2 * k + 1 :]
    pred = va.predict(f, t)
    np.testing.assert_array_equal(pred.p_lower, f0[np.searchsorted(c, t, "right")])
    np.testing.assert_array_equal(pred.p_upper, f1[np.searchsorted(c, t, "left")])


# ----------------------------------------------------------------------------------------------
# Bank reference data
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bank_ivap_equals_package():
    pl = pytest.importorskip("polars")
    path = DATA / "bank_marketing_scored.parquet"
    if not path.exists():
        pytest.skip(f"reference data {path} is absent")
    bank = pl.read_parquet(path).sort("event_id")  # event_id order = time order
    col = (
        "score_rf1000"
        if "score_rf1000" in bank.columns
        else next(c for c in bank.columns if c.startswith("score_"))
    )
    s = bank[col].to_numpy().astype(np.float64)
    y = bank["label"].to_numpy().astype(np.int64)
    cal, test = slice(0, 5000), slice(5000, None)
    p0, p1, p = _p0p1(s[cal], y[cal], s[test])
    r0, r1, rp = _package_ivap(s[cal], y[cal], s[test])
    np.testing.assert_allclose(p0, r0, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p1, r1, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p, rp, atol=ATOL, rtol=0)
    b0, b1 = naive.ivap_p0p1(s[cal], y[cal], s[test][:50])  # and the definition, on a few
    np.testing.assert_allclose(p0[:50], b0, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p1[:50], b1, atol=ATOL, rtol=0)


def test_binary_breakpoints_are_the_fit_scores_and_refuse_a_multiclass_fit():
    import numpy as np
    import pytest

    from calpipe.kernels import venn_abers

    f = venn_abers.fit(np.array([0.1, 0.4, 0.4, 0.9]), np.array([0, 1, 0, 1]))
    assert list(venn_abers.binary_breakpoints(f)) == [0.1, 0.4, 0.9]
    p3 = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    with pytest.raises(ValueError, match="not a binary Venn-ABERS fitted vector"):
        venn_abers.binary_breakpoints(venn_abers.fit(p3, np.array([0, 1, 2])))
