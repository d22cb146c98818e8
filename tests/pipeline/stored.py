"""An oracle for the nightly run's derived tables: each recomputed from the *stored* rows.

``calpipe run`` computes ``calibration_daily``, ``performance_estimates``,
``calibration_arrivals``, ``martingale_alarms`` and ``calibration_map`` from memory, batch by batch and part by part, and never reads back what
it wrote. Here each is recomputed from the tables as stored, by SQL written for the test (the
stored-row queries of the retired stage functions) and the night's row functions on whole
days: a day's stored protected rows in their stored order for the daily metrics; the arrived
forecasts joined in SQL (the labels of the day's scores rows, then the feed's, each with the
forecast made at its event) for the arrivals; the candidate rows at the alarm level joined to
their event times for the alarms; the stored state rows for the maps. Equal tables say that the
memory path (batches, parts, spans, the label lookups) loses, doubles and reorders nothing.
"""

from __future__ import annotations

import polars as pl

from calpipe import config, storage
from calpipe.night.alarms import first_crossings
from calpipe.night.mapping import map_rows
from calpipe.night.monitoring import arrival_metrics, daily_rows
from calpipe.night.performance import estimate_rows
from calpipe.pipeline import Settings, stored_n_classes

#: The forecasts whose labels were learnt on the nights [$1, $2]: the labels of each night's
#: scores rows (delay 0) that the feed did not bring that night, and the feed's arrivals with
#: the forecast made at their event; sorted by night, stream, event id.
ARRIVED_SQL = """
SELECT p.event_date AS date, p.stream, p.event_id, p.base_score{s}, p.protected_score{s}, p.label,
       0.0 AS delay_s
FROM protected_scores p
WHERE p.event_date BETWEEN $1 AND $2 AND p.label IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM event_labels l WHERE l.date = p.event_date
                  AND l.event_date = p.event_date AND l.stream = p.stream
                  AND l.event_id = p.event_id)
UNION ALL
SELECT l.date, l.stream, l.event_id, p.base_score{s}, p.protected_score{s}, l.label,
       epoch_us(l.label_time) / 1e6 - epoch_us(l.event_time) / 1e6 AS delay_s
FROM event_labels l
JOIN protected_scores p
  ON p.event_date = l.event_date AND p.stream = l.stream AND p.event_id = l.event_id
WHERE l.date BETWEEN $1 AND $2
ORDER BY date, stream, event_id
"""

#: The rows of [$1, $2] at the alarm level ($3) of streams whose maximum before the row's day
#: is below it, with their event_time.
CANDIDATES_SQL = """
SELECT p.event_date, p.stream, e.event_time, p.event_id, p.log10_martingale
FROM protected_scores p
JOIN scored_events e
  ON e.event_date = p.event_date AND e.stream = p.stream AND e.event_id = p.event_id
WHERE p.event_date BETWEEN $1 AND $2 AND p.log10_martingale >= $3
  AND NOT EXISTS (
      SELECT 1 FROM calibrator_state s
      WHERE s.date < p.event_date AND s.stream = p.stream AND s.log10_martingale_max >= $3)
"""


def derived_tables(con, settings: Settings | None = None) -> dict[str, pl.DataFrame]:
    """The five derived tables of every stored day, recomputed from the stored rows."""
    settings = settings or Settings()
    days = storage.query(con, "SELECT min(date) AS a, max(date) AS b FROM pipeline_days")
    start, end = days["a"][0], days["b"][0]
    s = "" if (stored_n_classes(con) or 2) == 2 else "s"
    state = storage.read_partitions(con, "calibrator_state", start, end)
    daily, estimates = [], []
    for d in storage.iter_days(start, end):
        scores = storage.query(
            con,
            f"SELECT stream, base_score{s}, protected_score{s}, label, log10_martingale "
            "FROM protected_scores WHERE event_date = ?",
            [d],
        )
        daily.append(daily_rows(scores, state.filter(pl.col("date") == d), d))
        estimates.append(estimate_rows(scores, d))
    thr = config.ALARM_LOG10_THRESHOLD
    hot = state.filter(pl.col("log10_martingale_max") >= thr)
    candidates = storage.query(con, CANDIDATES_SQL, [start, end, thr])
    alarms = [
        first_crossings(hits, hot.filter(pl.col("date") < d), d)
        for (d,), hits in sorted(candidates.partition_by("event_date", as_dict=True).items())
    ]
    arrived = storage.query(con, ARRIVED_SQL.format(s=s), [start, end])
    return {
        "calibration_daily": pl.concat([f for f in daily if f.height] or daily[:1]),
        "performance_estimates": pl.concat([f for f in estimates if f.height] or estimates[:1]),
        "calibration_arrivals": arrival_metrics(arrived, state),
        "martingale_alarms": pl.concat(alarms) if alarms else pl.DataFrame(),
        "calibration_map": map_rows(state, settings),
    }


def assert_derived_tables_match(con, settings: Settings | None = None) -> None:
    """Each derived table as stored equals its recomputation from the stored rows
    (:func:`derived_tables`), row for row (in the table's sort order) and bit for bit."""
    for name, want in derived_tables(con, settings).items():
        got = storage.query(con, f"SELECT * FROM {name} ORDER BY ALL")
        if want.height == 0:
            assert got.height == 0, name
            continue
        want = want.select(got.columns).cast(dict(got.schema)).sort(got.columns)
        assert got.equals(want), name
