"""Driving a running ``calpipe ui`` through dagster's GraphQL API, as its web page does.

:class:`RunningUI` starts ``calpipe ui`` on a database in a process group of its own, waits for
it, counts materialized partitions, materializes a partition, and stops everything as Ctrl-C
does. ``docs/screenshots.py`` and ``tests/dagster_project/test_ui_graphql.py`` drive the UI with
it. A test and screenshot driver: it lives with the tests, not in the runtime package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
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

#: How long a client of ``calpipe ui`` waits for it to answer: it starts a webserver, code servers and a daemon, which once took over 2 minutes on a
#: loaded 2-core CI machine.
UI_START_SECONDS: float = 360.0

#: The code location ``calpipe ui`` serves, and the job dagster builds for ad-hoc asset runs.
LOCATION = "calpipe.dagster_project.definitions"
ASSET_JOB = "__ASSET_JOB"
_FINAL = ("SUCCESS", "FAILURE", "CANCELED")


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _socket_inodes(pid: int) -> set[int]:
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def _address(hex_addr: str) -> str:
    """``0100007F:0BB8`` -> ``127.0.0.1:3000`` (IPv4; IPv6 as [hex]:port)."""
    host, port = hex_addr.split(":")
    if len(host) == 8:
        ip = ".".join(str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        ip = f"[{host}]"
    return f"{ip}:{int(port, 16)}"


def listening_sockets(pid: int) -> list[tuple[str, str, int]]:
    """Every listening socket a process of ``pid``'s tree holds: ``(kind, address, pid)``,
    kind ``tcp``, ``tcp6`` or ``unix`` (from /proc/net and /proc/PID/fd, as ``ss -lp`` does)."""
    owner = {ino: p for p in process_tree(pid) for ino in _socket_inodes(p)}
    found = []
    for kind in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{kind}") as f:
            for line in f.read().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[9]) in owner:  # state LISTEN
                    found.append((kind, _address(cols[1]), owner[int(cols[9])]))
    with open(f"/proc/{pid}/net/unix") as f:
        for line in f.read().splitlines()[1:]:
            cols = line.split()
            # flags __SO_ACCEPTCON (listening), the inode, the path
            if cols[3] == "00010000" and int(cols[6]) in owner:
                found.append(("unix", cols[7] if len(cols) > 7 else "", owner[int(cols[6])]))
    return found


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


#: Chromium's flags for this machine's closed network: without the background-networking ones,
#: its start-up connections to Google's hosts are refused, many at a time.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

#: How long a page of the UI may take to show what is waited for (the web app loads, then asks
#: GraphQL; a loaded 2-core machine took ~10 s).
PAGE_SECONDS: float = 90.0

#: dagster's words, in the UI, for a check's result on a partition.
UI_RESULT = {"SUCCEEDED": "Passed", "FAILED": "Failed"}


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing() -> str | None:
    """Why the UI's pages cannot be read in a browser here (None: they can)."""
    if chromium_path() is None:
        return "Chromium is not installed (Debian: apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (requirements/dev.lock)"
    return None


class BrowserPages:
    """The UI's pages rendered in headless Chromium (playwright over the system's browser) and
    read as a user reads them: a partition's metadata, an asset's partition counts, a check's
    execution history. What the page shows, not what GraphQL answers: the two used to disagree
    (#37 item 3). Use as a context manager."""

    def __init__(self, base: str):
        self.base = base

    def __enter__(self) -> BrowserPages:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(
            executable_path=chromium_path(), args=list(CHROMIUM_ARGS)
        )
        self.page = self._browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.set_default_timeout(PAGE_SECONDS * 1000)
        return self

    def __exit__(self, *exc) -> None:
        self._browser.close()
        self._pw.stop()

    def _tables(self) -> list[list[list[str]]]:
        return [
            [
                [c.inner_text().strip() for c in r.locator("td,th").all()]
                for r in t.locator("tr").all()
            ]
            for t in self.page.locator("table").all()
        ]

    def partition_metadata(self, asset: str, day: str) -> dict[str, str]:
        """The metadata table of ``asset``'s partition ``day`` as its page shows it (label ->
        text), with ``status`` its badges ("Materialized"; "Materialized, Unsynced (1)"; ...)."""
        self.page.goto(f"{self.base}/assets/{asset}?view=partitions&partition={day}")
        self.page.get_by_text("Latest materialization").first.wait_for()

        # the detail pane's heading: the partition's key, its badges ("Materialized", and
        # "Unsynced (1)" where dagster thinks an upstream asset is newer: drawn a moment after
        # the key), then "Latest materialization"
        seen: list[str] = []

        def badges():
            body = self.page.inner_text("body").split("Latest materialization")[0]
            seen[:] = [w.strip() for w in body.split("\n") if w.strip()][-4:]
            after = seen[len(seen) - seen[::-1].index(day) :] if day in seen else []
            return ", ".join(after) or None

        try:
            status = wait_for(f"the badge of partition {day}", badges, PAGE_SECONDS)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the pane's heading ends {seen}") from None
        # the metadata comes after the pane: its first entry, or the words for none
        self.page.get_by_text(
            re.compile(r"^(dagster/row_count|No metadata entries)$")
        ).first.wait_for()
        rows = {"status": status}
        for table in self._tables():
            for cells in table:
                if len(cells) >= 2 and cells[0] and "\n" not in cells[0]:
                    rows.setdefault(cells[0], cells[1])
        return rows

    def partition_counts(self, asset: str) -> dict[str, int]:
        """The counts of ``asset``'s partitions page: {"Materialized": n, "Missing": n, ...}."""
        self.page.goto(f"{self.base}/assets/{asset}?view=partitions")
        self.page.get_by_text("Materialized (").first.wait_for()
        out = {}
        for word in ("Failed", "Materialized", "Materializing", "Missing"):
            text = self.page.get_by_text(f"{word} (").first.inner_text()
            out[word] = int(text.split("(")[1].rstrip(")"))
        return out

    def check_results(self, asset: str, check: str) -> dict[str, str]:
        """Partition -> the result the check's *Execution history* shows for it (its first page,
        newest first: a partition's newest result wins)."""
        self.page.goto(f"{self.base}/assets/{asset}?view=checks&checkDetail={check}")
        self.page.get_by_text("Execution history").first.click()
        self.page.get_by_text("Target materialization").first.wait_for()
        self.page.locator("table tr").nth(1).wait_for()  # the rows come after the header
        out: dict[str, str] = {}
        for table in self._tables():
            if table and table[0][:4] == [
                "Evaluation result",
                "Timestamp",
                "Target materialization",
                "Partition",
            ]:
                for cells in table[1:]:
                    out.setdefault(cells[3], cells[0])
        return out
