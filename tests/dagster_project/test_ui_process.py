"""The real ``calpipe ui`` process: one guarded TCP port, and first starts that cannot break the
instance (hardening issue #36 items 1 and 2).

1. ``calpipe ui`` ran ``dagster dev``, whose webserver listened on an internal loopback port
   without the guard: a request sent there directly, with a foreign Host, a cross-site Origin
   and a GraphQL mutation over GET, launched a run; a cross-site WebSocket to it opened. Now
   dagster's app is served in the guarded process itself: the process tree of ``calpipe ui``
   listens on one TCP port, the guarded one on 127.0.0.1, and the guard refuses those
   requests there while the UI works.
2. The webserver, the daemon and the sync starting at once on a new instance folder left
   ``schedules.db`` with two alembic heads in 3 of 10 fresh starts (every page then 500). Now
   the instance is created and migrated once, before they start: several first starts at once
   each serve their pages, and each ``schedules.db`` has one alembic version.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
import websockets

from calpipe import cli, generate, storage
from calpipe.generate import StreamSpec
from tests.ui_client import RunningUI, listening_sockets, process_tree

pytestmark = pytest.mark.slow

STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", events_per_day=20))
PAGES = ("/", "/assets", "/runs", "/server_info")
RUNS = "{ runsOrError { ... on Runs { results { runId } } } }"
LAUNCH = (
    "mutation { launchRun(executionParams: {selector: {repositoryLocationName: "
    '"calpipe.dagster_project.definitions", repositoryName: "__repository__", jobName: '
    '"__ASSET_JOB"}}) { __typename } }'
)


def _database(folder):
    """A 4-day `calpipe run` database in ``folder`` (its landing folder beside it)."""
    events = generate.generate(n_days=4, streams=STREAMS, seed=9)
    storage.write_landing(events, folder / "landing")
    db = folder / "c.duckdb"
    argv = ["run", "--events", str(folder / "landing"), "--db", str(db), "--no-progress"]
    assert cli.main(argv) == 0
    return db


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """One running ``calpipe ui`` over a `calpipe run` database, for the tests of this module
    that only read it (its start is the slow part)."""
    folder = tmp_path_factory.mktemp("ui")
    running = RunningUI(_database(folder), cwd=folder)
    try:
        running.wait_ready()
        yield running
    finally:
        out = running.stop()
        # Ctrl-C: one line of calpipe's own at the end, exit 130, no traceback
        assert running.proc.returncode == 130, out[-3000:]
        assert out.rstrip().splitlines()[-1].startswith("calpipe ui: stopped (Ctrl-C)"), out[-3000:]
        assert "Traceback" not in out, out[-3000:]


def test_dagster_listened_on_an_unguarded_tcp_port(ui):
    """The process tree of `calpipe ui` (the UI process, the daemon, the code servers, the sync)
    listens on exactly one TCP port: the guarded one, on 127.0.0.1. Everything else of it
    listens on Unix sockets."""
    found = listening_sockets(ui.proc.pid)
    tcp = [(kind, addr) for kind, addr, _ in found if kind != "unix"]
    assert tcp == [("tcp", f"127.0.0.1:{ui.port}")], found
    # and that port is the guarded one: a foreign Host is refused on it
    r = httpx.get(f"{ui.base}/server_info", headers={"Host": "evil.example"}, timeout=30)
    assert r.status_code == 403


def test_a_foreign_host_a_cross_site_origin_and_a_cross_site_websocket_were_let_through(ui):
    """The requests that launched a run through the unguarded port are refused on the one port
    there is, no run is launched; the UI itself works: its pages, GraphQL from its own origin
    (a mutation too), and its WebSocket subscriptions."""
    base = ui.base
    for page in PAGES:
        assert httpx.get(f"{base}{page}", timeout=60).status_code == 200, page
    ok = httpx.post(f"{base}/graphql", json={"query": "{ version }"}, headers={"Origin": base},
                    timeout=60)  # fmt: skip
    assert ok.status_code == 200 and ok.json()["data"]["version"]
    # the attack of the issue: foreign Host, cross-site Origin, a mutation over GET
    attack = httpx.get(f"{base}/graphql", params={"query": LAUNCH}, timeout=60,
                       headers={"Host": "evil.example", "Origin": "https://evil.example"})  # fmt: skip
    assert attack.status_code == 403 and "refused" in attack.text
    for headers in ({"Origin": "https://evil.example"}, {"Host": "attacker.test:80"}):
        r = httpx.post(f"{base}/graphql", json={"query": LAUNCH}, headers=headers, timeout=60)
        assert r.status_code == 403, headers
    mutation_over_get = httpx.get(f"{base}/graphql", params={"query": LAUNCH}, timeout=60)
    assert mutation_over_get.status_code == 403
    assert ui.gql(RUNS)["runsOrError"]["results"] == []  # nothing was launched

    async def websocket(origin):
        url = f"ws://127.0.0.1:{ui.port}/graphql"
        async with websockets.connect(url, subprotocols=["graphql-ws"], origin=origin) as ws:
            await ws.send(json.dumps({"type": "connection_init", "payload": {}}))
            return json.loads(await asyncio.wait_for(ws.recv(), 60))["type"]

    assert asyncio.run(websocket(base)) == "connection_ack"  # the UI's own subscriptions
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        asyncio.run(websocket("https://evil.example"))
    assert refused.value.response.status_code == 403


def _alembic_versions(home) -> list[str]:
    with sqlite3.connect(home / "schedules" / "schedules.db") as con:
        return [r[0] for r in con.execute("SELECT version_num FROM alembic_version")]


def test_first_starts_at_once_left_two_alembic_heads(tmp_path):
    """Three first starts at once (each a new instance folder beside its own copy of a database,
    so each starts the webserver, the daemon and the sync together): each serves its pages, and
    each instance's schedule storage has one alembic version."""
    db = _database(tmp_path)
    uis = []
    try:
        for i in range(3):
            folder = tmp_path / f"start{i}"
            folder.mkdir()
            shutil.copy(db, folder / db.name)
            uis.append(RunningUI(folder / db.name, cwd=folder))
        for running in uis:
            running.wait_ready()
        for i, running in enumerate(uis):
            for page in PAGES:
                r = httpx.get(f"{running.base}{page}", timeout=60)
                assert r.status_code == 200, (i, page, running.log_tail())
            assert running.gql("{ repositoriesOrError { __typename } }")
            home = tmp_path / f"start{i}" / "c.dagster"
            assert len(_alembic_versions(home)) == 1, _alembic_versions(home)
    finally:
        for running in uis:
            running.stop()


def test_ctrl_c_while_the_ui_starts_printed_tracebacks(tmp_path):
    """Ctrl-C at the terminal (SIGINT to the process group) while the UI's process still
    imports dagster: one line, exit 130, no traceback, and no process of the UI left."""
    db = _database(tmp_path)
    ui = RunningUI(db, cwd=tmp_path)
    t0 = time.monotonic()
    while len(process_tree(ui.proc.pid)) < 2:  # the UI's process has started: it is importing
        assert ui.proc.poll() is None and time.monotonic() - t0 < 60, ui.log_tail()
        time.sleep(0.05)
    time.sleep(1.0)
    pids = process_tree(ui.proc.pid)
    out = ui.stop()
    assert ui.proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert out.rstrip().splitlines()[-1].startswith("calpipe ui: stopped (Ctrl-C)"), out[-3000:]
    deadline = time.monotonic() + 60
    while alive := [p for p in pids if os.path.exists(f"/proc/{p}") and _not_zombie(p)]:
        assert time.monotonic() < deadline, alive
        time.sleep(0.5)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_port_in_use_started_dagster_for_nothing(tmp_path):
    """The UI's port is taken: one line naming it, exit 2, before anything starts (no
    instance folder is made)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
        res = subprocess.run(
            [sys.executable, "-m", "calpipe.cli", "ui", "--db", str(tmp_path / "x.duckdb"),
             "--port", str(port)],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stderr == (
        f"calpipe: error: port {port} of 127.0.0.1 is in use (another calpipe ui?); choose "
        "another with --port\n"
    )
    assert not (tmp_path / "x.dagster").exists()


def test_the_browser_got_500s_after_ready_was_printed(tmp_path):
    """#37 item 5: for 10-30 s after `calpipe ui` said where the UI was, the browser got
    "Internal Server Error". Now the port answers a starting page (503, Retry-After, a page that
    reloads itself) from the moment it opens until dagster's app serves, and `calpipe ui` says
    "ready" only once the UI's page answers: polled from the start, the port never answers
    anything else, and nothing is a traceback."""
    db = _database(tmp_path)
    with RunningUI(db, cwd=tmp_path) as ui:
        seen: list[int] = []
        deadline = time.monotonic() + 300
        while not seen or seen[-1] != 200:
            assert ui.proc.poll() is None and time.monotonic() < deadline, ui.log_tail()
            try:
                r = httpx.get(f"{ui.base}/server_info", timeout=30)
            except httpx.TransportError:  # not open yet: the process still imports
                time.sleep(0.1)
                continue
            seen.append(r.status_code)
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1"
                assert "calpipe ui is starting" in r.text and "http-equiv=refresh" in r.text
            time.sleep(0.1)
        assert set(seen) <= {503, 200}, seen
        assert 503 in seen  # the starting page was served (the port opens before dagster loads)
        ready = f"calpipe ui: ready: {ui.base}"
        t0 = time.monotonic()
        while ready not in ui.log_tail():
            assert time.monotonic() - t0 < 30, ui.log_tail()
            time.sleep(0.2)
        assert ui.gql("{ repositoriesOrError { __typename } }")
        assert "Traceback" not in ui.log_tail(100_000)


def _gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while alive := [p for p in pids if os.path.exists(f"/proc/{p}") and _not_zombie(p)]:
        assert time.monotonic() < deadline, alive
        time.sleep(0.5)


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_sigterm_or_sigkill_to_calpipe_ui_left_the_ui_listening(tmp_path):
    """#36 review: SIGTERM to `calpipe ui` (a service manager's stop, `kill PID`) ended it and
    left its webserver, daemon, sync and code servers running, the port still answering; so did
    SIGKILL. Now SIGTERM stops everything as Ctrl-C does (one line, exit 143), and after a
    SIGKILL the UI notices its parent is gone and stops with all it started."""
    db = _database(tmp_path)
    ui = RunningUI(db, cwd=tmp_path)
    try:
        ui.wait_ready()
        pids = process_tree(ui.proc.pid)
        assert len(pids) >= 3, pids  # calpipe ui, the UI's process, the daemon (and the sync)
        ui.proc.send_signal(signal.SIGTERM)  # to calpipe ui alone, not its group
        assert ui.proc.wait(timeout=120) == 128 + signal.SIGTERM
        out = ui.stop()
        assert out.rstrip().splitlines()[-1] == (
            "calpipe ui: stopped (SIGTERM): the UI, its daemon and the sync have exited"
        ), out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        _gone(pids, 60)
        assert _closed(ui.port)
    finally:
        ui.stop()

    ui = RunningUI(db, cwd=tmp_path)
    try:
        ui.wait_ready()
        pids = process_tree(ui.proc.pid)
        ui.proc.kill()
        ui.proc.wait()
        _gone(pids, 90)  # the UI's process got SIGTERM from the kernel, and stopped the rest
        assert _closed(ui.port)
    finally:
        ui.stop()
