"""calpipe.generate: the seeded synthetic streams with known drift dates."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

from calpipe import generate
from calpipe.engine import contract
from calpipe.generate import StreamSpec


@pytest.fixture(scope="module")
def events() -> pl.DataFrame:
    return generate.generate()


def test_same_seed_same_events_other_seed_other_events(events):
    assert generate.generate().equals(events)
    assert not generate.generate(seed=generate.DEFAULT_SEED + 1).equals(events)


def test_a_new_stream_does_not_change_the_others():
    extra = (*generate.DEFAULT_STREAMS, StreamSpec("extra"))
    a = generate.generate(n_days=5)
    b = generate.generate(n_days=5, streams=extra)
    assert b.filter(pl.col("stream") != "extra").equals(a)


def test_events_follow_the_data_contract(events):
    assert events.schema == pl.Schema(
        {"stream": pl.String, "event_id": pl.Int64, "event_time": pl.Datetime("us"),
         "score": pl.Float64, "label": pl.Int32}
    )  # fmt: skip
    cols = contract.resolve_columns(
        events.columns, score="score", scores=None, label="label", label_time=None,
        by="stream", order_by=("event_time", "event_id"),
    )  # fmt: skip
    assert contract.validate_frame(events, cols) == 2
    days = events["event_time"].dt.date()
    assert days.min() == generate.DEFAULT_START
    assert days.max() == generate.DEFAULT_START + dt.timedelta(days=generate.DEFAULT_DAYS - 1)
    # ids increase with time within each stream
    ordered = events.group_by("stream").agg(
        (pl.col("event_time").diff().dt.total_microseconds().fill_null(0) >= 0).all().alias("t"),
        (pl.col("event_id").diff().fill_null(1) == 1).all().alias("i"),
    )
    assert ordered["t"].all() and ordered["i"].all()
    assert set(events["stream"].unique()) == {s.name for s in generate.DEFAULT_STREAMS}


def test_volumes_match_the_specs(events):
    per_day = events.group_by("stream").len().with_columns(pl.col("len") / generate.DEFAULT_DAYS)
    rate = dict(per_day.iter_rows())
    for s in generate.DEFAULT_STREAMS:
        assert rate[s.name] == pytest.approx(s.events_per_day, rel=0.05)


def calibration_gap(df: pl.DataFrame) -> float:
    """Mean label minus mean score over the logit-binned scores (a calibrated stream: ~0)."""
    return float(df["label"].mean() - df["score"].mean())


def slope(df: pl.DataFrame) -> float:
    """Logistic-regression slope of the label on logit(score) by Newton's method (1 = calibrated)."""
    x = np.log(df["score"].to_numpy() / (1 - df["score"].to_numpy()))
    y = df["label"].to_numpy().astype(float)
    X = np.column_stack([np.ones_like(x), x])
    w = np.zeros(2)
    for _ in range(25):
        p = 1 / (1 + np.exp(-X @ w))
        w += np.linalg.solve(X.T @ (X * (p * (1 - p))[:, None]), X.T @ (y - p))
    return float(w[1])


def test_streams_are_calibrated_before_drift_and_drift_as_specified(events):
    truth = generate.drift_table()
    for spec in generate.DEFAULT_STREAMS:
        s = events.filter(pl.col("stream") == spec.name)
        date = truth.filter(pl.col("stream") == spec.name)["drift_date"][0]
        before = s if date is None else s.filter(pl.col("event_time").dt.date() < date)
        assert slope(before) == pytest.approx(1.0, abs=0.1), spec.name
        assert calibration_gap(before) == pytest.approx(0.0, abs=0.01), spec.name
        if date is None:
            continue
        after = s.filter(pl.col("event_time").dt.date() >= date)
        if spec.drift == "shift":  # base rate fell: labels below scores
            assert calibration_gap(after) < -0.04
            assert slope(after) == pytest.approx(1.0, abs=0.15)
        else:  # slope k of the label's log-odds on the score's
            assert slope(after) == pytest.approx(spec.strength, abs=0.15)


def test_drift_table_dates():
    truth = generate.drift_table()
    assert truth.filter(pl.col("drift") == "none")["drift_date"].null_count() == 3
    by_name = {s.name: s for s in generate.DEFAULT_STREAMS}
    for name, date in truth.drop_nulls().select("stream", "drift_date").iter_rows():
        assert date == generate.DEFAULT_START + dt.timedelta(days=by_name[name].drift_day)


def test_spec_validation():
    with pytest.raises(ValueError, match="drift must be one of"):
        StreamSpec("x", drift="sideways", drift_day=3)
    with pytest.raises(ValueError, match="drift_day is given iff"):
        StreamSpec("x", drift="shift")
