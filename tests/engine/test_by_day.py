"""calpipe.engine.driver.protect_by_day: a span of days in one pass equals one protect_with_state per day.

The oracle is the obvious loop: the days in order, one :func:`calpipe.protect_with_state` call
each, the state carried; the end-of-day states are that state's rows of the streams with events
that day. Every method (the protected ones and those of test_frame_methods), binary and K = 3,
from no state and from a carried one: the same rows, the same final state, the same end-of-day
states, bit for bit.
"""

from __future__ import annotations

import datetime as dt
import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import calpipe
from calpipe.engine.driver import protect_by_day
from tests.conftest import make_events
from tests.engine.test_driver_methods import CASES as METHOD_CASES
from tests.engine.test_driver_methods import FAST

CASES = {
    "jumper": ("jumper", {}, (2, 3)),
    "composite-jumper": ("composite-jumper", {}, (2, 3)),
    "composite-brier": ("composite-jumper", {"loss": "brier", "clip": None}, (2,)),
    **METHOD_CASES,
}
PARAMS = [
    pytest.param(name, k, id=f"{name}-K{k}") for name, (_, _, ks) in CASES.items() for k in ks
]


def _events(seed: int, k: int, n: int = 90) -> pl.DataFrame:
    """Random events over a few days: the day is the event hour's quarter-day bucket, so each
    stream's events are in day order; some days have no event of some streams."""
    df = make_events(seed, n_events=n, n_classes=k, null_frac=0.2)
    hours = (pl.col("event_time") - dt.datetime(2024, 1, 1)).dt.total_hours()
    return df.with_columns(
        (pl.lit(dt.date(2024, 1, 1)) + pl.duration(days=hours // 6))
        .cast(pl.Date)
        .alias("event_date")
    )


def _kw(name: str, k: int) -> dict:
    method, params, _ = CASES[name]
    return {"method": method, **params, **({"scores": "scores"} if k > 2 else {})}


def _day_by_day(df: pl.DataFrame, state, kw: dict):
    parts, rows = [], []
    for d in sorted(df["event_date"].unique().to_list()):
        day = df.filter(pl.col("event_date") == d)
        r = calpipe.protect_with_state(day, by="stream", state=state, **kw)
        state = r.state
        parts.append(r.scores)
        active = day["stream"].unique().implode()
        rows.append(
            state.filter(pl.col("stream").is_in(active)).with_columns(pl.lit(d).alias("date"))
        )
    return pl.concat(parts), pl.concat(rows), state


@pytest.mark.parametrize(("name", "k"), PARAMS)
@FAST
@given(seed=st.integers(0, 10_000), carried=st.booleans())
def test_a_span_equals_one_protect_with_state_per_day(name, k, seed, carried):
    df = _events(seed, k)
    kw = _kw(name, k)
    state = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # windows not yet filled
        if carried:  # the span resumes from the state of an earlier run
            first = df["event_date"].min()
            state = calpipe.protect_with_state(
                df.filter(pl.col("event_date") == first), by="stream", **kw
            ).state
            df = df.filter(pl.col("event_date") > first)
        scores, rows, final = _day_by_day(df, state, kw)
        got = protect_by_day(df, by="stream", state=state, **kw)
    key = ["stream", "event_time", "event_id"]
    assert_frame_equal(got.scores.sort(key), scores.sort(key))
    assert_frame_equal(got.state, final)
    assert_frame_equal(got.states, rows)
    days = sorted(df["event_date"].unique().to_list())
    assert got.days == days
    per_day = (
        df.group_by("event_date").agg(pl.len(), pl.col("stream").n_unique()).sort("event_date")
    )
    assert got.n_events.tolist() == per_day["len"].to_list()
    assert got.n_active.tolist() == per_day["stream"].to_list()
    seen = [df.filter(pl.col("event_date") <= d)["stream"] for d in days]
    carried_streams = set() if state is None else set(state["stream"])
    assert got.n_streams.tolist() == [len(carried_streams | set(s)) for s in seen]


def test_the_rows_come_back_in_the_input_order():
    df = _events(5, 2).sample(fraction=1.0, shuffle=True, seed=3)
    got = protect_by_day(df, by="stream")
    assert got.scores.drop("protected_score", "log10_martingale").equals(df)


def test_no_events_keeps_the_state():
    df = _events(6, 2)
    state = calpipe.protect_with_state(df, by="stream").state
    got = protect_by_day(df.clear(), by="stream", state=state)
    assert got.state.equals(state) and got.states.height == 0 and got.days == []
    assert "protected_score" in got.scores.columns


def test_a_stream_out_of_day_order_is_refused():
    df = _events(7, 2)
    last = df["event_date"].max()
    bad = df.with_columns(  # the stream's first event (in time) put on the last day
        pl.when(pl.col("event_time") == pl.col("event_time").min().over("stream"))
        .then(pl.lit(last))
        .otherwise(pl.col("event_date"))
        .alias("event_date")
    )
    with pytest.raises(calpipe.InputError, match=r"event_date.*must be in day order"):
        protect_by_day(bad, by="stream")


def test_labels_pending_in_the_state_are_refused():
    df = make_events(8, n_events=40, label_time=True)
    state = calpipe.protect_with_state(df, by="stream", label_time="label_time").state
    assume_pending = state["pending_labels"].list.len().sum()
    assert assume_pending > 0  # the fixture holds labels arriving after the last event
    later = df.with_columns(
        pl.col("event_time") + pl.duration(days=30), pl.col("event_id") + 10**6
    ).drop("label_time")
    later = later.with_columns(pl.col("event_time").dt.date().alias("event_date"))
    with pytest.raises(calpipe.InputError, match="labels known at their events only"):
        protect_by_day(later, by="stream", state=state)


def test_a_day_column_must_be_a_date():
    df = _events(9, 2).with_columns(pl.col("event_date").cast(pl.String))
    with pytest.raises(calpipe.InputError, match="must be a Date column"):
        protect_by_day(df, by="stream")


def test_one_stream_without_keys():
    df = _events(10, 2).filter(pl.col("stream") == "s0").drop("stream")
    got = protect_by_day(df, by=())
    state, parts = None, []
    for d in sorted(df["event_date"].unique().to_list()):
        r = calpipe.protect_with_state(df.filter(pl.col("event_date") == d), by=(), state=state)
        state, parts = r.state, [*parts, r.scores]
    np.testing.assert_array_equal(
        got.scores.sort("event_time", "event_id")["protected_score"],
        pl.concat(parts).sort("event_time", "event_id")["protected_score"],
    )
    assert_frame_equal(got.state, state)
