"""The label feed: labels that land days after their events (docs/ARCHITECTURE.md §5).

In a deployment the scores of day d land on day d and their labels days or weeks later, in a
feed of their own: a landing folder ``date=YYYY-MM-DD/*.parquet`` (or a Parquet glob, or a
table) of ``stream, event_id, label, label_time``, where the folder's date is the arrival day and
``label_time`` falls on it. Night d

1. reads the labels of arrival day d (:func:`read_arrivals`) and checks them against the events
   (:func:`check_arrivals`): each names an event stored on a day <= d (or of day d itself), is
   its first label, and is not earlier than the event; a bad label is an
   :class:`~calpipe.errors.InputError` naming the file, stream, event and rule, and nothing of
   the night is written (``on_unknown="quarantine"`` parks labels of unknown events in
   ``quarantined_labels`` instead);
2. gives the labels of day d's own events to their rows (:func:`attach_labels`: ``label_time``
   column; an in-row label keeps a null label time, known at its event), and adds the labels of
   earlier events to their streams' pending updates (:func:`calpipe.engine.arrive_labels`, with the
   event's stored base score), so that the night's :func:`calpipe.protect_with_state` call learns
   each label at its ``label_time``;
3. stores them in ``event_labels`` (partitioned by arrival day) with the day's other tables; each
   label file's hash is recorded in ``pipeline_inputs`` (kind ``labels``), so a corrected or late
   label file replays the nights from its day (:mod:`calpipe.pipeline.inputs`).

A chain run this way, night after night, equals one pass ``calpipe.protect(events,
label_time="label_time")`` over every event with its final label and label time (null for labels
in the scores rows) — tested to 1e-12 (``tests/pipeline/test_labels.py``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from calpipe import storage
from calpipe.errors import InputError
from calpipe.night.arrivals import Arrivals, check_raw_labels, checked_arrivals
from calpipe.night.classes import frame_n_classes, score_column
from calpipe.pipeline.classes import stored_n_classes
from calpipe.pipeline.ids import stored_id_type
from calpipe.storage import EventSource, PartSpool
from calpipe.storage.landing import (
    FILE_COLUMN,
    check_files_named,
    parquet_files_sql,
    part_where,
    read_parquet_files,
    stream_sql,
)

#: A night's labels are looked up (their events, earlier labels, forecasts) this many at a time:
#: against a long history DuckDB builds the joins' hash tables on the labels' keys, which it
#: cannot spill (against 10M stored events: 2.1M labels failed at 384 MB, 1M ran at 256 MB and
#: 500k at 128 MB, each at ~0.35 us a label; measured).
LABEL_LOOKUP_ROWS: int = 500_000

#: What to do with a label whose event calpipe does not know: fail the night, or park it.
ON_UNKNOWN = ("error", "quarantine")

_ARRIVAL_SCHEMA = {
    "stream": pl.String,
    "event_id": pl.Int64,
    "label": pl.Int32,
    "label_time": pl.Datetime("us"),
    "file": pl.String,
}


@dataclass(frozen=True)
class LabelColumns:
    """Names of the label feed's columns in a source. ``stream=None``: one stream, ``default``
    (as for the events)."""

    stream: str | None = "stream"
    event_id: str = "event_id"
    label: str = "label"
    label_time: str = "label_time"

    @property
    def day_time(self) -> str:
        """A label's day is its arrival day: the date of its ``label_time``."""
        return self.label_time

    def required(self) -> list[str]:
        names = [self.event_id, self.label, self.label_time]
        return names if self.stream is None else [self.stream, *names]

    def check_file(self, path: Path) -> None:
        """InputError naming the file if its Parquet schema lacks a required column."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except (pa.ArrowException, OSError) as exc:
            raise storage.StoreError(
                f"reading {path}: not a readable Parquet file ({exc})"
            ) from exc
        missing = [c for c in self.required() if c not in names]
        if missing:
            raise InputError(
                missing[0], None, f"labels {path}: missing column (the file has {names})"
            )


def label_source(text: str, columns: LabelColumns | None = None) -> EventSource:
    """The label feed at ``text``: a landing folder with ``date=`` sub-folders, a Parquet
    file/glob, or a table (as :meth:`calpipe.storage.EventSource.parse`)."""
    return EventSource.parse(text, columns or LabelColumns())


def read_arrivals(
    con, source: EventSource, day: dt.date, part: tuple[int, int] | None = None,
    spool: PartSpool | None = None,
) -> pl.DataFrame:  # fmt: skip
    """The labels that arrived on ``day`` (of the streams of ``part``,
    :func:`calpipe.storage.landing.part_where`; from ``spool``, the day read once by part,
    :func:`spool_arrivals`) in the contract's names plus ``file`` (the landing file
    relative to the folder, or the source), not yet checked. Empty if none."""
    cm: LabelColumns = source.columns
    if spool is not None and (part is None or part[1] != spool.k):
        raise ValueError(f"part {part} of labels spooled in {spool.k} parts")
    if source.kind == "landing":
        if spool is not None:
            files = [f for _, f in spool.files]
            raw = check_files_named(spool.read(part[0]), files)
        else:
            files = _arrival_files(source, day)
            if not files:
                return pl.DataFrame(schema=_ARRIVAL_SCHEMA)
            # each label's file as the file's index, then an Enum of the night's few files
            # relative to the folder (10 MB for 10M labels)
            with source.reading():
                raw = read_parquet_files(
                    con, files, part_where(cm.stream, part, storage.DEFAULT_STREAM)
                )
        prefix = len(str(source.location)) + 1
        relative = [str(f)[prefix:] for f in files]
        raw = raw.with_columns(
            pl.col(FILE_COLUMN).replace_strict(
                dict(enumerate(relative)), return_dtype=pl.Enum(relative)
            )
        )
    else:
        raw = source.read_range(con, day, day, part, spool)
        if raw.width == 0:
            return pl.DataFrame(schema=_ARRIVAL_SCHEMA)
        name = pl.lit(source.location, pl.Enum([source.location]))
        raw = raw.drop(storage.DAY_COLUMN).with_columns(name.alias(FILE_COLUMN))
    for c in cm.required():
        if c not in raw.columns:
            raise InputError(
                c, None, f"labels {source.describe()}: missing column (it has {raw.columns})"
            )
    ids = stored_id_type(con)
    # (no labels, no ids to compare: a night's first part without events has not set the type
    # of a new database yet)
    if raw.height and raw.schema[cm.event_id].is_integer() != (ids == pl.Int64):
        raise InputError(
            cm.event_id, None,
            f"labels {source.describe()}: event ids are {raw.schema[cm.event_id]}, but this "
            f"database stores {'integer' if ids == pl.Int64 else 'string'} event ids",
        )  # fmt: skip

    if not raw.schema[cm.label_time].is_temporal():
        where = _typed_file(source, day, cm.label_time, _temporal)
        raise InputError(cm.label_time, None, f"labels {where}: label_time must be a "
                         f"Date or Datetime (got {raw.schema[cm.label_time]})")  # fmt: skip
    lab = raw.schema[cm.label]
    if not _numeric(lab):
        where = _typed_file(source, day, cm.label, _numeric)
        raise InputError(cm.label, None, f"labels {where}: labels must be 0/1 "
                         f"(got {lab})")  # fmt: skip
    stream = pl.col(cm.stream).cast(pl.String) if cm.stream else pl.lit(storage.DEFAULT_STREAM)
    return raw.select(
        stream.alias("stream"),
        pl.col(cm.event_id).cast(ids).alias("event_id"),
        pl.col(cm.label).cast(pl.Float64).alias("__y"),
        pl.col(cm.label_time).cast(pl.Datetime("us")).alias("label_time"),
        pl.col(FILE_COLUMN).alias("file"),
    )


def _arrival_files(source: EventSource, day: dt.date) -> list[Path]:
    """The landing folder's files of ``day`` (none without its folder), each checked for the
    feed's columns."""
    root = Path(source.location)
    if not root.is_dir():
        raise storage.StoreError(f"labels landing folder {root} does not exist")
    sub = root / f"date={day.isoformat()}"
    files = storage.day_files(sub) if sub.is_dir() else []
    for f in files:
        source.columns.check_file(f)
    return files


def spool_arrivals(
    con, source: EventSource, day: dt.date, k: int, directory: Path
) -> PartSpool | None:
    """The labels that arrived on ``day`` read once and split into ``k`` parts
    (:class:`calpipe.storage.PartSpool` in ``directory``), for :func:`read_arrivals` to read
    part by part; None if there are none. Close it when done."""
    if source.kind != "landing":
        return source.spool_range(con, day, day, k, directory)
    files = _arrival_files(source, day)
    if not files:
        return None
    stream = stream_sql(source.columns.stream, storage.DEFAULT_STREAM)
    with source.reading():
        return PartSpool.create(
            con, parquet_files_sql(files), stream, k, directory, files=[(day, f) for f in files]
        )


def _numeric(t) -> bool:
    return t.is_integer() or t.is_float() or t == pl.Boolean


def _temporal(t) -> bool:
    return t.is_temporal()


def _typed_file(source: EventSource, day: dt.date, column: str, ok) -> str:
    """Where a label-feed column of the wrong type comes from: for a landing folder the first
    file of ``day`` whose ``column`` is not ``ok`` (read from its Parquet schema, no rows), else
    the source."""
    if source.kind == "landing":
        for f in storage.day_files(Path(source.location) / f"date={day.isoformat()}"):
            schema = pl.read_parquet_schema(f)
            if column in schema and not ok(schema[column]):
                return f"file {f} ({source.describe()}, day {day})"
    return f"{source.describe()}, day {day}"


#: For the night's labels (registered as ``_calpipe_label_keys``, with their row ``i``): the
#: event stored on a day before $1 (the night), a label that arrived on a night before it, and
#: the forecast made at the event (``protected_scores``: the night's arrival monitoring judges
#: it, :func:`calpipe.night.monitoring.night_arrival_stats`). The days from $1 on are being
#: replaced by this run (each checked as it is read). At most one row per label: an event and
#: its label are unique over the history.
_LOOKUP_SQL = """
SELECT k.i, e.event_date, e.event_time, e.{score}, e.label AS row_label,
       l.label AS prev_label, l.date AS prev_date,
       p.base_score{s} AS __base, p.protected_score{s} AS __prot
FROM _calpipe_label_keys k
LEFT JOIN scored_events e
  ON e.stream = k.stream AND e.event_id = k.event_id AND e.event_date < $1
LEFT JOIN event_labels l
  ON l.stream = k.stream AND l.event_id = k.event_id AND l.date < $1
LEFT JOIN protected_scores p
  ON p.stream = k.stream AND p.event_id = k.event_id AND p.event_date < $1
"""

#: :data:`_LOOKUP_SQL` for integer event ids, joined on the id alone: hashing the stream names
#: of every stored row the joins probe was a third of the lookup (a 10M + 10M-label night in 5
#: parts: 6.3 -> 4.5-4.8 CPU-s). ``__ok``: every row found is of the label's stream. When each
#: label finds one row and every ``__ok`` holds, the rows are :data:`_LOOKUP_SQL`'s (a stored
#: row of the label's (stream, id) would have been found by its id); an id that two streams
#: share makes more rows or a false ``__ok``, and then the slice is looked up by
#: :data:`_LOOKUP_SQL`. (A projection, not a join condition: DuckDB does not hash the streams.)
_LOOKUP_BY_ID_SQL = """
SELECT k.i, e.event_date, e.event_time, e.{score}, e.label AS row_label,
       l.label AS prev_label, l.date AS prev_date,
       p.base_score{s} AS __base, p.protected_score{s} AS __prot,
       coalesce(e.stream = k.stream, true) AND coalesce(l.stream = k.stream, true)
         AND coalesce(p.stream = k.stream, true) AS __ok
FROM _calpipe_label_keys k
LEFT JOIN scored_events e ON e.event_id = k.event_id AND e.event_date < $1
LEFT JOIN event_labels l ON l.event_id = k.event_id AND l.date < $1
LEFT JOIN protected_scores p ON p.event_id = k.event_id AND p.event_date < $1
"""


def check_arrivals(
    con,
    raw: pl.DataFrame,
    day: dt.date,
    events: pl.DataFrame,
    source: EventSource,
    *,
    on_unknown: str = "error",
) -> Arrivals:
    """The night's labels ``raw`` (:func:`read_arrivals`) checked against the events: the day's
    own ``events`` (``stream, event_id, event_time, score, label``) and those stored in
    ``scored_events`` before ``day``, and against the labels stored before ``day``.

    Raises InputError naming the file, stream, event and the rule for: a null field, a label
    outside the classes (0..K-1), a ``label_time`` not on its arrival day, two labels of one event, a label of
    an unknown event (unless ``on_unknown="quarantine"``), a label earlier than its event, a
    second label of an event that has one (in its scores row or from an earlier night), and a
    label that changes a stored one. Call it with the connection free (no INSERT pending)."""
    if on_unknown not in ON_UNKNOWN:
        raise ValueError(f"on_unknown must be one of {ON_UNKNOWN}, got {on_unknown!r}")
    k = frame_n_classes(events) if events.height else (stored_n_classes(con) or 2)
    if raw.height == 0:
        return Arrivals.empty(day, k)
    raw = check_raw_labels(raw, day, source.describe(), k)
    found = lookup_arrivals(con, raw, day, k)
    return checked_arrivals(raw, found, events, day, source.describe(), k, on_unknown)


def lookup_arrivals(con, raw: pl.DataFrame, day: dt.date, k: int) -> pl.DataFrame:
    """What :data:`_LOOKUP_SQL` finds for the night's labels ``raw``, one row per label in the
    labels' order (without ``i``).

    The labels are looked up :data:`LABEL_LOOKUP_ROWS` at a time (the joins'
    hash tables on their keys must fit DuckDB's pool). The lookup has at most one row per
    label (an event and its label are unique over the history), so its rows are put in the
    labels' order by ``i``, a gather by the inverse permutation, not a join; column by column,
    each freed once placed (the frame and its copy together were 1 GB of a 10M-label night's
    peak).

    Integer ids are looked up in id order: each slice then spans a narrow range of ids, and
    DuckDB's join filter (the build side's min and max id) skips the stored row groups outside
    it wherever ids grow with time (a sequence, a timestamp-based id), as they are stored in
    event time order. A feed in arrival order (ids at random) took twice as long per slice
    (BENCHMARKS.md §12). String ids keep the feed's order (sorting 2M UUIDs took 1.2 s)."""
    form = {"score": score_column(k), "s": "" if k == 2 else "s"}
    exact, by_id = _LOOKUP_SQL.format(**form), _LOOKUP_BY_ID_SQL.format(**form)
    keys, found = raw.select("i", "stream", "event_id"), []
    integer = keys.schema["event_id"].is_integer()
    if integer:
        keys = keys.sort("event_id")
    for start in range(0, max(raw.height, 1), LABEL_LOOKUP_ROWS):  # (a query if none)
        some = keys.slice(start, LABEL_LOOKUP_ROWS)
        con.register("_calpipe_label_keys", some.to_arrow())
        try:
            rows = storage.query(con, by_id, [day]) if integer else None
            if rows is not None and rows.height == some.height and rows["__ok"].all():
                found.append(rows.drop("__ok"))
            else:  # (string ids; or an id that two streams share)
                found.append(storage.query(con, exact, [day]))
        finally:
            con.unregister("_calpipe_label_keys")
    stored = pl.concat(found) if len(found) > 1 else found[0]
    del keys, found
    if stored.height != raw.height:  # the history's checks keep events and labels unique
        raise storage.StoreError(
            f"labels of {day}: the lookup of their events found {stored.height} rows for "
            f"{raw.height} labels (the database holds an event or a label twice)"
        )
    at = np.empty(raw.height, dtype=np.int64)  # one row per label: the inverse permutation of i
    at[stored["i"].cast(pl.Int64).to_numpy()] = np.arange(raw.height, dtype=np.int64)
    columns, at = stored.drop("i").get_columns(), pl.Series(at)
    del stored
    placed = []
    while columns:  # (a gather across DuckDB's ~80 result chunks took twice the rechunk + gather)
        c = columns.pop(0)
        nulls = c.null_count() == c.len()  # e.g. no label stored before: nothing to place
        placed.append(pl.Series(c.name, dtype=c.dtype).extend_constant(None, c.len()) if nulls
                      else c.rechunk().gather(at))  # fmt: skip
    return pl.DataFrame(placed)


def night_arrivals(
    con,
    labels: EventSource | None,
    day: dt.date,
    events: pl.DataFrame,
    on_unknown: str = "error",
    part: tuple[int, int] | None = None,
    spool: PartSpool | None = None,
) -> Arrivals:
    """The labels of the feed ``labels`` that arrived on ``day`` (of the streams of ``part``,
    whose events are ``events``; from ``spool``: :func:`spool_arrivals`), checked
    (:func:`read_arrivals`, :func:`check_arrivals`); none without a feed."""
    if labels is None:
        return Arrivals.empty(day)
    raw = read_arrivals(con, labels, day, part, spool)
    return check_arrivals(con, raw, day, events, labels, on_unknown=on_unknown)
