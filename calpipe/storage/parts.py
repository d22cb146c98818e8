"""A big night's rows read once and split into its parts (docs/ARCHITECTURE.md §5).

A night too big to hold at once runs in ``k`` parts of whole streams
(:func:`calpipe.storage.landing.part_sql`). Reading each part with its own filtered query read
the day's files ``k`` times: every row decoded and hashed once per part (a 10M-event day in 7
parts: 2.45 CPU-s for the events instead of 0.66, and as much again for a 10M-label feed; on
remote storage, ``k`` times the bytes). A :class:`PartSpool` runs the read once, splits each
Arrow batch by part as DuckDB streams it, and appends each part's rows to an Arrow IPC file of
its own in a folder of the database's spill directory, so memory holds one batch rather than
the day (the ``<= 4x`` peak targets hold); each part is read back from its file, in the rows'
order in the read, equal to what the part's filtered query returns.

The folder is DuckDB's ``temp_directory`` of the run's database (``<db>.tmp`` unless set), where
DuckDB spills the same data; :func:`spill_folder` finds it. A spool removes its folder when
closed; one left by a killed run is removed by the next spool made in the same directory
(:func:`PartSpool.create`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from calpipe.errors import StoreError
from calpipe.storage.session import fetch_one

#: Rows per Arrow batch of a spooled read: a batch in flight is all a spool holds in memory
#: (~45 MB of events); DuckDB streams one row group (~123k rows) per batch below it anyway.
SPOOL_BATCH_ROWS: int = 1_000_000

#: The column a spooled read carries each row's part in (dropped before the rows are stored).
PART_COLUMN = "__calpipe_part"

_PREFIX = "calpipe-parts-"

#: The spool's Arrow buffers come from malloc, which returns a freed batch or part to the
#: system; pyarrow's default pool (mimalloc) keeps freed buffers for reuse, which a read
#: done once per night never has.
_POOL = pa.system_memory_pool()


def spill_folder(con: duckdb.DuckDBPyConnection) -> Path:
    """Where ``con``'s database spills (DuckDB's ``temp_directory``), absolute: the folder a
    :class:`PartSpool` of its nights goes in."""
    row = fetch_one(con, "SELECT current_setting('temp_directory')")
    text = row[0] if row and row[0] else tempfile.gettempdir()
    return Path(text).expanduser().resolve()


class PartSpool:
    """The rows of one query, read once, split into the ``k`` parts of their stream.

    ``read(i)`` returns part ``i``'s rows, in their order in the query's result, as the
    query filtered by ``part_sql(stream_sql, (i, k))`` would (same columns and types).

    >>> import duckdb, tempfile
    >>> con = duckdb.connect()
    >>> sql = "SELECT 's' || (range % 3) AS stream, range AS x FROM range(6)"
    >>> with PartSpool.create(con, sql, "stream", 2, tempfile.mkdtemp()) as spool:
    ...     sorted(spool.read(0)["x"].to_list() + spool.read(1)["x"].to_list()), spool.rows
    ([0, 1, 2, 3, 4, 5], 6)
    """

    def __init__(
        self, folder: Path, k: int, rows: int, schema: pa.Schema, files: list | None = None,
        made_directory: bool = False,
    ) -> None:  # fmt: skip
        self.folder, self.k, self.rows, self._schema = folder, k, rows, schema
        #: whether the spool made its directory (then :meth:`close` removes it if empty: a
        #: night in parts left an empty ``<db>.tmp`` beside the database)
        self.made_directory = made_directory
        #: a landing read's ``(day, file)`` pairs in the numbering of its ``FILE_COLUMN``
        #: (as listed when the rows were read: a part's rows are named by them)
        self.files = files or []

    @classmethod
    def create(
        cls,
        con: duckdb.DuckDBPyConnection,
        sql: str,
        stream_sql: str,
        k: int,
        directory: Path | str,
        params: list | None = None,
        files: list | None = None,
    ) -> PartSpool:
        """Run ``sql`` (with ``params``) once on ``con`` and store its rows by part in a new
        folder of ``directory``. ``stream_sql``: the SQL expression of a row's stream name
        (:func:`calpipe.storage.landing.stream_sql`); ``files``: kept as :attr:`files`."""
        if not 1 <= k <= 256:
            raise ValueError(f"k must be in 1..256, got {k}")
        directory = Path(directory)
        try:
            made = not directory.exists()
            directory.mkdir(parents=True, exist_ok=True)
            _remove_orphans(directory)
            folder = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=directory))
        except OSError as exc:
            raise _spill_error(directory, exc) from exc
        try:
            part = f"CAST(hash(CAST({stream_sql} AS VARCHAR)) % {k} AS UTINYINT)"
            reader = con.sql(f"SELECT *, {part} AS {PART_COLUMN} FROM ({sql})", params=params)
            batches = reader.to_arrow_reader(SPOOL_BATCH_ROWS)
            schema = _view_schema(
                batches.schema.remove(batches.schema.get_field_index(PART_COLUMN))
            )
            rows = _split(batches, schema, k, folder)
        except BaseException as exc:
            shutil.rmtree(folder, ignore_errors=True)
            if isinstance(exc, OSError):  # (a full disk)
                raise _spill_error(directory, exc) from exc
            raise
        return cls(folder, k, rows, schema, files, made)

    def read(self, i: int) -> pl.DataFrame:
        """Part ``i``'s rows (an empty frame of the read's columns if it has none)."""
        if not 0 <= i < self.k:
            raise ValueError(f"part {i} of a spool of {self.k} parts")
        path = self.folder / f"{i}.arrow"
        if not path.exists():
            if not self.folder.exists():
                raise StoreError(f"the parts of this read were removed ({self.folder})")
            return pl.from_arrow(self._schema.empty_table())
        with pa.OSFile(str(path), memory_pool=_POOL) as f:
            table = pa.ipc.open_file(f, memory_pool=_POOL).read_all()
        return pl.from_arrow(table, rechunk=False)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.made_directory:
            # (only if empty: DuckDB may have spilled into it meanwhile, or another spool)
            with contextlib.suppress(OSError):
                self.folder.parent.rmdir()

    def __enter__(self) -> PartSpool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _split(batches: pa.RecordBatchReader, schema: pa.Schema, k: int, folder: Path) -> int:
    """Append each batch's rows of part i to ``folder/i.arrow`` (opened at a part's first
    row), keeping their order; the number of rows."""
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    rows = 0
    try:
        for batch in batches:
            part = batch.column(PART_COLUMN).to_numpy(zero_copy_only=False)
            rows += batch.num_rows
            # a stable sort by part keeps each part's rows in their order in the read
            order = np.argsort(part, kind="stable")
            counts = np.bincount(part, minlength=k)
            grouped = pc.take(batch.drop_columns([PART_COLUMN]), order, memory_pool=_POOL)
            grouped = pa.RecordBatch.from_arrays(
                [
                    pc.cast(c, f.type, memory_pool=_POOL)
                    for c, f in zip(grouped.columns, schema, strict=True)
                ],
                schema=schema,
            )
            start = 0
            for i in np.flatnonzero(counts):
                if i not in writers:
                    writers[i] = pa.ipc.new_file(str(folder / f"{i}.arrow"), schema)
                writers[i].write_batch(grouped.slice(start, int(counts[i])))
                start += int(counts[i])
    finally:
        for w in writers.values():
            w.close()
    return rows


def _spill_error(directory: Path, exc: OSError) -> StoreError:
    return StoreError(
        f"a night in parts spools its read in {directory} (the database's spill folder, "
        f"DuckDB's temp_directory) and could not: {exc}. Free space there or SET "
        "temp_directory to a folder with room for the night's rows"
    )


def _view_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its string columns as Arrow string views: polars takes those without a
    copy (``string`` columns are copied into polars' views, the part twice in memory while it
    converts: 3M rows of a stream name and a float took 84 MB that way, 36 MB as views)."""
    strings = (pa.string(), pa.large_string())
    return pa.schema(
        [f.with_type(pa.string_view()) if f.type in strings else f for f in schema],
        metadata=schema.metadata,
    )


def _remove_orphans(directory: Path) -> None:
    """Remove the spool folders in ``directory`` of processes that no longer run (a killed
    run's)."""
    for sub in directory.glob(f"{_PREFIX}*"):
        pid = sub.name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(sub, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
