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
from calpipe.errors import InputError

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
    """The night's labels ``raw`` (with their row ``i``) beside what :data:`_LOOKUP_SQL` found
    (``stored``, :func:`_lookup`: in the labels' order) or, for a label of none of the stored
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
