"""Calibrated regression (calpipe.kernels.calibrated_regression) against paper 004, Algorithm 2.

The oracle is a plain per-op loop: theta = numpy.linalg.solve(I + sum f f^T, sum y f) over the
earlier updates, the test functions written from the module's layout with numpy.linspace knots,
and the fixed point y^ = clip(theta . f(y^)) by scipy's brentq in the first grid cell where
theta . f(u) - u changes sign (else the end point that is a fixed point, as in the proof of
Theorem 3.1). The paper's
guarantee (Theorem 3.3, Corollary 4.1) is checked on random and adversarial sequences, including
an adaptive adversary that sees each forecast before choosing the label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from calpipe.config import CALREG_ROOT_GRID
from calpipe.kernels import calibrated_regression as CR
from tests.kernels.ops import Ops, make_ops, step_ops

SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(max_examples=25, deadline=None)


# ----------------------------------------------------------------------------------------------
# Configurations and operation lists
# ----------------------------------------------------------------------------------------------
@dataclass
class Cfg:
    powers: int = 1
    tents: int = 0
    intercept: bool = True
    base_score: bool = True
    score_tents: int = 0
    n_categories: int = 0

    @property
    def kw(self) -> dict:
        return dict(self.__dict__)

    @property
    def dim(self) -> int:
        return CR.feature_dim(**self.kw)


def random_cfg(rng) -> Cfg:
    return Cfg(
        powers=int(rng.integers(1, 4)),
        tents=int(rng.choice([0, 0, 2, 3, 5])),
        intercept=bool(rng.random() < 0.7),
        base_score=bool(rng.random() < 0.7),
        score_tents=int(rng.choice([0, 0, 2, 4])),
        n_categories=int(rng.choice([0, 0, 1, 3])),
    )


def random_problem(seed: int):
    rng = np.random.default_rng(seed)
    cfg = random_cfg(rng)
    n = int(rng.integers(1, 100))
    s = rng.random(n)
    s[rng.random(n) < 0.1] = rng.choice([0.0, 1.0], 1)
    y = (rng.random(n) < np.clip(1.3 * s - 0.1, 0, 1)).astype(np.int64)  # miscalibrated base
    cat = rng.integers(0, max(cfg.n_categories, 1), n)
    ops = make_ops(rng, n, int(rng.integers(1, 4)))
    return rng, cfg, s, y, cat, ops


def run(s, y, cat, ops: Ops, state, cfg: Cfg):
    return CR.calibrated_regression_online(
        s, y, ops.op_event, ops.op_kind, ops.op_offsets, state,
        categories=cat if cfg.n_categories else None, **cfg.kw,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The oracle: paper 004 Algorithm 2, one op at a time
# ----------------------------------------------------------------------------------------------
def oracle_features(u: float, s: float, c: int, cfg: Cfg) -> np.ndarray:
    def tents(v, m):
        knots = np.linspace(0.0, 1.0, m)
        return [max(0.0, 1.0 - abs(v - kn) / (1.0 / (m - 1))) for kn in knots]

    f = [u**k for k in range(1, cfg.powers + 1)]  # f_0 = u, then u^2 .. u^m
    if cfg.tents:
        f += tents(u, cfg.tents)
    if cfg.intercept:
        f.append(1.0)
    if cfg.base_score:
        f.append(s)
    if cfg.score_tents:
        f += tents(s, cfg.score_tents)
    f += [1.0 if c == i else 0.0 for i in range(cfg.n_categories)]
    return np.array(f)


def oracle_fixed_point(theta, s, c, cfg: Cfg) -> float:
    """Any fixed point satisfies Algorithm 2; the module's rule picks the smallest interior root
    found on CALREG_ROOT_GRID equal cells (brentq here), else the end point that is one."""

    def g(u):
        return float(theta @ oracle_features(u, s, c, cfg)) - u

    grid = np.arange(CALREG_ROOT_GRID + 1) / CALREG_ROOT_GRID
    vals = [g(u) for u in grid]
    if vals[0] == 0:
        return 0.0
    for j in range(1, grid.size):
        if vals[j] == 0:
            return float(grid[j])
        if vals[j - 1] * vals[j] < 0:
            return brentq(g, grid[j - 1], grid[j], xtol=1e-15, rtol=4 * np.finfo(float).eps)
    return 0.0 if vals[0] < 0 else 1.0  # theta . f(0) <= 0: y^ = 0 = clip(.); else y^ = 1


def oracle(s, y, cat, ops: Ops, cfg: Cfg):
    n_streams = ops.op_offsets.shape[0] - 1
    out = np.full(s.shape[0], np.nan)
    states = []
    for st_ in range(n_streams):
        a, b, t = np.eye(cfg.dim), np.zeros(cfg.dim), 0
        for e, kind in ops.stream(st_):
            theta = np.linalg.solve(a, b)  # argmin sum (theta . f - y)^2 + |theta|^2
            yh = oracle_fixed_point(theta, s[e], cat[e], cfg)
            if kind != CR.OP_UPDATE:
                out[e] = yh
            if kind != CR.OP_FORECAST:
                f = oracle_features(yh, s[e], cat[e], cfg)
                a += np.outer(f, f)
                b += y[e] * f
                t += 1
        states.append(np.concatenate([[t], a.ravel(), b]))
    return out, np.array(states)


@FEW
@given(SEEDS)
def test_matches_oracle(seed):
    _rng, cfg, s, y, cat, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    p, state = run(s, y, cat, ops, CR.initial_state(n_streams, cfg.dim), cfg)
    want, want_state = oracle(s, y, cat, ops, cfg)
    assert np.array_equal(np.isnan(p), np.isnan(want))
    np.testing.assert_allclose(p, want, atol=1e-10, rtol=0)
    np.testing.assert_allclose(state, want_state, atol=1e-9, rtol=1e-12)


def test_linear_case_closed_form():
    """Only f_0 = y^ and constants: y^ = sum_{i>0} theta_i x_i / (1 - theta_0) (paper 004 §IV),
    checked by hand on two steps with f = (y^, 1, s)."""
    s = np.array([0.3, 0.6, 0.9])
    y = np.array([1, 0, 1])
    p, _ = run(s, y, None, step_ops(3), CR.initial_state(1, 3), Cfg())
    assert p[0] == 0.0  # theta = 0: theta . f(0) = 0 <= 0
    # After (f = (0, 1, 0.3), y = 1): A = I + f f^T, b = f; theta = A^{-1} f = f / (1 + |f|^2).
    f1 = np.array([0.0, 1.0, 0.3])
    theta = f1 / (1 + f1 @ f1)
    assert abs(p[1] - (theta[1] + theta[2] * 0.6) / (1 - theta[0])) <= 1e-15


# ----------------------------------------------------------------------------------------------
# The paper's guarantee: Theorem 3.3 and Corollary 4.1
# ----------------------------------------------------------------------------------------------
ADVERSARIES = ["iid", "halves", "blocks", "contrarian", "category_contrarian", "chaser"]


def play(seed: int, adversary: str, cfg: Cfg, t_len: int):
    """One stream of OP_STEPs; an adaptive adversary sees y^_t (the kernel's forecast with the
    state carried, one call per operation) before choosing y_t; an oblivious one fixes the labels
    in advance. Returns scores, categories, labels, forecasts."""
    rng = np.random.default_rng(seed)
    s = rng.random(t_len)
    cat = rng.integers(0, max(cfg.n_categories, 1), t_len)
    y = np.zeros(t_len, np.int64)
    if adversary == "iid":
        y = (rng.random(t_len) < s**2).astype(np.int64)
    elif adversary == "halves":  # paper 004 footnote 1: 0s, then 1s
        y[t_len // 2 :] = 1
    elif adversary == "blocks":
        y = np.repeat(rng.integers(0, 2, t_len), rng.integers(1, 30, t_len))[:t_len]
    if adversary in ("iid", "halves", "blocks"):  # oblivious: one pass
        return s, cat, y, run(s, y, cat, step_ops(t_len), CR.initial_state(1, cfg.dim), cfg)[0]
    state = CR.initial_state(1, cfg.dim)
    forecasts = np.empty(t_len)
    one = Ops(np.zeros(1, np.int64), np.full(1, CR.OP_FORECAST, np.int8), np.array([0, 1]))
    upd = Ops(one.op_event, np.full(1, CR.OP_UPDATE, np.int8), one.op_offsets)
    thresholds = rng.random(max(cfg.n_categories, 1))
    for t in range(t_len):
        ev = (s[t : t + 1], y[t : t + 1], cat[t : t + 1])
        forecasts[t] = run(*ev, one, state, cfg)[0][0]
        if adversary == "contrarian":  # the label the forecast says is less likely
            y[t] = int(forecasts[t] < 0.5)
        elif adversary == "category_contrarian":
            y[t] = int(forecasts[t] < thresholds[cat[t]])
        elif adversary == "chaser":  # 1 whenever the forecast falls below the base score
            y[t] = int(forecasts[t] < s[t])
        _, state = run(s[t : t + 1], y[t : t + 1], cat[t : t + 1], upd, state, cfg)
    return s, cat, y, forecasts


@settings(max_examples=40, deadline=None)
@given(SEEDS, st.sampled_from(ADVERSARIES), st.integers(1, 400))
def test_paper_calibration_bound(seed, adversary, t_len):
    """Paper 004 Theorem 3.3: for each test function i = 1..d,
    |sum_t f_{t,i}(y^_t)(y^_t - y_t)| <= 2 sqrt(tau_i (d + 1) ln(T + 1)) <= 2 sqrt((T + 1)(d + 1)
    ln(T + 1)), tau_i = sum_t f_{t,i}^2 + 1; for an indicator (a category, or the intercept = the
    whole sequence) tau_i = T_i + 1: Corollary 4.1. For f_0 = y^ itself the same proof with the
    comparator theta = (1 + beta) e_0 (|theta|^2 = (1 + beta)^2 instead of 1 + beta^2) gives
    |sum_t y^_t (y^_t - y_t) + 1| <= 2 sqrt(tau_0 (d + 1) ln(T + 1))."""
    rng = np.random.default_rng(seed)
    cfg = random_cfg(rng)
    if adversary in ("iid", "halves", "blocks"):
        t_len *= 25  # oblivious sequences run in one call: longer, where a bias Omega(T) shows
    s, cat, y, forecasts = play(seed, adversary, cfg, t_len)
    # The step-by-step play is one pass of the kernel (chunked = one pass).
    p, _ = run(s, y, cat, step_ops(t_len), CR.initial_state(1, cfg.dim), cfg)
    assert np.array_equal(p, forecasts)
    f = CR.feature_matrix(p, s, cat if cfg.n_categories else None, **cfg.kw)
    err = f.T @ (p - y)
    tau = (f**2).sum(axis=0) + 1.0
    d1 = cfg.dim  # d + 1
    log_t = np.log(t_len + 1.0)
    bound = 2.0 * np.sqrt(tau * d1 * log_t)
    assert np.all(np.abs(err[1:]) <= bound[1:])
    assert np.all(bound <= 2.0 * np.sqrt((t_len + 1.0) * d1 * log_t) * (1 + 1e-12))
    assert abs(err[0] + 1.0) <= bound[0]
    if cfg.intercept:  # unbiased in the large: Corollary 4.1 with T_i = T
        col = cfg.powers + cfg.tents
        assert abs((p - y).sum()) <= 2.0 * np.sqrt((t_len + 1) * d1 * log_t)
        assert np.all(f[:, col] == 1.0)
    for i in range(cfg.n_categories):  # each category is a subsequence (§IV)
        m = cat == i
        assert abs((p[m] - y[m]).sum()) <= 2.0 * np.sqrt((m.sum() + 1) * d1 * log_t)


def test_bound_binds_where_plain_regression_fails():
    """Paper 004 footnote 1: on 0s then 1s, online ridge without f_0 = y^ (the historical average)
    has bias Omega(T); calibrated regression keeps it within 2 sqrt((T+1)(d+1) ln(T+1))."""
    t_len = 2000
    y = np.zeros(t_len, np.int64)
    y[t_len // 2 :] = 1
    s = np.full(t_len, 0.5)
    cfg = Cfg(base_score=False)
    p, _ = run(s, y, None, step_ops(t_len), CR.initial_state(1, cfg.dim), cfg)
    bias = abs((p - y).sum())
    assert bias <= 2.0 * np.sqrt((t_len + 1) * 2 * np.log(t_len + 1))
    ridge = np.array([y[:t].sum() / (1.0 + t) for t in range(t_len)])  # Algorithm 1, x_t = 1
    assert abs((ridge - y).sum()) > 3 * bias


# ----------------------------------------------------------------------------------------------
# Invariants
# ----------------------------------------------------------------------------------------------
@FEW
@given(SEEDS)
def test_prequential(seed):
    rng, cfg, s, y, cat, _ = random_problem(seed)
    n = s.size
    ops = step_ops(n)
    st0 = CR.initial_state(1, cfg.dim)
    p, _ = run(s, y, cat, ops, st0, cfg)
    j = int(rng.integers(0, n))
    y2 = y.copy()
    y2[j] = 1 - y[j]
    p2, _ = run(s, y2, cat, ops, st0, cfg)
    assert np.array_equal(p[: j + 1], p2[: j + 1])


@FEW
@given(SEEDS)
def test_chunked_equals_one_pass(seed):
    rng, cfg, s, y, cat, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    st0 = CR.initial_state(n_streams, cfg.dim)
    full, full_state = run(s, y, cat, ops, st0, cfg)
    n_chunks = int(rng.integers(1, 5))
    cuts = [
        np.sort(rng.integers(0, len(ops.stream(k)) + 1, n_chunks - 1)) for k in range(n_streams)
    ]
    state = st0
    out = np.full(s.size, np.nan)
    for c in range(n_chunks):
        ev, kind, off = [], [], [0]
        for k in range(n_streams):
            bounds = [0, *cuts[k].tolist(), len(ops.stream(k))]
            part = ops.stream(k)[bounds[c] : bounds[c + 1]]
            ev += [e for e, _ in part]
            kind += [kk for _, kk in part]
            off.append(len(ev))
        chunk = Ops(np.array(ev, np.int64), np.array(kind, np.int8), np.array(off, np.int64))
        r, state = run(s, y, cat, chunk, state, cfg)
        out[~np.isnan(r)] = r[~np.isnan(r)]
    assert np.array_equal(full, out, equal_nan=True)
    assert np.array_equal(full_state, state)


@FEW
@given(SEEDS)
def test_forecast_then_update_equals_step(seed):
    _rng, cfg, s, y, cat, _ = random_problem(seed)
    n = s.size
    split = Ops(
        np.repeat(np.arange(n, dtype=np.int64), 2),
        np.tile(np.array([CR.OP_FORECAST, CR.OP_UPDATE], np.int8), n),
        np.array([0, 2 * n], np.int64),
    )
    st0 = CR.initial_state(1, cfg.dim)
    a = run(s, y, cat, step_ops(n), st0, cfg)
    b = run(s, y, cat, split, st0, cfg)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@FEW
@given(SEEDS)
def test_streams_independent_and_in_unit_interval(seed):
    _rng, cfg, s, y, cat, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    full, full_state = run(s, y, cat, ops, CR.initial_state(n_streams, cfg.dim), cfg)
    seen = ~np.isnan(full)
    assert np.all((full[seen] >= 0) & (full[seen] <= 1))
    for k in range(n_streams):
        lo, hi = ops.op_offsets[k], ops.op_offsets[k + 1]
        alone = Ops(ops.op_event[lo:hi], ops.op_kind[lo:hi], np.array([0, hi - lo]))
        r, st_ = run(s, y, cat, alone, CR.initial_state(1, cfg.dim), cfg)
        mine = np.unique(ops.op_event[lo:hi])
        assert np.array_equal(full[mine], r[mine])
        assert np.array_equal(full_state[k], st_[0])


@FEW
@given(SEEDS)
def test_state_is_the_regression_statistics(seed):
    """After OP_STEPs, state = [T, I + F^T F, F^T y] with F = feature_matrix(forecasts)."""
    _rng, cfg, s, y, cat, _ = random_problem(seed)
    n = s.size
    p, state = run(s, y, cat, step_ops(n), CR.initial_state(1, cfg.dim), cfg)
    f = CR.feature_matrix(p, s, cat if cfg.n_categories else None, **cfg.kw)
    want = np.concatenate([[n], (np.eye(cfg.dim) + f.T @ f).ravel(), f.T @ y])
    np.testing.assert_allclose(state[0], want, rtol=1e-12, atol=1e-12)


def test_inputs_not_written():
    rng = np.random.default_rng(5)
    cfg = Cfg(tents=3, n_categories=2)
    s, y, cat = rng.random(40), rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    ops = make_ops(rng, 40, 2)
    st0 = CR.initial_state(2, cfg.dim)
    arrays = (s, y, cat, ops.op_event, ops.op_kind, ops.op_offsets, st0)
    copies = [a.copy() for a in arrays]
    run(s, y, cat, ops, st0, cfg)
    for a, b in zip(arrays, copies, strict=True):
        assert np.array_equal(a, b)
