"""Reading a source's events of a day: the data contract's names, each event on its day, and
unique over the stored history.

:func:`read_source` reads the events of a range of days (of a part of the streams) from an
:class:`~calpipe.storage.EventSource` in the data contract's names; :func:`check_history_duplicates`
refuses an event whose (stream, event_id) is stored on another day. The stored event schema and
the table's rows are :mod:`calpipe.night.events`' (:data:`~calpipe.night.events.EVENT_SCHEMA`,
:func:`~calpipe.night.events.stored_events`); :func:`calpipe.pipeline.run_range` validates the
events as it protects them.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from calpipe import storage
from calpipe.errors import InputError
from calpipe.night.classes import split_scores
from calpipe.night.events import EVENT_SCHEMA, check_event_days, source_error
from calpipe.storage import EventSource, PartSpool


def read_source(
    con, source: EventSource, start: dt.date, end: dt.date, part: tuple[int, int] | None = None,
    spool: PartSpool | None = None,
) -> pl.DataFrame:  # fmt: skip
    """The source's events of [start, end] (of the streams of ``part``,
    :func:`calpipe.storage.landing.part_where`; from ``spool``, the range read once by part,
    :meth:`~calpipe.storage.EventSource.spool_range`) in the data contract's names with
    ``event_date``, each checked to lie on its day, but not yet validated nor cast to the
    stored types."""
    raw = source.read_range(con, start, end, part, spool)
    if raw.height == 0:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    days = raw[storage.DAY_COLUMN]
    norm = storage.normalize_events(raw.drop(storage.DAY_COLUMN), source.columns)
    del raw
    try:
        norm, _ = split_scores(norm)
    except InputError as exc:
        raise source_error(
            exc, source.describe(), norm.with_columns(days.alias("event_date"))
        ) from None
    chunk = norm.with_columns(days.alias("event_date"))
    check_event_days(chunk, source.describe(), source.columns.event_time)
    return chunk


#: The first stored event with the key (stream, event_id) of one of the day's events (registered
#: as ``_calpipe_day_keys``) outside the days [$1, $2] that the run is replacing (the day and the
#: run's later days: each of those is checked when it is read, against the days before it).
_DUPLICATE_SQL = """
SELECT k.stream, k.event_id, e.event_date FROM scored_events e
JOIN _calpipe_day_keys k ON e.stream = k.stream AND e.event_id = k.event_id
WHERE e.event_date NOT BETWEEN $1 AND $2 LIMIT 1
"""


def check_history_duplicates(
    con, chunk: pl.DataFrame, day: dt.date, last: dt.date, source: EventSource
) -> None:
    """InputError (day, stream, event, the day it was stored on) for an event whose (stream,
    event_id) is already stored on another day: each event is unique in its stream over the
    whole history, not only within its day (a label re-sent as a new event, a day landed
    twice under two dates). ``last``: the run's last day (days ``day``..``last`` are being
    replaced). One semi-join of the day's keys against ``scored_events``; call it with the
    connection free (no INSERT pending), after :func:`ensure_id_type`."""
    if chunk.height == 0:
        return
    ids = pl.Int64 if chunk.schema["event_id"].is_integer() else pl.String
    keys = chunk.select(pl.col("stream").cast(pl.String), pl.col("event_id").cast(ids))
    con.register("_calpipe_day_keys", keys.to_arrow())
    try:
        row = storage.fetch_one(con, _DUPLICATE_SQL, [day, last])
    finally:
        con.unregister("_calpipe_day_keys")
    if row is not None:
        raise InputError(
            "event_id", None,
            f"{source.describe()}, day {day}, stream {row[0]!r}, event {row[1]}: duplicate of "
            f"the event stored on {row[2]}; each (stream, event_id) must be unique over the "
            "whole history",
        )  # fmt: skip
