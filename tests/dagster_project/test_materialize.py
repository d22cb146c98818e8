"""In-process materializations of the assets on a temporary DuckDB file."""

from __future__ import annotations

import base64
import datetime as dt

import numpy as np
import polars as pl
import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    build_run_status_sensor_context,
    materialize,
)
from dagster_duckdb import DuckDBResource

import calpipe
from calpipe import config, generate, storage
from calpipe.dagster_project.defs.partitions import RANGE_END_TAG, RANGE_START_TAG
from calpipe.dagster_project.defs.sensors import range_metadata_sensor
from calpipe.dagster_project.metadata import CHECK_ASSETS
from calpipe.generate import StreamSpec

from .location import location

#: dagster's own notices (backfill_policy is "beta"; its schedule helper calls a deprecated API).
pytestmark = [
    pytest.mark.filterwarnings("ignore::dagster.BetaWarning"),
    pytest.mark.filterwarnings(
        "ignore:Function `JobDefinition.run_request_for_partition`:DeprecationWarning"
    ),
]

START = generate.DEFAULT_START
N_DAYS = 6
STREAMS = (
    StreamSpec("calm", events_per_day=40),
    StreamSpec("drifting", "overconfident", 1, 60, strength=0.2),  # alarms within days
)
TABLES = tuple(storage.PARTITION_COLUMN)


def day(i: int) -> str:
    return (START + dt.timedelta(days=i)).isoformat()


@pytest.fixture(scope="module")
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def setup(tmp_path, instance):
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)
    storage.write_landing(events, tmp_path / "landing")
    db = tmp_path / "db.duckdb"
    defs = location(db, str(tmp_path / "landing"), START, START + dt.timedelta(days=N_DAYS - 1))
    assets = list(defs.assets)

    def run(first: str, last: str | None = None):
        kw = (
            {"partition_key": first}
            if last is None
            else {"tags": {RANGE_START_TAG: first, RANGE_END_TAG: last}}
        )
        return materialize(
            assets, resources=defs.resources, instance=instance, raise_on_error=False, **kw
        )

    return run, db, events, tmp_path


def read(db, sql: str) -> pl.DataFrame:
    con = storage.connect(db, read_only=True)
    try:
        return storage.query(con, sql)
    finally:
        con.close()


def snapshot(db) -> dict[str, pl.DataFrame]:
    return {t: read(db, f"SELECT * FROM {t} ORDER BY ALL") for t in TABLES}


def failure_messages(result) -> str:
    """The messages of every failed step, with their causes (the calpipe error is the cause)."""
    out = []
    for e in result.all_events:
        if e.event_type_value == "STEP_FAILURE":
            err = e.step_failure_data.error
            while err is not None:
                out.append(err.message)
                err = err.cause
    return "\n".join(out)


def test_daily_and_range_materializations_equal_one_protect_pass(setup):
    run, db, events, _tmp = setup
    for i in range(3):
        r = run(day(i))
        assert r.success, failure_messages(r)
        checks = r.get_asset_check_evaluations()
        assert {c.check_name for c in checks} == {
            "probabilities_valid", "rows_in_equal_rows_out", "state_continuity", "estimates_valid",
            "change_points_valid", "no_martingale_alarm",
        }  # fmt: skip
        assert all(c.passed for c in checks if c.check_name != "no_martingale_alarm")
    r = run(day(3), day(N_DAYS - 1))  # a single-run backfill over the rest
    assert r.success, failure_messages(r)
    mats = r.get_asset_materialization_events()
    assert {m.partition for m in mats} == {day(i) for i in range(3, N_DAYS)}

    chain = read(
        db, "SELECT stream, event_id, protected_score, log10_martingale FROM protected_scores"
    )
    one = calpipe.protect(events, method=config.PIPELINE_DEFAULT_METHOD)
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height == chain.height
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() <= 1e-12
    assert (j["log10_martingale"] - j["log10_martingale_c"]).abs().max() <= 1e-12
    assert read(db, "SELECT count(*) FROM pipeline_days").item() == N_DAYS


def test_metadata_has_a_metrics_table_and_real_plots(setup):
    run, _db, _, _tmp = setup
    r = run(day(0))
    meta = {
        m.asset_key.to_user_string(): m.materialization.metadata
        for m in r.get_asset_materialization_events()
    }
    table = meta["protected_scores"]["metrics"]  # a typed table the UI shows whole
    assert [c.name for c in table.schema.columns][:2] == ["stream", "n_events"]
    assert "log10_S_end" in [c.name for c in table.schema.columns]  # not cut before the martingale
    assert {r.data["stream"] for r in table.records} == {"calm", "drifting"}
    n0 = read(_db, f"SELECT count(*) AS n FROM protected_scores WHERE event_date = '{day(0)}'")
    assert meta["protected_scores"]["dagster/row_count"].value == n0["n"][0] > 0
    daily = meta["calibration_daily"]
    for name in ("martingale_trajectory", "reliability_diagram"):
        md = daily[name].value
        png = base64.b64decode(md.split("base64,")[1].rstrip(")"))
        assert png.startswith(b"\x89PNG")
        path = daily[f"{name}_file"].value
        assert open(path, "rb").read() == png
    r = run(day(1), day(2))  # a range: files only, not copied into every partition's metadata
    daily = next(
        m.materialization.metadata for m in r.get_asset_materialization_events()
        if m.asset_key.to_user_string() == "calibration_daily"
    )  # fmt: skip
    assert "martingale_trajectory" not in daily and "martingale_trajectory_file" in daily
    # a range run's counts say they are the run's (dagster copies them onto each partition)
    assert "dagster/row_count" not in daily and daily["partitions_in_run"].value == 2
    n12 = read(
        _db, f"SELECT count(*) AS n FROM calibration_daily WHERE date IN ('{day(1)}', '{day(2)}')"
    )
    assert daily["rows_in_run"].value == n12["n"][0]


def test_rematerializing_a_partition_is_idempotent(setup):
    run, db, _, _ = setup
    assert run(day(0), day(3)).success
    before = snapshot(db)
    assert run(day(2)).success
    after = snapshot(db)
    for t in TABLES:
        assert after[t].equals(before[t]), t


def test_a_day_without_previous_state_fails_with_a_clear_message(setup):
    run, db, _, _ = setup
    assert run(day(0)).success
    before = snapshot(db)
    r = run(day(2))
    assert not r.success
    msg = failure_messages(r)
    assert f"day {day(1)} has no calibrator state" in msg and f"first missing day: {day(1)}" in msg
    after = snapshot(db)
    for t in ("protected_scores", "calibrator_state", "pipeline_days", "calibration_daily"):
        assert after[t].equals(before[t]), t


def test_bad_events_fail_the_partition_and_leave_the_tables(setup):
    run, db, _, tmp = setup
    assert run(day(0), day(1)).success
    before = snapshot(db)
    target = tmp / "landing" / f"date={day(1)}" / "events.parquet"
    pl.read_parquet(target).with_columns(
        pl.when(pl.int_range(pl.len()) == 2).then(None).otherwise(pl.col("score")).alias("score")
    ).write_parquet(target)
    r = run(day(1))
    assert not r.success
    assert "null score" in failure_messages(r) and f"day {day(1)}" in failure_messages(r)
    after = snapshot(db)
    for t in TABLES:
        assert after[t].equals(before[t]), t


def test_the_alarm_check_warns_without_failing_the_run(setup):
    run, db, _, _ = setup
    r = run(day(0), day(N_DAYS - 1))
    assert r.success
    check = next(
        c for c in r.get_asset_check_evaluations() if c.check_name == "no_martingale_alarm"
    )
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    assert "drifting" in check.description and "calm" not in check.description
    assert check.metadata["new_alarms"].value == 1  # numeric metadata, not only text
    assert check.metadata["streams_in_alarm"].value == 1
    alarms = read(db, "SELECT stream, date FROM martingale_alarms")
    assert alarms["stream"].to_list() == ["drifting"]
    assert alarms["date"][0] >= START + dt.timedelta(days=1)
    sql = read(db, "SELECT calibrate_score('drifting', 0.9) AS p")["p"][0]
    assert np.isfinite(sql) and sql < 0.9  # the map pulls an overconfident score in


def test_a_label_feed_materializes_day_by_day_like_calpipe_run(tmp_path, instance):
    """The assets with a label feed (CalpipeResource.labels): daily partitions one after the
    other write the tables of one ``calpipe run`` over the same landings, and the chain equals
    one pass with the labels at their label times."""
    from calpipe import pipeline
    from calpipe.pipeline.labels import label_source
    from tests.pipeline.test_labels import split_feed

    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)
    scores, labels, truth = split_feed(events, seed=7)
    storage.write_landing(scores, tmp_path / "scores")
    storage.write_landing(labels, tmp_path / "labels", time_column="label_time")
    db = tmp_path / "db.duckdb"
    defs = location(
        db, str(tmp_path / "scores"), START, START + dt.timedelta(days=N_DAYS - 1),
        labels=str(tmp_path / "labels"),
    )  # fmt: skip
    for i in range(N_DAYS):
        r = materialize(
            list(defs.assets), resources=defs.resources, instance=instance,
            partition_key=day(i), raise_on_error=False,
        )  # fmt: skip
        assert r.success, failure_messages(r)
    ref = tmp_path / "ref.duckdb"
    con = storage.connect(ref)
    try:
        src = storage.EventSource.parse(str(tmp_path / "scores"))
        pipeline.run_range(con, src, labels=label_source(str(tmp_path / "labels")))
    finally:
        con.close()
    for t in (
        "protected_scores",
        "calibrator_state",
        "event_labels",
        "calibration_daily",
        "calibration_arrivals",
    ):
        sql = f"SELECT * FROM {t} ORDER BY ALL"
        assert read(db, sql).equals(read(ref, sql)), t
    assert read(db, "SELECT count(*) FROM event_labels").item() == labels.height > 0
    one = calpipe.protect(truth, method=config.PIPELINE_DEFAULT_METHOD, label_time="label_time")
    j = one.join(read(db, "SELECT * FROM protected_scores"), on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() <= 1e-12


def test_the_ui_reruns_a_partition_of_a_calpipe_run_with_its_columns_and_method(
    tmp_path, instance, capsys, monkeypatch, load_location
):
    """`calpipe run` records its source, column map and method; `calpipe ui` hands them to the
    code location, which re-materializes a day of that chain identically (it used to fail:
    StateError, "computed by 'isotonic' ... this run is 'composite-experts'")."""
    from calpipe import cli
    from calpipe.cli import pipeline as cli_pipeline

    events = generate.generate(n_days=4, streams=STREAMS, seed=5).rename(
        {"stream": "segment", "event_time": "ts", "score": "p", "label": "y"}
    )
    src = tmp_path / "events.parquet"
    events.write_parquet(src)
    db = tmp_path / "run.duckdb"
    argv = ["run", "--events", str(src), "--db", str(db), "--stream-col", "segment",
            "--time-col", "ts", "--score-col", "p", "--label-col", "y", "--method", "isotonic",
            "--window", "50", "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    before = read(db, "SELECT * FROM protected_scores ORDER BY stream, event_id")
    _, env = cli_pipeline.ui_command(db.resolve())
    assert storage.ColumnMap.from_json(env["CALPIPE_COLUMNS"]).stream == "segment"
    assert '"isotonic"' in env["CALPIPE_SETTINGS"] and env["CALPIPE_EVENTS"] == str(src)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    defs = load_location()
    res = materialize(list(defs.assets), resources=defs.resources, instance=instance,
                      partition_key=day(3), raise_on_error=False)  # fmt: skip
    assert res.success
    after = read(db, "SELECT * FROM protected_scores ORDER BY stream, event_id")
    assert after.equals(before)


def test_checks_are_partitioned_like_their_assets(setup):
    """A one-day run's check results belong to that day (the UI shows them per partition)."""
    run, _db, _, _ = setup
    assert run(day(0), day(1)).success
    r = run(day(2))
    evals = r.get_asset_check_evaluations()
    assert {c.check_name for c in evals} == {"probabilities_valid", "rows_in_equal_rows_out",
                                             "state_continuity", "estimates_valid",
                                             "change_points_valid",
                                             "no_martingale_alarm"}  # fmt: skip
    assert {c.partition for c in evals} == {day(2)}


def test_a_range_run_gives_each_partition_its_own_check_results(setup, instance):
    """Regression (#37): after a backfill every partition's check said "Skipped" (a range run's
    check results have no partition); now each day gets the checks computed on it alone, aimed
    at that partition's materialization by the run."""
    run, db, _, _ = setup
    assert run(day(0)).success
    r = run(day(1), day(3))
    assert r.success, failure_messages(r)
    # the range's results (dagster requires one per check: no partition, so the UI shows none
    # of them on a partition), then each day's
    every = r.get_asset_check_evaluations()
    assert {e.check_name for e in every if e.partition is None} == set(CHECK_ASSETS)
    evals = [e for e in every if e.partition is not None]
    con = storage.connect(db, read_only=True)
    try:
        expected = {(day(i), c.name): c.passed for i in (1, 2, 3)
                    for c in calpipe.pipeline.data_checks(con, START + dt.timedelta(days=i),
                                                          START + dt.timedelta(days=i))}  # fmt: skip
    finally:
        con.close()
    assert {(e.partition, e.check_name): e.passed for e in evals} == expected
    assert len(evals) == len(expected)
    for e in evals:  # each aimed at its own partition's materialization of this run
        rec = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=e.asset_key, asset_partitions=[e.partition]), limit=1
        ).records[0]
        assert e.target_materialization_data.storage_id == rec.storage_id
        assert rec.run_id == r.dagster_run.run_id


def test_after_a_range_run_each_partition_has_its_own_metadata(setup, instance):
    """dagster gives a range run's partitions the run's one metadata; the range metadata sensor
    then reports each day's own counts as its partitions' latest materialization."""
    run, db, _events, _tmp = setup
    assert run(day(0)).success
    r = run(day(1), day(3))
    assert r.success, failure_messages(r)
    sensor = range_metadata_sensor
    context = build_run_status_sensor_context(
        sensor_name=sensor.name, dagster_instance=instance, dagster_run=r.dagster_run,
        dagster_event=r.get_run_success_event(), resources={"duckdb": DuckDBResource(database=str(db))},
    )  # fmt: skip
    out = sensor(context)
    assert "reported the metadata of 3 day(s)" in str(out.skip_message)
    counts = read(db, "SELECT event_date, count(*) AS n FROM protected_scores GROUP BY ALL")
    per_day = {d.isoformat(): n for d, n in counts.iter_rows()}
    for d in (day(1), day(2), day(3)):
        latest = instance.fetch_materializations(AssetKey("protected_scores"), limit=50).records
        # newest first: the partition's latest materialization is the sensor's, with the day's
        # own count (the run's says "rows_in_run" for the three days together)
        mat = next(
            m.asset_materialization for m in latest if m.asset_materialization.partition == d
        )
        assert mat.metadata["dagster/row_count"].value == per_day[d] > 0
        assert mat.metadata["run"].value == r.dagster_run.run_id
        assert "rows_in_run" not in mat.metadata
    # each day's check results are the run's again, aimed at those materializations (a result
    # aimed at an older one shows as "not evaluated")
    for name, asset in CHECK_ASSETS.items():
        history = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey(asset), name), limit=100
        )
        for d in (day(1), day(2), day(3)):
            rec = next(h for h in history if h.partition == d)  # newest first
            assert rec.run_id == r.dagster_run.run_id
            latest = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[d]), limit=1
            ).records[0]
            assert latest.run_id == ""  # the sensor's
            target = rec.event.dagster_event.event_specific_data.target_materialization_data
            assert target.storage_id == latest.storage_id, (name, d)
    # a one-partition run has its own metadata already: nothing to report
    single = run(day(3))
    context = build_run_status_sensor_context(
        sensor_name=sensor.name, dagster_instance=instance, dagster_run=single.dagster_run,
        dagster_event=single.get_run_success_event(),
        resources={"duckdb": DuckDBResource(database=str(db))},
    )  # fmt: skip
    assert "not a range run" in str(sensor(context).skip_message)
