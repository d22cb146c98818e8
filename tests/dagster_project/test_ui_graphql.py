"""The running UI, driven through its GraphQL API as the browser does (#14).

`calpipe ui` on a database a `calpipe run` filled: the days computed outside dagster show as
materialized (the background sync), a run launched through GraphQL materializes one partition,
and its metadata read back through GraphQL holds that partition's own numbers. Then Ctrl-C
stops everything (no dagster process left).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from calpipe import cli, generate, pipeline, store
from calpipe.generate import StreamSpec

pytestmark = pytest.mark.slow

STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", events_per_day=20))
LOCATION = "calpipe.dagster_project.definitions"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, fn, timeout: float = 120.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            value = fn()
        except (urllib.error.URLError, ConnectionError, OSError):
            value = None
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_ui_shows_cli_days_and_materializes_a_partition_through_graphql(tmp_path):
    events = generate.generate(n_days=4, streams=STREAMS, seed=9)
    store.write_landing(events, tmp_path / "landing")
    db = tmp_path / "g.duckdb"
    assert (
        cli.main(["run", "--events", str(tmp_path / "landing"), "--db", str(db), "--no-progress"])
        == 0
    )
    days = [d.isoformat() for d in sorted(events["event_time"].dt.date().unique())]
    port = _port()
    env = os.environ | {"DAGSTER_DISABLE_TELEMETRY": "1"}
    env.pop("DAGSTER_HOME", None)  # calpipe ui chooses the database's own instance
    ui = subprocess.Popen([sys.executable, "-m", "calpipe.cli", "ui", "--db", str(db), "--port", str(port)],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)  # fmt: skip

    def gql(query: str, variables: dict | None = None) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        assert "errors" not in out, out
        return out["data"]

    def materialized(asset: str) -> int:
        q = """query($a: [String!]!) { assetNodeOrError(assetKey: {path: $a}) {
                 ... on AssetNode { partitionStats { numMaterialized } } } }"""
        return gql(q, {"a": [asset]})["assetNodeOrError"]["partitionStats"]["numMaterialized"]

    failure = None
    try:
        # dagster dev starts a webserver, a code server and a daemon: on a loaded 2-core CI
        # machine that took over 2 minutes once, so the wait is generous
        _wait("the UI", lambda: gql("{ repositoriesOrError { __typename } }"), timeout=360)
        # the CLI's days, reported by the background sync: every asset, every day
        _wait(
            "the sync",
            lambda: all(materialized(a) == len(days) for a in pipeline.ASSET_TABLES),
            timeout=360,
        )

        run = gql(
            """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
                 __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
            {"p": {"selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                                "jobName": "__ASSET_JOB",
                                "assetSelection": [{"path": [a]} for a in pipeline.ASSET_TABLES]},
                   "executionMetadata": {"tags": [{"key": "dagster/partition", "value": days[2]}]}}},
        )["launchRun"]  # fmt: skip
        assert run["__typename"] == "LaunchRunSuccess", run
        run_id = run["run"]["runId"]
        status = _wait(
            "the run",
            lambda: (s := gql('query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }',
                              {"id": run_id})["runOrError"]["status"]) in ("SUCCESS", "FAILURE", "CANCELED") and s,
            timeout=180,
        )  # fmt: skip
        assert status == "SUCCESS"
        mat = gql(
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
    except AssertionError as exc:  # reported with the UI's own output, below
        failure = exc
    finally:
        os.killpg(ui.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole process group
        try:
            out, _ = ui.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            out, _ = ui.communicate()
    if failure is not None:
        raise AssertionError(f"{failure}\n--- calpipe ui's output ---\n{out[-4000:]}")
    assert ui.returncode is not None
    assert "dagster: 4 day(s) computed outside dagster recorded" in out
