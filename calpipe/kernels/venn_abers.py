r"""Venn-ABERS predictors on fixed base scores: inductive (IVAP), cross (CVAP) and multiclass.

A batch calibrator kernel (the contract of :mod:`calpipe.kernels`): :func:`fit` turns a
calibration window of base scores and labels into one self-describing float64 vector,
:func:`predict` maps test scores through it to a :class:`~calpipe.kernels.prediction.Prediction`
with the calibrated probability ``p`` and, for binary problems, the Venn multiprobability
``[p_lower, p_upper]``.

Inductive Venn-ABERS predictor (Vovk & Petej 2014, Section 3; Vovk, Petej & Fedorova 2015 =
VPF 2015, Section 2)
    Given calibration scores :math:`s_1, \dots, s_n` with labels :math:`y_i \in \{0, 1\}` and a test
    score :math:`s`, let :math:`g^{(y)}` be the isotonic (non-decreasing, least-squares) regression
    of the labels on the scores fitted to the calibration set *plus* the point :math:`(s, y)`
    (tied scores pooled: the fit is a function of the score). The IVAP outputs the
    multiprobability :math:`p_0 = g^{(0)}(s) \le p_1 = g^{(1)}(s)`; as a Venn predictor it is
    well calibrated (Vovk & Petej 2014, Section 2). The point forecast minimising the worst-case
    log-loss regret against both is (VPF 2015, Section 4)

    .. math:: p = \frac{p_1}{1 - p_0 + p_1},

    and in Brier loss :math:`p = p_1 + p_0^2 / 2 - p_1^2 / 2` (VPF 2015, Section 4, one fold).

Fast algorithm (VPF 2015, Section 2, Algorithms 1-4)
    Sort the calibration scores, pool ties into :math:`k` distinct values
    :math:`s'_1 < \dots < s'_k` with multiplicities :math:`w_j` and label sums :math:`c_j`, and
    form the cumulative sum diagram (CSD) :math:`P_j = (\sum_{i \le j} w_i, \sum_{i \le j} c_i)`,
    :math:`P_0 = (0, 0)`. The isotonic regression at a block is the slope of the greatest convex
    minorant (GCM) of the CSD over that block (Barlow et al. 1972, Theorem 1.1). Adding the test
    point :math:`(s, 1)` with :math:`s'_{j-1} < s \le s'_j` shifts :math:`P_j, \dots, P_k` by
    (1, 1) - equivalently shifts :math:`P_0, \dots, P_{j-1}` by (-1, -1) - so

    .. math:: F_1(s) = \text{slope of the GCM of } \{P_0 - (1,1), \dots, P_{j-1} - (1,1),
              P_j, \dots, P_k\} \text{ over } [P_{j-1} - (1,1), P_j],

    and sweeping :math:`j = 1, \dots, k` only moves one point per step, so one stack of GCM
    corners (Algorithm 1 builds it with :math:`P_{-1} = (-1, -1)`, Algorithm 2 updates it) yields
    all :math:`k` slopes in :math:`O(k)` amortised time after the sort. :math:`F_1 = 1` above
    :math:`s'_k`. :math:`F_0` (the test point :math:`(s, 0)` with :math:`s'_j \le s < s'_{j+1}`)
    is the mirror image (Algorithms 3-4): the same sweep on the reversed blocks with labels
    flipped, :math:`F_0 = 1 - F_1^{\text{mirror}}`; :math:`F_0 = 0` below :math:`s'_1`. A test
    score equal to a calibration score joins its tie block, which is where the intervals above
    put it (the pooled fit at the block equals the fit at a separate point just before it for
    label 1, just after it for label 0, because the added label is extreme). The slopes are
    ratios of exact integers (counts), so every :math:`F` is the correctly rounded rational.

    Prediction is one binary search per test score: :math:`p_1 = F_1[\#\{s'_j < s\}]`,
    :math:`p_0 = F_0[\#\{s'_j \le s\}]`, O(log k) (an O(1)-expected bucket index narrows it).
    With several folds (below) the merged output depends only on the rank of the test score
    among the union of the folds' distinct scores and on whether it equals one, so ``predict``
    merges once per union value and then also does one search per test score.

Cross Venn-ABERS predictor on fixed scores (VPF 2015, Section 3)
    The base model cannot be retrained here, so fold :math:`f` of the calibration window is the
    calibration set of IVAP :math:`f` (the scores of all folds come from the same fixed model);
    the :math:`F` pairs :math:`(p_0^f, p_1^f)` are merged (VPF 2015, Section 4;
    ``venn_abers`` 1.5.4, ``VennAbersCV.predict_proba``):

    .. math:: p_{\log} = \frac{\mathrm{GM}(p_1)}{\mathrm{GM}(1 - p_0) + \mathrm{GM}(p_1)},
              \qquad
              p_{\text{Brier}} = \overline{p_1} + \tfrac12 \overline{p_0^2}
              - \tfrac12 \overline{p_1^2},

    GM the geometric and bars the arithmetic mean over folds. The package reports no merged
    bounds (only the per-fold stacks), so ``p_lower``/``p_upper`` are the fold means
    :math:`\overline{p_0}, \overline{p_1}`. They contain :math:`p_{\text{Brier}}` (each fold's
    :math:`p_1 - (p_1^2 - p_0^2)/2 \in [p_0, p_1]`) but *not always* :math:`p_{\log}` when the
    folds disagree strongly (e.g. :math:`p_0 = (0.9, 0), p_1 = (0.95, 0.01)` gives
    :math:`p_{\log} = 0.236 < \overline{p_0} = 0.45`); :math:`p_{\log}` always lies in
    :math:`[\min_f p_0^f, \max_f p_1^f]`.

Multiclass (Manokhin 2017; ``venn_abers`` 1.5.4, ``predict_proba_prefitted_va`` and
``VennAbersMultiClass``)
    ``"ovr"``: class :math:`c`'s binary Venn-ABERS predictor on score column :math:`c` with labels
    :math:`1\{y = c\}` gives :math:`p_c`; the row is renormalised. ``"ovo"``: for each pair
    :math:`i < j`, the binary predictor on the points labelled :math:`i` or :math:`j` with pair
    score :math:`s_j / (s_i + s_j)` (1/2 when both are 0; the package gives NaN there) gives
    :math:`q_{j|ij}` and :math:`q_{i|ij} = 1 - q_{j|ij}`; pairwise coupling (Price et al. 1995, as
    used by Manokhin 2017 and the package)

    .. math:: p_c \propto \Bigl(\sum_{o \ne c} \frac{1}{q_{c|co}} - (K - 2)\Bigr)^{-1},

    renormalised to sum to 1. Each binary sub-problem is an IVAP or a CVAP as above; multiclass
    predictions carry no bounds (``p_lower = p_upper = None``): the per-pair intervals are not
    intervals for the class probabilities after coupling and renormalisation.

Fitted vector
    ``[K, mode, merge, S, <sub-problem 1>, ..., <sub-problem S>]`` with ``K = 1`` for binary
    (1-D scores, ``S = 1``) or the number of classes (``S = K`` for ovr, ``K (K - 1) / 2`` for
    ovo, pairs in lexicographic order), ``mode`` 0 = ovr / 1 = ovo, ``merge`` 0 = log /
    1 = Brier. A sub-problem is ``[F, <IVAP 1>, ..., <IVAP F>]`` (its non-empty folds; ``F = 1``
    with an empty IVAP if it has no calibration point) and an IVAP is
    ``[k, s'_1..s'_k, F0[0..k], F1[0..k]]`` (3k + 3 numbers). An empty IVAP (k = 0) predicts the
    vacuous multiprobability [0, 1] (p = 1/2 under either merge).

References
----------
Vovk, V. & Petej, I. (2014). Venn-Abers predictors. UAI 2014 (arXiv:1211.0025).
Vovk, V., Petej, I. & Fedorova, V. (2015). Large-scale probabilistic predictors with and
without guarantees of validity. NeurIPS 28 (arXiv:1511.00213).
Manokhin, V. (2017). Multi-class probabilistic classification using inductive and cross
Venn-Abers predictors. COPA 2017, PMLR 60.
Barlow, R. E., Bartholomew, D. J., Bremner, J. M. & Brunk, H. D. (1972). Statistical Inference
under Order Restrictions. Wiley.

Examples
--------
Four calibration points; p0/p1 from refitting the isotonic regression with the test point
added as label 0/1 (at 0.4: tie block {0, 0, 1} + 0 -> 1/3, + 1 -> 2/3; below the range:
p0 = 0, p1 = (1 + 0)/2; above: p0 = (1 + 0)/2, p1 = 1):

>>> import numpy as np
>>> from calpipe.kernels import venn_abers
>>> fitted = venn_abers.fit(np.array([0.1, 0.4, 0.4, 0.8]), np.array([0, 0, 1, 1]))
>>> pred = venn_abers.predict(fitted, np.array([0.0, 0.4, 0.9]))
>>> pred.p_lower, pred.p_upper
(array([0.        , 0.33333333, 0.5       ]), array([0.5       , 0.66666667, 1.        ]))
>>> pred.p  # p1 / (1 - p0 + p1)
array([0.33333333, 0.5       , 0.66666667])

Cross Venn-ABERS with 2 folds (point i in fold i mod 2). At 0.5, fold 0 {0.2: 0, 0.3: 1,
0.7: 1} gives (p0, p1) = (1/2, 1) and fold 1 {0.3: 0, 0.6: 0, 0.9: 1} gives (0, 1/2), so the
log merge is sqrt(1/2) / (sqrt(1/2) + sqrt(1/2)) = 1/2 and the bounds are the fold means:

>>> s = np.array([0.2, 0.3, 0.3, 0.6, 0.7, 0.9])
>>> y = np.array([0, 0, 1, 0, 1, 1])
>>> venn_abers.predict(venn_abers.fit(s, y, cross=True, n_folds=2), np.array([0.5]))
Prediction(p=array([0.5]), p_lower=array([0.25]), p_upper=array([0.75]))

A 3-class one-vs-one predictor (rows of p sum to 1; no bounds):
>>> sc = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.2, 0.7], [0.4, 0.4, 0.2]])
>>> pm = venn_abers.predict(venn_abers.fit(sc, np.array([0, 1, 2, 1])), sc).p
>>> pm.shape, bool(np.allclose(pm.sum(axis=1), 1.0))
((4, 3), True)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from calpipe import config
from calpipe.kernels.prediction import Prediction

__all__ = ["fit", "predict"]

_MERGE = {"log": 0, "brier": 1}
_MODE = {"ovr": 0, "ovo": 1}
_HEADER = 4  # K, mode, merge, S


# --------------------------------------------------------------------------------------------
# Fit: tie pooling and the GCM sweeps (VPF 2015, Algorithms 1-4)
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _cross(ox, oy, ax, ay, bx, by):
    """z of (a - o) x (b - o) in exact int64: > 0 iff o -> a -> b turns left (counter-clockwise)."""
    return (ax - ox) * (by - oy) - (ay - oy) * (bx - ox)


@njit(cache=True)
def _f1_slopes(w, c):
    """F1 of every tie block as exact integer slopes ``dy[j] / dx[j]``, j = 0..k-1.

    ``w[j]`` multiplicity and ``c[j]`` label sum of block j (distinct scores ascending). Block j of
    the result is the isotonic value at a label-1 test point pooled into block j (test score in
    (s'_{j-1}, s'_j]), i.e. the GCM slope over [P_j - (1, 1), P_{j+1}] of the diagram
    {P_0 - (1,1), .., P_j - (1,1), P_{j+1}, .., P_k} (0-based P_j = CSD after j blocks).
    """
    k = w.shape[0]
    px = np.empty(k + 1, np.int64)  # CSD P_0..P_k
    py = np.empty(k + 1, np.int64)
    px[0] = 0
    py[0] = 0
    for j in range(k):
        px[j + 1] = px[j] + w[j]
        py[j + 1] = py[j] + c[j]
    # Algorithm 1: GCM corners of {P_{-1} = (-1, -1), P_0, .., P_k}, left to right, dropping
    # every corner that is not a strict left turn (collinear points are not corners).
    sx = np.empty(k + 2, np.int64)
    sy = np.empty(k + 2, np.int64)
    sx[0] = -1
    sy[0] = -1
    sx[1] = 0
    sy[1] = 0
    h = 2
    for j in range(1, k + 1):
        while h >= 2 and _cross(sx[h - 2], sy[h - 2], sx[h - 1], sy[h - 1], px[j], py[j]) <= 0:
            h -= 1
        sx[h] = px[j]
        sy[h] = py[j]
        h += 1
    # Reverse: the leftmost corner on top (index h - 1), as Algorithm 2's stack S'.
    for a in range(h // 2):
        b = h - 1 - a
        sx[a], sx[b] = sx[b], sx[a]
        sy[a], sy[b] = sy[b], sy[a]
    dy = np.empty(k, np.int64)
    dx = np.empty(k, np.int64)
    # Algorithm 2. Invariant: the stack holds the GCM corners of the current diagram from a
    # corner at or left of the test block's left end P_j - (1, 1) rightwards, and its top segment
    # covers the test block. The capacity k + 2 suffices: every push follows a pop.
    for j in range(k):
        t = h - 1
        dx[j] = sx[t - 1] - sx[t]
        dy[j] = sy[t - 1] - sy[t]
        if j + 1 == k:
            break
        # Next diagram: P_{j+1} - (1, 1) joins the left part (P_j leaves the right part; it lies
        # on or above the GCM, being (1, 1) above P_j - (1, 1) where the slope is <= 1).
        nx = px[j + 1] - 1
        ny = py[j + 1] - 1
        if _cross(sx[t], sy[t], sx[t - 1], sy[t - 1], nx, ny) >= 0:
            continue  # on or above the top segment: the GCM is unchanged and still covers
        h -= 1
        while h >= 2 and _cross(nx, ny, sx[h - 1], sy[h - 1], sx[h - 2], sy[h - 2]) <= 0:
            h -= 1
        sx[h] = nx
        sy[h] = ny
        h += 1
    return dy, dx


@njit(cache=True)
def _ivap_block(s_sorted, y_sorted):
    """One IVAP as ``[k, s'(k), F0(k + 1), F1(k + 1)]`` from calibration data sorted by score.

    ``F0[i]`` is p0 for a test score s with #{s' <= s} = i; ``F1[i]`` is p1 for #{s' < s} = i.
    """
    n = s_sorted.shape[0]
    vals = np.empty(n)
    w = np.empty(n, np.int64)
    c = np.empty(n, np.int64)
    k = 0
    for i in range(n):  # pool ties: distinct scores, multiplicities, label sums
        if k == 0 or s_sorted[i] != vals[k - 1]:
            vals[k] = s_sorted[i]
            w[k] = 0
            c[k] = 0
            k += 1
        w[k - 1] += 1
        c[k - 1] += y_sorted[i]
    out = np.empty(3 * k + 3)
    out[0] = k
    out[1 : k + 1] = vals[:k]
    f0 = out[k + 1 : 2 * k + 2]
    f1 = out[2 * k + 2 :]
    dy, dx = _f1_slopes(w[:k], c[:k])
    for j in range(k):
        f1[j] = dy[j] / dx[j]
    f1[k] = 1.0  # a label-1 point above every calibration score: the fit there is 1
    # F0 by symmetry (Algorithms 3-4): reverse the blocks and flip the labels, then the slope
    # over the same points in original coordinates is (dx - dy_mirror) / dx, still exact.
    wr = np.empty(k, np.int64)
    cr = np.empty(k, np.int64)
    for j in range(k):
        wr[j] = w[k - 1 - j]
        cr[j] = w[k - 1 - j] - c[k - 1 - j]
    dyr, dxr = _f1_slopes(wr, cr)
    f0[0] = 0.0  # a label-0 point below every calibration score: the fit there is 0
    for i in range(1, k + 1):
        r = k - i  # mirror block of original block i - 1
        f0[i] = (dxr[r] - dyr[r]) / dxr[r]
    return out


# --------------------------------------------------------------------------------------------
# Predict: one merged lookup table per sub-problem, then coupling
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _bucket(v, lo, scale, nb):
    # scale > 0 only when u_U - u_1 is finite, so v - lo (v <= u_U) cannot overflow
    return min(int((v - lo) * scale), nb - 1) if scale > 0.0 else 0


@njit(cache=True)
def _merge_one(p0, p1, how):
    """(p, mean p0, mean p1) of F fold pairs (VPF 2015, Section 4), as the package computes it.

    log: GM(p1) / (GM(1 - p0) + GM(p1)), GM = product^(1/F): F = 1 is exactly the package's
    p1 / ((1 - p0) + p1); F > 1 is 1 / (1 + (prod(1 - p0) / prod(p1))^(1/F)), within a few ulps
    of its ``geo_mean`` formula, with a log-domain fallback where a product could underflow
    (p1 >= 1/(n_f + 1) > 0 and 1 - p0 > 0 always). Brier: (1/F) (sum p1 + sum p0^2 / 2 -
    sum p1^2 / 2), term for term the package's.
    """
    nf = p0.shape[0]
    inv = 1.0 / nf
    s0 = 0.0
    s1 = 0.0
    for f in range(nf):
        s0 += p0[f]
        s1 += p1[f]
    if how != 0:
        q0 = 0.0
        q1 = 0.0
        for f in range(nf):
            q0 += p0[f] * p0[f]
            q1 += p1[f] * p1[f]
        p = inv * (s1 + 0.5 * q0 - 0.5 * q1)
    elif nf == 1:
        p = p1[0] / ((1.0 - p0[0]) + p1[0])
    else:
        g0 = 1.0
        g1 = 1.0
        for f in range(nf):
            g0 *= 1.0 - p0[f]
            g1 *= p1[f]
        if g0 > 1e-280 and g1 > 1e-280:
            p = 1.0 / (1.0 + (g0 / g1) ** inv)
        else:
            l0 = 0.0
            l1 = 0.0
            for f in range(nf):
                l0 += np.log1p(-p0[f])
                l1 += np.log(p1[f])
            p = 1.0 / (1.0 + np.exp((l0 - l1) * inv))
    return p, s0 * inv, s1 * inv


@njit(cache=True)
def _table(fitted, offs, how):
    """The merged prediction table of one sub-problem (its F IVAP blocks at ``fitted[offs]``).

    Let u_1 < ... < u_U be the union of the folds' distinct scores. For a test score v with
    a = #{u < v}, fold f's ranks are #{s'_f < v} = #{s'_f < u_a} and, if v = u_a,
    #{s'_f <= v} = that + [u_a in fold f]: so (p, mean p0, mean p1) depend only on a and on
    whether v = u_a, and are merged once per union value instead of once per test score.
    ``u`` holds u_1..u_U (the search keys, compact for the cache) and row a of ``val`` is
    (p, p_hit, lo, lo_hit, hi, hi_hit) for a = 0..U (row U: above every u).
    ``first[b]`` is the first index whose score lies in bucket >= b of U uniform buckets over
    [u_1, u_U]: bucket(v) = floor((v - u_1) scale) is non-decreasing in v, so a score in a lower
    bucket than v is < v and one in a higher bucket is > v, and the rank search is narrowed to one
    bucket (O(1) expected for a smooth score density).
    """
    nf = offs.shape[0]
    kf = np.empty(nf, np.int64)
    total = 0
    for f in range(nf):
        kf[f] = int(fitted[offs[f]])
        total += kf[f]
    u = np.empty(total)
    val = np.empty((total + 1, 6))
    pos = np.zeros(nf, np.int64)
    q0 = np.empty(nf)
    q0h = np.empty(nf)
    q1 = np.empty(nf)
    n_u = 0
    while True:  # F-way merge of the folds' sorted distinct scores
        v = np.inf
        found = False
        for f in range(nf):
            if pos[f] < kf[f]:
                w = fitted[offs[f] + 1 + pos[f]]
                if not found or w < v:
                    v = w
                    found = True
        for f in range(nf):
            o = offs[f]
            k = kf[f]
            i = pos[f]
            hit = found and i < k and fitted[o + 1 + i] == v
            q1[f] = fitted[o + 2 * k + 2 + i]  # F1[#{s' < v}]
            q0[f] = fitted[o + k + 1 + i]  # F0[#{s' <= v}] for v strictly between
            q0h[f] = fitted[o + k + 2 + i] if hit else q0[f]  # ... and for v = u
            if hit:
                pos[f] += 1
        p, lo, hi = _merge_one(q0, q1, how)
        ph, loh, hih = _merge_one(q0h, q1, how)
        val[n_u, 0] = p
        val[n_u, 1] = ph
        val[n_u, 2] = lo
        val[n_u, 3] = loh
        val[n_u, 4] = hi
        val[n_u, 5] = hih
        if not found:
            break
        u[n_u] = v
        n_u += 1
    u = u[:n_u]
    val = val[: n_u + 1]
    nb = max(n_u, 1)
    lo_u = u[0] if n_u > 0 else 0.0
    scale = 0.0
    if n_u > 1 and u[n_u - 1] > lo_u:
        sc = nb / (u[n_u - 1] - lo_u)
        if np.isfinite(sc):  # else a subnormal or overflowing range: one bucket
            scale = sc
    first = np.empty(nb + 1, np.int32)  # int32: half the cache footprint (n < 2^31 points)
    b = 0
    for i in range(n_u):
        bi = _bucket(u[i], lo_u, scale, nb)
        while b <= bi:
            first[b] = i
            b += 1
    while b <= nb:
        first[b] = n_u
        b += 1
    return u, val, first, lo_u, scale


@njit(cache=True)
def _predict_sub(fitted, offs, x, col_i, col_j, how, p, lower, upper, bounds):
    """Merged p (and, if ``bounds``, the fold means of p0 and p1) of one binary sub-problem.

    The test score of row t is ``x[t, col_j]`` (``col_i < 0``) or the pair score
    x[t, j] / (x[t, i] + x[t, j]) (1/2 when the sum is 0, where the package has NaN). Its record
    is found by a bucket-narrowed binary search (NaN ranks last, as in numpy).
    """
    u, val, first, lo, scale = _table(fitted, offs, how)
    n_u = u.shape[0]
    top = u[n_u - 1] if n_u > 0 else 0.0
    for t in range(x.shape[0]):
        if col_i < 0:
            v = x[t, col_j]
        else:
            tot = x[t, col_i] + x[t, col_j]
            v = x[t, col_j] / tot if tot != 0.0 else 0.5
        if n_u == 0 or v < lo:
            a = 0
            h = 0
        elif not (v <= top):  # above the range, or NaN
            a = n_u
            h = 0
        else:
            bx = _bucket(v, lo, scale, n_u)
            a = first[bx]
            e = first[bx + 1]
            while a < e:  # first index with u >= v
                mid = (a + e) >> 1
                if u[mid] < v:
                    a = mid + 1
                else:
                    e = mid
            h = 1 if (a < n_u and u[a] == v) else 0
        p[t] = val[a, h]
        if bounds:
            lower[t] = val[a, 2 + h]
            upper[t] = val[a, 4 + h]


@njit(cache=True)
def _couple(ps, n_cls, out):
    """Pairwise coupling (Price et al. 1995; Manokhin 2017; the package's order of terms).

    ``ps[s]`` = q_{j|ij} of pair s = (i, j), i < j, lexicographic. out[t, c] =
    1 / (sum_{o != c} 1 / q_{c|co} - (K - 2)), summed over o = c+1..K-1 then o = 0..c-1, then
    each row is renormalised.
    """
    m = ps.shape[1]
    idx = np.empty((n_cls, n_cls), np.int64)  # pair index of (i, j), i < j
    s = 0
    for i in range(n_cls):
        for j in range(i + 1, n_cls):
            idx[i, j] = s
            s += 1
    for t in range(m):
        tot = 0.0
        for c in range(n_cls):
            acc = 0.0
            for o in range(c + 1, n_cls):
                acc += 1.0 / (1.0 - ps[idx[c, o], t])
            for o in range(c):
                acc += 1.0 / ps[idx[o, c], t]
            out[t, c] = 1.0 / (acc - (n_cls - 2))
            tot += out[t, c]
        for c in range(n_cls):
            out[t, c] /= tot


@njit(cache=True)
def _normalise(ps, out):
    """One-vs-rest: out[t, c] = ps[c, t] / sum_c ps[c, t] (the package's renormalisation)."""
    n_cls, m = ps.shape
    for t in range(m):
        tot = 0.0
        for c in range(n_cls):
            tot += ps[c, t]
        for c in range(n_cls):
            out[t, c] = ps[c, t] / tot


# --------------------------------------------------------------------------------------------
# Public wrappers
# --------------------------------------------------------------------------------------------
def _fit_binary(s: np.ndarray, y: np.ndarray, fold_of: np.ndarray | None, n_f: int) -> list:
    """One binary sub-problem: ``[F, IVAP blocks...]`` over its non-empty folds."""
    blocks = []
    if fold_of is None:
        groups = [(s, y)] if s.size else []
    else:
        groups = [(s[fold_of == f], y[fold_of == f]) for f in range(n_f)]
    for gs, gy in groups:
        if gs.size == 0:
            continue
        order = np.argsort(gs)  # any order within a tie block gives the same block sums
        blocks.append(_ivap_block(np.ascontiguousarray(gs[order]), np.ascontiguousarray(gy[order])))
    if not blocks:  # no calibration point: the vacuous IVAP [0, 1]
        blocks.append(np.array([0.0, 0.0, 1.0]))
    return [np.array([float(len(blocks))]), *blocks]


def _pair_score(scores: np.ndarray, i: int, j: int) -> np.ndarray:
    """s_j / (s_i + s_j), the package's pairwise renormalisation; 1/2 where both are 0."""
    tot = scores[:, i] + scores[:, j]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = scores[:, j] / tot
    out[tot == 0.0] = 0.5
    return out


def _pairs(k: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(k) for j in range(i + 1, k)]


def fit(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    cross: bool = False,
    n_folds: int = config.VENN_ABERS_N_FOLDS,
    folds: np.ndarray | None = None,
    merge: str = config.VENN_ABERS_MERGE,
    multiclass: str = config.VENN_ABERS_MULTICLASS,
) -> np.ndarray:
    """Fit an inductive or cross Venn-ABERS predictor on a calibration window.

    Parameters
    ----------
    scores : ndarray of float64, shape (n,) or (n, K)
        Base probabilities of label 1 (binary) or of each class (rows summing to 1). Only the
        order of the scores matters (ties are pooled exactly); they must be finite.
    labels : ndarray of int, shape (n,)
        In {0, 1} (binary) or 0..K-1.
    cross : bool, default False
        False: one IVAP on the whole window. True: a CVAP, fold f of the window being the
        calibration set of IVAP f (fixed base scores: no refit of the base model).
    n_folds : int, default ``config.VENN_ABERS_N_FOLDS`` (5)
        CVAP folds: point i (in the order given, i.e. time order) goes to fold ``i mod F`` with
        ``F = min(n_folds, n)``. Ignored if ``folds`` is given.
    folds : ndarray of int, shape (n,), optional
        Explicit fold of each calibration point (any integer ids; folds are taken in increasing
        id). Implies ``cross=True``.
    merge : {"log", "brier"}, default "log"
        How the multiprobabilities become one p (VPF 2015, Section 4); stored in the fitted vector.
    multiclass : {"ovo", "ovr"}, default "ovo"
        Reduction for 2-D scores: one-vs-one with pairwise coupling, or one-vs-rest.

    Returns
    -------
    ndarray of float64
        The fitted vector (layout in the module docstring); deterministic: the same inputs give
        a bit-identical vector, and for an IVAP the order of the calibration points is irrelevant.
        Degenerate windows do not raise: n = 0 (or a sub-problem without points) gives the
        vacuous [0, 1] and p = 1/2; all labels 0 give p0 = 0 and p1 = 1 / (1 + #{s_i >= s})
        (all labels 1 the mirror image); all scores tied give one block (k = 1).
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(np.int64, copy=False).ravel()
    if s.ndim not in (1, 2) or s.shape[0] != y.shape[0]:
        raise ValueError(f"scores {s.shape} and labels {y.shape} do not match")
    n = y.shape[0]
    if merge not in _MERGE:
        raise ValueError(f"merge must be one of {sorted(_MERGE)}, got {merge!r}")
    if multiclass not in _MODE:
        raise ValueError(f"multiclass must be one of {sorted(_MODE)}, got {multiclass!r}")
    fold_of = None
    n_f = 1
    if folds is not None:
        f_arr = np.asarray(folds).astype(np.int64, copy=False).ravel()
        if f_arr.shape[0] != n:
            raise ValueError(f"folds {f_arr.shape} and labels {y.shape} do not match")
        ids, fold_of = np.unique(f_arr, return_inverse=True)
        n_f = max(ids.shape[0], 1)
    elif cross:
        n_f = max(min(int(n_folds), n), 1)
        fold_of = np.arange(n, dtype=np.int64) % n_f
    if fold_of is not None and n_f == 1:
        fold_of = None

    if s.ndim == 1:
        n_cls, mode, subs = 1, 0, [_fit_binary(s, y, fold_of, n_f)]
    else:
        n_cls = s.shape[1]
        if n_cls < 2:
            raise ValueError(f"multiclass scores need K >= 2 columns, got {s.shape}")
        mode = _MODE[multiclass]
        subs = []
        if mode == 0:
            for c in range(n_cls):
                subs.append(_fit_binary(s[:, c], (y == c).astype(np.int64), fold_of, n_f))
        else:
            for i, j in _pairs(n_cls):
                sel = (y == i) | (y == j)
                sub_f = None if fold_of is None else fold_of[sel]
                yy = (y[sel] == j).astype(np.int64)
                subs.append(_fit_binary(_pair_score(s[sel], i, j), yy, sub_f, n_f))
    head = np.array([n_cls, mode, _MERGE[merge], len(subs)], dtype=np.float64)
    return np.concatenate([head, *(a for sub in subs for a in sub)])


def _sub_offsets(fitted: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """Offsets of the IVAP blocks of the sub-problem at ``fitted[pos]``, and the next position."""
    n_f = int(fitted[pos])
    pos += 1
    offs = np.empty(n_f, dtype=np.int64)
    for f in range(n_f):
        offs[f] = pos
        pos += 3 * int(fitted[pos]) + 3
    return offs, pos


def binary_breakpoints(fitted: np.ndarray) -> np.ndarray:
    """The calibration scores s' of a binary fitted vector, over its folds: p0 and p1 depend on
    a test score only through #{s'_j < s} and #{s'_j <= s}, so they change only at these."""
    f = np.ascontiguousarray(fitted, dtype=np.float64)
    if int(f[0]) != 1:
        raise ValueError("not a binary Venn-ABERS fitted vector")
    offs, _ = _sub_offsets(f, _HEADER)
    parts = [f[o + 1 : o + 1 + int(f[o])] for o in offs]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0)


def sub_tables(fitted: np.ndarray) -> tuple[str, list[tuple[int, int, np.ndarray, np.ndarray]]]:
    """A multiclass fitted vector's binary sub-problems as tables: ``(coupling, subs)`` with
    coupling ``"ovr"`` or ``"ovo"`` and, per sub-problem, ``(i, j, x, y)``: its test score is
    column j (``i = -1``) or the pair score of (i, j); its merged p at ``x`` (the points where
    it may change, :func:`binary_breakpoints`) and between them is ``y`` evaluated by
    :func:`predict` itself at ``[below x_1, x_1, .., x_m, mid-points, above x_m]`` (what the
    SQL step tables hold: the same values, so the same map)."""
    f = np.ascontiguousarray(fitted, dtype=np.float64)
    n_cls, mode, how, n_sub = (int(v) for v in f[:_HEADER])
    if n_cls < 2:
        raise ValueError("not a multiclass Venn-ABERS fitted vector")
    cols = [(-1, c) for c in range(n_cls)] if mode == 0 else _pairs(n_cls)
    out, pos = [], _HEADER
    for i, j in cols[:n_sub]:
        _, end = _sub_offsets(f, pos)
        binary = np.concatenate([[1.0, 0.0, float(how), 1.0], f[pos:end]])
        pos = end
        x = binary_breakpoints(binary)
        out.append((i, j, x, predict(binary, _table_points(x)).p))
    return ("ovr" if mode == 0 else "ovo"), out


def _table_points(x: np.ndarray) -> np.ndarray:
    """``[below x_1, x_1, .., x_m, the mid-points, above x_m]`` of sorted points x (m >= 0)."""
    left = x[0] - 1.0 if x.size else 0.5
    right = x[-1] + 1.0 if x.size else 0.5
    return np.concatenate([[left], x, (x[:-1] + x[1:]) / 2, [right]])


def predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Calibrated probabilities of test scores under a fitted Venn-ABERS predictor.

    Parameters
    ----------
    fitted : ndarray of float64
        The output of :func:`fit`.
    scores : ndarray of float64, shape (m,) or (m, K)
        Test base scores (finite; any value, ties with calibration scores handled exactly).

    Returns
    -------
    Prediction
        Binary: ``p`` (m,) and the multiprobability ``p_lower = p0``, ``p_upper = p1`` (fold
        means for a CVAP). Multiclass: ``p`` (m, K) with rows summing to 1, no bounds.
        Below the calibration range p0 = 0 and above it p1 = 1 (the isotonic fit at an extreme
        test point with an extreme label); with no calibration point, [0, 1] and p = 1/2.
    """
    fitted = np.ascontiguousarray(fitted, dtype=np.float64)
    n_cls, mode, how, n_sub = (int(v) for v in fitted[:_HEADER])
    x = np.asarray(scores, dtype=np.float64)
    if n_cls == 1:
        if x.ndim != 1:
            raise ValueError(f"binary Venn-ABERS expects scores of shape (m,), got {x.shape}")
        m = x.shape[0]
        offs, _ = _sub_offsets(fitted, _HEADER)
        p, lo, hi = np.empty(m), np.empty(m), np.empty(m)
        xx = np.ascontiguousarray(x).reshape(m, 1)
        _predict_sub(fitted, offs, xx, -1, 0, how, p, lo, hi, True)
        return Prediction(p, lo, hi)
    if x.ndim != 2 or x.shape[1] != n_cls:
        raise ValueError(f"expected scores of shape (m, {n_cls}), got {x.shape}")
    x = np.ascontiguousarray(x)
    m = x.shape[0]
    cols = [(-1, c) for c in range(n_cls)] if mode == 0 else _pairs(n_cls)
    subs = []
    pos = _HEADER
    for _ in range(n_sub):
        offs, pos = _sub_offsets(fitted, pos)
        subs.append(offs)
    ps = np.empty((n_sub, m))
    dummy = np.empty(0)
    for sub, (i, j) in enumerate(cols):
        _predict_sub(fitted, subs[sub], x, i, j, how, ps[sub], dummy, dummy, False)
    out = np.empty((m, n_cls))
    if mode == 0:
        _normalise(ps, out)
    else:
        _couple(ps, n_cls, out)
    return Prediction(out)
