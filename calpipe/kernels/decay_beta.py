r"""Beta calibration refitted on exponentially forgotten score-bin counts (``decay-beta``).

The windowed batch method ``beta`` refits Kull et al.'s (2017) beta calibration on the trailing
W labels: its state holds the window (2W floats). This kernel keeps, per stream, only the labels'
counts in B fixed bins of the base log-odds, each count multiplied by lambda = 1 - 2/W at every
label (an exponential window whose effective sample size (1 + lambda)/(1 - lambda) ~ W matches
the trailing window's), and refits the same model on the bin centres:

.. math::

    n^{y}_b \leftarrow \lambda\, n^{y}_b + [b = b(p_t)][y = y_t] \quad (y \in \{0, 1\}),\qquad
    (a, b, c) = \arg\max \sum_b n^1_b \ln\sigma(z_b) + n^0_b \ln(1 - \sigma(z_b))
    - \tfrac{\rho}{2}\lVert (a, b, c) - (1, 1, 0)\rVert^2,

with :math:`z_b = a \ln \bar p_b - b \ln(1 - \bar p_b) + c` at bin centre :math:`\bar p_b`; as in
Kull et al.'s ``betacal``, a negative a (or b) is fixed at 0 and the rest refitted (the map stays
monotone). Forecast: :math:`\sigma(a \ln q - b \ln(1 - q) + c)`, q the score clipped to
[eps, 1 - eps]; before ``warmup`` labels, the base itself. A refit happens after label ``warmup``
and every ``refit_every`` labels after it, warm-started from the previous fit (Newton's method
with step halving: the optimum is unique for rho > 0). The state is O(B): [u, a, b, c, g,
g n^1 (B), g n^0 (B)], the counts kept multiplied by g = lambda^-(labels since the last rescale)
so that decaying all bins costs one division per label.

Public entry point: :func:`decay_beta`; the calibrator is
:class:`calpipe.calibrators.decay.DecayBeta`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from calpipe import config
from calpipe.kernels.numeric import sigmoid
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

_HEAD = 5  # u, a, b, c, g
_RESCALE = config.DECAY_BETA_RESCALE  # a literal in the compiled kernel


@njit(cache=True)
def _objective(w, x1, x2, pos, neg, rho, ez):
    """Penalised negative log-likelihood of the binned data; ``ez[k]`` receives the exponential
    that sigmoid(z_k) takes (e^-z for z >= 0, else e^z: :func:`calpipe.kernels.numeric.sigmoid`),
    which the loss computes anyway: the next Newton step's gradient at this w reads it instead
    of calling exp again (the same libm call on the same z, so the same value).

    A bin's term of a label it has no count of (n = 0) is not evaluated: 0 * l is +0 for the
    finite l >= 0 that a finite z gives, so the sum is the same to the bit; a non-finite z still
    evaluates both (0 * inf is NaN, as before)."""
    f = 0.5 * rho * ((w[0] - 1.0) ** 2 + (w[1] - 1.0) ** 2 + w[2] ** 2)
    for k in range(x1.shape[0]):
        if pos[k] + neg[k] <= 0.0:
            continue
        z = w[0] * x1[k] + w[1] * x2[k] + w[2]
        finite = z - z == 0.0
        need_p = pos[k] != 0.0 or not finite
        need_n = neg[k] != 0.0 or not finite
        # -ln sigma(z) = log1p(e^-z), -ln(1 - sigma(z)) = log1p(e^z), overflow-free
        lp = 0.0
        ln = 0.0
        if z >= 0.0:
            em = math.exp(-z)  # z > -30: the exp of lp
            ez[k] = em
            if need_p:
                lp = math.log1p(em)
            if need_n:
                ln = math.log1p(math.exp(z)) if z < 30.0 else z
        else:
            ep = math.exp(z)  # z < 30 (or NaN): the exp of ln
            ez[k] = ep
            if need_n:
                ln = math.log1p(ep) if z < 30.0 else z
            if need_p:
                lp = math.log1p(math.exp(-z)) if z > -30.0 else -z
        f += (pos[k] * lp if need_p else 0.0) + (neg[k] * ln if need_n else 0.0)
    return f


@njit(cache=True)
def _newton(w, free, x1, x2, pos, neg, rho, max_iter, tol):
    """Minimise :func:`_objective` over the coordinates with ``free`` set, from ``w`` (in
    place): Newton steps with step halving."""
    g = np.zeros(3)
    h = np.zeros((3, 3))
    ez = np.empty(x1.shape[0])  # the exponentials of sigmoid(z_k) at the last w evaluated
    cur = _objective(w, x1, x2, pos, neg, rho, ez)
    for _ in range(max_iter):
        g[:] = 0.0
        h[:, :] = 0.0
        g[0] = rho * (w[0] - 1.0)
        g[1] = rho * (w[1] - 1.0)
        g[2] = rho * w[2]
        for i in range(3):
            h[i, i] = rho
        for k in range(x1.shape[0]):
            m = pos[k] + neg[k]
            if m <= 0.0:
                continue
            # sigmoid(z_k) with its exp from _objective at this w (the last one evaluated:
            # the start, or the accepted trial)
            z = w[0] * x1[k] + w[1] * x2[k] + w[2]
            e = ez[k]
            s = 1.0 / (1.0 + e) if z >= 0.0 else e / (1.0 + e)
            r = m * s - pos[k]  # d/dz of the loss
            v = m * s * (1.0 - s)
            xs = (x1[k], x2[k], 1.0)
            for i in range(3):
                g[i] += r * xs[i]
                for j in range(3):
                    h[i, j] += v * xs[i] * xs[j]
        for i in range(3):  # fixed coordinates: identity rows, zero gradient
            if not free[i]:
                g[i] = 0.0
                for j in range(3):
                    h[i, j] = 0.0
                    h[j, i] = 0.0
                h[i, i] = 1.0
        step = np.linalg.solve(h, g)
        t = 1.0
        trial = w - step
        new = _objective(trial, x1, x2, pos, neg, rho, ez)
        while new > cur and t > 1e-10:
            t *= 0.5
            trial = w - t * step
            new = _objective(trial, x1, x2, pos, neg, rho, ez)
        if new > cur:
            break
        done = np.max(np.abs(trial - w)) < tol
        w[:] = trial
        cur = new
        if done:
            break


@njit(cache=True)
def fit_kernel(w, x1, x2, pos, neg, rho, max_iter, tol):
    """The full model, then betacal's rule: a negative a or b is fixed at 0 and the rest
    refitted (the more negative first), so the map is non-decreasing."""
    free = np.ones(3, dtype=np.bool_)
    _newton(w, free, x1, x2, pos, neg, rho, max_iter, tol)
    for _ in range(2):
        if w[0] >= 0.0 and w[1] >= 0.0:
            break
        i = 0 if w[0] < w[1] else 1
        free[i] = False
        w[i] = 0.0
        _newton(w, free, x1, x2, pos, neg, rho, max_iter, tol)


@njit(cache=True, inline="always")
def forget_and_count(v, g_at, pos, neg, label, k, lam):
    """One label into exponentially forgotten bin counts (decay-beta, decay-venn-abers), in
    place: the counts are kept multiplied by g = lambda^-(labels since the last rescale)
    (``v[g_at]``), so decaying every bin is one division (O(1) per label, not O(B)); the label
    adds g to bin ``k`` of ``pos`` (label 1) or ``neg``; every count is divided by g once it
    passes ``config.DECAY_BETA_RESCALE``. Then the label count ``v[0]`` + 1, returned."""
    v[g_at] /= lam
    if label == 1:
        pos[k] += v[g_at]
    else:
        neg[k] += v[g_at]
    if v[g_at] > _RESCALE:
        for j in range(pos.shape[0]):
            pos[j] /= v[g_at]
            neg[j] /= v[g_at]
        v[g_at] = 1.0
    v[0] += 1.0
    return v[0]


@njit(cache=True, error_model="numpy")
def _decay_beta(
    x, y, op_event, op_kind, op_offsets, state, lam, edges, eps, warmup, refit_every, rho,
    max_iter, tol,
):  # fmt: skip
    n_bins = edges.shape[0] - 1
    x1 = np.empty(n_bins)
    x2 = np.empty(n_bins)
    for k in range(n_bins):
        pc = sigmoid(0.5 * (edges[k] + edges[k + 1]))
        x1[k] = math.log(pc)
        x2[k] = -math.log1p(-pc)
    out = np.full(x.shape[0], np.nan)
    st = state.copy()
    w = np.empty(3)
    cur_pos = np.empty(n_bins)
    cur_neg = np.empty(n_bins)
    for s in range(op_offsets.shape[0] - 1):
        v = st[s]
        pos = v[_HEAD : _HEAD + n_bins]
        neg = v[_HEAD + n_bins : _HEAD + 2 * n_bins]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            q = min(max(x[e], eps), 1.0 - eps)
            if op_kind[o] != OP_UPDATE:
                if v[0] >= warmup:
                    out[e] = sigmoid(v[1] * math.log(q) - v[2] * math.log1p(-q) + v[3])
                else:
                    out[e] = x[e]
            if op_kind[o] != OP_FORECAST:
                z = math.log(q) - math.log1p(-q)
                k = np.searchsorted(edges[1:-1], z, side="right")  # interior edges: 0..B-1
                u = forget_and_count(v, 4, pos, neg, y[e], k, lam)
                if u >= warmup and (u - warmup) % refit_every == 0:
                    if u == warmup:  # the first fit starts from the identity map
                        w[0], w[1], w[2] = 1.0, 1.0, 0.0
                    else:
                        w[0], w[1], w[2] = v[1], v[2], v[3]
                    for j in range(n_bins):
                        cur_pos[j] = pos[j] / v[4]
                        cur_neg[j] = neg[j] / v[4]
                    fit_kernel(w, x1, x2, cur_pos, cur_neg, rho, max_iter, tol)
                    v[1], v[2], v[3] = w[0], w[1], w[2]
    return out, st


def bin_edges(n_bins: int, eps: float) -> np.ndarray:
    """The B + 1 edges of the equal-width log-odds bins over [logit(eps), logit(1 - eps)]."""
    lo = math.log(eps / (1.0 - eps))
    return np.linspace(lo, -lo, n_bins + 1)


def state_size(n_bins: int) -> int:
    """Length of a stream's state vector: [u, a, b, c, g, g n^1 (B), g n^0 (B)]."""
    return _HEAD + 2 * n_bins


def initial_state(n_streams: int, n_bins: int) -> np.ndarray:
    """(S, 5 + 2B): no label yet, the identity map (a = b = 1, c = 0), g = 1, empty bins."""
    st = np.zeros((n_streams, state_size(n_bins)))
    st[:, 1] = 1.0
    st[:, 2] = 1.0
    st[:, 4] = 1.0
    return st


def decay_beta(
    x, y, op_event, op_kind, op_offsets, state, *, memory, n_bins, eps, warmup, refit_every, rho,
    max_iter, tol,
):  # fmt: skip
    """Run the op list over all streams; returns ``(forecasts (n,), new state (S, 5 + 2B))``.

    ``state`` (S, 5 + 2B) is not modified. ``memory`` W sets lambda = 1 - 2/W.

    >>> import numpy as np
    >>> from calpipe.kernels.ops import OP_STEP
    >>> x = np.array([0.2, 0.6, 0.4, 0.7]); y = np.array([0, 1, 1, 1])
    >>> p, st = decay_beta(x, y, np.arange(4), np.full(4, OP_STEP, np.int8), np.array([0, 4]),
    ...                    initial_state(1, 10), memory=8, n_bins=10, eps=1e-4, warmup=2,
    ...                    refit_every=1, rho=1e-3, max_iter=50, tol=1e-12)
    >>> p[:2].tolist(), int(st[0, 0]), bool(p[2] != x[2])  # the base, then the fitted map
    ([0.2, 0.6], 4, True)
    """
    if not (memory >= 4 and n_bins >= 1 and 0.0 < eps < 0.5 and warmup >= 1 and refit_every >= 1):
        raise ValueError("need memory >= 4, n_bins >= 1, 0 < eps < 0.5, warmup, refit_every >= 1")
    st = np.ascontiguousarray(state, dtype=np.float64)
    if st.ndim != 2 or st.shape != (op_offsets.shape[0] - 1, state_size(n_bins)):
        raise ValueError(f"state must be (S, {state_size(n_bins)})")
    return _decay_beta(
        np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(y, dtype=np.int64),
        np.ascontiguousarray(op_event, dtype=np.int64), np.ascontiguousarray(op_kind),
        np.ascontiguousarray(op_offsets, dtype=np.int64), st, 1.0 - 2.0 / memory,
        bin_edges(n_bins, eps), float(eps), float(warmup), float(refit_every), float(rho),
        int(max_iter), float(tol),
    )  # fmt: skip
