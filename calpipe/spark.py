"""Scale-out on Spark: protection as a Spark DataFrame transformation (extra ``calpipe[spark]``).

This module holds the Spark primitives: the session, the cogroup over stream buckets, the
Arrow IPC slices a bucket's rows leave in, and :func:`protect_day` (a night's events protected
on Spark). The nightly run on Spark, every table of ``calpipe run`` through the night function,
is :mod:`calpipe.spark_run` (``calpipe spark-run``), built on them.

calpipe's recursion is sequential within a stream and independent across streams, and its state
is one row per stream, so a night maps onto Spark's cogrouped Arrow UDFs: the day's events and
the state of the day before are grouped by a hash *bucket* of the stream keys,
``events.groupBy(bucket).cogroup(state.groupBy(bucket)).applyInArrow(fn)``, and ``fn`` makes
**one** :func:`calpipe.protect_with_state` call per bucket (one call per stream costs ~20 ms of
fixed overhead each: 5-7x slower). Every stream lives in one bucket, so each stream's rows are
exactly those of one process: the Spark chain equals :func:`calpipe.protect` bit for bit.

A bucket is one task: the cogroup repartitions to exactly ``n_buckets`` partitions, bucket i in
partition i (:func:`bucket_column`). The cogroup's output holds the scores rows and, per bucket,
the state rows and the day's per-stream metrics as Arrow IPC slices (narrow rows: the output is
persisted once and written three times); :func:`unpack_rows` turns the slices back into rows.

The knob that matters is the bucket count (``n_buckets``): a cogroup group is loaded whole into a
Python worker (the bucket's events as Arrow, then as polars, plus the engine's working set,
~0.5 KB per event), so ``events / n_buckets`` must fit an executor's Python memory; more buckets
than cores keep every core busy when buckets differ in size. The default is
:data:`calpipe.SPARK_BUCKETS_PER_CORE` buckets per core of the session
(``defaultParallelism``), at least ``events / SPARK_MAX_BUCKET_ROWS`` when the day's row count is
given.

Spark itself is imported lazily (``pip install 'calpipe[spark]'``): ``import calpipe`` never
needs it. Set ``spark.sql.session.timeZone=UTC`` and give event times as ``timestamp_ntz`` (naive
UTC, as calpipe stores them); :func:`session` does both.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa

from calpipe import config
from calpipe.engine import protect_with_state
from calpipe.errors import CalpipeError, ParameterError

#: calpipe.spark: buckets (cogroup groups, one engine call each) per core of the Spark session,
#: so that buckets of unequal size still keep every core busy to the end of the stage.
SPARK_BUCKETS_PER_CORE: int = 4

#: calpipe.spark: the most events a bucket should hold when the day's size is known (a bucket is
#: loaded whole into a Python worker: ~0.5 KB per event with the engine's working set, so 2M
#: events stay near 1 GB; the pipeline's own batches, PROTECT_BATCH_ROWS, are 1.6M).
SPARK_MAX_BUCKET_ROWS: int = 2_000_000

#: calpipe.spark.session: the JVM heap of a local session (driver and executors in one JVM),
#: where the shuffle of a multi-million-event night is buffered; Spark's 1 GB default runs out.
SPARK_LOCAL_DRIVER_MEMORY: str = "4g"

#: calpipe.spark: state or metrics rows per Arrow IPC slice of the cogroup's combined output
#: (0.7-6 KB a state row, the default method's the largest: slices of at most ~60 MB, far below
#: a Spark binary value's 2 GB limit).
SPARK_ROWS_PER_BLOB: int = 10_000

#: Column of the bucket of a row's stream keys (dropped from every output).
BUCKET = "__calpipe_bucket"
#: Which output a row of the cogroup's combined result is: in :func:`protect_day`'s,
#: :data:`_SCORES` (one row per event), :data:`_STATES` or :data:`_DAILY` (one row per slice of
#: a bucket's state or metrics rows); in :mod:`calpipe.spark_run`'s, the table of the slice.
KIND = "__calpipe_kind"
_SCORES, _STATES, _DAILY = 0, 1, 2
#: The combined result's column holding a slice of state or metrics rows as an Arrow IPC stream.
#: Why not the state's own columns: the combined rows are persisted (computed once, written three
#: times), and a dozen always-null state columns on every event's row made the persist and the
#: Arrow -> JVM row conversion cost more than the engine itself (1M events: 2.8 s against 1.4 s).
BLOB = "__calpipe_blob"


def spark_modules():
    """pyspark's ``functions`` and ``types`` modules, imported on first use (CalpipeError naming
    the extra to install without pyspark)."""
    try:
        import pyspark  # noqa: F401
        from pyspark.sql import functions as F
        from pyspark.sql import types as T
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise CalpipeError("calpipe.spark needs pyspark: pip install 'calpipe[spark]'") from exc
    return F, T


def session(master: str = "local[*]", app: str = "calpipe", **conf: str):
    """A SparkSession set up for calpipe: UTC session time zone, workers on this interpreter
    (``PYSPARK_PYTHON``), and the numba cache shared with executors (``NUMBA_CACHE_DIR``, so a
    worker loads the compiled kernels instead of compiling them). ``conf``: more settings."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    local = re.fullmatch(r"local\[(\d+|\*)\]", master)
    if local and "spark.sql.shuffle.partitions" not in conf:
        # a local session's shuffles: a few partitions per core, not Spark's default 200 (each
        # an empty task costing milliseconds of scheduling at every night's cogroup)
        cores = (os.cpu_count() or 1) if local[1] == "*" else int(local[1])
        builder = builder.config(
            "spark.sql.shuffle.partitions", str(SPARK_BUCKETS_PER_CORE * cores)
        )
    if local and "spark.driver.memory" not in conf:  # the local session's executors are the driver
        builder = builder.config("spark.driver.memory", SPARK_LOCAL_DRIVER_MEMORY)
    for k, v in executor_env().items():
        builder = builder.config(k, v)
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def executor_env() -> dict[str, str]:
    """Spark settings that hand this process's ``NUMBA_CACHE_DIR`` on to the executors when the
    user set one (a shared folder: workers load the compiled kernels instead of compiling
    them) or it is the venv's own folder (the executors run this interpreter); none when
    calpipe chose the user's cache directory, which each executor chooses for itself on its
    own machine."""
    from calpipe import numba_cache

    cache = os.environ.get("NUMBA_CACHE_DIR")
    if cache and not numba_cache.DEFAULTED:
        return {"spark.executorEnv.NUMBA_CACHE_DIR": cache}
    return {}


# ----------------------------------------------------------------------------------------------
# Types: polars <-> Spark
# ----------------------------------------------------------------------------------------------
def _spark_type(dtype: pl.DataType):
    """The Spark type of a polars column type of calpipe's outputs and state."""
    _, T = spark_modules()
    if isinstance(dtype, pl.List | pl.Array):
        return T.ArrayType(_spark_type(dtype.inner), containsNull=True)
    simple = {
        pl.String: T.StringType(), pl.Int64: T.LongType(), pl.Int32: T.IntegerType(),
        pl.Int16: T.ShortType(), pl.Int8: T.ByteType(), pl.UInt32: T.LongType(),
        pl.Float64: T.DoubleType(), pl.Float32: T.FloatType(), pl.Boolean: T.BooleanType(),
        pl.Date: T.DateType(),
    }  # fmt: skip
    if isinstance(dtype, pl.Datetime):
        return T.TimestampType() if dtype.time_zone else T.TimestampNTZType()
    for k, v in simple.items():
        if dtype == k:
            return v
    raise ParameterError(f"calpipe.spark: no Spark type for the column type {dtype}")


def spark_fields(schema: pl.Schema, prefix: str = ""):
    """The Spark ``StructField`` of each column of a polars ``schema`` (nullable), named with
    ``prefix``."""
    _, T = spark_modules()
    return [T.StructField(prefix + n, _spark_type(t), nullable=True) for n, t in schema.items()]


def _polars_schema(spark_schema) -> pl.Schema:
    """The polars schema of rows of a Spark schema (through Arrow, as the UDF receives them)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(spark_schema, timezone="UTC", prefers_large_types=False)
    return pl.from_arrow(arrow.empty_table()).schema


# ----------------------------------------------------------------------------------------------
# The cogroup function
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Bucket:
    """What runs in a Python worker for one bucket: one :func:`calpipe.protect_with_state` call
    over the bucket's events from the bucket's state, returning one Arrow table of the scores
    rows (``KIND`` = :data:`_SCORES`) followed by the state rows and, if ``metrics`` is set, the
    per-stream metrics of the day (:class:`_Metrics`), both as Arrow IPC slices in :data:`BLOB`
    (:func:`unpack_rows` turns them back into rows)."""

    kwargs: dict[str, Any]
    score_schema: pl.Schema
    state_schema: pl.Schema
    out_schema: pa.Schema
    metrics: _Metrics | None = None

    def __call__(self, events: pa.Table, state: pa.Table) -> pa.Table:
        ev = pl.from_arrow(events)
        if BUCKET in ev.columns:
            ev = ev.drop(BUCKET)
        if ev.height == 0:  # a bucket of idle streams: the cogroup's empty side has no columns
            ev = pl.DataFrame(schema={c: self.score_schema[c] for c in self._input_columns()})
        st = None
        if state.num_rows:
            st = pl.from_arrow(state).drop(BUCKET).cast(dict(self.state_schema))
        r = protect_with_state(ev, state=st, **self.kwargs)
        scores = r.scores.cast(dict(self.score_schema)).with_columns(
            pl.lit(_SCORES, pl.Int8).alias(KIND), pl.lit(None, pl.Binary).alias(BLOB)
        )
        packed = pack_rows(_STATES, r.state.cast(dict(self.state_schema)))
        if self.metrics is not None and r.scores.height:
            packed += pack_rows(_DAILY, self.metrics.rows(r.scores))
        blobs = pl.DataFrame(
            {KIND: [k for k, _ in packed], BLOB: [b for _, b in packed]},
            schema={KIND: pl.Int8, BLOB: pl.Binary},
        )
        both = pl.concat([scores, blobs], how="diagonal")
        return both.select(self.out_schema.names).to_arrow().cast(self.out_schema)

    def _input_columns(self) -> list[str]:
        return [c for c in self.score_schema if c not in _OUTPUT_COLUMNS]


def pack_rows(kind: int, rows: pl.DataFrame) -> list[tuple[int, bytes]]:
    """``rows`` as Arrow IPC streams of at most :data:`calpipe.SPARK_ROWS_PER_BLOB` rows
    each (a Spark binary value stays far below its 2 GB limit however many streams a bucket
    holds)."""
    out = []
    for start in range(0, rows.height, SPARK_ROWS_PER_BLOB):
        sink = pa.BufferOutputStream()
        part = rows.slice(start, SPARK_ROWS_PER_BLOB).to_arrow()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        out.append((kind, sink.getvalue().to_pybytes()))
    return out


@dataclass(frozen=True)
class _Unpack:
    """A ``mapInArrow`` function: the rows of the :data:`BLOB` slices of a batch, cast to
    ``schema`` (the Arrow schema of the DataFrame it returns)."""

    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for blob in batch.column(BLOB).to_pylist():
                table = pa.ipc.open_stream(blob).read_all()
                yield from table.select(self.schema.names).cast(self.schema).to_batches()


def unpack_rows(combined, kind: int, schema: pl.Schema):
    """The rows of ``kind`` packed in ``combined`` (:func:`pack_rows`), as a DataFrame of ``schema``."""
    F, T = spark_modules()
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = T.StructType(spark_fields(schema))
    fn = _Unpack(to_arrow_schema(struct, timezone="UTC", prefers_large_types=False))
    blobs = combined.filter(F.col(KIND) == kind).select(BLOB)
    # a few rows per bucket: one Python task per core decodes them (not one per bucket, whose
    # fixed cost per task was most of the decoding's time)
    cores = max(1, int(combined.sparkSession.sparkContext.defaultParallelism))
    return blobs.coalesce(cores).mapInArrow(_plain_iter(fn), struct)


#: Columns the engine adds to the events (present or not, depending on the method).
_OUTPUT_COLUMNS = frozenset({
    "protected_score", "protected_scores", "log10_martingale", "p_lower", "p_upper",
    "base_method_score", "base_method_scores",
})  # fmt: skip


@dataclass
class SparkDay:
    """The result of :func:`protect_day`: ``scores`` (the events with calpipe's outputs, as
    :func:`calpipe.protect` returns them) and ``state`` (one row per stream). Unpacks as
    ``scores, state = protect_day(...)``. Both come from one cached cogroup (computed once
    whichever is written first); :meth:`release` drops the cache once both are written.
    ``daily``: the day's per-stream metrics when asked for (``protect_day(daily=True)``)."""

    scores: Any
    state: Any
    daily: Any = None
    _combined: Any = field(repr=False, default=None)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.scores, self.state))

    def release(self) -> None:
        """Drop the cached cogroup result (after writing ``scores`` and ``state``)."""
        if self._combined is not None:
            self._combined.unpersist()


def default_buckets(spark, n_events: int | None = None) -> int:
    """The default bucket count: :data:`calpipe.SPARK_BUCKETS_PER_CORE` per core of the
    session, and at least enough for buckets of at most :data:`calpipe.config.
    SPARK_MAX_BUCKET_ROWS` events when the day's size is known."""
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    n = SPARK_BUCKETS_PER_CORE * cores
    if n_events:
        n = max(n, -(-n_events // SPARK_MAX_BUCKET_ROWS))
    return n


def protect_day(
    events,
    state=None,
    *,
    method: str = config.DEFAULT_METHOD,
    by: str | Sequence[str] = "stream",
    n_buckets: int | None = None,
    daily: bool = False,
    **params,
) -> SparkDay:
    """Protect one night's events on Spark, resuming each stream from ``state``.

    A pure transformation: ``events`` is a Spark DataFrame in the data contract's columns
    (docs/ARCHITECTURE.md §3: stream keys ``by``, ``event_id``, ``event_time`` as timestamp_ntz,
    ``score`` double or ``scores`` array<double>, ``label``, optionally ``label_time``), ``state``
    the state DataFrame of the day before (a previous call's, or None on the first day). Returns
    :class:`SparkDay` ``(scores, state)``: the events with ``protected_score(s)`` and
    ``log10_martingale`` (and the method's extra outputs), and the state at the end of the day,
    one row per stream (streams of ``state`` without events pass through unchanged). Each
    stream's rows equal one :func:`calpipe.protect_with_state` call over its events from its
    state, bit for bit; the caller writes them where it wants (the nightly run on Spark,
    :func:`calpipe.spark_run.run_days`, writes every table of ``calpipe run``).

    The rows are grouped by ``hash(by) mod n_buckets`` and each bucket's streams run in one
    engine call in a Python worker (module docstring: the bucket count against executor memory);
    ``params`` are :func:`calpipe.protect`'s (``score=``/``scores=``, ``label_time=``,
    ``base_method=``, the method's parameters). Bad input raises in the worker: Spark reports it
    as a ``PythonException`` carrying calpipe's message (column, row, rule). ``daily=True`` also
    computes the day's per-stream metrics (:func:`daily_metrics`) in the same cogroup, as
    ``SparkDay.daily``: no second shuffle of the scores.

    Examples
    --------
    >>> from calpipe import spark as cs                                     # doctest: +SKIP
    >>> s = cs.session("local[2]")                                          # doctest: +SKIP
    >>> day1 = s.read.parquet("landing/date=2024-01-01")                    # doctest: +SKIP
    >>> scores, state = cs.protect_day(day1, method="composite-jumper")    # doctest: +SKIP
    >>> scores2, state2 = cs.protect_day(day2, state, method="composite-jumper")  # doctest: +SKIP
    """
    F, T = spark_modules()
    spark = events.sparkSession
    by_t = (by,) if isinstance(by, str) else tuple(by)
    if not by_t:
        raise ParameterError("calpipe.spark.protect_day: by= must name the stream keys")
    n = n_buckets or default_buckets(spark)
    if n < 1:
        raise ParameterError(f"n_buckets must be >= 1, got {n}")
    events = naive_times(events)
    kwargs = {"method": method, "by": list(by_t), **params}
    # the output schemas: calpipe's own on an empty frame of the events' schema
    empty = pl.DataFrame(schema=_polars_schema(events.schema))
    probe = protect_with_state(empty, **kwargs)
    score_schema, state_schema = probe.scores.schema, probe.state.schema
    out = T.StructType([
        *spark_fields(score_schema), T.StructField(KIND, T.ByteType()),
        T.StructField(BLOB, T.BinaryType()),
    ])  # fmt: skip
    from pyspark.sql.pandas.types import to_arrow_schema

    metrics = _Metrics(by_t, {"method": method, **params}, score_schema) if daily else None
    fn = _Bucket(
        kwargs, score_schema, state_schema,
        to_arrow_schema(out, timezone="UTC", prefers_large_types=False), metrics,
    )  # fmt: skip
    bucket = bucket_column(spark, by_t, n)
    if state is None:
        state = spark.createDataFrame([], T.StructType(spark_fields(state_schema)))
    state = naive_times(state)
    # one shuffle partition (one task) per bucket, asked for explicitly: Spark's adaptive
    # execution coalesces the partitions of an implicit groupBy shuffle to about the core count
    # by their bytes (8 buckets of 5M events became 3 tasks of 1.3M, 1.9M and 1.9M events on 2
    # cores), but not those of a repartition; the cogroup reuses this partitioning
    combined = (
        events.select(bucket, *events.columns)
        .repartition(n, BUCKET)
        .groupBy(BUCKET)
        .cogroup(state.select(bucket, *state.columns).repartition(n, BUCKET).groupBy(BUCKET))
        .applyInArrow(plain2(fn), out)
    )
    from pyspark import StorageLevel

    # computed once, read by each write; spilled to local disk where the executors' memory does
    # not hold it (a night's scores rows are as large as its events)
    combined = combined.persist(StorageLevel.MEMORY_AND_DISK)
    scores = combined.filter(F.col(KIND) == _SCORES).select(*score_schema.names())
    st = unpack_rows(combined, _STATES, state_schema)
    per_stream = unpack_rows(combined, _DAILY, metrics.out_schema()) if metrics else None
    return SparkDay(scores, st, per_stream, combined)


def bucket_column(spark, by: tuple[str, ...], n: int):
    """The bucket of each row's stream keys, ``xxhash64(by) mod n``, as a *label* chosen so that
    bucket i lands in partition i of a ``repartition(n, bucket)``.

    Why labels: a repartition places a key by Spark's Murmur3 hash of it mod n, and the hashes
    of the numbers 0..n-1 collide: with 8 buckets in 8 partitions, four partitions held two
    buckets each and four none, so half the tasks did all the work."""
    F, _ = spark_modules()
    labels = bucket_labels(spark, n)
    index = F.pmod(F.xxhash64(*by), F.lit(n))
    # long, as the labels were hashed (Spark hashes an int and a long of one value differently)
    labels_col = F.array(*[F.lit(v).cast("long") for v in labels])
    return F.element_at(labels_col, (index + 1).cast("int")).alias(BUCKET)


@functools.lru_cache(maxsize=64)
def bucket_labels(spark, n: int) -> tuple[int, ...]:
    """``n`` longs, the i-th the first number whose Spark hash partition among ``n``
    (``pmod(hash(v), n)``, as ``repartition(n, col)`` computes it) is i: one small Spark job,
    once per session and bucket count (a backfill's nights reuse it)."""
    F, _ = spark_modules()
    limit = 64 * n
    while True:
        rows = (
            spark.range(0, limit)
            .select(F.pmod(F.hash(F.col("id")), F.lit(n)).alias("p"), "id")
            .groupBy("p")
            .agg(F.min("id").alias("id"))
            .collect()
        )
        first = {int(r["p"]): int(r["id"]) for r in rows}
        if len(first) == n:
            return tuple(first[i] for i in range(n))
        limit *= 4  # pragma: no cover - 64 candidates per partition are plenty


def naive_times(df):
    """``df`` with zone-aware timestamps as timestamp_ntz (naive UTC, as calpipe stores them:
    with the session in UTC, polars would otherwise see Datetime(us, UTC) against the state's
    naive times)."""
    F, T = spark_modules()
    cols = []
    for f in df.schema.fields:
        if isinstance(f.dataType, T.TimestampType):
            cols.append(F.col(f.name).cast(T.TimestampNTZType()).alias(f.name))
        elif isinstance(f.dataType, T.ArrayType) and isinstance(
            f.dataType.elementType, T.TimestampType
        ):
            cols.append(F.col(f.name).cast(T.ArrayType(T.TimestampNTZType())).alias(f.name))
        else:
            cols.append(F.col(f.name))
    return df.select(*cols)


def daily_metrics(scores, *, by: str | Sequence[str] = "stream", **params):
    """Per-stream forecast quality of a day's ``scores`` (:func:`protect_day`'s output), as
    ``calibration_daily`` computes it (:func:`calpipe.night.monitoring.daily_metrics`: base
    vs protected log loss, Brier, ECE, smooth ECE, CORP, the day's maximum log10 martingale),
    one row per stream; ``params``: the method and its parameters (the martingale's base is the
    method's clipped base or a stack's base-method forecast)."""
    _, T = spark_modules()
    by_t = (by,) if isinstance(by, str) else tuple(by)
    fn = _Metrics(by_t, params, _polars_schema(scores.schema))
    schema = T.StructType(spark_fields(fn.out_schema()))
    from pyspark.sql.pandas.types import to_arrow_schema

    fn = _Metrics(by_t, params, fn.in_schema, to_arrow_schema(schema, timezone="UTC"))
    spark = scores.sparkSession
    n = default_buckets(spark)
    keyed = scores.select(bucket_column(spark, by_t, n), *scores.columns)
    return keyed.repartition(n, BUCKET).groupBy(BUCKET).applyInArrow(_plain1(fn), schema)


def _plain1(fn):
    """``fn`` as a plain function of one table (pyspark counts a callable object's ``self`` as
    an argument when it validates, but not when it calls)."""

    def run(table):
        return fn(table)

    return run


def _plain_iter(fn):
    """``fn`` as a plain function of an iterator of batches (see :func:`_plain1`)."""

    def run(batches):
        return fn(batches)

    return run


def plain2(fn):
    """``fn`` as a plain function of two tables (see :func:`_plain1`)."""

    def run(left, right):
        return fn(left, right)

    return run


@dataclass(frozen=True)
class _Metrics:
    """The per-bucket metrics of :func:`daily_metrics` (one grouped-metrics call per bucket)."""

    by: tuple[str, ...]
    params: dict[str, Any]
    in_schema: pl.Schema
    arrow: pa.Schema | None = None

    def rows(self, scores: pl.DataFrame) -> pl.DataFrame:
        """The metrics of ``scores`` (:func:`protect_with_state`'s rows), one row per stream."""
        from calpipe.calibrators import make_calibrator
        from calpipe.night.chain import base_score_column
        from calpipe.night.monitoring import daily_metrics as metrics

        kw = {
            k: v
            for k, v in self.params.items()
            if k not in ("score", "scores", "label", "label_time", "order_by")
        }
        method = kw.pop("method", config.DEFAULT_METHOD)
        cal = make_calibrator(method, **kw)
        multi = "protected_scores" in scores.columns
        frame = scores.rename({self.params.get("scores", "scores"): "scores"} if multi else
                              {self.params.get("score", "score"): "score"})  # fmt: skip
        label = self.params.get("label", "label")
        rows = frame.select(
            *self.by, base_score_column(cal, frame), pl.col(label).alias("label"),
            "protected_scores" if multi else "protected_score", "log10_martingale",
        )  # fmt: skip
        return metrics(rows, keys=self.by)

    def out_schema(self) -> pl.Schema:
        return self.rows(pl.DataFrame(schema=self.in_schema)).schema

    def __call__(self, table: pa.Table) -> pa.Table:
        scores = pl.from_arrow(table).drop(BUCKET)
        return self.rows(scores).to_arrow().cast(self.arrow)
