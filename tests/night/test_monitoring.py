"""The monitoring rows of calpipe.night.monitoring: the arrival statistics of a night whose
labels all came in its rows, taken from its daily statistics, equal those computed from its
labelled rows, bit for bit."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import calpipe
from calpipe.night.monitoring import (
    arrival_stats,
    arrived_in_rows,
    day_stats,
    labels_in_id_order,
    rows_arrival_stats,
    stream_groups,
)

DAY = dt.date(2024, 5, 1)


def protected(n: int, n_streams: int, seed: int, shuffle_ids: bool, k: int = 2) -> pl.DataFrame:
    """A night's protected rows in time order: ids increase with time unless ``shuffle_ids``."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.01, 0.99, n)
    label = np.where(rng.random(n) < 0.7, (rng.random(n) < base).astype(np.int32), -1)
    ids = rng.permutation(n) if shuffle_ids else np.arange(n)
    cols = {
        "event_date": pl.Series([DAY] * n, dtype=pl.Date),
        "stream": [f"s{i}" for i in rng.integers(0, n_streams, n)],
        "event_id": ids.astype(np.int64),
        "label": pl.Series(label).replace(-1, None),
        "log10_martingale": rng.normal(0, 1, n),
    }
    if k == 2:
        cols |= {"base_score": base, "protected_score": np.clip(base + rng.normal(0, 0.05, n),
                                                                0.001, 0.999)}  # fmt: skip
    else:
        p = rng.dirichlet(np.ones(k), n)
        cols |= {"base_scores": p.tolist(), "protected_scores": p[:, ::-1].tolist(),
                 "label": pl.Series(np.where(label >= 0, rng.integers(0, k, n), -1)).replace(-1, None)}  # fmt: skip
    return pl.DataFrame(cols)


#: The arguments of :func:`protected` that the property tests draw.
NIGHTS = {
    "n": st.integers(0, 400), "n_streams": st.integers(1, 6), "seed": st.integers(0, 10**6),
    "shuffle_ids": st.booleans(), "k": st.sampled_from([2, 3]),
}  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(**NIGHTS)
def test_arrival_stats_from_the_daily_ones_equal_those_of_the_labelled_rows(
    n, n_streams, seed, shuffle_ids, k
):
    rows = protected(n, n_streams, seed, shuffle_ids, k)
    groups = stream_groups(rows, ["stream"])
    got = rows_arrival_stats(rows, day_stats(rows, DAY, groups), groups).sort("date", "stream")
    want = arrival_stats(arrived_in_rows(rows)).sort("date", "stream")
    if want.height == 0:
        assert got.height == 0
        return
    assert got.schema == want.schema
    assert got.equals(want)  # every bit (NaN = NaN)


def test_labels_in_id_order_sees_the_order_within_each_stream_and_only_of_labelled_rows():
    rows = pl.DataFrame({
        "stream": ["a", "b", "a", "b", "a"], "event_id": [1, 9, 2, 3, 0],
        "label": [1, 0, None, 1, None],
    })  # fmt: skip
    # a's labelled ids 1 (row 0); b's 9 then 3: out of order
    assert not labels_in_id_order(rows, stream_groups(rows, ["stream"]))
    ok = rows.with_columns(pl.Series("event_id", [1, 2, 9, 3, 0]))
    assert labels_in_id_order(ok, stream_groups(ok, ["stream"]))  # a's unlabelled 0 is ignored
    text = ok.with_columns(pl.col("event_id").cast(pl.String))
    assert not labels_in_id_order(text, stream_groups(text, ["stream"]))  # string ids: sorted


@pytest.mark.parametrize("shuffle_ids", [False, True])
def test_both_paths_are_taken(shuffle_ids):
    """The equality above covers both paths: ids in time order take the daily statistics,
    shuffled ids the sort."""
    rows = protected(2000, 5, 1, shuffle_ids)
    assert labels_in_id_order(rows, stream_groups(rows, ["stream"])) is not shuffle_ids


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("label_time", [False, True])
def test_the_engines_groups_are_the_monitorings_stream_groups(shuffle, label_time):
    # The night reuses ProtectResult.groups for its monitoring (Batch.groups): they must be
    # the very ids stream_groups gives the output rows, or every per-stream metric would be
    # attributed to another stream.
    rng = np.random.default_rng(3)
    n = 600
    t = (np.datetime64("2024-01-01T00:00") + np.arange(n).astype("timedelta64[m]")).astype(
        "datetime64[us]"
    )
    df = pl.DataFrame({
        "stream": rng.choice(["s" + str(i) for i in range(9)], n),
        "event_time": t, "event_id": np.arange(n),
        "score": rng.uniform(0.05, 0.95, n), "label": rng.integers(0, 2, n),
    })  # fmt: skip
    if label_time:
        df = df.with_columns(label_time=pl.col("event_time") + pl.duration(minutes=30))
    if shuffle:
        df = df[rng.permutation(n)]
    res = calpipe.protect_with_state(
        df, by="stream", label_time="label_time" if label_time else None
    )
    ids, first = res.groups
    want_ids, want_first = stream_groups(res.scores, ["stream"])
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(first, want_first)


@settings(max_examples=25, deadline=None)
@given(**NIGHTS)
def test_a_night_s_arrival_stats_from_memory_equal_those_of_the_sorted_rows(
    n, n_streams, seed, shuffle_ids, k
):
    """A night's arrival statistics from its labelled rows in memory (the nightly run's path:
    night_arrival_stats, the rows put in (stream, event id) order by sort_by_keys) have the
    bits of those of the same rows sorted by polars (arrived_in_rows)."""
    from calpipe.night.arrivals import Arrivals
    from calpipe.night.monitoring import labelled_rows, night_arrival_stats

    rows = protected(n, n_streams, seed, shuffle_ids, k)
    got = night_arrival_stats(labelled_rows(rows), Arrivals.empty(DAY, k))
    want = arrival_stats(arrived_in_rows(rows))
    assert got.equals(want)
