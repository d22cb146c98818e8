"""Build the golden scenarios and write their tables to ``tests/data/golden/`` (issue #32).

Run ``python -m tests.golden.make_golden`` (``--scenario NAME`` for some, ``--out DIR`` to write
elsewhere, ``--new-inputs`` to draw the inputs again). Each scenario is built in a temporary
folder through the ``calpipe`` command, in process (:func:`calpipe.cli.main`), exactly as a
user runs it:

* ``demo``: ``calpipe demo`` (the bank stream and the six seeded synthetic streams, 892 days);
* ``labels12``: 12 nights of ``calpipe run --labels --on-unknown-label quarantine`` as a cron
  runs them, one per night, on binary scores of four streams (one starting on day 2, one idle
  on day 5) whose labels land 0-3 days after their events; day 3's scores land two nights late
  (their labels are parked as unknown, then the late day replays); three labels of events that
  never exist stay quarantined; after night 12 day 7's scores file is rewritten with changed
  scores, and a 13th run replays days 7-11;
* ``k4``: 5 nights of ``calpipe run --labels`` on K = 4 class ``scores`` lists with string
  event ids ("ev-10" sorts before "ev-9") and ties in event time, labels landing 0-2 days late,
  one label of an unknown event quarantined;
* ``spark``: :func:`calpipe.spark.protect_day` on local[1] with two buckets over 3 days of four
  streams (one idle on day 2, one starting on day 3) with delayed labels in the events
  (``label_time``: labels pending in the state across days), each day's ``scores``, ``state``
  and ``daily`` written as Parquet: ``calpipe spark-run`` before the redesign (since then it
  writes ``calpipe run``'s tables, tested equal to them in ``tests/spark/``).

The inputs of ``labels12``, ``k4`` and ``spark`` are committed (``tests/data/golden/inputs/``),
so a change of ``calpipe.generate`` does not change them; the demo is ``calpipe demo`` as it
is. The scenarios' tables are read back as DuckDB has them (every table and view of the
database) or as Spark wrote them (its three Parquet tables), normalized
(:data:`tests.golden.canonical.NORMALIZED`) and written in canonical form
(:mod:`tests.golden.canonical`): column types and digests, a digest per table and day, and the
full rows (all of them, but only a few days of the demo's big tables).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from tests.golden.canonical import (
    NORMALIZED,
    Captured,
    Context,
    Encoded,
    encode,
    normalize,
    read_duckdb,
    read_partitioned_parquet,
    write_golden,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden"
INPUTS = GOLDEN / "inputs"
SCENARIOS = ("demo", "labels12", "k4", "spark")

#: Each DuckDB table's and view's (sort keys, day column): the tables' are
#: ``calpipe.storage.SORT_KEYS`` and ``PARTITION_COLUMN`` as of the golden data (copied, so the
#: comparison does not depend on where a redesign moves them; :func:`check_keys` compares them
#: while the old code is there). A table not listed is sorted by its rows' bytes, as one day.
DB_KEYS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "scored_events": (("stream", "event_time", "event_id"), "event_date"),
    "protected_scores": (("stream", "event_id"), "event_date"),
    "calibrator_state": (("stream",), "date"),
    "pipeline_days": ((), "date"),
    "calibration_daily": (("stream",), "date"),
    "calibration_arrivals": (("stream",), "date"),
    "performance_estimates": (("stream",), "date"),
    "martingale_alarms": (("stream",), "date"),
    "change_points": (("stream",), "detected_date"),
    "calibration_map": (("stream", "layer", "term"), "date"),
    "pipeline_inputs": (("kind", "file"), "date"),
    "event_labels": (("stream", "event_id"), "date"),
    "quarantined_labels": (("file", "stream", "event_id"), "date"),
    "calpipe_meta": (("key",), None),
    "v_protected_scores": (("stream", "event_id"), "event_date"),
    "v_calibration_daily": (("stream",), "date"),
    "v_alarms": (("stream",), None),
    "v_latest_calibration_map": (("stream", "layer", "term"), "date"),
    "v_performance_estimates": (("stream",), "date"),
    "v_change_points": (("stream", "change_number"), None),
}
#: Spark's output tables (``OUT/<name>/date=D/*.parquet``): sort keys within a day.
SPARK_KEYS: dict[str, tuple[str, ...]] = {
    "scores": ("stream", "event_id"),
    "state": ("stream",),
    "daily": ("stream",),
}
#: The demo's days whose full rows are committed (its tables are too big to commit whole:
#: their other days are digests): the first day, the four alarms' days, the synthetic streams'
#: first day and the last day.
DEMO_FULL_DAYS = frozenset(
    {"2008-06-09", "2008-06-20", "2010-07-21", "2010-09-06", "2010-09-21", "2010-10-11",
     "2010-11-17", "*"}
)  # fmt: skip

START = dt.date(2010, 7, 21)


def day(i: int) -> dt.date:
    return START + dt.timedelta(days=i)


# ----------------------------------------------------------------------------------------------
# Running calpipe as a user does
# ----------------------------------------------------------------------------------------------
def calpipe(*argv: object, logs: list[str] | None = None) -> str:
    """``calpipe ARGV`` in this process; its output (also appended to ``logs``), or
    RuntimeError with it if it failed."""
    from calpipe.cli import main

    args = [str(a) for a in argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(args)
    if logs is not None:
        logs.append(out.getvalue())
    if code != 0:
        raise RuntimeError(f"calpipe {' '.join(args)} exited {code}:\n{out.getvalue()}")
    return out.getvalue()


def land(frame: pl.DataFrame, root: Path, d: dt.date, time_column: str, name: str) -> None:
    """Write the rows of ``frame`` whose ``time_column`` falls on ``d`` as
    ``root/date=d/name`` (what an upstream job lands; nothing on a day without rows), written
    to a temporary name and renamed."""
    part = frame.filter(pl.col(time_column).dt.date() == d)
    if part.height == 0:
        return
    sub = root / f"date={d.isoformat()}"
    sub.mkdir(parents=True, exist_ok=True)
    part.write_parquet(sub / f".{name}.tmp")
    (sub / f".{name}.tmp").replace(sub / name)


def capture_db(db: Path, ctx: Context) -> dict[str, Captured]:
    """Every table and view of the database at ``db``, normalized."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        names = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE NOT internal UNION "
                "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1"
            ).fetchall()
        ]
        out = {}
        for name in names:
            keys, day_col = DB_KEYS.get(name, ((), None))
            out[name] = normalize(read_duckdb(con, name, keys, day_col), ctx)
    finally:
        con.close()
    return out


def check_keys() -> None:
    """:data:`DB_KEYS` of the tables is the storage's layout (``calpipe.storage``)."""
    from calpipe import storage

    sort_keys = getattr(storage, "SORT_KEYS", None)
    partition = getattr(storage, "PARTITION_COLUMN", None)
    if sort_keys is None or partition is None:
        return
    for table, keys in sort_keys.items():
        want = (tuple(k for k in keys if k != partition[table]), partition[table])
        if DB_KEYS.get(table) != want:
            raise AssertionError(f"DB_KEYS[{table!r}] = {DB_KEYS.get(table)}, the store: {want}")


# ----------------------------------------------------------------------------------------------
# Inputs (committed; drawn again with --new-inputs)
# ----------------------------------------------------------------------------------------------
def _null_labels(events: pl.DataFrame, rng: np.random.Generator, frac: float) -> pl.DataFrame:
    """``frac`` of the labels unknown for good (null in the scores, never in the feed)."""
    keep = pl.Series(rng.random(events.height) >= frac)
    return events.with_columns(pl.when(keep).then(pl.col("label")).alias("label"))


def _split_feed(events: pl.DataFrame, rng: np.random.Generator, frac: float, max_days: int):
    """(scores, labels): ``frac`` of the known labels leave their scores rows for the feed, with
    a delay of 0 to ``max_days`` days (a tenth exactly 0: label_time = event_time), so labels
    arrive out of event order; labels that would land after the last day never do."""
    n = events.height
    fed = events["label"].is_not_null().to_numpy() & (rng.random(n) < frac)
    delay = rng.integers(0, max_days * 86_400_000_000, n)
    delay[rng.random(n) < 0.1] = 0
    lt = events["event_time"] + pl.Series(delay).cast(pl.Duration("us"))
    arrives = fed & (lt.dt.date() <= events["event_time"].max().date()).to_numpy()
    scores = events.with_columns(pl.when(pl.Series(~fed)).then(pl.col("label")).alias("label"))
    labels = (
        events.with_columns(lt.alias("label_time"))
        .filter(pl.Series(arrives))
        .select("stream", "event_id", "label", "label_time")
    )
    return scores, labels


#: labels12: day 3's scores land on night 5; day 7's scores file is corrected after night 12
L12_DAYS, L12_LATE, L12_CORRECTED = 12, 3, 7


def _inputs_labels12() -> dict[str, pl.DataFrame]:
    from calpipe import generate
    from calpipe.generate import StreamSpec

    streams = (
        StreamSpec("a", events_per_day=30),
        StreamSpec("b", "shift", 4, 20, strength=1.5),
        StreamSpec("c", events_per_day=4),
        StreamSpec("d", "overconfident", 6, 12, strength=2.0),
    )
    events = generate.generate(n_days=L12_DAYS, streams=streams, seed=1201, start=START)
    d = pl.col("event_time").dt.date()
    events = events.filter(
        ~((pl.col("stream") == "d") & (d < day(2))),  # d starts on day 2
        ~((pl.col("stream") == "c") & (d == day(5))),  # c is idle on day 5
    )
    rng = np.random.default_rng(1202)
    scores, labels = _split_feed(_null_labels(events, rng, 0.08), rng, 0.6, 3)
    unknown = pl.DataFrame(
        {
            "stream": ["a", "b", "a"],
            "event_id": [900_001, 900_002, 900_003],
            "label": pl.Series([1, 0, 1], dtype=pl.Int32),
            "label_time": [
                dt.datetime.combine(day(2), dt.time(12)),
                dt.datetime.combine(day(6), dt.time(8, 30)),
                dt.datetime.combine(day(9), dt.time(18, 15)),
            ],
        },
        schema=labels.schema,
    )
    labels = pl.concat([labels, unknown]).sort("label_time", "stream", "event_id")
    # the correction: a third of day 7's events get another score (the model re-scored them)
    d7 = scores.filter(d == day(L12_CORRECTED))
    changed = pl.Series(rng.random(d7.height) < 1 / 3)
    new = pl.Series(rng.uniform(0.02, 0.98, d7.height))
    corrected = d7.with_columns(
        pl.when(changed).then(new).otherwise(pl.col("score")).alias("score")
    )
    return {"scores": scores, "labels": labels, "corrected": corrected}


K = 4


def _with_classes(events: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """K-class forecasts: a random ``scores`` vector per event (Dirichlet, a few exactly 0 in a
    class) in place of ``score``, labels drawn from a sharpened forecast (miscalibrated)."""
    p = rng.dirichlet(np.full(K, 1.5), size=events.height)
    p[rng.random(events.height) < 0.03, 0] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    sharp = p**2 / (p**2).sum(axis=1, keepdims=True)
    y = np.minimum(
        (rng.random(events.height)[:, None] > np.cumsum(sharp, axis=1)).sum(axis=1), K - 1
    )
    return events.drop("score").with_columns(
        pl.Series("scores", p).cast(pl.List(pl.Float64)),
        pl.Series("label", y.astype(np.int32)),
    )


K4_DAYS = 5


def _inputs_k4() -> dict[str, pl.DataFrame]:
    from calpipe import generate
    from calpipe.generate import StreamSpec

    streams = (
        StreamSpec("triage", events_per_day=25),
        StreamSpec("routing", "shift", 2, 15, strength=1.5),
        StreamSpec("rare", events_per_day=3),
    )
    events = generate.generate(n_days=K4_DAYS, streams=streams, seed=4401, start=START)
    rng = np.random.default_rng(4402)
    events = _with_classes(events, rng).with_columns(
        pl.format("ev-{}", pl.col("event_id")).alias("event_id"),  # "ev-10" < "ev-9"
        pl.col("event_time").dt.truncate("2h"),  # ties in event time: ordered by the string id
    )
    scores, labels = _split_feed(_null_labels(events, rng, 0.1), rng, 0.5, 2)
    unknown = pl.DataFrame(
        {
            "stream": ["triage"],
            "event_id": ["ev-999999"],
            "label": pl.Series([2], dtype=pl.Int32),
            "label_time": [dt.datetime.combine(day(3), dt.time(9))],
        },
        schema=labels.schema,
    )
    labels = pl.concat([labels, unknown]).sort("label_time", "stream", "event_id")
    return {"scores": scores, "labels": labels}


SPARK_DAYS = 3


def _inputs_spark() -> dict[str, pl.DataFrame]:
    from calpipe import generate
    from calpipe.generate import StreamSpec

    streams = (
        StreamSpec("a", events_per_day=30),
        StreamSpec("b", "shift", 1, 20, strength=1.5),
        StreamSpec("c", events_per_day=10),
        StreamSpec("d", events_per_day=8),
    )
    events = generate.generate(n_days=SPARK_DAYS, streams=streams, seed=5501, start=START)
    d = pl.col("event_time").dt.date()
    events = events.filter(
        ~((pl.col("stream") == "c") & (d == day(1))),  # c is idle on day 2
        ~((pl.col("stream") == "d") & (d < day(2))),  # d starts on day 3
    )
    rng = np.random.default_rng(5502)
    events = _null_labels(events, rng, 0.1)
    n = events.height
    delay = pl.Series(rng.integers(0, 36 * 3_600_000_000, n)).cast(pl.Duration("us"))
    delayed = pl.Series(rng.random(n) >= 0.4)  # else known at the event (null label_time)
    lt = pl.when(pl.col("label").is_not_null() & delayed).then(pl.col("event_time") + delay)
    return {"events": events.with_columns(lt.alias("label_time"))}


INPUT_MAKERS = {"labels12": _inputs_labels12, "k4": _inputs_k4, "spark": _inputs_spark}


def write_inputs(scenario: str, root: Path = INPUTS) -> None:
    folder = root / scenario
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in INPUT_MAKERS[scenario]().items():
        frame.write_parquet(folder / f"{name}.parquet", compression="zstd")


def read_inputs(scenario: str, root: Path = INPUTS) -> dict[str, pl.DataFrame]:
    return {p.stem: pl.read_parquet(p) for p in sorted((root / scenario).glob("*.parquet"))}


# ----------------------------------------------------------------------------------------------
# The scenarios
# ----------------------------------------------------------------------------------------------
def build_demo(work: Path, inputs: Path, logs: list[str] | None) -> dict[str, Captured]:
    db = work / "demo.duckdb"
    calpipe("demo", "--db", db, "--no-progress", logs=logs)
    return capture_db(db, Context(work, {"scores": work / "landing"}))


def _run_args(work: Path) -> list[object]:
    return [
        "run", "--events", work / "scores", "--labels", work / "labels", "--db",
        work / "db.duckdb", "--on-unknown-label", "quarantine", "--no-progress",
    ]  # fmt: skip


def build_labels12(work: Path, inputs: Path, logs: list[str] | None) -> dict[str, Captured]:
    data = read_inputs("labels12", inputs)
    scores, labels = work / "scores", work / "labels"
    for root in (scores, labels):
        root.mkdir()
    for i in range(L12_DAYS):  # night i: what landed that day, then the nightly run
        if i != L12_LATE:
            land(data["scores"], scores, day(i), "event_time", "events.parquet")
        if i == L12_LATE + 2:
            land(data["scores"], scores, day(L12_LATE), "event_time", "events.parquet")
        land(data["labels"], labels, day(i), "label_time", "labels.parquet")
        calpipe(*_run_args(work), logs=logs)
    # day 7's scores file rewritten with changed scores: the next run replays days 7 .. 11
    land(data["corrected"], scores, day(L12_CORRECTED), "event_time", "events.parquet")
    calpipe(*_run_args(work), logs=logs)
    return capture_db(work / "db.duckdb", Context(work, {"scores": scores, "labels": labels}))


def build_k4(work: Path, inputs: Path, logs: list[str] | None) -> dict[str, Captured]:
    data = read_inputs("k4", inputs)
    scores, labels = work / "scores", work / "labels"
    for root in (scores, labels):
        root.mkdir()
    for i in range(K4_DAYS):
        land(data["scores"], scores, day(i), "event_time", "events.parquet")
        land(data["labels"], labels, day(i), "label_time", "labels.parquet")
        calpipe(*_run_args(work), logs=logs)
    return capture_db(work / "db.duckdb", Context(work, {"scores": scores, "labels": labels}))


def build_spark(work: Path, inputs: Path, logs: list[str] | None) -> dict[str, Captured]:
    from pyspark.sql import SparkSession

    data = read_inputs("spark", inputs)
    landing, out = work / "landing", work / "out"
    for i in range(SPARK_DAYS):
        land(data["events"], landing, day(i), "event_time", "events.parquet")
    cache = REPO / ".venv" / "numba_cache"
    if cache.is_dir():  # the workers load the compiled kernels instead of compiling them
        os.environ.setdefault("NUMBA_CACHE_DIR", str(cache))
    had = SparkSession.getActiveSession()
    # a JVM started for three small days spends most of its CPU in the JIT's optimizing
    # compiler: its first tier only halves that (70 -> 36 s of CPU here), the rows are the same
    # (Python computes them). Only for a JVM this process starts, unless the user set the args.
    ours = "PYSPARK_SUBMIT_ARGS" not in os.environ
    if ours:
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
        )
    try:
        _spark_chain(landing, out, logs)
    finally:
        if ours:
            del os.environ["PYSPARK_SUBMIT_ARGS"]
        session = SparkSession.getActiveSession()
        if had is None and session is not None:
            session.stop()
    return {
        name: read_partitioned_parquet(out / name, name, keys, "date")
        for name, keys in SPARK_KEYS.items()
    }


def _spark_chain(landing: Path, out: Path, logs: list[str] | None) -> None:
    """The days of ``landing`` through :func:`calpipe.spark.protect_day` on local[1], each from
    the state the day before wrote (the default method, two buckets, the events' own delayed
    labels pending in the state), writing each day's ``scores``, ``state`` and per-stream
    ``daily`` metrics as Parquet partitioned by ``date``: what ``calpipe spark-run`` wrote
    before the redesign of #32, which made it write ``calpipe run``'s tables through the night
    function (tested equal to ``calpipe run`` in ``tests/spark/``). Spark's transform itself,
    ``protect_day``, is what this scenario keeps bit for bit."""
    from pyspark.sql import functions as F

    from calpipe import config
    from calpipe import spark as cs

    session = cs.session("local[1]")
    state = None
    for i in range(SPARK_DAYS):
        d = day(i)
        events = session.read.parquet(str(landing / f"date={d.isoformat()}"))
        night = cs.protect_day(
            events, state, daily=True, method=config.DEFAULT_METHOD, n_buckets=2,
            label_time="label_time",
        )  # fmt: skip
        for name, frame in (("scores", night.scores), ("state", night.state),
                            ("daily", night.daily)):  # fmt: skip
            rows = frame.select("*", F.lit(d).cast("date").alias("date"))
            rows.write.mode("overwrite").partitionBy("date").parquet(str(out / name))
        night.release()
        state = session.read.parquet(str(out / "state" / f"date={d.isoformat()}"))
        if logs is not None:
            logs.append(f"{d}: written to {out}/{{scores,state,daily}}")


BUILDERS = {
    "demo": build_demo,
    "labels12": build_labels12,
    "k4": build_k4,
    "spark": build_spark,
}


def build(
    scenario: str, work: Path, inputs: Path = INPUTS, logs: list[str] | None = None
) -> dict[str, Encoded]:
    """Build ``scenario`` in the empty folder ``work`` and return its tables, encoded (the
    output of each ``calpipe`` command appended to ``logs``)."""
    return {name: encode(t) for name, t in BUILDERS[scenario](work, inputs, logs).items()}


def check_logs(scenario: str, logs: list[str]) -> None:
    """What the golden data must have gone through (when it is written): the labels12 chain
    replayed its late day on night 6 and its corrected day on the 13th run."""
    if scenario != "labels12":
        return
    for i, d in ((L12_LATE + 2, L12_LATE), (L12_DAYS, L12_CORRECTED)):
        if f"replaying {day(d)}" not in logs[i]:
            raise AssertionError(f"labels12, run {i + 1} did not replay {day(d)}:\n{logs[i]}")


def full_days(scenario: str):
    """Which days' full rows ``scenario`` commits (None: all)."""
    if scenario != "demo":
        return lambda _e: None
    return lambda _e: DEMO_FULL_DAYS


# ----------------------------------------------------------------------------------------------
# README
# ----------------------------------------------------------------------------------------------
def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


#: What each scenario runs (the README's words; the module docstring has the details).
SCENARIO_TEXT = {
    "demo": "`calpipe demo`: the bank stream and the six seeded synthetic streams, day by day "
    "in spans, the default method.",
    "labels12": "12 nights of `calpipe run --labels --on-unknown-label quarantine`, one run a "
    "night, binary scores, the default method: labels landing 0-3 days after their events, a "
    "stream starting on day 2 and one idle on day 5, day 3's scores landing two nights late "
    "(replayed), three labels of unknown events quarantined, then day 7's scores file rewritten "
    "with changed scores and a 13th run replaying days 7-11.",
    "k4": "5 nights of `calpipe run --labels` on K = 4 class `scores` lists, string event ids "
    "and ties in event time, the default method: labels landing 0-2 days late, one label of an "
    "unknown event quarantined.",
    "spark": "`calpipe.spark.protect_day` on local[1], two buckets, over 3 days, the default "
    "method: a stream idle on day 2, one starting on day 3, delayed labels in the events "
    "(`label_time`), pending in the state across days; each day's scores, state and daily "
    "metrics written as Parquet (what `calpipe spark-run` wrote before #32's redesign).",
}


def _facts(tables: dict[str, Encoded]) -> str:
    """Events, streams, days (and labels) of a scenario, from its tables."""
    events = tables.get("scored_events") or tables["scores"]
    streams = len(set(events.captured.data.column("stream").to_pylist()))
    if "pipeline_days" in tables:
        days = tables["pipeline_days"].n_rows
    else:
        days = len(events.spans)
    text = f"{events.n_rows} events, {streams} streams, {days} days"
    if "event_labels" in tables and tables["event_labels"].n_rows:
        text += (
            f", {tables['event_labels'].n_rows} labels of the feed, "
            f"{tables['quarantined_labels'].n_rows} quarantined"
        )
    return text


def write_readme(out: Path, summaries: dict[str, tuple[str, list[tuple[str, int, int]]]]) -> None:
    lines = [
        "# Golden tables (issue #32)",
        "",
        "Every table of four pipeline scenarios as the nightly layer wrote them before its",
        "redesign: `tests/test_golden_tables.py` rebuilds each scenario with the code under",
        "test and compares its tables with these, bit for bit. Written by",
        "`python -m tests.golden.make_golden` (`tests/golden/make_golden.py` says what each",
        "scenario runs; `tests/golden/canonical.py` the canonical form).",
        "",
        "Per scenario: `columns.tsv` (each table's columns in order, their types and a SHA-256",
        "of each column over all rows), `days.tsv` (each table's rows and SHA-256 per day) and",
        "`rows/<table>.parquet` (the rows themselves, normalized; for the demo only the days",
        f"{', '.join(sorted(d for d in DEMO_FULL_DAYS if d != '*'))}, and whole tables without",
        "a day). `inputs/` holds the inputs of the scenarios other than the demo.",
        "",
        "## Normalized columns",
        "",
        "Every other column is compared exactly (floats bit for bit, nulls, types, order).",
        "",
        "| table | column | compared as | why |",
        "|---|---|---|---|",
    ]
    for (table, column), (what, why, _) in NORMALIZED.items():
        lines.append(f"| `{table}` | `{column}` | {what} | {why} |")
    lines += ["", "## Scenarios", ""]
    for scenario, (facts, rows) in summaries.items():
        lines += [
            f"### {scenario}",
            "",
            f"{SCENARIO_TEXT[scenario]} {facts}; {_size(out / scenario) / 1024:.0f} KB on disk.",
            "",
            "| table | rows | days |",
            "|---|---:|---:|",
        ]
        lines += [f"| `{t}` | {n} | {d} |" for t, n, d in rows]
        lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def _summary(tables: dict[str, Encoded]) -> list[tuple[str, int, int]]:
    return [(name, e.n_rows, len(set(e.spans) - {"*"})) for name, e in sorted(tables.items())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.golden.make_golden", description=__doc__)
    p.add_argument("--out", type=Path, default=GOLDEN, help=f"default {GOLDEN}")
    p.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: all")
    p.add_argument("--new-inputs", action="store_true",
                   help="draw the inputs again (default: the committed ones)")  # fmt: skip
    args = p.parse_args(argv)
    check_keys()
    scenarios = args.scenario or list(SCENARIOS)
    inputs = args.out / "inputs"
    if inputs != INPUTS and INPUTS.is_dir() and not args.new_inputs:
        shutil.copytree(INPUTS, inputs, dirs_exist_ok=True)
    summaries = {}
    for scenario in scenarios:
        if scenario in INPUT_MAKERS and (args.new_inputs or not (inputs / scenario).is_dir()):
            write_inputs(scenario, inputs)
        t0 = time.perf_counter()
        logs: list[str] = []
        with tempfile.TemporaryDirectory(prefix=f"golden-{scenario}-") as work:
            tables = build(scenario, Path(work), inputs, logs)
        check_logs(scenario, logs)
        write_golden(args.out / scenario, tables, full_days(scenario))
        summaries[scenario] = (_facts(tables), _summary(tables))
        print(
            f"{scenario}: {summaries[scenario][0]}; {len(tables)} tables, "
            f"{_size(args.out / scenario) / 1024:.0f} KB, built in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    if set(scenarios) == set(SCENARIOS):
        write_readme(args.out, summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
