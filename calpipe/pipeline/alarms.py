"""Stage ``martingale_alarms``: the first crossing of the alarm level per stream, in its day.

A stream crosses on day d if its running maximum before d (the state of d - 1) is below
:data:`calpipe.config.ALARM_LOG10_THRESHOLD` and one of its events of day d reaches it; the row
records that event and value. :func:`first_crossings` computes a day's rows from memory; the
stage (:func:`alarm_days`, from the stored rows) and the fused run (``calpipe/pipeline/tables.py``,
from the engine's output) both call it.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from calpipe import config, storage
from calpipe.night.alarms import first_crossings
from calpipe.night.settings import as_date
from calpipe.pipeline.chain import require_chain
from calpipe.pipeline.settings import StageResult
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
