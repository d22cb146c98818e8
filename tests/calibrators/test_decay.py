"""calpipe.kernels.decay_beta and the ``decay-beta`` calibrator: against a slow per-event loop
written from the module docstring, whose refits use scipy's optimiser (an independent solver of
the same strictly convex problem, so the two agree to the optimisers' tolerance)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from calpipe import config
from calpipe.calibrators import make_calibrator
from calpipe.kernels import decay_beta as DB


def _penalised(w, x1, x2, pos, neg, rho):
    z = w[0] * x1 + w[1] * x2 + w[2]
    nll = pos * np.logaddexp(0, -z) + neg * np.logaddexp(0, z)
    return nll.sum() + 0.5 * rho * ((w[0] - 1) ** 2 + (w[1] - 1) ** 2 + w[2] ** 2)


def _fit(x1, x2, pos, neg, rho):
    """The penalised fit; a negative a or b fixed at 0 (the more negative first) and refitted."""
    fixed: dict[int, float] = {}
    for _ in range(3):
        free = [i for i in range(3) if i not in fixed]

        def f(v, free=free):
            w = np.zeros(3)
            w[free] = v
            return _penalised(w, x1, x2, pos, neg, rho)

        v = minimize(f, np.array([1.0, 1.0, 0.0])[free], method="BFGS",
                     options={"gtol": 1e-11}).x  # fmt: skip
        w = np.zeros(3)
        w[free] = v
        neg_ab = [i for i in (0, 1) if i not in fixed and w[i] < 0]
        if not neg_ab:
            return w
        fixed[min(neg_ab, key=lambda i: w[i])] = 0.0
    return w


def slow_decay_beta(x, y, memory, n_bins, eps, warmup, refit, rho):
    """One stream, one event at a time: forecast, then decay, count, refit when due."""
    lam = 1 - 2 / memory
    edges = DB.bin_edges(n_bins, eps)
    mid = 1 / (1 + np.exp(-0.5 * (edges[1:] + edges[:-1])))
    x1, x2 = np.log(mid), -np.log1p(-mid)
    pos, neg = np.zeros(n_bins), np.zeros(n_bins)
    w, u, out = None, 0, np.empty(x.size)
    for t in range(x.size):
        q = min(max(x[t], eps), 1 - eps)
        out[t] = x[t] if w is None else 1 / (1 + math.exp(-(w[0] * math.log(q) - w[1] *
                                                             math.log1p(-q) + w[2])))  # fmt: skip
        if y[t] < 0:
            continue
        z = math.log(q) - math.log1p(-q)
        k = min(max(int(np.searchsorted(edges, z, side="right")) - 1, 0), n_bins - 1)
        pos, neg = pos * lam, neg * lam
        (pos if y[t] == 1 else neg)[k] += 1
        u += 1
        if u >= warmup and (u - warmup) % refit == 0:
            w = _fit(x1, x2, pos, neg, rho)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_equals_the_slow_loop(seed):
    rng = np.random.default_rng(seed)
    n = 400
    x = rng.uniform(0.01, 0.99, n)
    drift = np.where(np.arange(n) < n // 2, 0.0, 1.5)  # the map changes halfway
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(np.log(x / (1 - x)) * 0.6 + drift)))).astype(int)
    y[rng.uniform(size=n) < 0.1] = -1  # some labels unknown: forecast only
    cal = make_calibrator("decay-beta", memory=120, n_bins=20)
    out, st = cal.run(x, y)
    want = slow_decay_beta(x, y, 120, 20, config.DECAY_BETA_EPS, cal.warmup, cal.refit_every,
                           config.DECAY_BETA_RIDGE)  # fmt: skip
    np.testing.assert_allclose(out.protected, want, rtol=0, atol=1e-7)
    assert len(st.weights) == DB.state_size(20)  # fixed size, whatever the stream's length


def test_a_single_class_stream_stays_finite():
    """All labels 1: the unpenalised fit would diverge (c -> inf); the ridge keeps it finite."""
    x = np.linspace(0.1, 0.9, 300)
    out, st = make_calibrator("decay-beta", memory=50).run(x, np.ones(300, dtype=np.int64))
    assert np.all(np.isfinite(out.protected)) and np.all(np.isfinite(st.weights))
    assert out.protected[-1] > 0.99


def test_it_forgets_like_a_window_of_its_memory():
    """After a shift of the log-odds by +2, it follows within a few memories: on the last 1,500
    events its log loss is near the true map's and far below the base's."""
    rng = np.random.default_rng(3)
    n, memory = 6000, 500
    x = rng.uniform(0.02, 0.98, n)
    z = np.log(x / (1 - x)) + np.where(np.arange(n) < 3000, 0.0, 2.0)
    truth = 1 / (1 + np.exp(-z))
    y = (rng.uniform(size=n) < truth).astype(np.int64)
    out, _ = make_calibrator("decay-beta", memory=memory).run(x, y)

    def loss(p):
        p = p[-1500:]
        return float(-np.mean(np.log(np.where(y[-1500:] == 1, p, 1 - p))))

    assert loss(out.protected) < loss(truth) + 0.02 < loss(x) - 0.1
