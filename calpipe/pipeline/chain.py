"""The stored chain of days: where a run resumes it, and the rules it must obey.

Reads the database only: the chain's first day, the state at the end of day d - 1 that day d
starts from (:func:`state_before`, with the :class:`calpipe.errors.StateError` when it is
missing, was computed under another configuration or was altered outside calpipe), its hash,
and the state as of any day (:func:`state_as_of`). The chain itself, carried in memory from
day to day, is :class:`calpipe.night.chain.Chain`.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from calpipe import storage
from calpipe.errors import StateError
from calpipe.night.chain import chain_hash, state_digests
from calpipe.night.settings import Settings, as_date
from calpipe.pipeline.classes import stored_n_classes


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
    if state.height:
        _verify_state_chain(con, day, state["date"].min(), prev, first_day)
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


#: The stored chain of [$1, $2]: each day's hashes and its number of state rows.
_CHAIN_SQL = """
SELECT date, state_hash, prev_state_hash, n_state_rows FROM pipeline_days
WHERE date BETWEEN $1 AND $2 ORDER BY date
"""


def _verify_state_chain(con, day: dt.date, lo: dt.date, prev: dt.date, first_day) -> None:
    """StateError naming the first day of [lo, prev] whose stored ``calibrator_state`` rows do
    not hash to the ``state_hash`` that ``pipeline_days`` recorded for it (rows deleted,
    changed or added outside calpipe, even with its counts altered to match), or whose
    ``prev_state_hash`` is not the day before's ``state_hash``.

    ``lo`` is the oldest day a row of the state loaded at the end of ``prev`` comes from: a row
    that this state would have read and that was deleted or changed is on a day of [lo, prev],
    so those days are the ones whose rows are hashed (one read, one digest a day,
    :func:`calpipe.night.chain.state_digests`; no per-stream loop). Days computed before calpipe
    recorded the hash (``state_hash`` null) are not checked. A hash names no stream: the error
    names the day and the streams whose state the run would have loaded from it."""
    days = storage.query(con, _CHAIN_SQL, [lo, prev])
    known = days.filter(pl.col("state_hash").is_null())
    if known.height:  # the days after the last one without a hash
        days = days.filter(pl.col("date") > known["date"].max())
    if days.height == 0:
        return
    lo = days["date"][0]
    rows = storage.query(
        con, "SELECT * FROM calibrator_state WHERE date BETWEEN ? AND ?", [lo, prev]
    ).sort("date", "stream")
    per_day = rows.group_by("date").len()
    counts = days.select("date").join(per_day, on="date", how="left")["len"].fill_null(0).to_numpy()
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    digests = state_digests(rows, bounds)
    h = days["prev_state_hash"][0]
    for d, stored, before, digest in zip(
        days["date"], days["state_hash"], days["prev_state_hash"], digests, strict=True
    ):
        if before != h:
            bad = f"its prev_state_hash is not the state_hash of {d - dt.timedelta(days=1)}"
        elif chain_hash(h, digest) != stored:
            bad = "its calibrator_state rows do not hash to its recorded state_hash"
        else:
            h = stored
            continue
        of_day = rows.filter(pl.col("date") == d)["stream"]
        streams = ", ".join(repr(x) for x in of_day.head(5).to_list())
        more = f" and {of_day.len() - 5} more" if of_day.len() > 5 else ""
        named = f" (its stored rows are of the streams {streams}{more})" if streams else ""
        raise StateError(
            f"cannot run day {day}: the stored state of day {d} was altered outside calpipe: "
            f"{bad}{named}; a row was deleted, changed or added; restore the database, or "
            f"re-run from the chain's first day {first_day} into a new database"
        )


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
