"""Slow, obvious per-event loops of the online scaling methods, written from the papers.

Gupta & Ramdas, "Online Platt Scaling with Calibeating" (ICML 2023): Online Platt Scaling (OPS,
§2, Algorithm 1: the Online Newton Step of Hazan 2016, Algorithm 12, on the Platt parameters),
tracking and hedging calibeating (§3; Foster & Hart 2023) and online beta scaling (§5). The
oracles the kernels of :mod:`calpipe.kernels.online_scaling` are tested against: plain Python
and numpy, one event at a time, no shared code with the kernels.
"""

from __future__ import annotations

import math

import numpy as np


def features(p, kind: str, clip: float):
    """Feature vector u(p) of the scaling model: logit(m(p)) = theta . u(p)."""
    if kind == "platt":
        q = min(max(p, clip), 1.0 - clip)
        return np.array([math.log(q / (1.0 - q)), 1.0])
    if kind == "beta":
        q = min(max(p, clip), 1.0 - clip)
        return np.array([math.log(q), -math.log(1.0 - q), 1.0])
    # vector and matrix scaling, K classes: ln of the row floored at clip, renormalised
    q = np.maximum(np.asarray(p, dtype=float), clip)
    q = q / q.sum()
    return np.log(q)


def project(theta, a, radius):
    """argmin_{||x|| <= radius} (theta - x)^T A (theta - x), by bisection on the multiplier."""
    if float(theta @ theta) <= radius * radius:
        return theta

    def at(lam):
        return np.linalg.solve(a + lam * np.eye(a.shape[0]), a @ theta)

    lo, hi = 0.0, 1.0
    while float(at(hi) @ at(hi)) > radius * radius:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        x = at(mid)
        if float(x @ x) > radius * radius:
            lo = mid
        else:
            hi = mid
    return at(hi)


def matrix_stream(scores, labels, *, gamma=0.1, radius=100.0, eps=0.01, clip=0.01):
    """Online matrix scaling of one stream (all labels known), written from G&R Algorithm 1
    (Hazan 2016, Algorithm 12) with the multinomial logistic model of Guo et al. 2017:
    theta = (W (K x K, row-major), b (K)), forecast softmax(W ln q + b), theta_1 = (I, 0),
    A_0 = eps I; per label g = grad of -ln softmax(W ln q + b)_y = ((f - e_y) ln q^T, f - e_y),
    A += g g^T, theta <- Pi^A_{||.|| <= radius}(theta - A^-1 g / gamma)."""
    scores = np.asarray(scores, dtype=float)
    k = scores.shape[1]
    w = np.eye(k)
    b = np.zeros(k)
    a = eps * np.eye(k * k + k)
    out = []
    for p, y in zip(scores, labels, strict=True):
        lnq = features(p, "vector", clip)
        z = np.array([sum(w[c, j] * lnq[j] for j in range(k)) + b[c] for c in range(k)])
        e = np.exp(z - z.max())
        f = e / e.sum()
        out.append(f)
        r = f - np.eye(k)[y]
        g = np.concatenate([np.outer(r, lnq).ravel(), r])
        a = a + np.outer(g, g)
        theta = project(np.concatenate([w.ravel(), b]) - np.linalg.solve(a, g) / gamma, a, radius)
        w, b = theta[: k * k].reshape(k, k), theta[k * k :]
    return np.array(out)


def ons_stream(scores, labels, *, kind="platt", gamma=0.1, radius=100.0, eps=0.01, clip=0.01):
    """OPS / online beta / online vector scaling forecasts of one stream (all labels known)."""
    if kind == "matrix":
        return matrix_stream(scores, labels, gamma=gamma, radius=radius, eps=eps, clip=clip)
    binary = kind in ("platt", "beta")
    if kind == "platt":
        theta = np.array([1.0, 0.0])
    elif kind == "beta":
        theta = np.array([1.0, 1.0, 0.0])
    else:
        k = np.asarray(scores).shape[1]
        theta = np.concatenate([np.ones(k), np.zeros(k)])
    a = eps * np.eye(theta.size)
    out = []
    for p, y in zip(scores, labels, strict=True):
        u = features(p, kind, clip)
        if binary:
            z = float(theta @ u)
            f = 1.0 / (1.0 + math.exp(-z))
            out.append(f)
            g = (f - y) * u
        else:
            k = u.size
            z = theta[:k] * u + theta[k:]
            e = np.exp(z - z.max())
            f = e / e.sum()
            out.append(f)
            r = f.copy()
            r[y] -= 1.0
            g = np.concatenate([r * u, r])
        a = a + np.outer(g, g)
        theta = project(theta - np.linalg.solve(a, g) / gamma, a, radius)
    return np.array(out)


def tracking(expert, labels, n_bins=10):
    """Tracking calibeating (Foster & Hart): the mean label of earlier events whose expert
    forecast fell in the same of ``n_bins`` equal-width bins; the expert's forecast if none."""
    total = np.zeros(n_bins)
    count = np.zeros(n_bins)
    out = []
    for p, y in zip(expert, labels, strict=True):
        b = min(int(p * n_bins), n_bins - 1)
        out.append(total[b] / count[b] if count[b] > 0 else p)
        total[b] += y
        count[b] += 1
    return np.array(out)


def hedging(expert, labels, n_bins=10):
    """Hedging calibeating: in each bin of the expert's forecast, Foster's (1999) calibrated
    forecaster on the grid of bin midpoints m_i = (i + 1/2) / n_bins, in expectation.

    rho_i = sum over earlier events of the bin of w_i (y - m_i), where w_i is the weight the
    forecaster put on m_i. With b the expert's bin: if rho_b = 0, all weight on m_b; if
    rho_b > 0, the first i >= b with rho_i >= 0 >= rho_{i+1} going up (m_last if none); if
    rho_b < 0, the first such i going down from b - 1 (m_0 if none). At that i, weight
    q = |rho_{i+1}| / (rho_i + |rho_{i+1}|) on m_i and 1 - q on m_{i+1}; the forecast is the mean.
    """
    mids = (np.arange(n_bins) + 0.5) / n_bins
    rho = np.zeros((n_bins, n_bins))
    out = []
    for p, y in zip(expert, labels, strict=True):
        b = min(int(p * n_bins), n_bins - 1)
        r = rho[b]
        w = np.zeros(n_bins)
        if r[b] == 0.0:
            w[b] = 1.0
        else:
            steps = range(b, n_bins - 1) if r[b] > 0 else range(b - 1, -1, -1)
            hit = [i for i in steps if r[i] >= 0.0 >= r[i + 1]]
            if not hit:
                w[n_bins - 1 if r[b] > 0 else 0] = 1.0
            else:
                i = hit[0]
                q = -r[i + 1] / (r[i] - r[i + 1])
                w[i], w[i + 1] = q, 1.0 - q
        out.append(float(w @ mids))
        rho[b] = r + w * (y - mids)
    return np.array(out)
