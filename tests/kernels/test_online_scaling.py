"""calpipe.kernels.online_scaling against the per-event loops of tests/naive_online_scaling.py
(written from Gupta & Ramdas 2023), and the properties the paper proves."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.kernels import online_scaling as OS
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE
from tests import naive_online_scaling as naive

KINDS = {OS.MODEL_PLATT: "platt", OS.MODEL_BETA: "beta"}
BEATS = (OS.CALIBEAT_NONE, OS.CALIBEAT_TRACKING, OS.CALIBEAT_HEDGING)


def _run(x, y, model, calibeat, *, k=2, gamma=0.1, radius=100.0, rho=100.0, clip=0.01, bins=10):
    """One stream, every event a step op."""
    n = y.shape[0]
    theta, a, beat = OS.initial_state(1, model, k, calibeat, bins, rho)
    return OS.online_scaling(
        x, y, np.arange(n), np.full(n, OP_STEP, np.int8), np.array([0, n]), theta, a, beat,
        model, calibeat, gamma, radius, clip, bins,
    )  # fmt: skip


def _oracle(x, y, model, calibeat, *, gamma=0.1, radius=100.0, rho=100.0, clip=0.01, bins=10):
    if model == OS.MODEL_NONE:
        expert = np.asarray(x, dtype=float)
    else:
        expert = naive.ons_stream(
            x, y, kind=KINDS[model], gamma=gamma, radius=radius, eps=rho, clip=clip
        )
    if calibeat == OS.CALIBEAT_TRACKING:
        return naive.tracking(expert, y, bins)
    if calibeat == OS.CALIBEAT_HEDGING:
        return naive.hedging(expert, y, bins)
    return expert


def _stream(seed, n=400, shift=1.5):
    """A drifting binary stream: the true log-odds move from the score's by +shift halfway."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.01, 0.99, n)
    z = np.log(x / (1 - x)) + np.where(np.arange(n) < n // 2, 0.0, shift)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    return x, y


@pytest.mark.parametrize("model", [OS.MODEL_PLATT, OS.MODEL_BETA])
@pytest.mark.parametrize("calibeat", BEATS)
@pytest.mark.parametrize(
    "knobs",
    [{}, {"radius": 1.5, "rho": 1.0}, {"gamma": 0.5, "clip": 0.001, "bins": 4}],
    ids=["paper", "projection-binds", "other-knobs"],
)
def test_equals_the_paper_loop(model, calibeat, knobs):
    x, y = _stream(int(model) * 10 + int(calibeat))
    p = _run(x, y, model, calibeat, **knobs)[0]
    np.testing.assert_allclose(p, _oracle(x, y, model, calibeat, **knobs), rtol=0, atol=1e-12)


def test_online_histogram_is_tracking_of_the_base():
    x, y = _stream(5)
    p = _run(x, y, OS.MODEL_NONE, OS.CALIBEAT_TRACKING, bins=7)[0]
    np.testing.assert_array_equal(p, naive.tracking(x, y, 7))


@pytest.mark.parametrize("k", [3, 5])
def test_vector_scaling_equals_the_loop(k):
    rng = np.random.default_rng(k)
    x = rng.dirichlet(np.ones(k) * 0.7, 500)
    y = rng.integers(0, k, 500)
    for knobs in ({}, {"radius": 2.0, "rho": 1.0}):
        p = _run(x, y, OS.MODEL_VECTOR, OS.CALIBEAT_NONE, k=k, **knobs)[0]
        ref = naive.ons_stream(x, y, kind="vector", eps=knobs.get("rho", 100.0),
                               radius=knobs.get("radius", 100.0))  # fmt: skip
        np.testing.assert_allclose(p, ref, rtol=0, atol=1e-12)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)


def test_projection_keeps_theta_in_the_ball_and_binds():
    x, y = _stream(3, n=300, shift=6.0)
    _, theta, _, _ = _run(x, y, OS.MODEL_PLATT, OS.CALIBEAT_NONE, radius=1.5, rho=1.0)
    assert np.linalg.norm(theta[0]) <= 1.5 * (1 + 1e-12)
    assert np.linalg.norm(theta[0]) > 1.5 * (1 - 1e-6)  # the shift pushes it to the sphere


def test_streams_and_ops_of_one_call_equal_the_loop_per_stream():
    """Several streams in one call, with forecast-only and delayed update ops."""
    xs, ys = zip(*(_stream(s, n=120) for s in range(3)), strict=True)
    x, y = np.concatenate(xs), np.concatenate(ys)
    ev, kind, off = [], [], [0]
    for s in range(3):
        base = 120 * s
        # events 0..99 are steps; 100..119 forecast now, labelled at the end (update ops)
        ev += [base + i for i in range(100)] + [base + i for i in range(100, 120)] * 2
        kind += [OP_STEP] * 100 + [OP_FORECAST] * 20 + [OP_UPDATE] * 20
        off.append(len(ev))
    theta, a, beat = OS.initial_state(3, OS.MODEL_PLATT, 2, OS.CALIBEAT_HEDGING, 10, 100.0)
    p, theta1, *_ = OS.online_scaling(
        x, y, np.array(ev), np.array(kind, np.int8), np.array(off), theta, a, beat,
        OS.MODEL_PLATT, OS.CALIBEAT_HEDGING, 0.1, 100.0, 0.01, 10,
    )  # fmt: skip
    for s in range(3):
        ref = _oracle(xs[s][:100], ys[s][:100], OS.MODEL_PLATT, OS.CALIBEAT_HEDGING)
        np.testing.assert_allclose(p[120 * s : 120 * s + 100], ref, atol=1e-12, rtol=0)
        # the 20 forecast-only events see the state after event 99 (nothing learnt between)
        for j in range(100, 120):
            xe, ye = np.r_[xs[s][:100], xs[s][j]], np.r_[ys[s][:100], 0]
            expert = naive.ons_stream(xe, ye, kind="platt", eps=100.0)
            want = naive.hedging(expert, ye)[-1]
            assert abs(p[120 * s + j] - want) <= 1e-12
        full = _run(xs[s], ys[s], OS.MODEL_PLATT, OS.CALIBEAT_NONE)[1]
        np.testing.assert_allclose(theta1[s], full[0], atol=1e-12)
    assert np.all(theta == np.array([1.0, 0.0]))  # inputs untouched


def test_forecast_only_ops_learn_nothing():
    x, y = _stream(9, n=50)
    theta, a, beat = OS.initial_state(1, OS.MODEL_PLATT, 2, OS.CALIBEAT_TRACKING, 10, 100.0)
    p, th, a1, b1 = OS.online_scaling(
        x, y, np.arange(50), np.full(50, OP_FORECAST, np.int8), np.array([0, 50]), theta, a,
        beat, OS.MODEL_PLATT, OS.CALIBEAT_TRACKING, 0.1, 100.0, 0.01, 10,
    )  # fmt: skip
    np.testing.assert_allclose(p, np.clip(x, 0.01, 0.99), atol=1e-15)  # the identity map
    assert np.array_equal(th, theta) and np.array_equal(a1, a) and np.array_equal(b1, beat)


def test_ops_regret_against_the_best_fixed_platt_map_is_logarithmic():
    """G&R Thm. 2.1 / Hazan Thm. 4.5: regret O(d log T) on a stationary miscalibrated stream."""
    rng = np.random.default_rng(0)
    n = 20000
    x = rng.uniform(0.02, 0.98, n)
    z = 0.5 * np.log(x / (1 - x)) - 0.7  # the truth is a Platt map of the score
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    p = _run(x, y, OS.MODEL_PLATT, OS.CALIBEAT_NONE)[0]
    ops_loss = -np.sum(np.where(y == 1, np.log(p), np.log(1 - p)))
    u = np.log(x / (1 - x))
    best = min(  # the best fixed map in hindsight, on a fine grid around the truth
        -np.sum(np.where(y == 1, -np.logaddexp(0, -(a * u + b)), -np.logaddexp(0, a * u + b)))
        for a in np.linspace(0.3, 0.7, 41)
        for b in np.linspace(-0.9, -0.5, 41)
    )
    assert ops_loss - best < 10 * 2 * math.log(n)  # O(d log T), with a generous constant
    assert ops_loss - best > -1.0  # and no map is much better than the hindsight optimum


def test_hedging_is_calibrated_on_an_adversarial_sequence():
    """Foster (1999): whatever the outcomes, the hedged forecasts are calibrated.

    The adversary sees each (deterministic) forecast and sets y = 1 exactly when it is below
    1/2 (Dawid's argument against deterministic forecasters). Blackwell's argument bounds
    ||rho_T||^2 <= T / n_bins + T, so max_i |rho_i| / T -> 0 like 1 / sqrt(T)."""
    n, bins = 3000, 10
    state = OS.initial_state(1, OS.MODEL_NONE, 2, OS.CALIBEAT_HEDGING, bins, 100.0)
    x = np.array([0.7])
    one = np.array([0, 1])
    forecasts, ys = np.zeros(n), np.zeros(n, np.int64)
    for t in range(n):
        f = OS.online_scaling(x, np.zeros(1, np.int64), np.zeros(1, np.int64),
                              np.array([OP_FORECAST], np.int8), one, *state, OS.MODEL_NONE,
                              OS.CALIBEAT_HEDGING, 0.1, 100.0, 0.01, bins)[0][0]  # fmt: skip
        forecasts[t], ys[t] = f, int(f < 0.5)
        state = OS.online_scaling(x, ys[t : t + 1], np.zeros(1, np.int64),
                                  np.array([OP_UPDATE], np.int8), one, *state, OS.MODEL_NONE,
                                  OS.CALIBEAT_HEDGING, 0.1, 100.0, 0.01, bins)[1:]  # fmt: skip
    rho = state[2][0, 7]  # the expert's bin (0.7)
    assert np.max(np.abs(rho)) / n < 2.0 / math.sqrt(n)
    # and the state is the paper loop's: the same forecasts from the same outcomes
    np.testing.assert_allclose(naive.hedging(np.full(n, 0.7), ys, bins), forecasts, atol=1e-12)
    # the expert itself (0.7 throughout) is off by 0.2 against these outcomes
    assert abs(np.mean(ys) - 0.7) > 0.15


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    model=st.sampled_from([OS.MODEL_PLATT, OS.MODEL_BETA, OS.MODEL_NONE]),
    calibeat=st.sampled_from(BEATS),
    cut=st.integers(1, 79),
)
def test_chunks_with_state_carried_equal_one_pass(seed, model, calibeat, cut):
    if model == OS.MODEL_NONE and calibeat == OS.CALIBEAT_NONE:
        calibeat = OS.CALIBEAT_TRACKING
    x, y = _stream(seed, n=80)
    whole = _run(x, y, model, calibeat)
    st0 = OS.initial_state(1, model, 2, calibeat, 10, 100.0)

    def part(lo, hi, state):
        m = hi - lo
        return OS.online_scaling(
            x[lo:hi], y[lo:hi], np.arange(m), np.full(m, OP_STEP, np.int8), np.array([0, m]),
            *state, model, calibeat, 0.1, 100.0, 0.01, 10,
        )  # fmt: skip

    first = part(0, cut, st0)
    second = part(cut, 80, first[1:])
    assert np.array_equal(np.concatenate([first[0], second[0]]), whole[0])
    for got, want in zip(second[1:], whole[1:], strict=True):
        assert np.array_equal(got, want)
    assert np.all((whole[0] >= 0) & (whole[0] <= 1))


def test_bad_arguments_are_refused():
    x, y = _stream(1, n=5)
    theta, a, beat = OS.initial_state(1, OS.MODEL_PLATT, 2, OS.CALIBEAT_NONE, 10, 100.0)
    args = (x, y, np.arange(5), np.full(5, OP_STEP, np.int8), np.array([0, 5]), theta, a, beat)
    with pytest.raises(ValueError, match="gamma > 0"):
        OS.online_scaling(*args, OS.MODEL_PLATT, OS.CALIBEAT_NONE, 0.0, 100.0, 0.01, 10)
    with pytest.raises(ValueError, match="needs \\(n, K\\)"):
        OS.online_scaling(*args, OS.MODEL_VECTOR, OS.CALIBEAT_NONE, 0.1, 100.0, 0.01, 10)


def test_the_calibeating_table_refuses_what_it_cannot_tabulate():
    """calibeat_table (the SQL form of tops/hops): no table without calibeating, and the
    statistics must have the bin count's shape."""
    import numpy as np
    import pytest

    from calpipe.kernels import online_scaling as OS

    with pytest.raises(ValueError, match="no calibeating table for calibeat code 0"):
        OS.calibeat_table(np.zeros((1, 4, 2)), OS.CALIBEAT_NONE, 4)
    with pytest.raises(ValueError, match=r"beat must be \(S, 5, W\)"):
        OS.calibeat_table(np.zeros((1, 4, 2)), OS.CALIBEAT_TRACKING, 5)
    table = OS.calibeat_table(np.array([[[1.0, 2.0], [0.0, 0.0]]]), OS.CALIBEAT_TRACKING, 2)
    assert table[0, 0] == 0.5 and np.isnan(table[0, 1])  # an empty bin: the expert's forecast
