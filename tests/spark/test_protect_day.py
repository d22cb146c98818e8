"""calpipe/spark.py and spark_run.py on Spark (local[1]) equal one process bit for bit (#15, #32).

Three-day chains through :func:`calpipe.spark.protect_day` (each day from the previous day's
Spark state) against one :func:`calpipe.protect` pass over the three days; idle and new
streams; ``calpipe spark-run`` and the dagster Spark assets writing every table of
``calpipe run`` (equal bit for bit), re-run idempotently.
"""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import polars as pl
import pyspark  # noqa: F401  (no importorskip: pyspark is part of the stack; CI fails without it)
import pytest

import calpipe
from calpipe import generate, pipeline, spark_run, storage
from calpipe import spark as cs
from calpipe.cli import main
from calpipe.generate import StreamSpec
from tests.pipeline.test_labels import split_feed, with_classes, write_day
from tests.spark.tables import assert_tables_equal, read_table

pytestmark = [pytest.mark.spark, pytest.mark.filterwarnings("ignore::FutureWarning")]

STREAMS = (
    StreamSpec("a", events_per_day=30),
    StreamSpec("b", events_per_day=20, drift="shift", drift_day=1, strength=1.5),
    StreamSpec("c", events_per_day=10),
    StreamSpec("d", events_per_day=8),
)
N_DAYS = 3
START = generate.DEFAULT_START
DAYS = [START + dt.timedelta(days=i) for i in range(N_DAYS)]


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("NUMBA_CACHE_DIR", str(os.path.abspath(".venv/numba_cache")))
    s = cs.session("local[1]", app="calpipe-tests")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def events() -> pl.DataFrame:
    """Three days of four streams; ``c`` is idle on day 2 and ``d`` starts on day 3."""
    ev = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=21)
    day = pl.col("event_time").dt.date()
    return ev.filter(
        ~((pl.col("stream") == "c") & (day == DAYS[1])),
        ~((pl.col("stream") == "d") & (day < DAYS[2])),
    )


def chain(spark, frame: pl.DataFrame, **kw) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The three days through protect_day, each from the previous day's Spark state."""
    state, parts = None, []
    for d in DAYS:
        part = frame.filter(pl.col("event_time").dt.date() == d)
        day = cs.protect_day(spark.createDataFrame(part.to_arrow()), state, n_buckets=3, **kw)
        parts.append(pl.from_arrow(day.scores.toArrow()))
        state = day.state
    return pl.concat(parts), pl.from_arrow(state.toArrow())


def run_composite_jumper(landing, db) -> None:
    """``calpipe run`` (composite-jumper) of the landing folder into the database ``db``: the
    tables spark-run must equal."""
    con = storage.connect(db)
    try:
        pipeline.run_range(
            con, storage.EventSource.parse(str(landing)),
            settings=pipeline.Settings.make("composite-jumper"),
        )  # fmt: skip
    finally:
        con.close()


CASES = {
    "default": {},
    "composite-jumper": {"method": "composite-jumper"},
    "jumper": {"method": "jumper"},
    "ops": {"method": "ops"},
    "stack": {"method": "composite-jumper", "base_method": "isotonic"},
    "venn-abers": {"method": "venn-abers", "window": 30},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_three_day_chain_equals_one_process(spark, events, case):
    kw = CASES[case]
    got, state = chain(spark, events, **kw)
    one = calpipe.protect_with_state(events, **kw)
    key = ["stream", "event_id"]
    want = one.scores.sort(key)
    got = got.sort(key).select(want.columns)
    assert got.equals(want)  # bit for bit, every output column
    assert state.sort("stream").equals(one.state.sort("stream"))
    # idle stream c kept its state through day 2; d is new on day 3
    assert set(got.filter(pl.col("event_time").dt.date() == DAYS[1])["stream"]) == {"a", "b"}
    assert got.filter(pl.col("stream") == "d")["event_time"].dt.date().min() == DAYS[2]


def test_k_classes_and_delayed_labels_equal_one_process(spark, events):
    multi = with_classes(events, 3, seed=4)
    rng = np.random.default_rng(5)
    delay = pl.Series(rng.integers(0, 2 * 86_400_000_000, multi.height)).cast(pl.Duration("us"))
    lt = pl.when(pl.col("label").is_not_null()).then(pl.col("event_time") + delay)
    multi = multi.with_columns(lt.alias("label_time"))
    kw = {"method": "composite-jumper", "scores": "scores", "label_time": "label_time"}
    # delayed labels cross days: each day's events carry the labels known by that day's end
    # only through the state's pending list, so the chain is fed day by day with label_time
    got, state = chain(spark, multi, **kw)
    one = calpipe.protect_with_state(multi, **kw)
    key = ["stream", "event_id"]
    assert got.sort(key).select(one.scores.columns).equals(one.scores.sort(key))
    assert state.sort("stream").equals(one.state.sort("stream"))


def test_spark_run_writes_every_table_of_calpipe_run_and_a_rerun_of_a_day_is_idempotent(
    spark, events, tmp_path, capsys
):
    """``calpipe spark-run`` writes calpipe run's tables (the same rows, bit for bit); re-running
    night 2 alone rewrites its partitions with the same rows and leaves the others' files
    untouched."""
    storage.write_landing(events, tmp_path / "landing")
    out = tmp_path / "out"
    args = ["spark-run", "--events", str(tmp_path / "landing"), "--out", str(out),
            "--method", "composite-jumper", "--n-buckets", "2", "--master", "local[1]"]  # fmt: skip
    assert main(args) == 0
    assert "3 day(s)" in capsys.readouterr().out
    db = tmp_path / "db.duckdb"
    run_composite_jumper(tmp_path / "landing", db)
    counts = assert_tables_equal(out, db)
    assert counts["protected_scores"] == events.height and counts["pipeline_days"] == N_DAYS
    scores = read_table(out, "protected_scores")
    one = calpipe.protect(events, method="composite-jumper")
    key = ["stream", "event_id"]
    assert scores.sort(key)["protected_score"].equals(one.sort(key)["protected_score"])
    files = {p: p.read_bytes() for p in sorted(out.rglob("*.parquet"))}
    assert main([*args, "--start", DAYS[1].isoformat(), "--end", DAYS[1].isoformat()]) == 0
    assert_tables_equal(out, db)
    for p, b in files.items():
        if f"date={DAYS[1]}" not in str(p):
            assert p.read_bytes() == b, p


def test_spark_run_with_k_classes_string_ids_and_a_label_feed_equals_calpipe_run(
    spark, events, tmp_path
):
    """K = 4 forecasts, string event ids, a label feed whose labels land on their event's night
    or later, and a label of an unknown event parked (``--on-unknown-label quarantine``): every
    table of ``calpipe spark-run`` equals ``calpipe run``'s, bit for bit."""
    four = with_classes(events, 4, seed=3).with_columns(
        pl.format("id-{}", pl.col("event_id")).alias("event_id")
    )
    scores, labels, _ = split_feed(four, seed=7, frac=0.7, max_delay_days=2)
    unknown = labels.head(1).with_columns(
        pl.lit("id-unknown").alias("event_id"),
        pl.lit(dt.datetime.combine(DAYS[1], dt.time(12))).alias("label_time"),
    )
    labels = pl.concat([labels, unknown])
    for d in DAYS:
        write_day(scores, tmp_path / "scores", d, "event_time")
        write_day(labels, tmp_path / "labels", d, "label_time")
    inputs = ["--events", str(tmp_path / "scores"), "--labels", str(tmp_path / "labels"),
              "--on-unknown-label", "quarantine"]  # fmt: skip
    db = tmp_path / "run.duckdb"
    assert main(["run", *inputs, "--db", str(db), "--no-progress"]) == 0
    out = tmp_path / "out"
    # more buckets than streams: buckets of no stream, of idle state only, of labels only
    args = ["spark-run", *inputs, "--out", str(out), "--n-buckets", "7", "--master", "local[1]"]
    assert main(args) == 0
    counts = assert_tables_equal(out, db)
    assert counts["quarantined_labels"] == 1 and counts["event_labels"] >= 20
    assert read_table(out, "scored_events")["scores"].list.len().unique().to_list() == [4]


def test_a_bad_label_fails_spark_run_with_calpipes_message_and_nothing_of_the_night_written(
    spark, events, tmp_path, capsys
):
    """A label of an unknown event on night 2 (no ``--on-unknown-label quarantine``): the run
    stops with calpipe's InputError naming the rule, file, stream and event (not Spark's
    worker traceback), night 1 is written, and no table has a partition of night 2."""
    scores, labels, _ = split_feed(events, seed=7, frac=0.7, max_delay_days=1)
    unknown = labels.head(1).with_columns(
        pl.lit(10**9, labels.schema["event_id"]).alias("event_id"),
        pl.lit(dt.datetime.combine(DAYS[1], dt.time(12))).alias("label_time"),
    )
    for d in DAYS[:2]:
        write_day(scores, tmp_path / "scores", d, "event_time")
        write_day(pl.concat([labels, unknown]), tmp_path / "labels", d, "label_time")
    out = tmp_path / "out"
    args = ["spark-run", "--events", str(tmp_path / "scores"), "--labels",
            str(tmp_path / "labels"), "--out", str(out), "--n-buckets", "2",
            "--master", "local[1]"]  # fmt: skip
    assert main(args) == 2  # calpipe's error, not a traceback
    msg = capsys.readouterr().err
    assert msg.startswith("calpipe: error: ") and "Traceback" not in msg
    assert "label of an unknown event" in msg and "event 1000000000" in msg
    assert f"day {DAYS[1]}" in msg and "file date=" in msg
    written = {p.parent.name for p in out.rglob("*.parquet")}
    assert f"date={DAYS[0]}" in written or f"event_date={DAYS[0]}" in written
    assert not [w for w in written if str(DAYS[1]) in w], written


def test_a_float_label_is_refused_by_the_engine_as_calpipe_run_refuses_it(
    spark, events, tmp_path, capsys
):
    """Regression: the Spark bucket cast the events to the stored types before the engine saw
    them, so a label 0.5 was stored as 0. Now the engine validates them as read."""
    bad = events.with_columns(pl.col("label").cast(pl.Float64))
    bad = bad.with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(0.5).otherwise(pl.col("label")).alias("label")
    )
    storage.write_landing(bad, tmp_path / "landing")
    out = tmp_path / "out"
    args = ["spark-run", "--events", str(tmp_path / "landing"), "--out", str(out),
            "--n-buckets", "2", "--master", "local[1]"]  # fmt: skip
    assert main(args) == 2
    msg = capsys.readouterr().err
    assert "label is not a whole number" in msg and "(value: 0.5)" in msg
    r = bad.row(5, named=True)
    assert f"stream {r['stream']!r}, event {r['event_id']}" in msg
    assert not list(out.rglob("*.parquet"))  # night 1 holds the bad label: nothing written


def test_an_event_outside_its_landing_day_is_refused(spark, events, tmp_path, capsys):
    """An event of night 2 in night 1's folder: calpipe run's error (source, day, event, the
    rule), and nothing written."""
    day1 = events.filter(pl.col("event_time").dt.date() == DAYS[0])
    stray = day1.head(1).with_columns(
        pl.col("event_time") + pl.duration(days=1), pl.lit(10**9, day1.schema["event_id"])
        .alias("event_id"),
    )  # fmt: skip
    folder = tmp_path / "landing" / f"date={DAYS[0]}"
    folder.mkdir(parents=True)
    pl.concat([day1, stray]).write_parquet(folder / "events.parquet")
    out = tmp_path / "out"
    args = ["spark-run", "--events", str(tmp_path / "landing"), "--out", str(out),
            "--n-buckets", "2", "--master", "local[1]"]  # fmt: skip
    assert main(args) == 2
    msg = capsys.readouterr().err
    assert f"day {DAYS[0]}: event 1000000000 of stream" in msg and "outside its day" in msg
    assert not list(out.rglob("*.parquet"))


def test_a_label_feed_that_is_not_a_landing_folder_is_refused(spark, tmp_path):
    f = tmp_path / "labels.parquet"
    pl.DataFrame({"stream": ["a"]}).write_parquet(f)
    with pytest.raises(calpipe.errors.ParameterError, match="as a landing folder"):
        spark_run.run_days(spark, lambda d: None, str(tmp_path / "o"), DAYS[0], DAYS[0],
                           labels=str(f))  # fmt: skip


def test_an_event_stored_on_an_earlier_night_is_refused(spark, events, tmp_path, capsys):
    """An event id of night 1 again on night 2 (same stream): InputError naming both nights,
    the stream and the event; night 2 is not written."""
    again = events.filter(pl.col("event_time").dt.date() == DAYS[0]).head(1)
    again = again.with_columns(pl.col("event_time") + pl.duration(days=1))
    storage.write_landing(pl.concat([events, again]), tmp_path / "landing")
    out = tmp_path / "out"
    args = ["spark-run", "--events", str(tmp_path / "landing"), "--out", str(out),
            "--n-buckets", "2", "--master", "local[1]"]  # fmt: skip
    assert main(args) == 2
    msg = capsys.readouterr().err
    r = again.row(0, named=True)
    assert (
        f"day {DAYS[1]}, stream {r['stream']!r}, event {r['event_id']}: event already "
        f"stored on {DAYS[0]}" in msg
    )
    assert not [p for p in out.rglob("*.parquet") if str(DAYS[1]) in str(p)]


def test_each_bucket_gets_a_task_of_its_own(spark, events):
    """Regression: the hashes of the bucket numbers 0..n-1 collided in the cogroup's shuffle
    (and adaptive execution merged its partitions by bytes), so with 8 buckets half the tasks
    were empty and the others did twice the work. Now bucket i is partition i."""
    from pyspark.sql import functions as F

    n = 8
    labels = cs.bucket_labels(spark, n)
    assert len(set(labels)) == n
    many = generate.generate(
        n_days=1, streams=[StreamSpec(f"s{i}", events_per_day=5) for i in range(64)], seed=3
    )
    day = cs.protect_day(spark.createDataFrame(many.to_arrow()), None, n_buckets=n)
    scores = day.scores
    assert scores.rdd.getNumPartitions() == n
    per_task = scores.groupBy(F.spark_partition_id().alias("task")).agg(
        F.countDistinct(F.pmod(F.xxhash64("stream"), F.lit(n))).alias("buckets")
    )
    rows = per_task.collect()
    day.release()
    assert len(rows) == n  # every task holds data ...
    assert all(r["buckets"] == 1 for r in rows)  # ... of exactly one bucket


def test_daily_metrics_in_the_cogroup_equal_the_separate_pass(spark, events):
    """protect_day(daily=True) computes the per-stream metrics inside the cogroup (no second
    shuffle); they equal daily_metrics() over the day's scores."""
    part = events.filter(pl.col("event_time").dt.date() == DAYS[0])
    day = cs.protect_day(spark.createDataFrame(part.to_arrow()), None, daily=True, n_buckets=3)
    inside = pl.from_arrow(day.daily.toArrow()).sort("stream")
    apart = pl.from_arrow(cs.daily_metrics(day.scores).toArrow()).sort("stream")
    day.release()
    assert inside.height == part["stream"].n_unique()
    assert inside.equals(apart)


def test_delta_without_delta_lake_is_refused_before_anything_is_written(spark, events, tmp_path):
    """table_format='delta' on a session without Delta Lake (this one: CI cannot fetch the
    delta-spark JARs) names what to install; no output folder is created."""
    out = tmp_path / "out"
    with pytest.raises(calpipe.errors.CalpipeError, match="needs Delta Lake on this Spark"):
        spark_run.run_days(spark, lambda d: None, str(out), DAYS[0], DAYS[0], table_format="delta")
    with pytest.raises(calpipe.errors.ParameterError, match="table_format must be one of"):
        spark_run.run_days(spark, lambda d: None, str(out), DAYS[0], DAYS[0], table_format="orc")
    assert not out.exists()


def test_a_day_needs_the_state_of_the_day_before(spark, events, tmp_path):
    with pytest.raises(calpipe.errors.CalpipeError, match="holds no finished night"):
        spark_run.run_days(
            spark, lambda d: None, str(tmp_path), DAYS[1], DAYS[1], first_day=DAYS[0]
        )


def test_the_dagster_spark_assets_materialize_a_backfill_and_a_day_like_spark_run(
    spark, events, tmp_path
):
    """The code location's Spark assets (PySparkResource) write what ``calpipe spark-run``
    writes: a single-run backfill of the three days, then one partition re-materialized."""
    from dagster import DagsterInstance, materialize

    from calpipe.dagster_project.defs.partitions import RANGE_END_TAG, RANGE_START_TAG
    from tests.dagster_project.location import location

    storage.write_landing(events, tmp_path / "landing")
    out = tmp_path / "spark_out"
    defs = location(
        tmp_path / "db.duckdb", str(tmp_path / "landing"), DAYS[0], DAYS[-1],
        pipeline.Settings.make("composite-jumper"), spark_out=str(out), spark_master="local[1]",
    )  # fmt: skip
    spark_assets = [
        a for a in defs.assets if "spark_protected_scores" in {k.path[-1] for k in a.keys}
    ]
    db = tmp_path / "run.duckdb"
    run_composite_jumper(tmp_path / "landing", db)
    with DagsterInstance.ephemeral() as inst:
        tags = {RANGE_START_TAG: DAYS[0].isoformat(), RANGE_END_TAG: DAYS[-1].isoformat()}
        r = materialize(spark_assets, resources=defs.resources, instance=inst, tags=tags)
        assert r.success
        assert_tables_equal(out, db)
        r = materialize(
            spark_assets, resources=defs.resources, instance=inst, partition_key=DAYS[1].isoformat()
        )
        assert r.success
        assert_tables_equal(out, db)
        mats = r.asset_materializations_for_node("spark_night")
        assert {m.asset_key.path[-1] for m in mats} == {
            f"spark_{t}" for t in (*spark_run.SPARK_TABLES, spark_run.STATE)
        }


def test_spark_run_finds_calpipe_run_s_change_points_with_a_label_feed(spark, tmp_path):
    """A stream that changes twice, its labels delayed by a feed: ``calpipe spark-run`` writes
    the change points and the detector's state of ``calpipe run`` (the second change tested
    against the map frozen at the first), bit for bit."""
    from tests.night.test_changes import land_with_feed, two_changes

    inputs, _ = land_with_feed(two_changes(n_days=7), tmp_path)
    db = tmp_path / "run.duckdb"
    assert main(["run", *inputs, "--db", str(db), "--no-progress"]) == 0
    out = tmp_path / "out"
    assert main(["spark-run", *inputs, "--out", str(out), "--n-buckets", "2",
                 "--master", "local[1]"]) == 0  # fmt: skip
    counts = assert_tables_equal(out, db)
    assert counts["change_points"] >= 2
    assert read_table(out, "change_points")["reference_date"].null_count() < counts["change_points"]
