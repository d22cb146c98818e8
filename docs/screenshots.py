"""Screenshots of the dagster UI over a calpipe database, for the README (``docs/img/``).

    python docs/screenshots.py [--db PATH] [--out docs/img]

Starts ``calpipe ui`` on the database (default: the demo's), waits until the days computed by
``calpipe run`` / ``calpipe demo`` show as materialized, materializes the last day through the
GraphQL API (so its plots are in its metadata), and drives headless Chromium (playwright over
the system's ``chromium``) to three pages: the lineage, the partitions of ``protected_scores``
with the last day's metadata, and the last day's martingale trajectory as the UI shows it.
Then stops the UI as Ctrl-C does. ``tests/test_screenshots.py`` runs it where Chromium is
installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from calpipe import paths, pipeline, store

LOCATION = "calpipe.dagster_project.definitions"
SHOTS = ("lineage", "partition", "plot")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    if "errors" in out:
        raise RuntimeError(out["errors"])
    return out["data"]


def _wait(what: str, fn, timeout: float):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            value = fn()
        except (urllib.error.URLError, OSError):
            value = None
        if value:
            return value
        time.sleep(1.0)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _materialized(port: int, asset: str) -> int:
    q = """query($a: [String!]!) { assetNodeOrError(assetKey: {path: $a}) {
             ... on AssetNode { partitionStats { numMaterialized } } } }"""
    return _gql(port, q, {"a": [asset]})["assetNodeOrError"]["partitionStats"]["numMaterialized"]


def _materialize(port: int, day: str) -> None:
    run = _gql(
        port,
        """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
             __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
        {"p": {"selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                            "jobName": "__ASSET_JOB",
                            "assetSelection": [{"path": [a]} for a in pipeline.ASSET_TABLES]},
               "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day}]}}},
    )["launchRun"]  # fmt: skip
    if run["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launching the run of {day}: {run}")
    q = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
    final = ("SUCCESS", "FAILURE", "CANCELED")
    status = _wait(
        f"the run of {day}",
        lambda: (
            (s := _gql(port, q, {"id": run["run"]["runId"]})["runOrError"]["status"]) in final and s
        ),
        600,
    )
    if status != "SUCCESS":
        raise RuntimeError(f"the run of {day} ended {status}")


def take(db: Path, out: Path, *, timeout: float = 600) -> dict[str, Path]:
    """The three screenshots of ``db``'s UI written into ``out``; their paths by name."""
    from playwright.sync_api import sync_playwright

    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser_path is None:
        raise RuntimeError("Chromium is not installed (Debian: apt-get install chromium)")
    con = store.connect(db, read_only=True)
    try:
        days = pipeline.stored_days(con)["date"]
    finally:
        con.close()
    if days.len() == 0:
        raise RuntimeError(f"{db}: no day has been run yet")
    last = days.max().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"} | {
        "DAGSTER_DISABLE_TELEMETRY": "1"
    }
    ui = subprocess.Popen([sys.executable, "-m", "calpipe.cli", "ui", "--db", str(db), "--port", str(port)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    shots = {name: out / f"ui_{name}.png" for name in SHOTS}
    try:
        _wait("the UI", lambda: _gql(port, "{ repositoriesOrError { __typename } }"), 360)
        _wait(
            "the days computed outside dagster",
            lambda: _materialized(port, "protected_scores") >= days.len(),
            timeout,
        )
        _materialize(port, last)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/asset-groups/calpipe/lineage")
            page.get_by_text("calibration_map").first.wait_for(timeout=60_000)
            page.wait_for_timeout(2000)  # the graph's layout settles
            page.screenshot(path=shots["lineage"])
            page.goto(f"{base}/assets/protected_scores?view=partitions&partition={last}")
            page.get_by_text("config_fingerprint").first.wait_for(timeout=60_000)
            page.screenshot(path=shots["partition"])
            page.goto(f"{base}/assets/calibration_daily?view=partitions&partition={last}")
            page.get_by_text("Show Markdown").first.click(timeout=60_000)  # the trajectory
            page.get_by_text("Close").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=shots["plot"])
            browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGINT)  # Ctrl-C: calpipe ui stops dagster and its daemon
        try:
            ui.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
    return shots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--db", default=str(paths.DEFAULT_DB), help="calpipe database (default: the demo's)"
    )
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "img"))
    args = ap.parse_args(argv)
    for name, path in take(Path(args.db).resolve(), Path(args.out)).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
