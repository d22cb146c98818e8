"""Rows of ``martingale_alarms``: each stream's first crossing of the alarm threshold in a day.

:func:`first_crossings` reads a day's (or a span's) protected rows and the state before it: the
event at which a stream's running log10 test martingale first reaches
:data:`calpipe.config.ALARM_LOG10_THRESHOLD` (Ville's inequality: probability at most 1 % under
calibrated base forecasts). Pure and in memory, like every module of :mod:`calpipe.night`.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from calpipe import config
from calpipe.night.monitoring import stream_groups


def first_crossings(
    scores: pl.DataFrame,
    before: pl.DataFrame | None,
    day: dt.date | None,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
) -> pl.DataFrame:
    """``martingale_alarms`` rows of ``day``: per stream whose maximum before the day
    (``before``, the state of day - 1; None on the chain's first day) is below the threshold, its
    first event in replay order (event_time, then event_id) with log10 S >= threshold.

    ``scores`` holds the day's protected rows with ``stream``, ``event_time``, ``event_id`` and
    ``log10_martingale`` (the engine's output; rows below the threshold may be left out, they
    are never chosen).
    Per-stream minima of event_time, then of event_id among the ties, instead of a sort.
    ``groups``: ``stream_groups(scores, ["stream"])``, if known.

    ``day=None``: the rows of several consecutive days at once (``scores`` with their
    ``event_date``, ``before`` the state before the first): a stream's maximum before a day is
    below the threshold until its first day with a row at it, so its crossing is on that day.
    The same rows as day by day (a span of the nightly run)."""
    thr = config.ALARM_LOG10_THRESHOLD
    hit = scores["log10_martingale"].to_numpy() >= thr
    if before is not None and before.height:
        hot = before.filter(pl.col("log10_martingale_max") >= thr)["stream"]
        hit &= ~scores["stream"].is_in(hot.implode()).to_numpy()
    if day is None:  # each stream's hits of its first day with one
        scores = scores.filter(pl.Series(hit))
        scores = scores.filter(pl.col("event_date") == pl.col("event_date").min().over("stream"))
        hit, groups = np.ones(scores.height, dtype=bool), None
    hits = np.flatnonzero(hit)
    if hits.size:
        ids, first = stream_groups(scores, ["stream"]) if groups is None else groups
        t = scores["event_time"].to_physical().to_numpy()
        t_first = np.full(first.shape[0], np.iinfo(np.int64).max)
        np.minimum.at(t_first, ids[hits], t[hits])
        hits = hits[t[hits] == t_first[ids[hits]]]  # the hits at their stream's first time
    first_rows = scores[hits.tolist()].sort("stream", "event_id").unique("stream", keep="first")
    by_day = day is None
    return first_rows.sort(["event_date", "stream"] if by_day else "stream").select(
        pl.col("event_date").alias("date") if by_day else pl.lit(day, pl.Date).alias("date"),
        "stream",
        "event_time",
        "event_id",
        "log10_martingale",
        pl.lit(thr, pl.Float64).alias("threshold"),
    )
