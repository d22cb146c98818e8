"""The nightly run without a daemon (``calpipe run``): every table of a day in one pass from memory.

:func:`run_range` reads a day from the source once, protects it in batches of whole streams, and
writes the rows of every table of the registry (``calpipe/pipeline/tables.py``) with its
writer, in transactions of whole days (``calpipe/pipeline/transactions.py``); then it runs the
data checks. The dagster ``night`` asset runs it too, over its partitions.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb
import numpy as np
import polars as pl

from calpipe import storage
from calpipe.engine.driver import protect_by_day
from calpipe.errors import CalpipeError, StateError
from calpipe.night.arrivals import Arrivals
from calpipe.night.chain import Chain, check_outputs, state_digests
from calpipe.night.changes import engine_state
from calpipe.night.classes import frame_n_classes, score_column
from calpipe.night.events import (
    REPLAY_ORDER,
    STREAM_KEYS,
    check_stream_names,
    event_schema,
    protect_columns,
)
from calpipe.night.phases import Span, Transaction, night_day, night_part, span_changes
from calpipe.night.settings import Settings, as_date
from calpipe.pipeline import transactions
from calpipe.pipeline.chain import chain_first_day, state_before, state_hash_before
from calpipe.pipeline.checks import CheckOutcome, data_checks, missing_rows
from calpipe.pipeline.classes import ensure_n_classes, stored_n_classes
from calpipe.pipeline.events import check_history_duplicates, read_source
from calpipe.pipeline.ids import ensure_id_type
from calpipe.pipeline.inputs import (
    LABELS,
    SCORES,
    ReplayRequired,
    check_removed_inputs,
    replay_start,
    run_inputs,
)
from calpipe.pipeline.labels import night_arrivals, spool_arrivals
from calpipe.pipeline.tables import TABLES, write_phase
from calpipe.storage import EventSource, PartSpool
from calpipe.storage.landing import stream_part

#: The nightly run protects a day in batches of whole streams of about this many events (streams
#: are independent): memory is then bounded by a batch plus the day's events, not by the day's
#: working set, and the engine's per-row costs stay those of a cache-friendly frame. 1.6M, not
#: 2M: a 10M-event night's peak 1,305-1,347 -> 1,129-1,163 MiB (4.1-4.3x -> 3.6-3.7x its Arrow
#: size) at the same speed (composite-jumper 7.2-7.5 s, the default 11.0 s), a 10M + 10M-label
#: night's ~1,750 -> ~1,370 MiB at +0.6-0.8 s (more parts, more history lookups; BENCHMARKS.md
#: §29).
PROTECT_BATCH_ROWS: int = 1_600_000


#: The nightly run reads, checks and protects a night of more scores or more labels than this
#: in parts of whole streams of about this many of each (each part's rows chosen by DuckDB as it
#: reads the files: calpipe.storage.landing.part_where), so memory is bounded by a part, not by the
#: night: a protect batch of events and as many labels.
NIGHT_PART_ROWS: int = PROTECT_BATCH_ROWS


@dataclass
class RunSummary:
    """What :func:`run_range` did."""

    start: dt.date | None
    end: dt.date | None
    days: int
    events: int
    checks: list[CheckOutcome] = field(default_factory=list)
    #: rows written per table (every table of :data:`TABLES`)
    rows: dict[str, int] = field(default_factory=dict)
    #: the days of the run without events (a late landing shows up here)
    empty_days: list[dt.date] = field(default_factory=list)
    #: the settings' fingerprint for the database's number of classes
    fingerprint: str | None = None


def _date_range(con, source: EventSource, labels: EventSource | None):
    """First and last day of the scored events and the label feed together (a night with labels
    and no events is a night too). None if neither has any."""
    rngs = [r for r in (source.date_range(con), labels and labels.date_range(con)) if r]
    if not rngs:
        return None
    return min(r[0] for r in rngs), max(r[1] for r in rngs)


def default_range(
    con, source: EventSource, labels: EventSource | None = None
) -> tuple[dt.date, dt.date] | None:
    """The nightly default: from the day after the last day stored (or the source's first day)
    to the source's (or the label feed's) last day. None if there is nothing to run."""
    rng = _date_range(con, source, labels)
    if rng is None:
        return None
    row = storage.fetch_one(con, "SELECT max(date) FROM pipeline_days")
    start = rng[0] if row is None or row[0] is None else row[0] + dt.timedelta(days=1)
    return (start, rng[1]) if start <= rng[1] else None


def data_span(con, source: EventSource | None, labels: EventSource | None = None):
    """The days a database and its sources span, ``(first, last)``, or None when there is no
    day: from the stored chain's first day (else the first landed day) through the last day
    stored or landed (scores or labels). What the dagster code location's partitions cover
    (not the calendar, not a value frozen when the chain started). ``con`` is None for a
    database that does not exist yet (``source`` and ``labels`` are then read on a connection
    of their own); ``source`` None when there is none to read."""
    stored = None
    if con is not None:
        stored = storage.fetch_one(con, "SELECT min(first_day), max(date) FROM pipeline_days")
    if source is None:
        landed = None
    elif con is None:
        with duckdb.connect() as mem:
            storage.configure_session(mem)
            landed = _date_range(mem, source, labels)
    else:
        landed = _date_range(con, source, labels)
    if stored is not None and stored[0] is None:  # a database without a day yet
        stored = None
    spans = [r for r in (stored, landed) if r is not None]
    if not spans:
        return None
    return (stored or landed)[0], max(r[1] for r in spans)


def _read_day(
    con, source: EventSource, d: dt.date, last: dt.date, chain: Chain, to: dt.date | None = None,
    part: tuple[int, int] | None = None, settled: bool = False, spool: PartSpool | None = None,
) -> pl.DataFrame | None:  # fmt: skip
    """Day ``d``'s events (the days [d, to] with ``to``; of the streams of ``part``,
    :func:`parts_of_night`, from ``spool`` if the day was read once by part) from the source,
    checked unique against
    the stored history outside [d, last] (the writer has no INSERT pending when a day is read:
    the connection is free), their number of classes the database's (the first events of a new
    database set it, and the chain's).

    ``settled``: a read that consults nothing stored (``con`` need not be the database's: a
    database without stored events, whose id type and classes the chain already holds, as
    :meth:`_Nights._parts` reads a new database's night ahead): no history check, and None
    when the events' id type or classes are not the chain's, for the caller to read them
    again through the database (which raises the usual error)."""
    chunk = read_source(con, source, d, to or d, part, spool)
    check_part(chunk["stream"], part, f"{source.describe()}, day {d}")
    if settled:
        kind = pl.Int64 if chunk.schema["event_id"].is_integer() else pl.String
        # (the chain's id type is None until a part with events set it)
        if not chunk.height or kind != chain.id_type or frame_n_classes(chunk) != chain.n_classes:
            return None  # (an empty part too: the run's connection gives it the chain's form)
        return chunk
    if chunk.height:
        # the database's id type is settled by the first day with events (one catalog query a
        # day cost ~1.6 ms behind the writer's pending INSERT: a second of the demo's 892 days)
        ids = chunk.schema["event_id"]
        kind = pl.Int64 if ids.is_integer() else pl.String
        if chain.id_type != kind:
            chain.id_type = ensure_id_type(con, ids, source)
        k = frame_n_classes(chunk)
        if k != chain.n_classes:
            ensure_n_classes(con, k, source, d)
            chain.use_classes(k)
    elif chain.n_classes != 2:  # a day without events, in the chain's form
        chunk = pl.DataFrame(schema=event_schema(chain.n_classes != 2))
    check_history_duplicates(con, chunk, d, last, source)
    return chunk


def _check_label_feed(con, labels: EventSource | None) -> None:
    """StateError if the stored days were computed with a label feed and this run has none:
    recomputing them without it would drop their labels."""
    if labels is not None:
        return
    row = storage.fetch_one(con, "SELECT min(date) FROM pipeline_inputs WHERE kind = ?", [LABELS])
    if row is not None and row[0] is not None:
        feed = storage.get_meta(con, "labels") or "its label feed"
        raise StateError(
            f"the stored days from {row[0]} on were computed with the label feed {feed}; "
            f"run with it (--labels {feed}): without it they would lose their labels"
        )


def _replay_range(
    con, source: EventSource, labels: EventSource | None, end: dt.date | None,
    replay_deleted: bool = False, log: Callable[[str], None] | None = None,
):  # fmt: skip
    """((first day to recompute, last day), why, the sources' inputs over them) if a stored day
    changed since it ran (:func:`calpipe.pipeline.inputs.replay_start`), else None."""
    first = chain_first_day(con)
    row = storage.fetch_one(con, "SELECT max(date) FROM pipeline_days")
    if first is None or row is None or row[0] is None:
        return None
    rng = _date_range(con, source, labels)
    # through the sources' last day, and at least the stored days (a removed last day is
    # recomputed empty)
    last = max(row[0], rng[1]) if rng is not None else row[0]
    last = end or last
    current = run_inputs(con, source, labels, first, last)
    found = replay_start(con, source, first, current, replay_deleted=replay_deleted, log=log)
    if found is None:
        return None
    return (found[0], last), found[1], current


def pending_range(
    con, source: EventSource, labels: EventSource | None = None
) -> tuple[dt.date, dt.date, str] | None:
    """What a ``calpipe run`` without ``--start`` would compute now: ``(first day, last day,
    why)`` (stored days whose inputs changed or that are stale, else the days landed after the
    last stored one), or None when the database is up to date with its sources. Read only:
    the landing sensor of the code location asks it on every tick."""
    found = _replay_range(con, source, labels, None)
    if found is not None:
        (start, end), why, _ = found
        return start, end, why
    rng = default_range(con, source, labels)
    if rng is None:
        return None
    return rng[0], rng[1], "new days landed"


def parts_of_night(inputs: pl.DataFrame, d: dt.date) -> int:
    """How many parts of whole streams night ``d`` is read, checked and protected in: one for a
    night of at most :data:`NIGHT_PART_ROWS` scores and as many labels (their
    files' row counts, ``inputs``), else about that many of each a part (at most 256). Streams
    are independent, so the parts one after the other write each stream's one-part rows;
    memory is that of a part (:func:`calpipe.storage.landing.part_where`)."""
    n = max(recorded_rows(inputs, d, SCORES) or 0, recorded_rows(inputs, d, LABELS) or 0)
    return 1 if n <= NIGHT_PART_ROWS else min(-(-n // NIGHT_PART_ROWS), 256)


def recorded_rows(inputs: pl.DataFrame, d: dt.date, kind: str) -> int | None:
    """Rows of day ``d``'s files of ``kind`` (scores or labels) as :func:`run_inputs` counted
    them; None if a count is missing (a file recorded without one)."""
    rows = inputs.filter((pl.col("date") == d) & (pl.col("kind") == kind))["n_rows"]
    return None if rows.null_count() else int(rows.sum() or 0)


def check_part(streams: pl.Series, part: tuple[int, int] | None, what: str) -> None:
    """StateError if a row read for ``part`` is of a stream of another part: DuckDB chose the
    rows by the hash of the stream name as it reads it, the pipeline splits the state by the
    name polars made of it (a stream column of a type whose text differs between the two). A
    stream in two parts would run twice from one state: refused, never computed."""
    if part is None or streams.len() == 0:
        return
    names = streams.unique()
    wrong = stream_part(names, part[1]) != part[0]
    if wrong.any():
        name = names.filter(pl.Series(wrong))[0]
        raise StateError(
            f"{what}: stream {name!r} was read as part {part[0]} of {part[1]} but its name is of "
            "another part (its column's text differs between DuckDB and polars: land the "
            "stream column as a string)"
        )


@dataclass
class _DayEvents:
    """A day's events as :func:`_read_day` read them and its labels as
    :func:`~calpipe.pipeline.labels.night_arrivals` checked them (a night of ``parts`` > 1
    parts is read part by part as it runs: then neither), handed over to :func:`_run_day` by
    :meth:`take`: the only reference is then the engine's, which frees the events after the
    last batch (480 MB of a 10M-event night's arrival monitoring)."""

    frame: pl.DataFrame | None
    height: int
    arrivals: Arrivals | None = None
    parts: int = 1

    def take(self) -> tuple[pl.DataFrame, Arrivals | None]:
        taken = self.frame, self.arrivals
        self.frame = self.arrivals = None
        return taken


def _run_day(
    writer: storage.PartitionWriter,
    source: EventSource,
    chain: Chain,
    d: dt.date,
    parts: Iterator[_DayEvents],
    n_parts: int,
    inputs: pl.DataFrame,
) -> pl.DataFrame:
    """Day ``d`` of :func:`run_range` in its ``n_parts`` parts of whole streams
    (:func:`parts_of_night`; one for all but the biggest nights), each a :class:`_DayEvents` of
    the part's events and checked labels, read from the source as the iterator ``parts`` is
    advanced: each runs through the night function (:func:`calpipe.night.phases.night_part`),
    whose phases' rows are written as they come (the part's events are freed with it); then
    the day's tables (phase ``day``, :func:`calpipe.night.phases.night_day`: the
    ``calibrator_state`` rows of the streams that changed, the ``pipeline_days`` row, the
    forecasts the night's labels judge). Streams are independent, so each part runs its
    streams from their state of the day before, and the day writes each stream's rows of one
    pass. Returns the day's ``calibrator_state`` rows."""
    before = chain.state
    split = n_parts > 1 and before is not None
    part_of = stream_part(before["stream"], n_parts) if split else None
    done = []
    for i, part in enumerate(parts):
        state = before.filter(pl.Series(part_of == i)) if split else before
        events, arrivals = part.take()
        night = night_part(chain, d, events, state, arrivals, source.describe(), PROTECT_BATCH_ROWS)
        del events, arrivals  # held by the night function alone: it frees them when done
        for phase, context in night:
            if phase == "part":
                done.append(context)
            else:
                write_phase(writer, phase, context)
            del context  # a batch is freed before the next one runs
    day = night_day(chain, d, done, inputs)
    write_phase(writer, "day", day)
    return day.state


def _span_events(
    con, source: EventSource, chain: Chain, d: dt.date, e: dt.date, first: pl.DataFrame,
    last: dt.date, inputs: pl.DataFrame,
) -> pl.DataFrame | None:  # fmt: skip
    """The events of the days [d, e] (``first``: day d's, read by :func:`_read_day`), checked as
    :func:`_read_day` checks a day, if the days can run as one span: they fit in
    :data:`calpipe.pipeline.transactions.TRANSACTION_ROWS` events by the row counts recorded in ``inputs``
    (the transaction was sized by its first day alone) and have the types of day d's. None
    otherwise: the days then run one by one."""
    recorded = inputs.filter(
        (pl.col("kind") == SCORES) & pl.col("date").is_between(d + dt.timedelta(days=1), e)
    )["n_rows"]
    if (
        recorded.null_count()
        or first.height + int(recorded.sum() or 0) > transactions.TRANSACTION_ROWS
    ):
        return None
    # the other days as day d was read (day d's rows of an earlier run are deleted already)
    more = _read_day(con, source, d + dt.timedelta(days=1), last, chain, to=e)
    if more.height == 0 or first.height == 0:
        chunk = more if first.height == 0 else first
    elif more.schema != first.schema:
        return None  # another id, score or class type: the days one by one say what differs
    else:
        chunk = pl.concat([first, more])
    if not chunk["event_date"].is_sorted():  # a table source: the days' rows in day order
        chunk = chunk.sort("event_date", maintain_order=True)
    check_stream_names(chunk, source.describe())
    return chunk


def _run_span(
    writer: storage.PartitionWriter, con, source: EventSource, settings: Settings, chain: Chain,
    d: dt.date, e: dt.date, first: pl.DataFrame, last: dt.date, inputs: pl.DataFrame,
) -> tuple[Span, list[tuple[dt.date, int]]] | None:  # fmt: skip
    """The days [d, e] of :func:`run_range` as one span: one read of their events, one
    validation, one engine pass (:func:`calpipe.engine.driver.protect_by_day`, a kernel call per
    day), and each table's rows of all the days at once (the registry's span writers), equal
    to the rows the days write one by one (tested). Returns the span (its ``calibrator_state``
    rows, its protected rows) and each day's number of events; None, having written nothing and left the chain as it
    was, when the days cannot run so (:func:`_span_events`) or one of them is bad: the days
    then run one by one, which report the first bad day exactly as without spans."""
    try:
        chunk = _span_events(con, source, chain, d, e, first, last, inputs)
        if chunk is None:
            return None
        col = score_column(chain.n_classes)
        result = protect_by_day(
            chunk.select(*protect_columns(chain.n_classes), "event_date"), day="event_date",
            **{col: col}, label="label", by=STREAM_KEYS, order_by=REPLAY_ORDER,
            method=chain.cal, state=engine_state(chain.state),
        )  # fmt: skip
        check_outputs(result.scores, d)
    except CalpipeError:
        return None
    span = Span(d, e, chain.cal, chunk, result, chain.state, [], inputs)
    span_changes(span, chain.n_classes)  # the detector's state joins the state rows
    result = span.result
    rows = result.states  # by day, then stream: each day's rows are a slice
    bounds = np.append(0, np.cumsum(result.n_active))
    digests = state_digests(rows, bounds)
    no_rows = state_digests(rows.clear(), np.array([0, 0]))[0]  # of a day without events
    j_of = {day: j for j, day in enumerate(result.days)}
    n_streams = 0 if chain.state is None else chain.state.height
    day_rows, per_day = [], []
    for day in storage.iter_days(d, e):
        j = j_of.get(day)
        if j is None:  # a day without events: no state row
            n_events = n_active = 0
            day_state, digest = rows.clear(), no_rows
        else:
            n_events, n_active = int(result.n_events[j]), int(result.n_active[j])
            n_streams = int(result.n_streams[j])
            day_state, digest = rows.slice(int(bounds[j]), n_active), digests[j]
        day_rows.append(
            chain.day_row(day, n_events, n_active, day_state, 0, n_streams=n_streams, digest=digest)
        )
        per_day.append((day, n_events))
    chain.state, span.day_rows = result.state, day_rows
    write_phase(writer, "span", span)
    return span, per_day


class DayProgress(Protocol):
    """What :func:`run_range` tells a progress display (the command line's bar)."""

    def start(self, total: int) -> None: ...
    def advance(self, day: dt.date, events: int) -> None: ...
    def stop(self) -> None: ...


@dataclass
class _Nights:
    """The nights of one :func:`run_range`, written in transactions of whole days
    (:meth:`write`): each day read from the source (:meth:`_read`, part by part for a big
    night: :meth:`_parts`), run through the night function (:func:`_run_day`), or several
    small days at once as a span (:meth:`_span`), and each transaction's end-of-run rows
    (:meth:`_finish`). The loop is here, driven by the run; ``transactions`` sizes each
    transaction (:func:`~calpipe.pipeline.transactions.transaction_end`)."""

    con: duckdb.DuckDBPyConnection
    source: EventSource
    labels: EventSource | None
    settings: Settings
    chain: Chain
    inputs: pl.DataFrame
    end: dt.date
    on_unknown_label: str
    spans: bool
    progress: DayProgress | None
    #: where a night in parts spools its read (:func:`calpipe.storage.spill_folder`)
    spill: Path
    empty_days: list[dt.date] = field(default_factory=list)
    #: the ``calibrator_state`` rows of the current transaction's days (for its map)
    states: list[pl.DataFrame] = field(default_factory=list)

    def write(self, start: dt.date) -> dict[str, int]:
        """Replace the partitions of every table of the days [start, end], in transactions of
        whole consecutive days; the rows written per table. A transaction starts at a day whose
        events are read first and spans as many days as fit at that day's size
        (:func:`~calpipe.pipeline.transactions.transaction_end`); its days run as one span when
        they can, else one by one, each day read once the writer has sent what the day's reads
        consult (:func:`~calpipe.pipeline.transactions.before_read`). A crash leaves whole
        days."""
        tables = list(TABLES)
        rows = dict.fromkeys(tables, 0)
        d = start
        while d <= self.end:
            day = self._read(d)
            e = transactions.transaction_end(d, self.end, day.height)
            with storage.replacing_partitions(self.con, d, e, tables, background=True) as writer:
                if not (e > d and self._span(writer, d, e, day)):
                    for each in storage.iter_days(d, e):
                        if each != d:
                            transactions.before_read(writer, tables)
                            day = self._read(each)
                        self._night(writer, each, day, first=each == d)
                        day = None  # free the day before reading the next one
                self._finish(writer)
            if self.labels is not None and d == start:
                # the feed the committed days were computed with (after their commit: a run
                # that failed before its first day recorded it, and calpipe ui then used it)
                storage.set_meta(self.con, labels=self.labels.location)
            for table, n in writer.rows.items():
                rows[table] += n
            storage.drop_block_cache(self.con)  # the days just committed are not read again
            d = e + dt.timedelta(days=1)
        return rows

    def _read(
        self,
        d: dt.date,
        part: tuple[int, int] | None = None,
        con: duckdb.DuckDBPyConnection | None = None,
        settled: bool = False,
        spools: tuple[PartSpool | None, PartSpool | None] = (None, None),
    ) -> _DayEvents | None:
        """Day ``d``'s events and checked labels (of ``part``, read through ``con``, by default
        the run's connection; from ``spools``, the day's events and labels each read once by
        part); a big night is read part by part as it runs (:meth:`_parts`).
        ``settled``: as :func:`_read_day` (None: read the part again through the database)."""
        k = parts_of_night(self.inputs, d) if part is None else 1
        if k > 1:
            return _DayEvents(None, recorded_rows(self.inputs, d, SCORES) or 0, parts=k)
        con = con or self.con
        chunk = _read_day(con, self.source, d, self.end, self.chain, part=part, settled=settled,
                          spool=spools[0])  # fmt: skip
        if chunk is None:
            return None
        arrived = night_arrivals(con, self.labels, d, chunk, self.on_unknown_label, part,
                                 spools[1])  # fmt: skip
        feed = f"labels {self.labels and self.labels.describe()}, day {d}"
        for rows in (arrived.rows, arrived.quarantined):
            check_part(rows["stream"], part, feed)
        return _DayEvents(chunk, chunk.height, arrived)

    def _parts(
        self, writer: storage.PartitionWriter, d: dt.date, day: _DayEvents, first: bool
    ) -> Iterator[_DayEvents]:
        """The parts of night ``d``, each read as the night reaches it; every row read in
        exactly one part (StateError otherwise: a file changed during the run).

        A part's reads consult the history before day ``d`` (the events' duplicate check, the
        labels' lookup). When ``d`` is the ``first`` day of its transaction and the chain
        resumes stored state rows, the open transaction has changed nothing they consult (only the
        days from ``d`` on, and the id type and classes are stored already), so they go
        through a second connection (:func:`calpipe.storage.committed_reader`) while the
        writer inserts the part before: they do not wait for it, and each part is read in a
        thread while the part before runs (DuckDB and polars release the GIL; one part ahead
        at most; BENCHMARKS.md §19: a 10M + 10M-label night 5-12 % faster, its peak 10-14 %
        lower).
        A database that stores no events yet (its first night; a backfill's first day) has no
        history to consult: when ``d`` is the ``first`` day of its transaction and there is no
        label feed, the first part is read through the run's connection (it settles the id
        type and classes inside the night's transaction) and the others ahead, in the thread,
        through a connection of their own that reads the files and nothing stored
        (``settled`` reads: a part whose id type or classes differ is read again through the
        run's connection, which raises the usual error).
        Otherwise each part waits for the writer's pending INSERTs (the days before ``d`` in
        this transaction are visible to its own connection only). Either way the parts come,
        and a bad one fails the night, in order."""
        if day.parts == 1:
            yield day
            return
        # (stored state rows, not only a stored chain: one of empty days has stored no id type
        # nor classes yet, which the first part's read would then write through the reader,
        # outside the night's transaction, and change the chain from the reading thread)
        resumed = self.chain.state is not None and self.chain.state.height > 0
        reader = storage.committed_reader(self.con) if first and resumed else None
        fresh = reader is None and first and self._nothing_stored(writer)
        if fresh:
            reader = storage.configure_session(duckdb.connect())

        spools: list[PartSpool | None] = []

        def spooled(con: duckdb.DuckDBPyConnection) -> tuple[PartSpool | None, PartSpool | None]:
            # the day's events and labels, each read once (by the first part's read) and
            # split by part into files (storage.PartSpool): not once per part
            if not spools:
                spools.append(self.source.spool_range(con, d, d, day.parts, self.spill))
                if self.labels is not None:
                    spools.append(spool_arrivals(con, self.labels, d, day.parts, self.spill))
            return spools[0], spools[1] if len(spools) > 1 else None

        def read(i: int) -> _DayEvents | None:
            return self._read(d, (i, day.parts), reader, fresh, spooled(reader))

        ahead = None if reader is None else ThreadPoolExecutor(1, "calpipe-read")
        n_events = n_labels = 0  # (no local holds a part: the engine frees each)
        try:
            coming = None if ahead is None or fresh else ahead.submit(read, 0)
            for i in range(day.parts):
                part = None if coming is None else coming.result()
                if part is None:
                    writer.wait()  # the part's reads need the connection (no INSERT pending)
                    part = self._read(d, (i, day.parts), spools=spooled(self.con))
                more = ahead is not None and i + 1 < day.parts
                coming = ahead.submit(read, i + 1) if more else None
                n_events += part.height
                n_labels += part.arrivals.rows.height + part.arrivals.quarantined.height
                yield part
                del part
        finally:
            if ahead is not None:  # (a failed night: the read under way ends before the close)
                ahead.shutdown(wait=True, cancel_futures=True)
            if reader is not None:
                reader.close()
            for spool in reversed(spools):  # (the last made first: the first may own the folder)
                if spool is not None:
                    spool.close()
        want = (recorded_rows(self.inputs, d, SCORES), recorded_rows(self.inputs, d, LABELS))
        # (a missing count: the parts' own reads only)
        if any(w is not None and w != m for w, m in zip(want, (n_events, n_labels), strict=True)):
            raise StateError(
                f"day {d}: its {day.parts} parts read {n_events} events and {n_labels} labels; "
                f"its files hold {want[0]} and {want[1]} (did a file change during the run?)"
            )

    def _nothing_stored(self, writer: storage.PartitionWriter) -> bool:
        """Whether a night's parts can be read ahead as a new database's (:meth:`_parts`): no
        label feed (its lookup consults the history), a source of files (not a table of this
        database), and no event stored (as the night's transaction sees it: what it replaces
        is deleted already)."""
        if self.labels is not None or self.source.kind == "table":
            return False
        writer.wait()  # (the connection is free)
        row = storage.fetch_one(self.con, "SELECT count(*) FROM scored_events")
        return row is not None and row[0] == 0

    def _night(
        self, writer: storage.PartitionWriter, d: dt.date, day: _DayEvents, *, first: bool
    ) -> None:
        """Night ``d`` (the ``first`` day of its transaction, or a later one) through the night
        function, its rows written as they come."""
        if day.height == 0:
            self.empty_days.append(d)
        parts = self._parts(writer, d, day, first)
        self.states.append(
            _run_day(writer, self.source, self.chain, d, parts, day.parts, self.inputs)
        )
        if self.progress is not None:
            self.progress.advance(d, day.height)

    def _span(
        self, writer: storage.PartitionWriter, d0: dt.date, d1: dt.date, first: _DayEvents
    ) -> bool:
        """The days [d0, d1] as one span (:func:`_run_span`), if they can run so: without a
        label feed, small days. False, having written nothing, otherwise."""
        if self.labels is not None or not self.spans or first.parts > 1:
            return False
        done = _run_span(
            writer, self.con, self.source, self.settings, self.chain, d0, d1, first.frame,
            self.end, self.inputs,
        )  # fmt: skip
        if done is None:
            return False
        self.states.append(done[0].result.states)
        for d, n in done[1]:
            if n == 0:
                self.empty_days.append(d)
            if self.progress is not None:
                self.progress.advance(d, n)
        return True

    def _finish(self, writer: storage.PartitionWriter) -> None:
        """The transaction's end: its ``calibration_map`` rows (phase ``transaction``)."""
        write_phase(writer, "transaction", Transaction(self.settings, pl.concat(self.states)))
        self.states.clear()


def run_range(
    con,
    source: EventSource,
    start: dt.date | None = None,
    end: dt.date | None = None,
    settings: Settings | None = None,
    *,
    first_day: dt.date | None = None,
    log: Callable[[str], None] | None = None,
    replay: bool = True,
    labels: EventSource | None = None,
    on_unknown_label: str = "error",
    progress: DayProgress | None = None,
    spans: bool = True,
    raise_on_failed_check: bool = True,
    replay_deleted: bool = False,
) -> RunSummary:
    """The nightly job (``calpipe run``, the dagster ``night`` asset): every table of the days
    [start, end], then the data checks. Defaults: see :func:`default_range`; the chain's first day is the one stored,
    else ``start``. Raises on the first failed (non-warning) check.

    Without ``start``, stored days whose inputs changed since they ran (a corrected or late
    landing) or that are stale (an earlier day was recomputed after them) come first: the run
    starts at the earliest of them (:func:`calpipe.pipeline.inputs.replay_start`) and goes
    through the source's last day; with ``replay=False`` that is a
    :class:`~calpipe.pipeline.inputs.ReplayRequired` error naming the day and the reason.

    Writes the rows of every table of the registry (:data:`TABLES`), one day at a time from
    memory (:func:`_run_day`), every table of a day in one transaction (:meth:`_Nights.write`):
    a day is read from the source once, validated once and never read back; memory is bounded
    by a batch of streams plus the day's events (a night of more than
    :data:`NIGHT_PART_ROWS` scores or labels is read, checked and protected in
    parts of whole streams, :func:`parts_of_night`: plus a part's); and DuckDB writes a batch
    while the engine protects the next one (the writer's background INSERTs).

    Without a label feed, a transaction of small days runs as one span (:func:`_run_span`: one
    read, one validation and one engine pass over its days, a kernel call per day), which writes
    the same rows; ``spans=False`` runs every day on its own (what the span is tested against).

    Stored days whose inputs were removed since they ran (a retention policy) keep their rows:
    they are not replayed, and a replay from an earlier day that would recompute them is a
    :class:`~calpipe.pipeline.inputs.SourceRemoved` error; ``replay_deleted=True`` recomputes
    them without those inputs. A stored day whose rows differ from what ``pipeline_days``
    recorded (deleted outside calpipe) is a :class:`~calpipe.pipeline.inputs.ReplayRequired`
    naming it, whatever ``replay`` says (:func:`calpipe.pipeline.checks.missing_rows`).

    ``progress`` (e.g. the command line's bar) is told the number of days, then each day as
    it is done with its number of events, then that the run stopped (also on an error).

    A failed (non-warning) data check raises :class:`~calpipe.errors.CalpipeError` once the
    days are committed; with ``raise_on_failed_check=False`` its outcome is in the summary's
    ``checks`` (the dagster assets report each as the check result of its asset)."""
    settings = settings or Settings()
    say = log or (lambda _msg: None)
    _check_label_feed(con, labels)
    inputs = None
    if start is None:
        _check_stored_rows(con)
        found = _replay_range(con, source, labels, end, replay_deleted, say)
        if found is not None:
            (start, end_replay), why, inputs = found
            if not replay:
                raise ReplayRequired(
                    start, why,
                    f"day {start}: {why}; the stored days from {start} on were computed from "
                    f"other inputs: run them again from {start} (--start {start})",
                )  # fmt: skip
            say(f"day {start}: {why}: replaying {start} .. {end or end_replay}")
            end = end or end_replay
    if start is None:
        rng = default_range(con, source, labels)
        if rng is None:
            return RunSummary(None, None, 0, 0)
        start = rng[0]
    if end is None:
        rng = _date_range(con, source, labels)
        if rng is None:
            return RunSummary(None, None, 0, 0)
        end = rng[1]
    start, end = as_date(start), as_date(end)
    if end < start:
        return RunSummary(None, None, 0, 0)
    first = as_date(first_day or chain_first_day(con) or start)
    if inputs is None:  # (a replay's inputs were checked by replay_start)
        inputs = run_inputs(con, source, labels, start, end)
        check_removed_inputs(con, inputs, start, end, replay_deleted=replay_deleted)
    chain = Chain(
        settings, first, state_before(con, start, settings, first), state_hash_before(con, start),
        stored_n_classes(con),
    )  # fmt: skip
    run = _Nights(con, source, labels, settings, chain, inputs, end, on_unknown_label, spans,
                  progress, storage.spill_folder(con))  # fmt: skip
    # every registered table, each written by its writer: none is replaced without rows
    if progress is not None:
        progress.start((end - start).days + 1)
    try:
        rows = run.write(start)
    finally:
        if progress is not None:
            progress.stop()
    empty_days = run.empty_days
    empty = f", {len(empty_days)} day(s) without events" if empty_days else ""
    say(f"scored_events: {rows['scored_events']} events, {start}..{end}{empty}")
    say(f"protected_scores / calibrator_state: {rows['protected_scores']} rows")
    if labels is not None:
        parked = rows["quarantined_labels"]
        say(
            f"event_labels: {rows['event_labels']} labels arrived"
            + (f", {parked} of unknown events quarantined (quarantined_labels)" if parked else "")
        )
    # at a small buffer pool: the checks scan every day of the run, whose blocks DuckDB would
    # otherwise keep cached up to its limit, on top of what the nights needed; checks that need
    # more than that pool run again at the default one (the days are committed already)
    storage.drop_block_cache(con, storage.session.CHECKS_MEMORY_LIMIT)
    try:
        checks = data_checks(con, start, end)
    except duckdb.OutOfMemoryException:
        storage.drop_block_cache(con)
        checks = data_checks(con, start, end)
    finally:
        storage.drop_block_cache(con)
    for c in checks:
        if raise_on_failed_check and not c.passed and not c.warning:
            raise CalpipeError(f"check {c.name} failed: {c.description}")
    _record_run(con, source, settings, first)
    days = (end - start).days + 1
    return RunSummary(
        start, end, days, rows["scored_events"], checks, dict(rows), sorted(empty_days),
        chain.fp,
    )  # fmt: skip


def run_facts_file(db: str | Path) -> Path:
    """The run log beside the database ``db`` (``demo.duckdb`` -> ``demo.runs.jsonl``)."""
    p = Path(db).expanduser().resolve()
    return p.with_name(p.stem + ".runs.jsonl")


def record_run_facts(db: str | Path, summary: RunSummary, method: str, seconds: float,
                     runner: str) -> None:  # fmt: skip
    """Append what a run outside dagster did (``calpipe run``, ``calpipe demo``) to the run log
    beside the database (:func:`run_facts_file`), one JSON line per run that computed a day:
    the command, when it finished (UTC), its days, events, method and duration. The dagster
    code location reports them with the days they computed (calpipe never imports dagster).
    A file, not a table: the facts are wall-clock times and durations, not results, and the
    database's tables are results, equal run after run (``tests/test_golden_tables.py``)."""
    if summary.days == 0:
        return
    finished = dt.datetime.now(dt.UTC).replace(tzinfo=None).isoformat(timespec="milliseconds")
    facts = {
        "runner": runner, "finished": finished, "start": summary.start.isoformat(),
        "end": summary.end.isoformat(), "days": summary.days, "events": summary.events,
        "method": method, "seconds": round(seconds, 3),
    }  # fmt: skip
    with open(run_facts_file(db), "a") as f:
        f.write(json.dumps(facts) + "\n")


def run_facts(db: str | Path) -> list[dict]:
    """The facts :func:`record_run_facts` recorded beside ``db``, oldest run first (none for a
    database without a run log)."""
    path = run_facts_file(db)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_stored_rows(con) -> None:
    """ReplayRequired naming the first stored day whose rows are missing (or extra) against the
    counts of ``pipeline_days``: a plain run said "up to date" after ``DELETE FROM
    protected_scores``. One aggregate over the date columns."""
    row = storage.fetch_one(con, "SELECT min(date), max(date) FROM pipeline_days")
    if row is None or row[0] is None:
        return
    gone = missing_rows(con, row[0], row[1])
    if gone is not None:
        d, why = gone.day, gone.message
        raise ReplayRequired(d, why, f"{why}; recompute the stored days from {d} (--start {d})")


def _record_run(con, source: EventSource, settings: Settings, first: dt.date) -> None:
    """What the chain was run with, in ``calpipe_meta``: the source, its column mapping, the
    method and the first day. ``calpipe ui`` hands them to the code location, so a partition
    materialized there reads the same events the same way and resumes the same chain."""
    storage.set_meta(
        con, events=source.location, columns=source.columns.to_json(),
        settings=settings.to_json(), first_day=first.isoformat(),
    )  # fmt: skip
