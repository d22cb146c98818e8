"""``oms`` (online matrix scaling, #34) through the public entry points: protect (streams,
delayed labels), its serving map, the state checks, and as an input of ``composite-experts``;
each forecast equal to the paper loop of tests/naive_online_scaling.py (``matrix_stream``)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import softmax

import calpipe
from calpipe import config
from calpipe.calibrators import METHODS, make_calibrator
from calpipe.calibrators.base import StreamState
from calpipe.calibrators.experts import INPUT_METHODS
from calpipe.errors import ParameterError, StateError
from tests import naive_online_scaling as naive


def _k_events(n=150, k=4, seed=0, streams=("a", "b")):
    rng = np.random.default_rng(seed)
    m = n * len(streams)
    p = rng.dirichlet(np.full(k, 0.7), m)
    y = np.array([rng.choice(k, p=r[::-1]) for r in p])  # the classes' order reversed: W far from I
    return pl.DataFrame({
        "stream": np.repeat(list(streams), n), "event_time": np.tile(np.arange(n), len(streams)),
        "event_id": np.tile(np.arange(n), len(streams)), "scores": p.tolist(), "label": y,
    })  # fmt: skip


def test_registered_and_an_input_of_the_default():
    assert METHODS["oms"].classes == "both"
    assert INPUT_METHODS["oms"] is METHODS["oms"]
    spec = calpipe.methods()["oms"]["parameters"]
    assert set(spec) == {"gamma", "radius", "rho", "score_clip", "clip"}


def test_protect_equals_the_paper_loop_per_stream():
    df = _k_events()
    out = calpipe.protect(df, scores="scores", method="oms")
    for s in ("a", "b"):
        part = out.filter(pl.col("stream") == s).sort("event_time")
        x = np.array(part["scores"].to_list())
        want = naive.matrix_stream(x, part["label"].to_numpy(), eps=100.0)
        got = np.array(part["protected_scores"].to_list())
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)


def test_parameters_reach_the_kernel():
    df = _k_events(n=80, streams=("a",))
    kw = {"gamma": 0.5, "radius": 1.5, "rho": 1.0, "score_clip": 0.001}
    out = calpipe.protect(df, scores="scores", method="oms", **kw)
    x = np.array(df["scores"].to_list())
    want = naive.matrix_stream(x, df["label"].to_numpy(), gamma=0.5, radius=1.5, eps=1.0,
                               clip=0.001)  # fmt: skip
    np.testing.assert_allclose(np.array(out["protected_scores"].to_list()), want, atol=1e-12)
    with pytest.raises(ParameterError, match="gamma"):
        make_calibrator("oms", gamma=0)
    with pytest.raises(ParameterError, match="n_bins"):
        make_calibrator("oms", n_bins=4)  # no calibeating


def test_delayed_labels_are_learnt_when_they_arrive():
    t0 = pl.datetime(2026, 1, 1)
    df = _k_events(n=80, k=3, streams=("a",)).with_columns(
        (t0 + pl.duration(seconds=pl.col("event_time"))).alias("event_time")
    )
    late = df.with_columns(  # event t sees the labels of events <= t - 10
        (pl.col("event_time") + pl.duration(milliseconds=9500)).alias("label_time")
    )
    got = np.array(
        calpipe.protect(late, scores="scores", method="oms", label_time="label_time")[
            "protected_scores"
        ].to_list()
    )
    x, y = np.array(df["scores"].to_list()), df["label"].to_numpy()
    for t in (0, 9, 10, 41, 79):
        seen = max(t - 9, 0)
        want = naive.matrix_stream(np.vstack([x[:seen], x[t]]), np.r_[y[:seen], 0], eps=100.0)
        np.testing.assert_allclose(got[t], want[-1], atol=1e-12, rtol=0)


def test_binary_scores_run_online_beta_scaling_bit_for_bit():
    rng = np.random.default_rng(4)
    x = rng.uniform(0.01, 0.99, 300)
    y = (rng.uniform(size=300) < x**2).astype(np.int64)
    a, sa = make_calibrator("oms").run(x, y)
    b, sb = make_calibrator("obs").run(x, y)
    assert np.array_equal(a.protected, b.protected) and sa.weights == sb.weights


def test_the_serving_map_is_softmax_of_w_ln_q_plus_b():
    """matrix_map (the SQL form's rows) evaluated in numpy = serving_map = the next forecast."""
    cal = make_calibrator("oms")
    k = 4
    df = _k_events(n=120, k=k, streams=("a",))
    x, y = np.array(df["scores"].to_list()), df["label"].to_numpy()
    _, st = cal.run(x, y)
    state = cal.state_from_flat(np.array(st.weights), np.array([0, len(st.weights)]),
                                np.zeros(1), k)  # fmt: skip
    m = cal.matrix_map(state, k)[0]
    w, b, eps = m[: k * k].reshape(k, k), m[k * k : k * k + k], m[-1]
    assert not np.allclose(w, np.eye(k), atol=0.05)  # it learnt a non-diagonal map
    grid = np.random.default_rng(1).dirichlet(np.ones(k), 50)
    grid[0] = [0.0, 0.0, 0.3, 0.7]  # floored at eps
    q = np.maximum(grid, eps)
    want = softmax(np.log(q / q.sum(axis=1, keepdims=True)) @ w.T + b, axis=1)
    served = cal.serving_map(state, grid[None])[0]
    np.testing.assert_allclose(served, want, atol=1e-12, rtol=0)
    nxt, _ = cal.run(grid, np.full(50, -1), state=st)  # forecasts only: the next forecasts
    np.testing.assert_allclose(nxt.protected, served, atol=1e-15, rtol=0)
    with pytest.raises(ParameterError, match="matrix map, not a vector map"):
        cal.vector_map(state, k)


def test_too_many_classes_are_refused_naming_the_limit():
    k = config.OMS_MAX_CLASSES + 1
    x = np.full((3, k), 1.0 / k)
    with pytest.raises(ParameterError, match=rf"at most K = {config.OMS_MAX_CLASSES} classes"):
        make_calibrator("oms").run(x, np.array([0, 1, -1]))
    with pytest.raises(ParameterError, match=r"at most K = "):
        make_calibrator("composite-experts", inputs=("ops", "oms")).run(x, np.array([0, 1, -1]))
    # the default drops its oms input above the limit (ops has none): any K runs
    cal = make_calibrator("composite-experts")
    assert [n for n, _ in cal.input_specs(k)] == ["ops"]
    assert [n for n, _ in cal.input_specs(k - 1)] == [n for n, _ in cal.input_specs(3)]
    cal.run(x, np.array([0, 1, -1]))


def _tampered(mutate, k=3):
    cal = make_calibrator("oms")
    x = np.full((3, k), 1.0 / k)
    _, st = cal.run(x, np.array([0, 1, 2]))
    w = np.array(st.weights)
    mutate(w)
    st.weights = w.tolist()
    return cal, x, StreamState.from_json(st.to_json())


def test_a_tampered_k_class_state_is_refused_on_load():
    d = 12  # K = 3: W (9) and b (3)
    cal, x, st = _tampered(lambda w: w.__setitem__(slice(0, 2), 1e308))
    with pytest.raises(StateError, match="theta's norm exceeds the projection radius"):
        cal.run(x, np.array([1, -1, 0]), state=st)
    cal, x, st = _tampered(lambda w: w.__setitem__(slice(d, None), 0.0))
    with pytest.raises(StateError, match="smallest eigenvalue"):
        cal.run(x, np.array([1, -1, 0]), state=st)
    cal, x, st = _tampered(lambda w: w.__setitem__(d + 1, w[d + 1] + 1.0))  # A[0, 1] != A[1, 0]
    with pytest.raises(StateError, match="A is not symmetric"):
        cal.run(x, np.array([1, -1, 0]), state=st)
    assert cal.state_size(3) == d + d * d and cal.state_size(10) == 110 + 110 * 110


@pytest.mark.parametrize("inputs", [("ops", "oms"), ("oms",)])
def test_an_input_of_composite_experts_keeps_the_insurance(inputs):
    """Paper 001 Prop. 1 with oms among the inputs: log loss <= base + ln 2 (pi = 1/2) per
    stream; and the mixture's input oms forecasts as oms alone."""
    df = _k_events(n=200, k=4, seed=3)
    out = calpipe.protect(df, scores="scores", method="composite-experts", inputs=inputs)
    for s in ("a", "b"):
        part = out.filter(pl.col("stream") == s).sort("event_time")
        y = part["label"].to_numpy()
        idx = np.arange(y.size)
        p = np.array(part["protected_scores"].to_list())[idx, y]
        base = np.maximum(np.array(part["scores"].to_list()), config.DEFAULT_CLIP_EPS)
        base = (base / base.sum(axis=1, keepdims=True))[idx, y]
        assert -np.log(p).sum() <= -np.log(base).sum() + np.log(2) + 1e-9


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), k=st.integers(3, 5), cut=st.integers(1, 39))
def test_chunked_runs_equal_one_run_and_forecast_probabilities(seed, k, cut):
    """Calibrator.run in two chunks, the state through its JSON form, equals one run; every
    forecast is a probability vector (rows with zeros and ones included)."""
    rng = np.random.default_rng(seed)
    x = rng.dirichlet(np.full(k, 0.4), 40)
    x[rng.uniform(size=40) < 0.1] = np.eye(k)[0]
    y = np.where(rng.uniform(size=40) < 0.2, -1, rng.integers(0, k, 40))
    cal = make_calibrator("oms")
    whole, st_whole = cal.run(x, y)
    a, st_a = cal.run(x[:cut], y[:cut])
    b, st_b = cal.run(x[cut:], y[cut:], state=StreamState.from_json(st_a.to_json()))
    assert np.array_equal(np.vstack([a.protected, b.protected]), whole.protected)
    assert st_b.weights == st_whole.weights
    p = whole.protected
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
