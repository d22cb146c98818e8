"""Venn predictor (paper 002: Vovk, Shafer & Nouretdinov, "Self-calibrating probability
forecasting", §3-§5) with a taxonomy over the base score or over a user category.

Taxonomy
--------
Paper 002 §3 defines a Venn probability machine by a *taxonomy*: a rule that splits the bag of
examples into groups, the same whatever their order. The taxonomies here depend on the object
only (never on the labels), so the group of an event is a fixed *category* k:

* **score bins** (binary): k = the bin of the base score s given increasing interior ``edges``,
  k = #{j : edges[j] <= s} (bins are ``[edges[k-1], edges[k])``). The lead computes the edges from
  a calibration window with :func:`equal_mass_edges`; fixed in advance, they are a legal taxonomy.
* **predicted class x confidence bins** (K classes): k = argmax_c s_c * (B + 1) + bin(max_c s_c),
  B = len(edges): the group of the base model's predicted label, refined by its confidence, the
  analogue of the 1-nearest-neighbour taxonomy of paper 002 §5 ("two examples are assigned to the
  same group if their nearest neighbors have the same label").
* **user categories**: an int64 code k in [0, C) carried by each event.

Multiprobability (paper 002 §3)
-------------------------------
Let n_k be the number of labelled examples seen so far in category k and n_{k,c} those of class c.
Completing the new object with the postulated label y puts it in its own group G (|G| = n_k + 1),
whose empirical label distribution is

    p_y(c) = (n_{k,c} + [c = y]) / (n_k + 1),        y = 0, ..., K-1,

so the multiprobability {p_y} spans, class by class,

    lower_c = min_y p_y(c) = n_{k,c} / (n_k + 1),    upper_c = max_y p_y(c) = (n_{k,c} + 1) / (n_k + 1).

Theorem 1 of paper 002: any Venn probability machine is (finitarily) calibrated. For binary
problems ``lower``/``upper`` are the [p0, p1] of Venn-ABERS (of label 1).

Point forecast (the merge)
--------------------------
Paper 002 outputs the multiprobability itself and, in its experiment (§5), an interval; it does not
prescribe one probability. We merge by *minimax log-loss regret within the multiprobability*: when
class c occurs, the calibrated member is p_c (postulated label = true label), whose probability of c
is upper_c; the forecast q is chosen in the convex hull of {p_y} to minimise
max_c ln(upper_c / q_c). Writing q = sum_y w_y p_y, q_c = (n_{k,c} + w_c) / (n_k + 1), and the
optimum equalises upper_c / q_c = r over the classes with w_c > 0 (water-filling):

* if (K - 1) n_{k,c} <= n_k + 1 for every c (always true for K = 2), every class is active and
  q_c = (n_{k,c} + 1) / (n_k + K): the normalised upper probabilities, i.e. Laplace's rule of
  succession in the group (paper 002 §4 mentions it as the "regularized" frequency);
* otherwise the classes with the largest counts get w_c = 0 (q_c = lower_c) and the others share
  the weight: q_c = (n_{k,c} + 1) B / (A (n_k + 1)), A = sum_active (n_{k,c} + 1),
  B = 1 + sum_active n_{k,c}.

For K = 2 this is the log-loss merge of Venn-ABERS, p = p1 / (1 - p0 + p1) (Vovk & Petej 2014,
"Venn-Abers predictors", §4), which here equals (n_{k,1} + 1) / (n_k + 2). Unrestricted, the minimax
merge would be the normalised upper vector for every K; for K >= 3 that vector can fall below
lower_c (e.g. n_k = n_{k,0} = 10, K = 3: 11/13 < 10/11), so we keep q in the hull, which guarantees
lower <= q <= upper and sum_c q_c = 1.

Operations (online kernel)
--------------------------
As in :mod:`calpipe.kernels.ops`: ``OP_STEP`` (forecast, then learn the label),
``OP_FORECAST`` (forecast only), ``OP_UPDATE`` (learn the label). A forecast uses the counts of
earlier updates only (prequential). The state of a stream is its count table n_{k,c} as float64
(exact for counts below 2^53), shape (C, K): flattened category-major, entry k * K + c.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from calpipe.config import VENN_DEFAULT_N_BINS
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE
from calpipe.kernels.prediction import Prediction

__all__ = [
    "OP_FORECAST",
    "OP_STEP",
    "OP_UPDATE",
    "TAXONOMY_CATEGORY",
    "TAXONOMY_SCORE_BINARY",
    "TAXONOMY_SCORE_MULTICLASS",
    "category_of",
    "equal_mass_edges",
    "fit",
    "n_categories_of",
    "predict",
    "venn_initial_counts",
    "venn_online",
]

#: Taxonomy codes stored in the fitted vector (entry 0).
TAXONOMY_SCORE_BINARY = 0
TAXONOMY_SCORE_MULTICLASS = 1
TAXONOMY_CATEGORY = 2

_HEADER = 4  # fitted = [taxonomy, K, C, n_edges, edges (n_edges), counts (C * K, category-major)]


# --------------------------------------------------------------------------------------------
# Taxonomy
# --------------------------------------------------------------------------------------------
def equal_mass_edges(scores: np.ndarray, n_bins: int = VENN_DEFAULT_N_BINS) -> np.ndarray:
    """Interior bin edges splitting ``scores`` into about ``n_bins`` groups of equal mass.

    With the sorted scores v_0 <= ... <= v_{n-1}, the j-th boundary (j = 1, ..., n_bins - 1) is
    wanted before position q_j = round(j n / n_bins). A bin is a function of the score value, so a
    tie block is never split: the boundary moves to the start i of the tie block holding v_{q_j}
    and the edge is the midpoint (v_{i-1} + v_i) / 2 (or v_i if the midpoint rounds down to
    v_{i-1}). Boundaries at the minimum and duplicates are dropped, so heavy ties give fewer bins.

    Parameters
    ----------
    scores : array_like, shape (n,)
        Calibration-window values (binary base scores; for K classes the caller passes the
        maximum class probability).
    n_bins : int
        Wanted number of bins (>= 1).

    Returns
    -------
    ndarray of float64, shape (m,), m <= n_bins - 1
        Strictly increasing interior edges; use with :func:`category_of`. Bin k of a value s is
        #{j : edges[j] <= s}; with distinct scores, bin k holds exactly q_{k+1} - q_k of them.

    Examples
    --------
    >>> equal_mass_edges(np.array([0.1, 0.2, 0.3, 0.4]), 2)
    array([0.25])
    >>> equal_mass_edges(np.array([0.1, 0.5, 0.5, 0.5, 0.9]), 5)  # the tie block stays whole
    array([0.3, 0.7])
    """
    v = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    n = v.shape[0]
    if n == 0 or n_bins <= 1:
        return np.empty(0, dtype=np.float64)
    j = np.arange(1, n_bins, dtype=np.int64)
    q = (2 * j * n + n_bins) // (2 * n_bins)  # round(j n / n_bins), exact integer arithmetic
    q = q[(q > 0) & (q < n)]
    start = np.searchsorted(v, v[q], side="left")  # first index of each tie block
    start = np.unique(start[start > 0])
    lo, hi = v[start - 1], v[start]
    mid = 0.5 * (lo + hi)
    return np.ascontiguousarray(np.where(mid > lo, mid, hi))


def category_of(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The taxonomy category of each event from its base score(s).

    Binary (``scores`` of shape (n,)): k = #{j : edges[j] <= s}, in [0, len(edges)].
    K classes (shape (n, K)): k = argmax_c s_c * (len(edges) + 1) + bin(max_c s_c), in
    [0, K (len(edges) + 1)); ties in the argmax go to the lowest class.

    Examples
    --------
    >>> category_of(np.array([0.1, 0.25, 0.9]), np.array([0.25, 0.5]))
    array([0, 1, 2])
    >>> category_of(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]), np.array([0.65]))
    array([1, 4])
    """
    s = np.asarray(scores, dtype=np.float64)
    e = np.ascontiguousarray(edges, dtype=np.float64)
    if s.ndim == 1:
        return np.searchsorted(e, s, side="right").astype(np.int64)
    if s.ndim != 2:
        raise ValueError(f"scores must be 1-D or 2-D, got shape {s.shape}")
    top = np.argmax(s, axis=1).astype(np.int64)
    conf = s[np.arange(s.shape[0]), top]
    return top * (e.shape[0] + 1) + np.searchsorted(e, conf, side="right").astype(np.int64)


def n_categories_of(edges: np.ndarray, n_classes: int = 2, multiclass: bool = False) -> int:
    """Number of categories C of the score taxonomy: len(edges) + 1, times K if ``multiclass``.

    >>> n_categories_of(np.array([0.3, 0.6])), n_categories_of(np.array([0.5]), 3, True)
    (3, 6)
    """
    b = int(np.asarray(edges).shape[0]) + 1
    return b * n_classes if multiclass else b


def venn_initial_counts(n_streams: int, n_categories: int, n_classes: int = 2) -> np.ndarray:
    """The initial online state: zero counts, shape (S, C, K) float64.

    >>> venn_initial_counts(2, 3).shape
    (2, 3, 2)
    """
    return np.zeros((n_streams, n_categories, n_classes), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _venn_row(cnt, lower, upper, point, order):
    """Multiprobability bounds and minimax merge of one group with counts cnt[c] = n_{k,c}.

    order (K,) int64 is scratch space. Writes lower/upper/point in place (see module docstring).
    """
    k = cnt.shape[0]
    n = 0.0
    big = 0.0
    for c in range(k):
        n += cnt[c]
        big = max(big, cnt[c])
    den = n + 1.0  # |G|: the group with the new example
    for c in range(k):
        lower[c] = cnt[c] / den
        upper[c] = (cnt[c] + 1.0) / den
    if (k - 1) * big <= den:
        # Every class active: q_c = upper_c / sum(upper) = (n_c + 1) / (n + K) (Laplace's rule).
        tot = n + k
        for c in range(k):
            point[c] = (cnt[c] + 1.0) / tot
        return
    # Water-filling: classes sorted by count ascending; the m smallest are active (w_c > 0).
    for c in range(k):
        order[c] = c
    for i in range(1, k):  # insertion sort, stable, K is small
        j = i
        while j > 0 and cnt[order[j - 1]] > cnt[order[j]]:
            t = order[j - 1]
            order[j - 1] = order[j]
            order[j] = t
            j -= 1
    m = k - 1  # m = K is infeasible here (the test above failed)
    a_sum = 0.0  # A = sum_active (n_c + 1)
    b_sum = 1.0  # B = 1 + sum_active n_c;  r = A / B = upper_c / q_c on the active classes
    for i in range(m):
        a_sum += cnt[order[i]] + 1.0
        b_sum += cnt[order[i]]
    while m > 1:
        top = cnt[order[m - 1]]
        if (top + 1.0) * b_sum >= a_sum * top:  # w >= 0 for the largest active count
            break
        m -= 1
        a_sum -= top + 1.0
        b_sum -= top
    scale = b_sum / (a_sum * den)
    for i in range(k):
        c = order[i]
        if i < m:
            # In [lower, upper] exactly (the maths guarantees it; rounding could miss by an ulp).
            point[c] = min(max((cnt[c] + 1.0) * scale, lower[c]), upper[c])
        else:
            point[c] = lower[c]


@njit(cache=True)
def _venn_online(cat, y, op_event, op_kind, op_offsets, counts0):
    """Online Venn predictor over the op list (paper 002 §3 with a fixed-category taxonomy).

    cat (n,) int64 in [0, C); y (n,) int64 in [0, K), read by updates only; op_event (m,) int64;
    op_kind (m,) int8; op_offsets (S+1,) int64; counts0 (S, C, K) float64.

    Returns (p, lower, upper) each (n, K), and the counts (S, C, K). Events without a forecast
    operation keep NaN.
    """
    n = cat.shape[0]
    n_streams = op_offsets.shape[0] - 1
    k = counts0.shape[2]
    out_p = np.full((n, k), np.nan)
    out_lo = np.full((n, k), np.nan)
    out_hi = np.full((n, k), np.nan)
    counts = counts0.copy()
    order = np.empty(k, dtype=np.int64)
    for s in range(n_streams):
        cs = counts[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            g = cat[e]
            if kind != OP_UPDATE:
                # Prequential: the counts of earlier updates only.
                _venn_row(cs[g], out_lo[e], out_hi[e], out_p[e], order)
            if kind != OP_FORECAST:
                cs[g, y[e]] += 1.0
    return out_p, out_lo, out_hi, counts


@njit(cache=True)
def _venn_rows(cat, counts):
    """Batch prediction: row i from counts[cat[i]]; a category outside [0, C) is an empty group."""
    n = cat.shape[0]
    n_cat, k = counts.shape
    out_p = np.empty((n, k))
    out_lo = np.empty((n, k))
    out_hi = np.empty((n, k))
    empty = np.zeros(k)
    order = np.empty(k, dtype=np.int64)
    for i in range(n):
        g = cat[i]
        row = counts[g] if 0 <= g < n_cat else empty
        _venn_row(row, out_lo[i], out_hi[i], out_p[i], order)
    return out_p, out_lo, out_hi


# --------------------------------------------------------------------------------------------
# Public wrappers
# --------------------------------------------------------------------------------------------
def _as_binary(p, lo, hi, binary):
    if not binary:
        return p, lo, hi
    return tuple(np.ascontiguousarray(a[:, 1]) for a in (p, lo, hi))


def venn_online(
    scores: np.ndarray | None,
    categories: np.ndarray | None,
    labels: np.ndarray,
    op_event: np.ndarray,
    op_kind: np.ndarray,
    op_offsets: np.ndarray,
    counts: np.ndarray,
    edges: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Online Venn predictor over an operation list, all streams in one call (paper 002 §3).

    For each forecast of an event in category k, with the counts n_{k,c} of the stream's earlier
    updates: lower_c = n_{k,c} / (n_k + 1), upper_c = (n_{k,c} + 1) / (n_k + 1) and the minimax
    log-loss merge p (module docstring; binary: (n_{k,1} + 1) / (n_k + 2) = p1 / (1 - p0 + p1)).
    An update adds 1 to n_{k, y}.

    Parameters
    ----------
    scores : ndarray or None
        Base scores, (n,) binary or (n, K); used for the categories when ``categories`` is None
        (with ``edges``, see :func:`category_of`) and to choose the output shape. None: binary
        output iff K = 2.
    categories : ndarray of int64, shape (n,), or None
        Category of each event in [0, C) (user taxonomy, or precomputed by :func:`category_of`).
    labels : ndarray of int, shape (n,)
        Labels in [0, K); only those of events with an update operation are read.
    op_event, op_kind, op_offsets : ndarray
        The operation list (int64 event indices, int8 kinds, int64 S + 1 stream bounds).
    counts : ndarray of float64, shape (S, C, K)
        State in: each stream's counts (:func:`venn_initial_counts` to start). Not modified.
    edges : ndarray, optional
        Bin edges, needed only when ``categories`` is None.

    Returns
    -------
    p, lower, upper : ndarray
        (n,) probabilities of label 1 (binary) or (n, K); NaN for events never forecast.
    new_counts : ndarray, shape (S, C, K)
        State out.

    Examples
    --------
    One stream, one category; labels 1, 1, 0 learned one by one (OP_STEP):

    >>> p, lo, hi, c = venn_online(
    ...     None, np.zeros(3, np.int64), np.array([1, 1, 0]), np.arange(3),
    ...     np.zeros(3, np.int8), np.array([0, 3]), venn_initial_counts(1, 1))
    >>> lo, hi  # [0, 1] with no data, then [1/2, 1], then [2/3, 1]
    (array([0.        , 0.5       , 0.66666667]), array([1., 1., 1.]))
    >>> p  # (n_1 + 1) / (n + 2): 1/2, 2/3, 3/4
    array([0.5       , 0.66666667, 0.75      ])
    >>> c[0].tolist()
    [[1.0, 2.0]]
    """
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    if counts.ndim != 3:
        raise ValueError(f"counts must have shape (S, C, K), got {counts.shape}")
    n_streams, n_cat, k = counts.shape
    s = None if scores is None else np.asarray(scores, dtype=np.float64)
    if categories is None:
        if s is None or edges is None:
            raise ValueError("give categories, or scores and edges")
        categories = category_of(s, edges)
    cat = np.ascontiguousarray(categories, dtype=np.int64)
    if cat.ndim != 1:
        raise ValueError("categories must be 1-D")
    n = cat.shape[0]
    y = np.ascontiguousarray(labels, dtype=np.int64)
    op_event = np.ascontiguousarray(op_event, dtype=np.int64)
    op_kind = np.ascontiguousarray(op_kind, dtype=np.int8)
    op_offsets = np.ascontiguousarray(op_offsets, dtype=np.int64)
    if y.shape != (n,) or (s is not None and s.shape[0] != n):
        raise ValueError("scores, categories and labels must have one entry per event")
    if s is not None and s.ndim == 2 and s.shape[1] != k:
        raise ValueError(f"scores have {s.shape[1]} classes, counts {k}")
    if op_event.shape != op_kind.shape or op_offsets.shape != (n_streams + 1,):
        raise ValueError("op_event/op_kind lengths differ or op_offsets is not (S + 1,)")
    if op_event.size and (op_event.min() < 0 or op_event.max() >= n):
        raise ValueError("op_event out of range")
    if n and (cat.min() < 0 or cat.max() >= n_cat):
        raise ValueError(f"categories must lie in [0, {n_cat})")
    read = y[op_event[op_kind != OP_FORECAST]]
    if read.size and (read.min() < 0 or read.max() >= k):
        raise ValueError(f"labels of updated events must lie in [0, {k})")
    p, lo, hi, new = _venn_online(cat, y, op_event, op_kind, op_offsets, counts)
    binary = k == 2 and (s is None or s.ndim == 1)
    p, lo, hi = _as_binary(p, lo, hi, binary)
    return p, lo, hi, new


def fit(
    scores: np.ndarray,
    labels: np.ndarray,
    n_bins: int = VENN_DEFAULT_N_BINS,
    categories: np.ndarray | None = None,
    n_categories: int | None = None,
) -> np.ndarray:
    """Fit an inductive Venn predictor: the taxonomy and the counts of a calibration window.

    Score taxonomy (``categories`` None): edges = :func:`equal_mass_edges` of the scores (binary)
    or of the maximum class probability (K classes), categories by :func:`category_of`. User
    taxonomy: the given int64 codes, C = ``n_categories`` (default: max code + 1).
    Counts n_{k,c} = #{i : category_i = k, label_i = c}.

    Returns
    -------
    ndarray of float64
        ``[taxonomy, K, C, n_edges, edges..., counts...]`` with taxonomy 0 (binary score bins),
        1 (predicted class x confidence bins) or 2 (user categories) and the C x K counts
        category-major. Degenerate windows need no special case: one point or tied scores give no
        edge (one bin); a single class gives zero counts for the others.

    Examples
    --------
    >>> fit(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 1, 1, 1]), n_bins=2)
    array([0. , 2. , 2. , 1. , 0.5, 1. , 1. , 0. , 2. ])
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if s.ndim not in (1, 2) or y.shape != (s.shape[0],):
        raise ValueError("scores must be (n,) or (n, K) and labels (n,)")
    k = 2 if s.ndim == 1 else s.shape[1]
    if categories is None:
        taxonomy = TAXONOMY_SCORE_BINARY if s.ndim == 1 else TAXONOMY_SCORE_MULTICLASS
        edges = equal_mass_edges(s if s.ndim == 1 else s.max(axis=1), n_bins)
        cat = category_of(s, edges)
        n_cat = n_categories_of(edges, k, s.ndim == 2)
    else:
        taxonomy = TAXONOMY_CATEGORY
        edges = np.empty(0, dtype=np.float64)
        cat = np.asarray(categories, dtype=np.int64)
        if cat.shape != y.shape:
            raise ValueError("categories must have one entry per event")
        n_cat = int(n_categories) if n_categories is not None else int(cat.max(initial=-1)) + 1
        if cat.size and (cat.min() < 0 or cat.max() >= n_cat):
            raise ValueError(f"categories must lie in [0, {n_cat})")
    if y.size and (y.min() < 0 or y.max() >= k):
        raise ValueError(f"labels must lie in [0, {k})")
    counts = np.bincount(cat * k + y, minlength=n_cat * k).astype(np.float64)
    head = np.array([taxonomy, k, n_cat, edges.shape[0]], dtype=np.float64)
    return np.ascontiguousarray(np.concatenate([head, edges, counts]))


def bin_edges(fitted: np.ndarray) -> np.ndarray:
    """The edges of a fitted score taxonomy (where a score's category changes)."""
    return _unpack(fitted)[2]


def _unpack(fitted: np.ndarray):
    f = np.asarray(fitted, dtype=np.float64)
    taxonomy, k, n_cat, n_edges = (int(v) for v in f[:_HEADER])
    edges = f[_HEADER : _HEADER + n_edges]
    counts = np.ascontiguousarray(f[_HEADER + n_edges :].reshape(n_cat, k))
    return taxonomy, k, edges, counts


def category_forecasts(fitted: np.ndarray, counts: np.ndarray | None = None):
    """``(edges, forecasts)`` of a fitted K-class score taxonomy (or of the ``counts`` (C, K) of
    an online one, ``fitted`` then being its edges): the forecast of category k is row k, the
    merge :func:`predict` makes for a score in it (category :func:`category_of`)."""
    if counts is None:
        taxonomy, _, edges, counts = _unpack(fitted)
        if taxonomy != TAXONOMY_SCORE_MULTICLASS:
            raise ValueError("not a K-class score taxonomy")
    else:
        edges = np.ascontiguousarray(fitted, dtype=np.float64)
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    return edges, _venn_rows(np.arange(counts.shape[0], dtype=np.int64), counts)[0]


def predict(
    fitted: np.ndarray, scores: np.ndarray, categories: np.ndarray | None = None
) -> Prediction:
    """Venn multiprobability bounds and merged forecast for new events (paper 002 §3).

    Each event joins its category's calibration counts as the (n_k + 1)-th example:
    lower_c = n_{k,c} / (n_k + 1), upper_c = (n_{k,c} + 1) / (n_k + 1), p = minimax log-loss
    merge (module docstring). Scores outside the calibration range fall in the end bins; a
    user category never seen in the window (or outside [0, C)) is an empty group: lower = 0,
    upper = 1, p = 1/K.

    Returns
    -------
    Prediction
        ``p``, ``p_lower``, ``p_upper``: (n,) of label 1 (binary score taxonomy, or user categories
        with 1-D scores) or (n, K).

    Examples
    --------
    >>> f = fit(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 1, 1, 1]), n_bins=2)
    >>> pr = predict(f, np.array([0.0, 0.95]))
    >>> pr.p_lower, pr.p, pr.p_upper  # bin 0: one 0 and one 1; bin 1: two 1s
    (array([0.33333333, 0.66666667]), array([0.5 , 0.75]), array([0.66666667, 1.        ]))
    """
    taxonomy, k, edges, counts = _unpack(fitted)
    s = np.asarray(scores, dtype=np.float64)
    if taxonomy == TAXONOMY_CATEGORY:
        if categories is None:
            raise ValueError("this Venn predictor was fitted on user categories: give categories")
        cat = np.ascontiguousarray(categories, dtype=np.int64)
        binary = k == 2 and s.ndim == 1
    else:
        if (taxonomy == TAXONOMY_SCORE_BINARY) != (s.ndim == 1):
            raise ValueError("scores have the wrong shape for this fitted Venn predictor")
        if s.ndim == 2 and s.shape[1] != k:
            raise ValueError(f"scores have {s.shape[1]} classes, the fit {k}")
        cat = category_of(s, edges)
        binary = taxonomy == TAXONOMY_SCORE_BINARY
    p, lo, hi = _as_binary(*_venn_rows(cat, counts), binary)
    return Prediction(p, lo, hi)
