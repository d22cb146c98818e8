"""Platt scaling, beta calibration and temperature scaling (calpipe.kernels.parametric).

Oracles:

* Platt: scikit-learn's unpenalised ``LogisticRegression`` (newton-cg, tol 1e-15) on the same
  feature logit(clip(p)); Platt's smoothed targets through sample weights (each event once as
  label 1 with weight t_i and once as label 0 with weight 1 - t_i); the stationarity of the
  log-likelihood written out by hand.
* Beta: the betacal package itself (its code, rules and features) with its
  ``LogisticRegression(C=99999999999)`` converged tightly (monkeypatched tol 1e-15), for every
  parameterisation, including data that trigger its negative-coefficient refits; and the stock
  package (lbfgs, tol 1e-4, so only to ~1e-3).
* Temperature: the log loss written as a loop over events, minimised by scipy's bounded
  ``minimize_scalar`` and on a dense grid of 1/T.

Tolerances asserted (reached in brackets): Platt coefficients 1e-7 relative [4e-9] and
probabilities 1e-8 [1.2e-9] against sklearn; beta (a, b, c) 1e-6 relative [8e-8] and
probabilities 1e-7 [2.2e-8] against tight betacal, 5e-3 [6e-4] against stock betacal; 1/T 1e-6
relative [1e-7, the bounded search's own accuracy on a flat loss; the loss agrees to 1e-13
relative]. The gaps to sklearn/betacal are the ridge (1e-10 on the mean loss), which moves
weakly determined coefficients of small sets by up to ~1e-7.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from calpipe import config
from calpipe.kernels import parametric as K

SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(max_examples=40, deadline=None)
DATA = Path(
    os.environ.get("CALPIPE_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
)
BANK = DATA / "bank_marketing_scored.parquet"


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _binary_data(seed: int, n: int | None = None, edge: float = 0.05):
    """Scores with exact 0s and 1s, labels from a beta-calibration truth (a, b, c) at random."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400)) if n is None else n
    s = rng.beta(0.8, 0.8, n)
    at_edge = rng.random(n) < edge
    s[at_edge] = rng.integers(0, 2, at_edge.sum()).astype(float)
    a, b, c = rng.uniform(0.2, 3.0), rng.uniform(0.2, 3.0), rng.normal(0.0, 0.7)
    ps = np.clip(s, 1e-9, 1 - 1e-9)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(ps) - b * np.log1p(-ps) + c)))
    y = (rng.random(n) < truth).astype(np.int64)
    return s, y


def _logit_clip(s: np.ndarray, eps: float) -> np.ndarray:
    p = np.clip(s, eps, 1 - eps)
    return np.log(p) - np.log1p(-p)


def _sk_logreg(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None, **kw):
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LogisticRegression(
            C=np.inf, solver="newton-cg", tol=1e-15, max_iter=100000, **kw
        ).fit(x, y, sample_weight=w)


def _mean_log_loss(p: np.ndarray, y: np.ndarray, clip: float = 0.0) -> float:
    p = np.clip(p, clip, 1 - clip)
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.where(y == 1, np.log(p), np.log1p(-p))))


# ----------------------------------------------------------------------------------------------
# Platt scaling
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(8))
def test_platt_matches_sklearn(seed):
    s, y = _binary_data(seed)
    fitted = K.platt_fit(s, y)
    z = _logit_clip(s, config.PLATT_CLIP_EPS)
    ref = _sk_logreg(z[:, None], y)
    theta_ref = np.array([ref.coef_[0, 0], ref.intercept_[0]])
    np.testing.assert_allclose(fitted[:2], theta_ref, rtol=1e-7, atol=1e-7)
    assert fitted[2] == config.PLATT_CLIP_EPS
    new = np.random.default_rng(seed + 1000).uniform(0, 1, 300)
    new[:4] = [0.0, 1.0, 1e-15, 1 - 1e-15]
    p_ref = ref.predict_proba(_logit_clip(new, config.PLATT_CLIP_EPS)[:, None])[:, 1]
    np.testing.assert_allclose(K.platt_predict(fitted, new).p, p_ref, rtol=0, atol=1e-8)


@pytest.mark.parametrize("seed", range(4))
def test_platt_targets_match_weighted_sklearn(seed):
    s, y = _binary_data(seed, n=25 + 10 * seed)
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))  # Platt 1999 eq. (3)
    z = _logit_clip(s, config.PLATT_CLIP_EPS)
    ref = _sk_logreg(
        np.r_[z, z][:, None], np.r_[np.ones_like(y), np.zeros_like(y)], np.r_[t, 1.0 - t]
    )
    fitted = K.platt_fit(s, y, platt_targets=True)
    np.testing.assert_allclose(
        fitted[:2], [ref.coef_[0, 0], ref.intercept_[0]], rtol=1e-7, atol=1e-7
    )
    assert not np.allclose(fitted[:2], K.platt_fit(s, y)[:2], atol=1e-3)


def _platt_gradient(s, y, a, b, eps):
    """Mean gradient of the unpenalised log loss in (a, b), one event at a time."""
    ga = gb = 0.0
    for si, yi in zip(s.tolist(), y.tolist(), strict=True):
        p = min(max(si, eps), 1 - eps)
        z = math.log(p) - math.log1p(-p)
        r = _sigmoid(a * z + b) - yi
        ga += r * z
        gb += r
    return ga / len(s), gb / len(s)


@FEW
@given(seed=SEEDS, n=st.integers(2, 120), edge=st.sampled_from([0.0, 0.2]))
@example(seed=27758, n=4, edge=0.2)  # near-separable: (a, b) = (1.5, -18.3) along a flat ridge
def test_platt_is_stationary_and_monotone(seed, n, edge):
    s, y = _binary_data(seed, n=n, edge=edge)
    fitted = K.platt_fit(s, y)
    a, b, eps = fitted
    assert np.all(np.isfinite(fitted))
    # stationarity of mean log loss + lambda/2 (a^2 + b'^2), b' = b + a zbar the intercept at
    # the mean feature: d/db' = gb + lambda b' = 0 and d/da = ga - zbar gb + lambda a = 0
    ga, gb = _platt_gradient(s, y, a, b, eps)
    zbar = float(np.mean(_logit_clip(s, eps)))
    lam = config.LOGREG_RIDGE_MEAN
    tol = 1e-12 * (1.0 + abs(zbar)) * (1.0 + abs(a) + abs(b))
    assert abs(gb + lam * (b + a * zbar)) <= tol
    assert abs(ga - zbar * gb + lam * a) <= tol * (1.0 + abs(zbar))
    grid = np.r_[0.0, np.sort(np.random.default_rng(seed).uniform(0, 1, 200)), 1.0]
    p = K.platt_predict(fitted, grid).p
    assert np.all((p >= 0) & (p <= 1))
    if a >= 0:  # Platt promises monotonicity only for a >= 0
        assert np.all(np.diff(p) >= 0)
    np.testing.assert_array_equal(K.platt_fit(s, y), fitted)  # deterministic
    # row order only changes the sums' rounding: the same map. Compared as maps, not as (a, b):
    # on a near-separable set the objective is flat (curvature ~ the ridge) along a line of
    # (a, b), where Newton's stopping rule leaves ~1e-8 of parameter noise with no effect on p
    perm = np.random.default_rng(seed).permutation(n)
    p_perm = K.platt_predict(K.platt_fit(s[perm], y[perm]), grid).p
    np.testing.assert_allclose(p_perm, p, rtol=0, atol=1e-7)


def test_platt_degenerate_sets():
    x = np.linspace(0.01, 0.99, 100)
    ones, zeros = np.ones(100, np.int64), np.zeros(100, np.int64)
    for s, y, check in [
        (x, ones, lambda p: p.min() > 1 - 1e-8),  # one class: the MLE is p' = 1
        (x, zeros, lambda p: p.max() < 1e-8),
        (np.array([0.3]), np.array([1]), lambda p: p.min() > 1 - 1e-8),  # n = 1
        (np.full(50, 0.3), (np.arange(50) < 20).astype(np.int64), lambda p: np.allclose(p, 0.4)),
        (np.zeros(10), np.r_[np.ones(3), np.zeros(7)].astype(np.int64), lambda p: True),
        # separable: steep but finite
        (x, (x > 0.5).astype(np.int64), lambda p: p[49] < 1e-3 and p[50] > 1 - 1e-3),
    ]:
        fitted = K.platt_fit(s, y)
        assert np.all(np.isfinite(fitted))
        p_cal = K.platt_predict(fitted, s).p
        assert check(p_cal), (s[:3], y[:3], p_cal[:3])
        p = K.platt_predict(fitted, np.array([0.0, 1e-300, 0.5, 1.0])).p
        assert np.all(np.isfinite(p) & (p >= 0) & (p <= 1))
    tied = K.platt_fit(np.full(50, 0.3), (np.arange(50) < 20).astype(np.int64))
    assert abs(tied[0]) < 1e-12  # all tied: slope 0, a constant map (mean label 0.4)
    # Platt's targets: one class of N gives the constant (N + 1) / (N + 2), not 1
    fitted = K.platt_fit(x, ones, platt_targets=True)
    np.testing.assert_allclose(K.platt_predict(fitted, x).p, 101 / 102, atol=1e-7)
    fitted = K.platt_fit(x, zeros, platt_targets=True)
    np.testing.assert_allclose(K.platt_predict(fitted, x).p, 1 / 102, atol=1e-7)


def test_platt_predict_is_the_formula():
    fitted = np.array([1.7, -0.4, 1e-6])
    s = np.array([0.0, 1e-7, 0.2, 0.5, 0.9, 1.0])
    expect = [
        _sigmoid(1.7 * math.log(p / (1 - p)) - 0.4) for p in np.clip(s, 1e-6, 1 - 1e-6).tolist()
    ]
    np.testing.assert_allclose(K.platt_predict(fitted, s).p, expect, rtol=1e-13)
    np.testing.assert_allclose(K.platt_predict(np.array([1.0, 0.0, 1e-12]), s[2:5]).p, s[2:5])


def test_platt_rejects_bad_shapes():
    with pytest.raises(ValueError):
        K.platt_fit(np.zeros((3, 2)), np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        K.platt_fit(np.zeros(3), np.zeros(2, np.int64))
    with pytest.raises(ValueError):
        K.platt_fit(np.zeros(3), np.array([0, 1, 2]))
    with pytest.raises(ValueError):
        K.platt_fit(np.zeros(0), np.zeros(0, np.int64))
    with pytest.raises(ValueError):
        K.platt_predict(np.zeros(4), np.zeros(3))


# ----------------------------------------------------------------------------------------------
# Beta calibration
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def tight_betacal(monkeypatch):
    """betacal.BetaCalibration with its LogisticRegression(C=99999999999) converged tightly."""
    import betacal
    import betacal.beta_calibration as bc
    from sklearn.linear_model import LogisticRegression

    monkeypatch.setattr(
        bc,
        "LogisticRegression",
        functools.partial(LogisticRegression, solver="newton-cg", tol=1e-15, max_iter=100000),
    )
    return betacal.BetaCalibration


def _betacal_abc(model, parameters: str) -> np.ndarray:
    """(a, b, c) of a fitted betacal model in p' = sigmoid(a ln p - b ln(1 - p) + c)."""
    cal = model.calibrator_
    a, b, _ = cal.map_
    if parameters == "ab":
        return np.array([a, b, (a - b) * math.log(2.0)])
    if parameters == "a":
        return np.array([a, b, 0.0])
    return np.array([a, b, cal.lr_.intercept_[0]])


def _beta_data(seed: int, a: float, b: float, n: int = 300):
    rng = np.random.default_rng(seed)
    s = rng.beta(0.8, 0.8, n)
    s[:3] = [0.0, 1.0, 0.5]
    ps = np.clip(s, 1e-9, 1 - 1e-9)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(ps) - b * np.log1p(-ps) + rng.normal(0, 0.5))))
    return s, (rng.random(n) < truth).astype(np.int64)


#: (true a, true b): ordinary, and the two negative-coefficient refits of betacal's "abm"
BETA_CASES = [(1.5, 0.7), (0.4, 2.5), (-1.5, 2.0), (2.0, -1.5)]


@pytest.mark.parametrize("parameters", ["abm", "ab", "am", "a"])
@pytest.mark.parametrize("case", range(len(BETA_CASES)))
def test_beta_matches_tight_betacal(tight_betacal, parameters, case):
    s, y = _beta_data(case, *BETA_CASES[case])
    ref = tight_betacal(parameters).fit(s, y)
    fitted = K.beta_fit(s, y, parameters=parameters)
    assert fitted[3] == config.BETA_CLIP_EPS
    np.testing.assert_allclose(fitted[:3], _betacal_abc(ref, parameters), rtol=1e-6, atol=1e-6)
    new = np.r_[0.0, 1.0, 1e-300, np.random.default_rng(case).uniform(0, 1, 200)]
    np.testing.assert_allclose(K.beta_predict(fitted, new).p, ref.predict(new), atol=1e-7)
    if parameters == "abm" and case == 2:
        assert fitted[0] == 0.0 and fitted[1] > 0  # refit without ln p
    if parameters == "abm" and case == 3:
        assert fitted[1] == 0.0 and fitted[0] > 0  # refit without -ln(1 - p)


@pytest.mark.parametrize("parameters", ["abm", "ab", "am"])
def test_beta_matches_stock_betacal_loosely(parameters):
    """The package as shipped stops lbfgs at tol 1e-4: the same map to ~1e-3."""
    import betacal

    for seed in range(3):
        s, y = _binary_data(seed, n=400)
        ref = betacal.BetaCalibration(parameters).fit(s, y)
        p = K.beta_predict(K.beta_fit(s, y, parameters=parameters), s).p
        np.testing.assert_allclose(p, ref.predict(s), atol=5e-3)


def test_beta_am_is_platt_on_the_same_clip():
    s, y = _binary_data(3)
    am = K.beta_fit(s, y, parameters="am")
    platt = K.platt_fit(s, y, eps=config.BETA_CLIP_EPS)
    assert am[0] == am[1]
    np.testing.assert_array_equal(am[[0, 2]], platt[:2])  # Kull et al. §3.2: am = logistic


def test_beta_predict_is_the_formula():
    a, b, c, eps = 1.3, 0.6, -0.2, 1e-9
    s = np.array([0.0, 1e-12, 0.1, 0.5, 0.99, 1.0])
    ps = np.clip(s, eps, 1 - eps).tolist()
    # Kull et al. 2017 eq. (3): 1 / (1 + 1 / (e^c p^a / (1 - p)^b))
    expect = [1.0 / (1.0 + 1.0 / (math.exp(c) * p**a / (1 - p) ** b)) for p in ps]
    np.testing.assert_allclose(
        K.beta_predict(np.array([a, b, c, eps]), s).p, expect, rtol=1e-12, atol=1e-300
    )
    s = np.array([0.01, 0.3, 0.7])
    np.testing.assert_allclose(K.beta_predict(np.array([1.0, 1.0, 0.0, eps]), s).p, s)


@FEW
@given(
    seed=SEEDS,
    n=st.integers(1, 150),
    parameters=st.sampled_from(["abm", "ab", "am", "a"]),
    edge=st.sampled_from([0.0, 0.3]),
)
def test_beta_invariants(seed, n, parameters, edge):
    s, y = _binary_data(seed, n=n, edge=edge)
    fitted = K.beta_fit(s, y, parameters=parameters)
    a, b = fitted[0], fitted[1]
    assert np.all(np.isfinite(fitted))
    if parameters == "abm" and (a == 0.0 or b == 0.0):
        assert a >= 0 or b >= 0  # the package's rule zeroes the negative coefficient
    if parameters in ("am", "a"):
        assert a == b
    grid = np.r_[0.0, np.sort(np.random.default_rng(seed).uniform(0, 1, 200)), 1.0]
    p = K.beta_predict(fitted, grid).p
    assert np.all((p >= 0) & (p <= 1))
    if a >= 0 and b >= 0:  # monotone non-decreasing when both exponents are >= 0
        assert np.all(np.diff(p) >= 0)
    np.testing.assert_array_equal(K.beta_fit(s, y, parameters=parameters), fitted)


def test_beta_degenerate_sets():
    x = np.linspace(0.0, 1.0, 101)
    for parameters in ["abm", "ab", "am", "a"]:
        for s, y in [
            (x, np.ones(101, np.int64)),
            (x, np.zeros(101, np.int64)),
            (np.array([0.3]), np.array([0])),
            (np.full(40, 0.8), (np.arange(40) < 10).astype(np.int64)),
            (np.r_[np.zeros(5), np.ones(5)], np.r_[np.zeros(5), np.ones(5)].astype(np.int64)),
            (x, (x > 0.5).astype(np.int64)),
        ]:
            fitted = K.beta_fit(s, y, parameters=parameters)
            assert np.all(np.isfinite(fitted)), (parameters, s[:3], y[:3])
            p = K.beta_predict(fitted, np.r_[s, 0.0, 1.0]).p
            assert np.all(np.isfinite(p) & (p >= 0) & (p <= 1))
    tied = K.beta_fit(np.full(40, 0.8), (np.arange(40) < 10).astype(np.int64))
    assert abs(tied[0]) < 1e-12 and abs(tied[1]) < 1e-12  # all tied: a constant map at 1/4
    np.testing.assert_allclose(K.beta_predict(tied, np.array([0.1, 0.9])).p, 0.25, atol=1e-8)
    with pytest.raises(ValueError):
        K.beta_fit(x, np.ones(101, np.int64), parameters="bm")


# ----------------------------------------------------------------------------------------------
# Temperature scaling
# ----------------------------------------------------------------------------------------------
def _temperature_loss(inv_t: float, scores: np.ndarray, labels: np.ndarray, eps: float) -> float:
    """Summed log loss of softmax(inv_t ln max(p, eps)), one event at a time (Guo et al. 2017)."""
    total = 0.0
    for row, y in zip(scores.tolist(), labels.tolist(), strict=True):
        z = [inv_t * math.log(max(v, eps)) for v in row]
        m = max(z)
        total += m + math.log(sum(math.exp(v - m) for v in z)) - z[y]
    return total


def _multiclass_data(seed: int, n: int, k: int, temperature: float, edge: float = 0.05):
    rng = np.random.default_rng(seed)
    s = rng.dirichlet(np.full(k, rng.uniform(0.3, 3.0)), n)
    for i in np.flatnonzero(rng.random(n) < edge):
        s[i] = 0.0
        s[i, rng.integers(0, k)] = 1.0
    q = np.maximum(s, 1e-6) ** (1 / temperature)
    q /= q.sum(axis=1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in q], dtype=np.int64)
    return s, y


@pytest.mark.parametrize(("seed", "k", "temperature"), [(0, 2, 0.5), (1, 3, 2.0), (2, 5, 1.3)])
def test_temperature_matches_scipy_and_grid(seed, k, temperature):
    from scipy.optimize import minimize_scalar

    s, y = _multiclass_data(seed, 300, k, temperature)
    fitted = K.temperature_fit(s, y)
    eps = config.TEMPERATURE_CLIP_EPS
    assert fitted[1] == eps
    ref = minimize_scalar(
        lambda b: _temperature_loss(b, s, y, eps),
        bounds=(0.0, 50.0),
        method="bounded",
        options={"xatol": 1e-10},
    )
    np.testing.assert_allclose(fitted[0], ref.x, rtol=1e-6)
    loss = _temperature_loss(fitted[0], s, y, eps)
    assert loss <= ref.fun + 1e-9 * abs(ref.fun)
    grid = np.linspace(0.01, 5.0, 500)
    assert loss <= min(_temperature_loss(b, s, y, eps) for b in grid) + 1e-12
    # stationarity: central difference of the loop loss
    h = 1e-5 * fitted[0]
    slope = (
        _temperature_loss(fitted[0] + h, s, y, eps) - _temperature_loss(fitted[0] - h, s, y, eps)
    ) / (2 * h)
    assert abs(slope) < 1e-5 * len(y)


@FEW
@given(
    seed=SEEDS,
    n=st.integers(1, 80),
    k=st.integers(2, 5),
    temperature=st.sampled_from([0.3, 1.0, 3.0]),
    edge=st.sampled_from([0.0, 0.3]),
)
def test_temperature_invariants(seed, n, k, temperature, edge):
    s, y = _multiclass_data(seed, n, k, temperature, edge)
    fitted = K.temperature_fit(s, y)
    assert np.all(np.isfinite(fitted))
    assert config.TEMPERATURE_MIN_INV_T <= fitted[0] <= config.TEMPERATURE_MAX_INV_T
    p = K.temperature_predict(fitted, s).p
    assert p.shape == s.shape
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    # the fit is no worse than T = 1 and than any 1/T on a grid (convexity, global optimum)
    eps = config.TEMPERATURE_CLIP_EPS
    loss = _temperature_loss(fitted[0], s, y, eps)
    for b in [config.TEMPERATURE_MIN_INV_T, 0.5, 1.0, 2.0, 10.0]:
        assert loss <= _temperature_loss(b, s, y, eps) + 1e-9 * (1 + abs(loss))
    np.testing.assert_array_equal(K.temperature_fit(s, y), fitted)


@FEW
@given(seed=SEEDS, n=st.integers(1, 80))
def test_temperature_binary_is_k2_and_monotone(seed, n):
    s, y = _binary_data(seed, n=n, edge=0.2)
    fitted = K.temperature_fit(s, y)
    stacked = np.stack([1.0 - s, s], axis=1)
    np.testing.assert_array_equal(fitted, K.temperature_fit(stacked, y))
    grid = np.r_[0.0, np.sort(np.random.default_rng(seed).uniform(0, 1, 100)), 1.0]
    p = K.temperature_predict(fitted, grid).p
    assert p.shape == grid.shape
    np.testing.assert_array_equal(
        p, K.temperature_predict(fitted, np.stack([1 - grid, grid], axis=1)).p[:, 1]
    )
    assert np.all(np.diff(p) >= 0)
    # binary temperature scaling is sigmoid((ln max(p, eps) - ln max(1 - p, eps)) / T)
    eps = fitted[1]
    expect = [
        _sigmoid(fitted[0] * (math.log(max(v, eps)) - math.log(max(1 - v, eps))))
        for v in grid.tolist()
    ]
    np.testing.assert_allclose(p, expect, atol=1e-12)


def test_temperature_degenerate_sets():
    rng = np.random.default_rng(5)
    s = rng.dirichlet(np.ones(3), 50)
    # uniform rows: the loss does not depend on T; the identity 1/T = 1 is kept
    assert K.temperature_fit(np.full((10, 3), 1 / 3), rng.integers(0, 3, 10))[0] == 1.0
    # labels always the argmin: anti-informative; 1/T stops at its floor, nearly flat forecasts
    fitted = K.temperature_fit(s, s.argmin(axis=1))
    assert fitted[0] == config.TEMPERATURE_MIN_INV_T
    np.testing.assert_allclose(K.temperature_predict(fitted, s).p, 1 / 3, atol=0.02)
    # argmax always right: the minimiser is at 1/T = infinity, capped
    assert K.temperature_fit(s, s.argmax(axis=1))[0] == config.TEMPERATURE_MAX_INV_T
    # n = 1, one class, exact 0/1 entries
    for scores, labels in [
        (s[:1], np.array([1])),
        (s, np.zeros(50, np.int64)),
        (np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]), np.array([1, 1, 2])),
        (np.array([0.0, 1.0, 1.0, 0.0]), np.array([0, 0, 1, 1])),
    ]:
        fitted = K.temperature_fit(scores, labels)
        assert np.all(np.isfinite(fitted))
        p = K.temperature_predict(fitted, scores).p
        assert np.all(np.isfinite(p) & (p >= 0) & (p <= 1))
    with pytest.raises(ValueError):
        K.temperature_fit(s, np.full(50, 3))
    with pytest.raises(ValueError):
        K.temperature_fit(s[:, :1], np.zeros(50, np.int64))


def test_temperature_of_anti_informative_scores_keeps_the_argmax():
    # regression: 1/T = 0 made every forecast exactly uniform, so argmax ties went to class 0
    rng = np.random.default_rng(12)
    s = rng.dirichlet(np.ones(4), 200)
    fitted = K.temperature_fit(s, s.argmin(axis=1))
    p = K.temperature_predict(fitted, s).p
    np.testing.assert_array_equal(p.argmax(axis=1), s.argmax(axis=1))
    binary = rng.uniform(0.05, 0.95, 200)
    fb = K.temperature_fit(binary, (binary < 0.5).astype(np.int64))
    pb = K.temperature_predict(fb, binary).p
    np.testing.assert_array_equal(pb > 0.5, binary > 0.5)


# ----------------------------------------------------------------------------------------------
# The bank data (shared/data/bank_marketing_scored.parquet)
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("column", ["score_rf1000", "score_rf100"])
def test_bank_fit_first_5000_apply_to_rest(column):
    if not BANK.exists():
        pytest.skip(f"reference data {BANK} is absent (shared/data beside the repository)")
    bank = pl.read_parquet(BANK).sort("event_id")
    s = bank[column].to_numpy().astype(np.float64)
    y = bank["label"].to_numpy().astype(np.int64)
    fit_s, fit_y, rest_s, rest_y = s[:5000], y[:5000], s[5000:], y[5000:]
    for name, fit, predict, eps in [
        ("platt", K.platt_fit, K.platt_predict, config.PLATT_CLIP_EPS),
        ("beta", K.beta_fit, K.beta_predict, config.BETA_CLIP_EPS),
        ("temperature", K.temperature_fit, K.temperature_predict, config.TEMPERATURE_CLIP_EPS),
    ]:
        fitted = fit(fit_s, fit_y)
        # in sample the fit is no worse than the identity map (a member of each family)
        in_sample = _mean_log_loss(predict(fitted, fit_s).p, fit_y)
        assert in_sample <= _mean_log_loss(np.clip(fit_s, eps, 1 - eps), fit_y) + 1e-9, name
        # out of sample (the base rate drifts from 5 % to 15 %): finite clipped log loss
        out = _mean_log_loss(predict(fitted, rest_s).p, rest_y, clip=config.DEFAULT_CLIP_EPS)
        assert np.isfinite(out) and out < 1.0, name
