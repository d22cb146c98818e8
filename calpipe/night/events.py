"""A night's events in memory: the stored event schema, the engine's input columns, the checks.

Owns the stored types of ``scored_events`` (:data:`EVENT_SCHEMA`, :func:`event_schema`), the
columns and replay keys the engine reads (:data:`PROTECT_INPUT`, :data:`STREAM_KEYS`,
:data:`REPLAY_ORDER`), how a bad row is named (:func:`source_error`: source, day, stream,
event), the stream name check and the table's rows (:func:`stored_events`). Reading a source
is the pipeline's (:mod:`calpipe.pipeline.events`).
"""

from __future__ import annotations

import polars as pl

from calpipe import config
from calpipe.engine.contract import Rule, check_rules
from calpipe.errors import InputError
from calpipe.night.classes import score_column

EVENT_SCHEMA = {
    "event_date": pl.Date,
    "stream": pl.String,
    "event_id": pl.Int64,
    "event_time": pl.Datetime("us"),
    "score": pl.Float64,
    "label": pl.Int32,
}

#: The columns calpipe.protect reads, in both paths (stored events, or fresh from the source),
#: binary; :func:`protect_columns` for K classes.
PROTECT_INPUT = ("stream", "event_id", "event_time", "score", "label")

#: Streams and replay order of the stored events (the data contract's default names).
STREAM_KEYS = ("stream",)
REPLAY_ORDER = ("event_time", "event_id")


def protect_columns(n_classes: int) -> tuple[str, ...]:
    """:data:`PROTECT_INPUT` with the forecast column of K classes (``score`` or ``scores``)."""
    col = score_column(n_classes)
    return tuple(col if c == "score" else c for c in PROTECT_INPUT)


def event_schema(multiclass: bool) -> dict[str, pl.DataType]:
    """The stored types of a night's events (K classes: ``scores`` in place of ``score``)."""
    if not multiclass:
        return EVENT_SCHEMA
    return {("scores" if c == "score" else c): (pl.List(pl.Float64) if c == "score" else t)
            for c, t in EVENT_SCHEMA.items()}  # fmt: skip


def source_error(exc: InputError, source: str, chunk: pl.DataFrame) -> InputError:
    """``exc`` (raised on ``chunk``'s rows) restated with the source (its description), day,
    stream and event."""
    if exc.row is None:
        return InputError(exc.column, None, f"{source}: {exc.rule}")
    r = chunk.row(exc.row, named=True)
    name = r["stream"] if len(r["stream"]) <= 60 else r["stream"][:60] + "..."
    return InputError(
        exc.column, None,
        f"{source}, day {r['event_date']}, stream {name!r}, event "
        f"{r['event_id']}: {exc.rule}",
    )  # fmt: skip


def check_stream_names(chunk: pl.DataFrame, source: str) -> None:
    """InputError (day, stream cut short, event) for a stream name longer than
    :data:`calpipe.config.MAX_STREAM_NAME_BYTES`: both pipeline paths call it before anything of
    the day is written."""
    long = pl.col("stream").str.len_bytes()
    rule = Rule("stream", f"stream name longer than {config.MAX_STREAM_NAME_BYTES} bytes",
                long > config.MAX_STREAM_NAME_BYTES, long)  # fmt: skip
    try:
        check_rules(chunk, [rule])
    except InputError as exc:
        raise source_error(exc, source, chunk) from None


def check_event_days(chunk: pl.DataFrame, source: str, column: str = "event_time") -> None:
    """InputError naming the day, stream and event of the first event whose ``event_time`` is
    not on its ``event_date`` (the day of its landing folder); ``source``: the source's
    description, ``column``: its name of the event time. Both runners call it."""
    bad = chunk.filter(pl.col("event_time").cast(pl.Date) != pl.col("event_date"))
    if bad.height:
        r = bad.row(0, named=True)
        raise InputError(
            column, None,
            f"{source}, day {r['event_date']}: event {r['event_id']} of stream "
            f"{r['stream']!r} has event_time {r['event_time']}, outside its day",
        )  # fmt: skip


def stored_events(chunk: pl.DataFrame) -> pl.DataFrame:
    """``scored_events`` rows: the contract's columns cast to the stored types (string ids stay
    strings: :func:`ensure_id_type` made the database's id columns VARCHAR)."""
    ids = pl.Int64 if chunk.schema["event_id"].is_integer() else pl.String
    types = {**event_schema("scores" in chunk.columns), "event_id": ids}
    return chunk.select([pl.col(c).cast(t) for c, t in types.items()])
