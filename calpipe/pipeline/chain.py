"""Stage ``protected_scores`` + ``calibrator_state`` + ``pipeline_days``: the chain of days.

Owns the chain's rules (the first day, the state of day d - 1 that day d starts from, and the
:class:`calpipe.errors.StateError` when it is missing or was computed under another
configuration), :class:`Chain` (the state carried in memory from day to day, one
:func:`calpipe.protect_with_state` call per day or batch of streams), and the rows of the three
tables (:func:`protected_rows`, :func:`state_rows`, :meth:`Chain.day_row`), which the stage
(:func:`protect_days`) and the fused run (``calpipe/pipeline/tables.py``) both write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import polars as pl

from calpipe import storage
from calpipe.errors import StateError
from calpipe.night.chain import Chain
from calpipe.night.events import protect_columns
from calpipe.night.settings import Settings, as_date
from calpipe.pipeline.classes import stored_n_classes
from calpipe.pipeline.labels import stored_arrivals
from calpipe.pipeline.settings import StageResult
from calpipe.pipeline.transactions import write_days


def chain_first_day(con) -> dt.date | None:
    """The first day of the chain stored in this database (None before the first run)."""
    row = storage.fetch_one(con, "SELECT min(first_day) FROM pipeline_days")
    return None if row is None else row[0]


def _first_missing_day(con, first_day: dt.date, before: dt.date) -> dt.date | None:
    done = {
        r[0]
        for r in con.execute(
            "SELECT date FROM pipeline_days WHERE date BETWEEN ? AND ?", [first_day, before]
        ).fetchall()
    }
    for d in storage.iter_days(first_day, before):
        if d not in done:
            return d
    return None


def state_before(con, day: dt.date, settings: Settings, first_day: dt.date) -> pl.DataFrame | None:
    """The calibrator state at the end of ``day - 1`` (None when ``day`` is the first day).

    Raises StateError with what to do if ``day - 1`` has not been materialized, was computed under
    another configuration, or belongs to a chain that starts on another day.
    """
    if day < first_day:
        raise StateError(f"day {day} is before the chain's first day {first_day}")
    if day == first_day:
        recorded = chain_first_day(con)
        if recorded is not None and recorded != first_day:
            raise StateError(
                f"cannot start a chain on {day}: this database's chain starts on {recorded} "
                "(set the first day to it, e.g. CALPIPE_START_DATE, or use a new database)"
            )
        return None
    prev = day - dt.timedelta(days=1)
    row = storage.fetch_one(
        con,
        "SELECT first_day, method, config_fingerprint, config_json, n_streams FROM pipeline_days "
        "WHERE date = ?",
        [prev],
    )
    if row is None:
        missing = _first_missing_day(con, first_day, prev)
        raise StateError(
            f"cannot run day {day}: day {prev} has no calibrator state. The chain starts on "
            f"{first_day}; materialize the days in order (first missing day: {missing}), or run a "
            f"backfill from {missing} to {day}"
        )
    rec_first, method, fp, cfg, n_streams = row
    if rec_first != first_day:
        raise StateError(
            f"cannot run day {day}: this database's chain starts on {rec_first}, but this run "
            f"says the first day is {first_day}"
        )
    want = settings.fingerprint_for(stored_n_classes(con) or 2)
    if fp != want:
        raise StateError(
            f"cannot run day {day}: day {prev} was computed by {method!r} with config "
            f"fingerprint {fp} ({cfg}), this run is {settings.method!r} with fingerprint "
            f"{want} ({settings.to_json()}); loading a state under another "
            "configuration is an error: use the same method options, or a new database"
        )
    altered = _state_rows_missing(con, first_day, prev)
    if altered is not None:  # deleted rows would resume those streams from an older state
        d, n_rows, n_recorded = altered
        raise StateError(
            f"cannot run day {day}: calibrator_state of {d} has {n_rows} rows, but "
            f"pipeline_days recorded {n_recorded} streams whose state changed that day; the state "
            f"was altered outside calpipe: restore it, or re-run from the chain's first day "
            f"{first_day} into a new database"
        )
    state = state_as_of(con, prev)
    if state.height != n_streams:
        raise StateError(
            f"cannot run day {day}: calibrator_state holds {state.height} streams up to {prev}, "
            f"but pipeline_days recorded {n_streams} streams at the end of that day; the state "
            f"was altered outside calpipe: restore it, or re-run from the chain's first day "
            f"{first_day} into a new database"
        )
    return state.drop("date")


#: The state of every stream at the end of day $1: its latest ``calibrator_state`` row on or
#: before it (a day stores the rows of the streams whose state changed, :func:`state_rows`).
#: The latest dates are found on two narrow columns first, so that only the needed rows' state
#: vectors are read.
_STATE_AS_OF_SQL = """
SELECT s.* FROM calibrator_state s
JOIN (SELECT stream, max(date) AS date FROM calibrator_state WHERE date <= $1 GROUP BY stream) l
  USING (stream, date)
ORDER BY s.stream
"""


def state_hash_before(con, day: dt.date) -> str | None:
    """The ``state_hash`` of ``day - 1`` (None on the chain's first day or for a day computed
    before calpipe recorded it): where the hash chain of the days from ``day`` on starts."""
    row = storage.fetch_one(
        con, "SELECT state_hash FROM pipeline_days WHERE date = ?", [day - dt.timedelta(days=1)]
    )
    return None if row is None else row[0]


def state_as_of(con, day: dt.date) -> pl.DataFrame:
    """The calibrator state of every stream at the end of ``day`` (one row per stream, with the
    ``date`` of the row it comes from): each stream's latest ``calibrator_state`` row on or
    before ``day``. What :func:`calpipe.pipeline.serving_map` takes to serve the map in force
    then, and what the ``calibrate_score_as_of`` macro evaluates in SQL."""
    return storage.query(con, _STATE_AS_OF_SQL, [as_date(day)])


def _state_rows_missing(con, first_day: dt.date, last: dt.date) -> tuple | None:
    """The first day of [first_day, last] whose ``calibrator_state`` row count differs from the
    ``n_state_rows`` that ``pipeline_days`` recorded: (day, rows, recorded), or None. Reads the
    date column only (a stream's rows are sparse: a deleted row would go unnoticed by the state
    as of a later day, which would quietly resume that stream from an older row)."""
    return storage.fetch_one(
        con,
        """SELECT d.date, coalesce(c.n, 0), d.n_state_rows FROM pipeline_days d
           LEFT JOIN (SELECT date, count(*) AS n FROM calibrator_state
                      WHERE date BETWEEN $1 AND $2 GROUP BY date) c USING (date)
           WHERE d.date BETWEEN $1 AND $2 AND coalesce(c.n, 0) <> d.n_state_rows
           ORDER BY d.date LIMIT 1""",
        [first_day, last],
    )


def _day_events_sql(n_classes: int) -> str:
    """A day's scored events in their stored order (the source's: deterministic, so the day's
    protected_scores rows, written in the same order, are too). No ORDER BY: calpipe.protect
    groups the streams by hashing and finds an event log already in time order without a sort,
    where a SQL sort by (stream, event_time, event_id) would cost more than the protection."""
    cols = ", ".join(protect_columns(n_classes))
    return f"SELECT {cols} FROM scored_events WHERE event_date = ?"


def protect_days(
    con,
    start: dt.date,
    end: dt.date,
    settings: Settings,
    *,
    first_day: dt.date | None = None,
    on_day: Callable[[dt.date], None] | None = None,
) -> StageResult:
    """Stage ``protected_scores`` + ``calibrator_state``: run the days [start, end] in order.

    Day d starts from the state of d - 1 (read from the database for the first day of the range,
    then carried in memory), runs one :func:`calpipe.protect_with_state` over all streams of the
    day, and produces the day's protected rows, its state rows (keyed by d, one per stream seen
    so far) and its ``pipeline_days`` row. Days are read and written one at a time, in
    transactions of whole days (:func:`write_days`): only one day's events and the small state
    frame are held in memory. ``first_day`` is the chain's first day (default: the one stored,
    else ``start``).
    """
    start, end = as_date(start), as_date(end)
    if first_day is None:
        first_day = chain_first_day(con) or start
    first_day = as_date(first_day)
    k = stored_n_classes(con) or 2
    chain = Chain(
        settings, first_day, state_before(con, start, settings, first_day),
        state_hash_before(con, start), k,
    )  # fmt: skip

    def write(writer: storage.PartitionWriter, d: dt.date, events: pl.DataFrame) -> None:
        day = chain.step(events, d, stored_arrivals(con, d, k))
        # in the input's order (the engine keeps it): no sort of the day's rows
        writer.insert("protected_scores", day.protected, sort=False)
        writer.insert("calibrator_state", day.state)
        writer.insert("pipeline_days", pl.DataFrame([day.day_row]))
        if on_day is not None:
            on_day(d)

    tables = ["protected_scores", "calibrator_state", "pipeline_days"]
    rows = write_days(
        con, start, end, tables, lambda d: storage.query(con, _day_events_sql(k), [d]), write
    )
    return StageResult(start, end, {t: rows[t] for t in tables[:2]})


def require_chain(con, start: dt.date, end: dt.date, what: str) -> None:
    missing = _first_missing_day(con, start, end)
    if missing is not None:
        raise StateError(
            f"cannot compute {what} for {missing}: protected_scores/calibrator_state of {missing} "
            "have not been materialized"
        )
