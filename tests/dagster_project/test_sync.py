"""calpipe/dagster_project/sync.py: days computed by calpipe run become dagster materializations
(#14: after `calpipe demo` the UI showed every asset 0 % materialized)."""

from __future__ import annotations

import datetime as dt

from dagster import AssetKey, DagsterInstance

from calpipe import cli, pipeline, storage
from calpipe.dagster_project import sync


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
