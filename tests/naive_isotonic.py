"""Naive oracles for calpipe.kernels.isotonic: slow, obvious loops straight from paper 003
(Berta, Bach & Jordan, "Classifier Calibration with ROC-Regularized Isotonic Regression").

Nothing here imports calpipe's kernels. Values are exact (``fractions.Fraction``) wherever the
algorithm compares them; the split gain M_R(gamma) is a float computed in the same order as the
kernel's, so that ties between candidate splits are broken identically.

* :func:`pool_ties` - scikit-learn's ``_make_unique`` rule, one score at a time.
* :func:`pav` - Algorithm 1 as printed: while r is not monotone, pool one violating pair.
* :func:`binary_map` - the fitted threshold map, evaluated by a search over the thresholds.
* :func:`roc_points`, :func:`upper_hull` - the empirical ROC curve and its upper convex hull by
  brute force over pairs of points (Theorem 2.1).
* :func:`rrir_binary` - Algorithm 2 on the line (K = 2: thresholds on the score, r monotone).
* :func:`rrir_multiclass` - Algorithm 2 on the simplex with the pairwise ROC-monotonicity check
  over every pair of calibration points.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import pairwise

import numpy as np

RESOLUTION = 1e-15  # sklearn: np.finfo(np.float64).resolution


# ----------------------------------------------------------------------------------------------
# Binary isotonic regression
# ----------------------------------------------------------------------------------------------
def pool_ties(scores, labels):
    """Sorted tie groups: [(first score, count, positives)] (sklearn ``_make_unique``)."""
    pairs = sorted(zip(scores.tolist(), labels.tolist(), strict=True), key=lambda t: t[0])
    groups: list[list] = []
    for s, y in pairs:
        if groups and s - groups[-1][0] < RESOLUTION:
            groups[-1][1] += 1
            groups[-1][2] += y
        else:
            groups.append([s, 1, y])
    return [tuple(g) for g in groups]


def pav(values, weights):
    """Paper 003 Algorithm 1 (PAV), literally: blocks [value, weight, members]; while some
    r_i < r_{i-1}, pool the first such pair. Returns the value of every input point."""
    blocks = [[Fraction(v), Fraction(w), 1] for v, w in zip(values, weights, strict=True)]
    while True:
        bad = next((i for i in range(1, len(blocks)) if blocks[i][0] < blocks[i - 1][0]), None)
        if bad is None:
            break
        (v0, w0, m0), (v1, w1, m1) = blocks[bad - 1], blocks[bad]
        blocks[bad - 1 : bad + 1] = [[(w0 * v0 + w1 * v1) / (w0 + w1), w0 + w1, m0 + m1]]
    out = []
    for v, _, m in blocks:
        out += [v] * m
    return out


def isotonic_thresholds(scores, labels):
    """(x, r): pooled scores and their PAV values (Fractions)."""
    groups = pool_ties(scores, labels)
    r = pav([Fraction(p, c) for _, c, p in groups], [c for _, c, _ in groups])
    return [g[0] for g in groups], r


def binary_map(x, r, s, step):
    """Evaluate the threshold map at one score: clip to [x_1, x_m]; step: r_j of the largest
    x_j <= s; linear: the straight line through the two neighbouring thresholds."""
    if math.isnan(s):
        return math.nan
    s = min(max(s, x[0]), x[-1])
    if len(x) == 1:
        return float(r[0])
    if step:
        j = max(j for j in range(len(x)) if x[j] <= s)
        return float(r[j])
    j = next(j for j in range(1, len(x)) if s <= x[j])
    w = (s - x[j - 1]) / (x[j] - x[j - 1])
    return float(r[j - 1]) + w * (float(r[j]) - float(r[j - 1]))


# ----------------------------------------------------------------------------------------------
# ROC curves
# ----------------------------------------------------------------------------------------------
def roc_points(scores, labels):
    """Empirical ROC curve: (FPR, TPR) as Fractions when predicting 1 for scores >= t, t running
    down the distinct scores, from (0, 0) to (1, 1)."""
    n1 = sum(1 for y in labels if y == 1)
    n0 = len(labels) - n1
    pts = [(Fraction(0), Fraction(0))]
    tp = fp = 0
    for t in sorted(set(scores.tolist()), reverse=True):
        for s, y in zip(scores.tolist(), labels.tolist(), strict=True):
            if s == t:
                tp += y == 1
                fp += y == 0
        pts.append((Fraction(fp, n0), Fraction(tp, n1)))
    return pts


def upper_hull(points, x):
    """Value at x of the upper convex hull of ``points``: the maximum over pairs (a, b) with
    x_a <= x <= x_b of the chord through them at x (Carathéodory on a line)."""
    best = None
    for xa, ya in points:
        for xb, yb in points:
            if xa <= x <= xb:
                v = max(ya, yb) if xa == xb else ya + (yb - ya) * (x - xa) / (xb - xa)
                best = v if best is None else max(best, v)
    return best


def curve_value(points, x):
    """Upper value at x of the polyline through ``points`` in order (vertical runs: the top)."""
    best = None
    for (xa, ya), (xb, yb) in pairwise(points):
        if xa <= x <= xb:
            v = max(ya, yb) if xa == xb else ya + (yb - ya) * (x - xa) / (xb - xa)
            best = v if best is None else max(best, v)
    return best


# ----------------------------------------------------------------------------------------------
# Algorithm 2, K = 2 on the line
# ----------------------------------------------------------------------------------------------
def rrir_binary(scores, labels, max_regions=None, min_size=1):
    """Algorithm 2 for binary scores: regions are runs of tie groups, a split at a group gives
    (scores <= gamma, scores > gamma), admissible when the calibrated values stay
    non-decreasing (ROC monotone for K = 2). Returns (x, r) per tie group, r Fractions."""
    groups = pool_ties(scores, labels)
    x = [g[0] for g in groups]
    cnt = [g[1] for g in groups]
    pos = [g[2] for g in groups]

    def stats(a, b):
        return sum(cnt[a:b]), sum(pos[a:b])

    def gain(a, j, b):
        n, p = stats(a, b)
        nl, pl = stats(a, j)
        nu, pu = n - nl, p - pl
        m = p / n
        return nl * abs(m - pl / nl) + nu * abs(m - pu / nu)

    def value(a, b):
        n, p = stats(a, b)
        return Fraction(p, n)

    def split(a, b, leaves, check):
        best, best_j = 0.0, None
        for j in range(a + 1, b):
            if stats(a, j)[0] < min_size or stats(j, b)[0] < min_size:
                continue
            g = gain(a, j, b)
            if not g > best:
                continue
            if check:
                if max_regions is not None and len(leaves) + 1 > max_regions:
                    continue
                new = sorted([lf for lf in leaves if lf != (a, b)] + [(a, j), (j, b)])
                vals = [value(*lf) for lf in new]
                if any(v1 > v2 for v1, v2 in pairwise(vals)):
                    continue
            best, best_j = g, j
        return best, best_j

    leaves = [(0, len(x))]
    regions = [(0, len(x), split(0, len(x), leaves, False)[0])]
    while regions:
        t = max(range(len(regions)), key=lambda i: (regions[i][2], -i))
        a, b, _ = regions.pop(t)
        _, j = split(a, b, leaves, True)
        if j is None:
            continue
        leaves.remove((a, b))
        leaves += [(a, j), (j, b)]
        for lf in ((a, j), (j, b)):
            regions.append((*lf, split(*lf, leaves, False)[0]))
    r = [None] * len(x)
    for a, b in leaves:
        for g in range(a, b):
            r[g] = value(a, b)
    return x, r


# ----------------------------------------------------------------------------------------------
# Algorithm 2 on the simplex
# ----------------------------------------------------------------------------------------------
def _sector(row, gamma):
    """argmax_k (row_k - gamma_k), first index on ties."""
    d = [float(a) - float(b) for a, b in zip(row, gamma, strict=True)]
    return d.index(max(d))


def _mean(points, y, k):
    return tuple(Fraction(sum(1 for i in points if y[i] == c), len(points)) for c in range(k))


def _gain(points, parts, y, k):
    """M_R(gamma) = sum_k #S_k ||ybar_R - ybar_{S_k}||_2 (float, the kernel's order)."""
    ybar = [sum(1 for i in points if y[i] == c) / len(points) for c in range(k)]
    g = 0.0
    for part in parts:
        if part:
            d2 = 0.0
            for c in range(k):
                d = ybar[c] - sum(1 for i in part if y[i] == c) / len(part)
                d2 += d * d
            g += len(part) * math.sqrt(d2)
    return g


def roc_monotone(r, path):
    """The pairwise ROC-monotonicity conditions over every pair of calibration points in
    different regions: if their regions first part at a split into sub-regions a and c,
    r_i[a] - r_i[c] >= r_j[a] - r_j[c]."""
    pts = list(r)
    for i in pts:
        for j in pts:
            pi, pj = path[i], path[j]
            if pi == pj:
                continue
            t = next(t for t in range(min(len(pi), len(pj))) if pi[t] != pj[t])
            a, c = pi[t], pj[t]
            if r[i][a] - r[i][c] < r[j][a] - r[j][c]:
                return False
    return True


def rrir_multiclass(p, y, max_regions=None, min_size=1, max_cand=0):
    """Paper 003 Algorithm 2, literally (see the module docstring of calpipe.kernels.isotonic
    for the decisions). Returns (r, tree): r[i] the calibrated vector (Fractions) of each
    calibration point; tree a list of nodes {points, path, gamma, children, value}."""
    n, k = p.shape
    y = [int(v) for v in y]
    tree = [{"points": list(range(n)), "path": (), "gamma": None, "children": None}]

    def candidates(points):
        m = len(points)
        if max_cand <= 0 or m <= max_cand:
            return list(points)
        return [points[(t * m) // max_cand] for t in range(max_cand)]

    def parts_of(points, gamma):
        parts = [[] for _ in range(k)]
        for i in points:
            parts[_sector(p[i], gamma)].append(i)
        return parts

    def split(node, r, path, n_leaves, check):
        """Algorithm 2 procedure split(R, p, r, y)."""
        pts = tree[node]["points"]
        best, found = 0.0, None
        for g in candidates(pts):
            parts = parts_of(pts, p[g])
            sizes = [len(s) for s in parts if s]
            if len(sizes) < 2 or min(sizes) < min_size:
                continue
            m = _gain(pts, parts, y, k)
            if not m > best:
                continue
            if check:
                if max_regions is not None and n_leaves + len(sizes) - 1 > max_regions:
                    continue
                r_hat = dict(r)
                path_hat = dict(path)
                for kk, part in enumerate(parts):
                    for i in part:
                        r_hat[i] = _mean(part, y, k)
                        path_hat[i] = (*tree[node]["path"], kk)
                if not roc_monotone(r_hat, path_hat):
                    continue
            best, found = m, (g, parts)
        return best, found

    r = {i: _mean(range(n), y, k) for i in range(n)}  # r <- ybar (one region)
    path = {i: () for i in range(n)}
    regions = [(0, split(0, r, path, 1, False)[0])]
    n_leaves = 1
    while regions:
        t = max(range(len(regions)), key=lambda i: (regions[i][1], -i))
        node, _ = regions.pop(t)
        _, found = split(node, r, path, n_leaves, True)
        if found is None:
            continue
        g, parts = found
        tree[node]["gamma"] = p[g].copy()
        tree[node]["children"] = []
        for kk, part in enumerate(parts):
            child = len(tree)
            tree[node]["children"].append(child)
            tree.append(
                {"points": part, "path": (*tree[node]["path"], kk), "gamma": None, "children": None}
            )
            for i in part:
                r[i] = _mean(part, y, k)
                path[i] = tree[child]["path"]
        n_leaves += sum(1 for part in parts if part) - 1
        for child in tree[node]["children"]:
            if tree[child]["points"]:
                regions.append((child, split(child, r, path, n_leaves, False)[0]))
    for node in tree:  # leaf values; an empty leaf takes its parent's mean
        if node["points"]:
            node["value"] = _mean(node["points"], y, k)
    for node in tree:
        for child in node["children"] or []:
            if not tree[child]["points"]:
                tree[child]["value"] = node["value"]
    return [r[i] for i in range(n)], tree


def route(tree, row):
    """Value of the leaf reached by ``row`` (floats)."""
    node = tree[0]
    while node["children"] is not None:
        node = tree[node["children"][_sector(row, node["gamma"])]]
    return np.array([float(v) for v in node["value"]])
