"""Storage: the DuckDB file, its SQL layer, the tables' layout, transactional writes, event sources.

Layer 4 of docs/ARCHITECTURE.md §2. Everything calpipe writes lives in one embedded DuckDB file
(docs/ARCHITECTURE.md §5); every table is partitioned by a ``DATE`` column and every write
replaces whole partitions in one transaction, so a crash leaves the previous contents intact
and a re-run writes identical rows. One concern a module:

==================  =============================================================================
module              what it holds
==================  =============================================================================
``schema``          :func:`connect`, ``sql/`` (:data:`SQL_LAYOUT`), :data:`SCHEMA_VERSION`, ``calpipe_meta``
``session``         a connection's settings, :func:`query`, :func:`fetch_one`, :func:`rollback`,
                    :func:`committed_reader`
``tables``          each table's partition column and sort keys, :func:`read_partitions`
``writer``          :class:`PartitionWriter`, :func:`replacing_partitions`, :func:`replace_partitions`
``sources``         :class:`EventSource`, :class:`ColumnMap`, :func:`normalize_events`
``landing``         the landing folder layout: a day's files, one read of several, a night's parts
``parts``           :class:`PartSpool`: a big night's read once, split into its parts on disk
``locks``           waiting for a DuckDB file another process holds
==================  =============================================================================

Example
-------
>>> import datetime as dt, tempfile, polars as pl
>>> from pathlib import Path
>>> path = Path(tempfile.mkdtemp()) / "example.duckdb"
>>> con = connect(path)
>>> day = dt.date(2024, 1, 2)
>>> rows = pl.DataFrame({
...     "event_date": [day], "stream": ["a"], "event_id": [1],
...     "event_time": [dt.datetime(2024, 1, 2, 9)], "score": [0.3], "label": [1],
... })
>>> replace_partitions(con, day, day, {"scored_events": rows})
>>> read_partitions(con, "scored_events", day, day).select("stream", "score").rows()
[('a', 0.3)]
>>> con.close()
"""

from calpipe.errors import StoreError
from calpipe.storage.landing import (
    FILE_COLUMN,
    day_files,
    part_sql,
    part_where,
    read_parquet_files,
    stream_part,
    write_landing,
)
from calpipe.storage.locks import open_waiting
from calpipe.storage.parts import PartSpool, spill_folder
from calpipe.storage.schema import (
    SCHEMA_VERSION,
    SQL_LAYOUT,
    TABLE_PARTS,
    connect,
    get_meta,
    install_sql,
    require_calpipe,
    set_meta,
    sql_files,
)
from calpipe.storage.session import (
    committed_reader,
    configure_session,
    drop_block_cache,
    fetch_one,
    query,
    rollback,
)
from calpipe.storage.sources import (
    CSV_SUFFIXES,
    DAY_COLUMN,
    DEFAULT_STREAM,
    ColumnMap,
    EventSource,
    iter_days,
    normalize_events,
    sql_ident,
)
from calpipe.storage.tables import (
    LAYOUT,
    PARTITION_COLUMN,
    SORT_KEYS,
    TableLayout,
    partition_dates,
    read_partitions,
    table_columns,
)
from calpipe.storage.writer import PartitionWriter, replace_partitions, replacing_partitions

__all__ = [
    "CSV_SUFFIXES",
    "DAY_COLUMN",
    "DEFAULT_STREAM",
    "FILE_COLUMN",
    "LAYOUT",
    "PARTITION_COLUMN",
    "SCHEMA_VERSION",
    "SORT_KEYS",
    "SQL_LAYOUT",
    "TABLE_PARTS",
    "ColumnMap",
    "EventSource",
    "PartSpool",
    "PartitionWriter",
    "StoreError",
    "TableLayout",
    "committed_reader",
    "configure_session",
    "connect",
    "day_files",
    "drop_block_cache",
    "fetch_one",
    "get_meta",
    "install_sql",
    "iter_days",
    "normalize_events",
    "open_waiting",
    "part_sql",
    "part_where",
    "partition_dates",
    "query",
    "read_parquet_files",
    "read_partitions",
    "replace_partitions",
    "replacing_partitions",
    "require_calpipe",
    "rollback",
    "set_meta",
    "spill_folder",
    "sql_files",
    "sql_ident",
    "stream_part",
    "table_columns",
    "write_landing",
]
