"""Calibrated regression (paper 004: Foster & Kakade, "Calibration via Regression", Algorithm 2),
an online calibrator of binary outcomes y_t in {0, 1} with forecasts y^_t in [0, 1].

Algorithm 2
-----------
With test functions f_t : [0, 1] -> [0, 1]^{d+1}, f_{t,0}(y^) = y^, at each step t

1. theta_t = argmin_theta sum_{tau < t} (theta . f_tau(y^_tau) - y_tau)^2 + |theta|^2
           = A_t^{-1} b_t,  A_t = I + sum_{tau < t} f_tau f_tau^T,  b_t = sum_{tau < t} y_tau f_tau;
2. forecast any y^_t with y^_t = clip_[0,1](theta_t . f_t(y^_t)) (a fixed point; it exists by
   Theorem 3.1).

Theorem 3.3 (with tau_i = sum_t f_{t,i}(y^_t)^2 + 1): for every i = 1, ..., d,

    |sum_t f_{t,i}(y^_t) (y^_t - y_t)| <= 2 sqrt(tau_i (d + 1) ln(T + 1)) <= 2 sqrt((T + 1)(d + 1) ln(T + 1)),

and Corollary 4.1 for indicator test functions x_{t,i} in {0, 1} of subsequences of length T_i:
|sum_t x_{t,i} (y^_t - y_t)| <= 2 sqrt((T_i + 1)(d + 1) ln(T + 1)).

How the base score enters (decision)
------------------------------------
Following the paper, the base model's score s_t is *context*: part of the object x_t that Reality
announces before the forecast. Test functions may depend on it because they are time-dependent
(§I, eq. (3): "this time dependence implicitly allows dependence on events that occur before time
t"), and §IV uses f_{t,i}(y^) = x_{t,i}, which "naturally generalizes to the case where x_t is
non-binary". So s_t enters as regressors f(y^, x) = s_t (and tents on s_t), never as an offset:
an offset y^ = clip(s_t + theta . f) is not Algorithm 2 and the proof of Theorem 3.3 (comparator
theta = e_0 + beta e_i) is for the plain regression on f_t. The forecast map is then implicit:
in the linear case (§IV) y^_t = (sum_{i>0} theta_i f_{t,i}) / (1 - theta_0) clipped, e.g.
(theta_1 + theta_2 s_t) / (1 - theta_0) with an intercept and the base score.

Test functions (the layout of f, index order)
---------------------------------------------
0. y^ (f_0, always: the "simple modification" of §III that makes regression calibrate);
1. y^2, ..., y^m (``powers`` = m >= 1; §I: "low order polynomials");
2. ``tents`` tents on y^, knots u_j = j / (tents - 1), width h = 1 / (tents - 1):
   max(0, 1 - |y^ - u_j| / h) (calibration in the small, §III.C: a basis of Lipschitz functions);
3. 1 if ``intercept`` (the whole sequence as a subsequence: unbiased in the large);
4. s_t if ``base_score``;
5. ``score_tents`` tents on s_t (knots as in 2.);
6. ``n_categories`` indicators [category_t = i] (calibration on subsequences, §IV).

Items 0-2 depend on y^; items 3-6 are constants of the event. All lie in [0, 1] as the theorems
require (scores are probabilities by the data contract). d + 1 = the dimension D.

Fixed point
-----------
The paper allows any fixed point. With only f_0 depending on y^ (the linear case) it is §IV's
closed form y^ = c / (1 - theta_0), c = sum_{i>0} theta_i f_i, if that lies in [0, 1], else the
end point that is one. Otherwise g(u) = theta . f(u) - u is scanned on ``CALREG_ROOT_GRID`` cells
and the first sign change is bisected to ``CALREG_BISECTION_TOL`` (the smallest interior root, a
deterministic choice), else 0 if g(0) <= 0 and 1 otherwise (proof of Theorem 3.1). That costs up
to ~100 evaluations of the y^-dependent functions per forecast (about 3 us per event for D = 9).

Numerics
--------
The state keeps the sufficient statistics A and b themselves (additions only: no drift, and a
chunked run is bit-for-bit one pass); theta is re-solved by a Cholesky factorisation of A after
each update. A = I + sum f f^T has all eigenvalues >= 1, so the factorisation never fails and the
solve is well conditioned for the small D used here (O(D^3 / 6) per event). A Sherman-Morrison
recursion on A^{-1} would be O(D^2) but accumulates rounding error and can lose positive
definiteness over long streams, and it would make the state depend on the update path.

Operations
----------
As in :mod:`calpipe.kernels.ops` (OP_STEP, OP_FORECAST, OP_UPDATE). An update regresses on
f(y^) where y^ is the forecast the current state gives the event (the fixed point, recomputed):
for OP_STEP, and for OP_FORECAST directly followed by OP_UPDATE, it is the forecast issued, so
those agree bit for bit and Algorithm 2 is run exactly. With delayed labels (other updates in
between) it is the forecast the event would get at its label time; the paper's protocol has no
delays and its bound is not claimed then.

State per stream: one float64 vector ``[n_updates, A (D x D, row-major), b (D)]`` of length
1 + D^2 + D; initial state ``[0, I, 0]`` (:func:`initial_state`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from calpipe.config import (
    CALREG_BISECTION_MAX_ITER,
    CALREG_BISECTION_TOL,
    CALREG_DEFAULT_POWERS,
    CALREG_ROOT_GRID,
)
from calpipe.kernels.numeric import cholesky_solve
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE

__all__ = [
    "OP_FORECAST",
    "OP_STEP",
    "OP_UPDATE",
    "calibrated_regression_online",
    "feature_dim",
    "feature_matrix",
    "initial_state",
]


def _check_params(powers, tents, score_tents, n_categories):
    if powers < 1:
        raise ValueError("powers must be >= 1 (f_0(y) = y is always a test function)")
    for name, v in (("tents", tents), ("score_tents", score_tents)):
        if v == 1 or v < 0:
            raise ValueError(f"{name} must be 0 or >= 2 knots")
    if n_categories < 0:
        raise ValueError("n_categories must be >= 0")


def feature_dim(
    powers: int = CALREG_DEFAULT_POWERS,
    tents: int = 0,
    intercept: bool = True,
    base_score: bool = True,
    score_tents: int = 0,
    n_categories: int = 0,
) -> int:
    """D = d + 1, the number of test functions (see the module docstring for the layout).

    >>> feature_dim(), feature_dim(powers=3, tents=5, n_categories=4)
    (3, 14)
    """
    _check_params(powers, tents, score_tents, n_categories)
    return int(powers + tents + bool(intercept) + bool(base_score) + score_tents + n_categories)


def initial_state(n_streams: int, dim: int) -> np.ndarray:
    """Initial state ``[0, I (D x D), 0 (D)]`` per stream, shape (S, 1 + D^2 + D).

    >>> initial_state(1, 2)
    array([[0., 1., 0., 0., 1., 0., 0.]])
    """
    st = np.zeros((n_streams, 1 + dim * dim + dim), dtype=np.float64)
    st[:, 1 : 1 + dim * dim] = np.eye(dim).ravel()
    return st


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _tent(t, j):
    # t = value * (knots - 1): the tent centred at knot j with a width of one spacing.
    return max(0.0, 1.0 - abs(t - j))


@njit(cache=True, inline="always")
def _dynamic(u, f, powers, tents):
    """f[0 : powers + tents] = (u, u^2, ..., u^m, tents on u)."""
    f[0] = u
    v = u
    for i in range(1, powers):
        v = v * u
        f[i] = v
    if tents > 0:
        t = u * (tents - 1)
        for j in range(tents):
            f[powers + j] = _tent(t, j)


@njit(cache=True, inline="always")
def _g(u, theta, c, f, powers, tents):
    """g(u) = theta . f(u) - u (the static part c = sum_{static i} theta_i f_i precomputed)."""
    _dynamic(u, f, powers, tents)
    acc = c
    for i in range(powers + tents):
        acc += theta[i] * f[i]
    return acc - u


@njit(cache=True, inline="always")
def _fixed_point(theta, c, f, powers, tents, grid, tol, max_iter):
    """A y^ in [0, 1] with y^ = clip(theta . f(y^)) (paper 004 Alg. 2 step 2, Theorem 3.1).

    With g(u) = theta . f(u) - u, the paper allows any fixed point; we take the smallest interior
    root (as §IV's closed form prefers the interior solution), else the end point that is one:
    0 if g(0) <= 0 (clip(theta . f(0)) = 0), else 1 (then g(1) >= 0). Linear case (f_0 the only
    function of y^): g(u) = c + (theta_0 - 1) u, root c / (1 - theta_0) (§IV). Otherwise g is
    scanned on ``grid`` equal cells and the first sign change is bisected to width ``tol``.
    """
    g0 = _g(0.0, theta, c, f, powers, tents)
    if powers == 1 and tents == 0:
        g1 = c + theta[0] - 1.0
        if (g0 < 0.0 and g1 > 0.0) or (g0 > 0.0 and g1 < 0.0):
            return min(max(c / (1.0 - theta[0]), 0.0), 1.0)
        return 0.0 if g0 <= 0.0 else 1.0
    if g0 == 0.0:
        return 0.0
    glo = g0
    for j in range(1, grid + 1):
        u = j / grid
        gu = _g(u, theta, c, f, powers, tents)
        if gu == 0.0:
            return u
        if (gu > 0.0) != (glo > 0.0):
            lo, hi = (j - 1) / grid, u
            for _ in range(max_iter):
                if hi - lo <= tol:
                    break
                mid = 0.5 * (lo + hi)
                gm = _g(mid, theta, c, f, powers, tents)
                if gm == 0.0:
                    return mid
                if (gm > 0.0) == (glo > 0.0):
                    lo, glo = mid, gm
                else:
                    hi = mid
            return 0.5 * (lo + hi)
        glo = gu
    return 0.0 if g0 < 0.0 else 1.0


@njit(cache=True)
def _calreg_online(
    p,
    y,
    cat,
    op_event,
    op_kind,
    op_offsets,
    state0,
    powers,
    tents,
    intercept,
    base_score,
    score_tents,
    n_cat,
    grid,
    tol,
    max_iter,
):
    """Calibrated regression (paper 004 Alg. 2) over the op list, all streams.

    p (n,) base scores in [0, 1]; y (n,) int64 in {0, 1}, read by updates only; cat (n,) int64
    categories (ignored if n_cat = 0); op_event (m,) int64; op_kind (m,) int8; op_offsets (S+1,);
    state0 (S, 1 + D^2 + D) = [n_updates, A, b] per stream; feature switches as in the module
    docstring. Returns (forecasts (n,), NaN where never forecast; state (S, 1 + D^2 + D)).
    """
    n = p.shape[0]
    n_streams = op_offsets.shape[0] - 1
    dim = powers + tents + intercept + base_score + score_tents + n_cat
    n_dyn = powers + tents
    out = np.full(n, np.nan)
    state = state0.copy()
    f = np.empty(dim)
    theta = np.empty(dim)
    lower = np.zeros((dim, dim))
    z = np.empty(dim)
    for s in range(n_streams):
        st = state[s]
        a = st[1 : 1 + dim * dim].reshape((dim, dim))  # views into the state row
        b = st[1 + dim * dim :]
        stale = True
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            if stale:
                cholesky_solve(
                    a, b, lower, z, theta
                )  # theta_t: ridge on the updates so far (step 1)
                stale = False
            # Static test functions of the event's context x_t (items 3-6).
            j = n_dyn
            if intercept:
                f[j] = 1.0
                j += 1
            if base_score:
                f[j] = p[e]
                j += 1
            if score_tents > 0:
                t = p[e] * (score_tents - 1)
                for i in range(score_tents):
                    f[j + i] = _tent(t, i)
                j += score_tents
            for i in range(n_cat):
                f[j + i] = 1.0 if cat[e] == i else 0.0
            c = 0.0
            for i in range(n_dyn, dim):
                c += theta[i] * f[i]
            yh = _fixed_point(theta, c, f, powers, tents, grid, tol, max_iter)
            if kind != OP_UPDATE:
                out[e] = yh
            if kind != OP_FORECAST:
                _dynamic(yh, f, powers, tents)  # f = f_t(y^_t) at the forecast
                ye = float(y[e])
                for i in range(dim):
                    fi = f[i]
                    b[i] += ye * fi
                    for k in range(dim):
                        a[i, k] += fi * f[k]
                st[0] += 1.0
                stale = True
    return out, state


@njit(cache=True)
def _thetas(states, dim):
    """theta = A^{-1} b of each state row ``[n_updates, A, b]``, solved as the kernel solves it."""
    n = states.shape[0]
    out = np.empty((n, dim))
    lower = np.zeros((dim, dim))
    z = np.empty(dim)
    theta = np.empty(dim)
    for s in range(n):
        st = states[s]
        cholesky_solve(
            st[1 : 1 + dim * dim].reshape((dim, dim)), st[1 + dim * dim :], lower, z, theta
        )
        out[s] = theta
    return out


# --------------------------------------------------------------------------------------------
# Public wrappers
# --------------------------------------------------------------------------------------------
def thetas(states: np.ndarray, dim: int) -> np.ndarray:
    """The regression coefficients theta (S, D) the next forecast of each state row (S, 1 + D^2
    + D) uses (Algorithm 2 step 1: the ridge solution A^{-1} b, by the kernel's Cholesky solve).

    >>> thetas(initial_state(1, 2), 2)  # no update yet: theta = I^{-1} 0
    array([[0., 0.]])
    """
    s = np.ascontiguousarray(states, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] != 1 + dim * dim + dim:
        raise ValueError(f"states must be (S, {1 + dim * dim + dim}) for D = {dim}")
    return _thetas(s, int(dim))


def feature_matrix(
    y_hat: np.ndarray,
    scores: np.ndarray,
    categories: np.ndarray | None = None,
    powers: int = CALREG_DEFAULT_POWERS,
    tents: int = 0,
    intercept: bool = True,
    base_score: bool = True,
    score_tents: int = 0,
    n_categories: int = 0,
) -> np.ndarray:
    """The test functions f_t(y^_t) of each event, shape (n, D), in the module's layout.

    Use it to measure the calibration errors of paper 004 Theorem 3.3,
    ``feature_matrix(...).T @ (y_hat - y)``.

    Examples
    --------
    >>> feature_matrix(np.array([0.5]), np.array([0.2]), powers=2, tents=3)
    array([[0.5 , 0.25, 0.  , 1.  , 0.  , 1.  , 0.2 ]])
    """
    _check_params(powers, tents, score_tents, n_categories)
    u = np.asarray(y_hat, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    cols = [u ** (k + 1) for k in range(powers)]

    def tent_cols(v, m):
        t = v * (m - 1)
        return [np.maximum(0.0, 1.0 - np.abs(t - j)) for j in range(m)]

    if tents:
        cols += tent_cols(u, tents)
    if intercept:
        cols.append(np.ones_like(u))
    if base_score:
        cols.append(s)
    if score_tents:
        cols += tent_cols(s, score_tents)
    if n_categories:
        cat = np.asarray(categories, dtype=np.int64)
        cols += [(cat == i).astype(np.float64) for i in range(n_categories)]
    return np.column_stack(cols) if cols else np.empty((u.shape[0], 0))


def calibrated_regression_online(
    scores: np.ndarray,
    labels: np.ndarray,
    op_event: np.ndarray,
    op_kind: np.ndarray,
    op_offsets: np.ndarray,
    state: np.ndarray,
    *,
    categories: np.ndarray | None = None,
    powers: int = CALREG_DEFAULT_POWERS,
    tents: int = 0,
    intercept: bool = True,
    base_score: bool = True,
    score_tents: int = 0,
    n_categories: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated regression (paper 004, Algorithm 2) over an operation list, all streams.

    Forecast: theta = A^{-1} b (ridge on the earlier updates), then the fixed point
    y^ = clip_[0,1](theta . f(y^)). Update: A += f(y^) f(y^)^T, b += y f(y^), n_updates += 1.

    Parameters
    ----------
    scores : ndarray of float64, shape (n,)
        Base probabilities of label 1 in [0, 1] (context x_t; unused if ``base_score`` is False
        and ``score_tents`` is 0).
    labels : ndarray of int, shape (n,)
        Labels in {0, 1}; only those of events with an update operation are read.
    op_event, op_kind, op_offsets : ndarray
        The operation list (int64 event indices, int8 kinds, int64 S + 1 stream bounds).
    state : ndarray of float64, shape (S, 1 + D^2 + D)
        ``[n_updates, A (row-major), b]`` per stream (:func:`initial_state`). Not modified.
    categories : ndarray of int64, shape (n,), optional
        Category codes in [0, n_categories) (required when ``n_categories`` > 0).
    powers, tents, intercept, base_score, score_tents, n_categories
        The test functions (module docstring); D = :func:`feature_dim` of them.

    Returns
    -------
    p : ndarray, shape (n,)
        Forecasts in [0, 1]; NaN for events never forecast.
    new_state : ndarray, shape (S, 1 + D^2 + D)

    Examples
    --------
    Only f_0 = y^ and the intercept, four labels 1: theta = 0 at first, so y^ = 0 is the fixed
    point; then f = (0, 1), A = diag(1, 2), b = (0, 1), theta = (0, 1/2) and y^ = 1/2; then
    theta = (1/7, 9/14) and y^ = (9/14) / (1 - 1/7) = 3/4 (the closed form of §IV).

    >>> p, st = calibrated_regression_online(
    ...     np.full(4, 0.5), np.array([1, 1, 1, 1]), np.arange(4), np.zeros(4, np.int8),
    ...     np.array([0, 4]), initial_state(1, 2), base_score=False)
    >>> p.round(4)
    array([0.    , 0.5   , 0.75  , 0.8732])
    >>> st[0, 0]
    np.float64(4.0)
    """
    _check_params(powers, tents, score_tents, n_categories)
    dim = feature_dim(powers, tents, intercept, base_score, score_tents, n_categories)
    p = np.ascontiguousarray(scores, dtype=np.float64)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    op_event = np.ascontiguousarray(op_event, dtype=np.int64)
    op_kind = np.ascontiguousarray(op_kind, dtype=np.int8)
    op_offsets = np.ascontiguousarray(op_offsets, dtype=np.int64)
    state = np.ascontiguousarray(state, dtype=np.float64)
    n = p.shape[0]
    if p.ndim != 1 or y.shape != (n,):
        raise ValueError("scores and labels must be 1-D with one entry per event")
    if n_categories > 0:
        if categories is None:
            raise ValueError("n_categories > 0 needs categories")
        cat = np.ascontiguousarray(categories, dtype=np.int64)
        if cat.shape != (n,):
            raise ValueError("categories must have one entry per event")
        if n and (cat.min() < 0 or cat.max() >= n_categories):
            raise ValueError(f"categories must lie in [0, {n_categories})")
    else:
        cat = np.zeros(n, dtype=np.int64)
    n_streams = op_offsets.shape[0] - 1
    if state.shape != (n_streams, 1 + dim * dim + dim):
        raise ValueError(f"state must have shape ({n_streams}, {1 + dim * dim + dim})")
    if op_event.shape != op_kind.shape:
        raise ValueError("op_event and op_kind lengths differ")
    if op_event.size and (op_event.min() < 0 or op_event.max() >= n):
        raise ValueError("op_event out of range")
    read = y[op_event[op_kind != OP_FORECAST]]
    if read.size and (read.min() < 0 or read.max() > 1):
        raise ValueError("labels of updated events must be 0 or 1")
    return _calreg_online(
        p,
        y,
        cat,
        op_event,
        op_kind,
        op_offsets,
        state,
        int(powers),
        int(tents),
        int(bool(intercept)),
        int(bool(base_score)),
        int(score_tents),
        int(n_categories),
        int(CALREG_ROOT_GRID),
        float(CALREG_BISECTION_TOL),
        int(CALREG_BISECTION_MAX_ITER),
    )
