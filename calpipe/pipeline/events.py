"""Stage ``scored_events``: read a source's events of a day, check the data contract, store them.

Owns the stored event schema (:data:`EVENT_SCHEMA`), the columns and replay keys the engine
reads (:data:`PROTECT_INPUT`, :data:`STREAM_KEYS`, :data:`REPLAY_ORDER`), and how a bad source row is named
in an error (day, stream, event). :func:`stored_events` is the table's rows in both paths: the
stage (:func:`load_events`) and the fused run (``calpipe/pipeline/tables.py``).
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from calpipe import storage
from calpipe.engine.contract import replay_order, resolve_columns, validate_frame
from calpipe.errors import InputError
from calpipe.night.arrivals import Arrivals, label_rows, quarantine_rows
from calpipe.night.classes import frame_n_classes, split_scores
from calpipe.night.events import (
    EVENT_SCHEMA,
    REPLAY_ORDER,
    STREAM_KEYS,
    check_stream_names,
    source_error,
    stored_events,
)
from calpipe.night.settings import as_date
from calpipe.pipeline.classes import ensure_n_classes
from calpipe.pipeline.ids import ensure_id_type
from calpipe.pipeline.inputs import day_inputs, run_inputs
from calpipe.pipeline.labels import night_arrivals
from calpipe.pipeline.settings import StageResult
from calpipe.pipeline.transactions import write_days
from calpipe.storage import EventSource


def read_source(
    con, source: EventSource, start: dt.date, end: dt.date, part: tuple[int, int] | None = None
) -> pl.DataFrame:
    """The source's events of [start, end] (of the streams of ``part``,
    :func:`calpipe.storage.landing.part_where`) in the data contract's names with ``event_date``, each
    checked to lie on its day, but not yet validated nor cast to the stored types."""
    raw = source.read_range(con, start, end, part)
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
    bad = chunk.filter(pl.col("event_time").cast(pl.Date) != pl.col("event_date"))
    if bad.height:
        r = bad.row(0, named=True)
        raise InputError(
            source.columns.event_time, None,
            f"{source.describe()}, day {r['event_date']}: event {r['event_id']} of stream "
            f"{r['stream']!r} has event_time {r['event_time']}, outside its day",
        )  # fmt: skip
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


def read_source_days(con, source: EventSource, start: dt.date, end: dt.date) -> pl.DataFrame:
    """Validated scored events of [start, end] from ``source`` (the rows ``load_events`` stores).

    Checks the data contract (docs/ARCHITECTURE.md §3, via :func:`calpipe.engine.contract.validate_frame` and
    :func:`calpipe.engine.contract.replay_order`: scores in [0, 1] (K-class vectors summing to 1,
    :mod:`calpipe.pipeline.classes`), integer labels in {0, 1} (0..K-1), unique
    (stream, event_id), ...) and that each landing file's events fall on its folder's date.
    Raises :class:`calpipe.errors.InputError` naming the day, stream and event of the first
    offending row.
    """
    chunk = read_source(con, source, start, end)
    if chunk.height:
        multi = "scores" in chunk.columns
        cols = resolve_columns(
            chunk.columns, score=None if multi else "score", scores="scores" if multi else None,
            label="label", label_time=None,
            by=STREAM_KEYS, order_by=REPLAY_ORDER,
        )  # fmt: skip
        check_stream_names(chunk, source.describe())
        try:
            validate_frame(chunk, cols, check_duplicates=False)
            # "(stream, event_id) unique" as calpipe.protect checks it: in an event log (time
            # order) strictly increasing ids prove it in one pass, where hashing every key
            # costs ~250 bytes a row
            replay_order(chunk, cols)
        except InputError as exc:
            raise source_error(exc, source.describe(), chunk) from None
    return stored_events(chunk)


def load_events(
    con,
    source: EventSource,
    start: dt.date,
    end: dt.date,
    labels: EventSource | None = None,
    *,
    on_unknown_label: str = "error",
) -> StageResult:
    """Stage ``scored_events`` + ``event_labels``: validate the source's events of [start, end]
    and the labels of the feed ``labels`` that arrived on those days, and store them.

    A bad event fails the stage with a clear message and writes nothing for its chunk; a day
    without events stores an empty partition (and is still a day of the chain). The result's
    ``notes`` lists the days without events (a late landing shows up there).

    Days are read, validated and written one at a time, in transactions of whole days
    (:func:`write_days`): memory is bounded by a day. Each day's ``pipeline_inputs`` rows (what
    it was read from, :mod:`calpipe.pipeline.inputs`) are written in the same transaction. Rows are stored in the source's order,
    which is deterministic (re-running a day from the same files writes identical rows).
    """
    start, end = as_date(start), as_date(end)
    res = StageResult(start, end)
    inputs = run_inputs(con, source, labels, start, end)
    arrivals: dict[dt.date, Arrivals] = {}

    def write(writer: storage.PartitionWriter, d: dt.date, rows: pl.DataFrame) -> None:
        if rows.height == 0:
            res.notes.append(d.isoformat())
        night = arrivals.pop(d)
        writer.insert("scored_events", rows, sort=False)
        writer.insert("event_labels", label_rows(night))
        writer.insert("quarantined_labels", quarantine_rows(night))
        writer.insert("pipeline_inputs", day_inputs(inputs, d))

    tables = ["scored_events", "event_labels", "quarantined_labels", "pipeline_inputs"]

    def read(d: dt.date) -> pl.DataFrame:
        rows = read_source_days(con, source, d, d)
        if rows.height:
            ensure_id_type(con, rows.schema["event_id"], source)
            ensure_n_classes(con, frame_n_classes(rows), source, d)
        check_history_duplicates(con, rows, d, end, source)
        arrivals[d] = night_arrivals(con, labels, d, rows, on_unknown_label)
        return rows

    rows = write_days(con, start, end, tables, read, write)
    res.rows = {t: rows[t] for t in tables[:3]}
    return res
