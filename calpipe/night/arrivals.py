"""A night's label arrivals in memory: the labels of the night, their schema, checks and rows.

:class:`Arrivals` holds the labels that landed on a night (those of the night's own events and
those of earlier events) and the ones quarantined (unknown events);
:func:`attach_labels` gives the night's events their labels, :func:`learn_late` adds the labels
of earlier events to the state's pending updates (:func:`calpipe.engine.arrive_labels`), and
:func:`label_rows` / :func:`quarantine_rows` are the rows of ``event_labels`` and
``quarantined_labels``. Reading the label feed and looking its events up in the database is the
pipeline's (:mod:`calpipe.pipeline.labels`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cached_property

import polars as pl

from calpipe.engine import arrive_labels
from calpipe.engine.contract import TIME_US, Rule, check_rules
from calpipe.engine.ordering import duplicated
from calpipe.errors import InputError
from calpipe.night.classes import score_column

#: ``event_labels`` rows (the table's columns, in its order).
_LABEL_SCHEMA = {
    "date": pl.Date,
    "stream": pl.String,
    "event_id": pl.Int64,
    "event_date": pl.Date,
    "event_time": pl.Datetime("us"),
    "score": pl.Float64,
    "label": pl.Int32,
    "label_time": pl.Datetime("us"),
    "file": pl.String,
}

QUARANTINE_SCHEMA = {
    "date": pl.Date,
    "stream": pl.String,
    "event_id": pl.Int64,
    "label": pl.Int32,
    "label_time": pl.Datetime("us"),
    "file": pl.String,
    "reason": pl.String,
}


def label_schema(n_classes: int) -> dict[str, pl.DataType]:
    """:data:`_LABEL_SCHEMA` for forecasts of K classes (the event's ``scores`` vector)."""
    if n_classes == 2:
        return _LABEL_SCHEMA
    return {("scores" if c == "score" else c): (pl.List(pl.Float64) if c == "score" else t)
            for c, t in _LABEL_SCHEMA.items()}  # fmt: skip


@dataclass
class Arrivals:
    """The labels that arrived on one night, checked: ``rows`` (``event_labels`` rows) and the
    labels of unknown events parked by ``on_unknown="quarantine"`` (``quarantined``)."""

    day: dt.date
    rows: pl.DataFrame
    quarantined: pl.DataFrame
    #: the forecasts made at the events of ``rows``, row for row (``__base``, ``__prot``: the
    #: base and protected score, or K-class vectors, of ``protected_scores``); null for the
    #: night's own events (forecast tonight). None when not looked up (stored arrivals).
    forecasts: pl.DataFrame | None = None

    @classmethod
    def empty(cls, day: dt.date, n_classes: int = 2) -> Arrivals:
        return cls(
            day,
            pl.DataFrame(schema=label_schema(n_classes)),
            pl.DataFrame(schema=QUARANTINE_SCHEMA),
        )

    # cached: a night reads them several times, and each is a copy of up to every label (none
    # when every label is of one kind: the usual nights of a feed of labels of earlier days)
    @cached_property
    def same_day(self) -> pl.DataFrame:
        """Labels of the night's own events (they go to their rows)."""
        return self._part(pl.col("event_date") == self.day)

    @cached_property
    def late(self) -> pl.DataFrame:
        """Labels of events of earlier days (they go to their streams' pending updates)."""
        return self._part(pl.col("event_date") < self.day)

    def _part(self, which: pl.Expr) -> pl.DataFrame:
        mask = self.rows.select(which.alias("m"))["m"]
        return self.rows if mask.all() else self.rows.filter(mask)

    def streams(self) -> pl.Series:
        """Streams whose state the labels change (for the night's ``calibrator_state`` rows)."""
        return self.late["stream"].unique()


def with_events(
    raw: pl.DataFrame,
    stored: pl.DataFrame,
    events: pl.DataFrame,
    day: dt.date,
    score: str,
    score_type: pl.DataType,
) -> pl.DataFrame:
    """The night's labels ``raw`` (with their row ``i``) beside what the lookup of their events
    found (``stored``, in the labels' order: :data:`FORECASTS`' comment) or, for a label of none of the stored
    events, the night's own ``events``; in the labels' order (the checks report the first bad
    label of the files). Only the labels the lookup did not find are joined with the night's
    events (none on a night whose labels are all of earlier days)."""
    j = pl.concat([raw, stored], how="horizontal").with_columns(
        pl.col("__y").cast(pl.Int32).alias("label")
    )
    missing = j["event_date"].is_null()
    if events.height == 0 or not missing.any():
        return j
    own = events.select(
        "stream", "event_id",
        pl.lit(day, pl.Date).alias("event_date"),
        pl.col("event_time").cast(pl.Datetime("us")),
        pl.col(score).cast(score_type),
        pl.col("label").cast(pl.Int32).alias("row_label"),
    )  # fmt: skip
    filled = (
        j.filter(missing)
        .drop("event_date", "event_time", score, "row_label")
        .join(own, on=["stream", "event_id"], how="left", maintain_order="left")
        .select(j.columns)
    )
    if filled.height == j.height:
        return filled
    return pl.concat([j.filter(~missing), filled]).sort("i")


def check_label_rules(frame: pl.DataFrame, source: str, day: dt.date, rules: list[Rule]) -> None:
    """InputError of the first broken rule, restated with the label feed (``source``: its
    description), the file, stream and event."""
    try:
        check_rules(frame, rules)
    except InputError as exc:
        r = frame.row(exc.row, named=True)
        name = (
            r["stream"]
            if r["stream"] is None or len(r["stream"]) <= 60
            else r["stream"][:60] + "..."
        )
        raise InputError(
            exc.column, None,
            f"labels {source}, day {day}, file {r['file']}, stream {name!r}, event "
            f"{r['event_id']}: {exc.rule}",
        ) from None  # fmt: skip


#: The forecast columns of the lookup of a night's labels (:attr:`Arrivals.forecasts`: the
#: base and protected forecast made at each label's event). The whole lookup
#: (:func:`checked_arrivals`' ``found``, one row per label in the labels' order) also holds the
#: event stored before the night (``event_date``, ``event_time``, its forecast column,
#: ``row_label``: the label of its scores row) and the label that arrived for it on an earlier
#: night (``prev_label``, ``prev_date``). ``calpipe run`` finds them in DuckDB
#: (:func:`calpipe.pipeline.labels.lookup_arrivals`), ``calpipe spark-run`` by joins with the
#: tables it wrote.
FORECASTS = ("__base", "__prot")


def check_raw_labels(raw: pl.DataFrame, day: dt.date, source: str, n_classes: int) -> pl.DataFrame:
    """The night's labels as read (``stream, event_id, __y, label_time, file``) with their row
    ``i``, once checked on their own: InputError naming the file, stream and event for a null
    field, a label outside the classes 0..K-1, a ``label_time`` not on its arrival ``day``, or
    two labels of one event. ``source``: the label feed's description."""
    raw = raw.with_row_index("i")
    y = pl.col("__y")
    k = n_classes
    classes = [float(c) for c in range(k)]
    check_label_rules(raw, source, day, [
        *[Rule(c, f"null {c}", pl.col(c).is_null()) for c in ("stream", "event_id", "label_time")],
        Rule("label", "null label", y.is_null(), y),
        Rule("label", f"label outside the classes 0..{k - 1} (labels are integers 0..{k - 1})",
             ~y.is_in(classes), y),
        Rule("label_time", f"label_time not on its arrival day {day} (a label lands in the folder "
             "of the day it became known)", pl.col("label_time").cast(pl.Date) != day,
             pl.col("label_time")),
        Rule("event_id", "second label of the same event in the night's labels",
             pl.lit(pl.Series(duplicated(raw, ["stream", "event_id"])))),
    ])  # fmt: skip
    return raw


def checked_arrivals(
    raw: pl.DataFrame,
    found: pl.DataFrame,
    events: pl.DataFrame,
    day: dt.date,
    source: str,
    n_classes: int,
    on_unknown: str = "error",
) -> Arrivals:
    """The night's :class:`Arrivals` of its labels ``raw`` (:func:`check_raw_labels`) and what
    the lookup ``found`` for each (:data:`FORECASTS`' docstring; in ``raw``'s order), against
    the night's own ``events`` (``stream, event_id, event_time``, the forecast, ``label``).

    InputError naming the file, stream, event and rule for a label of an unknown event (unless
    ``on_unknown="quarantine"``: parked in ``quarantined``), a label earlier than its event, a
    second label of an event that has one (in its scores row or from an earlier night), and a
    label that changes a stored one."""
    score, schema = score_column(n_classes), label_schema(n_classes)
    if score not in events.columns:  # a night without events, in the binary form
        events = events.rename({"score": score}).cast({score: schema[score]})
    j = with_events(raw, found, events, day, score, schema[score])
    unknown = pl.col("event_date").is_null()
    quarantined = pl.DataFrame(schema=QUARANTINE_SCHEMA)
    if on_unknown == "quarantine":
        quarantined = j.filter(unknown).select(
            pl.lit(day, pl.Date).alias("date"), "stream", "event_id", "label", "label_time",
            pl.col("file").cast(pl.String),  # (few rows, kept over the transaction's days)
            pl.lit(f"no scored event with this stream and event_id up to {day}")
            .alias("reason"),
        )  # fmt: skip
        j = j.filter(~unknown)
    lab, row, prev = pl.col("label"), pl.col("row_label"), pl.col("prev_label")
    check_label_rules(j, source, day, [
        Rule("event_id", f"label of an unknown event (no scored event with this stream and "
             f"event_id up to {day}; --on-unknown-label quarantine parks such labels)", unknown),
        Rule("label_time", "label earlier than its event", pl.col("label_time") <
             pl.col("event_time"), pl.format("{} < event_time {}", pl.col("label_time"),
                                             pl.col("event_time"))),
        Rule("label", "second label of the same event (its scores row has it)",
             row.is_not_null() & (row == lab), pl.col("event_date")),
        Rule("label", "label that changes a stored one (its scores row has the other label)",
             row.is_not_null() & (row != lab), row),
        Rule("label", "second label of the same event (it arrived on an earlier night)",
             prev.is_not_null() & (prev == lab), pl.col("prev_date")),
        Rule("label", "label that changes a stored one (another label arrived on an earlier "
             "night)", prev.is_not_null() & (prev != lab), pl.format("{} on {}", prev,
                                                                    pl.col("prev_date"))),
    ])  # fmt: skip
    # in the files' order (deterministic: files by name, rows as stored); whoever needs another
    # order sorts the columns it reads (a sort of every column cost 1.8 s of a 10M-label night)
    rows = j.select(pl.lit(day, pl.Date).alias("date"), *list(schema)[1:]).cast(
        {**schema, "event_id": j.schema["event_id"], "file": j.schema["file"]}
    )
    return Arrivals(day, rows, quarantined.sort("file", "stream", "event_id"), j.select(FORECASTS))


def attach_labels(events: pl.DataFrame, arrivals: Arrivals | None) -> pl.DataFrame:
    """The night's events with the labels that arrived for them: ``label`` filled in and a
    ``label_time`` column (null for a label of the scores row: known at its event). ``events``
    unchanged when no label of the night is for them (the engine's faster path)."""
    same = None if arrivals is None else arrivals.same_day
    if same is None or same.height == 0:
        return events
    fed = same.select(
        "stream", "event_id", pl.col("label").alias("__fed"), pl.col("label_time").cast(TIME_US)
    )
    out = events.join(fed, on=["stream", "event_id"], how="left", maintain_order="left")
    return out.with_columns(pl.coalesce("label", "__fed").cast(events.schema["label"])).drop(
        "__fed"
    )


def learn_late(state: pl.DataFrame | None, late: pl.DataFrame | None) -> pl.DataFrame | None:
    """``state`` with ``late`` (:attr:`Arrivals.late` rows of its streams) pending in their
    streams (:func:`calpipe.engine.arrive_labels`): the night's engine call applies each at its
    ``label_time``."""
    if state is None or late is None or late.height == 0:
        return state
    score = "scores" if "scores" in late.columns else "score"
    return arrive_labels(
        state,
        late.select("stream", "event_time", "event_id", score, "label", "label_time"),
        score=score,
    )


def label_rows(arrivals: Arrivals) -> pl.DataFrame:
    """``event_labels`` rows of a night."""
    return arrivals.rows


def quarantine_rows(arrivals: Arrivals) -> pl.DataFrame:
    """``quarantined_labels`` rows of a night."""
    return arrivals.quarantined
