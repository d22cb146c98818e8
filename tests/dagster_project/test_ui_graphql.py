"""The running UI, driven through its GraphQL API as the browser does (#14).

`calpipe ui` on a database a `calpipe run` filled: the days computed outside dagster show as
materialized (the background sync), a run launched through GraphQL materializes one partition,
and its metadata read back through GraphQL holds that partition's own numbers. Then Ctrl-C
stops everything.
"""

from __future__ import annotations

import json

import pytest

from calpipe import pipeline
from tests.ui_client import RunningUI, wait_for

pytestmark = pytest.mark.slow


def test_the_ui_shows_cli_days_and_materializes_a_partition_through_graphql(cli_chain, tmp_path):
    events, db = cli_chain
    days = [d.isoformat() for d in sorted(events["event_time"].dt.date().unique())]
    ui = RunningUI(db, cwd=tmp_path)
    try:
        ui.wait_ready()
        # the CLI's days, reported by the background sync: every asset, every day
        wait_for(
            "the sync",
            lambda: all(ui.materialized(a) == len(days) for a in pipeline.ASSET_TABLES),
            360,
        )
        run_id, status = ui.materialize(days[2], timeout=180)
        assert status == "SUCCESS"
        mat = ui.gql(
            """query($day: String!) { assetOrError(assetKey: {path: ["protected_scores"]}) { ... on Asset {
                 assetMaterializations(partitions: [$day], limit: 1) { runId metadataEntries {
                   label ... on IntMetadataEntry { intValue } ... on TableMetadataEntry { table { records } } } } } } }""",
            {"day": days[2]},
        )["assetOrError"]["assetMaterializations"][0]  # fmt: skip
        assert mat["runId"] == run_id
        entries = {e["label"]: e for e in mat["metadataEntries"]}
        n_day = events.filter(events["event_time"].dt.date().cast(str) == days[2]).height
        assert entries["dagster/row_count"]["intValue"] == n_day
        streams = {json.loads(r)["stream"] for r in entries["metrics"]["table"]["records"]}
        assert streams == {"a", "b"}
        # a single-run backfill of days 1-3: the daemon's range metadata sensor then gives each
        # partition its own counts (dagster gives them the run's one metadata)
        run_id, status = ui.materialize(days[1], timeout=180, last=days[3])
        assert status == "SUCCESS"

        def latest(day):
            q = """query($day: String!) { assetOrError(assetKey: {path: ["protected_scores"]}) {
                     ... on Asset { assetMaterializations(partitions: [$day], limit: 1) {
                       metadataEntries { label ... on IntMetadataEntry { intValue }
                                         ... on TextMetadataEntry { text } } } } } }"""
            mat = ui.gql(q, {"day": day})["assetOrError"]["assetMaterializations"][0]
            return {e["label"]: e for e in mat["metadataEntries"]}

        wait_for(
            "the range metadata sensor",
            lambda: all(latest(d).get("run", {}).get("text") == run_id for d in days[1:]),
            180,
        )
        for d in days[1:]:
            n_day = events.filter(events["event_time"].dt.date().cast(str) == d).height
            assert latest(d)["dagster/row_count"]["intValue"] == n_day
    except (AssertionError, TimeoutError, RuntimeError) as exc:  # with the UI's own output
        raise AssertionError(f"{exc}\n--- calpipe ui's output ---\n{ui.stop()[-4000:]}") from exc
    finally:
        out = ui.stop()
    assert "dagster: 4 day(s) computed outside dagster recorded" in out
