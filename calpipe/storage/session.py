"""A DuckDB session of calpipe: its settings, queries into polars, one-row reads, rollback.

DuckDB allows one read-write *process* per database file at a time; connections within a process
share the database (docs/ARCHITECTURE.md §5). :func:`calpipe.storage.connect` opens a file and
installs ``sql/``; this module holds what every reader and writer of an open connection uses.
"""

from __future__ import annotations

from contextlib import suppress

import duckdb
import polars as pl

#: DuckDB buffer pool of a read-write calpipe connection. DuckDB caches every block it writes up
#: to its memory_limit (default 80 % of RAM), so a backfill's memory would grow with the history
#: written; the pipeline never reads those blocks back, and its own queries (checks, alarm joins)
#: stay within this or spill to disk.
DUCKDB_MEMORY_LIMIT: str = "256MB"

#: DuckDB buffer pool while ``calpipe run`` checks the days it wrote: the checks scan the run's
#: days, and DuckDB keeps the blocks it reads cached up to its limit: a 60-night run's checks
#: cached ~200 MB and raised its peak from 642 to 698 MiB (in one process, BENCHMARKS §12). A
#: quarter of the pool bounds that cache; checks that need more run again at the full pool.
CHECKS_MEMORY_LIMIT: str = "64MB"


def db_name(con: duckdb.DuckDBPyConnection) -> str:
    row = fetch_one(
        con, "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    )
    return f"database {row[0] if row and row[0] else '(in memory)'}"


def configure_session(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """The session settings of every calpipe connection (also the dagster resource's):

    * time zone UTC: DuckDB otherwise takes the process's, and a day that mixed naive and
      time-zone-aware files (read as TIMESTAMPTZ) stored the naive times shifted by the
      process's offset; naive times mean UTC everywhere in calpipe;
    * memory limit :data:`calpipe.DUCKDB_MEMORY_LIMIT`: the pipeline never reads back
      the blocks it writes, so DuckDB must not cache a backfill;
    * no DuckDB progress bar: a query over 2 s drew one into ``calpipe run``'s output (and
      into the logs of dagster runs); the run reports its own progress, a line a day.
    """
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY_LIMIT}'")
    return con


def committed_reader(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A second connection to ``con``'s database, with the session settings of every calpipe
    connection (:func:`configure_session`), for reads while ``con`` is busy with a writer's
    INSERTs (:class:`calpipe.storage.PartitionWriter`). It sees what is committed, not the rows
    of ``con``'s open transaction: read through it only what that transaction has not changed.
    Close it when done.
    """
    return configure_session(con.cursor())


def drop_block_cache(con: duckdb.DuckDBPyConnection, limit: str | None = None) -> None:
    """Evict the blocks DuckDB keeps cached, e.g. the partitions just committed, and set the
    memory limit to ``limit`` (default :data:`calpipe.DUCKDB_MEMORY_LIMIT`).

    DuckDB caches the blocks it writes up to its memory limit; a backfill never reads them back,
    so after each commit the pipeline drops them (by lowering the limit for a moment) and its
    memory stays that of a day, not of a day plus the cache. Pinned blocks (an open
    transaction's) stay.
    """
    try:
        con.execute("SET memory_limit = '1MB'")
    except duckdb.OutOfMemoryException:
        pass  # some blocks are pinned: the unpinned ones were evicted on the way
    finally:
        con.execute(f"SET memory_limit = '{limit or DUCKDB_MEMORY_LIMIT}'")


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if DuckDB has not already aborted it: after an I/O error
    (a full disk) DuckDB ends the transaction itself, and a failing ROLLBACK ("cannot rollback -
    no transaction is active") would replace the real error ("No space left on device") that
    the caller re-raises."""
    with suppress(duckdb.Error):
        con.rollback()


def fetch_one(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple | None:
    """The first row of a query (None if none). Fetches the whole result: DuckDB 2 refuses new
    work on a connection that still has an unfinished result."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


def query(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """Run a query and return a polars frame."""
    return con.sql(sql, params=params or None).pl()
