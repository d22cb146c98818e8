"""Scale-out on Spark: the nightly step as a Spark DataFrame transformation (extra ``calpipe[spark]``).

calpipe's recursion is sequential within a stream and independent across streams, and its state
is one row per stream, so a night maps onto Spark's cogrouped Arrow UDFs: the day's events and
the state of the day before are grouped by a hash *bucket* of the stream keys,
``events.groupBy(bucket).cogroup(state.groupBy(bucket)).applyInArrow(fn)``, and ``fn`` makes
**one** :func:`calpipe.protect_with_state` call per bucket (one call per stream costs ~20 ms of
fixed overhead each: 5-7x slower). Every stream lives in one bucket, so each stream's rows are
exactly those of one process: the Spark chain equals :func:`calpipe.protect` bit for bit.

The knob that matters is the bucket count (``n_buckets``): a cogroup group is loaded whole into a
Python worker (the bucket's events as Arrow, then as polars, plus the engine's working set,
~0.5 KB per event), so ``events / n_buckets`` must fit an executor's Python memory; more buckets
than cores keep every core busy when buckets differ in size. The default is
:data:`calpipe.config.SPARK_BUCKETS_PER_CORE` buckets per core of the session
(``defaultParallelism``), at least ``events / SPARK_MAX_BUCKET_ROWS`` when the day's row count is
given.

Spark itself is imported lazily (``pip install 'calpipe[spark]'``): ``import calpipe`` never
needs it. Set ``spark.sql.session.timeZone=UTC`` and give event times as ``timestamp_ntz`` (naive
UTC, as calpipe stores them); :func:`session` does both.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from calpipe import config
from calpipe.errors import CalpipeError, InputError, ParameterError
from calpipe.frame import protect_with_state

#: Column of the bucket of a row's stream keys (dropped from every output).
_BUCKET = "__calpipe_bucket"
#: Which output a row of the cogroup's combined result is: 0 = a scores row, 1 = a state row.
_KIND = "__calpipe_kind"
#: Prefix of the state's columns in the combined result (their names clash with the scores').
_STATE = "__calpipe_state_"


def _pyspark():
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
            "spark.sql.shuffle.partitions", str(config.SPARK_BUCKETS_PER_CORE * cores)
        )
    if local and "spark.driver.memory" not in conf:  # the local session's executors are the driver
        builder = builder.config("spark.driver.memory", config.SPARK_LOCAL_DRIVER_MEMORY)
    cache = os.environ.get("NUMBA_CACHE_DIR")
    if cache:
        builder = builder.config("spark.executorEnv.NUMBA_CACHE_DIR", cache)
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


# ----------------------------------------------------------------------------------------------
# Types: polars <-> Spark
# ----------------------------------------------------------------------------------------------
def _spark_type(dtype: pl.DataType):
    """The Spark type of a polars column type of calpipe's outputs and state."""
    _, T = _pyspark()
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


def _struct(schema: pl.Schema, prefix: str = ""):
    _, T = _pyspark()
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
    over the bucket's events from the bucket's state, returning the scores and state rows as one
    Arrow table (``_KIND`` tells them apart; state columns prefixed :data:`_STATE`)."""

    kwargs: dict[str, Any]
    score_schema: pl.Schema
    state_schema: pl.Schema
    out_schema: pa.Schema

    def __call__(self, events: pa.Table, state: pa.Table) -> pa.Table:
        ev = pl.from_arrow(events)
        if _BUCKET in ev.columns:
            ev = ev.drop(_BUCKET)
        if ev.height == 0:  # a bucket of idle streams: the cogroup's empty side has no columns
            ev = pl.DataFrame(schema={c: self.score_schema[c] for c in self._input_columns()})
        st = None
        if state.num_rows:
            st = pl.from_arrow(state).drop(_BUCKET).cast(dict(self.state_schema))
        r = protect_with_state(ev, state=st, **self.kwargs)
        scores = r.scores.cast(dict(self.score_schema)).with_columns(
            pl.lit(0, pl.Int8).alias(_KIND)
        )
        rows = r.state.cast(dict(self.state_schema))
        rows = rows.rename({c: _STATE + c for c in rows.columns}).with_columns(
            pl.lit(1, pl.Int8).alias(_KIND)
        )
        both = pl.concat([scores, rows], how="diagonal")
        return both.select(self.out_schema.names).to_arrow().cast(self.out_schema)

    def _input_columns(self) -> list[str]:
        return [c for c in self.score_schema if c not in _OUTPUT_COLUMNS]


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
    whichever is written first); :meth:`release` drops the cache once both are written."""

    scores: Any
    state: Any
    _combined: Any = field(repr=False, default=None)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.scores, self.state))

    def release(self) -> None:
        """Drop the cached cogroup result (after writing ``scores`` and ``state``)."""
        if self._combined is not None:
            self._combined.unpersist()


def default_buckets(spark, n_events: int | None = None) -> int:
    """The default bucket count: :data:`calpipe.config.SPARK_BUCKETS_PER_CORE` per core of the
    session, and at least enough for buckets of at most :data:`calpipe.config.
    SPARK_MAX_BUCKET_ROWS` events when the day's size is known."""
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    n = config.SPARK_BUCKETS_PER_CORE * cores
    if n_events:
        n = max(n, -(-n_events // config.SPARK_MAX_BUCKET_ROWS))
    return n


def protect_day(
    events,
    state=None,
    *,
    method: str = config.DEFAULT_METHOD,
    by: str | Sequence[str] = "stream",
    n_buckets: int | None = None,
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
    state, bit for bit; the caller writes them where it wants (:func:`run_days` writes Parquet).

    The rows are grouped by ``hash(by) mod n_buckets`` and each bucket's streams run in one
    engine call in a Python worker (module docstring: the bucket count against executor memory);
    ``params`` are :func:`calpipe.protect`'s (``score=``/``scores=``, ``label_time=``,
    ``base_method=``, the method's parameters). Bad input raises in the worker: Spark reports it
    as a ``PythonException`` carrying calpipe's message (column, row, rule).

    Examples
    --------
    >>> from calpipe import spark as cs                                     # doctest: +SKIP
    >>> s = cs.session("local[2]")                                          # doctest: +SKIP
    >>> day1 = s.read.parquet("landing/date=2024-01-01")                    # doctest: +SKIP
    >>> scores, state = cs.protect_day(day1, method="composite-jumper")    # doctest: +SKIP
    >>> scores2, state2 = cs.protect_day(day2, state, method="composite-jumper")  # doctest: +SKIP
    """
    F, T = _pyspark()
    spark = events.sparkSession
    by_t = (by,) if isinstance(by, str) else tuple(by)
    if not by_t:
        raise ParameterError("calpipe.spark.protect_day: by= must name the stream keys")
    n = n_buckets or default_buckets(spark)
    if n < 1:
        raise ParameterError(f"n_buckets must be >= 1, got {n}")
    events = _naive_times(events)
    kwargs = {"method": method, "by": list(by_t), **params}
    # the output schemas: calpipe's own on an empty frame of the events' schema
    empty = pl.DataFrame(schema=_polars_schema(events.schema))
    probe = protect_with_state(empty, **kwargs)
    score_schema, state_schema = probe.scores.schema, probe.state.schema
    out = T.StructType(
        [*_struct(score_schema), *_struct(state_schema, _STATE), T.StructField(_KIND, T.ByteType())]
    )
    from pyspark.sql.pandas.types import to_arrow_schema

    fn = _Bucket(kwargs, score_schema, state_schema, to_arrow_schema(out, timezone="UTC"))
    bucket = F.pmod(F.xxhash64(*by_t), F.lit(n)).alias(_BUCKET)
    if state is None:
        state = spark.createDataFrame([], T.StructType(_struct(state_schema)))
    state = _naive_times(state)
    combined = (
        events.select(bucket, *events.columns)
        .groupBy(_BUCKET)
        .cogroup(state.select(bucket, *state.columns).groupBy(_BUCKET))
        .applyInArrow(_plain2(fn), out)
    )
    from pyspark import StorageLevel

    # on local disk, not the JVM heap: a night's combined rows (with the state's vectors) are
    # as large as its events, far more than a default 1 GB heap caches
    combined = combined.persist(StorageLevel.DISK_ONLY)
    scores = combined.filter(F.col(_KIND) == 0).select(*score_schema.names())
    st = combined.filter(F.col(_KIND) == 1).select(
        *[F.col(_STATE + c).alias(c) for c in state_schema.names()]
    )
    return SparkDay(scores, st, combined)


def _naive_times(df):
    """``df`` with zone-aware timestamps as timestamp_ntz (naive UTC, as calpipe stores them:
    with the session in UTC, polars would otherwise see Datetime(us, UTC) against the state's
    naive times)."""
    F, T = _pyspark()
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


# ----------------------------------------------------------------------------------------------
# A chain of days, written as Parquet partitioned by day
# ----------------------------------------------------------------------------------------------
_LANDING_DAY = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


def landing_days(root: str) -> list[dt.date]:
    """The days of a local landing folder (its ``date=YYYY-MM-DD`` sub-folders), in order."""
    p = Path(root)
    if not p.is_dir():
        raise InputError(None, None, f"landing folder {root} does not exist")
    found = (_LANDING_DAY.match(c.name) for c in p.iterdir())
    return sorted(dt.date.fromisoformat(m[1]) for m in found if m)


def _day_path(root: str, d: dt.date) -> str:
    return f"{root.rstrip('/')}/date={d.isoformat()}"


def read_state(spark, out: str, day: dt.date):
    """The state at the end of ``day`` written by :func:`run_days` under ``out`` (None if that
    day has no state: the chain's first day)."""
    path = _day_path(f"{out}/state", day)
    from pyspark.errors import AnalysisException

    try:
        return spark.read.parquet(path)
    except AnalysisException:
        return None


def run_days(
    spark,
    read_events: Callable[[dt.date], Any],
    out: str,
    start: dt.date,
    end: dt.date,
    *,
    first_day: dt.date | None = None,
    log: Callable[[str], None] | None = None,
    **kwargs,
) -> list[dt.date]:
    """Run the days [start, end] in order (a backfill, or one night): day d's events
    (``read_events(d)``, a Spark DataFrame) from the state of d - 1 under ``out``, writing
    ``out/scores``, ``out/state`` and ``out/daily`` (per-stream metrics of the day,
    :func:`calpipe.pipeline.monitoring.daily_metrics`) as Parquet partitioned by ``date``, each
    day's partition replaced by a dynamic partition overwrite, so re-running a day rewrites
    exactly its partitions. ``first_day`` (default ``start``) starts from no state; a later
    ``start`` needs the state of ``start - 1``. ``kwargs``: :func:`protect_day`'s."""
    F, _ = _pyspark()
    say = log or (lambda _m: None)
    first = first_day or start
    state = None
    if start > first:
        state = read_state(spark, out, start - dt.timedelta(days=1))
        if state is None:
            raise CalpipeError(
                f"cannot run {start}: {out}/state has no state of {start - dt.timedelta(days=1)}; "
                f"run the days from the chain's first day {first} in order"
            )
    done = []
    d = start
    while d <= end:
        events = read_events(d)
        day = protect_day(events, state, **kwargs)
        stamp = F.lit(d).cast("date").alias("date")
        for name, frame in (
            ("scores", day.scores),
            ("state", day.state),
            (
                "daily",
                daily_metrics(day.scores, by=kwargs.get("by", "stream"), **_metric_kw(kwargs)),
            ),
        ):
            frame.select("*", stamp).write.mode("overwrite").partitionBy("date").parquet(
                f"{out}/{name}"
            )
        day.release()
        # the next day starts from the state as written (not the cached frame): what a re-run
        # of the next day alone reads too
        state = read_state(spark, out, d)
        say(f"{d}: written to {out}/{{scores,state,daily}}/date={d}")
        done.append(d)
        d += dt.timedelta(days=1)
    return done


def _metric_kw(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k not in ("by", "n_buckets")}


def daily_metrics(scores, *, by: str | Sequence[str] = "stream", **params):
    """Per-stream forecast quality of a day's ``scores`` (:func:`protect_day`'s output), as
    ``calibration_daily`` computes it (:func:`calpipe.pipeline.monitoring.daily_metrics`: base
    vs protected log loss, Brier, ECE, smooth ECE, CORP, the day's maximum log10 martingale),
    one row per stream; ``params``: the method and its parameters (the martingale's base is the
    method's clipped base or a stack's base-method forecast)."""
    F, T = _pyspark()
    by_t = (by,) if isinstance(by, str) else tuple(by)
    fn = _Metrics(by_t, params, _polars_schema(scores.schema))
    schema = T.StructType(_struct(fn.out_schema()))
    from pyspark.sql.pandas.types import to_arrow_schema

    fn = _Metrics(by_t, params, fn.in_schema, to_arrow_schema(schema, timezone="UTC"))
    n = config.SPARK_BUCKETS_PER_CORE * max(
        1, int(scores.sparkSession.sparkContext.defaultParallelism)
    )
    bucket = F.pmod(F.xxhash64(*by_t), F.lit(n)).alias(_BUCKET)
    return scores.select(bucket, *scores.columns).groupBy(_BUCKET).applyInArrow(_plain1(fn), schema)


def _plain1(fn):
    """``fn`` as a plain function of one table (pyspark counts a callable object's ``self`` as
    an argument when it validates, but not when it calls)."""

    def run(table):
        return fn(table)

    return run


def _plain2(fn):
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

    def _rows(self, scores: pl.DataFrame) -> pl.DataFrame:
        from calpipe.calibrators import make_calibrator
        from calpipe.pipeline.chain import _martingale_base
        from calpipe.pipeline.monitoring import daily_metrics as metrics

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
            *self.by, _martingale_base(cal, frame), pl.col(label).alias("label"),
            "protected_scores" if multi else "protected_score", "log10_martingale",
        )  # fmt: skip
        return metrics(rows, keys=self.by)

    def out_schema(self) -> pl.Schema:
        return self._rows(pl.DataFrame(schema=self.in_schema)).schema

    def __call__(self, table: pa.Table) -> pa.Table:
        scores = pl.from_arrow(table).drop(_BUCKET)
        return self._rows(scores).to_arrow().cast(self.arrow)
