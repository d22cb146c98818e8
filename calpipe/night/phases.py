"""The night function: a part of a night (whole streams) in phases, and what each phase holds.

Every runner computes a night through :func:`night_part` and :func:`night_day`: ``calpipe run``
and the dagster ``night`` asset (:mod:`calpipe.pipeline.nightly`, a part = the whole night, or
a part of whole streams on the biggest nights), and ``calpipe spark-run`` (:mod:`calpipe.spark_run`,
a part = one bucket of streams inside the cogroup). :func:`night_part` yields the night in
phases, each ``(phase, context)``; a runner hands each to the table registry
(:data:`calpipe.pipeline.tables.TABLES`), whose tables of that phase compute their rows from
the context with their one row function, and writes them where it writes (DuckDB, Parquet).

========  ===================  =====================================================
phase     context              when
========  ===================  =====================================================
night     :class:`Arrivals`    the night's checked labels, before any event runs
events    :class:`Batch`       a batch's events as read (before the engine when their
                               types are the stored ones, so that a writer stores them
                               while the engine runs; after it otherwise)
batch     :class:`Batch`       the batch once the engine ran (its ``result``)
part      :class:`PartDone`    the part's end-of-night state and its day-level rows
                               (no table's phase: the runner keeps it for the day)
day       :class:`Day`         :func:`night_day`: the night's parts together
========  ===================  =====================================================

A transaction of small days may run as one :class:`Span` (one engine pass over several days,
:func:`calpipe.engine.driver.protect_by_day`); its end is a :class:`Transaction`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl

from calpipe.calibrators import Calibrator
from calpipe.engine import ProtectResult
from calpipe.engine.driver import DaysResult
from calpipe.errors import InputError
from calpipe.night.arrivals import Arrivals
from calpipe.night.chain import Chain, changed_streams, check_outputs, protected_rows, state_rows
from calpipe.night.changes import (
    CHANGE_SCHEMA,
    detect,
    factors,
    freeze,
    labelled_in_rows,
    late_labelled,
    merged_detector,
    with_detector,
)
from calpipe.night.events import check_stream_names, event_schema, protect_columns, source_error
from calpipe.night.monitoring import (
    arrival_rows,
    day_stats,
    labelled_rows,
    night_arrival_stats,
    rows_arrival_stats,
    stream_groups,
)
from calpipe.night.settings import Settings

#: The phases a table's rows are computed at, in the order :func:`night_part` and
#: :func:`night_day` reach them, then ``transaction`` (the end of a runner's transaction of
#: days: :class:`Transaction`).
PHASES = ("night", "events", "batch", "day", "transaction")


@dataclass
class Batch:
    """A batch of whole streams of one night, as its tables' row functions see it.

    ``events``: the batch's events as read from the source (the data contract's names and
    ``event_date``); ``before``: the state of day - 1 of the batch's streams (None on the chain's
    first day); ``result``: the engine's output (None until it ran). The protected rows and the
    stream ids are computed once per batch, on first use."""

    day: dt.date
    cal: Calibrator
    events: pl.DataFrame
    before: pl.DataFrame | None
    result: ProtectResult | None = None
    #: the batch's ``change_points`` rows (:func:`~calpipe.night.changes.detect`), once the
    #: engine ran
    changes: pl.DataFrame | None = None

    @cached_property
    def protected(self) -> pl.DataFrame:
        """The batch's ``protected_scores`` rows (the monitoring reads them too)."""
        return protected_rows(self.cal, self.result.scores, self.day)

    @cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Stream ids of the engine's output rows (= of :attr:`protected`'s, same order): the
        engine's own grouping of them where it gave one (the same ids: both number the streams
        by first appearance)."""
        if self.result is not None and self.result.groups is not None:
            return self.result.groups
        return stream_groups(self.protected, ["stream"])

    @cached_property
    def stats(self) -> pl.DataFrame:
        """The batch's metrics per stream (:func:`~calpipe.night.monitoring.day_stats`):
        ``calibration_daily`` reports them, and ``calibration_arrivals`` on a night whose
        labels all came in its rows."""
        return day_stats(self.protected, self.day, self.groups)


@dataclass
class PartDone:
    """What a part of a night (:func:`night_part`) leaves for the day: its streams' state at the
    end of the night, its ``calibrator_state`` rows (streams that changed), its
    ``calibration_arrivals`` rows and its counts."""

    state: pl.DataFrame
    rows: pl.DataFrame
    arrival_rows: pl.DataFrame
    n_events: int
    n_active: int
    n_labels: int


@dataclass
class Day:
    """A night after all its parts: its ``calibrator_state`` rows (the state of the streams that
    changed, keyed by the day), its ``pipeline_days`` row, the run's ``pipeline_inputs`` rows
    (this day's are written) and the forecasts whose labels arrived that night, as
    ``calibration_arrivals`` rows (the labels themselves are phase ``night``)."""

    day: dt.date
    state: pl.DataFrame
    day_row: dict[str, Any]
    inputs: pl.DataFrame
    #: the ``calibration_arrivals`` rows of the forecasts whose labels the night learnt, computed
    #: part by part (:func:`~calpipe.night.monitoring.arrival_rows`: the forecasts of a
    #: part are freed with it)
    arrival_rows: pl.DataFrame


@dataclass
class Transaction:
    """The days of one transaction of a runner: their ``calibrator_state`` rows."""

    settings: Settings
    states: pl.DataFrame


@dataclass
class Span:
    """The days [start, end] of one transaction run as one span: the events as read (with
    ``event_date``), the engine's output (:class:`calpipe.engine.driver.DaysResult`: the rows, the
    end-of-day state rows), the state before the span (None on the chain's first day), the
    ``pipeline_days`` row of each day, and the run's ``pipeline_inputs`` rows."""

    start: dt.date
    end: dt.date
    cal: Calibrator
    events: pl.DataFrame
    result: DaysResult
    before: pl.DataFrame | None
    day_rows: list[dict[str, Any]]
    inputs: pl.DataFrame
    #: the span's ``change_points`` rows (:func:`span_changes`)
    changes: pl.DataFrame | None = None

    @cached_property
    def protected(self) -> pl.DataFrame:
        """The span's ``protected_scores`` rows (the monitoring reads them too)."""
        return protected_rows(self.cal, self.result.scores, None)

    @cached_property
    def stats(self) -> pl.DataFrame:
        """The span's metrics per day and stream (:func:`~calpipe.night.monitoring.day_stats`):
        ``calibration_daily`` reports them, and ``calibration_arrivals`` (a span's labels all
        came in its rows)."""
        return day_stats(self.protected, None)


def day_inputs(inputs: pl.DataFrame, day: dt.date, to: dt.date | None = None) -> pl.DataFrame:
    """The ``pipeline_inputs`` rows of one day (of the days [day, to] with ``to``) among the
    run's input files ``inputs`` (:func:`calpipe.pipeline.inputs.run_inputs`)."""
    return inputs.filter(pl.col("date").is_between(day, to or day)).sort("date", "kind", "file")


def stream_bucket(streams: pl.Series, k: int) -> np.ndarray:
    """Bucket 0..k-1 (k <= 256) of each stream name: a fixed hash, so a stream always lands in
    one bucket; uint8, so that numpy's stable argsort of the buckets is a radix sort."""
    return (streams.hash(seed=0) % k).cast(pl.UInt8).to_numpy()


def stream_batches(events: pl.DataFrame, batch_rows: int) -> tuple[int, list[np.ndarray] | None]:
    """Split a night's events into k batches of whole streams of about ``batch_rows`` events:
    (k, each batch's row indices in the night's order), or (1, None) for a night that fits in
    one batch. Streams are independent, so running the batches one after the other gives each
    stream exactly its one-pass rows."""
    k = min(-(-events.height // batch_rows), 256)
    if k <= 1:
        return 1, None
    bucket = stream_bucket(events["stream"], k)
    order = np.argsort(bucket, kind="stable")  # keeps each stream's rows in the night's order
    bounds = np.searchsorted(bucket[order], np.arange(k + 1))
    return k, [order[bounds[i] : bounds[i + 1]] for i in range(k)]


def night_part(
    chain: Chain,
    day: dt.date,
    events: pl.DataFrame,
    before: pl.DataFrame | None,
    arrivals: Arrivals | None,
    source: str,
    batch_rows: int,
) -> Iterator[tuple[str, Any]]:
    """Night ``day`` of a part of whole streams, in phases (the module's table): its ``events``
    (the data contract's names plus ``event_date``), its streams' state of the day before
    ``before`` (None on the chain's first day) and its checked label ``arrivals``
    (:class:`Arrivals`; None: none). Yields ``("night", arrivals)``, then per batch of
    about ``batch_rows`` events (:func:`stream_batches`) ``("events", batch)`` and
    ``("batch", batch)``, and last ``("part", PartDone)``. ``source`` names the events' source in
    errors.

    Each batch runs one engine call (:meth:`Chain.protect`, which validates the data contract:
    an :class:`~calpipe.errors.InputError` names the source, stream and event) from its
    streams' state, learning the night's labels: those of the night's events in their rows,
    those of earlier events (:attr:`Arrivals.late`) in their streams' pending updates; its
    outputs are checked (:func:`~calpipe.night.chain.check_outputs`) before the ``batch``
    phase. Memory (``calpipe run``'s nights of several batches): the caller hands ``events``
    over (keeps no reference) and drops each context before asking for the next: a batch is
    then freed before the next one runs."""
    arrivals = arrivals or Arrivals.empty(day)
    check_stream_names(events, source)
    # stored types already (the usual case): a writer stores a batch's events while the engine
    # validates and protects them (an invalid night rolls its transaction back); other types
    # after the engine validated them, so that a bad type gets the contract's message
    stored = event_schema(chain.n_classes != 2)
    early = dict(events.schema) == {**stored, "event_id": events.schema["event_id"]} and (
        events.schema["event_id"] in (pl.Int64, pl.String)
    )
    protect_input = protect_columns(chain.n_classes)
    yield "night", arrivals
    k, batches = stream_batches(events, batch_rows)
    late = arrivals.late
    parts, labelled, stats, streams, n_active = [], [], [], [], 0
    late_bucket = None if k == 1 or not late.height else stream_bucket(late["stream"], k)
    # the labels of earlier events with their forecasts, for the change detector
    late_lab = late_labelled(arrivals.rows, arrivals.forecasts, day) if late.height else None
    lab_bucket = None if late_lab is None or k == 1 else stream_bucket(late_lab["stream"], k)
    for i in range(k):
        rows = events if batches is None else events[batches[i]]
        state, late_i, lab_i = before, late, late_lab
        if k > 1 and before is not None:
            state = before.filter(pl.Series(stream_bucket(before["stream"], k) == i))
            if late_bucket is not None:
                late_i = late.filter(pl.Series(late_bucket == i))
        if lab_bucket is not None:
            lab_i = late_lab.filter(pl.Series(lab_bucket == i))
        batch = Batch(day, chain.cal, rows, state)
        if early:
            yield "events", batch
        try:
            batch.result = chain.protect(rows.select(protect_input), state, arrivals, late_i)
        except InputError as exc:
            raise source_error(exc, source, rows) from None
        check_outputs(batch.result.scores, day)  # before the night's transaction commits
        detect_changes(chain, batch, state, lab_i)
        if not early:
            yield "events", batch
        yield "batch", batch
        parts.append(batch.result.state)
        if arrivals.rows.height:  # judged with the feed's labels, part by part below
            labelled.append(labelled_rows(batch.protected))
        else:  # the night's labels all came in its rows: the daily metrics hold theirs
            stats.append(rows_arrival_stats(batch.protected, batch.stats, batch.groups))
        streams.append(batch.protected["stream"].gather(batch.groups[1]))  # the batch's streams
        n_active += batch.groups[1].shape[0]
        del rows, batch  # free the batch before the next one
    n_events = events.height
    del events, batches  # (handed over: the part's events are freed)
    state = parts[0] if k == 1 else pl.concat(parts).sort("stream")
    changed = state_rows(state, day, changed_streams(pl.concat(streams), arrivals))
    if labelled:
        stats.append(night_arrival_stats(pl.concat(labelled), arrivals))
    arrived = arrival_rows(concat_parts(stats, ["date", "stream"]), changed)
    yield "part", PartDone(state, changed, arrived, n_events, n_active, arrivals.rows.height)


def detect_changes(
    chain: Chain, batch: Batch, state: pl.DataFrame | None, late: pl.DataFrame | None
) -> None:
    """The change detector over a batch once its engine ran (:mod:`calpipe.night.changes`):
    its labels learnt tonight, those of its events and ``late`` (:func:`~calpipe.night.changes.
    late_labelled` of its streams' labels of earlier events), against each stream's reference
    in ``state`` (the state before). Sets ``batch.changes`` and gives the batch's end state the
    detector's columns."""
    lab = labelled_in_rows(batch.result.scores, batch.protected)
    if late is not None and late.height:
        lab = pl.concat([lab, late.cast(dict(lab.schema))])
    rows, after, frozen = detect(factors(lab, state), state, batch.day)
    after = freeze(chain.cal, chain.n_classes, after, frozen, batch.result.state, batch.day)
    batch.changes = rows
    batch.result = ProtectResult(
        batch.result.scores, with_detector(batch.result.state, state, after), batch.result.groups
    )


def span_changes(span: Span, n_classes: int) -> None:
    """The change detector over a span (its labels all came in its rows), day by day as the
    nights one by one run it (a reference frozen on a day is the next day's): sets
    ``span.changes`` and gives the span's state rows (each day's and the end's) the detector's
    columns."""
    res = span.result
    lab = labelled_in_rows(res.scores, span.protected)
    by_day = lab.partition_by("event_date", as_dict=True, include_key=False)
    state_of = res.states.partition_by("date", as_dict=True)
    det = span.before
    found, states = [], []
    for day in res.days:
        day_rows = state_of.get((day,), res.states.clear())
        lab_d = by_day.get((day,), lab.head(0).drop("event_date"))
        rows, after, frozen = detect(factors(lab_d, det), det, day)
        after = freeze(span.cal, n_classes, after, frozen, day_rows, day)
        states.append(with_detector(day_rows, det, after))
        det = merged_detector(det, after)
        found.append(rows)
    span.changes = (
        concat_parts(found, ["detected_date", "stream"])
        if found
        else pl.DataFrame(schema=CHANGE_SCHEMA)
    )
    states_out = pl.concat(states) if states else with_detector(res.states, None, None)
    span.result = dataclasses.replace(
        res, states=states_out, state=with_detector(res.state, det, None)
    )


def night_day(chain: Chain, day: dt.date, parts: list[PartDone], inputs: pl.DataFrame) -> Day:
    """Night ``day`` of its ``parts`` (:func:`night_part`, each of other streams): the chain's
    state becomes theirs, and the night's ``calibrator_state`` and ``calibration_arrivals`` rows
    are theirs together in their sort order (each stream's rows of one pass: streams are
    independent); its ``pipeline_days`` row extends the chain's state hash
    (:meth:`Chain.day_row`). ``inputs``: the run's ``pipeline_inputs`` rows."""
    chain.state = concat_parts([p.state for p in parts], "stream")
    rows = concat_parts([p.rows for p in parts], "stream")
    row = chain.day_row(
        day, sum(p.n_events for p in parts), sum(p.n_active for p in parts), rows,
        sum(p.n_labels for p in parts),
    )  # fmt: skip
    arrived = concat_parts([p.arrival_rows for p in parts], ["date", "stream"])
    return Day(day, rows, row, inputs, arrived)


def concat_parts(frames: list[pl.DataFrame], keys: str | list[str]) -> pl.DataFrame:
    """The rows of a night's parts (each sorted by ``keys``, which are unique: each stream is in
    one part) as one part would have them: sorted by ``keys``. An empty part may lack columns
    (a night without arrivals), so the empty ones are left out."""
    full = [f for f in frames if f.height] or frames[:1]
    return full[0] if len(full) == 1 else pl.concat(full).sort(keys)
