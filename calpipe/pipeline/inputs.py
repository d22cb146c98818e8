"""Table ``pipeline_inputs``: what each day was computed from, and which days must be replayed.

A day's result depends on its inputs and on the state of the day before. Both can change after
the day ran: a corrected or late landing (its files), or a re-run of an earlier day (its state).
Neither may go unnoticed, so the pipeline records

* per day, the inputs it read (:func:`source_inputs`): for a landing folder one row per file (its
  path relative to the folder, size, modification time, SHA-256 of its bytes, and rows from the
  Parquet footer); for a Parquet glob or a table, one row per day (its row count and an
  order-independent hash of its rows, computed by DuckDB). They are written with the day's other
  tables, in its transaction (:func:`calpipe.pipeline.run_range`);
* per day, a hash chain of the state (``pipeline_days.state_hash``: the SHA-256 of the previous
  day's ``state_hash`` and of the day's ``calibrator_state`` rows, :func:`state_digest`) and the
  ``prev_state_hash`` the day started from. Day d is **stale** when its ``prev_state_hash`` is not
  the ``state_hash`` of day d - 1 any more: day d - 1 was recomputed to another state after day d
  ran. Re-running a day to the same state changes nothing (a re-run stays idempotent).

:func:`replay_start` compares the source now with what was recorded and returns the earliest day
that changed (or is stale); ``calpipe run`` replays from it through the source's last day, or,
with ``--no-replay``, refuses with the exact command (:class:`ReplayRequired`). A landing file
rewritten with its size and modification time unchanged is not re-hashed (as ``make`` trusts
them): touch it, or run the days again with ``--start``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from calpipe import storage
from calpipe.errors import StateError
from calpipe.storage import EventSource

#: Block size of the SHA-256 of a landing file (pipeline/inputs.py): 1 MiB reads keep the hash
#: at disk speed with a small buffer.
HASH_BLOCK_BYTES: int = 1 << 20

#: ``pipeline_inputs.kind`` of the scored events' files, and of the label feed's
#: (:data:`calpipe.pipeline.labels.LABELS`).
SCORES = "scores"
LABELS = "labels"

_INPUT_SCHEMA = {
    "date": pl.Date,
    "kind": pl.String,
    "file": pl.String,
    "size_bytes": pl.Int64,
    "mtime_ns": pl.Int64,
    "content_hash": pl.String,
    "n_rows": pl.Int64,
}


class ReplayRequired(StateError):
    """Stored days whose inputs or previous state changed since they ran: ``day`` is the first,
    ``reason`` says why. ``calpipe run`` replays from ``day`` unless told ``--no-replay``."""

    def __init__(self, day: dt.date, reason: str, message: str):
        self.day, self.reason = day, reason
        super().__init__(message)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK_BYTES):
            h.update(block)
    return h.hexdigest()


def _parquet_rows(path: Path) -> int:
    """Rows in a Parquet file's footer; StoreError naming the file if it is not Parquet."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise storage.StoreError(f"reading {path}: not a readable Parquet file ({exc})") from exc


def run_inputs(
    con, source: EventSource, labels: EventSource | None, start: dt.date, end: dt.date
) -> pl.DataFrame:
    """The ``pipeline_inputs`` rows of a run over [start, end]: the scored events' and, with a
    label feed, the labels' (:func:`source_inputs` of each)."""
    known = recorded_inputs(con, start, end)
    rows = source_inputs(con, source, start, end, known)
    if labels is not None:
        rows = pl.concat([rows, source_inputs(con, labels, start, end, known, LABELS)])
    return rows


def source_inputs(
    con,
    source: EventSource,
    start: dt.date,
    end: dt.date,
    known: pl.DataFrame | None = None,
    kind: str = SCORES,
) -> pl.DataFrame:
    """The ``pipeline_inputs`` rows of the source's days in [start, end], as the source is now
    (``kind``: ``scores``, or ``labels`` for the label feed).

    ``known``: rows recorded earlier; a landing file whose path, size and modification time
    match one of them keeps its hash and row count (no read). Table and glob sources are
    fingerprinted by one DuckDB aggregate over the range."""
    if source.kind == "landing":
        seen = {}
        if known is not None and known.height:
            for r in known.filter(pl.col("kind") == kind).iter_rows(named=True):
                seen[(r["date"], r["file"], r["size_bytes"], r["mtime_ns"])] = r
        root = Path(source.location)
        rows = []
        for d, f in source.landing_day_files(start, end):
            st = os.stat(f)
            rel = f.relative_to(root).as_posix()
            old = seen.get((d, rel, st.st_size, st.st_mtime_ns))
            if old is None:
                digest, n = _sha256(f), _parquet_rows(f)
            else:
                digest, n = old["content_hash"], old["n_rows"]
            rows.append((d, kind, rel, st.st_size, st.st_mtime_ns, digest, n))
        return pl.DataFrame(rows, schema=_INPUT_SCHEMA, orient="row")
    rel = source.relation_sql()
    names = storage.query(con, f"SELECT * FROM {rel} LIMIT 0").columns
    t = storage.sql_ident(source.columns.day_time)
    cols = ", ".join(storage.sql_ident(c) for c in names)
    frame = storage.query(
        con,
        f"""SELECT CAST({t} AS DATE) AS date, count(*) AS n_rows,
                   CAST(sum(hash({cols})) AS VARCHAR) AS content_hash
            FROM {rel} WHERE CAST({t} AS DATE) BETWEEN ? AND ? GROUP BY 1 ORDER BY 1""",
        [start, end],
    )
    return frame.select(
        "date",
        pl.lit(kind).alias("kind"),
        pl.lit("").alias("file"),
        pl.lit(None, pl.Int64).alias("size_bytes"),
        pl.lit(None, pl.Int64).alias("mtime_ns"),
        "content_hash",
        "n_rows",
    ).cast(_INPUT_SCHEMA)


def recorded_inputs(con, start: dt.date, end: dt.date) -> pl.DataFrame:
    """The ``pipeline_inputs`` rows recorded for [start, end]."""
    return storage.read_partitions(con, "pipeline_inputs", start, end).cast(_INPUT_SCHEMA)


def _changes(
    recorded: pl.DataFrame, current: pl.DataFrame, days: list[dt.date]
) -> tuple[dict, dict]:
    """Per day of ``days`` whose inputs differ: why (the first differing file); split into the
    days with a changed or new input, and the days whose inputs were only removed."""
    key = ["date", "kind", "file"]
    j = recorded.select(*key, pl.col("content_hash").alias("was")).join(
        current.select(*key, pl.col("content_hash").alias("now")),
        on=key, how="full", coalesce=True, nulls_equal=True,
    ).filter(pl.col("date").is_in(days) & pl.col("was").ne_missing(pl.col("now")))  # fmt: skip
    changed: dict[dt.date, str] = {}
    removed: dict[dt.date, str] = {}
    for r in j.sort(key).iter_rows(named=True):
        what = f"{r['kind']} file {r['file']!r}" if r["file"] else f"{r['kind']} rows"
        if r["was"] is None:
            changed.setdefault(r["date"], f"{what} appeared after the day ran")
        elif r["now"] is None:
            removed.setdefault(r["date"], f"{what} was removed after the day ran")
        else:
            changed.setdefault(r["date"], f"{what} changed after the day ran")
    return changed, {d: why for d, why in removed.items() if d not in changed}


class SourceRemoved(StateError):
    """A replay would recompute stored days whose inputs were removed since they ran (a
    retention policy deleted old landing folders): their stored rows would be lost. ``days``:
    the first such day and why. Refused unless the run is told ``--replay-deleted``."""

    def __init__(self, day: dt.date, why: str, message: str):
        self.day, self.why = day, why
        super().__init__(message)


def check_removed_inputs(
    con, current: pl.DataFrame, start: dt.date, end: dt.date, *, replay_deleted: bool = False
) -> None:
    """:class:`SourceRemoved` if a run over [start, end] given explicitly (``calpipe run
    --start``, a dagster partition), with the sources' inputs ``current`` (:func:`run_inputs`),
    would recompute a stored day whose inputs were only removed since it ran: its stored rows
    would be lost as silently as by a replay (:func:`replay_start`). ``replay_deleted``: the
    named choice to recompute such days without those inputs."""
    if replay_deleted:
        return
    days = storage.query(
        con,
        "SELECT date FROM pipeline_days WHERE date BETWEEN ? AND ? AND state_hash IS NOT NULL",
        [start, end],
    )["date"].to_list()
    if not days:
        return
    _, removed = _changes(recorded_inputs(con, start, end), current, days)
    if removed:
        d = min(removed)
        raise SourceRemoved(
            d, removed[d],
            f"days {start} .. {end}: recomputing day {d}, whose inputs were removed "
            f"({removed[d]}), would delete its stored rows: restore those inputs, start after "
            f"it, or run with --replay-deleted to recompute the days without them (nothing was "
            f"written)",
        )  # fmt: skip


def replay_start(
    con,
    source: EventSource,
    first_day: dt.date,
    current: pl.DataFrame,
    *,
    replay_deleted: bool = False,
    log=None,
) -> tuple[dt.date, str] | None:
    """The earliest stored day to recompute, and why: its inputs differ from what it was
    computed from (``current``: :func:`source_inputs` over the stored days), or it is stale (day
    d - 1 was recomputed to another state after it ran). None if every stored day is current.
    Days computed before calpipe recorded inputs (no ``state_hash``) are not compared."""
    days = storage.query(
        con,
        "SELECT date, state_hash, prev_state_hash, lag(state_hash) OVER (ORDER BY date) AS "
        "before FROM pipeline_days WHERE date >= ? ORDER BY date",
        [first_day],
    )
    tracked = days.filter(pl.col("state_hash").is_not_null())
    found: list[tuple[dt.date, str]] = []
    if tracked.height:
        lo, hi = tracked["date"].min(), tracked["date"].max()
        changes, removed = _changes(
            recorded_inputs(con, lo, hi), current, tracked["date"].to_list()
        )
        if replay_deleted:
            changes |= removed
        elif removed:
            # a source that disappeared (retention) keeps its stored days: recomputing them
            # would delete their rows and redo every later day
            d0, why = min(removed.items())
            if log is not None:
                log(
                    f"{len(removed)} stored day(s) from {d0} on have inputs that were removed "
                    f"({why}): their stored rows are kept (--replay-deleted recomputes them "
                    "without those inputs)"
                )
        found += sorted(changes.items())[:1]
    stale = tracked.filter(
        pl.col("prev_state_hash").is_not_null() & pl.col("before").is_not_null()
        & (pl.col("prev_state_hash") != pl.col("before"))
    )  # fmt: skip
    if stale.height:
        d = stale["date"][0]
        found.append(
            (d, f"it ran from a state of {d - dt.timedelta(days=1)} that was recomputed since")
        )
    if not found:
        return None
    start = min(found)
    if not replay_deleted and tracked.height and removed:
        later = sorted(d for d in removed if d >= start[0])
        if later:
            raise SourceRemoved(
                later[0], removed[later[0]],
                f"day {start[0]}: {start[1]}; replaying from it would recompute day {later[0]}, "
                f"whose inputs were removed ({removed[later[0]]}), and delete its stored rows: "
                f"restore those inputs, or run with --replay-deleted to recompute the days "
                f"without them (nothing was written)",
            )  # fmt: skip
    return start
