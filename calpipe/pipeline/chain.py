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
from calpipe.pipeline.checks import missing_rows
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
    altered = missing_rows(con, first_day, prev, ("calibrator_state",))
    if altered is not None:  # deleted rows would resume those streams from an older state
        d, n_rows, n_recorded = altered.day, altered.rows, altered.recorded
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
    names the day and its streams (:func:`_streams_of_altered_day`)."""
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
        named = _streams_of_altered_day(con, d, rows.filter(pl.col("date") == d)["stream"])
        raise StateError(
            f"cannot run day {day}: the stored state of day {d} was altered outside calpipe: "
            f"{bad}{named}; a row was deleted, changed or added; restore the database, or "
            f"re-run from the chain's first day {first_day} into a new database"
        )


#: Streams an altered day's message names (the rest are counted).
_NAMED = 5


def _names(streams: list) -> str:
    more = f" and {len(streams) - _NAMED} more" if len(streams) > _NAMED else ""
    return ", ".join(repr(x) for x in streams[:_NAMED]) + more


def _streams_of_altered_day(con, d: dt.date, stored: pl.Series) -> str:
    """What an altered day's message says of its streams: those whose state row of ``d`` is
    missing (a stream with events or arriving labels that day has one: :func:`state_rows`),
    those with a row but neither, and otherwise the streams of its stored rows (a value
    changed in one of them)."""
    expected = storage.query(
        con,
        """SELECT DISTINCT stream FROM protected_scores WHERE event_date = $1
           UNION SELECT DISTINCT stream FROM event_labels WHERE date = $1""",
        [d],
    )["stream"].cast(stored.dtype)
    missing = sorted(set(expected.to_list()) - set(stored.to_list()))
    extra = sorted(set(stored.to_list()) - set(expected.to_list()))
    if missing:
        return (f" (no state row for the streams {_names(missing)}, which have events or "
                "labels that day)")  # fmt: skip
    if extra:
        return (f" (a state row for the streams {_names(extra)}, which have no events or "
                "labels that day)")  # fmt: skip
    if stored.len():
        return f" (its stored rows are of the streams {_names(sorted(stored.to_list()))})"
    return ""


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
