"""calpipe/dagster_project/sync.py: days computed by calpipe run become dagster materializations
(#14: after `calpipe demo` the UI showed every asset 0 % materialized)."""

from __future__ import annotations

import datetime as dt

from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, DagsterInstance

from calpipe import cli, generate, pipeline, storage
from calpipe.dagster_project import sync
from calpipe.dagster_project.metadata import CHECK_ASSETS

from .conftest import CLI_STREAMS


def _latest(instance, asset: str) -> dict[str, dict]:
    res = instance.fetch_materializations(AssetKey(asset), limit=1000)
    out = {}
    for rec in res.records:
        mat = rec.asset_materialization
        out.setdefault(mat.partition, {k: v.value for k, v in mat.metadata.items()})
    return out


def test_days_of_a_cli_run_are_reported_once_with_their_own_counts(cli_chain, tmp_path):
    events, db = cli_chain
    con = storage.connect(db, read_only=True)
    days = pipeline.stored_days(con)
    con.close()
    with DagsterInstance.ephemeral() as instance:
        assert sync.report_stored_days(instance, db) == 4
        keys = {d.isoformat() for d in days["date"]}
        for asset in pipeline.ASSET_TABLES:
            assert instance.get_materialized_partitions(AssetKey(asset)) == keys, asset
            meta = _latest(instance, asset)
            for row in days.iter_rows(named=True):  # each partition its own day's rows
                assert meta[row["date"].isoformat()]["dagster/row_count"] == row[asset]
        per_day = dict(events.group_by(events["event_time"].dt.date()).len().iter_rows())
        assert {dt.date.fromisoformat(k): v["dagster/row_count"]
                for k, v in _latest(instance, "scored_events").items()} == per_day  # fmt: skip
        assert sync.report_stored_days(instance, db) == 0  # nothing new: nothing reported

        # a corrected landing file: calpipe run replays from that day; the sync re-reports
        # exactly the days whose state changed
        day2 = sorted(per_day)[2]
        fixed = events.filter(events["event_time"].dt.date() == day2).head(10)
        storage.write_landing(fixed, tmp_path / "landing")
        argv = ["run", "--events", str(tmp_path / "landing"), "--db", str(db), "--no-progress"]
        assert cli.main(argv) == 0
        assert sync.report_stored_days(instance, db) == 2  # day 2 and day 3 (its state follows)
        assert _latest(instance, "scored_events")[day2.isoformat()]["dagster/row_count"] == 10


def _check_statuses(instance, asset: str, check: str) -> dict[str, tuple[bool, bool]]:
    """partition -> (passed, aimed at the partition's latest materialization) of the latest
    evaluation of ``check`` on each partition."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey(asset), check), limit=1000
    )
    out = {}
    for rec in records:  # newest first
        ev = rec.event.dagster_event.event_specific_data
        if ev.partition in out:
            continue
        latest = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[ev.partition]), limit=1
        ).records[0]
        out[ev.partition] = (
            ev.passed,
            ev.target_materialization_data.storage_id == latest.storage_id,
        )
    return out


def test_days_of_a_cli_run_get_their_own_check_results_and_the_run_s_facts(cli_chain, tmp_path):
    """Regression (#37): after `calpipe demo` the UI said "Not evaluated" for every check (the
    sync reported materializations only), and nothing said which command computed a day."""
    _events, db = cli_chain
    con = storage.connect(db, read_only=True)
    days = pipeline.stored_days(con)["date"].to_list()
    expected = {d.isoformat(): {c.name: c.passed for c in pipeline.data_checks(con, d, d)}
                for d in days}  # fmt: skip
    con.close()
    with DagsterInstance.ephemeral() as instance:
        assert sync.report_stored_days(instance, db) == 4
        for check, asset in CHECK_ASSETS.items():
            got = _check_statuses(instance, asset, check)
            assert set(got) == set(expected), check
            for day, (passed, current) in got.items():
                assert current and passed == expected[day][check], (check, day)
        meta = _latest(instance, "protected_scores")
        for d in days:
            m = meta[d.isoformat()]
            assert m["runner"] == "calpipe run" and m["run_events"] > 0 and m["run_seconds"] > 0
            assert m["run_days"] == f"{days[0]}..{days[-1]} (4 day(s))"
        # a second run of two more days: its days carry its own facts, the first four theirs
        more = generate.generate(n_days=6, streams=CLI_STREAMS, seed=9)
        new = more.filter(more["event_time"].dt.date() > days[-1])
        storage.write_landing(new, tmp_path / "landing")
        argv = ["run", "--events", str(tmp_path / "landing"), "--db", str(db), "--no-progress"]
        assert cli.main(argv) == 0
        assert sync.report_stored_days(instance, db) == 2
        meta = _latest(instance, "protected_scores")
        last = [k for k in sorted(meta)][-2:]
        assert all(meta[k]["run_events"] == new.height for k in last)
        assert meta[days[0].isoformat()]["run_days"].endswith("(4 day(s))")
        assert set(_check_statuses(instance, "calibrator_state", "state_continuity")) == {
            *expected,
            *last,
        }
