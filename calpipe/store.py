"""DuckDB and Parquet I/O: connect (and install ``sql/``), read events, replace partitions.

Everything calpipe writes lives in one embedded DuckDB file (docs/ARCHITECTURE.md §5). Every table is
partitioned by a ``DATE`` column (:data:`PARTITION_COLUMN`), and every write replaces whole
partitions in **one transaction** (``BEGIN; DELETE ...; INSERT ...; COMMIT``): a crash or a
``SIGKILL`` in the middle leaves the previous contents of every table intact, and re-running a
partition writes identical rows (rows are inserted in a fixed order). A long range is written
one day at a time inside its transaction (:func:`replacing_partitions`), so memory is bounded by
a day, not by the range.

Scored events come from a :class:`EventSource`: a Parquet landing folder with hive-style
``date=YYYY-MM-DD/`` sub-folders, a Parquet file (or glob), or a DuckDB table, with a column map
onto the data contract (docs/ARCHITECTURE.md §3).

DuckDB allows one read-write *process* per database file at a time; connections within a process
share the database.

Example
-------
>>> import datetime as dt, tempfile, polars as pl
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

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl
import polars.selectors as cs

from calpipe import config
from calpipe.errors import InputError, StoreError
from calpipe.landing import (  # noqa: F401  (the landing layout: part of the store's API)
    FILE_COLUMN,
    day_files,
    part_where,
    read_parquet_files,
    write_landing,
)
from calpipe.locks import open_waiting
from calpipe.paths import SQL_DIR

#: The DATE column that partitions each calpipe table.
PARTITION_COLUMN: dict[str, str] = {
    "scored_events": "event_date",
    "protected_scores": "event_date",
    "calibrator_state": "date",
    "pipeline_days": "date",
    "calibration_daily": "date",
    "calibration_arrivals": "date",
    "martingale_alarms": "date",
    "calibration_map": "date",
    "pipeline_inputs": "date",
    "event_labels": "date",
    "quarantined_labels": "date",
}

#: Row order of each table on insert (so that a re-run writes byte-identical partitions) and of
#: :func:`read_partitions`. The pipeline inserts the two event-sized tables unsorted, in an order
#: that is already deterministic (``scored_events``: the source's; ``protected_scores``: the replay
#: order), because sorting millions of rows costs more than writing them.
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "scored_events": ("event_date", "stream", "event_time", "event_id"),
    "protected_scores": ("event_date", "stream", "event_id"),
    "calibrator_state": ("date", "stream"),
    "pipeline_days": ("date",),
    "calibration_daily": ("date", "stream"),
    "calibration_arrivals": ("date", "stream"),
    "martingale_alarms": ("date", "stream"),
    "calibration_map": ("date", "stream", "layer", "term"),
    "pipeline_inputs": ("date", "kind", "file"),
    "event_labels": ("date", "stream", "event_id"),
    "quarantined_labels": ("date", "file", "stream", "event_id"),
}

_META_SQL_HASH = "sql_hash"
_META_SCHEMA = "schema_version"

#: Version of the tables' layout in ``sql/``; bump it with any change that alters a table, so an
#: older calpipe refuses a newer database instead of migrating it backwards. 1 = the databases
#: written before the version was recorded (they upgrade on the next read-write connection);
#: 3 = calibration_map's term inputs (in_w1, in_w2, in_w0, in_eps); 4 = calibrator_state and
#: calibration_map hold the rows of the streams that changed that day (pipeline_days.n_state_rows);
#: 5 = pipeline_inputs and pipeline_days.state_hash (corrected, late and stale days are replayed);
#: 6 = the label feed (event_labels, quarantined_labels, calibration_arrivals,
#: pipeline_days.n_label_arrivals); 7 = K-class forecasts (``scores``, ``base_scores``,
#: ``protected_scores`` lists; the binary columns nullable); 8 = every method's map in
#: ``calibration_map`` (``layer`` of a stack, step/linear tables: ``x``, ``y_at``, ``y_right``,
#: ``x_next``, ``y_next``); 9 = K-class maps (``alphas``, ``in_ka``, ``in_kb``); 10 = a K-class
#: category's forecast and a partition tree (``y_k``, ``kids``: the Venn taxonomies' tables,
#: ROC-isotonic's tree); 11 = a composite-experts input table (``in_layer``, negative ``layer``).
SCHEMA_VERSION = 11
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}$")


# ----------------------------------------------------------------------------------------------
# Connections and the SQL layer
# ----------------------------------------------------------------------------------------------
def sql_files(sql_dir: Path = SQL_DIR) -> list[Path]:
    """The ``.sql`` files of the SQL layer, in the order they are installed."""
    files = sorted(sql_dir.glob("*.sql"))
    if not files:
        raise StoreError(f"no SQL files in {sql_dir}; is calpipe installed from its repository?")
    return files


def _sql_hash(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def install_sql(con: duckdb.DuckDBPyConnection, *, force: bool = False) -> bool:
    """Install the tables, views and macros of ``sql/`` into ``con``'s database.

    Every statement is idempotent (``CREATE TABLE IF NOT EXISTS``, ``CREATE OR REPLACE``,
    ``ADD COLUMN IF NOT EXISTS``): applying them is the migration from any earlier version. The
    hash of the SQL files and :data:`SCHEMA_VERSION` are kept in ``calpipe_meta``, so a database
    that is up to date is left untouched (no write). Refused, with nothing changed: a database
    written by a newer calpipe (its schema version is higher), and a database that is not
    calpipe's (it has tables or views but no ``calpipe_meta``). Returns True if anything was
    (re)installed.
    """
    files = sql_files()
    digest = _sql_hash(files)
    try:
        meta = dict(con.execute("SELECT key, value FROM calpipe_meta").fetchall())
    except duckdb.CatalogException:
        meta = None
    if meta is None:
        others = fetch_one(
            con,
            "SELECT (SELECT count(*) FROM duckdb_tables() WHERE NOT internal) + "
            "(SELECT count(*) FROM duckdb_views() WHERE NOT internal)",
        )[0]
        if others:
            raise StoreError(
                f"{_db_name(con)} is not a calpipe database: it has {others} tables/views of its "
                "own and no calpipe_meta; calpipe installs its schema only into a new file or "
                "its own databases (nothing was changed)"
            )
    else:
        version = int(meta.get(_META_SCHEMA, 1))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{_db_name(con)} was written by a newer calpipe (schema version {version}; "
                f"this calpipe knows {SCHEMA_VERSION}): upgrade calpipe (nothing was changed)"
            )
        if not force and version == SCHEMA_VERSION and meta.get(_META_SQL_HASH) == digest:
            return False
    con.begin()
    try:
        for f in files:
            con.execute(f.read_text())
        _set_meta(con, _META_SQL_HASH, digest)
        _set_meta(con, _META_SCHEMA, str(SCHEMA_VERSION))
        con.commit()
    except BaseException:
        rollback(con)
        raise
    return True


def _db_name(con: duckdb.DuckDBPyConnection) -> str:
    row = fetch_one(
        con, "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    )
    return f"database {row[0] if row and row[0] else '(in memory)'}"


def connect(
    path: str | Path, *, read_only: bool = False, lock_wait: float | None = None
) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) a calpipe DuckDB file and install the SQL layer.

    ``path`` is made absolute; its folder is created. A read-only connection does not install
    anything (the file must have been opened read-write by calpipe before). A read-write
    connection's DuckDB memory limit is :data:`calpipe.config.DUCKDB_MEMORY_LIMIT` (``SET
    memory_limit`` changes it). When another process holds the file's lock (a writer, or a
    read-only connection when this one writes), the connection is retried with backoff for
    ``lock_wait`` seconds (default :data:`calpipe.config.LOCK_WAIT_SECONDS`), then refused with
    a :class:`StoreError` naming that process.
    """
    p = Path(path).expanduser().resolve()
    if read_only and not p.exists():
        raise StoreError(f"database {p} does not exist")
    if not read_only:
        p.parent.mkdir(parents=True, exist_ok=True)
    con = open_waiting(p, read_only, config.LOCK_WAIT_SECONDS if lock_wait is None else lock_wait)
    configure_session(con)
    if not read_only:
        install_sql(con)
    return con


def configure_session(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """The session settings of every calpipe connection (also the dagster resource's):

    * time zone UTC: DuckDB otherwise takes the process's, and a day that mixed naive and
      time-zone-aware files (read as TIMESTAMPTZ) stored the naive times shifted by the
      process's offset; naive times mean UTC everywhere in calpipe;
    * memory limit :data:`calpipe.config.DUCKDB_MEMORY_LIMIT`: the pipeline never reads back
      the blocks it writes, so DuckDB must not cache a backfill.
    """
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET memory_limit = '{config.DUCKDB_MEMORY_LIMIT}'")
    return con


def drop_block_cache(con: duckdb.DuckDBPyConnection, limit: str | None = None) -> None:
    """Evict the blocks DuckDB keeps cached, e.g. the partitions just committed, and set the
    memory limit to ``limit`` (default :data:`calpipe.config.DUCKDB_MEMORY_LIMIT`).

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
        con.execute(f"SET memory_limit = '{limit or config.DUCKDB_MEMORY_LIMIT}'")


def _set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute("DELETE FROM calpipe_meta WHERE key = ?", [key])
    con.execute("INSERT INTO calpipe_meta VALUES (?, ?)", [key, value])


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


def get_meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    """A value of ``calpipe_meta`` (None if unset)."""
    row = fetch_one(con, "SELECT value FROM calpipe_meta WHERE key = ?", [key])
    return None if row is None else row[0]


def set_meta(con: duckdb.DuckDBPyConnection, **values: str) -> None:
    """Set values of ``calpipe_meta``, key = value, all in one transaction of their own."""
    con.begin()
    try:
        for key, value in values.items():
            _set_meta(con, key, value)
        con.commit()
    except BaseException:
        rollback(con)
        raise


def query(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """Run a query and return a polars frame."""
    return con.sql(sql, params=params or None).pl()


# ----------------------------------------------------------------------------------------------
# Partitions
# ----------------------------------------------------------------------------------------------
def _check_table(table: str) -> str:
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
    col = _check_table(table)
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
    col = _check_table(table)
    return [
        r[0] for r in con.execute(f'SELECT DISTINCT "{col}" FROM "{table}" ORDER BY 1').fetchall()
    ]


class PartitionWriter:
    """Inserts rows into the partitions that :func:`replacing_partitions` is replacing.

    Only valid inside its ``with`` block (the open transaction). Rows are buffered per table and
    sent to DuckDB once a table holds :data:`calpipe.config.WRITE_FLUSH_ROWS` rows, and at the
    end of the block: a long range of small days costs a few INSERTs, and a big day is sent at
    once, so a caller writing one day at a time keeps about one day in memory (DuckDB writes the
    transaction's full row groups to the database file; it keeps ~11 bytes a row until the
    commit).

    With ``background=True`` the INSERTs run in a worker thread (DuckDB releases the GIL), one at
    a time and in order, at most :data:`calpipe.config.WRITE_MAX_PENDING` queued, while the
    caller computes the next rows: writing a batch overlaps with protecting the next one. The
    caller must then call :meth:`wait` before using the connection itself.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        start: dt.date,
        end: dt.date,
        tables: list[str],
        *,
        background: bool = False,
    ) -> None:
        self._con, self._start, self._end, self._tables = con, start, end, tables
        self.rows: dict[str, int] = dict.fromkeys(tables, 0)
        self._buffer: dict[str, list[pl.DataFrame]] = {t: [] for t in tables}
        self._sort: dict[str, bool] = dict.fromkeys(tables, False)
        self._columns = table_columns(con, tables)
        self._pool = ThreadPoolExecutor(1, "calpipe-writer") if background else None
        self._pending: list[Future] = []  # in order; the one worker runs them one at a time

    def insert(self, table: str, frame: pl.DataFrame, *, sort: bool = True) -> None:
        """Insert ``frame``'s rows into ``table`` (matched by column name).

        ``sort=True`` inserts a flush's rows in the table's :data:`SORT_KEYS` order;
        ``sort=False`` keeps the order of the frames as given, which must then be deterministic
        (the source's order, or the order the engine returned): a multi-key sort of millions of
        rows costs more than writing them. Every row must lie in the partitions being replaced.
        """
        if table not in self._tables:
            raise StoreError(f"{table}: not among the tables being replaced ({self._tables})")
        if frame.height == 0:
            return
        col = PARTITION_COLUMN[table]
        lo, hi = frame.select(pl.col(col).min().alias("lo"), pl.col(col).max().alias("hi")).row(0)
        if lo < self._start or hi > self._end:
            raise StoreError(
                f"{table}: rows dated {lo}..{hi} outside the partitions being replaced "
                f"({self._start}..{self._end})"
            )
        self._buffer[table].append(frame)
        self._sort[table] |= sort
        self.rows[table] += frame.height
        if sum(f.height for f in self._buffer[table]) >= config.WRITE_FLUSH_ROWS:
            self.flush(table)

    def flush(self, table: str | None = None) -> None:
        """Send the buffered rows of ``table`` (default: every table) to DuckDB (in the
        background with ``background=True``)."""
        for t in [table] if table is not None else self._tables:
            frames, self._buffer[t] = self._buffer[t], []
            if not frames:
                continue
            if self._pool is None:
                self._send(t, frames)
                continue
            # at most MAX_PENDING INSERTs queued: the frames they hold stay in memory
            while len(self._pending) >= config.WRITE_MAX_PENDING:
                self._pending.pop(0).result()
            self._pending.append(self._pool.submit(self._send, t, frames))

    def wait(self) -> None:
        """Return once every row sent so far is in DuckDB (re-raises a failed INSERT's error)."""
        pending, self._pending = self._pending, []
        errors = []
        for future in pending:  # all of them: none may still hold the connection
            try:
                future.result()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _send(self, table: str, frames: list[pl.DataFrame]) -> None:
        if len(frames) > 1:  # (two Enums, e.g. two nights' label files, have no common type)
            frames[:] = [f.with_columns(cs.enum().cast(pl.String)) for f in frames]
        frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")
        frames.clear()
        if self._sort[table]:
            frame = frame.sort(list(SORT_KEYS[table]), maintain_order=True)
        columns = self._columns[table]
        unknown = [c for c in frame.columns if c not in columns]
        if unknown:
            raise StoreError(f"{table} has no column(s) {unknown} (its columns: {columns})")
        # the table's columns in its order (missing ones NULL): an Arrow relation inserted
        # by position. Not a registered view: inside a transaction DuckDB keeps a dropped
        # view's catalog entry, and the Arrow data it holds, until the commit.
        aligned = frame.select(
            pl.col(c) if c in frame.columns else pl.lit(None).alias(c) for c in columns
        )
        self._con.from_arrow(aligned.to_arrow()).insert_into(table)

    def close(self, *, failed: bool) -> None:
        """Finish the background work (after a failure: wait for it, ignoring its error)."""
        try:
            if failed:
                with suppress(Exception):
                    self.wait()
            else:
                self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()


@contextmanager
def replacing_partitions(
    con: duckdb.DuckDBPyConnection,
    start: dt.date,
    end: dt.date,
    tables: Sequence[str],
    *,
    background: bool = False,
) -> Iterator[PartitionWriter]:
    """Replace the partitions [start, end] of ``tables`` in ONE transaction, streaming the rows.

    Opens a transaction, deletes the tables' rows with partition date in [start, end], yields a
    :class:`PartitionWriter` to insert the new rows, and commits when the block ends. On any
    error (or a crash) nothing is committed: every table keeps its previous contents.
    ``background``: see :class:`PartitionWriter`.

    >>> import tempfile
    >>> con = connect(Path(tempfile.mkdtemp()) / "w.duckdb")
    >>> day = dt.date(2024, 1, 2)
    >>> rows = pl.DataFrame({
    ...     "event_date": [day], "stream": ["a"], "event_id": [1],
    ...     "event_time": [dt.datetime(2024, 1, 2, 9)], "score": [0.3], "label": [1],
    ... })
    >>> with replacing_partitions(con, day, day, ["scored_events"]) as writer:
    ...     writer.insert("scored_events", rows, sort=False)  # e.g. one call per day of a range
    >>> writer.rows
    {'scored_events': 1}
    >>> con.close()
    """
    tables = list(tables)
    for table in tables:
        _check_table(table)
    writer = PartitionWriter(con, start, end, tables, background=background)
    con.begin()
    try:
        for table in tables:
            col = PARTITION_COLUMN[table]
            con.execute(f'DELETE FROM "{table}" WHERE "{col}" BETWEEN ? AND ?', [start, end])
        yield writer
        writer.flush()
        writer.close(failed=False)
        con.commit()
    except BaseException:
        writer.close(failed=True)
        rollback(con)
        raise


def replace_partitions(
    con: duckdb.DuckDBPyConnection,
    start: dt.date,
    end: dt.date,
    frames: Mapping[str, pl.DataFrame],
    *,
    sort: bool = True,
) -> None:
    """Replace the partitions [start, end] of each table by the rows given, in ONE transaction.

    For each ``table -> frame``: delete the table's rows with partition date in [start, end], then
    insert the frame's rows (matched by column name; in the table's sort order unless
    ``sort=False``, see :meth:`PartitionWriter.insert`). Every row of a frame must lie in
    [start, end]. Either every table is replaced or, on any error or crash, none is: the
    previous contents stay.
    """
    with replacing_partitions(con, start, end, list(frames)) as writer:
        for table, frame in frames.items():
            writer.insert(table, frame, sort=sort)


# ----------------------------------------------------------------------------------------------
# Event sources
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ColumnMap:
    """Names of the data-contract columns in a source (docs/ARCHITECTURE.md §3). ``stream=None``
    means one stream, called ``default``; otherwise a source without the stream column is an
    error (a renamed or mistyped column must not merge every stream into one)."""

    stream: str | None = "stream"
    event_id: str = "event_id"
    event_time: str = "event_time"
    score: str = "score"
    label: str = "label"

    @property
    def day_time(self) -> str:
        """The column whose date is a row's day (a table or Parquet glob source is split by it)."""
        return self.event_time

    def to_json(self) -> str:
        """The mapping as JSON (``calpipe_meta`` key ``columns``: what the code location reads)."""
        return json.dumps(
            {"stream": self.stream, "event_id": self.event_id, "event_time": self.event_time,
             "score": self.score, "label": self.label}, sort_keys=True,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> ColumnMap:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise StoreError(f"column map {text!r} is not a calpipe column map: {exc}") from None

    def required(self, names: list[str] | None = None) -> list[str]:
        """The columns every file or table must have (the stream's unless ``stream=None``);
        with the source's column ``names``, its score column is :meth:`score_in`'s."""
        score = self.score if names is None else self.score_in(names)
        req = [self.event_id, self.event_time, score, self.label]
        return req if self.stream is None else [self.stream, *req]

    def score_in(self, names: list[str]) -> str:
        """The score column of a source with columns ``names``: ``score`` (a float, or a list of
        K class probabilities), or by default ``scores`` (K classes) if there is no ``score``."""
        if self.score == "score" and "score" not in names and "scores" in names:
            return "scores"
        return self.score

    def check_file(self, path: Path) -> None:
        """InputError naming the file if its Parquet schema lacks a required column (exact
        name: a stream column renamed ``Stream`` must not merge every stream into one)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as exc:
            raise StoreError(f"reading {path}: not a readable Parquet file ({exc})") from exc
        names = schema.names
        if self.event_id in names and not _id_type_ok(schema.field(self.event_id).type):
            raise InputError(
                self.event_id, None, f"{path}: event ids must be integers or strings (UUIDs "
                f"read as strings) to be stored (the file has {schema.field(self.event_id).type})",
            )  # fmt: skip
        missing = [c for c in self.required(names) if c not in names]
        if missing:
            hint = " (one stream: --stream-col none)" if missing[0] == self.stream else ""
            raise InputError(
                missing[0], None, f"{path}: missing column (the file has {names}){hint}"
            )


def _id_type_ok(t) -> bool:
    """An Arrow type calpipe stores as an event id: integers (BIGINT), strings or UUIDs
    (VARCHAR: DuckDB reads a Parquet UUID as its string form)."""
    import pyarrow as pa

    if getattr(t, "extension_name", None) is not None:
        return t.extension_name == "arrow.uuid"
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


#: Name of the single stream of a source that has no stream column.
DEFAULT_STREAM = "default"

#: Column that :meth:`EventSource.read_range` adds: the day a row was read for.
DAY_COLUMN = "__calpipe_day"


@dataclass(frozen=True)
class EventSource:
    """Where scored events land: a Parquet landing folder (``date=YYYY-MM-DD/`` sub-folders), a
    Parquet file or glob, or a DuckDB table (``name`` or ``schema.name``) in the calpipe database.

    Use :meth:`parse` to build one from a command-line string.
    """

    kind: str  # "landing" | "parquet" | "csv" | "table"
    location: str
    columns: ColumnMap = field(default_factory=ColumnMap)

    @classmethod
    def parse(cls, text: str, columns: ColumnMap | None = None) -> EventSource:
        """``PATH`` of a folder with ``date=`` sub-folders -> landing; a ``.csv`` / ``.csv.gz``
        / ``.tsv`` file or glob -> csv (a header row; DuckDB's sniffer reads the types, the
        data contract checks them); ``*.parquet`` / a glob / a Parquet file -> parquet;
        anything else that is a SQL identifier -> table."""
        cm = columns or ColumnMap()
        p = Path(text).expanduser()
        if p.is_dir():
            return cls("landing", str(p.resolve()), cm)
        if text.lower().endswith(CSV_SUFFIXES):
            return cls("csv", str(p.resolve()) if p.exists() else text, cm)
        if text.endswith(".parquet") or any(ch in text for ch in "*?[") or p.is_file():
            return cls("parquet", str(p.resolve()) if p.exists() else text, cm)
        if _IDENT.match(text):
            return cls("table", text, cm)
        raise StoreError(
            f"events {text!r}: neither a folder, a Parquet or CSV file/glob, nor a table name"
        )

    def describe(self) -> str:
        return f"{self.kind} {self.location}"

    # -- raw reads -----------------------------------------------------------------------------
    def _landing_days(self) -> list[tuple[dt.date, Path]]:
        root = Path(self.location)
        if not root.is_dir():
            raise StoreError(f"landing folder {root} does not exist")
        out = []
        for sub in root.iterdir():
            if sub.is_dir() and sub.name.startswith("date="):
                # exactly date=YYYY-MM-DD: fromisoformat also takes 20240102, a folder the
                # reader (which looks for date=2024-01-02) then never read
                m = _DAY_FOLDER.fullmatch(sub.name)
                try:
                    out.append((dt.date.fromisoformat(m.group(1)), sub))
                except (AttributeError, ValueError):
                    raise StoreError(f"landing folder {sub}: not date=YYYY-MM-DD") from None
        return sorted(out)

    def landing_day_files(self, start: dt.date, end: dt.date) -> list[tuple[dt.date, Path]]:
        """(day, file) of every Parquet file of a landing folder's days in [start, end] (as
        :meth:`read_range` reads them)."""
        return [
            (d, f) for d, sub in self._landing_days() if start <= d <= end for f in day_files(sub)
        ]

    def relation_sql(self) -> str:
        """The source as a SQL relation (a Parquet file/glob or a table source)."""
        return self._relation_sql()

    def _relation_sql(self) -> str:
        if self.kind == "parquet":
            return f"read_parquet('{_sql_str(self.location)}', union_by_name = true)"
        if self.kind == "csv":
            return f"read_csv('{_sql_str(self.location)}', header = true, union_by_name = true)"
        if self.kind == "table":
            return ".".join(f'"{part}"' for part in self.location.split("."))
        raise StoreError(f"no relation for a {self.kind} source")

    def date_range(self, con: duckdb.DuckDBPyConnection) -> tuple[dt.date, dt.date] | None:
        """First and last event date of the source (None if it has no events)."""
        with self.reading():
            return self._date_range(con)

    @contextmanager
    def reading(self):
        """A DuckDB error while reading the source is a StoreError that names the source (and
        only then: the CLI used to label every database error "reading <source>")."""
        try:
            yield
        except duckdb.InterruptException:  # Ctrl-C mid-query: an interrupt, not a bad source
            raise
        except duckdb.Error as exc:
            raise StoreError(f"reading {self.describe()}: {exc}") from exc

    def _date_range(self, con: duckdb.DuckDBPyConnection) -> tuple[dt.date, dt.date] | None:
        if self.kind == "landing":
            days = [d for d, sub in self._landing_days() if day_files(sub)]
            return (days[0], days[-1]) if days else None
        t = sql_ident(self.columns.day_time)
        row = fetch_one(
            con,
            f"SELECT CAST(min({t}) AS DATE), CAST(max({t}) AS DATE) FROM {self._relation_sql()}",
        )
        return None if row is None or row[0] is None else (row[0], row[1])

    def read_raw(self, con: duckdb.DuckDBPyConnection, day: dt.date) -> pl.DataFrame:
        """The source's rows of one day, with the source's own column names."""
        raw = self.read_range(con, day, day)
        return raw.drop(DAY_COLUMN) if DAY_COLUMN in raw.columns else raw

    def read_range(
        self,
        con: duckdb.DuckDBPyConnection,
        start: dt.date,
        end: dt.date,
        part: tuple[int, int] | None = None,
    ) -> pl.DataFrame:
        """The source's rows of [start, end] with the source's column names plus
        :data:`DAY_COLUMN`, the day each row was read for (a landing file's folder date; the
        event's date for a file or table); with ``part = (i, k)``, those of the streams of part
        i of k (:func:`calpipe.landing.part_where`). One query for the range. An empty frame
        (no columns) if there is nothing."""
        where = part_where(self.columns.stream, part, DEFAULT_STREAM)
        with self.reading():
            return self._read_range(con, start, end, where)

    def _read_range(self, con, start: dt.date, end: dt.date, where: str) -> pl.DataFrame:
        if self.kind == "landing":
            files = []
            for day in iter_days(start, end):  # the range's folders, not the whole landing's
                sub = Path(self.location) / f"date={day.isoformat()}"
                files += [(day, f) for f in day_files(sub)] if sub.is_dir() else []
            if not files:
                return pl.DataFrame()
            for _, f in files:  # per file: union_by_name would fill a renamed column with nulls
                self.columns.check_file(f)
            # one query for the range (one a day cost ~2 ms a day): the files in day order, each
            # file's rows in order; each row's day from its file
            raw = read_parquet_files(con, [f for _, f in files], where)
            day_of = {i: day for i, (day, _) in enumerate(files)}
            days = raw[FILE_COLUMN].replace_strict(day_of, return_dtype=pl.Date)
            return raw.drop(FILE_COLUMN).with_columns(days.alias(DAY_COLUMN))
        t = sql_ident(self.columns.day_time)
        return query(
            con,
            f"SELECT *, CAST({t} AS DATE) AS {DAY_COLUMN} FROM {self._relation_sql()} "
            f"WHERE CAST({t} AS DATE) BETWEEN ? AND ? AND {where}",
            [start, end],
        )


_DAY_FOLDER = re.compile(r"date=(\d{4}-\d{2}-\d{2})")

#: CSV sources (compared in lower case): a header row, DuckDB's type sniffer.
CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")


def sql_ident(name: str) -> str:
    """A column name as a quoted SQL identifier (``--time-col`` was pasted into SQL as is)."""
    return '"' + name.replace('"', '""') + '"'


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def iter_days(start: dt.date, end: dt.date) -> Iterator[dt.date]:
    """Every calendar day of [start, end]."""
    d = start
    while d <= end:
        yield d
        d += dt.timedelta(days=1)


def normalize_events(raw: pl.DataFrame, columns: ColumnMap) -> pl.DataFrame:
    """Rename a source's columns to the data contract and check the ones calpipe stores.

    Returns columns ``stream, event_id, event_time, score, label`` (String, Int64 or String,
    Datetime(us), source score dtype: a float or K-class vectors, source label dtype); raises InputError for a missing column
    or an event id that is not an integer.
    """
    cm = columns
    score = cm.score_in(raw.columns)
    needed = [cm.event_id, cm.event_time, score, cm.label]
    if raw.width == 0:
        return pl.DataFrame(
            schema={
                "stream": pl.String, "event_id": pl.Int64, "event_time": pl.Datetime("us"),
                "score": pl.Float64, "label": pl.Int32,
            }
        )  # fmt: skip
    if cm.stream is not None:  # no stream column means one stream only when asked for
        needed = [cm.stream, *needed]
    for c in needed:
        if c not in raw.columns:
            hint = " (one stream: --stream-col none)" if c == cm.stream else ""
            raise InputError(c, None, f"missing column (the source has {raw.columns}){hint}")
    id_type = raw.schema[cm.event_id]
    string_ids = id_type in (pl.String, pl.Categorical) or isinstance(id_type, pl.Enum)
    if not (id_type.is_integer() or string_ids):
        raise InputError(
            cm.event_id,
            None,
            f"event ids must be integers or strings to be stored (got {id_type})",
        )
    if raw.schema[cm.event_id] == pl.UInt64:  # ids >= 2^63 do not fit the stored Int64
        big = raw.select((pl.col(cm.event_id) > 2**63 - 1).arg_true().first()).item()
        if big is not None:
            raise InputError(
                cm.event_id, int(big), f"event id {raw[cm.event_id][big]} does not fit a signed "
                "64-bit integer (the stored type)",
            )  # fmt: skip
    if not raw.schema[cm.event_time].is_temporal():
        raise InputError(
            cm.event_time,
            None,
            f"event_time must be a Date or Datetime (got {raw.schema[cm.event_time]})",
        )
    t = pl.col(cm.event_time)
    tz = getattr(raw.schema[cm.event_time], "time_zone", None)
    if tz is not None:  # stored as naive UTC
        t = t.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    stream = (
        pl.lit(DEFAULT_STREAM, pl.String)
        if cm.stream is None
        else pl.col(cm.stream).cast(pl.String)
    )
    return raw.select(
        stream.alias("stream"),
        pl.col(cm.event_id).cast(pl.String if string_ids else pl.Int64).alias("event_id"),
        t.cast(pl.Datetime("us")).alias("event_time"),
        pl.col(score).alias("score"),
        pl.col(cm.label).alias("label"),
    )
