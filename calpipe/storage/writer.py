"""Transactional partition writes: whole partitions replaced in one transaction, rows inserted in the background.

Every write replaces whole partitions in **one transaction** (``BEGIN; DELETE ...; INSERT ...;
COMMIT``): a crash or a ``SIGKILL`` in the middle leaves the previous contents of every table
intact, and re-running a partition writes identical rows (rows are inserted in a fixed order).
A long range is written one day at a time inside its transaction
(:func:`replacing_partitions`), so memory is bounded by a day, not by the range.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress

import duckdb
import polars as pl
import polars.selectors as cs

from calpipe.errors import StoreError
from calpipe.storage.session import rollback
from calpipe.storage.tables import PARTITION_COLUMN, SORT_KEYS, check_table, table_columns

#: A partition writer sends a table's buffered rows to DuckDB once it holds this many: small
#: days (the demo's) are inserted a chunk at a time (a few INSERTs, not one per day and table),
#: while a big day is inserted at once and freed, so memory stays bounded by about a day.
WRITE_FLUSH_ROWS: int = 500_000

#: INSERTs a background partition writer may have queued: 2 lets DuckDB write a batch's events
#: and the previous batch's protected rows while the engine runs (10M-event day: -5 % time),
#: and bounds the frames held for it to two batches.
WRITE_MAX_PENDING: int = 2


class PartitionWriter:
    """Inserts rows into the partitions that :func:`replacing_partitions` is replacing.

    Only valid inside its ``with`` block (the open transaction). Rows are buffered per table and
    sent to DuckDB once a table holds :data:`calpipe.WRITE_FLUSH_ROWS` rows, and at the
    end of the block: a long range of small days costs a few INSERTs, and a big day is sent at
    once, so a caller writing one day at a time keeps about one day in memory (DuckDB writes the
    transaction's full row groups to the database file; it keeps ~11 bytes a row until the
    commit).

    With ``background=True`` the INSERTs run in a worker thread (DuckDB releases the GIL), one at
    a time and in order, at most :data:`calpipe.WRITE_MAX_PENDING` queued, while the
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
        if sum(f.height for f in self._buffer[table]) >= WRITE_FLUSH_ROWS:
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
            while len(self._pending) >= WRITE_MAX_PENDING:
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
    >>> from pathlib import Path
    >>> from calpipe.storage import connect
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
        check_table(table)
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
