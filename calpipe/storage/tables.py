"""The storage layout of each calpipe table (DDL file, partition column, row order) and reading
its partitions.

:data:`LAYOUT` is the one registry: every table is created by a file of ``sql/``, partitioned
by a ``DATE`` column (:data:`PARTITION_COLUMN`), and every write replaces whole partitions
(:mod:`calpipe.storage.writer`); :data:`SORT_KEYS` is the row order of an insert (so that a
re-run writes byte-identical partitions) and of :func:`read_partitions`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import duckdb
import polars as pl

from calpipe.errors import StoreError
from calpipe.storage.session import query


@dataclass(frozen=True)
class TableLayout:
    """How a calpipe table is stored: the ``sql/`` file that creates it (later changes of its
    columns are ``sql/migrations/``), the ``DATE`` column that partitions it, and its row order
    (the first sort key is the partition column)."""

    name: str
    ddl: str
    partition_column: str
    sort_keys: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.sort_keys[:1] != (self.partition_column,):
            raise ValueError(f"table {self.name!r}: its rows sort by its partition column first")


#: Every calpipe table's layout: the one registry of the storage layout (the pipeline's table
#: registry, ``calpipe/pipeline/tables.py``, adds how each table's rows are computed). Row order
#: is that of an insert (so that a re-run writes byte-identical partitions) and of
#: :func:`read_partitions`; the pipeline inserts the two event-sized tables unsorted, in an order
#: that is already deterministic (``scored_events``: the source's; ``protected_scores``: the
#: replay order), because sorting millions of rows costs more than writing them.
LAYOUT: dict[str, TableLayout] = {
    t.name: t
    for t in (
        TableLayout("scored_events", "001_tables.sql", "event_date",
                    ("event_date", "stream", "event_time", "event_id")),
        TableLayout("protected_scores", "001_tables.sql", "event_date",
                    ("event_date", "stream", "event_id")),
        TableLayout("calibrator_state", "001_tables.sql", "date", ("date", "stream")),
        TableLayout("pipeline_days", "001_tables.sql", "date", ("date",)),
        TableLayout("calibration_daily", "001_tables.sql", "date", ("date", "stream")),
        TableLayout("calibration_arrivals", "001_tables.sql", "date", ("date", "stream")),
        TableLayout("performance_estimates", "001_tables.sql", "date", ("date", "stream")),
        TableLayout("martingale_alarms", "001_tables.sql", "date", ("date", "stream")),
        TableLayout("change_points", "001_tables.sql", "detected_date",
                    ("detected_date", "stream")),
        TableLayout("calibration_map", "001_tables.sql", "date",
                    ("date", "stream", "layer", "term")),
        TableLayout("pipeline_inputs", "001_tables.sql", "date", ("date", "kind", "file")),
        TableLayout("event_labels", "001_tables.sql", "date", ("date", "stream", "event_id")),
        TableLayout("quarantined_labels", "001_tables.sql", "date",
                    ("date", "file", "stream", "event_id")),
    )
}  # fmt: skip

#: The DATE column that partitions each calpipe table (from :data:`LAYOUT`).
PARTITION_COLUMN: dict[str, str] = {n: t.partition_column for n, t in LAYOUT.items()}

#: Row order of each table (from :data:`LAYOUT`).
SORT_KEYS: dict[str, tuple[str, ...]] = {n: t.sort_keys for n, t in LAYOUT.items()}


def check_table(table: str) -> str:
    if table not in PARTITION_COLUMN:
        raise StoreError(
            f"unknown calpipe table {table!r}; expected one of {list(PARTITION_COLUMN)}"
        )
    return PARTITION_COLUMN[table]


def read_partitions(
    con: duckdb.DuckDBPyConnection,
    table: str,
    start: dt.date,
    end: dt.date,
    *,
    columns: list[str] | None = None,
) -> pl.DataFrame:
    """Rows of ``table`` whose partition date is in [start, end], in the table's sort order."""
    col = check_table(table)
    cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    order = ", ".join(f'"{c}"' for c in SORT_KEYS[table])
    return query(
        con,
        f'SELECT {cols} FROM "{table}" WHERE "{col}" BETWEEN ? AND ? ORDER BY {order}',
        [start, end],
    )


def table_columns(con: duckdb.DuckDBPyConnection, tables: list[str]) -> dict[str, list[str]]:
    """The columns of each of ``tables`` in their order (one catalog query: ~2 ms each, per
    transaction of every table, was a tenth of a run of small days)."""
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE list_contains(?, table_name) "
        "AND database_name = current_database() AND schema_name = current_schema() "
        "ORDER BY table_name, column_index",
        [list(tables)],
    ).fetchall()
    out: dict[str, list[str]] = {t: [] for t in tables}
    for table, column in rows:
        out[table].append(column)
    return out


def partition_dates(con: duckdb.DuckDBPyConnection, table: str) -> list[dt.date]:
    """The distinct partition dates present in ``table``, ascending."""
    col = check_table(table)
    return [
        r[0] for r in con.execute(f'SELECT DISTINCT "{col}" FROM "{table}" ORDER BY 1').fetchall()
    ]
