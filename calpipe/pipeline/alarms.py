"""Stage ``martingale_alarms``: the first crossing of the alarm level per stream, in its day.

A stream crosses on day d if its running maximum before d (the state of d - 1) is below
:data:`calpipe.config.ALARM_LOG10_THRESHOLD` and one of its events of day d reaches it; the row
records that event and value. :func:`first_crossings` computes a day's rows from memory; the
stage (:func:`alarm_days`, from the stored rows) and the fused run (``calpipe/pipeline/tables.py``,
from the engine's output) both call it.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from calpipe import config, storage
from calpipe.pipeline.chain import require_chain
from calpipe.pipeline.monitoring import stream_groups
from calpipe.pipeline.settings import StageResult, as_date
from calpipe.pipeline.transactions import day_range

#: The candidate rows of [$1, $2] for :func:`first_crossings` ($3 = threshold): protected rows
#: at or above the threshold, with their event_time from scored_events, of streams whose maximum
#: before the row's day (the state at the end of the day before: the stream's latest row before
#: the day; the running maximum only grows, so no earlier row of the stream reached it) is below
#: it. The two filters are :func:`first_crossings`' own, pushed down so that only a crossing
#: day's rows leave DuckDB.
_CANDIDATES_SQL = """
SELECT p.event_date, p.stream, e.event_time, p.event_id, p.log10_martingale
FROM protected_scores p
JOIN scored_events e
  ON e.event_date = p.event_date AND e.stream = p.stream AND e.event_id = p.event_id
 AND e.event_date BETWEEN $1 AND $2
WHERE p.event_date BETWEEN $1 AND $2 AND p.log10_martingale >= $3
  AND NOT EXISTS (
      SELECT 1 FROM calibrator_state s
      WHERE s.date < p.event_date AND s.stream = p.stream AND s.log10_martingale_max >= $3)
"""


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
    ``log10_martingale`` (the engine's output in the fused run, or the stored candidate rows in
    :func:`alarm_days`; rows below the threshold may be left out, they are never chosen).
    Per-stream minima of event_time, then of event_id among the ties, instead of a sort.
    ``groups``: ``stream_groups(scores, ["stream"])``, if known.

    ``day=None``: the rows of several consecutive days at once (``scores`` with their
    ``event_date``, ``before`` the state before the first): a stream's maximum before a day is
    below the threshold until its first day with a row at it, so its crossing is on that day.
    The same rows as day by day (a span of the fused run)."""
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


def alarm_days(con, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``martingale_alarms``: the first crossing of log10 S >= 2 per stream, in its day.

    Per chunk of :data:`calpipe.config.CHUNK_DAYS` days, one query reads the candidate rows
    (:data:`_CANDIDATES_SQL`) and the state rows before the chunk's last day that are at the
    alarm level (a stream at it before day d: one of its rows before d is); each day's rows are
    then :func:`first_crossings` of its candidates, as in the fused run.
    """
    start, end = as_date(start), as_date(end)
    require_chain(con, start, end, "martingale_alarms")
    thr = config.ALARM_LOG10_THRESHOLD
    res = StageResult(start, end, {"martingale_alarms": 0})
    for c0, c1 in day_range(start, end):
        hot = storage.query(
            con,
            "SELECT date, stream, log10_martingale_max FROM calibrator_state "
            "WHERE date < $1 AND log10_martingale_max >= $2",
            [c1, thr],
        )
        candidates = storage.query(con, _CANDIDATES_SQL, [c0, c1, thr])
        by_day = candidates.partition_by("event_date", as_dict=True)
        rows = [
            first_crossings(hits, hot.filter(pl.col("date") < d), d)
            for (d,), hits in sorted(by_day.items())
        ]
        alarms = pl.concat(rows) if rows else pl.DataFrame()  # replacing with none: a delete
        storage.replace_partitions(con, c0, c1, {"martingale_alarms": alarms})
        res.rows["martingale_alarms"] += alarms.height
    return res
