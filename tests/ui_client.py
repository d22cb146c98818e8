"""Driving a running ``calpipe ui`` through dagster's GraphQL API, as its web page does.

:class:`RunningUI` starts ``calpipe ui`` on a database in a process group of its own, waits for
it, counts materialized partitions, materializes a partition, and stops everything as Ctrl-C
does. ``docs/screenshots.py`` and ``tests/dagster_project/test_ui_graphql.py`` drive the UI with
it. A test and screenshot driver: it lives with the tests, not in the runtime package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from calpipe.cli.ui_guard import free_port
from calpipe.pipeline import ASSET_TABLES

#: How long a client of ``calpipe ui`` waits for it to answer: dagster dev starts a webserver, a code server and a daemon, which once took over 2 minutes on a
#: loaded 2-core CI machine.
UI_START_SECONDS: float = 360.0

#: The code location ``calpipe ui`` serves, and the job dagster builds for ad-hoc asset runs.
LOCATION = "calpipe.dagster_project.definitions"
ASSET_JOB = "__ASSET_JOB"
_FINAL = ("SUCCESS", "FAILURE", "CANCELED")


def wait_for(what: str, fn, timeout: float):
    """``fn()``'s first truthy value, polled each second while the server may still be
    starting (connection errors count as "not yet"); TimeoutError naming ``what``."""
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


class RunningUI:
    """``calpipe ui --db DB`` in a process group of its own, its output in a file (:meth:`stop`
    returns it). Use as a context manager: the UI is stopped on the way out, also on an error."""

    def __init__(self, db: str | Path, *, cwd: str | Path | None = None):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # the db's own
        env["DAGSTER_DISABLE_TELEMETRY"] = "1"
        # a file, not a pipe: nobody reads dagster's log while it runs, and a full pipe would
        # stop the UI
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "calpipe.cli", "ui", "--db", str(db), "--port", str(self.port)],
            cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RunningUI:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def gql(self, query: str, variables: dict | None = None) -> dict:
        """The ``data`` of a GraphQL request; RuntimeError with the errors if any."""
        req = urllib.request.Request(
            f"{self.base}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        if "errors" in out:
            raise RuntimeError(out["errors"])
        return out["data"]

    def wait_ready(self, timeout: float = UI_START_SECONDS) -> None:
        """Wait until the UI answers GraphQL. RuntimeError with its log as soon as ``calpipe
        ui`` has exited (it never will answer), TimeoutError with its log's tail after
        ``timeout``: a UI that did not start says why, not only that it did not."""

        def answers():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"calpipe ui exited with code {self.proc.returncode} before answering on "
                    f"port {self.port}; its log:\n{self.log_tail()}"
                )
            return self.gql("{ repositoriesOrError { __typename } }")

        try:
            wait_for("the UI", answers, timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} (port {self.port}); its log:\n{self.log_tail()}") from None

    def log_tail(self, size: int = 4000) -> str:
        """The last ``size`` bytes of the UI's output so far, read without moving the file
        offset that the running UI writes at (a seek here would make it overwrite)."""
        fd = self._log.fileno()
        end = os.fstat(fd).st_size
        start = max(0, end - size)
        return os.pread(fd, end - start, start).decode(errors="replace")

    def materialized(self, asset: str) -> int:
        """How many partitions of ``asset`` the instance has materialized."""
        q = """query($a: [String!]!) { assetNodeOrError(assetKey: {path: $a}) {
                 ... on AssetNode { partitionStats { numMaterialized } } } }"""
        node = self.gql(q, {"a": [asset]})["assetNodeOrError"]
        return node["partitionStats"]["numMaterialized"]

    def materialize(
        self, day: str, timeout: float = 600, last: str | None = None
    ) -> tuple[str, str]:
        """Launch one run of every calpipe asset for partition ``day`` (with ``last``: for the
        partitions ``day`` .. ``last``, one run, as a single-run backfill) (``launchRun``) and
        wait for it to end: ``(run id, final status)``."""
        tags = (
            [{"key": "dagster/partition", "value": day}]
            if last is None
            else [{"key": "dagster/asset_partition_range_start", "value": day},
                  {"key": "dagster/asset_partition_range_end", "value": last}]
        )  # fmt: skip
        params = {
            "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                         "jobName": ASSET_JOB, "assetSelection": [{"path": [a]} for a in ASSET_TABLES]},
            "executionMetadata": {"tags": tags},
        }  # fmt: skip
        run = self.gql(
            """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
                 __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
            {"p": params},
        )["launchRun"]
        if run["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launching the run of {day}: {run}")
        run_id = run["run"]["runId"]
        q = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"

        def ended():
            status = self.gql(q, {"id": run_id})["runOrError"]["status"]
            return status if status in _FINAL else None

        return run_id, wait_for(f"the run of {day}", ended, timeout)

    def stop(self) -> str:
        """Ctrl-C to the UI's process group (calpipe ui stops dagster, its daemon and the sync);
        its output so far (stopping twice is stopping once)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.seek(0)
        return self._log.read()
