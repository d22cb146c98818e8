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
:class:`~calpipe.night.arrivals.Arrivals`, :class:`Batch`, :class:`Day`,
:class:`Transaction`). A transaction of small days may run as one span
(:func:`calpipe.engine.driver.protect_by_day`): then each table's ``span`` writer calls the same
function on the rows of all its days at once, a :class:`Span` (tested equal to the days
one by one).

======================  ===========================  =============
table                   rows                         phase
======================  ===========================  =============
``scored_events``       ``stored_events``            events
``protected_scores``    ``protected_rows``           batch
``calibrator_state``    ``state_rows``               day
``pipeline_days``       ``Chain.day_row``            day
``calibration_daily``   ``daily_rows``               batch
``calibration_arrivals``  ``arrival_rows``           day
``performance_estimates``  ``estimate_rows``         batch
``martingale_alarms``   ``first_crossings``          batch
``change_points``       ``detect``                   batch
``calibration_map``     ``map_rows``                 transaction
``pipeline_inputs``     ``day_inputs``               day
``event_labels``        ``label_rows``               night
``quarantined_labels``  ``quarantine_rows``          night
======================  ===========================  =============
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from calpipe import paths, storage
from calpipe.night.alarms import first_crossings
from calpipe.night.arrivals import Arrivals, label_rows, quarantine_rows
from calpipe.night.events import stored_events
from calpipe.night.mapping import map_rows
from calpipe.night.monitoring import arrival_rows, daily_rows, rows_arrival_stats, stream_groups
from calpipe.night.performance import estimate_rows
from calpipe.night.phases import PHASES, Batch, Day, Span, Transaction, day_inputs


def _night_events(b: Batch) -> pl.DataFrame:
    return stored_events(b.events)


def _night_protected(b: Batch) -> pl.DataFrame:
    return b.protected


def _night_state(d: Day) -> pl.DataFrame:
    return d.state


def _night_day_row(d: Day) -> pl.DataFrame:
    return pl.DataFrame([d.day_row])


def _night_inputs(d: Day) -> pl.DataFrame:
    return day_inputs(d.inputs, d.day)


def _night_labels(a: Arrivals) -> pl.DataFrame:
    return label_rows(a)


def _night_quarantine(a: Arrivals) -> pl.DataFrame:
    return quarantine_rows(a)


def _night_daily(b: Batch) -> pl.DataFrame:
    return daily_rows(b.protected, b.result.state, b.day, b.groups, stats=b.stats)


def _night_estimates(b: Batch) -> pl.DataFrame:
    return estimate_rows(b.protected, b.day, b.groups)


def _night_alarms(b: Batch) -> pl.DataFrame:
    return first_crossings(b.result.scores, b.before, b.day, b.groups)


def _night_changes(b: Batch) -> pl.DataFrame:
    return b.changes


def _night_map(s: Transaction) -> pl.DataFrame:
    return map_rows(s.states, s.settings)


def _night_arrivals(d: Day) -> pl.DataFrame:
    return d.arrival_rows


def _span_events(s: Span) -> pl.DataFrame:
    return stored_events(s.events)


def _span_protected(s: Span) -> pl.DataFrame:
    return s.protected


def _span_state(s: Span) -> pl.DataFrame:
    return s.result.states


def _span_day_rows(s: Span) -> pl.DataFrame:
    return pl.DataFrame(s.day_rows)


def _span_inputs(s: Span) -> pl.DataFrame:
    return day_inputs(s.inputs, s.start, s.end)


def _span_no_labels(s: Span) -> pl.DataFrame:
    """A span runs without a label feed: no ``event_labels`` nor ``quarantined_labels`` rows."""
    return pl.DataFrame()


def _span_daily(s: Span) -> pl.DataFrame:
    return daily_rows(s.protected, s.result.states, None, stats=s.stats)


def _span_estimates(s: Span) -> pl.DataFrame:
    return estimate_rows(s.protected, None)


def _span_alarms(s: Span) -> pl.DataFrame:
    return first_crossings(s.result.scores, s.before, None)


def _span_changes(s: Span) -> pl.DataFrame:
    return s.changes


def _span_arrivals(s: Span) -> pl.DataFrame:
    groups = stream_groups(s.protected, ["stream"])
    return arrival_rows(rows_arrival_stats(s.protected, s.stats, groups), s.result.states)


@dataclass(frozen=True)
class OutputTable:
    """A table the pipeline writes (see the module's table).

    ``rows`` computes its rows from the context of its ``phase`` (:data:`PHASES`);
    ``sort``: whether the nightly run inserts its rows in the table's sort keys' order (False for
    the event-sized tables, whose rows come in a deterministic order that a sort of millions of
    rows would only slow down); ``span``: its rows of a transaction run as one span, from a
    :class:`Span` (every table but those of phase ``transaction``, which are written at the
    end of the transaction either way)."""

    name: str
    rows: Callable[[Any], pl.DataFrame]
    phase: str
    span: Callable[[Span], pl.DataFrame] | None = None
    sort: bool = True

    def __post_init__(self) -> None:
        if self.name not in storage.LAYOUT:
            raise ValueError(
                f"table {self.name!r} has no storage layout: add it to calpipe.storage.LAYOUT"
            )
        if not callable(self.rows):
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
        OutputTable("scored_events", _night_events, "events",
                    _span_events, sort=False),
        OutputTable("protected_scores", _night_protected, "batch",
                    _span_protected, sort=False),
        OutputTable("calibrator_state", _night_state, "day",
                    _span_state),
        OutputTable("pipeline_days", _night_day_row, "day",
                    _span_day_rows),
        OutputTable("calibration_daily", _night_daily, "batch",
                    _span_daily),
        OutputTable("calibration_arrivals", _night_arrivals,
                    "day", _span_arrivals),
        OutputTable("performance_estimates", _night_estimates, "batch",
                    _span_estimates),
        OutputTable("martingale_alarms", _night_alarms, "batch",
                    _span_alarms),
        OutputTable("change_points", _night_changes, "batch",
                    _span_changes),
        OutputTable("calibration_map", _night_map, "transaction"),
        OutputTable("pipeline_inputs", _night_inputs, "day",
                    _span_inputs),
        OutputTable("event_labels", _night_labels, "night",
                    _span_no_labels, sort=False),  # in the label files' order
        OutputTable("quarantined_labels", _night_quarantine,
                    "night", _span_no_labels),
    )
}  # fmt: skip


def phase_rows(phase: str, context: Any) -> Iterator[tuple[OutputTable, pl.DataFrame]]:
    """Each registered table of ``phase`` (:data:`~calpipe.night.phases.PHASES`) with its rows
    computed from ``context`` (``phase="span"``: every table with a span writer, from a
    :class:`~calpipe.night.phases.Span`), in the registry's order."""
    for t in TABLES.values():
        if phase == "span" and t.span is not None:
            yield t, t.span(context)
        elif t.phase == phase:
            yield t, t.rows(context)


def write_phase(writer: storage.PartitionWriter, phase: str, context: Any) -> None:
    """Insert the rows of every registered table of ``phase`` computed from ``context``
    (:func:`phase_rows`)."""
    for t, rows in phase_rows(phase, context):
        writer.insert(t.name, rows, sort=t.sort)


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
