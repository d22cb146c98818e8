"""Online matrix scaling (``MODEL_MATRIX`` of calpipe.kernels.online_scaling, #34) against the
per-event loop of tests/naive_online_scaling.py (``matrix_stream``, written from Gupta & Ramdas
2023 Algorithm 1 / Hazan 2016 Algorithm 12 with Guo et al. 2017's matrix scaling), and the
properties the ONS gives it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

from calpipe.kernels import online_scaling as OS
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE
from tests import naive_online_scaling as naive


def _run(x, y, *, gamma=0.1, radius=100.0, rho=100.0, clip=0.01, ops=None):
    """One stream of K-class scores through the kernel: every event a step op, or ``ops``."""
    n, k = x.shape
    ev, kind = ops if ops is not None else (np.arange(n), np.full(n, OP_STEP, np.int8))
    theta, a, beat = OS.initial_state(1, OS.MODEL_MATRIX, k, OS.CALIBEAT_NONE, 10, rho)
    return OS.online_scaling(
        x, y, ev, kind, np.array([0, len(ev)]), theta, a, beat, OS.MODEL_MATRIX,
        OS.CALIBEAT_NONE, gamma, radius, clip, 10,
    )  # fmt: skip


def _confused(seed, n=400, k=4):
    """Base scores whose classes 0 and 1 are swapped half the time in the truth: a map no
    vector scaling can express (it moves probability between classes)."""
    rng = np.random.default_rng(seed)
    x = rng.dirichlet(np.full(k, 0.6), n)
    y = np.array([rng.choice(k, p=p) for p in x])
    swap = (rng.uniform(size=n) < 0.5) & (y < 2)
    y[swap] = 1 - y[swap]
    return x, y.astype(np.int64)


@pytest.mark.parametrize("k", [3, 4, 7])
@pytest.mark.parametrize(
    "knobs",
    [{}, {"radius": 1.5, "rho": 1.0}, {"gamma": 0.5, "clip": 0.001}],
    ids=["paper", "projection-binds", "other-knobs"],
)
def test_equals_the_paper_loop(k, knobs):
    x, y = _confused(k, n=250 if k < 7 else 120, k=k)
    p, theta, a, _ = _run(x, y, **knobs)
    ref = naive.matrix_stream(
        x, y, gamma=knobs.get("gamma", 0.1), radius=knobs.get("radius", 100.0),
        eps=knobs.get("rho", 100.0), clip=knobs.get("clip", 0.01),
    )  # fmt: skip
    np.testing.assert_allclose(p, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    if "radius" in knobs:  # the identity (norm sqrt(K) > 1.5) is outside: the projection binds
        assert np.linalg.norm(theta[0]) <= knobs["radius"] * (1 + 1e-12)
    assert theta.shape == (1, k * k + k) and a.shape == (1, k * k + k, k * k + k)


def test_starts_at_the_identity_the_base():
    x, y = _confused(1, n=30)
    p = _run(x, y, ops=(np.arange(30), np.full(30, OP_FORECAST, np.int8)))[0]
    q = np.maximum(x, 0.01)
    np.testing.assert_allclose(p, q / q.sum(axis=1, keepdims=True), rtol=0, atol=1e-15)
    theta, _, _ = OS.initial_state(2, OS.MODEL_MATRIX, 3, OS.CALIBEAT_NONE, 10, 100.0)
    np.testing.assert_array_equal(theta[1], np.r_[np.eye(3).ravel(), np.zeros(3)])


def test_streams_forecast_only_and_delayed_updates_of_one_call_equal_the_loop():
    """Three streams in one call: steps, then forecasts whose labels come at the end."""
    k = 3
    xs, ys = zip(*(_confused(s, n=60, k=k) for s in range(3)), strict=True)
    x, y = np.concatenate(xs), np.concatenate(ys)
    ev, kind, off = [], [], [0]
    for s in range(3):
        b = 60 * s
        ev += [b + i for i in range(45)] + [b + i for i in range(45, 60)] * 2
        kind += [OP_STEP] * 45 + [OP_FORECAST] * 15 + [OP_UPDATE] * 15
        off.append(len(ev))
    theta, a, beat = OS.initial_state(3, OS.MODEL_MATRIX, k, OS.CALIBEAT_NONE, 10, 100.0)
    theta_in, a_in = theta.copy(), a.copy()
    p, theta1, _, _ = OS.online_scaling(
        x, y, np.array(ev), np.array(kind, np.int8), np.array(off), theta, a, beat,
        OS.MODEL_MATRIX, OS.CALIBEAT_NONE, 0.1, 100.0, 0.01, 10,
    )  # fmt: skip
    for s in range(3):
        ref = naive.matrix_stream(xs[s][:45], ys[s][:45], eps=100.0)
        np.testing.assert_allclose(p[60 * s : 60 * s + 45], ref, atol=1e-12, rtol=0)
        for j in range(45, 60):  # each forecast-only event sees the state after event 44
            xe, ye = np.vstack([xs[s][:45], xs[s][j]]), np.r_[ys[s][:45], 0]
            want = naive.matrix_stream(xe, ye, eps=100.0)[-1]
            np.testing.assert_allclose(p[60 * s + j], want, atol=1e-12, rtol=0)
        # then every label is learnt: the end state is the whole stream's, in this order
        whole = _run(xs[s], ys[s])
        np.testing.assert_allclose(theta1[s], whole[1][0], atol=1e-12, rtol=0)
    assert np.array_equal(theta, theta_in) and np.array_equal(a, a_in)  # inputs untouched


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(3, 6),
    cut=st.integers(1, 59),
    small_ball=st.booleans(),
    kinds=st.lists(st.sampled_from([OP_STEP, OP_FORECAST]), min_size=60, max_size=60),
)
def test_chunks_equal_one_pass_and_forecasts_are_probabilities(seed, k, cut, small_ball, kinds):
    """Any op list (steps, forecast-only ops, their labels late) in two chunks with the state
    carried equals one pass bit for bit; every forecast is a probability vector, also with
    base rows of exact zeros and ones and a projection that binds."""
    rng = np.random.default_rng(seed)
    x = rng.dirichlet(np.full(k, 0.3), 60)
    x[rng.uniform(size=60) < 0.1] = np.eye(k)[rng.integers(0, k)]
    y = rng.integers(0, k, 60)
    ev, kind = [], []
    late: list[int] = []
    for e, kd in enumerate(kinds):
        ev.append(e)
        kind.append(kd)
        if kd == OP_FORECAST and rng.uniform() < 0.7:
            late.append(e)
        if late and rng.uniform() < 0.3:
            ev.append(late.pop(0))
            kind.append(OP_UPDATE)
    ev, kind = np.array(ev), np.array(kind, np.int8)
    knobs = {"radius": 1.5, "rho": 1.0} if small_ball else {}
    whole = _run(x, y, ops=(ev, kind), **knobs)
    cut = min(cut, len(ev) - 1)
    theta, a, beat = OS.initial_state(1, OS.MODEL_MATRIX, k, OS.CALIBEAT_NONE, 10,
                                      knobs.get("rho", 100.0))  # fmt: skip
    parts = []
    for lo, hi in ((0, cut), (cut, len(ev))):
        p, theta, a, beat = OS.online_scaling(
            x, y, ev[lo:hi], kind[lo:hi], np.array([0, hi - lo]), theta, a, beat,
            OS.MODEL_MATRIX, OS.CALIBEAT_NONE, 0.1, knobs.get("radius", 100.0), 0.01, 10,
        )  # fmt: skip
        parts.append(p)
    shown = np.isin(np.arange(60), ev[kind != OP_UPDATE])
    first = np.isin(np.arange(60), ev[:cut][kind[:cut] != OP_UPDATE])
    got = np.where(first[:, None], parts[0], parts[1])
    assert np.array_equal(got[shown], whole[0][shown])
    assert np.array_equal(theta, whole[1]) and np.array_equal(a, whole[2])
    p = whole[0][shown]
    assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    ball = max(knobs.get("radius", 100.0), math.sqrt(k))  # theta_1 = (I, 0) may lie outside
    assert np.linalg.norm(whole[1][0]) <= ball * (1 + 1e-9)


def _matrix_truth(seed, n, k=3):
    """Labels drawn from softmax(W* ln q): classes 0 and 1 mixed geometrically, a fixed matrix
    map that no vector map expresses."""
    rng = np.random.default_rng(seed)
    x = rng.dirichlet(np.full(k, 0.6), n)
    w = np.eye(k)
    w[:2, :2] = [[0.2, 0.8], [0.8, 0.2]]
    q = np.maximum(x, 0.01)
    t = softmax(np.log(q / q.sum(axis=1, keepdims=True)) @ w.T, axis=1)
    return x, np.array([rng.choice(k, p=r) for r in t], dtype=np.int64)


def _best_fixed_matrix_loss(x, y, clip=0.01):
    """min over (W, b) of the cumulative log loss of softmax(W ln q + b) (L-BFGS)."""
    q = np.maximum(x, clip)
    z = np.log(q / q.sum(axis=1, keepdims=True))
    k = z.shape[1]
    onehot = np.eye(k)[y]

    def f(th):
        w, b = th[: k * k].reshape(k, k), th[k * k :]
        lp = log_softmax(z @ w.T + b, axis=1)
        g = np.exp(lp) - onehot
        return -np.sum(lp * onehot), np.r_[(g.T @ z).ravel(), g.sum(axis=0)]

    th0 = np.r_[np.eye(k).ravel(), np.zeros(k)]
    return minimize(f, th0, jac=True, method="L-BFGS-B").fun


def test_regret_against_the_best_fixed_matrix_map_is_logarithmic():
    """Hazan 2016 Thm. 4.5 (G&R Thm. 2.1 for the Platt case): regret O(d log T), d = K^2 + K,
    on a stream whose truth is a fixed matrix map no vector map expresses; and it beats online
    vector scaling there."""
    k, n = 3, 6000
    x, y = _matrix_truth(11, n, k)
    p = _run(x, y)[0]
    oms = -np.sum(np.log(p[np.arange(n), y]))
    best = _best_fixed_matrix_loss(x, y)
    d = k * k + k
    assert -1.0 < oms - best < 2 * d * math.log(n)  # O(d log T), a generous constant
    th, a, beat = OS.initial_state(1, OS.MODEL_VECTOR, k, OS.CALIBEAT_NONE, 10, 100.0)
    pv = OS.online_scaling(
        x, y, np.arange(n), np.full(n, OP_STEP, np.int8), np.array([0, n]), th, a, beat,
        OS.MODEL_VECTOR, OS.CALIBEAT_NONE, 0.1, 100.0, 0.01, 10,
    )[0]  # fmt: skip
    ops = -np.sum(np.log(pv[np.arange(n), y]))
    assert oms < ops - 0.02 * n  # mixing classes 0 and 1 is worth > 0.02 nats an event


def test_bad_arguments_are_refused():
    x, y = _confused(2, n=5, k=3)
    theta, a, beat = OS.initial_state(1, OS.MODEL_VECTOR, 3, OS.CALIBEAT_NONE, 10, 100.0)
    args = (x, y, np.arange(5), np.full(5, OP_STEP, np.int8), np.array([0, 5]), theta, a, beat)
    with pytest.raises(ValueError, match="theta0 holds 6 parameters; the model on K = 3 classes "
                                         "has 12"):  # fmt: skip
        OS.online_scaling(*args, OS.MODEL_MATRIX, OS.CALIBEAT_NONE, 0.1, 100.0, 0.01, 10)
    with pytest.raises(ValueError, match="needs \\(n, K\\)"):
        OS.online_scaling(x[:, 0], *args[1:], OS.MODEL_MATRIX, OS.CALIBEAT_NONE, 0.1, 100.0,
                          0.01, 10)  # fmt: skip
    with pytest.raises(ValueError, match="without calibeating"):
        OS.online_scaling(*args, OS.MODEL_MATRIX, OS.CALIBEAT_TRACKING, 0.1, 100.0, 0.01, 10)
