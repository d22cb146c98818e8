"""The table registry: every table the nightly run writes, and the function of its rows.

One :class:`OutputTable` per table: its storage layout (DDL file in ``sql/``, partition column,
sort keys: :data:`calpipe.storage.LAYOUT`, which the storage owns, since it sits below the
pipeline and reads no pipeline module), and the writer with which :func:`calpipe.pipeline.run_range` (behind
``calpipe run`` and the dagster ``night`` asset alike) computes its rows from memory; it
iterates :data:`TABLES`, so it replaces exactly the registered tables. Adding a table is one
entry here (and its DDL and its layout); ``tests/pipeline/test_tables.py`` fails if a table of the
store or of the DDL has no entry.

Each table's rows come from one function of :mod:`calpipe.night` (third column), called on
what the run holds in memory at the table's phase (the night's
:class:`~calpipe.night.arrivals.Arrivals`, :class:`FusedBatch`, :class:`FusedDay`,
:class:`FusedSpan`). A transaction of small days may run as one span
(:func:`calpipe.engine.driver.protect_by_day`): then each table's ``span`` writer calls the same
function on the rows of all its days at once, a :class:`FusedDays` (tested equal to the days
one by one).

======================  ===========================  =============
table                   rows                         phase
======================  ===========================  =============
``scored_events``       ``stored_events``            events
``protected_scores``    ``protected_rows``           batch
``calibrator_state``    ``state_rows``               day
``pipeline_days``       ``Chain.day_row``            day
``calibration_daily``   ``daily_rows``               batch
``calibration_arrivals``  ``arrival_metrics``        day
``martingale_alarms``   ``first_crossings``          batch
``calibration_map``     ``map_rows``                 transaction
``pipeline_inputs``     ``day_inputs``               day
``event_labels``        ``label_rows``               night
``quarantined_labels``  ``quarantine_rows``          night
======================  ===========================  =============
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from calpipe import paths, storage
from calpipe.calibrators import Calibrator
from calpipe.engine import ProtectResult
from calpipe.engine.driver import DaysResult
from calpipe.night.alarms import first_crossings
from calpipe.night.arrivals import Arrivals, label_rows, quarantine_rows
from calpipe.night.chain import protected_rows
from calpipe.night.events import stored_events
from calpipe.night.monitoring import arrival_metrics, arrived_in_rows, daily_rows, stream_groups
from calpipe.night.settings import Settings
from calpipe.pipeline.inputs import day_inputs
from calpipe.pipeline.mapping import map_rows

#: When the nightly run calls a table.s writer, and with what: ``night`` with the night's
#: checked :class:`~calpipe.pipeline.labels.Arrivals` when the day starts (so that DuckDB
#: writes a night's labels while the engine runs, when there are at least
#: :data:`calpipe.storage.writer.WRITE_FLUSH_ROWS` of them: 10M labels were a 2.3 s INSERT after the
#: day's last batch), ``events`` with a
#: :class:`FusedBatch` as read (before the engine runs, so that DuckDB writes the events while
#: the engine protects them), ``batch`` with a :class:`FusedBatch` after the engine ran,
#: ``day`` with a :class:`FusedDay` once every batch of the day ran, ``transaction`` with a
#: :class:`FusedSpan` at the end of each transaction's days. A transaction run as one span
#: calls the ``span`` writer of every table of every phase but ``transaction`` with a
#: :class:`FusedDays` instead.
PHASES = ("night", "events", "batch", "day", "transaction")


@dataclass
class FusedBatch:
    """A batch of whole streams of one day in the nightly run, as its writers see it.

    ``events``: the batch's events as read from the source (the data contract's names and
    ``event_date``); ``before``: the state of day - 1 of the batch's streams (None on the chain's
    first day); ``result``: the engine's output (None until it ran). The protected rows and the
    stream ids are computed once per batch, on first use."""

    day: dt.date
    cal: Calibrator
    events: pl.DataFrame
    before: pl.DataFrame | None
    result: ProtectResult | None = None

    @cached_property
    def protected(self) -> pl.DataFrame:
        """The batch's ``protected_scores`` rows (the monitoring reads them too)."""
        return protected_rows(self.cal, self.result.scores, self.day)

    @cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Stream ids of the engine's output rows (= of :attr:`protected`'s, same order)."""
        return stream_groups(self.protected, ["stream"])


@dataclass
class FusedDay:
    """A day of the nightly run after all its batches: its ``calibrator_state`` rows (the state of
    the streams that changed, keyed by the day), its ``pipeline_days`` row, the run's
    ``pipeline_inputs`` rows (this day's are written) and the forecasts whose labels arrived
    that night, as ``calibration_arrivals`` rows (the labels themselves were written when the
    night started: phase ``night``)."""

    day: dt.date
    state: pl.DataFrame
    day_row: dict[str, Any]
    inputs: pl.DataFrame
    #: the ``calibration_arrivals`` rows of the forecasts whose labels the night learnt, computed
    #: part by part of the night's streams (:func:`~calpipe.night.monitoring.
    #: night_arrival_rows`: the forecasts of a part are freed with it)
    arrival_rows: pl.DataFrame


@dataclass
class FusedSpan:
    """The days of one transaction of the nightly run: their ``calibrator_state`` rows."""

    settings: Settings
    states: pl.DataFrame


@dataclass
class FusedDays:
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

    @cached_property
    def protected(self) -> pl.DataFrame:
        """The span's ``protected_scores`` rows (the monitoring reads them too)."""
        return protected_rows(self.cal, self.result.scores, None)


def _fused_events(b: FusedBatch) -> pl.DataFrame:
    return stored_events(b.events)


def _fused_protected(b: FusedBatch) -> pl.DataFrame:
    return b.protected


def _fused_state(d: FusedDay) -> pl.DataFrame:
    return d.state


def _fused_day_row(d: FusedDay) -> pl.DataFrame:
    return pl.DataFrame([d.day_row])


def _fused_inputs(d: FusedDay) -> pl.DataFrame:
    return day_inputs(d.inputs, d.day)


def _fused_labels(a: Arrivals) -> pl.DataFrame:
    return label_rows(a)


def _fused_quarantine(a: Arrivals) -> pl.DataFrame:
    return quarantine_rows(a)


def _fused_daily(b: FusedBatch) -> pl.DataFrame:
    return daily_rows(b.protected, b.result.state, b.day, b.groups)


def _fused_alarms(b: FusedBatch) -> pl.DataFrame:
    return first_crossings(b.result.scores, b.before, b.day, b.groups)


def _fused_map(s: FusedSpan) -> pl.DataFrame:
    return map_rows(s.states, s.settings)


def _fused_arrivals(d: FusedDay) -> pl.DataFrame:
    return d.arrival_rows


def _span_events(s: FusedDays) -> pl.DataFrame:
    return stored_events(s.events)


def _span_protected(s: FusedDays) -> pl.DataFrame:
    return s.protected


def _span_state(s: FusedDays) -> pl.DataFrame:
    return s.result.states


def _span_day_rows(s: FusedDays) -> pl.DataFrame:
    return pl.DataFrame(s.day_rows)


def _span_inputs(s: FusedDays) -> pl.DataFrame:
    return day_inputs(s.inputs, s.start, s.end)


def _span_no_labels(s: FusedDays) -> pl.DataFrame:
    """A span runs without a label feed: no ``event_labels`` nor ``quarantined_labels`` rows."""
    return pl.DataFrame()


def _span_daily(s: FusedDays) -> pl.DataFrame:
    return daily_rows(s.protected, s.result.states, None)


def _span_alarms(s: FusedDays) -> pl.DataFrame:
    return first_crossings(s.result.scores, s.before, None)


def _span_arrivals(s: FusedDays) -> pl.DataFrame:
    return arrival_metrics(arrived_in_rows(s.protected), s.result.states)


@dataclass(frozen=True)
class OutputTable:
    """A table the pipeline writes (see the module's table).

    ``fused`` computes its rows from the context of its ``phase`` (:data:`PHASES`);
    ``sort``: whether the nightly run inserts its rows in the table's sort keys' order (False for
    the event-sized tables, whose rows come in a deterministic order that a sort of millions of
    rows would only slow down); ``span``: its rows of a transaction run as one span, from a
    :class:`FusedDays` (every table but those of phase ``transaction``, which are written at the
    end of the transaction either way)."""

    name: str
    fused: Callable[[Any], pl.DataFrame]
    phase: str
    span: Callable[[FusedDays], pl.DataFrame] | None = None
    sort: bool = True

    def __post_init__(self) -> None:
        if self.name not in storage.LAYOUT:
            raise ValueError(
                f"table {self.name!r} has no storage layout: add it to calpipe.storage.LAYOUT"
            )
        if not callable(self.fused):
            raise TypeError(f"table {self.name!r}: the registry needs its rows' writer")
        if self.phase not in PHASES:
            raise ValueError(f"table {self.name!r}: phase {self.phase!r} not in {PHASES}")
        if (self.span is None) != (self.phase == "transaction"):
            raise TypeError(
                f"table {self.name!r}: a span writer is needed for the phases before "
                "'transaction', and only for them"
            )

    @property
    def layout(self) -> storage.TableLayout:
        """How the table is stored: its DDL file, partition column and sort keys
        (:data:`calpipe.storage.LAYOUT`)."""
        return storage.LAYOUT[self.name]

    @property
    def partition_column(self) -> str:
        """The DATE column whose partitions a write replaces."""
        return self.layout.partition_column

    @property
    def sort_keys(self) -> tuple[str, ...]:
        """The table's row order."""
        return self.layout.sort_keys

    @property
    def ddl_path(self) -> Path:
        """The ``sql/`` file that creates the table."""
        return paths.SQL_DIR / self.layout.ddl


#: Every table the pipeline writes, in the order the nightly run computes them within a phase.
TABLES: dict[str, OutputTable] = {
    t.name: t
    for t in (
        OutputTable("scored_events", _fused_events, "events",
                    _span_events, sort=False),
        OutputTable("protected_scores", _fused_protected, "batch",
                    _span_protected, sort=False),
        OutputTable("calibrator_state", _fused_state, "day",
                    _span_state),
        OutputTable("pipeline_days", _fused_day_row, "day",
                    _span_day_rows),
        OutputTable("calibration_daily", _fused_daily, "batch",
                    _span_daily),
        OutputTable("calibration_arrivals", _fused_arrivals,
                    "day", _span_arrivals),
        OutputTable("martingale_alarms", _fused_alarms, "batch",
                    _span_alarms),
        OutputTable("calibration_map", _fused_map, "transaction"),
        OutputTable("pipeline_inputs", _fused_inputs, "day",
                    _span_inputs),
        OutputTable("event_labels", _fused_labels, "night",
                    _span_no_labels, sort=False),  # in the label files' order
        OutputTable("quarantined_labels", _fused_quarantine,
                    "night", _span_no_labels),
    )
}  # fmt: skip


def write_fused(writer: storage.PartitionWriter, phase: str, context: Any) -> None:
    """Insert the rows of every registered table of ``phase`` computed from ``context``
    (``phase="span"``: of every table with a span writer, from a :class:`FusedDays`)."""
    for t in TABLES.values():
        if phase == "span" and t.span is not None:
            writer.insert(t.name, t.span(context), sort=t.sort)
        elif t.phase == phase:
            writer.insert(t.name, t.fused(context), sort=t.sort)


@functools.cache
def table_schemas() -> dict[str, tuple[tuple[str, str], ...]]:
    """Each calpipe table's columns as ``(name, DuckDB type)``, in order, from the tables' layout
    (``sql/001_tables.sql`` and ``sql/migrations/``: :data:`calpipe.storage.TABLE_PARTS`) run in
    an in-memory database: what the code location shows as column schemas, at its load (the
    tables alone take ~40 ms; the whole SQL layer ~0.6 s)."""
    import duckdb

    con = duckdb.connect()
    try:
        for f in storage.sql_files(parts=storage.TABLE_PARTS):
            con.execute(f.read_text())
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE NOT internal ORDER BY table_name, column_index"
        ).fetchall()
    finally:
        con.close()
    out: dict[str, list[tuple[str, str]]] = {}
    for table, column, dtype in rows:
        out.setdefault(table, []).append((column, dtype))
    return {t: tuple(cols) for t, cols in out.items()}
