"""Isotonic regression (binary) and ROC-regularized isotonic regression (binary and multiclass):
batch calibrators after paper 003 (Berta, Bach & Jordan, "Classifier Calibration with
ROC-Regularized Isotonic Regression", AISTATS 2024; ``shared/papers/003_*``, a summary).

Each method is a pair of pure functions following the calibrator kernel contract
(``*_fit(scores, labels, **params) -> fitted``, ``*_predict(fitted, scores) -> Prediction``):

=========================  ================================================  ===================
method                     map                                               fitted layout
=========================  ================================================  ===================
isotonic (``linear``)      PAV fit, linear between thresholds (scikit-learn)  ``[0, m, x, r]``
isotonic (``step``)        PAV fit, piecewise constant (paper 003 §2.2)       ``[1, m, x, r]``
ROC-regularized, binary    recursive partitioning (Alg. 2, K = 2), step      ``[1, m, x, r]``
ROC-regularized, K classes recursive partitioning of the simplex (Alg. 2)    ``[2, K, N, nodes]``
=========================  ================================================  ===================

Notation (paper 003)
--------------------
Calibration set (p_i, y_i), i = 1..n: p_i the base forecast (``scores``; binary: P(y = 1)), y_i
the label (one-hot e_{y_i} in the multiclass sections), r_i the calibrated forecast. A *region*
(bin) B has the mean label ybar_B = (1 / #B) sum_{i in B} y_i; every method here outputs, on a
calibration point, the mean label of its bin, which is why each of them has zero calibration
error on the calibration set (Proposition 2.1: E[Y | r] = r there).

Isotonic regression (Definition 2.1, Algorithm 1)
-------------------------------------------------
r = argmin sum_i (y_i - r_i)^2 subject to r_1 <= ... <= r_n for p_1 <= ... <= p_n. As in
scikit-learn's ``IsotonicRegression(out_of_bounds="clip")``, tied scores are first pooled into
one point of weight #ties and label mean (scores are tied when they lie within
``config.ISOTONIC_TIE_RESOLUTION`` of the first score of their run, sklearn's ``_make_unique``
rule), the weighted PAV (Algorithm 1) is run on the pooled points, and the map is stored as the
thresholds x_1 < ... < x_m (pooled scores, interior points of constant runs dropped) with values
r_1 <= ... <= r_m. PAV pools on exact integer sums (positives, count), so a block's value is the
correctly rounded rational positives / count. ``predict`` clips a score s to [x_1, x_m] and then

* ``linear``: interpolates linearly between the neighbouring thresholds (scikit-learn);
* ``step``: returns r_j for the largest x_j <= s: the step function of paper 003 §2.2, whose
  bins are [x_j, x_{j+1}).

Theorem 2.1 (the ROC curve of IR is the convex hull of the base ROC curve) holds for both: the
two maps agree on the calibration scores (the linear one up to rounding of its formula).

ROC-regularized isotonic regression (§3, Algorithm 2)
-----------------------------------------------------
A recursive partitioning of the score space. With threshold gamma (the paper's multidimensional
threshold, gamma in A_K), a region R splits into the K sub-regions

    R_k(gamma) = {x in R : argmax_j (x_j - gamma_j) = k},      S_k = {i : p_i in R_k(gamma)},

(ties to the lowest k, the same rule in ``fit`` and ``predict``). The gain of a split is

    M_R(gamma) = sum_k #S_k || ybar_R - ybar_{S_k} ||_2.

Algorithm 2: start from one region (the whole simplex) with r = ybar; repeatedly pop the pending
region of largest M_R = max_gamma M_R(gamma) (its unconstrained best gain, computed when the
region is created; ties to the oldest region) and run ``split``: over the candidate thresholds
gamma in R (the calibration scores in R), keep the one of largest M_R(gamma) > 0 whose new
calibration function r-hat (S_k's points set to ybar_{S_k}) is *ROC monotone*; if there is one,
apply it and push the sub-regions, otherwise the region is final. A region whose M_R is 0 can
never split and is final at once (same result, fewer passes).

ROC monotonicity (Definition 3.2) asks that every partition of the calibrated forecasts by a
threshold gamma be a partition of the base forecasts by some gamma'. Restricted to thresholds
that oppose two classes a, c only, it implies: whenever every point of bin A lies on the a-side
and every point of bin B on the c-side of a cut x_a - x_c = t, the calibrated values satisfy
r_A[a] - r_A[c] >= r_B[a] - r_B[c]. The tree of splits certifies such a cut for every pair of
bins: at their lowest common split, A lies in sub-region a and B in sub-region c. We impose
exactly these conditions (for every pair of non-empty leaves), in exact rational arithmetic on
the label counts. For K = 2 they say that r is non-decreasing in the score, and the recursive
partitioning then ends at the isotonic regression itself (the IRP of Luss, Rosset & Shahar 2012,
"Efficient regularized isotonic regression"), so its ROC curve is again the convex hull of the
base ROC curve.

Regularisation (paper 003 §3: "balance the decrease in cross entropy against overfitting"):

* ``max_regions``: a split is allowed only if the number of non-empty regions stays
  <= max_regions (None: no cap);
* ``min_region_size``: every non-empty sub-region of a split holds >= min_region_size points.

A multiclass split may leave a sub-region without calibration points; it becomes an empty leaf
whose value is its parent's ybar (new scores that land there get the parent's bin), does not
count as a region and takes no part in the monotonicity conditions.

Decisions where the summary is silent or ambiguous
--------------------------------------------------
* Algorithm 2 initialises "r <- y"; we read r <- ybar (one bin): r = y is not a calibration map.
* |.| in M_R is the Euclidean norm (for K = 2 every norm gives the same order of splits).
* The candidate thresholds "gamma in R" are the calibration scores in R; above ``max_candidates``
  points (multiclass only) an evenly spaced subset of them, in input order, keeps a split at
  O(max_candidates n_R K) (the paper notes the method's cost).
* The binary method is the 1-D instance of Algorithm 2 (thresholds on the score, one pass per
  region with prefix sums; scores pooled into tie groups as for isotonic regression).
  Unregularised, it is computed by PAV, to which it is equal (checked in the tests).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from calpipe import config
from calpipe.kernels.prediction import Prediction

__all__ = [
    "LAYOUT_LINEAR",
    "LAYOUT_STEP",
    "LAYOUT_TREE",
    "isotonic_fit",
    "isotonic_predict",
    "rrir_fit",
    "rrir_predict",
]

#: fitted[0] of a binary map interpolated linearly between thresholds (scikit-learn's).
LAYOUT_LINEAR = 0
#: fitted[0] of a binary step map (bins [x_j, x_{j+1})).
LAYOUT_STEP = 1
#: fitted[0] of a multiclass partition tree.
LAYOUT_TREE = 2

_INTERPOLATIONS = {"linear": LAYOUT_LINEAR, "step": LAYOUT_STEP}

# Node status in the multiclass partitioning kernel.
_PENDING = 0  # leaf with calibration points, waiting in Algorithm 2's ``regions`` list
_FINAL = 1  # leaf with calibration points, never to be split
_INTERNAL = 2  # split: gamma and K children
_EMPTY = 3  # leaf without calibration points (value = parent's ybar)

# Integer fields of a node record (then K class counts, then K child ids).
_LO, _HI, _PARENT, _SIDE, _DEPTH, _STATUS, _GAMMA = range(7)
_NI = 7


# --------------------------------------------------------------------------------------------
# Binary: pooling ties, PAV (Algorithm 1), thresholds.
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _pool_ties(s_sorted, y_sorted, resolution):
    """Pool sorted scores into tie groups (sklearn ``_make_unique``): a score starts a new group
    when it exceeds the group's *first* score by >= resolution. Returns (x, count, positives):
    x the group's first score, int64 counts and label sums (integers: exact)."""
    n = s_sorted.shape[0]
    x = np.empty(n)
    cnt = np.zeros(n, dtype=np.int64)
    pos = np.zeros(n, dtype=np.int64)
    g = 0
    x[0] = s_sorted[0]
    for i in range(n):
        if s_sorted[i] - x[g] >= resolution:
            g += 1
            x[g] = s_sorted[i]
        cnt[g] += 1
        pos[g] += y_sorted[i]
    return x[: g + 1].copy(), cnt[: g + 1].copy(), pos[: g + 1].copy()


@njit(cache=True)
def pav_kernel(cnt, pos):
    """Weighted PAV (paper 003 Algorithm 1) on pooled groups of ``cnt`` points with ``pos``
    positives. A block is pooled into its left neighbour while the neighbour's mean is >= its
    own (compared exactly: pos_a cnt_b >= pos_b cnt_a), so the final blocks have strictly
    increasing means. Returns the fitted value of every group."""
    g_n = cnt.shape[0]
    bn = np.empty(g_n, dtype=np.int64)
    bp = np.empty(g_n, dtype=np.int64)
    bend = np.empty(g_n, dtype=np.int64)
    nb = 0
    for g in range(g_n):
        c = cnt[g]
        p = pos[g]
        while nb > 0 and bp[nb - 1] * c >= p * bn[nb - 1]:
            nb -= 1
            c += bn[nb]
            p += bp[nb]
        bn[nb] = c
        bp[nb] = p
        bend[nb] = g + 1
        nb += 1
    r = np.empty(g_n)
    start = 0
    for b in range(nb):
        v = bp[b] / bn[b]
        for g in range(start, bend[b]):
            r[g] = v
        start = bend[b]
    return r


@njit(cache=True)
def _binary_scan(lo, hi, cc, cp, min_size, check, left_lo, right_hi):
    """Best threshold split of the region of groups [lo, hi) (Algorithm 2's ``split`` for K = 2).

    Children: groups [lo, j) (scores <= gamma = x_{j-1}) and [j, hi). Gain M = n_L |ybar - ybar_L|
    + n_U |ybar - ybar_U|. With ``check``, only splits keeping r non-decreasing are admissible:
    ybar_L <= ybar_U and the neighbouring leaves [left_lo, lo) and [hi, right_hi) (-1: none)
    stay ordered (exact cross-multiplied comparisons). Returns (M, j), j = -1 if M = 0."""
    n = cc[hi] - cc[lo]
    p = cp[hi] - cp[lo]
    m = p / n
    best = 0.0
    best_j = -1
    for j in range(lo + 1, hi):
        nl = cc[j] - cc[lo]
        nu = n - nl
        if nl < min_size or nu < min_size:
            continue
        pl = cp[j] - cp[lo]
        pu = p - pl
        gain = nl * abs(m - pl / nl) + nu * abs(m - pu / nu)
        if gain > best:
            if check:
                if pl * nu > pu * nl:
                    continue
                if left_lo >= 0:
                    na = cc[lo] - cc[left_lo]
                    pa = cp[lo] - cp[left_lo]
                    if pa * nl > pl * na:
                        continue
                if right_hi >= 0:
                    nb = cc[right_hi] - cc[hi]
                    pb = cp[right_hi] - cp[hi]
                    if pu * nb > pb * nu:
                        continue
            best = gain
            best_j = j
    return best, best_j


@njit(cache=True)
def _irp_binary(cnt, pos, max_regions, min_size):
    """ROC-regularized IR for K = 2 (Algorithm 2 on the line): returns each group's value.

    Leaves are intervals of groups; ``hi_of[lo]``/``lo_of[hi - 1]`` give a leaf's bounds from
    either end, so a leaf's neighbours are found in O(1). ``max_regions`` <= 0: no cap."""
    g_n = cnt.shape[0]
    cc = np.zeros(g_n + 1, dtype=np.int64)
    cp = np.zeros(g_n + 1, dtype=np.int64)
    for g in range(g_n):
        cc[g + 1] = cc[g] + cnt[g]
        cp[g + 1] = cp[g] + pos[g]
    hi_of = np.zeros(g_n + 1, dtype=np.int64)
    lo_of = np.zeros(g_n + 1, dtype=np.int64)
    hi_of[0] = g_n
    lo_of[g_n - 1] = 0
    # Algorithm 2's ``regions``: pending leaves in creation order, with their priority M_R.
    p_lo = np.empty(2 * g_n, dtype=np.int64)
    p_hi = np.empty(2 * g_n, dtype=np.int64)
    p_m = np.empty(2 * g_n)
    p_on = np.zeros(2 * g_n, dtype=np.bool_)
    n_p = 0
    m0, _ = _binary_scan(0, g_n, cc, cp, min_size, False, -1, -1)
    if m0 > 0.0:
        p_lo[0], p_hi[0], p_m[0], p_on[0] = 0, g_n, m0, True
        n_p = 1
    n_leaves = 1
    while True:
        pick = -1
        for t in range(n_p):
            if p_on[t] and (pick < 0 or p_m[t] > p_m[pick]):
                pick = t
        if pick < 0:
            break
        if max_regions > 0 and n_leaves + 1 > max_regions:
            break  # every split adds one region
        p_on[pick] = False
        lo, hi = p_lo[pick], p_hi[pick]
        left_lo = lo_of[lo - 1] if lo > 0 else -1
        right_hi = hi_of[hi] if hi < g_n else -1
        _, j = _binary_scan(lo, hi, cc, cp, min_size, True, left_lo, right_hi)
        if j < 0:
            continue  # final region
        hi_of[lo], lo_of[j - 1], hi_of[j], lo_of[hi - 1] = j, lo, hi, j
        n_leaves += 1
        for a, b in ((lo, j), (j, hi)):
            mc, _ = _binary_scan(a, b, cc, cp, min_size, False, -1, -1)
            if mc > 0.0:
                p_lo[n_p], p_hi[n_p], p_m[n_p], p_on[n_p] = a, b, mc, True
                n_p += 1
    r = np.empty(g_n)
    lo = 0
    while lo < g_n:
        hi = hi_of[lo]
        v = (cp[hi] - cp[lo]) / (cc[hi] - cc[lo])
        for g in range(lo, hi):
            r[g] = v
        lo = hi
    return r


@njit(cache=True)
def _trim(x, r):
    """Drop thresholds inside a run of equal values (sklearn ``trim_duplicates``): both the
    linear interpolation and the step map are unchanged. Returns (x, r) kept."""
    m = x.shape[0]
    keep = np.ones(m, dtype=np.bool_)
    for j in range(1, m - 1):
        keep[j] = r[j] != r[j - 1] or r[j] != r[j + 1]
    return x[keep].copy(), r[keep].copy()


@njit(cache=True)
def _predict_binary(x, r, s, step):
    """Evaluate the map at scores s (clipped to [x_1, x_m]; NaN stays NaN).

    linear: scipy ``interp1d`` (sklearn): j = searchsorted(x, s) clipped to [1, m - 1],
    r_{j-1} + (r_j - r_{j-1}) / (x_j - x_{j-1}) (s - x_{j-1}); step: r_j, x_j <= s < x_{j+1}."""
    m = x.shape[0]
    out = np.empty(s.shape[0])
    lo_x = x[0]
    hi_x = x[m - 1]
    for i in range(s.shape[0]):
        v = s[i]
        if v != v:
            out[i] = np.nan
            continue
        v = min(max(v, lo_x), hi_x)
        if m == 1:
            out[i] = r[0]
        elif step:
            j = np.searchsorted(x, v, side="right") - 1
            out[i] = r[max(j, 0)]
        else:
            j = min(max(np.searchsorted(x, v, side="left"), 1), m - 1)
            slope = (r[j] - r[j - 1]) / (x[j] - x[j - 1])
            out[i] = slope * (v - x[j - 1]) + r[j - 1]
    return out


# --------------------------------------------------------------------------------------------
# Multiclass: recursive partitioning of the simplex (Algorithm 2).
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _sector(row, gamma):
    """k = argmax_j (row_j - gamma_j), ties to the lowest j: the sub-region R_k(gamma) of row."""
    best = 0
    bv = row[0] - gamma[0]
    for k in range(1, row.shape[0]):
        v = row[k] - gamma[k]
        if v > bv:
            best = k
            bv = v
    return best


@njit(cache=True)
def _grow(ni, nm, need):
    """Node arrays with room for ``need`` nodes (doubling)."""
    if need <= ni.shape[0]:
        return ni, nm
    cap = max(need, 2 * ni.shape[0])
    ni2 = np.zeros((cap, ni.shape[1]), dtype=np.int64)
    nm2 = np.zeros(cap)
    ni2[: ni.shape[0]] = ni
    nm2[: nm.shape[0]] = nm
    return ni2, nm2


@njit(cache=True)
def _side_bounds(node, ni, n_nodes, kk):
    """Lower bounds from the ROC-monotonicity conditions against every other non-empty leaf B.

    For B, let a (c) be the sub-region holding ``node`` (B) at their lowest common split; the
    condition on ``node``'s value v is v[a] - v[c] >= ybar_B[a] - ybar_B[c]. Returns the
    largest bound per ordered pair (a, c) as a rational num / den (den = 0: no bound)."""
    num = np.zeros((kk, kk), dtype=np.int64)
    den = np.zeros((kk, kk), dtype=np.int64)
    for b in range(n_nodes):
        st = ni[b, _STATUS]
        if b == node or (st != _PENDING and st != _FINAL):
            continue
        u = node
        v = b
        while ni[u, _DEPTH] > ni[v, _DEPTH]:
            u = ni[u, _PARENT]
        while ni[v, _DEPTH] > ni[u, _DEPTH]:
            v = ni[v, _PARENT]
        while ni[u, _PARENT] != ni[v, _PARENT]:
            u = ni[u, _PARENT]
            v = ni[v, _PARENT]
        a = ni[u, _SIDE]
        c = ni[v, _SIDE]
        nb = ni[b, _HI] - ni[b, _LO]
        w = ni[b, _NI + a] - ni[b, _NI + c]
        if den[a, c] == 0 or w * den[a, c] > num[a, c] * nb:
            num[a, c] = w
            den[a, c] = nb
    return num, den


@njit(cache=True)
def _mc_scan(node, ni, perm, p, y, kk, min_size, max_cand, check, room, num, den):
    """Algorithm 2 ``split(R, p, r, y)`` for the region ``node`` (points perm[lo:hi]).

    Tries gamma = p_g for the candidate points g of R, in order; keeps the first of largest
    M_R(gamma) > 0 whose non-empty sub-regions all hold >= min_size points and, with ``check``:
    add at most ``room`` regions (max_regions) and pass the ROC-monotonicity conditions -
    between sibling sub-regions (k on side k, l on side l at this split) and against the other
    leaves' bounds ``num / den`` (:func:`_side_bounds`). Returns (M, g), g = -1 if none."""
    lo = ni[node, _LO]
    hi = ni[node, _HI]
    n_r = hi - lo
    ybar = np.empty(kk)
    for c in range(kk):
        ybar[c] = ni[node, _NI + c] / n_r
    n_cand = n_r if (max_cand <= 0 or n_r <= max_cand) else max_cand
    cnt = np.zeros((kk, kk), dtype=np.int64)  # cnt[k, c]: points of class c in S_k
    size = np.zeros(kk, dtype=np.int64)  # #S_k
    best = 0.0
    best_g = -1
    for t in range(n_cand):
        ci = lo + t if n_cand == n_r else lo + (t * n_r) // n_cand
        g = perm[ci]
        gamma = p[g]
        cnt[:, :] = 0
        size[:] = 0
        for i in range(lo, hi):
            pt = perm[i]
            k = _sector(p[pt], gamma)
            cnt[k, y[pt]] += 1
            size[k] += 1
        q = 0
        small = False
        for k in range(kk):
            if size[k] > 0:
                q += 1
                if size[k] < min_size:
                    small = True
        if q < 2 or small:
            continue
        gain = 0.0
        for k in range(kk):
            if size[k] > 0:
                d2 = 0.0
                for c in range(kk):
                    d = ybar[c] - cnt[k, c] / size[k]
                    d2 += d * d
                gain += size[k] * math.sqrt(d2)
        if not gain > best:
            continue
        if check:
            if q - 1 > room:
                continue
            ok = True
            for k in range(kk):
                if size[k] == 0 or not ok:
                    continue
                for c in range(kk):
                    if c == k:
                        continue
                    # sibling l = c: ybar_k[k] - ybar_k[l] >= ybar_l[k] - ybar_l[l]
                    if size[c] > 0:
                        lhs = (cnt[k, k] - cnt[k, c]) * size[c]
                        rhs = (cnt[c, k] - cnt[c, c]) * size[k]
                        if lhs < rhs:
                            ok = False
                            break
                for a in range(kk):
                    if not ok:
                        break
                    for c in range(kk):
                        if den[a, c] > 0:
                            # ybar_k[a] - ybar_k[c] >= num / den
                            if (cnt[k, a] - cnt[k, c]) * den[a, c] < num[a, c] * size[k]:
                                ok = False
                                break
            if not ok:
                continue
        best = gain
        best_g = g
    return best, best_g


@njit(cache=True)
def _rrir_multiclass(p, y, max_regions, min_size, max_cand):
    """Algorithm 2 on (n, K) scores. Returns (ni, n_nodes): node records
    [lo, hi, parent, side, depth, status, gamma point, counts (K), children (K)]; node 0 is
    the root, children follow their parent. ``max_regions`` <= 0: no cap."""
    n, kk = p.shape
    ni = np.zeros((max(16, 2 * kk + 1), _NI + 2 * kk), dtype=np.int64)
    nm = np.zeros(ni.shape[0])  # priority M_R of pending nodes
    perm = np.arange(n)
    buf = np.empty(n, dtype=np.int64)
    ni[0, _HI] = n
    ni[0, _PARENT] = -1
    ni[0, _GAMMA] = -1
    for i in range(n):
        ni[0, _NI + y[i]] += 1
    dummy = np.zeros((kk, kk), dtype=np.int64)
    m0, _ = _mc_scan(0, ni, perm, p, y, kk, min_size, max_cand, False, 0, dummy, dummy)
    nm[0] = m0
    ni[0, _STATUS] = _PENDING if m0 > 0.0 else _FINAL
    n_nodes = 1
    n_leaves = 1  # non-empty leaves = the regions of the current calibration function r
    # Paper -> code: ``regions`` = the _PENDING nodes, ``bestsplit`` = pick (largest M_R,
    # oldest first), ``split(R, p, r, y)`` = _mc_scan(check=True), ``splitfound`` = g >= 0,
    # gamma = p[g]; r is implicit: a calibration point's r_i is its leaf's count / size.
    while True:
        pick = -1
        for t in range(n_nodes):
            if ni[t, _STATUS] == _PENDING and (pick < 0 or nm[t] > nm[pick]):
                pick = t
        if pick < 0:
            break
        room = kk - 1 if max_regions <= 0 else max_regions - n_leaves
        if room < 1:
            break  # every split adds >= 1 region
        num, den = _side_bounds(pick, ni, n_nodes, kk)
        _, g = _mc_scan(pick, ni, perm, p, y, kk, min_size, max_cand, True, room, num, den)
        if g < 0:  # not splitfound: R stays a region for good
            ni[pick, _STATUS] = _FINAL
            continue
        # Apply the split: stable counting sort of perm[lo:hi] by sub-region.
        lo = ni[pick, _LO]
        hi = ni[pick, _HI]
        gamma = p[g]
        start = np.zeros(kk + 1, dtype=np.int64)
        for i in range(lo, hi):
            start[_sector(p[perm[i]], gamma) + 1] += 1
        for k in range(kk):
            start[k + 1] += start[k]
        fill = start[:kk].copy()
        for i in range(lo, hi):
            pt = perm[i]
            k = _sector(p[pt], gamma)
            buf[fill[k]] = pt
            fill[k] += 1
        for i in range(hi - lo):
            perm[lo + i] = buf[i]
        ni, nm = _grow(ni, nm, n_nodes + kk)
        ni[pick, _STATUS] = _INTERNAL
        ni[pick, _GAMMA] = g
        q = 0
        for k in range(kk):
            c = n_nodes + k
            ni[pick, _NI + kk + k] = c
            ni[c, _LO] = lo + start[k]
            ni[c, _HI] = lo + start[k + 1]
            ni[c, _PARENT] = pick
            ni[c, _SIDE] = k
            ni[c, _DEPTH] = ni[pick, _DEPTH] + 1
            ni[c, _GAMMA] = -1
            for i in range(ni[c, _LO], ni[c, _HI]):
                ni[c, _NI + y[perm[i]]] += 1
            if ni[c, _HI] > ni[c, _LO]:
                q += 1
        n_nodes += kk
        n_leaves += q - 1
        for k in range(kk):
            c = ni[pick, _NI + kk + k]
            if ni[c, _HI] == ni[c, _LO]:
                ni[c, _STATUS] = _EMPTY
                continue
            mc, _ = _mc_scan(c, ni, perm, p, y, kk, min_size, max_cand, False, 0, dummy, dummy)
            nm[c] = mc
            ni[c, _STATUS] = _PENDING if mc > 0.0 else _FINAL
    return ni[:n_nodes].copy(), n_nodes


@njit(cache=True)
def _tree_records(ni, p, kk):
    """The fitted tree as records of 1 + 2K floats: internal [1, gamma (K), child ids (K)],
    leaf [0, value (K), #points, 0 ...]; an empty leaf carries its parent's ybar."""
    n_nodes = ni.shape[0]
    rec = np.zeros((n_nodes, 1 + 2 * kk))
    for t in range(n_nodes):
        st = ni[t, _STATUS]
        if st == _INTERNAL:
            rec[t, 0] = 1.0
            g = ni[t, _GAMMA]
            for k in range(kk):
                rec[t, 1 + k] = p[g, k]
                rec[t, 1 + kk + k] = ni[t, _NI + kk + k]
        else:
            src = t if st != _EMPTY else ni[t, _PARENT]
            n_src = ni[src, _HI] - ni[src, _LO]
            for k in range(kk):
                rec[t, 1 + k] = ni[src, _NI + k] / n_src
            rec[t, 1 + kk] = ni[t, _HI] - ni[t, _LO]
    return rec


@njit(cache=True)
def _predict_tree(rec, s):
    """Route each score vector from the root: child k = argmax_j (s_j - gamma_j) (ties to the
    lowest j, as in ``fit``), until a leaf; output the leaf's value. NaN rows give NaN."""
    n, kk = s.shape
    out = np.empty((n, kk))
    for i in range(n):
        row = s[i]
        bad = False
        for k in range(kk):
            if row[k] != row[k]:
                bad = True
        if bad:
            out[i, :] = np.nan
            continue
        t = 0
        while rec[t, 0] == 1.0:
            k = _sector(row, rec[t, 1 : 1 + kk])
            t = int(rec[t, 1 + kk + k])
        for k in range(kk):
            out[i, k] = rec[t, 1 + k]
    return out


# --------------------------------------------------------------------------------------------
# Public wrappers.
# --------------------------------------------------------------------------------------------
def _binary_xy(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    s = np.ascontiguousarray(scores, dtype=np.float64)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if s.ndim != 1 or y.shape != s.shape or s.shape[0] == 0:
        raise ValueError("binary isotonic regression needs scores (n,), labels (n,), n >= 1")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    if y.min() < 0 or y.max() > 1:
        raise ValueError("binary labels must lie in {0, 1}")
    return s, y


def _groups(s: np.ndarray, y: np.ndarray):
    order = np.argsort(s, kind="stable")
    return _pool_ties(s[order], y[order], config.ISOTONIC_TIE_RESOLUTION)


def _binary_vector(code: int, x: np.ndarray, r: np.ndarray) -> np.ndarray:
    x, r = _trim(x, r)
    return np.concatenate([np.array([float(code), float(x.shape[0])]), x, r])


def isotonic_fit(
    scores: np.ndarray,
    labels: np.ndarray,
    interpolation: str = config.DEFAULT_ISOTONIC_INTERPOLATION,
) -> np.ndarray:
    r"""Fit binary isotonic regression (paper 003 Definition 2.1, PAV Algorithm 1).

    Solves min_r sum_j w_j (ybar_j - r_j)^2 s.t. r_1 <= ... <= r_m over the m distinct scores
    x_1 < ... < x_m (tied scores pooled: w_j their count, ybar_j their label mean; sklearn's
    rule, module docstring). On a calibration score the map is the mean label of its PAV block,
    so the calibration error on the calibration set is 0 (Proposition 2.1) and the ROC curve of
    the calibrated scores is the convex hull of the base ROC curve (Theorem 2.1).

    Parameters
    ----------
    scores : ndarray of float64, shape (n,)
        Base probabilities of label 1 (any finite reals: only their order and ties matter).
    labels : ndarray of int64, shape (n,)
        Labels in {0, 1}.
    interpolation : {"linear", "step"}
        Between thresholds: linear (equal to ``sklearn.isotonic.IsotonicRegression(
        out_of_bounds="clip")``) or piecewise constant (r_j on [x_j, x_{j+1})).

    Returns
    -------
    ndarray of float64
        ``[code, m, x_1..x_m, r_1..r_m]``: code 0 (linear) or 1 (step), the m kept thresholds
        (first and last score of each constant run) and their values. Degenerate sets: one
        point, all scores tied or a single class give m = 1 or a constant r, i.e. the constant
        map r = mean label.

    Examples
    --------
    >>> s = np.array([0.1, 0.3, 0.35, 0.6, 0.8])
    >>> y = np.array([0, 1, 0, 1, 1])
    >>> fitted = isotonic_fit(s, y)
    >>> fitted[:2]  # linear, m = 5 thresholds x = fitted[2:7] (here the scores themselves)
    array([0., 5.])
    >>> fitted[7:]  # r at the thresholds
    array([0. , 0.5, 0.5, 1. , 1. ])
    >>> isotonic_predict(fitted, np.array([0.0, 0.3, 0.475, 0.9])).p
    array([0.  , 0.5 , 0.75, 1.  ])
    >>> isotonic_predict(isotonic_fit(s, y, "step"), np.array([0.0, 0.3, 0.475, 0.9])).p
    array([0. , 0.5, 0.5, 1. ])
    """
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {sorted(_INTERPOLATIONS)}")
    s, y = _binary_xy(scores, labels)
    x, cnt, pos = _groups(s, y)
    return _binary_vector(_INTERPOLATIONS[interpolation], x, pav_kernel(cnt, pos))


def _unpack_binary(f: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    m = int(f[1])
    if f.shape[0] != 2 + 2 * m or m < 1:
        raise ValueError("malformed binary isotonic fitted vector")
    return int(f[0]), np.ascontiguousarray(f[2 : 2 + m]), np.ascontiguousarray(f[2 + m :])


def binary_thresholds(fitted: np.ndarray) -> tuple[np.ndarray, bool]:
    """The thresholds x of a binary (linear or step) fitted vector and whether the map is
    linear between them (constant outside [x_1, x_m] either way)."""
    f = np.asarray(fitted, dtype=np.float64)
    if int(f[0]) not in (LAYOUT_LINEAR, LAYOUT_STEP):
        raise ValueError("not a binary isotonic fitted vector")
    code, x, _ = _unpack_binary(f)
    return x, code == LAYOUT_LINEAR


def isotonic_predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Apply a fitted isotonic (or ROC-regularized isotonic) map to new scores.

    Binary layouts: the score is clipped to [x_1, x_m], then interpolated linearly or read off
    the step function (:func:`isotonic_fit`); ties and scores outside the calibration range
    are exact by construction. Tree layout: see :func:`rrir_predict`.

    Returns
    -------
    Prediction
        ``p`` (n,) calibrated P(y = 1), or (n, K) rows summing to 1 for the tree layout.

    Examples
    --------
    >>> f = isotonic_fit(np.array([0.2, 0.4, 0.6]), np.array([0, 1, 1]))
    >>> isotonic_predict(f, np.array([-1.0, 0.3, 2.0])).p
    array([0. , 0.5, 1. ])
    """
    f = np.asarray(fitted, dtype=np.float64)
    if f.ndim != 1 or f.shape[0] < 3:
        raise ValueError("fitted must be a 1-D isotonic fitted vector")
    code = int(f[0])
    if code == LAYOUT_TREE:
        return rrir_predict(f, scores)
    if code not in (LAYOUT_LINEAR, LAYOUT_STEP):
        raise ValueError(f"unknown isotonic layout code {code}")
    _, x, r = _unpack_binary(f)
    s = np.ascontiguousarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError("binary isotonic map needs scores (n,)")
    return Prediction(_predict_binary(x, r, s, code == LAYOUT_STEP))


def rrir_fit(
    scores: np.ndarray,
    labels: np.ndarray,
    max_regions: int | None = config.DEFAULT_RRIR_MAX_REGIONS,
    min_region_size: int = config.DEFAULT_RRIR_MIN_REGION_SIZE,
    max_candidates: int = config.DEFAULT_RRIR_MAX_CANDIDATES,
) -> np.ndarray:
    r"""Fit ROC-regularized isotonic regression (paper 003 §3, Algorithm 2).

    Recursive partitioning: a region R splits around a threshold gamma into the sub-regions
    R_k(gamma) = {x : argmax_j (x_j - gamma_j) = k}, choosing among the calibration scores gamma
    in R the split of largest gain M_R(gamma) = sum_k #S_k ||ybar_R - ybar_{S_k}||_2 > 0 whose
    calibrated values stay ROC monotone (Definition 3.2, in the pairwise form of the module
    docstring); regions are processed by decreasing max_gamma M_R(gamma). Each leaf predicts
    the mean label vector of its calibration points, so the calibration error on the
    calibration set is 0.

    Binary scores (n,) are the case K = 2 on the line: thresholds on the score, r non-decreasing;
    unregularised it is the isotonic regression (with the step map), whose ROC curve is the
    convex hull of the base ROC curve (Theorem 2.1).

    Parameters
    ----------
    scores : ndarray of float64, shape (n,) or (n, K)
        Base P(y = 1), or class probabilities (rows summing to 1; any rows are routed).
    labels : ndarray of int64, shape (n,)
        Labels in {0, 1} or 0..K-1.
    max_regions : int or None
        At most this many non-empty regions (bins); None: no cap. Splits are taken in order of
        gain, so a cap keeps the most useful ones.
    min_region_size : int
        Every non-empty sub-region of a split holds at least this many calibration points.
    max_candidates : int
        Multiclass only: thresholds tried per split (an evenly spaced subset of the region's
        points above this; <= 0: all). Cost O(min(n_R, max_candidates) n_R K) per split.

    Returns
    -------
    ndarray of float64
        Binary: ``[1, m, x_1..x_m, r_1..r_m]`` (the step layout of :func:`isotonic_fit`).
        Multiclass: ``[2, K, N, records...]``, N node records of 1 + 2K floats, node 0 the
        root: internal ``[1, gamma_1..gamma_K, child_1..child_K]`` (child ids), leaf
        ``[0, r_1..r_K, #points, 0...]``. Degenerate sets (one point, one class, all scores
        tied) give a single leaf: the constant map r = mean label (vector).

    Examples
    --------
    >>> s = np.array([0.1, 0.3, 0.35, 0.6, 0.8])
    >>> y = np.array([0, 1, 0, 1, 1])
    >>> rrir_predict(rrir_fit(s, y), s).p
    array([0. , 0.5, 0.5, 1. , 1. ])
    >>> rrir_predict(rrir_fit(s, y, max_regions=2), s).p
    array([0.33333333, 0.33333333, 0.33333333, 1.        , 1.        ])
    >>> p3 = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1],
    ...                [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.1, 0.1, 0.8]])
    >>> f = rrir_fit(p3, np.array([0, 0, 1, 1, 2, 1]))
    >>> rrir_predict(f, np.array([[0.8, 0.1, 0.1], [0.1, 0.2, 0.7]])).p
    array([[1. , 0. , 0. ],
           [0. , 0.5, 0.5]])
    """
    cap = 0 if max_regions is None else int(max_regions)
    if max_regions is not None and cap < 1:
        raise ValueError("max_regions must be >= 1 or None")
    min_size = max(int(min_region_size), 1)
    s = np.asarray(scores)
    if s.ndim == 1:
        s, y = _binary_xy(s, labels)
        x, cnt, pos = _groups(s, y)
        if cap == 0 and min_size == 1:
            r = pav_kernel(
                cnt, pos
            )  # unregularised Algorithm 2 on the line = PAV (module docstring)
        else:
            r = _irp_binary(cnt, pos, cap, min_size)
        return _binary_vector(LAYOUT_STEP, x, r)
    p = np.ascontiguousarray(s, dtype=np.float64)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] < 2 or y.shape != (p.shape[0],):
        raise ValueError("multiclass scores must be (n, K), K >= 2, n >= 1, labels (n,)")
    if not np.isfinite(p).all():
        raise ValueError("scores must be finite")
    kk = p.shape[1]
    if y.min() < 0 or y.max() >= kk:
        raise ValueError(f"labels must lie in [0, {kk})")
    ni, n_nodes = _rrir_multiclass(p, y, cap, min_size, int(max_candidates))
    rec = _tree_records(ni, p, kk)
    head = np.array([float(LAYOUT_TREE), float(kk), float(n_nodes)])
    return np.concatenate([head, rec.ravel()])


def tree_records(fitted: np.ndarray) -> np.ndarray:
    """The nodes of a multiclass partition tree, (n_nodes, 1 + 2K), node 0 the root: internal
    ``[1, gamma (K), child ids (K)]``, leaf ``[0, value (K), #points, 0 ...]`` (what
    :func:`rrir_predict` walks)."""
    f = np.asarray(fitted, dtype=np.float64)
    if f.ndim != 1 or f.shape[0] < 3 or int(f[0]) != LAYOUT_TREE:
        raise ValueError("not a multiclass partition tree")
    kk, n_nodes = int(f[1]), int(f[2])
    if f.shape[0] != 3 + n_nodes * (1 + 2 * kk):
        raise ValueError("malformed tree fitted vector")
    return f[3:].reshape(n_nodes, 1 + 2 * kk).copy()


def rrir_predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Apply a fitted ROC-regularized isotonic map.

    Binary (step layout): r_j for the largest threshold x_j <= s (s clipped to the calibration
    range). Multiclass (tree layout): the score vector descends the tree, at each split to
    sub-region argmax_j (s_j - gamma_j) (ties to the lowest j, as in the fit), and gets the
    leaf's mean label vector; every real vector lands in exactly one leaf, so scores outside
    the calibration range are handled. Rows sum to 1 (up to rounding of count / n).

    Returns
    -------
    Prediction
        ``p`` (n,) or (n, K).

    Examples
    --------
    >>> p3 = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    >>> f = rrir_fit(p3, np.array([0, 1, 2]))
    >>> f[:3]  # tree layout, K = 3, 4 nodes: the root split around gamma = p3[0], 3 leaves
    array([2., 3., 4.])
    >>> rrir_predict(f, np.array([[0.9, 0.05, 0.05], [0.3, 0.5, 0.2], [0.3, 0.3, 0.4]])).p
    array([[1., 0., 0.],
           [0., 1., 0.],
           [0., 0., 1.]])
    """
    f = np.asarray(fitted, dtype=np.float64)
    if f.ndim != 1 or f.shape[0] < 3:
        raise ValueError("fitted must be a 1-D isotonic fitted vector")
    if int(f[0]) != LAYOUT_TREE:
        return isotonic_predict(f, scores)
    kk = int(f[1])
    n_nodes = int(f[2])
    if f.shape[0] != 3 + n_nodes * (1 + 2 * kk):
        raise ValueError("malformed tree fitted vector")
    rec = np.ascontiguousarray(f[3:].reshape(n_nodes, 1 + 2 * kk))
    s = np.ascontiguousarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] != kk:
        raise ValueError(f"multiclass map needs scores (n, {kk})")
    return Prediction(_predict_tree(rec, s))
