"""Data checks of a range of days: the dagster asset checks, and what ``calpipe run`` verifies.

Each check is one query over the stored tables returning a :class:`CheckOutcome` (passed, a
one-line description, a small frame of the offending rows); a failed warning check does not fail
the job.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import polars as pl

from calpipe import config, storage


@dataclass
class CheckOutcome:
    """Result of a data check: ``passed``, a one-line ``description``, a small ``details``
    frame, and ``values``: the check's numbers (what the dagster check shows as metadata)."""

    name: str
    passed: bool
    description: str
    details: pl.DataFrame | None = None
    warning: bool = False  # severity: a failed warning check does not fail the job
    values: dict[str, float] = field(default_factory=dict)


def check_probabilities(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Protected scores are finite probabilities in [0, 1] and the martingale is finite."""
    bad = storage.query(
        con,
        """WITH bad AS (
               SELECT event_date, stream, event_id, protected_score, protected_scores,
                      log10_martingale
               FROM protected_scores
               WHERE event_date BETWEEN $1 AND $2
                 AND (CASE WHEN protected_scores IS NULL
                           THEN protected_score IS NULL OR isnan(protected_score)
                                OR protected_score < 0 OR protected_score > 1
                           -- K classes: every class's probability in [0, 1], summing to 1
                           ELSE NOT list_bool_and(list_transform(protected_scores,
                                    lambda x: x >= 0 AND x <= 1 AND NOT isnan(x)))
                                OR abs(list_sum(protected_scores) - 1) > $3 END
                      OR NOT isfinite(log10_martingale)))
           SELECT b.* FROM bad b
           LEFT JOIN scored_events e
                  ON e.event_date = b.event_date AND e.stream = b.stream
                 AND e.event_id = b.event_id AND e.event_date BETWEEN $1 AND $2
           ORDER BY b.event_date, b.stream, e.event_time, b.event_id LIMIT 10""",
        [start, end, config.SCORES_SUM_TOL],
    )
    ok = bad.height == 0
    return CheckOutcome(
        "probabilities_valid", ok,
        "every protected score is a probability in [0, 1]" if ok
        else f"{bad.height}+ invalid protected scores (first: {bad.row(0)})",
        bad, values={"invalid_rows_shown": bad.height},
    )  # fmt: skip


def check_row_counts(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Each day has as many protected rows as scored events (per stream)."""
    diff = storage.query(
        con,
        """WITH i AS (SELECT event_date, stream, count(*) AS n_in FROM scored_events
                      WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL),
                o AS (SELECT event_date, stream, count(*) AS n_out FROM protected_scores
                      WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL)
           SELECT event_date, stream, coalesce(n_in, 0) AS n_in, coalesce(n_out, 0) AS n_out
           FROM i FULL OUTER JOIN o USING (event_date, stream)
           WHERE coalesce(n_in, 0) <> coalesce(n_out, 0)
           ORDER BY event_date, stream""",
        [start, end],
    )
    ok = diff.height == 0
    return CheckOutcome(
        "rows_in_equal_rows_out", ok,
        "rows in = rows out for every day and stream" if ok
        else f"{diff.height} (day, stream) with rows in != rows out, first {diff.row(0)}",
        diff, values={"mismatched_day_streams": diff.height},
    )  # fmt: skip


def _estimate_rules() -> str:
    """SQL: why an estimate row is invalid (NULL when it is valid): a value outside its loss's
    range, or outside its own interval (bounds are both NULL below ESTIMATE_MIN_EVENTS)."""
    ranges = {"log_loss": "e.{c} >= 0 AND isfinite(e.{c})", "brier": "e.{c} BETWEEN 0 AND 2",
              "accuracy": "e.{c} BETWEEN 0 AND 1"}  # fmt: skip
    rules = []
    for who in ("", "base_"):
        for loss, rule in ranges.items():
            c = f"{who}expected_{loss}"
            rules.append(f"WHEN NOT coalesce({rule.format(c=c)}, false) THEN '{c} out of range'")
            rules.append(
                f"WHEN NOT coalesce((e.{c}_low IS NULL AND e.{c}_high IS NULL) OR "
                f"(e.{c}_low <= e.{c} AND e.{c} <= e.{c}_high), false) "
                f"THEN '{c} outside its interval'"
            )
    return " ".join(rules)


def check_estimates(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Each day and stream with protected rows has its ``performance_estimates`` row, counting
    them, and its estimates are valid (each in its loss's range and inside its interval); no
    estimate is left without events (a stale row of a recomputed day)."""
    bad = storage.query(
        con,
        f"""WITH o AS (SELECT event_date AS date, stream, count(*) AS n FROM protected_scores
                       WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL),
                 e AS (SELECT * FROM performance_estimates WHERE date BETWEEN $1 AND $2)
            SELECT * FROM (
                SELECT coalesce(o.date, e.date) AS date, coalesce(o.stream, e.stream) AS stream,
                       o.n AS protected_rows, e.events AS estimated_events,
                       CASE WHEN e.stream IS NULL THEN 'no estimate'
                            WHEN o.stream IS NULL THEN 'an estimate without protected rows'
                            WHEN e.events <> o.n THEN 'its events differ from the protected rows'
                            {_estimate_rules()} END AS rule
                FROM o FULL OUTER JOIN e ON o.date = e.date AND o.stream = e.stream)
            WHERE rule IS NOT NULL ORDER BY date, stream""",
        [start, end],
    )
    ok = bad.height == 0
    if ok:
        text = "every day and stream has its valid performance estimate"
    else:
        r = bad.row(0, named=True)
        text = (f"{bad.height} (day, stream) with a missing or invalid performance estimate, "
                f"first {r['date']} stream {r['stream']!r}: {r['rule']}")  # fmt: skip
        if r["rule"] == "no estimate":
            text += (f" (a database made before schema version 12: re-run the days from "
                     f"{r['date']} to compute them)")  # fmt: skip
    return CheckOutcome(
        "estimates_valid", ok, text, bad.head(10), values={"bad_day_streams": bad.height}
    )


def check_change_points(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """The ``change_points`` rows detected on [start, end] are consistent: each crossed its
    threshold, its estimated change is not after its detection, the dates are their times' days,
    each stream's change points are numbered 1, 2, 3 ... in the order they were found, and
    the stream's state row of that night counts them (``change_count``). The description says
    how many change points the days found."""
    bad = storage.query(
        con,
        """WITH n AS (SELECT *, row_number() OVER (PARTITION BY stream ORDER BY detected_date)
                             AS nth FROM change_points)
           SELECT n.detected_date, n.stream, n.change_number,
                  CASE WHEN n.log10_statistic < n.threshold THEN 'below its threshold'
                       WHEN n.estimated_change_time > n.detected_time
                            THEN 'its estimated change is after its detection'
                       WHEN CAST(n.detected_time AS DATE) <> n.detected_date
                            OR CAST(n.estimated_change_time AS DATE) <> n.estimated_change_date
                            THEN 'a date is not its time''s day'
                       WHEN n.change_number <> n.nth THEN 'not numbered in detection order'
                       WHEN s.change_count IS DISTINCT FROM n.change_number
                            THEN 'the stream''s state that night does not count it'
                  END AS rule
           FROM n LEFT JOIN calibrator_state s
             ON s.date = n.detected_date AND s.stream = n.stream
           WHERE n.detected_date BETWEEN $1 AND $2 AND rule IS NOT NULL
           ORDER BY n.detected_date, n.stream""",
        [start, end],
    )
    found = storage.query(
        con,
        "SELECT count(*) AS n, count(DISTINCT stream) AS s FROM change_points "
        "WHERE detected_date BETWEEN $1 AND $2",
        [start, end],
    ).row(0)
    ok = bad.height == 0
    span = f"{start}" if start == end else f"{start}..{end}"
    if ok:
        text = f"{found[0]} change point(s) in {found[1]} stream(s) on {span}, each consistent"
    else:
        r = bad.row(0, named=True)
        text = (f"{bad.height} inconsistent change point(s), first {r['detected_date']} stream "
                f"{r['stream']!r} (number {r['change_number']}): {r['rule']}")  # fmt: skip
    return CheckOutcome(
        "change_points_valid", ok, text, bad.head(10),
        values={"change_points": int(found[0]), "bad_change_points": bad.height},
    )  # fmt: skip


#: State rows of [$1, $2] whose event count is not the stream's previous row's plus the day's
#: events, and streams with events on a day of [$1, $2] but no state row that day. A stream's rows
#: are sparse (days on which its state changed): its previous row is its latest before, so the
#: latest row of each stream before $1 joins the window.
_STATE_JUMPS_SQL = """
WITH s AS (
    SELECT date, stream, n_events, n_labelled + len(coalesce(pending_labels, [])) AS n_known,
           lag(n_events) OVER (PARTITION BY stream ORDER BY date) AS prev_events,
           lag(n_labelled + len(coalesce(pending_labels, [])))
               OVER (PARTITION BY stream ORDER BY date) AS prev_known
    FROM calibrator_state
    WHERE date BETWEEN $1 AND $2
       OR (date < $1 AND (stream, date) IN (SELECT (stream, max(date)) FROM calibrator_state
                                            WHERE date < $1 GROUP BY stream))),
e AS (SELECT date, stream, sum(n_day) AS n_day, sum(n_day_labelled) AS n_day_labelled FROM (
        SELECT event_date AS date, stream, count(*) AS n_day, count(label) AS n_day_labelled
        FROM scored_events WHERE event_date BETWEEN $1 AND $2 GROUP BY ALL
        UNION ALL
        SELECT date, stream, 0, count(*) FROM event_labels WHERE date BETWEEN $1 AND $2
        GROUP BY ALL) GROUP BY ALL)
SELECT date, stream, s.prev_events, coalesce(e.n_day, 0) AS n_day, s.n_events,
       s.prev_known, coalesce(e.n_day_labelled, 0) AS n_day_labelled, s.n_known
FROM s FULL OUTER JOIN e USING (date, stream)
WHERE date >= $1
  AND (s.n_events IS NULL OR s.n_events <> coalesce(s.prev_events, 0) + coalesce(e.n_day, 0)
       OR s.n_known <> coalesce(s.prev_known, 0) + coalesce(e.n_day_labelled, 0))
ORDER BY date, stream LIMIT 10
"""


def check_state_continuity(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """No gap in the chain: every day of the range (and the day before it, unless the range starts
    the chain) has state, each day's ``calibrator_state`` rows are those ``pipeline_days``
    recorded, one configuration throughout, every stream with events on a day has its state row
    of the day, and each stream's event count grows by exactly the day's events."""
    problems: list[str] = []
    days = storage.query(
        con,
        "SELECT date, first_day, config_fingerprint FROM pipeline_days "
        "WHERE date BETWEEN ? AND ? ORDER BY date",
        [start - dt.timedelta(days=1), end],
    )
    have = set(days["date"].to_list())
    first = days["first_day"].min() if days.height else None
    lo = start if first is None or start <= first else start - dt.timedelta(days=1)
    missing = [d for d in storage.iter_days(lo, end) if d not in have]
    if missing:
        shown = ", ".join(d.isoformat() for d in missing[:5])
        problems.append(f"days without state: {shown}{' ...' if len(missing) > 5 else ''}")
    counts = storage.query(
        con,
        """SELECT d.date, d.n_state_rows, count(s.stream) AS n_rows FROM pipeline_days d
           LEFT JOIN calibrator_state s ON s.date = d.date
           WHERE d.date BETWEEN ? AND ? GROUP BY ALL HAVING count(s.stream) <> d.n_state_rows
           ORDER BY d.date LIMIT 5""",
        [start - dt.timedelta(days=1), end],
    )
    if counts.height:
        r = counts.row(0, named=True)
        problems.append(
            f"calibrator_state of {r['date']} has {r['n_rows']} rows for the {r['n_state_rows']} "
            "streams whose state changed that day (pipeline_days)"
        )
    known = storage.fetch_one(
        con,
        """SELECT (SELECT count(DISTINCT stream) FROM calibrator_state WHERE date <= $1),
                  (SELECT n_streams FROM pipeline_days WHERE date = $1)""",
        [end],
    )
    if known is not None and known[1] is not None and known[0] != known[1]:
        problems.append(
            f"calibrator_state holds {known[0]} streams up to {end}, pipeline_days recorded "
            f"{known[1]}"
        )
    if days["config_fingerprint"].n_unique() > 1:
        problems.append(f"several configurations: {days['config_fingerprint'].unique().to_list()}")
    jumps = storage.query(con, _STATE_JUMPS_SQL, [start, end])
    if jumps.height:
        r = jumps.row(0, named=True)
        if r["n_events"] is None:
            problems.append(
                f"stream {r['stream']!r} has {r['n_day']} events and {r['n_day_labelled']} "
                f"labels on {r['date']} but no calibrator_state row that day"
            )
        elif r["n_events"] != (r["prev_events"] or 0) + r["n_day"]:
            problems.append(
                f"state counts do not follow the events: stream {r['stream']!r} on {r['date']} "
                f"has n_events {r['n_events']}, expected {r['prev_events'] or 0} + {r['n_day']} "
                "events of the day"
            )
        else:
            problems.append(
                f"state counts do not follow the labels: stream {r['stream']!r} on {r['date']} "
                f"knows {r['n_known']} labels (n_labelled + pending), expected "
                f"{r['prev_known'] or 0} + {r['n_day_labelled']} labels of the day (in its "
                "scores rows and arrived)"
            )
    gone = missing_rows(con, lo, end)
    if gone is not None:
        problems.append(f"{gone.message}: run the days again from it (calpipe run --start "
                        f"{gone.day})")  # fmt: skip
    stale = storage.query(
        con,
        """SELECT date FROM (SELECT date, prev_state_hash,
                                    lag(state_hash) OVER (ORDER BY date) AS before
                             FROM pipeline_days WHERE date BETWEEN ? AND ?)
           WHERE prev_state_hash <> before ORDER BY date LIMIT 1""",
        [start - dt.timedelta(days=1), end],
    )
    if stale.height:
        d = stale["date"][0]
        problems.append(
            f"day {d} is stale: it ran from a state of {d - dt.timedelta(days=1)} that was "
            f"recomputed since (calpipe run replays it)"
        )
    ok = not problems
    return CheckOutcome(
        "state_continuity", ok,
        f"the chain has no gap from {lo} to {end}" if ok else "; ".join(problems),
        jumps if jumps.height else None, values={"problems": len(problems)},
    )  # fmt: skip


#: The tables whose rows ``pipeline_days`` counts for each stored day: (table, its date
#: column, the ``pipeline_days`` column holding the count, what that column counts).
DAY_COUNTED: tuple[tuple[str, str, str, str], ...] = (
    ("protected_scores", "event_date", "n_events", "events"),
    ("scored_events", "event_date", "n_events", "events"),
    ("calibrator_state", "date", "n_state_rows", "streams whose state changed"),
)


@dataclass(frozen=True)
class MissingRows:
    """A stored day whose rows in ``table`` differ from the count ``pipeline_days`` recorded."""

    day: dt.date
    table: str
    rows: int
    recorded: int
    what: str

    @property
    def message(self) -> str:
        return (
            f"day {self.day}: {self.table} has {self.rows} rows, but pipeline_days recorded "
            f"{self.recorded} {self.what} that day (rows were changed outside calpipe)"
        )


def missing_rows(
    con, start: dt.date, end: dt.date, tables: tuple[str, ...] | None = None
) -> MissingRows | None:
    """The first stored day of [start, end] whose rows in one of ``tables`` (default: every
    table of :data:`DAY_COUNTED`, in that order) differ from the counts ``pipeline_days``
    recorded: rows deleted or added outside calpipe, e.g. ``calpipe sql --write "DELETE FROM
    protected_scores"``. None if every day is whole.

    One aggregate over the date columns only: a stream's state rows are sparse, so a deleted
    row would go unnoticed by the state as of a later day, which would quietly resume that
    stream from an older row; the counts notice it.
    """
    chosen = [t for t in DAY_COUNTED if tables is None or t[0] in tables]
    if tables is not None and len(chosen) != len(tables):
        raise ValueError(f"tables must be among {[t[0] for t in DAY_COUNTED]}, got {tables}")
    ctes = ",\n".join(
        f"c{i} AS (SELECT {col} AS date, count(*) AS n FROM {table} "
        f"WHERE {col} BETWEEN $1 AND $2 GROUP BY 1)"
        for i, (table, col, _, _) in enumerate(chosen)
    )
    counts = ", ".join(f"coalesce(c{i}.n, 0)" for i in range(len(chosen)))
    joins = " ".join(f"LEFT JOIN c{i} USING (date)" for i in range(len(chosen)))
    differs = " OR ".join(
        f"coalesce(c{i}.n, 0) <> d.{recorded}" for i, (_, _, recorded, _) in enumerate(chosen)
    )
    recorded = ", ".join(f"d.{t[2]}" for t in chosen)
    row = storage.fetch_one(
        con,
        f"WITH {ctes} SELECT d.date, {counts}, {recorded} FROM pipeline_days d {joins} "
        f"WHERE d.date BETWEEN $1 AND $2 AND ({differs}) ORDER BY d.date LIMIT 1",
        [start, end],
    )
    if row is None:
        return None
    k = len(chosen)
    for (table, _, _, what), n, want in zip(chosen, row[1 : 1 + k], row[1 + k :], strict=True):
        if n != want:
            return MissingRows(row[0], table, int(n), int(want), what)
    raise AssertionError("unreachable: the query returned a day whose counts all match")


#: Streams an alarm warning names (the rest are counted: a night of 1,000 alarms printed 1,000
#: names on one line; ``martingale_alarms`` lists them all).
ALARM_NAMES_SHOWN: int = 10


def _names(streams: list[str]) -> str:
    shown = ", ".join(streams[:ALARM_NAMES_SHOWN])
    rest = len(streams) - ALARM_NAMES_SHOWN
    return f"{shown} and {rest} more (all in martingale_alarms)" if rest > 0 else shown


def check_alarms(con, start: dt.date, end: dt.date) -> CheckOutcome:
    """Warning: streams whose test martingale first reached 100 (log10 S >= 2) on a day of
    [start, end] (``martingale_alarms``): their base forecasts are rejected as miscalibrated at
    the 1 % level (Ville). Streams that crossed on earlier days are counted, not re-raised: a
    nightly check warns once, the night a stream alarms, not on every night after it."""
    new = storage.query(
        con,
        """SELECT stream, date AS alarm_date, event_time, log10_martingale
           FROM martingale_alarms WHERE date BETWEEN ? AND ? ORDER BY stream""",
        [start, end],
    )
    before = storage.query(
        con, "SELECT count(*) AS n FROM martingale_alarms WHERE date < ?", [start]
    )["n"][0]
    ok = new.height == 0
    earlier = f"; {before} stream(s) alarmed before {start}" if before else ""
    span = f"{start}" if start == end else f"{start}..{end}"
    return CheckOutcome(
        "no_martingale_alarm", ok,
        (f"no stream reached log10 S >= 2 on {span}{earlier}" if ok
         else f"{new.height} stream(s) reached the alarm level (S >= 100) on {span}: "
              f"{_names(new['stream'].to_list())}{earlier}"),
        new, warning=True,
        values={"new_alarms": new.height, "streams_in_alarm": new.height + int(before)},
    )  # fmt: skip


def data_checks(con, start: dt.date, end: dt.date) -> list[CheckOutcome]:
    """Every data check of the days [start, end]: what :func:`calpipe.pipeline.run_range` runs
    after a run, and what the dagster code location reports for each day of a range run or of
    a ``calpipe run`` (the same queries, a day at a time)."""
    return [
        check_probabilities(con, start, end),
        check_row_counts(con, start, end),
        check_state_continuity(con, start, end),
        check_estimates(con, start, end),
        check_change_points(con, start, end),
        check_alarms(con, start, end),
    ]
