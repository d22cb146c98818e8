"""Histogram binning (Zadrozny & Elkan 2001): equal-mass bins of the base score, each mapped to
the frequency of the label in it.

Binary scores (n,) are binned once; multiclass scores (n, K) are binned one-vs-rest, class by
class (bins of p_c, frequency of label c), and the K binned values are renormalised to sum to 1
(the one-vs-rest coupling of Zadrozny & Elkan 2002, "Transforming classifier scores into
accurate multiclass probability estimates", §3 "normalisation").

Bins
----
With the calibration scores sorted, s_(0) <= ... <= s_(n-1), and B = ``n_bins``, the candidate
cut values are the scores at ranks k_j = floor(j n / B), j = 1, ..., B - 1 (the j/B quantiles).
A bin is a half-open interval of score *values*, ``[v_j, v_{j+1})``, so tied scores are never
split: a tie block straddling a quantile goes entirely to the upper bin. Repeated cut values
and a cut equal to the minimum score would leave an empty bin and are dropped, so every bin
holds at least one calibration score and there are at most min(B, number of distinct scores)
bins. With distinct scores and n >= B there are exactly B bins, of floor(n/B) or ceil(n/B)
scores each. The outer bins are unbounded: a test score below (above) every calibration score
falls in the first (last) bin; a test score equal to a cut value falls in the bin above it,
like the calibration scores of that value.

The value of a bin with n_b scores of which k_b have the label is the m-estimate
(Zadrozny & Elkan 2001, §3; Cestnik 1990) ``(k_b + m r) / (n_b + m)``, m = ``prior_strength``
and r the label's frequency over the whole calibration set; m = 0 (default) is the plain bin
mean.

Fitted vector
-------------
``[G, block_0, ..., block_{G-1}]`` with G = 1 block (binary) or G = K blocks (class c = 0..K-1),
each block ``[B, v_1, ..., v_{B-1}, value_0, ..., value_{B-1}]`` (B bins, B - 1 increasing cut
values, B bin values).
"""

from __future__ import annotations

import numpy as np

from calpipe import config
from calpipe.kernels.prediction import Prediction


def _bin_block(s: np.ndarray, hit: np.ndarray, n_bins: int, prior_strength: float) -> np.ndarray:
    """``[B, cuts (B - 1), values (B)]`` of one score column ``s`` and 0/1 outcomes ``hit``."""
    n = s.size
    ranks = (np.arange(1, n_bins, dtype=np.int64) * n) // n_bins  # k_j = floor(j n / B)
    # the order statistics s_(0), s_(k_1), ... by selection, O(n log B), not a full sort
    kth = np.unique(np.r_[0, ranks])
    ordered = np.partition(s, kth)
    cuts = np.unique(ordered[ranks])  # sorted, repeated cut values merged
    cuts = cuts[cuts > ordered[0]]  # a cut at the minimum would leave bin 0 empty
    # bin b = #{cuts <= s}: [v_b, v_{b+1}), ties kept together (side="right")
    idx = np.searchsorted(cuts, s, side="right")
    n_b = np.bincount(idx, minlength=cuts.size + 1).astype(np.float64)
    k_b = np.bincount(idx, weights=hit, minlength=cuts.size + 1)
    rate = float(hit.mean())
    values = (k_b + prior_strength * rate) / (n_b + prior_strength)
    return np.concatenate(([float(cuts.size + 1)], cuts, values))


def fit(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    n_bins: int = config.HISTOGRAM_N_BINS,
    prior_strength: float = config.HISTOGRAM_PRIOR_STRENGTH,
) -> np.ndarray:
    """Fit histogram binning on calibration scores and labels.

    Equal-mass bins of the calibration scores (module docstring: cut values at the j/B
    quantile ranks, tied scores never split, no empty bin), each mapped to the m-estimate
    ``(k_b + m r) / (n_b + m)`` of the label frequency in the bin (Zadrozny & Elkan 2001).
    Multiclass: one-vs-rest, one set of bins per class column (renormalised in
    :func:`predict`).

    Degenerate sets do not raise: n = 1 or all scores tied give one bin whose value is the
    (smoothed) label frequency, i.e. a constant map; with a single class that constant is 0 or
    1 unless ``prior_strength`` > 0 and the prior rate r is not 0 or 1 (it is the calibration
    frequency, so a single-class set stays at 0 or 1: use a Venn or parametric method there).

    Parameters
    ----------
    scores : ndarray of float64, shape (n,) or (n, K)
        Base probabilities of label 1 (binary), or rows of class probabilities.
    labels : ndarray of int, shape (n,)
        Labels in {0, 1} (binary) or 0..K-1; n >= 1.
    n_bins : int
        Number B of equal-mass bins (``config.HISTOGRAM_N_BINS`` = 10, Zadrozny & Elkan's
        choice); fewer bins result when scores are tied or n < B.
    prior_strength : float
        m >= 0 of the m-estimate; the prior rate r is the label's frequency in the whole
        calibration set (Zadrozny & Elkan 2001, §3). 0 gives the plain bin mean.

    Returns
    -------
    ndarray of float64
        ``[G, blocks...]`` (module docstring).

    References
    ----------
    B. Zadrozny and C. Elkan, "Obtaining calibrated probability estimates from decision trees
    and naive Bayesian classifiers", ICML 2001, §3 (histogram binning, m-estimates).
    B. Zadrozny and C. Elkan, "Transforming classifier scores into accurate multiclass
    probability estimates", KDD 2002 (one-vs-rest coupling).

    Examples
    --------
    >>> import numpy as np
    >>> s = np.array([0.1, 0.2, 0.2, 0.2, 0.2, 0.6, 0.8, 0.9])
    >>> y = np.array([0, 0, 1, 0, 1, 1, 1, 0])
    >>> fitted = fit(s, y, n_bins=4)  # quantile cuts 0.2, 0.2, 0.8: the 0.2 block is not split
    >>> fitted  # [G, B, cuts, values]: bins {0.1}, {0.2 x 4, 0.6}, {0.8, 0.9}
    array([1. , 3. , 0.2, 0.8, 0. , 0.6, 0.5])
    >>> predict(fitted, np.array([0.0, 0.2, 0.79, 0.8, 1.0])).p
    array([0. , 0.6, 0.6, 0.5, 0.5])
    >>> fit(s, y, n_bins=4, prior_strength=2.0)[-3:]  # (k + 2 r) / (n + 2), r = 1/2
    array([0.33333333, 0.57142857, 0.5       ])
    """
    s = np.ascontiguousarray(scores, dtype=np.float64)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if s.ndim not in (1, 2) or (s.ndim == 2 and s.shape[1] < 2):
        raise ValueError(f"scores must be (n,) or (n, K >= 2), got shape {s.shape}")
    if y.shape != (s.shape[0],):
        raise ValueError(f"labels shape {y.shape} != ({s.shape[0]},)")
    if y.size == 0:
        raise ValueError("need at least one labelled score")
    n_classes = 2 if s.ndim == 1 else s.shape[1]
    if y.min() < 0 or y.max() >= n_classes:
        raise ValueError(f"labels must be in 0..{n_classes - 1}")
    n_bins = int(n_bins)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    prior_strength = float(prior_strength)
    if s.ndim == 1:
        blocks = [_bin_block(s, (y == 1).astype(np.float64), n_bins, prior_strength)]
    else:
        blocks = [
            _bin_block(
                np.ascontiguousarray(s[:, c]), (y == c).astype(np.float64), n_bins, prior_strength
            )
            for c in range(n_classes)
        ]
    return np.concatenate([[float(len(blocks))], *blocks])


def _unpack(fitted: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (cuts, values) of each block of a fitted vector."""
    f = np.ascontiguousarray(fitted, dtype=np.float64)
    if f.ndim != 1 or f.size < 3:
        raise ValueError("not a histogram-binning fitted vector")
    n_blocks = int(f[0])
    out = []
    pos = 1
    for _ in range(n_blocks):
        n_b = int(f[pos])
        cuts = f[pos + 1 : pos + n_b]
        values = f[pos + n_b : pos + 2 * n_b]
        if n_b < 1 or values.size != n_b:
            raise ValueError("truncated histogram-binning fitted vector")
        out.append((cuts, values))
        pos += 2 * n_b
    if pos != f.size:
        raise ValueError("histogram-binning fitted vector has trailing entries")
    return out


def class_tables(fitted: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """A multiclass fitted vector's bins per class: ``(cuts, values)``, class c's value of p_c
    is ``values[#{cuts <= p_c}]`` (before the renormalisation of :func:`predict`)."""
    blocks = _unpack(fitted)
    if len(blocks) < 2:
        raise ValueError("not a multiclass histogram-binning fitted vector")
    return blocks


def binary_cuts(fitted: np.ndarray) -> np.ndarray:
    """The cuts between the bins of a binary fitted vector (where its map changes value)."""
    blocks = _unpack(fitted)
    if len(blocks) != 1:
        raise ValueError("not a binary histogram-binning fitted vector")
    return blocks[0][0]


def predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Apply fitted histogram binning: the value of the bin holding each score.

    Binary: ``p`` (n,) is the bin value. Multiclass: the value of each class's bin of p_c,
    renormalised over the classes; a row whose K values are all 0 (every class's bin saw no
    occurrence of that class, possible with ``prior_strength=0``) keeps the base row p (no
    information to rescale).

    Parameters
    ----------
    fitted : ndarray of float64
        From :func:`fit`.
    scores : ndarray of float64, shape (n,) or (n, K)
        Base probabilities, of the shape used at fit time (any values; out of range go to the
        outer bins).

    Returns
    -------
    Prediction
        ``p`` of the shape of ``scores``.

    Examples
    --------
    >>> import numpy as np
    >>> s = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    >>> y = np.array([0, 1, 2, 1])
    >>> fitted = fit(s, y, n_bins=2)
    >>> p = predict(fitted, s).p
    >>> p.shape, bool(np.allclose(p.sum(axis=1), 1.0))
    ((4, 3), True)
    """
    blocks = _unpack(fitted)
    s = np.ascontiguousarray(scores, dtype=np.float64)
    if s.ndim == 1:
        if len(blocks) != 1:
            raise ValueError(f"fitted for {len(blocks)} classes, got binary scores")
        cuts, values = blocks[0]
        return Prediction(values[np.searchsorted(cuts, s, side="right")])
    if s.ndim != 2 or s.shape[1] != len(blocks) or len(blocks) < 2:
        raise ValueError(f"scores shape {s.shape} does not match {len(blocks)} fitted classes")
    raw = np.empty_like(s)
    for c, (cuts, values) in enumerate(blocks):
        raw[:, c] = values[np.searchsorted(cuts, s[:, c], side="right")]
    total = raw.sum(axis=1, keepdims=True)
    empty = total[:, 0] <= 0.0
    p = raw / np.where(empty[:, None], 1.0, total)
    p[empty] = s[empty]
    return Prediction(p)
