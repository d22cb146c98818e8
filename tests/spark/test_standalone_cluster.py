"""``calpipe spark-run`` on a Spark standalone cluster equals ``calpipe run``, every table (#32).

The cluster (``spark_cluster``, tests/spark/cluster.py): a master and two workers, separate JVM
processes started by the test on 127.0.0.1, one core and 1 GB of executor memory each.
``calpipe spark-run --master spark://127.0.0.1:PORT`` runs as a driver process of its own (as a
user runs it), its executors on both workers; ``calpipe run`` runs the same three nights into
DuckDB. Both read the same scores landing and the same label feed (``--labels``: each label in
the folder of its arrival night). The data: six streams (one idle on night 2 while labels of
its night-1 events arrive, one starting on night 3), labels in the scores rows (known at their
events), labels that arrive later the same night or on a later night, and events never
labelled (no label, or one that would arrive after night 3).

Both runners compute a night through the same night function
(:func:`calpipe.night.phases.night_part`): ``calpipe run`` over the whole night, spark-run
over each bucket of streams inside its cogroup, the label lookup made by joins with the tables
it wrote on the nights before. Compared: every table spark-run writes (all of ``calpipe run``'s
but ``pipeline_inputs``, the input files' hashes), each row by the table's sort keys, every
column, floats bit for bit (``tests/spark/tables.py``).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyspark  # noqa: F401  (no importorskip: without pyspark this fails, as it must in CI)
import pytest

from calpipe import config, generate
from calpipe.cli import main
from calpipe.generate import StreamSpec
from calpipe.spark_run import SPARK_TABLES
from tests.pipeline.test_labels import split_feed, write_day
from tests.spark.cluster import HOST, Cluster, Watch
from tests.spark.tables import assert_tables_equal

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


@dataclass
class Runs:
    """Both runners' outputs over the same three nights (spark-run's folder, calpipe run's
    database), the data, and what the cluster's processes did meanwhile."""

    truth: pl.DataFrame
    out: Path
    db: Path
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

    t0 = time.perf_counter()
    db = tmp / "run.duckdb"
    inputs = ["--events", str(tmp / "scores"), "--labels", str(tmp / "labels"),
              "--method", METHOD]  # fmt: skip
    assert main(["run", *inputs, "--db", str(db), "--no-progress"]) == 0
    t_run = time.perf_counter() - t0

    out = tmp / "spark_out"
    cmd = [sys.executable, "-m", "calpipe.cli", "spark-run", "--master", spark_cluster.url,
           *inputs, "--out", str(out), "--n-buckets", "2"]  # fmt: skip
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
    return Runs(truth, out, db, watch)


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


def test_every_table_is_bit_identical_to_calpipe_run(runs):
    counts = assert_tables_equal(runs.out, runs.db)
    # the comparison saw what the docstring says: late labels learnt, their forecasts judged
    assert set(counts) == set(SPARK_TABLES)
    assert counts["scored_events"] == runs.truth.height
    assert counts["event_labels"] >= 20 and counts["calibration_arrivals"] >= 3
    assert counts["pipeline_days"] == len(NIGHTS)
