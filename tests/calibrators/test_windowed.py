"""The windowed driver of batch calibrators (:mod:`calpipe.calibrators.windowed`) against a slow loop.

The oracle replays one stream event by event, exactly as the module docstring describes the
semantics: forecast with the map in force (base before the first fit), then learn the label, then
refit if the label count hits a fit point, on the last ``window`` labels.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import calpipe
from calpipe.calibrators import METHODS, make_calibrator
from calpipe.calibrators.windowed import WindowedCalibrator, fit_point
from calpipe.errors import ParameterError, StateError

FAST = settings(max_examples=40, deadline=None)


def naive_windowed(cal: WindowedCalibrator, scores, labels):
    """One stream, one event at a time; labels -1 = unknown (forecast only)."""
    n_classes = 2 if scores.ndim == 1 else scores.shape[1]
    win_s, win_y, fitted, u = [], [], None, 0
    out = np.empty(scores.shape)
    for i in range(scores.shape[0]):
        s = scores[i : i + 1]
        out[i] = s[0] if fitted is None else cal.predict_window(fitted, s, n_classes).p[0]
        if labels[i] < 0:
            continue
        u += 1
        win_s.append(scores[i])
        win_y.append(labels[i])
        due = u == cal.window or (
            cal.refit_every is not None
            and u > cal.window
            and (u - cal.window) % cal.refit_every == 0
        )
        if due:
            fitted = cal.fit_window(
                np.asarray(win_s[-cal.window :]), np.asarray(win_y[-cal.window :]), n_classes
            )
    return out


def _stream(seed, n, null_frac=0.2):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, n)
    y = (rng.uniform(size=n) < p**1.7).astype(np.int64)
    y[rng.uniform(size=n) < null_frac] = -1
    return p, y


def test_fit_point_follows_the_schedule():
    u = np.arange(12)
    assert fit_point(u, 4, None).tolist() == [-1] * 4 + [4] * 8
    assert fit_point(u, 4, 3).tolist() == [-1] * 4 + [4, 4, 4, 7, 7, 7, 10, 10]


@FAST
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 120),
    window=st.integers(1, 30),
    refit=st.one_of(st.none(), st.integers(1, 40)),
)
def test_driver_equals_the_event_by_event_loop(seed, n, window, refit):
    p, y = _stream(seed, n)
    cal = make_calibrator("platt", window=window, refit_every=refit)
    out, _ = cal.run(p, y)
    np.testing.assert_array_equal(out.protected, naive_windowed(cal, p, y))


@FAST
@given(seed=st.integers(0, 10_000), n=st.integers(2, 120), cut=st.integers(1, 119))
def test_chunks_with_state_equal_one_pass_bit_for_bit(seed, n, cut):
    p, y = _stream(seed, n)
    cut = min(cut, n - 1)
    cal = make_calibrator("platt", window=7, refit_every=5)
    whole, st_whole = cal.run(p, y)
    a, st_a = cal.run(p[:cut], y[:cut])
    b, st_b = cal.run(p[cut:], y[cut:], state=st_a)
    np.testing.assert_array_equal(np.r_[a.protected, b.protected], whole.protected)
    np.testing.assert_array_equal(
        np.r_[a.log10_martingale, b.log10_martingale], whole.log10_martingale
    )
    assert st_b.weights == st_whole.weights


def test_multiclass_window_is_kept_in_the_state():
    rng = np.random.default_rng(3)
    p = rng.dirichlet([1, 1, 1], 60)
    y = rng.integers(0, 3, 60)
    cal = make_calibrator("temperature", window=10, refit_every=4)
    whole, st_whole = cal.run(p, y)
    a, st_a = cal.run(p[:33], y[:33])
    b, _ = cal.run(p[33:], y[33:], state=st_a)
    np.testing.assert_array_equal(np.r_[a.protected, b.protected], whole.protected)
    np.testing.assert_array_equal(whole.protected, naive_windowed(cal, p, y))
    np.testing.assert_allclose(whole.protected.sum(axis=1), 1.0, atol=1e-12)
    assert len(st_whole.weights) == 3 + 10 * 3 + 10 + int(st_whole.weights[2])


def test_martingale_is_the_clipped_likelihood_ratio():
    p, y = _stream(11, 200, null_frac=0.0)
    cal = make_calibrator("platt", window=50, clip=1e-3)
    out, _ = cal.run(p, y)
    q = np.clip(out.protected, 1e-3, 1 - 1e-3)
    b = np.clip(p, 1e-3, 1 - 1e-3)
    expected = np.cumsum(
        np.log10(np.where(y == 1, q, 1 - q)) - np.log10(np.where(y == 1, b, 1 - b))
    )
    np.testing.assert_allclose(out.log10_martingale, expected, rtol=0, atol=1e-9)


def test_forecast_only_ops_see_the_current_map_and_learn_nothing():
    p, y = _stream(5, 80, null_frac=0.0)
    cal = make_calibrator("platt", window=20)
    y2 = y.copy()
    y2[50:] = -1
    out, st = cal.run(p, y2)
    assert st.n_labelled == 50 and st.weights[0] == 50
    ref, _ = cal.run(p, y)
    np.testing.assert_array_equal(out.protected[:51], ref.protected[:51])
    assert np.all(np.diff(out.log10_martingale[50:]) == 0)


def test_a_malformed_state_vector_is_refused():
    p, y = _stream(1, 30)
    cal = make_calibrator("platt", window=5)
    _, st = cal.run(p, y)
    st.weights = st.weights[:-1]
    with pytest.raises(StateError, match="does not have the layout"):
        cal.run(p, y, state=st)


def test_window_parameters_are_validated_from_the_table():
    with pytest.raises(ParameterError, match=r"window=0 is invalid: an integer >= 1"):
        make_calibrator("platt", window=0)
    with pytest.raises(ParameterError, match=r"refit_every=2.5 is invalid"):
        make_calibrator("platt", refit_every=2.5)


def test_every_batch_method_is_windowed_and_listed():
    windowed = {n for n, c in METHODS.items() if issubclass(c, WindowedCalibrator)}
    assert {"platt", "beta", "temperature"} <= windowed


def test_a_window_that_never_fills_warns_once_per_call():
    # regression: a window longer than the stream passed the base through without a word
    df = pl.DataFrame({"stream": ["a"] * 30 + ["b"] * 200, "event_id": range(230),
                       "score": np.linspace(0.1, 0.9, 230), "label": np.arange(230) % 2})  # fmt: skip
    with pytest.warns(UserWarning, match=r"platt: 1 of 2 streams have fewer than window=100") as w:
        out = calpipe.protect(df, by="stream", order_by="event_id", method="platt", window=100)
    assert len([x for x in w if "window=" in str(x.message)]) == 1
    short = out.filter(pl.col("stream") == "a")
    assert (short["protected_score"] == short["score"]).all()  # what the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calpipe.protect(df.filter(pl.col("stream") == "b"), order_by="event_id", method="platt",
                        window=100)  # fmt: skip


@FAST
@given(seed=st.integers(0, 10_000), cut=st.integers(1, 60))
def test_filling_and_fitted_streams_in_one_call_equal_one_call_each(seed, cut):
    """Streams whose window is still filling skip the per-stream fit loop (all at once): mixed
    with fitted ones in one call, chunked at any cut, each equals its own one-pass run."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, 6)  # window 12: some streams fill, some never do
    cal = make_calibrator("beta", window=12, refit_every=5)
    cal.warn_unfilled = False
    parts = [_stream(seed + k, int(m)) for k, m in enumerate(sizes)]
    df = pl.DataFrame({
        "stream": np.repeat(np.arange(len(sizes)), sizes), "event_id": np.arange(sizes.sum()),
        "score": np.concatenate([p for p, _ in parts]),
        "label": np.concatenate([y for _, y in parts]),
    }).with_columns(pl.when(pl.col("label") >= 0).then(pl.col("label")))  # fmt: skip
    kw = {"by": "stream", "order_by": "event_id", "method": "beta", "window": 12,
          "refit_every": 5}  # fmt: skip
    a = calpipe.protect_with_state(df.head(cut), **kw)
    b = calpipe.protect_with_state(df.slice(cut), **kw, state=a.state)
    got = pl.concat([a.scores, b.scores])["protected_score"].to_numpy()
    want = np.concatenate([cal.run(p, y)[0].protected for p, y in parts])
    np.testing.assert_array_equal(got, want)


def test_run_batch_with_a_windowed_state_of_wrong_header_lengths_gave_raw_numpy_errors():
    # a FlatState whose header [u, b, f] does not add up to its vector's length: the window
    # was read out of its segment (ragged_take's ValueError); now the layout's StateError
    from calpipe.calibrators.base import FlatState
    from calpipe.errors import StateError

    cal = make_calibrator("isotonic")
    st = cal.initial_state(2, 2)
    values = st.values.copy()
    values[3] = 5.0  # stream 1 claims u = 5 events, b = 0 in its window
    bad = FlatState(values, st.offsets, st.log10m)
    with pytest.raises(StateError, match="state vector 1 does not have the layout"):
        cal.run_batch(np.array([0.2, 0.7]), np.array([0, 1]), np.arange(2),
                      np.zeros(2, np.int8), np.array([0, 1, 2]), bad)  # fmt: skip
