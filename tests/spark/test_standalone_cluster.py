"""``calpipe spark-run`` on a Spark standalone cluster equals ``calpipe run`` (#32).

The cluster (``spark_cluster``, tests/spark/cluster.py): a master and two workers, separate JVM
processes started by the test on 127.0.0.1, one core and 1 GB of executor memory each.
``calpipe spark-run --master spark://127.0.0.1:PORT`` runs as a driver process of its own (as a
user runs it), its executors on both workers; ``calpipe run`` runs the same three nights into
DuckDB. The data: six streams (one idle on night 2 while labels of its night-1 events arrive,
one starting on night 3), labels in the scores rows (known at their events), labels that arrive
later the same night or on a later night (with their ``label_time``), and events never labelled
(no label, or one that would arrive after night 3).

The runners take late labels in different forms. ``calpipe run`` reads the scores' landing
(``date=``: the event's day) and a label feed (``--labels``, ``date=``: the arrival day) and on
night d learns what arrived by d. ``spark-run`` has no label feed: its landing holds each event
with the label that arrives for it within the three nights and its ``label_time``
(``--label-time-col``); the engine applies each at its ``label_time`` from the state's pending
list. Both are the same events and the same labels at the same times.

The tables. ``calpipe run`` writes scored_events, protected_scores, calibrator_state,
calibration_daily, calibration_arrivals, martingale_alarms, calibration_map, event_labels,
quarantined_labels, pipeline_days, pipeline_inputs and calpipe_meta; ``spark-run`` writes
``scores``, ``state`` and ``daily`` (Parquet by ``date``). Compared, every column both have,
floats bit for bit:

- ``scores`` with protected_scores joined to scored_events (stream, event_id, date, event_time,
  score, protected_score, log10_martingale, label): equal, except ``label``, which does not mean
  the same thing: spark-run's is the event's label from its landing, calpipe run's the label it
  knew on the event's night (null where the label arrived on a later night; checked exactly);
- ``state`` of each night with calibrator_state as of that night: equal on the last night;
  on the nights before, equal except the pending lists, which in spark-run also hold the labels
  that calpipe run has not received yet (its pending lists are exactly spark-run's entries
  whose ``label_time`` falls by the end of the night);
- ``daily`` with calibration_daily: equal for each (night, stream) none of whose events'
  labels arrive on a later night. Where some do, spark-run scores the night's forecasts with
  those labels too, calpipe run with the labels known that night: the label-free columns are
  equal, and spark-run's row is calibration_daily's own metrics function over calpipe run's
  rows of that night with spark-run's labels, bit for bit.

Not compared (only calpipe run writes them): calibration_arrivals (monitoring by arrival night,
from the feed), martingale_alarms (stream ``b`` crosses log10 S = 2 here; spark-run writes no
alarms, its ``scores`` hold the martingale they come from), calibration_map (the serving map),
event_labels and quarantined_labels (the feed as received), pipeline_days, pipeline_inputs and
calpipe_meta (the chain's bookkeeping); scored_events only through the columns of ``scores``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import polars as pl
import pyspark  # noqa: F401  (no importorskip: without pyspark this fails, as it must in CI)
import pytest

from calpipe import config, generate, storage
from calpipe.cli import main
from calpipe.generate import StreamSpec
from calpipe.night.monitoring import daily_metrics
from tests.pipeline.test_labels import split_feed, write_day
from tests.spark.cluster import HOST, Cluster, Watch

pytestmark = [pytest.mark.spark]

METHOD = config.DEFAULT_METHOD
STREAMS = (
    StreamSpec("a", events_per_day=30),
    StreamSpec("b", events_per_day=20, drift="shift", drift_day=1, strength=1.5),
    StreamSpec("c", events_per_day=12),
    StreamSpec("d", events_per_day=8),
    StreamSpec("e", events_per_day=6),
    StreamSpec("f", events_per_day=4),
)
START = generate.DEFAULT_START
NIGHTS = [START + dt.timedelta(days=i) for i in range(3)]
KEY = ["stream", "event_id"]


@dataclass
class Runs:
    """Both runners' outputs over the same three nights (``spark``: ``scores``, ``state``,
    ``daily``; ``run``: calpipe run's tables, ``by_night``: its protected rows of each night
    as stored) and what the cluster's processes did meanwhile."""

    truth: pl.DataFrame
    spark: dict[str, pl.DataFrame]
    run: dict[str, pl.DataFrame]
    by_night: dict[dt.date, pl.DataFrame]
    watch: Watch


def _events() -> pl.DataFrame:
    """Three days of six streams; ``c`` is idle on day 2 and ``d`` starts on day 3."""
    ev = generate.generate(n_days=3, streams=STREAMS, seed=32)
    day = pl.col("event_time").dt.date()
    return ev.filter(
        ~((pl.col("stream") == "c") & (day == NIGHTS[1])),
        ~((pl.col("stream") == "d") & (day < NIGHTS[2])),
    )


#: Rows whose label arrives on a night after its event's.
LATE = pl.col("label_time").dt.date() > pl.col("event_time").dt.date()


@pytest.fixture(scope="module")
def runs(spark_cluster: Cluster, tmp_path_factory) -> Runs:
    tmp = tmp_path_factory.mktemp("standalone")
    scores, labels, truth = split_feed(_events(), seed=7, frac=0.7, max_delay_days=2)
    # the data has what the docstring says it has
    assert truth.filter(LATE).height >= 20  # labels crossing into a later night
    assert truth.filter(LATE.not_(), pl.col("label_time").is_not_null()).height >= 10
    assert truth.filter(pl.col("label").is_not_null(), pl.col("label_time").is_null()).height
    assert truth["label"].null_count() >= 20  # never labelled within the three nights
    idle = truth.filter(pl.col("stream") == "c", LATE)
    assert (idle["label_time"].dt.date() == NIGHTS[1]).any()  # arrivals for an idle stream
    for d in NIGHTS:
        write_day(scores, tmp / "scores", d, "event_time")
        write_day(labels, tmp / "labels", d, "label_time")
    storage.write_landing(truth, tmp / "spark_landing")

    t0 = time.perf_counter()
    db = tmp / "run.duckdb"
    argv = ["run", "--events", str(tmp / "scores"), "--labels", str(tmp / "labels"),
            "--db", str(db), "--method", METHOD, "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    t_run = time.perf_counter() - t0

    out = tmp / "spark_out"
    cmd = [sys.executable, "-m", "calpipe.cli", "spark-run", "--master", spark_cluster.url,
           "--events", str(tmp / "spark_landing"), "--out", str(out), "--method", METHOD,
           "--label-time-col", "label_time", "--n-buckets", "2"]  # fmt: skip
    # two buckets, one per executor (the default, 4 per core, doubled spark-run's time for these
    # 200 events). The driver binds 127.0.0.1; its first job waits for both executors, and no
    # task waits for the executor holding its input (one executor would get every task)
    conf = {
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.locality.wait": "0",
    }
    submit = " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"
    env = spark_cluster.driver_env(PYSPARK_SUBMIT_ARGS=submit)
    t0 = time.perf_counter()
    with spark_cluster.watch() as watch:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(f"calpipe run {t_run:.1f} s, calpipe spark-run {time.perf_counter() - t0:.1f} s")
    assert done.returncode == 0, (
        f"spark-run failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-5000:]}"
    )
    assert "3 day(s)" in done.stdout

    def parquet(name: str) -> pl.DataFrame:  # a glob: Spark's .crc files break folder reads
        return pl.read_parquet(out / name / "**" / "*.parquet", hive_partitioning=True)

    con = storage.connect(db)
    try:
        run = {
            "scores": storage.query(con, """
                SELECT p.event_date AS date, p.stream, p.event_id, e.event_time, e.score,
                       p.label, p.protected_score, p.log10_martingale
                FROM protected_scores p JOIN scored_events e USING (event_date, stream, event_id)
            """),
            "daily": storage.query(con, "SELECT * FROM calibration_daily"),
            "state": pl.concat([
                storage.query(con, """
                    SELECT s.* EXCLUDE (date), $1 AS date FROM calibrator_state s
                    JOIN (SELECT stream, max(date) AS date FROM calibrator_state
                          WHERE date <= $1 GROUP BY stream) l USING (stream, date)
                """, [d]) for d in NIGHTS
            ]),
        }  # fmt: skip
        # each night's rows as the monitoring reads them: in their stored order (the engine's)
        by_night = {
            d: storage.query(con, """
                SELECT stream, event_id, base_score, protected_score, label, log10_martingale
                FROM protected_scores WHERE event_date = ?
            """, [d]) for d in NIGHTS
        }  # fmt: skip
    finally:
        con.close()
    spark = {name: parquet(name) for name in ("scores", "state", "daily")}
    return Runs(truth, spark, run, by_night, watch)


def _exact(v):
    """A value compared bit for bit: a float by its hex form (-0.0 is not 0.0), lists by item."""
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, list):
        return [_exact(x) for x in v]
    return v


def assert_same(got: pl.DataFrame, want: pl.DataFrame, key: list[str], what: str) -> None:
    """``got`` (spark-run's) and ``want`` (calpipe run's) hold the same rows by ``key`` and,
    in every column of ``want``, the same values, floats bit for bit; the message names each
    column that differs and its first rows."""
    assert got.select(key).sort(key).equals(want.select(key).sort(key)), f"{what}: rows differ"
    assert not got.select(key).is_duplicated().any(), f"{what}: {key} is not a key"
    g, w = got.sort(key), want.sort(key)
    diffs = []
    for c in want.columns:
        a, b = g[c].to_list(), w[c].to_list()
        bad = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if _exact(x) != _exact(y)]
        if bad:
            keys = g.select(key)
            rows = "; ".join(
                f"{keys.row(i)}: spark-run {a[i]!r}, calpipe run {b[i]!r}" for i in bad[:3]
            )
            diffs.append(f"  {c}: {len(bad)} of {len(a)} rows, e.g. {rows}")
    assert not diffs, f"{what} differ:\n" + "\n".join(diffs)


def test_the_cluster_runs_on_loopback_with_executors_on_both_workers(runs, spark_cluster):
    """Every socket the master, the workers, the executors and the driver listened on was on
    127.0.0.1; each worker ran an executor, and each executor Python workers of the venv's
    interpreter sharing the numba cache (handed on by the application, not the daemons)."""
    w = runs.watch
    assert w.listening, "the watch saw no listening socket"
    elsewhere = {a: c[:120] for a, c in w.listening.items() if a[0] != HOST}
    assert not elsewhere, f"listening beyond {HOST}: {elsewhere}"
    executors = w.executors()
    workers = {c.split("--worker-url ", 1)[1].split()[0] for c in executors}
    assert len(executors) == 2 and len(workers) == 2, executors
    assert w.python, "no Python worker of an executor seen"
    for pid, (exe, cache) in w.python.items():
        assert exe == sys.executable, (pid, exe)
        assert cache == os.environ["NUMBA_CACHE_DIR"], (pid, cache)
    app = [a for a in spark_cluster.state()["completedapps"] if a["name"] == "calpipe"]
    assert app and app[-1]["cores"] == 2, app


def test_protected_scores_are_bit_identical(runs):
    spark, run = runs.spark["scores"], runs.run["scores"]
    assert set(spark.columns) - set(run.columns) == {"label_time"}  # spark-run's input column
    shared = [c for c in run.columns if c != "label"]
    assert_same(spark.select(shared), run.select(shared), KEY, "scores / protected_scores")
    # label: spark-run's is the event's (its landing's); calpipe run's the one known that night
    both = spark.join(run, on=KEY, suffix="_run")
    late = both.filter(LATE)
    assert late.height and late["label_run"].null_count() == late.height
    assert late["label"].null_count() == 0
    known = both.filter(LATE.not_() | pl.col("label_time").is_null())
    run_labels = known.select(*KEY, pl.col("label_run").alias("label"))
    assert_same(known.select(*KEY, "label"), run_labels, KEY, "labels known on the night")


def test_the_state_of_each_night_is_bit_identical(runs):
    spark, run = runs.spark["state"], runs.run["state"]
    assert set(spark.columns) == set(run.columns)
    run, key = run.select(spark.columns), ["date", "stream"]
    last = pl.col("date") == NIGHTS[-1]
    # the last night: every column (every label of the three nights has arrived in both)
    assert_same(spark.filter(last), run.filter(last), key, "state of the last night")
    # the nights before: every column but the pending lists ...
    rest = [c for c in spark.columns if c not in PENDING]
    assert_same(spark.select(rest), run.select(rest), key, "state")
    # ... which in spark-run also hold the labels still to arrive: calpipe run's are exactly
    # spark-run's entries whose label arrives by the end of the night
    assert_same(_arrived_by_the_night(spark), run, key, "state, labels arrived by the night")
    future = spark.filter(~last)["pending_labels"].list.len().sum()
    assert future > run.filter(~last)["pending_labels"].list.len().sum()


PENDING = ("pending_label_time", "pending_scores", "pending_labels")


def _arrived_by_the_night(state: pl.DataFrame) -> pl.DataFrame:
    """``state`` with each pending list cut to the entries whose ``label_time`` falls by the
    end of the row's night ``date``."""
    rows = []
    for r in state.iter_rows(named=True):
        end = dt.datetime.combine(r["date"] + dt.timedelta(days=1), dt.time())
        keep = [i for i, t in enumerate(r["pending_label_time"]) if t < end]
        rows.append({**r, **{c: [r[c][i] for i in keep] for c in PENDING}})
    return pl.DataFrame(rows, schema=state.schema)


def test_the_daily_metrics_are_bit_identical_where_both_judge_by_the_same_labels(runs):
    spark, run, truth = runs.spark["daily"], runs.run["daily"], runs.truth
    assert set(spark.columns) < set(run.columns)
    # calibration_daily's own: the end-of-night martingale, its maximum to date, the alarm flag
    assert set(run.columns) - set(spark.columns) == {
        "log10_martingale", "log10_martingale_max_to_date", "alarm"
    }  # fmt: skip
    run, key = run.select(spark.columns), ["date", "stream"]
    waiting = (
        truth.filter(LATE)
        .group_by(pl.col("event_time").dt.date().alias("date"), "stream")
        .agg(pl.len().alias("n_later"))
    )
    assert waiting.height >= 3
    same = spark.join(waiting, on=key, how="anti")
    assert same.height >= 3
    # the nights whose labels all arrived by the night: every column, bit for bit
    assert_same(same, run.join(waiting, on=key, how="anti"), key, "daily (labels known)")
    # the others: the label-free columns equal, and n_labelled counts the later labels too
    other = spark.join(waiting, on=key, how="semi")
    run_other = run.join(waiting, on=key, how="semi")
    free = [*key, "n_events", "mean_score", "mean_protected", "log10_martingale_max"]
    assert_same(other.select(free), run_other.select(free), key, "daily, label-free columns")
    n = other.join(run_other, on=key, suffix="_run").join(waiting, on=key)
    assert (n["n_labelled"] - n["n_labelled_run"]).equals(
        n["n_later"].cast(pl.Int64), check_names=False
    )
    # ... and spark-run's row is calibration_daily's metrics over calpipe run's rows of the
    # night (in their stored order) with the labels spark-run has: the difference is the labels
    final = truth.select(*KEY, pl.col("label").alias("final"))
    recomputed = pl.concat([
        daily_metrics(
            rows.join(final, on=KEY, how="left", maintain_order="left")
            .with_columns(pl.col("final").alias("label")).drop("final"),
            keys=("stream",),
        ).select(pl.lit(d).alias("date"), pl.all())
        for d, rows in runs.by_night.items()
    ])  # fmt: skip
    assert_same(
        spark, recomputed.select(spark.columns), key, "daily vs the metrics with spark-run's labels"
    )
