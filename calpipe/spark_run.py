"""The nightly run on Spark (``calpipe spark-run``, the dagster Spark assets): every table of a
night through the night function, inside a cogroup (extra ``calpipe[spark]``).

Night d is one cogroup over hash buckets of the stream names (:mod:`calpipe.spark`): the
night's events on one side; on the other, the state of night d - 1 (one row per stream) and
the labels that arrived on night d, each beside what was stored for its event on the nights
before (the lookup ``calpipe run`` makes in DuckDB, made here by joins with the tables already
written). Each bucket is a part of whole streams of the night and runs
:func:`calpipe.night.phases.night_part`, the function ``calpipe run`` calls, and each table's
rows come from the registry's one function of that table
(:func:`calpipe.pipeline.tables.phase_rows`): the rows of a stream are those of ``calpipe run``,
bit for bit (``tests/spark/test_standalone_cluster.py`` compares every table). What needs all
the streams of the night is made on the driver from the buckets' small outputs: the
``pipeline_days`` row (counts, and the state hash over the night's ``calibrator_state`` rows,
collected to the driver: the streams that changed that night, ~1-6 KB each).

Written under ``OUT``: a folder per table, partitioned as ``calpipe run`` stores it (column
``event_date`` or ``date``: :data:`calpipe.storage.LAYOUT`), each night's partition replaced
whole (Parquet: the partition folder overwritten; Delta: ``replaceWhere``), and ``OUT/state``,
the state of every stream at the end of each night (the next night's input, and what a re-run
of night d reads). Not written: ``pipeline_inputs`` (the input files ``calpipe run`` hashes to
find a changed day; a Spark chain is re-run by the days it names).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from calpipe import spark as cs
from calpipe import storage
from calpipe.errors import CalpipeError, InputError, ParameterError, StateError, StoreError
from calpipe.night.arrivals import FORECASTS, Arrivals, check_raw_labels, checked_arrivals
from calpipe.night.chain import Chain
from calpipe.night.changes import with_detector
from calpipe.night.classes import score_column
from calpipe.night.events import check_event_days, event_schema
from calpipe.night.phases import Transaction, night_part
from calpipe.night.settings import Settings
from calpipe.pipeline.ids import ID_COLUMNS
from calpipe.pipeline.labels import ON_UNKNOWN
from calpipe.pipeline.nightly import PROTECT_BATCH_ROWS
from calpipe.pipeline.tables import TABLES, phase_rows, table_schemas

#: Table formats :func:`run_days` writes.
TABLE_FORMATS = ("parquet", "delta")

#: The tables a Spark night writes: the registry's, but ``pipeline_inputs`` (module docstring).
SPARK_TABLES: tuple[str, ...] = tuple(t for t in TABLES if t != "pipeline_inputs")

#: The folder of the state of every stream at the end of each night (``OUT/state/date=...``).
STATE = "state"

#: Outputs of a bucket besides the tables: its streams' state at the end of the night, and its
#: counts (events, active streams, labels, streams).
_CARRY, _COUNTS = "__carry", "__counts"
_KINDS = (*SPARK_TABLES, _CARRY, _COUNTS)

#: Which row of the cogroup's side is a state row or a label.
_SIDE = "__calpipe_side"
_STATE_ROW, _LABEL_ROW = 0, 1
#: Prefix of a label's columns on the side (beside the state's own names).
_L = "__l_"

_DUCKDB_TYPES = {
    "VARCHAR": pl.String, "BIGINT": pl.Int64, "INTEGER": pl.Int32, "DOUBLE": pl.Float64,
    "DATE": pl.Date, "TIMESTAMP": pl.Datetime("us"), "BOOLEAN": pl.Boolean,
}  # fmt: skip


def _polars_type(duckdb_type: str) -> pl.DataType:
    if duckdb_type.endswith("[]"):
        return pl.List(_polars_type(duckdb_type[:-2]))
    return _DUCKDB_TYPES[duckdb_type]


def table_schema(table: str, id_type: pl.DataType) -> pl.Schema:
    """The polars schema of ``table`` as ``calpipe run`` stores it (its DDL), with event ids of
    ``id_type`` (Int64 or String)."""
    cols = {c: _polars_type(t) for c, t in table_schemas()[table]}
    if table in ID_COLUMNS:
        cols[ID_COLUMNS[table]] = id_type
    return pl.Schema(cols)


def _conform(rows: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """``rows`` in the table's columns and types; a column the rows lack (the binary form has
    no ``scores``, an empty part may have no columns) is null, as DuckDB stores it."""
    return pl.DataFrame(
        [
            rows[c].cast(t) if c in rows.columns else pl.Series(c, [None] * rows.height, t)
            for c, t in schema.items()
        ],
        schema=schema,
    )


@dataclass(frozen=True)
class _NightBucket:
    """What runs in a Python worker for one bucket of night ``day``: its streams' events, state
    and labels through the night function, returning each table's rows (and the bucket's state
    and counts) as Arrow IPC slices (:func:`calpipe.spark.pack_rows`)."""

    chain: Chain
    day: dt.date
    source: str
    labels: str
    on_unknown: str
    id_type: pl.DataType
    state_schema: pl.Schema
    label_columns: tuple[str, ...]
    #: the schema of each table's rows (:func:`table_schema`)
    schemas: dict[str, pl.Schema]

    def __call__(self, events: pa.Table, side: pa.Table) -> pa.Table:
        k = self.chain.n_classes
        schema = {**event_schema(k != 2), "event_id": self.id_type}
        ev = pl.from_arrow(events)
        if ev.height:
            # the columns as read: the engine validates their types and values (a label 0.5
            # is refused, not cast to 0), as calpipe run's are; only the stream name and the
            # id take the stored types (as calpipe run's source normalizes them)
            ev = ev.select(
                pl.lit(self.day, pl.Date).alias("event_date"),
                pl.col("stream").cast(pl.String),
                pl.col("event_id").cast(self.id_type),
                *[c for c in schema if c not in ("event_date", "stream", "event_id")],
            )
            check_event_days(ev, self.source)
        else:  # a bucket of idle streams: the cogroup's empty side has no columns
            ev = pl.DataFrame(schema=schema)
        side = pl.from_arrow(side) if side.num_rows else None
        state = arrivals = None
        if side is not None:
            rows = side.filter(pl.col(_SIDE) == _STATE_ROW)
            if rows.height:
                state = rows.select(self.state_schema.names()).cast(dict(self.state_schema))
            labels = side.filter(pl.col(_SIDE) == _LABEL_ROW)
            if labels.height:
                arrivals = self._arrivals(labels, ev)
                late = arrivals.late
                if state is None and late.height:  # (their events are of earlier nights)
                    r = late.row(0, named=True)
                    raise StateError(
                        f"labels {self.labels}, day {self.day}, stream {r['stream']!r}, event "
                        f"{r['event_id']}: a label of an event of {r['event_date']}, but the "
                        f"state of {self.day - dt.timedelta(days=1)} has no row of its stream "
                        "(run the nights from the chain's first day in order)"
                    )
        out: dict[str, list[pl.DataFrame]] = {t: [] for t in _KINDS}
        night = night_part(self.chain, self.day, ev, state, arrivals, self.source,
                           PROTECT_BATCH_ROWS)  # fmt: skip
        del ev
        for phase, context in night:
            if phase == "part":
                done = context
                continue
            for t, rows in phase_rows(phase, context):
                out[t.name].append(rows)
            del context
        out["calibrator_state"].append(done.rows)
        out["calibration_arrivals"].append(done.arrival_rows)
        for t, rows in phase_rows("transaction", Transaction(self.chain.settings, done.rows)):
            out[t.name].append(rows)
        out[_CARRY].append(done.state)
        counts = {"n_events": done.n_events, "n_active": done.n_active,
                  "n_labels": done.n_labels, "n_streams": done.state.height}  # fmt: skip
        out[_COUNTS].append(pl.DataFrame({c: [v] for c, v in counts.items()}))
        packed = []
        for i, kind in enumerate(_KINDS):
            full = [f for f in out[kind] if f.height]
            if not full:
                continue
            rows = pl.concat(full, how="diagonal_relaxed")
            if kind == _CARRY:
                rows = rows.select(self.state_schema.names()).cast(dict(self.state_schema))
            elif kind != _COUNTS:
                rows = _conform(rows, self.schemas[kind])
            packed += cs.pack_rows(i, rows)
        kinds = pa.array([i for i, _ in packed], pa.int8())
        return pa.table({cs.KIND: kinds, cs.BLOB: pa.array([b for _, b in packed], pa.binary())})

    def _arrivals(self, labels: pl.DataFrame, events: pl.DataFrame) -> Arrivals:
        """The bucket's labels checked as ``calpipe run`` checks a night's (in the files'
        order: by file, then the file's rows)."""
        labels = labels.select(
            pl.col(_L + c).alias(c) if c != "stream" else pl.col("stream")
            for c in self.label_columns
        ).sort("file", "__row")
        k = self.chain.n_classes
        files = sorted(labels["file"].unique().to_list())
        raw = labels.select(
            "stream", pl.col("event_id").cast(self.id_type), "__y", "label_time",
            pl.col("file").cast(pl.Enum(files)),
        )  # fmt: skip
        raw = check_raw_labels(raw, self.day, self.labels, k)
        found = labels.select(
            "event_date", "event_time", score_column(k), "row_label", "prev_label", "prev_date",
            *FORECASTS,
        )  # fmt: skip
        return checked_arrivals(raw, found, events, self.day, self.labels, k, self.on_unknown)


def landing_days(root: str) -> list[dt.date]:
    """The days of a local landing folder (its ``date=YYYY-MM-DD`` sub-folders), in order."""
    p = Path(root)
    if not p.is_dir():
        raise InputError(None, None, f"landing folder {root} does not exist")
    found = (_LANDING_DAY.match(c.name) for c in p.iterdir())
    return sorted(dt.date.fromisoformat(m[1]) for m in found if m)


_LANDING_DAY = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


def _check_format(spark, table_format: str) -> None:
    """Refuse an unknown format, or Delta on a session without Delta Lake (before any write)."""
    if table_format not in TABLE_FORMATS:
        raise ParameterError(
            f"table_format must be one of {', '.join(TABLE_FORMATS)}, got {table_format!r}"
        )
    if table_format != "delta":
        return
    # Spark's public reader resolves the format first: without Delta Lake the load fails with
    # DATA_SOURCE_NOT_FOUND, with it on the missing path (no private py4j handle needed)
    try:
        spark.read.format("delta").load(f"/calpipe-probe-{os.getpid()}-does-not-exist")
    except Exception as exc:  # an AnalysisException, or py4j's wrap of Spark's class lookup
        condition = getattr(exc, "getCondition", lambda: None)()
        if condition != "DATA_SOURCE_NOT_FOUND" and "[DATA_SOURCE_NOT_FOUND]" not in str(exc):
            return  # Delta resolved; the probe's path does not exist
        raise CalpipeError(
            "table_format='delta' needs Delta Lake on this Spark session: start it with the "
            "delta-spark package (spark.jars.packages io.delta:delta-spark_2.13:<version>) and "
            "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension, or write Parquet "
            "(table_format='parquet'); nothing was written"
        ) from exc


def _write_night(frame, path: str, column: str, d: dt.date, table_format: str) -> None:
    """Replace night ``d``'s partition (``column = d``) of the table at ``path`` with ``frame``
    (its rows of that night, ``column`` among them), even by no rows: Parquet by overwriting the
    partition's folder, Delta by ``replaceWhere`` (one atomic commit)."""
    if table_format == "delta":
        frame.write.format("delta").mode("overwrite").partitionBy(column).option(
            "partitionOverwriteMode", "static"
        ).option("replaceWhere", f"{column} = DATE'{d.isoformat()}'").save(path)
    else:
        frame.drop(column).write.mode("overwrite").parquet(f"{path}/{column}={d.isoformat()}")


def _read_table(spark, path: str, table_format: str):
    """The table at ``path`` as written by :func:`run_days` (None if there is none yet)."""
    from pyspark.errors import AnalysisException

    if "://" not in path and not Path(path).exists():  # (a local folder: no JVM error logged)
        return None
    try:
        if table_format == "delta":
            return spark.read.format("delta").load(path)
        return spark.read.parquet(path)
    except AnalysisException:
        return None


def read_state(spark, out: str, day: dt.date, table_format: str = "parquet"):
    """The state of every stream at the end of ``day`` written by :func:`run_days` under
    ``out`` (None if that night has none: the chain's first day)."""
    F, _ = cs.spark_modules()
    table = _read_table(spark, f"{out}/{STATE}", table_format)
    if table is None:
        return None
    rows = table.where(F.col("date") == F.lit(day)).drop("date")
    return rows if rows.limit(1).count() else None


def _spark_schema(schema: pl.Schema):
    _, T = cs.spark_modules()
    return T.StructType(cs.spark_fields(schema))


def _history(spark, out: str, table: str, d: dt.date, table_format: str, id_type, columns):
    """``table``'s rows of the nights before ``d`` (its partition column < d), ``columns``
    (name -> expression) of them; an empty frame of those columns before the first night."""
    F, _ = cs.spark_modules()
    schema = table_schema(table, id_type)
    part = storage.LAYOUT[table].partition_column
    rows = _read_table(spark, f"{out}/{table}", table_format)
    if rows is None:
        rows = spark.createDataFrame([], _spark_schema(schema))
    rows = rows.where(F.col(part) < F.lit(d))
    return rows.select("stream", "event_id", *[e.alias(n) for n, e in columns.items()])


def _labels_found(spark, labels, out: str, d: dt.date, k: int, id_type, table_format: str):
    """The night's labels (the contract's names, ``file``) with what was stored for each event
    on the nights before: its event, a label that arrived earlier, the forecast made at it
    (the columns :func:`calpipe.night.arrivals.checked_arrivals` reads)."""
    F, _ = cs.spark_modules()
    s = "" if k == 2 else "s"
    score = score_column(k)
    events = _history(spark, out, "scored_events", d, table_format, id_type, {
        "event_date": F.col("event_date"), "event_time": F.col("event_time"),
        score: F.col(score), "row_label": F.col("label"),
    })  # fmt: skip
    earlier = _history(spark, out, "event_labels", d, table_format, id_type, {
        "prev_label": F.col("label"), "prev_date": F.col("date"),
    })  # fmt: skip
    forecasts = _history(spark, out, "protected_scores", d, table_format, id_type, {
        "__base": F.col(f"base_score{s}"), "__prot": F.col(f"protected_score{s}"),
    })  # fmt: skip
    key = ["stream", "event_id"]
    return labels.join(events, key, "left").join(earlier, key, "left").join(forecasts, key, "left")


def _read_labels(spark, root: str, d: dt.date, id_type):
    """The labels that landed in ``root/date=d`` in the contract's names, with ``file`` (the
    file's path under ``root``, as ``calpipe run`` records it) and each row's place in its file
    (``__row``); None if none landed. The day's files are those ``calpipe run`` reads
    (:func:`calpipe.storage.day_files`: Parquet files, in name order; a sub-folder or another
    file is refused), each read on its own so that its rows carry its name."""
    F, T = cs.spark_modules()
    folder = Path(root) / f"date={d.isoformat()}"
    if not folder.is_dir():
        return None
    files = storage.day_files(folder)
    if not files:
        return None
    parts = []
    for f in files:
        raw = spark.read.parquet(str(f))
        missing = [c for c in ("stream", "event_id", "label", "label_time") if c not in raw.columns]
        if missing:
            raise InputError(missing[0], None, f"labels {f}: missing column (it has {raw.columns})")
        parts.append(cs.naive_times(raw).select(
            F.col("stream").cast("string").alias("stream"),
            F.col("event_id").cast("long" if id_type == pl.Int64 else "string").alias("event_id"),
            F.col("label").cast("double").alias("__y"),
            F.col("label_time").cast(T.TimestampNTZType()).alias("label_time"),
            F.lit(str(f.relative_to(root))).alias("file"),
            F.monotonically_increasing_id().alias("__row"),
        ))  # fmt: skip
    return functools.reduce(lambda a, b: a.unionByName(b), parts)


def run_days(
    spark,
    read_events: Callable[[dt.date], Any],
    out: str,
    start: dt.date,
    end: dt.date,
    *,
    settings: Settings | None = None,
    labels: str | None = None,
    on_unknown_label: str = "error",
    first_day: dt.date | None = None,
    n_buckets: int | None = None,
    table_format: str = "parquet",
    source: str = "events",
    log: Callable[[str], None] | None = None,
) -> list[dt.date]:
    """Run the nights [start, end] in order on Spark (a backfill, or one night), writing every
    table of ``calpipe run`` but ``pipeline_inputs`` under ``out`` (module docstring).

    Night d reads its events (``read_events(d)``: a Spark DataFrame in the data contract's
    names, ``event_time`` a timestamp) and the labels that landed in ``labels/date=d`` (a label
    feed as ``calpipe run --labels`` reads it: ``stream, event_id, label, label_time``), and
    resumes each stream from ``out/state`` of night d - 1. ``first_day`` (default ``start``)
    starts from no state; a later ``start`` needs the state of ``start - 1``.
    ``table_format="delta"`` writes Delta tables (needs Delta Lake on the session; checked
    before anything is written). Each night's rows equal ``calpipe run``'s over the same
    landing and label feed, bit for bit."""
    _check_format(spark, table_format)
    if on_unknown_label not in ON_UNKNOWN:
        raise ParameterError(f"on_unknown_label must be one of {ON_UNKNOWN}, got "
                             f"{on_unknown_label!r}")  # fmt: skip
    if labels is not None and not Path(labels).is_dir():
        raise ParameterError(
            f"labels {labels}: the nightly run on Spark reads a label feed as a landing folder "
            "(date=YYYY-MM-DD/*.parquet, the arrival day), not a file, glob or table"
        )
    settings = settings or Settings()
    say = log or (lambda _m: None)
    first = first_day or start
    chain_hash, n_classes = None, None
    if start > first:
        before = start - dt.timedelta(days=1)
        state = read_state(spark, out, before, table_format)
        days = _read_table(spark, f"{out}/pipeline_days", table_format)
        row = None
        if days is not None:
            row = days.where(f"date = DATE'{before.isoformat()}'").select("state_hash").first()
        # the night's pipeline_days row is written last: without it, the night did not finish
        if state is None or row is None:
            raise CalpipeError(
                f"cannot run {start}: {out} holds no finished night {before} (its state and "
                f"pipeline_days row); run the nights from the chain's first day {first} in order"
            )
        chain_hash = row["state_hash"]
        n_classes = state.select("n_classes").first()["n_classes"]
    done = []
    d = start
    chain = None
    while d <= end:
        events = cs.naive_times(read_events(d))
        k = _n_classes(events)
        if chain is None:
            chain = Chain(settings, first, None, chain_hash, k or n_classes or 2)
            ids = dict(events.dtypes)["event_id"]
            id_type = pl.Int64 if ids in ("bigint", "int", "smallint", "tinyint") else pl.String
        elif k is not None and k != chain.n_classes:  # (as calpipe run's first events set it)
            chain.use_classes(k)
        _night(spark, chain, events, d, out, labels, on_unknown_label, id_type, n_buckets,
               table_format, source)  # fmt: skip
        say(f"{d}: written to {out}/{{{','.join(SPARK_TABLES)},{STATE}}}")
        done.append(d)
        d += dt.timedelta(days=1)
    return done


def _n_classes(events) -> int | None:
    """The number of classes of a night's events: 2 for a ``score`` column, the longest
    ``scores`` list for K-class forecasts (the engine checks that every list has K entries);
    None for a night without events."""
    if "scores" not in events.columns:
        return 2
    F, _ = cs.spark_modules()
    k = events.select(F.max(F.size("scores")).alias("k")).first()["k"]
    return None if k is None or k < 0 else int(k)


def _night(spark, chain: Chain, events, d: dt.date, out: str, labels: str | None,
           on_unknown: str, id_type, n_buckets: int | None, table_format: str,
           source: str) -> None:  # fmt: skip
    """Night ``d`` on Spark: the cogroup, each table's partition, the ``pipeline_days`` row."""
    F, T = cs.spark_modules()
    k = chain.n_classes
    col = "scores" if "scores" in events.columns else "score"  # (an empty night: as landed)
    events = events.select("stream", "event_id", "event_time", col, "label")
    _check_history(spark, events, out, d, table_format, id_type, source)
    state = read_state(spark, out, d - dt.timedelta(days=1), table_format)
    probe = chain.protect(pl.DataFrame(schema={**event_schema(k != 2), "event_id": id_type})
                          .drop("event_date"), None)  # fmt: skip
    state_schema = with_detector(probe.state, None, None).schema  # (the carried state's)
    n = n_buckets or cs.default_buckets(spark)
    bucket = cs.bucket_column(spark, ("stream",), n)
    side_cols = {_SIDE: F.lit(_STATE_ROW).cast("byte")}
    if state is None:
        state = spark.createDataFrame([], _spark_schema(pl.Schema(state_schema)))
    side = state.select(*state.columns, *[v.alias(c) for c, v in side_cols.items()])
    raw = _read_labels(spark, labels, d, id_type) if labels else None
    label_columns: tuple[str, ...] = ()
    if raw is not None:
        found = _labels_found(spark, raw, out, d, k, id_type, table_format)
        label_columns = tuple(found.columns)
        lab = found.select(
            "stream", *[F.col(c).alias(_L + c) for c in found.columns if c != "stream"],
            F.lit(_LABEL_ROW).cast("byte").alias(_SIDE),
        )  # fmt: skip
        side = side.unionByName(lab, allowMissingColumns=True)
    schemas = {t: table_schema(t, id_type) for t in SPARK_TABLES}
    fn = _NightBucket(chain, d, source, labels or "", on_unknown, id_type,
                      pl.Schema(state_schema), label_columns, schemas)  # fmt: skip
    out_type = T.StructType([T.StructField(cs.KIND, T.ByteType()),
                             T.StructField(cs.BLOB, T.BinaryType())])  # fmt: skip
    combined = (
        events.select(bucket, *events.columns)
        .repartition(n, cs.BUCKET)
        .groupBy(cs.BUCKET)
        .cogroup(side.select(bucket, *side.columns).repartition(n, cs.BUCKET).groupBy(cs.BUCKET))
        .applyInArrow(cs.plain2(fn), out_type)
    )
    from pyspark import StorageLevel

    combined = combined.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # every bucket runs here, before any write: bad input raises with nothing of the night
        # written (an overwrite would otherwise have replaced a table's partition already)
        with _worker_errors():
            combined.count()
        for i, name in enumerate(SPARK_TABLES):
            if name == "pipeline_days":
                continue
            schema = table_schema(name, id_type)
            rows = cs.unpack_rows(combined, i, schema)
            _write_night(rows, f"{out}/{name}", storage.LAYOUT[name].partition_column, d,
                         table_format)  # fmt: skip
        carry = cs.unpack_rows(combined, _KINDS.index(_CARRY), pl.Schema(state_schema))
        _write_night(carry.select("*", F.lit(d).alias("date")), f"{out}/{STATE}", "date", d,
                     table_format)  # fmt: skip
        # what needs every stream of the night: on the driver, from the buckets' small outputs
        counts = _collect(combined, _KINDS.index(_COUNTS))
        changed = _collect(combined, SPARK_TABLES.index("calibrator_state"))
    finally:
        combined.unpersist()
    if changed.height == 0:
        changed = pl.DataFrame(schema=table_schema("calibrator_state", id_type))
    total = counts.sum() if counts.height else None
    count = (lambda c: int(total[c][0] or 0)) if total is not None else (lambda c: 0)
    row = chain.day_row(
        d, count("n_events"), count("n_active"), changed.sort("stream"), count("n_labels"),
        n_streams=count("n_streams"),
    )  # fmt: skip
    day_rows = _conform(pl.DataFrame([row]), table_schema("pipeline_days", id_type))
    _write_night(spark.createDataFrame(day_rows.to_arrow()), f"{out}/pipeline_days", "date", d,
                 table_format)  # fmt: skip


#: calpipe's error in a Python worker's traceback, as Spark reports it on the driver.
_WORKER_ERROR = re.compile(r"calpipe\.errors\.(\w+): (.*)")


@contextlib.contextmanager
def _worker_errors():
    """calpipe's own error (its class and message: column, night, stream, event, rule) for a
    calpipe error raised in a Python worker, which Spark reports as a ``PythonException``
    carrying the worker's traceback."""
    from pyspark.errors import PythonException

    try:
        yield
    except PythonException as exc:
        found = _WORKER_ERROR.findall(str(exc))
        if not found:
            raise
        name, message = found[-1]
        # the same class (an InputError's message names its column already)
        make = {"InputError": lambda m: InputError(None, None, m), "StateError": StateError,
                "ParameterError": ParameterError, "StoreError": StoreError}.get(name)  # fmt: skip
        raise (make or CalpipeError)(message) from None


def _check_history(spark, events, out: str, d: dt.date, table_format: str, id_type, source):
    """InputError naming the night, stream and event if one of night ``d``'s events is stored
    on an earlier night already (``calpipe run`` checks the same against its history): an
    event is protected once."""
    F, _ = cs.spark_modules()
    before = _history(spark, out, "scored_events", d, table_format, id_type,
                      {"event_date": F.col("event_date")})  # fmt: skip
    again = events.select("stream", "event_id").join(before, ["stream", "event_id"]).first()
    if again is not None:
        raise InputError(
            "event_id", None,
            f"{source}, day {d}, stream {again['stream']!r}, event {again['event_id']}: event "
            f"already stored on {again['event_date']} (an event is protected once: the same "
            "stream and event_id on two nights)",
        )  # fmt: skip


def _collect(combined, kind: int) -> pl.DataFrame:
    """The rows of ``kind`` packed in ``combined``, on the driver, as the buckets made them."""
    F, _ = cs.spark_modules()
    blobs = combined.filter(F.col(cs.KIND) == kind).select(cs.BLOB).toArrow()
    frames = [
        pl.from_arrow(pa.ipc.open_stream(b.as_py()).read_all()) for b in blobs.column(cs.BLOB)
    ]
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
