"""Online scaling with calibeating: Gupta & Ramdas, "Online Platt Scaling with Calibeating"
(ICML 2023), over the operation list of :mod:`calpipe.kernels.ops`, all streams in one call.

Public entry point: :func:`online_scaling`. The calibrators are in
:mod:`calpipe.calibrators.online_scaling`; the per-event oracles in ``tests/naive_online_scaling.py``.

Scaling model (the expert)
--------------------------
A parametric map m_theta of the base forecast p with logit m_theta(p) = theta . u(p):

=========  ============================================  ======================  ===============
model      u(p)                                          identity theta           source
=========  ============================================  ======================  ===============
platt      (logit p, 1)                                  (1, 0)                   G&R eq. (2)
beta       (ln p, -ln(1 - p), 1)                         (1, 1, 0)                G&R §5 (Kull 2017)
vector     K classes: z_k = a_k ln p_k + b_k, softmax    a = 1, b = 0             Guo et al. 2017
matrix     K classes: z = W ln p + b, softmax            W = I, b = 0             Guo et al. 2017
none       no model: the expert is p itself              -                        (histogram binning)
=========  ============================================  ======================  ===============

p is clipped to [clip, 1 - clip] inside u (K classes: each p_k floored at clip, renormalised), the
bounded-feature assumption of the regret bound. theta is learnt by the Online Newton Step
(G&R Algorithm 1; Hazan 2016, Algorithm 12) on the log loss l_t(theta) = -ln m_theta(p_t)(y_t),
starting at the identity theta_1:

    g_t = grad l_t(theta_t) = (m_theta_t(p_t) - y_t) u(p_t)         (K: (q - e_y) (x) (ln p, 1))
    A_t = A_{t-1} + g_t g_t^T,   A_0 = rho I
    theta_{t+1} = Pi_{||theta|| <= B}^{A_t} (theta_t - A_t^{-1} g_t / gamma)

where Pi^A is the projection in the norm of A: argmin_{||x|| <= B} (y - x)^T A (y - x) =
(A + lambda I)^{-1} A y for the lambda >= 0 that puts it on the sphere, found by bisection.
Regret (Hazan 2016, Thm. 4.5, the log loss being exp-concave on the bounded set):
sum_t l_t(theta_t) - min_{||theta|| <= B} sum_t l_t(theta) = O(d log T).

Matrix scaling (K classes; ``oms``): theta = (W row-major, b), d = K^2 + K, logits
z_c = sum_j W_cj ln q_j + b_c with q the floored, renormalised row (as vector scaling's), the
softmax's log loss -ln softmax(z)_y, gradient dl/dW_cj = (f_c - [c = y]) ln q_j,
dl/db_c = f_c - [c = y] (the multinomial logistic regression's on the features (ln q, 1)). It is
the same G&R Algorithm 1 / Hazan Algorithm 12 recursion above over the full K^2 + K parameters:
A is (K^2 + K) x (K^2 + K), solved by Cholesky every label and factored again at each
bisection step of a projection. Cost per label O(d^3 / 3) = O(K^6 / 3) flops (K = 7: d = 56,
~0.06 Mflop, measured ~45 us; K = 10: d = 110, ~0.5 Mflop, ~0.3 ms; K = 16: d = 272, ~4.6 ms;
vector scaling: under 10 us) and a state of d + d^2 doubles per stream (K = 10: 12,210 doubles,
98 KB); :data:`calpipe.config.OMS_MAX_CLASSES` bounds K. The softmax of
W ln q + b is a log-loss exp-concave model on the bounded ball, so Hazan's Thm. 4.5 gives the
O(d log T) regret against the best fixed (W, b) with ||theta|| <= B as for vector scaling.
Vector scaling is matrix scaling with W diagonal: the matrix model contains it, at K^2 - K more
parameters (a regret term K^2 + K instead of 2K times the log).

Calibeating (binary; G&R §3, Foster & Hart 2023)
-----------------------------------------------
The expert's forecast e_t falls in one of ``n_bins`` equal-width bins b_t of [0, 1].

* tracking: forecast the mean label of the earlier events of bin b_t (e_t itself if none);
* hedging: in each bin, Foster's (1999) calibrated forecaster on the grid of bin midpoints
  m_i = (i + 1/2) / n_bins. With rho_i = sum over earlier events of the bin of w_i (y - m_i),
  Foster's rule forecasts at a sign change rho_i >= 0 >= rho_{i+1}, weight
  q = |rho_{i+1}| / (rho_i + |rho_{i+1}|) on m_i and 1 - q on m_{i+1} (or m_0 if rho_0 < 0,
  m_last if rho_last > 0), so that the expected increment of ||rho||^2 is O(1 / n_bins): any
  sign change will do. calpipe takes the one nearest the expert's own grid point m_b: all
  weight on m_b while rho_b = 0 (a fresh bin starts at its midpoint, not at m_0), else the
  first sign change going up from b if rho_b > 0 (m_last if none), down from b - 1 if
  rho_b < 0 (m_0 if none). Foster's forecaster draws m_i with these probabilities; calpipe
  forecasts their mean and updates rho with the weights w (the expectation of the randomised
  forecaster: deterministic and reproducible; by concavity of ln its log loss is at most the
  randomised forecaster's expected log loss).

Operations: at a forecast (OP_FORECAST, or the forecast half of OP_STEP) the expert and the
calibeating forecast are computed from the current state; at an update (OP_UPDATE, or the
update half of OP_STEP) the calibeating statistics, then theta and A, learn the label. Sums
run in op order, so k chunks with the state carried equal one pass bit for bit.

Example
-------
>>> import numpy as np
>>> from calpipe.kernels.ops import OP_STEP
>>> x = np.array([0.9, 0.9, 0.9, 0.9]); y = np.array([0, 0, 0, 0])
>>> theta, a, beat = initial_state(1, MODEL_PLATT, 2, CALIBEAT_NONE, 10, 100.0)
>>> p, *_ = online_scaling(x, y, np.arange(4), np.full(4, OP_STEP, np.int8),
...                        np.array([0, 4]), theta, a, beat, MODEL_PLATT, CALIBEAT_NONE,
...                        0.1, 100.0, 0.01, 10)
>>> p.round(3).tolist()  # starts at the identity (logit 0.9), then learns the zeros
[0.9, 0.845, 0.776, 0.699]
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from calpipe.kernels.numeric import cholesky_solve, sigmoid
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

MODEL_PLATT, MODEL_BETA, MODEL_VECTOR, MODEL_NONE, MODEL_MATRIX = 0, 1, 2, 3, 4
CALIBEAT_NONE, CALIBEAT_TRACKING, CALIBEAT_HEDGING = 0, 1, 2
#: Bisection steps of the projection's multiplier: stops earlier once the bracket cannot shrink.
_PROJECTION_STEPS = 200


def n_params(model: int, n_classes: int) -> int:
    """d, the length of theta."""
    return {MODEL_PLATT: 2, MODEL_BETA: 3, MODEL_VECTOR: 2 * n_classes, MODEL_NONE: 0,
            MODEL_MATRIX: n_classes * n_classes + n_classes}[model]  # fmt: skip


def beat_width(calibeat: int, n_bins: int) -> int:
    """Calibeating statistics per bin: (sum y, count) for tracking, rho (n_bins) for hedging."""
    return {CALIBEAT_NONE: 0, CALIBEAT_TRACKING: 2, CALIBEAT_HEDGING: n_bins}[calibeat]


def initial_state(n_streams, model, n_classes, calibeat, n_bins, rho):
    """(theta (S, d), A (S, d, d), calibeating statistics (S, n_bins, W)) of fresh streams."""
    d = n_params(model, n_classes)
    theta = np.zeros((n_streams, d))
    if model == MODEL_PLATT:
        theta[:, 0] = 1.0
    elif model == MODEL_BETA:
        theta[:, :2] = 1.0
    elif model == MODEL_VECTOR:
        theta[:, :n_classes] = 1.0
    elif model == MODEL_MATRIX:  # W = I (row-major: W_cc at c (K + 1)), b = 0
        theta[:, : n_classes * n_classes : n_classes + 1] = 1.0
    a = np.zeros((n_streams, d, d))
    for i in range(d):
        a[:, i, i] = rho
    w = beat_width(calibeat, n_bins)
    return theta, a, np.zeros((n_streams, n_bins if w else 0, w))


@njit(cache=True)
def _binary_features(p, model, clip, u):
    q = min(max(p, clip), 1.0 - clip)
    if model == MODEL_PLATT:
        u[0] = math.log(q / (1.0 - q))
        u[1] = 1.0
    else:
        u[0] = math.log(q)
        u[1] = -math.log(1.0 - q)
        u[2] = 1.0


@njit(cache=True, inline="always")
def _softmax_in_place(out, k, zmax):
    """out[:k] <- softmax(out[:k]), ``zmax`` its largest entry (the shift against overflow)."""
    s = 0.0
    for c in range(k):
        out[c] = math.exp(out[c] - zmax)
        s += out[c]
    for c in range(k):
        out[c] /= s


@njit(cache=True)
def _vector_forecast(row, theta, clip, lnq, out):
    """Vector scaling of one K-class score row: lnq = ln of the floored, renormalised row."""
    k = row.shape[0]
    tot = 0.0
    for c in range(k):
        tot += max(row[c], clip)
    zmax = -np.inf
    for c in range(k):
        lnq[c] = math.log(max(row[c], clip) / tot)
        z = theta[c] * lnq[c] + theta[k + c]
        out[c] = z
        zmax = max(zmax, z)
    _softmax_in_place(out, k, zmax)


@njit(cache=True)
def _matrix_forecast(row, theta, clip, lnq, out):
    """Matrix scaling of one K-class score row: softmax(W lnq + b), lnq = ln of the floored,
    renormalised row, theta = (W row-major, b)."""
    k = row.shape[0]
    tot = 0.0
    for c in range(k):
        tot += max(row[c], clip)
    for c in range(k):
        lnq[c] = math.log(max(row[c], clip) / tot)
    zmax = -np.inf
    for c in range(k):
        z = 0.0
        for j in range(k):
            z += theta[c * k + j] * lnq[j]
        z += theta[k * k + c]
        out[c] = z
        zmax = max(zmax, z)
    _softmax_in_place(out, k, zmax)


@njit(cache=True)
def project_kernel(theta, a, radius, shifted, rhs, lower, z, out):
    """theta <- argmin_{||x|| <= radius} (theta - x)^T A (theta - x) (in place)."""
    d = theta.shape[0]
    norm2 = 0.0
    for i in range(d):
        norm2 += theta[i] * theta[i]
    if norm2 <= radius * radius:
        return
    for i in range(d):  # rhs = A theta
        s = 0.0
        for j in range(d):
            s += a[i, j] * theta[j]
        rhs[i] = s
    lo, hi = 0.0, 1.0
    while _norm2_at(hi, a, rhs, shifted, lower, z, out) > radius * radius:
        hi *= 2.0
    for _ in range(_PROJECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _norm2_at(mid, a, rhs, shifted, lower, z, out) > radius * radius:
            lo = mid
        else:
            hi = mid
    _norm2_at(hi, a, rhs, shifted, lower, z, out)
    for i in range(d):
        theta[i] = out[i]


@njit(cache=True)
def _norm2_at(lam, a, rhs, shifted, lower, z, out):
    """||x||^2 for x = (A + lam I)^{-1} rhs (x left in ``out``)."""
    d = rhs.shape[0]
    for i in range(d):
        for j in range(d):
            shifted[i, j] = a[i, j]
        shifted[i, i] += lam
    cholesky_solve(shifted, rhs, lower, z, out)
    s = 0.0
    for i in range(d):
        s += out[i] * out[i]
    return s


@njit(cache=True)
def _hedge_weights(rho, b, w):
    """Foster's (1999) weights on the grid midpoints from bin ``b``'s rho (see the module)."""
    m = rho.shape[0]
    for i in range(m):
        w[i] = 0.0
    if rho[b] == 0.0:
        w[b] = 1.0
        return
    if rho[b] > 0.0:
        for i in range(b, m - 1):
            if rho[i] >= 0.0 >= rho[i + 1]:
                _split(rho, i, w)
                return
        w[m - 1] = 1.0
    else:
        for i in range(b - 1, -1, -1):
            if rho[i] >= 0.0 >= rho[i + 1]:
                _split(rho, i, w)
                return
        w[0] = 1.0


@njit(cache=True)
def _calibeat_values(beat, calibeat, n_bins):
    out = np.full((beat.shape[0], n_bins), np.nan)
    w = np.zeros(n_bins)
    mids = (np.arange(n_bins) + 0.5) / n_bins  # as _online_scaling computes them
    for s in range(beat.shape[0]):
        for b in range(n_bins):
            if calibeat == CALIBEAT_TRACKING:
                if beat[s, b, 1] > 0.0:
                    out[s, b] = beat[s, b, 0] / beat[s, b, 1]
            else:
                _hedge_weights(beat[s, b], b, w)
                v = 0.0
                for i in range(n_bins):
                    v += w[i] * mids[i]
                out[s, b] = v
    return out


def calibeat_table(beat: np.ndarray, calibeat: int, n_bins: int) -> np.ndarray:
    """The calibeating forecast of an expert forecast f in bin b = min(floor(f n_bins),
    n_bins - 1), per stream and bin, from the statistics ``beat`` (S, n_bins, W): the bin's mean
    label (tracking; NaN while the bin is empty: f itself is forecast) or Foster's forecast
    (hedging), exactly as :func:`online_scaling` forecasts them. (S, n_bins)."""
    if calibeat not in (CALIBEAT_TRACKING, CALIBEAT_HEDGING):
        raise ValueError(f"no calibeating table for calibeat code {calibeat}")
    b = np.ascontiguousarray(beat, dtype=np.float64)
    if b.ndim != 3 or b.shape[1] != n_bins:
        raise ValueError(f"beat must be (S, {n_bins}, W), got {b.shape}")
    return _calibeat_values(b, calibeat, n_bins)


@njit(cache=True, inline="always")
def _split(rho, i, w):
    # rho_i >= 0 >= rho_{i+1}, not both 0 (one of them is rho_b != 0 or a sign change)
    q = -rho[i + 1] / (rho[i] - rho[i + 1])
    w[i] = q
    w[i + 1] = 1.0 - q


@njit(cache=True)
def _online_scaling(
    x, y, op_event, op_kind, op_offsets, theta0, a0, beat0,
    model, calibeat, gamma, radius, clip, n_bins,
):  # fmt: skip
    n_streams = op_offsets.shape[0] - 1
    multiclass = x.ndim == 2
    k = x.shape[1] if multiclass else 2
    d = theta0.shape[1]
    theta_all = theta0.copy()
    a_all = a0.copy()
    beat_all = beat0.copy()
    p_out = np.full(x.shape, np.nan)
    u = np.zeros(max(d, k))
    g = np.zeros(d)
    step = np.zeros(d)
    rhs = np.zeros(d)
    shifted = np.zeros((d, d))
    lower = np.zeros((d, d))
    z = np.zeros(d)
    out = np.zeros(d)
    f_vec = np.zeros(k)
    w = np.zeros(n_bins)
    mids = (np.arange(n_bins) + 0.5) / n_bins
    for s in range(n_streams):
        theta = theta_all[s]
        a = a_all[s]
        beat = beat_all[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            # -- the expert's forecast from the current state
            if multiclass:
                if model == MODEL_MATRIX:
                    _matrix_forecast(x[e], theta, clip, u, f_vec)
                else:
                    _vector_forecast(x[e], theta, clip, u, f_vec)
                if kind != OP_UPDATE:
                    for c in range(k):
                        p_out[e, c] = f_vec[c]
            else:
                if model == MODEL_NONE:
                    f = x[e]
                else:
                    _binary_features(x[e], model, clip, u)
                    zz = 0.0
                    for i in range(d):
                        zz += theta[i] * u[i]
                    f = sigmoid(zz)
                forecast = f
                # (a guard: a state of finite theta cannot give NaN here, and the calibrator
                # refuses a NaN forecast after the call; int(NaN) read out of bounds)
                b = min(max(int(f * n_bins), 0), n_bins - 1) if f == f else 0
                if calibeat == CALIBEAT_TRACKING:
                    if beat[b, 1] > 0.0:
                        forecast = beat[b, 0] / beat[b, 1]
                elif calibeat == CALIBEAT_HEDGING:
                    _hedge_weights(beat[b], b, w)
                    forecast = 0.0
                    for i in range(n_bins):
                        forecast += w[i] * mids[i]
                if f != f:  # a NaN expert forecasts NaN, not its bin 0's value
                    forecast = f
                if kind != OP_UPDATE:
                    p_out[e] = forecast
            if kind == OP_FORECAST:
                continue
            # -- learn the label: calibeating statistics, then the ONS step
            lab = y[e]
            if not multiclass:
                if calibeat == CALIBEAT_TRACKING:
                    beat[b, 0] += lab
                    beat[b, 1] += 1.0
                elif calibeat == CALIBEAT_HEDGING:
                    for i in range(n_bins):
                        beat[b, i] += w[i] * (lab - mids[i])
                if model == MODEL_NONE:
                    continue
                for i in range(d):
                    g[i] = (f - lab) * u[i]
            elif model == MODEL_MATRIX:
                for c in range(k):
                    r = f_vec[c] - (1.0 if c == lab else 0.0)
                    for j in range(k):
                        g[c * k + j] = r * u[j]
                    g[k * k + c] = r
            else:
                for c in range(k):
                    r = f_vec[c] - (1.0 if c == lab else 0.0)
                    g[c] = r * u[c]
                    g[k + c] = r
            for i in range(d):
                for j in range(d):
                    a[i, j] += g[i] * g[j]
            cholesky_solve(a, g, lower, z, step)
            for i in range(d):
                theta[i] -= step[i] / gamma
            project_kernel(theta, a, radius, shifted, rhs, lower, z, out)
    return p_out, theta_all, a_all, beat_all


@njit(cache=True, inline="always")
def ons_step(t0, t1, t2, a00, a01, a11, a02, a12, a22, r, u0, u1, beta, gamma):
    """One online Newton step of a binary OPS / OBS (G&R Algorithm 1; Hazan 2016, Algorithm 12)
    before its projection: with the gradient g = r (u0, u1[, 1]) of the log loss (r = f - y, the
    features u of the score), A <- A + g g^T and theta <- theta - A^{-1} g / gamma, A^{-1} as the
    adjugate of the symmetric A over its determinant. ``beta``: three parameters (OBS), else two
    (``t2``, ``a02``, ``a12``, ``a22`` pass through). Returns the new theta, A and |theta|^2
    (the caller projects on the ball when it exceeds radius^2). Inlined: the per-stream kernel
    and the lanes kernel (``expert_lanes``) run these same operations, so their bits agree."""
    g0 = r * u0
    g1 = r * u1
    a00 += g0 * g0
    a01 += g0 * g1
    a11 += g1 * g1
    if beta:
        g2 = r
        a02 += g0 * g2
        a12 += g1 * g2
        a22 += g2 * g2
        c00 = a11 * a22 - a12 * a12  # adjugate of the symmetric A
        c01 = a02 * a12 - a01 * a22
        c02 = a01 * a12 - a02 * a11
        c11 = a00 * a22 - a02 * a02
        c12 = a01 * a02 - a00 * a12
        c22 = a00 * a11 - a01 * a01
        det = a00 * c00 + a01 * c01 + a02 * c02
        t0 -= (c00 * g0 + c01 * g1 + c02 * g2) / det / gamma
        t1 -= (c01 * g0 + c11 * g1 + c12 * g2) / det / gamma
        t2 -= (c02 * g0 + c12 * g1 + c22 * g2) / det / gamma
        norm2 = t0 * t0 + t1 * t1 + t2 * t2
    else:
        det = a00 * a11 - a01 * a01
        t0 -= (a11 * g0 - a01 * g1) / det / gamma
        t1 -= (a00 * g1 - a01 * g0) / det / gamma
        norm2 = t0 * t0 + t1 * t1
    return t0, t1, t2, a00, a01, a11, a02, a12, a22, norm2


@njit(cache=True, inline="always")
def store_iterate(theta, a, t0, t1, t2, a00, a01, a11, a02, a12, a22, beta):
    """The iterate held in scalars (:func:`ons_step`) into the vector ``theta`` and the
    symmetric matrix ``a`` (d = 2, or 3 with ``beta``)."""
    theta[0], theta[1] = t0, t1
    a[0, 0], a[0, 1], a[1, 0], a[1, 1] = a00, a01, a01, a11
    if beta:
        theta[2] = t2
        a[0, 2], a[2, 0], a[1, 2], a[2, 1], a[2, 2] = a02, a02, a12, a12, a22


@njit(cache=True, inline="always")
def project_scalars(
    t0, t1, t2, a00, a01, a11, a02, a12, a22, beta, radius, theta, a, shifted, rhs, lower, z, out
):
    """:func:`project_kernel` of the iterate held in scalars, through the scratch ``theta`` and
    ``a`` (d = 2, or 3 with ``beta``): the projected theta (the per-stream kernel and the lanes
    kernel project so, operation for operation)."""
    store_iterate(theta, a, t0, t1, t2, a00, a01, a11, a02, a12, a22, beta)
    project_kernel(theta, a, radius, shifted, rhs, lower, z, out)
    return theta[0], theta[1], theta[2] if beta else t2


@njit(cache=True)
def _ons_binary(x, y, op_event, op_kind, op_offsets, theta0, a0, model, gamma, radius, clip):
    """:func:`_online_scaling` for binary Platt (d = 2) and beta (d = 3) scaling without
    calibeating, in scalar registers: the ONS step A += g g^T, theta -= A^{-1} g / gamma solves
    the 2x2 / 3x3 system by its adjugate (A stays SPD: it starts at rho I and only gains g g^T)
    instead of a Cholesky factorisation, ~4x faster; same recursion, equal to rounding. The
    projection (rare: ||theta|| > radius) goes through :func:`project_kernel` on arrays."""
    n_streams = op_offsets.shape[0] - 1
    beta = model == MODEL_BETA
    d = 3 if beta else 2
    theta_all = theta0.copy()
    a_all = a0.copy()
    p_out = np.full(x.shape, np.nan)
    rhs = np.zeros(d)
    shifted = np.zeros((d, d))
    lower = np.zeros((d, d))
    zz = np.zeros(d)
    out = np.zeros(d)
    for s in range(n_streams):
        th = theta_all[s]
        a = a_all[s]
        t0, t1 = th[0], th[1]
        t2 = th[2] if beta else 0.0
        a00, a01, a11 = a[0, 0], a[0, 1], a[1, 1]
        a02 = a[0, 2] if beta else 0.0
        a12 = a[1, 2] if beta else 0.0
        a22 = a[2, 2] if beta else 0.0
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            q = min(max(x[e], clip), 1.0 - clip)
            if beta:
                u0 = math.log(q)
                u1 = -math.log(1.0 - q)
                z = t0 * u0 + t1 * u1 + t2
            else:
                u0 = math.log(q / (1.0 - q))
                u1 = 1.0
                z = t0 * u0 + t1
            f = sigmoid(z)
            if kind != OP_UPDATE:
                p_out[e] = f
            if kind == OP_FORECAST:
                continue
            t0, t1, t2, a00, a01, a11, a02, a12, a22, norm2 = ons_step(
                t0, t1, t2, a00, a01, a11, a02, a12, a22, f - y[e], u0, u1, beta, gamma
            )
            if norm2 > radius * radius:  # the generalised projection on the ball
                t0, t1, t2 = project_scalars(
                    t0, t1, t2, a00, a01, a11, a02, a12, a22, beta, radius,
                    th, a, shifted, rhs, lower, zz, out,
                )  # fmt: skip
        store_iterate(th, a, t0, t1, t2, a00, a01, a11, a02, a12, a22, beta)
    return p_out, theta_all, a_all


def online_scaling(
    x, y, op_event, op_kind, op_offsets, theta0, a0, beat0,
    model, calibeat, gamma, radius, clip, n_bins,
):  # fmt: skip
    """Forecasts of every forecast op and the new state, all streams of a batch in one call.

    Parameters
    ----------
    x : (n,) binary base forecasts P(y = 1), or (n, K) class probabilities (model ``vector``
        or ``matrix``).
    y : (n,) int labels (read at update ops only).
    op_event, op_kind, op_offsets : the operation list (:mod:`calpipe.kernels.ops`).
    theta0, a0, beat0 : (S, d), (S, d, d), (S, n_bins, W) state (:func:`initial_state`).
    model, calibeat : ``MODEL_*`` and ``CALIBEAT_*`` codes (calibeating needs a binary x).
    gamma, radius, clip, n_bins : ONS step 1/gamma, projection radius B, feature clip, bins.

    Returns
    -------
    p : forecasts, shaped like ``x`` (NaN for events without a forecast op);
    theta, a, beat : the new state (the inputs are not modified).
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    multiclass = x.ndim == 2
    if multiclass and (model not in (MODEL_VECTOR, MODEL_MATRIX) or calibeat != CALIBEAT_NONE):
        raise ValueError("K-class scores take model=MODEL_VECTOR or MODEL_MATRIX without "
                         "calibeating")  # fmt: skip
    if not multiclass and model in (MODEL_VECTOR, MODEL_MATRIX):
        raise ValueError("model=MODEL_VECTOR / MODEL_MATRIX needs (n, K) scores")
    d = theta0.shape[-1]
    if multiclass and d != n_params(model, x.shape[1]):
        raise ValueError(f"theta0 holds {d} parameters; the model on K = {x.shape[1]} classes "
                         f"has {n_params(model, x.shape[1])}")  # fmt: skip
    if not (gamma > 0 and radius > 0 and 0 < clip < 0.5 and n_bins >= 1):
        raise ValueError("need gamma > 0, radius > 0, 0 < clip < 0.5 and n_bins >= 1")
    if not multiclass and calibeat == CALIBEAT_NONE and model in (MODEL_PLATT, MODEL_BETA):
        p, theta, a = _ons_binary(
            x, np.ascontiguousarray(y, dtype=np.float64),
            np.ascontiguousarray(op_event, dtype=np.int64),
            np.ascontiguousarray(op_kind, dtype=np.int8),
            np.ascontiguousarray(op_offsets, dtype=np.int64),
            np.ascontiguousarray(theta0, dtype=np.float64),
            np.ascontiguousarray(a0, dtype=np.float64),
            int(model), float(gamma), float(radius), float(clip),
        )  # fmt: skip
        return p, theta, a, np.array(beat0, dtype=np.float64)
    return _online_scaling(
        x, np.ascontiguousarray(y, dtype=np.float64),
        np.ascontiguousarray(op_event, dtype=np.int64),
        np.ascontiguousarray(op_kind, dtype=np.int8),
        np.ascontiguousarray(op_offsets, dtype=np.int64),
        np.ascontiguousarray(theta0, dtype=np.float64),
        np.ascontiguousarray(a0, dtype=np.float64),
        np.ascontiguousarray(beat0, dtype=np.float64),
        int(model), int(calibeat), float(gamma), float(radius), float(clip), int(n_bins),
    )  # fmt: skip
