"""Stage ``calibration_daily``: forecast quality of base vs protected per stream and day.

Owns the table's rows (:func:`daily_rows`: :func:`daily_metrics` of a day's protected rows plus
the end-of-day martingale and the alarm flag), which the stage (:func:`monitor_days`, from the
stored rows) and the fused run (``calpipe/pipeline/tables.py``, from memory) both call. The
metrics themselves are defined in :mod:`calpipe.metrics` (polars expressions and their grouped
numpy forms, tested equal); rows are grouped by stream with the grouping kernel
(:func:`stream_groups`).
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from calpipe import config, storage
from calpipe.night.monitoring import arrival_metrics, daily_rows
from calpipe.night.settings import as_date
from calpipe.pipeline.chain import require_chain
from calpipe.pipeline.classes import stored_n_classes
from calpipe.pipeline.settings import StageResult
from calpipe.pipeline.transactions import day_range
from calpipe.storage.landing import part_sql


def _day_scores_sql(n_classes: int) -> str:
    """One day's protected rows, the columns the monitoring reads, in their stored order (the
    order the engine wrote them: the sums of the metrics run in it, so both paths agree to the
    bit)."""
    s = "" if n_classes == 2 else "s"
    return (
        f"SELECT stream, base_score{s}, protected_score{s}, label, log10_martingale "
        "FROM protected_scores WHERE event_date = ?"
    )


#: The forecasts whose labels were learnt on the nights [$1, $2], each with its night, its label
#: and how long the label took: the labels of each night's scores rows (known at their events,
#: delay 0; those the feed brought the same night count as arrivals) and the feed's arrivals
#: (``event_labels``), with the forecast made at the event (``protected_scores`` of its day). In
#: one fixed order, so that both paths sum the same rows in the same order.
_ARRIVED_SQL = """
SELECT p.event_date AS date, p.stream, p.event_id, p.base_score{s}, p.protected_score{s}, p.label,
       0.0 AS delay_s
FROM protected_scores p
WHERE p.event_date BETWEEN $1 AND $2 AND p.label IS NOT NULL {part_p}
  AND NOT EXISTS (SELECT 1 FROM event_labels l WHERE l.date = p.event_date
                  AND l.event_date = p.event_date AND l.stream = p.stream
                  AND l.event_id = p.event_id)
UNION ALL
SELECT l.date, l.stream, l.event_id, p.base_score{s}, p.protected_score{s}, l.label,
       epoch_us(l.label_time) / 1e6 - epoch_us(l.event_time) / 1e6 AS delay_s
FROM event_labels l
JOIN protected_scores p
  ON p.event_date = l.event_date AND p.stream = l.stream AND p.event_id = l.event_id
WHERE l.date BETWEEN $1 AND $2 {part_l} {part_p}
ORDER BY date, stream, event_id
"""


def _arrived(con, start: dt.date, end: dt.date, s: str) -> pl.DataFrame:
    """:data:`_ARRIVED_SQL`'s rows, in parts of about :data:`calpipe.config.ARRIVALS_QUERY_ROWS`
    arrived labels (streams split by hash), concatenated in the query's order. Why parts: the
    join of a night's labels with their forecasts must fit DuckDB's buffer pool (the pipeline's
    256 MB): 10M arrived labels failed with "Out of Memory" in one query."""
    n = storage.query(
        con, "SELECT count(*) AS n FROM event_labels WHERE date BETWEEN $1 AND $2", [start, end]
    )["n"][0]
    k = min(max(1, -(-int(n) // config.ARRIVALS_QUERY_ROWS)), 256)  # (part_sql's most)
    if k == 1:
        return storage.query(con, _ARRIVED_SQL.format(s=s, part_p="", part_l=""), [start, end])
    parts = [
        storage.query(con, _ARRIVED_SQL.format(
            s=s, part_p="AND " + part_sql("p.stream", (i, k)),
            part_l="AND " + part_sql("l.stream", (i, k)),
        ), [start, end])
        for i in range(k)
    ]  # fmt: skip
    return pl.concat(parts).sort("date", "stream", "event_id")


def _arrival_rows(con, start: dt.date, end: dt.date, state: pl.DataFrame) -> pl.DataFrame:
    """``calibration_arrivals`` rows of the nights [start, end]: per night and stream, the
    forecasts whose labels were learnt that night (:data:`_ARRIVED_SQL`): how many, base vs
    protected log loss, Brier, ECE and smooth ECE (:func:`daily_metrics`, over the forecasts
    made at their events), the mean and largest label delay, and the stream's martingale at the
    end of the night (``state``: the nights' ``calibrator_state`` rows; every stream that learnt
    a label on a night has one). One query for the range: a night's rows do not depend on it."""
    s = "" if (stored_n_classes(con) or 2) == 2 else "s"
    return arrival_metrics(_arrived(con, start, end, s), state)


def monitor_days(con, start: dt.date, end: dt.date) -> StageResult:
    """Stage ``calibration_daily`` + ``calibration_arrivals``: per day of [start, end], one row
    per stream with events (forecast quality of the day's events) and one per stream that
    learnt labels that night (the quality of the forecasts those labels judge: monitoring by
    arrival, for labels that land days after their events).

    One transaction per chunk of :data:`calpipe.config.CHUNK_DAYS` days, computed one day at a
    time from the day's stored protected rows (in their stored order: the engine's) by
    :func:`daily_rows`, the function the fused run calls on the same rows in memory, and
    :func:`_arrival_rows`, which both paths run on the stored rows."""
    start, end = as_date(start), as_date(end)
    require_chain(con, start, end, "calibration_daily")
    tables = ["calibration_daily", "calibration_arrivals"]
    res = StageResult(start, end, dict.fromkeys(tables, 0))
    day_sql = _day_scores_sql(stored_n_classes(con) or 2)
    for c0, c1 in day_range(start, end):
        state = storage.read_partitions(
            con, "calibrator_state", c0, c1,
            columns=["date", "stream", "log10_martingale", "log10_martingale_max"],
        )  # fmt: skip
        with storage.replacing_partitions(con, c0, c1, tables) as writer:
            for d in storage.iter_days(c0, c1):
                scores = storage.query(con, day_sql, [d])
                state_d = state.filter(pl.col("date") == d)
                writer.insert("calibration_daily", daily_rows(scores, state_d, d))
                del scores
            writer.insert("calibration_arrivals", _arrival_rows(con, c0, c1, state))
        for t in tables:
            res.rows[t] += writer.rows[t]
    return res
