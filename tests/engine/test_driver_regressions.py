"""Regression tests of calpipe.engine.driver, each named after what broke."""

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe.errors import StateError


def test_single_stream_state_join_key_dtype_mismatch():
    """by=() with a carried state joined a UInt32 stream index to an Int64 one and raised."""
    rng = np.random.default_rng(3)
    n = 200
    events = pl.DataFrame(
        {
            "event_time": np.arange(n),
            "event_id": np.arange(n),
            "score": rng.uniform(0.05, 0.95, n),
            "label": rng.integers(0, 2, n),
        }
    )
    one = calpipe.protect(events, by=())
    first = calpipe.protect_with_state(events.head(120), by=())
    rest = calpipe.protect_with_state(events.tail(n - 120), by=(), state=first.state)
    chunked = pl.concat([first.scores, rest.scores])
    assert chunked["protected_score"].to_list() == one["protected_score"].to_list()
    assert rest.state["n_events"].item() == n


@pytest.mark.parametrize(
    ("method", "corrupt"),
    [
        ("composite-jumper", lambda w: [float("nan"), *w[1:]]),  # NaN in a state vector
        ("composite-jumper", lambda w: [-1.0, *w[1:]]),  # a negative mixture weight
        ("composite-jumper", lambda w: w[:-1]),  # a vector of the wrong length
        ("composite-experts", lambda w: [-1.0, *w[1:]]),
        ("beta", lambda w: [*w, 1.0]),  # a windowed state off its layout
    ],
)
def test_state_errors_named_the_streams_position_in_the_batch_not_its_key(method, corrupt):
    """A bad stored state row said "state vector 1": the position of the stream in the engine's
    batch, which the user cannot map to a row. The error now names the stream by its key."""
    rng = np.random.default_rng(5)
    n = 300
    events = pl.DataFrame(
        {
            "stream": rng.choice(["alpha", "beta", "gamma"], n),
            "event_time": np.arange(n),
            "event_id": np.arange(n),
            "score": rng.uniform(0.05, 0.95, n),
            "label": rng.integers(0, 2, n),
        }
    )
    state = calpipe.protect_with_state(events, method=method).state
    bad = state.with_columns(
        pl.when(pl.col("stream") == "gamma")
        .then(pl.col("weights").map_elements(corrupt, return_dtype=pl.List(pl.Float64)))
        .otherwise(pl.col("weights"))
        .alias("weights")
    )
    later = events.with_columns(pl.col("event_time") + n, pl.col("event_id") + n)
    with pytest.raises(StateError, match=r"state row of stream='gamma': method") as info:
        calpipe.protect_with_state(later, method=method, state=bad)
    assert info.value.stream is not None


@pytest.mark.parametrize("method", ["jumper", "mean-jumper", "composite-jumper",
                                    "composite-experts", "platt", "venn-abers"])  # fmt: skip
def test_two_class_score_vectors_gave_rows_summing_to_half_or_nan(method):
    """issue 36 item 3: [[p0, p1], ...] ran the K-class kernels at K = 2 (composite-jumper:
    rows summing to 0.5; jumper, mean-jumper: [0, 0] then NaN). They are the binary p1: the
    binary path's forecasts (as [1 - p', p']), martingale and state, bit for bit."""
    import warnings

    rng = np.random.default_rng(3)
    n = 40
    p = rng.uniform(0.05, 0.95, n)
    ev = pl.DataFrame({"stream": ["a", "b"] * (n // 2), "event_time": np.arange(n),
                       "event_id": np.arange(n), "score": p,
                       "label": (rng.uniform(size=n) < p).astype(np.int64)})  # fmt: skip
    vec = ev.with_columns(pl.concat_list(1.0 - pl.col("score"), pl.col("score")).alias("scores"))
    vec = vec.with_columns(pl.col("scores").list.get(1).alias("score"))  # p1 exactly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = calpipe.protect_with_state(vec.drop("scores"), method=method)
        two = calpipe.protect_with_state(vec.drop("score"), scores="scores", method=method)
    got = np.array(two.scores["protected_scores"].to_list())
    want = one.scores["protected_score"].to_numpy()
    assert np.array_equal(got[:, 1], want) and np.array_equal(got[:, 0], 1.0 - want)
    assert np.array_equal(two.scores["log10_martingale"], one.scores["log10_martingale"])
    assert two.state.drop("last_event_time").equals(one.state.drop("last_event_time"))
