"""Calibration diagnostics of binary forecasts, every group at once: the smooth ECE (Błasiok &
Nakkiran 2024) and the CORP decomposition of the log and Brier scores (Dimitriadis, Gneiting &
Jordan 2021). The public forms (polars expressions and grouped numpy arrays) are in
:mod:`calpipe.metrics`; this module holds only the loops.

Smooth ECE (Błasiok & Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel
Smoothing", ICLR 2024, Definitions 5-6)
------------------------------------------------------------------------------------------
For forecasts f_i in [0, 1] and outcomes y_i, i = 1..n, and the reflected Gaussian kernel on
[0, 1] (the density at t of pi(f + sigma Z), pi the reflection of the line onto [0, 1]),

    K_sigma(t, f) = sum_{k in Z} phi_sigma(t - f + 2k) + phi_sigma(t + f + 2k),

the smoothed residual mass is g_sigma(t) = (1/n) sum_i K_sigma(t, f_i) (y_i - f_i), and

    smECE_sigma = int_0^1 |g_sigma(t)| dt    (= int |r_hat(t)| delta_hat(t) dt, the paper's form),
    smECE       = smECE_sigma* with sigma* the fixed point smECE_sigma* = sigma*.

smECE_sigma does not increase with sigma and is at most mean |y - f| <= 1, so the fixed point is
unique in (0, 1]; it is found by bracketing (Illinois regula falsi on log sigma), starting from
the bracket [smECE_1, smECE_(smECE_1)] that monotonicity gives (floored at ``min_sigma``). Below ``min_sigma`` the kernel's grid would be too fine to be worth it: if
smECE_min_sigma <= min_sigma the value at min_sigma is returned, which lies in [0, min_sigma].

Numerics (why the result is the integral to ~1e-3 relative or better): the residuals are
deposited on a grid of spacing h = sigma / ``points_per_sigma`` by linear interpolation (each
residual split between its two grid neighbours, keeping its mass and first moment; the variance
it adds, h^2 / 6 on average, is taken off the kernel's), convolved exactly with the kernel's
images (tails cut at :data:`_TAIL_SIGMAS` sigma, e^-18 of the peak), and |g| is integrated by the
trapezoid rule on the same grid. ``tests/kernels/test_diagnostics.py`` checks this against the
integral evaluated point by point from the definition (measured: <= 7e-4 relative at 8 points
per sigma, mostly far less).

CORP decomposition (Dimitriadis, Gneiting & Jordan, PNAS 2021, eqs. (2)-(4))
----------------------------------------------------------------------------
With f_hat the PAV (isotonic) recalibration of the forecasts (tied forecasts pooled first, so a
forecast value gets one recalibrated value) and r = mean y the climatological forecast, for a
proper score S with mean S_bar:

    S_bar(f) = MCB - DSC + UNC,   MCB = S_bar(f) - S_bar(f_hat),   DSC = S_bar(r) - S_bar(f_hat),
    UNC = S_bar(r).

PAV's fit minimises every proper score among isotonic maps at once (the paper's optimality
result), so MCB >= 0 and DSC >= 0. The kernel returns S_bar(f_hat) and S_bar(r) for the log score
(0 log 0 = 0) and the Brier score; the caller subtracts from S_bar(f).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

from calpipe import config
from calpipe.kernels.grouping import counting_sort_kernel, sort_values_kernel
from calpipe.kernels.isotonic import pav_kernel

#: The kernel's tails are cut at this many sigma: phi(6 sigma) / phi(0) = e^-18 ~ 1.5e-8.
_TAIL_SIGMAS = 6.0


@njit(cache=True)
def _axpy(g, g0, x, x0, n, a):
    """g[g0 + t] += a * x[x0 + t] for t < n. Unsigned indices (the caller's are >= 0): numba
    then drops its negative-index wraparound and LLVM vectorizes the loop (2x on the smooth
    ECE's convolution); each element's arithmetic is the same, so are the bits."""
    for t in range(n):
        g[uint64(g0 + t)] += a * x[uint64(x0 + t)]


@njit(cache=True)
def _smooth_ece_at(f, r, sigma, points_per_sigma):
    """smECE_sigma of forecasts ``f`` with residual masses ``r`` (= (y - f) / n)."""
    m = max(8, math.ceil(points_per_sigma / sigma))
    h = 1.0 / m
    w = np.zeros(m + 1)
    for i in range(f.shape[0]):
        x = f[i] * m
        lo = min(int(x), m - 1)
        fr = x - lo
        w[lo] += (1.0 - fr) * r[i]
        w[lo + 1] += fr * r[i]
    d = math.ceil(_TAIL_SIGMAS * sigma * m)
    taps = np.empty(d + 1)
    # the deposit spreads a point at fraction u of its cell with variance u (1 - u) h^2, h^2 / 6
    # on average: the taps' Gaussian is narrower by that much, so the total spread is sigma^2
    # (this removes the leading O((h / sigma)^2) bias of the deposit)
    s_eff = math.sqrt(sigma * sigma - h * h / 6.0)
    c = 1.0 / (math.sqrt(2.0 * math.pi) * s_eff)
    for j in range(d + 1):
        z = j * h / s_eff
        taps[j] = c * math.exp(-0.5 * z * z)
    g = np.zeros(m + 1)
    rtaps = taps[::-1].copy()  # taps[q - j] = rtaps[d - q + j]: both halves run forwards
    # images of grid point l: l + 2km and -l + 2km; only those within d of [0, m] reach the grid
    kmax = (d + m) // (2 * m) + 1
    for src in range(m + 1):
        wl = w[src]
        if wl == 0.0:
            continue
        for k in range(-kmax, kmax + 1):
            for sgn in (1, -1):
                q = sgn * src + 2 * k * m
                lo = max(0, q - d)
                hi = min(m, q + d)
                # g[j] += wl * taps[|j - q|] for j in [lo, hi]: left of q, then from q on (each
                # g[j] gets the same additions in the same order as one loop over j)
                end = min(hi + 1, q)
                if end > lo:
                    _axpy(g, lo, rtaps, d - q + lo, end - lo, wl)
                begin = max(lo, q)
                if hi + 1 > begin:
                    _axpy(g, begin, taps, begin - q, hi + 1 - begin, wl)
    total = 0.0
    for j in range(m + 1):
        a = abs(g[j])
        total += 0.5 * a if (j == 0 or j == m) else a
    return total * h


def smooth_ece_at(f, y, sigma: float, points_per_sigma: float | None = None) -> float:
    """smECE_sigma at one bandwidth ``sigma`` (paper 004, Definition 5: the integral over [0, 1]
    of |(1/n) sum_i K_sigma(t, f_i) (y_i - f_i)|, K the reflected Gaussian kernel) of forecasts
    ``f`` and 0/1 outcomes ``y``, on a grid of ``points_per_sigma`` / sigma cells (default
    :data:`calpipe.config.SMOOTH_ECE_POINTS_PER_SIGMA`). :func:`smooth_ece_groups` searches
    the bandwidth at which smECE_sigma = sigma; this is one evaluation of it.

    Every forecast 0.5 and 3 of 4 outcomes 1: the residual mass 0.25 sits at one point, and
    the reflected kernel integrates to 1 over [0, 1], so smECE_sigma = 0.25 at any bandwidth.

    >>> import numpy as np
    >>> round(smooth_ece_at(np.full(4, 0.5), np.array([1.0, 1.0, 1.0, 0.0]), 0.1), 6)
    0.25
    """
    f = np.ascontiguousarray(f, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    if f.ndim != 1 or f.shape != y.shape:
        raise ValueError(f"f and y must be 1-d of one length, got {f.shape} and {y.shape}")
    if f.size and not (np.all((f >= 0.0) & (f <= 1.0)) and np.all(np.isfinite(y))):
        raise ValueError("f must lie in [0, 1] and y be finite")
    if not sigma > 0.0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    pps = config.SMOOTH_ECE_POINTS_PER_SIGMA if points_per_sigma is None else points_per_sigma
    if not pps > 0.0:
        raise ValueError(f"points_per_sigma must be > 0, got {pps}")
    return float(_smooth_ece_at(f, (y - f) / max(f.size, 1), float(sigma), float(pps)))


@njit(cache=True)
def _smooth_ece_one(f, r, min_sigma, points_per_sigma, rtol):
    """(smECE, sigma*) of one group: the fixed point of smECE_sigma = sigma in [min_sigma, 1]."""
    if f.shape[0] == 0:
        return np.nan, np.nan
    # smECE_sigma does not increase with sigma, so smECE_1 <= smECE_sigma* = sigma* and then
    # sigma* <= smECE_(smECE_1): a bracket from two cheap evaluations (wide kernels, coarse grids)
    hi = 1.0
    v_hi = _smooth_ece_at(f, r, hi, points_per_sigma)
    if v_hi >= hi:  # cannot happen for y in [0, 1] (smECE_1 <= mean |y - f| <= 1); kept safe
        return v_hi, hi
    lo = max(min_sigma, v_hi)
    v_lo = _smooth_ece_at(f, r, lo, points_per_sigma)
    if v_lo <= lo:  # sigma* <= lo: lo = min_sigma (the floor), or lo = v_hi = sigma* exactly
        return v_lo, lo
    if v_lo < hi:
        hi = v_lo
        v_hi = _smooth_ece_at(f, r, hi, points_per_sigma)
        if v_hi >= hi:  # a flat stretch: smECE is v_lo = hi on [lo, hi], hi is the fixed point
            return v_hi, hi
    # root of h(s) = smECE_exp(s) - exp(s) on [log lo, log hi]: h decreasing, h(lo) > 0 > h(hi)
    a, b = math.log(lo), math.log(hi)
    ha, hb = v_lo - lo, v_hi - hi
    side = 0
    s, v = hi, v_hi
    for _ in range(200):
        x = (a * hb - b * ha) / (hb - ha)
        s = math.exp(x)
        v = _smooth_ece_at(f, r, s, points_per_sigma)
        hx = v - s
        if hx > 0.0:
            a, ha = x, hx
            if side == -1:
                hb *= 0.5  # Illinois: halve the stale end so the bracket shrinks on both sides
            side = -1
        else:
            b, hb = x, hx
            if side == 1:
                ha *= 0.5
            side = 1
        if b - a <= rtol or hx == 0.0:
            break
    return v, s


@njit(cache=True)
def smooth_ece_groups(f, y, ids, n_groups, min_sigma, points_per_sigma, rtol):
    """(smECE, sigma*) of every group (``ids`` dense in [0, n_groups)); NaN for an empty group."""
    order, counts = counting_sort_kernel(ids, n_groups)
    out = np.full(n_groups, np.nan)
    sig = np.full(n_groups, np.nan)
    start = 0
    for k in range(n_groups):
        n = counts[k]
        if n > 0:
            rows = order[start : start + n]
            fk = f[rows]
            rk = (y[rows] - fk) / n
            out[k], sig[k] = _smooth_ece_one(fk, rk, min_sigma, points_per_sigma, rtol)
        start += n
    return out, sig


@njit(cache=True)
def bin_cells(p, y, ids, n_groups, n_bins):
    """(count, sum of p, sum of y) of every (group, bin) cell, cell ``ids[i] * n_bins + b`` with
    b = the equal-width bin of ``p[i]`` in [0, 1] (the ECE's and the reliability diagram's
    cells). A NaN forecast goes to bin 0 (and makes its cell's sum NaN); one pass, the sums in
    row order (as ``np.bincount`` adds its weights: the same bits)."""
    size = n_groups * n_bins
    count = np.zeros(size, np.int64)
    sum_p = np.zeros(size)
    sum_y = np.zeros(size)
    top = n_bins - 1
    for i in range(p.shape[0]):
        x = p[i] * n_bins
        b = 0 if not x > 0.0 else (top if x >= top else int(x))  # (NaN -> bin 0)
        cell = ids[i] * n_bins + b
        count[cell] += 1
        sum_p[cell] += p[i]
        sum_y[cell] += y[i]
    return count, sum_p, sum_y


@njit(cache=True)
def _xlogx(x):
    return 0.0 if x <= 0.0 else x * math.log(x)


@njit(cache=True)
def corp_groups(f, y, ids, n_groups):
    """Per group: (mean log score of f_hat, mean Brier of f_hat, mean log score of r, mean Brier
    of r) with f_hat the PAV recalibration of ``f`` on tie-pooled forecasts and r = mean y.
    ``y`` is 0/1 (float64: 1.0 is an event, anything else a non-event). NaN for an empty group."""
    order, counts = counting_sort_kernel(ids, n_groups)
    out = np.full((n_groups, 4), np.nan)
    start = 0
    for k in range(n_groups):
        n = counts[k]
        if n == 0:
            continue
        rows = order[start : start + n]
        start += n
        # the forecasts of the 1s and of the 0s, each sorted by value (a value sort is several
        # times faster than an argsort), merged into runs of equal forecasts: one recalibrated
        # value per forecast value, with its count and positives (exact integers)
        n1 = 0
        for i in range(n):
            if y[rows[i]] == 1.0:
                n1 += 1
        f1 = np.empty(n1)
        f0 = np.empty(n - n1)
        i1 = 0
        i0 = 0
        for i in range(n):
            v = f[rows[i]]
            if y[rows[i]] == 1.0:
                f1[i1] = v
                i1 += 1
            else:
                f0[i0] = v
                i0 += 1
        sort_values_kernel(f1)
        sort_values_kernel(f0)
        cnt = np.zeros(n, np.int64)
        pos = np.zeros(n, np.int64)
        g = -1
        prev = np.nan
        i1 = 0
        i0 = 0
        while i1 < n1 or i0 < n - n1:
            take1 = i0 >= n - n1 or (i1 < n1 and f1[i1] <= f0[i0])
            v = f1[i1] if take1 else f0[i0]
            if g < 0 or v != prev:
                g += 1
                prev = v
            cnt[g] += 1
            if take1:
                pos[g] += 1
                i1 += 1
            else:
                i0 += 1
        cnt = cnt[: g + 1]
        pos = pos[: g + 1]
        fit = pav_kernel(cnt, pos)
        log_fit = 0.0
        brier_fit = 0.0
        log_p = log_1p = 0.0
        p_logged = np.nan
        for j in range(g + 1):
            p = fit[j]
            c = cnt[j]
            q = pos[j]
            if p != p_logged:  # a new PAV block: its two logs, once (blocks are few)
                p_logged = p
                log_p = math.log(p) if p > 0.0 else 0.0
                log_1p = math.log(1.0 - p) if p < 1.0 else 0.0
            # q events with outcome 1 and c - q with 0, all forecast p (0 log 0 = 0: a block of
            # all-zeros has p = 0 exactly, of all-ones p = 1)
            if q > 0:
                log_fit -= q * log_p
            if c - q > 0:
                log_fit -= (c - q) * log_1p
            brier_fit += q * (1.0 - p) ** 2 + (c - q) * p * p
        total_pos = 0
        for j in range(g + 1):
            total_pos += pos[j]
        rbar = total_pos / n
        out[k, 0] = log_fit / n
        out[k, 1] = brier_fit / n
        out[k, 2] = -(_xlogx(rbar) + _xlogx(1.0 - rbar))
        out[k, 3] = rbar * (1.0 - rbar)
    return out
