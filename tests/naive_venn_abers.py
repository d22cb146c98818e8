"""Slow, obvious Venn-ABERS oracles written straight from the definitions (test-only).

* :func:`isotonic_fit` - weighted pool-adjacent-violators (PAV) on *distinct* scores: tied scores
  are pooled first (their labels averaged, weight = multiplicity), so the fit is a function of the
  score, as in Vovk & Petej (2014), Section 3, and scikit-learn's ``IsotonicRegression``.
* :func:`ivap_p0p1` - the inductive Venn-ABERS predictor by its definition (Vovk & Petej 2014,
  Algorithm 1): for a test score s and each hypothetical label y in {0, 1}, refit the isotonic
  regression on the calibration set plus (s, y) and read the fitted value at s; one full refit per
  test score and label, O(n) each.
* :func:`cvap`, :func:`multiclass` - fold and class loops over :func:`ivap_p0p1`, with the merges
  and the coupling written element by element.
"""

from __future__ import annotations

import math

import numpy as np


def isotonic_fit(x: list[float], y: list[float]) -> dict[float, float]:
    """Non-decreasing least-squares fit of y on x with ties pooled: {distinct x: fitted value}."""
    xs = sorted(set(x))
    # pool ties: (label sum, weight) per distinct score
    blocks = [[0.0, 0.0] for _ in xs]
    pos = {v: i for i, v in enumerate(xs)}
    for xi, yi in zip(x, y, strict=True):
        blocks[pos[xi]][0] += yi
        blocks[pos[xi]][1] += 1.0
    # PAV: a stack of [sum, weight, number of distinct scores]; merge while the means decrease
    stack: list[list[float]] = []
    for s, w in blocks:
        stack.append([s, w, 1])
        while len(stack) >= 2 and stack[-2][0] * stack[-1][1] > stack[-1][0] * stack[-2][1]:
            s2, w2, c2 = stack.pop()
            stack[-1][0] += s2
            stack[-1][1] += w2
            stack[-1][2] += c2
    out: dict[float, float] = {}
    i = 0
    for s, w, c in stack:
        for _ in range(int(c)):
            out[xs[i]] = s / w
            i += 1
    return out


def ivap_p0p1(cal_s, cal_y, test_s) -> tuple[np.ndarray, np.ndarray]:
    """(p0, p1) of the IVAP for every test score, one isotonic refit per score and label."""
    cal_s = [float(v) for v in cal_s]
    cal_y = [float(v) for v in cal_y]
    p0 = np.empty(len(test_s))
    p1 = np.empty(len(test_s))
    for t, s in enumerate(test_s):
        s = float(s)
        p0[t] = isotonic_fit([*cal_s, s], [*cal_y, 0.0])[s]
        p1[t] = isotonic_fit([*cal_s, s], [*cal_y, 1.0])[s]
    return p0, p1


def merge(p0: np.ndarray, p1: np.ndarray, how: str) -> np.ndarray:
    """Vovk, Petej & Fedorova (2015), Section 4: merge (m, F) stacks of p0, p1 into one p.

    log: p = GM(p1) / (GM(1 - p0) + GM(p1)); brier: p = mean(p1) + mean(p0^2)/2 - mean(p1^2)/2.
    """
    m, f = p0.shape
    out = np.empty(m)
    for i in range(m):
        if how == "log":
            g1 = math.exp(sum(math.log(v) for v in p1[i]) / f)
            g0 = math.exp(sum(math.log(1.0 - v) for v in p0[i]) / f)
            out[i] = g1 / (g0 + g1)
        else:
            out[i] = sum(p1[i]) / f + sum(v * v for v in p0[i]) / (2 * f)
            out[i] -= sum(v * v for v in p1[i]) / (2 * f)
    return out


def cvap(cal_s, cal_y, folds, test_s, how: str):
    """CVAP on fixed scores: fold f's points are the calibration set of IVAP f; merge the F pairs.

    Returns (p, p0 stack (m, F), p1 stack (m, F)); folds are taken in increasing fold id.
    """
    cal_s = np.asarray(cal_s, dtype=float)
    cal_y = np.asarray(cal_y)
    ids = sorted(set(np.asarray(folds).tolist()))
    p0 = np.empty((len(test_s), len(ids)))
    p1 = np.empty((len(test_s), len(ids)))
    for j, f in enumerate(ids):
        sel = np.asarray(folds) == f
        p0[:, j], p1[:, j] = ivap_p0p1(cal_s[sel], cal_y[sel], test_s)
    return merge(p0, p1, how), p0, p1


def _binary(cal_s, cal_y, folds, test_s, how):
    if len(cal_s) == 0:  # no calibration points: the vacuous multiprobability [0, 1]
        p0 = np.zeros((len(test_s), 1))
        p1 = np.ones((len(test_s), 1))
        return merge(p0, p1, how)
    return cvap(cal_s, cal_y, folds, test_s, how)[0]


def multiclass(cal_p, cal_y, folds, test_p, mode: str, how: str) -> np.ndarray:
    """One-vs-rest or one-vs-one (pairwise coupling) multiclass Venn-ABERS, element by element.

    ovr: class j's binary CVAP on score column j, labels 1{y = j}; rows renormalised.
    ovo: for i < j, the binary CVAP of "j vs i" on the points labelled i or j, with pair score
    s_j / (s_i + s_j) (1/2 when both are 0), giving q_{j|ij}; class c's coupled probability is
    1 / (sum_{o != c} 1 / q_{c|co} - (K - 2)) (Manokhin 2017, after Price et al. 1995), rows
    renormalised.
    """
    cal_p = np.asarray(cal_p, dtype=float)
    test_p = np.asarray(test_p, dtype=float)
    cal_y = np.asarray(cal_y)
    folds = np.asarray(folds)
    n_cls = cal_p.shape[1]
    m = test_p.shape[0]
    out = np.zeros((m, n_cls))
    if mode == "ovr":
        for c in range(n_cls):
            out[:, c] = _binary(cal_p[:, c], (cal_y == c).astype(int), folds, test_p[:, c], how)
    else:
        q = np.zeros((n_cls, n_cls, m))  # q[c, o] = P(c | c or o)
        for i in range(n_cls):
            for j in range(i + 1, n_cls):
                sel = (cal_y == i) | (cal_y == j)

                def pair(p, i=i, j=j):
                    tot = p[:, i] + p[:, j]
                    return np.array(
                        [p[r, j] / tot[r] if tot[r] > 0 else 0.5 for r in range(p.shape[0])]
                    )

                pj = _binary(
                    pair(cal_p[sel]), (cal_y[sel] == j).astype(int), folds[sel], pair(test_p), how
                )
                q[j, i] = pj
                q[i, j] = 1.0 - pj
        for r in range(m):
            for c in range(n_cls):
                tot = sum(1.0 / q[c, o, r] for o in range(n_cls) if o != c)
                out[r, c] = 1.0 / (tot - (n_cls - 2))
    return out / out.sum(axis=1, keepdims=True)
