"""The dagster UI as ``calpipe ui`` serves it: one process, one TCP port, behind the guard.

``python -m calpipe.dagster_project.webserver --port PORT [--db DB]`` (``calpipe ui`` runs it,
with the database's ``DAGSTER_HOME``):

1. creates and migrates the dagster instance, once, before anything else opens it
   (:func:`prepare_instance`): the webserver, the daemon and the sync starting at once on a new
   instance folder each created its SQLite storages, and ``schedules.db`` sometimes ended with
   two alembic heads (every page then answered 500 until the folder was deleted);
2. starts the dagster daemon (its public ``dagster-daemon run`` command: schedules, sensors,
   the run queue; its output in ``DAGSTER_HOME/daemon.log``) and, when the database exists, the sync of days computed outside dagster
   (:mod:`calpipe.dagster_project.sync`);
3. serves dagster's own ASGI app (the Starlette app ``dagster-webserver`` builds) *in this
   process*, wrapped in :class:`calpipe.cli.ui_guard.Guard`, on ``127.0.0.1:PORT``. There is no
   other TCP port: ``calpipe ui`` used to run ``dagster dev``, whose webserver listened on an
   internal loopback port without the guard, so a request sent there directly (a foreign
   Host, a cross-site Origin, a GraphQL mutation over GET) launched a run. The code servers
   dagster starts for the webserver and the daemon listen on Unix sockets.

Two names here are dagster's private API, because dagster has no public way to build its
webserver's app without binding a TCP port of its own: ``dagster-webserver`` (the documented
entry point) always ends in ``uvicorn.run(app, host, port)``, with no Unix-socket option and no
hook to wrap the app. The app itself comes from the public
``dagster_webserver.app.create_app_from_workspace_process_context``, but its argument, the
process's workspace, is ``dagster._core.workspace.context.WorkspaceProcessContext`` over a
``dagster._core.workspace.load_target.ModuleTarget``; this module builds them exactly as the
``dagster-webserver`` command does. The architecture tests allow these two imports in this
module only (``tests/test_architecture.py``); a dagster upgrade that moves them fails loudly
at start, and ``tests/dagster_project/test_ui_process.py`` checks the listening sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, one start at a time is up to the user
    fcntl = None

from dagster import DagsterInstance
from dagster._core.workspace.context import WorkspaceProcessContext  # private: see above
from dagster._core.workspace.load_target import ModuleTarget  # private: see above
from dagster_webserver.app import create_app_from_workspace_process_context
from dagster_webserver.version import __version__

from calpipe.cli import ui_guard

#: The code location the UI and the daemon load (the same name, so the daemon finds the
#: location of a run the UI queued).
DEFINITIONS = "calpipe.dagster_project.definitions"
#: How often the UI polls for fresh asset data (ms): dagster-webserver's default.
LIVE_DATA_POLL_MS = 2000
#: Database settings of a long-running webserver: dagster-webserver's defaults (statement
#: timeout ms, pool recycle s, pool max overflow).
WEBSERVER_DB = (15_000, 3_600, 20)
#: The daemon's log (its warnings and errors, and its code servers'), in DAGSTER_HOME.
DAEMON_LOG = "daemon.log"
#: How long the daemon and the sync get to stop before they are killed (s).
STOP_SECONDS = 30.0


def prepare_instance() -> DagsterInstance:
    """The instance of ``DAGSTER_HOME``, created and migrated to dagster's current schema in
    this process, before any other process opens it (what it prints while migrating is
    dropped: a new instance has nothing to report). Two ``calpipe ui`` starting at once on the
    same new folder take turns (a lock file in it)."""
    home = Path(os.environ.get("DAGSTER_HOME") or ".")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".calpipe-ui.lock", "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        instance = DagsterInstance.get()
        with contextlib.redirect_stdout(io.StringIO()):
            instance.upgrade()
    return instance


def daemon_command() -> list[str]:
    """The public ``dagster-daemon run`` command over the same code location, warnings only
    (its sensor ticks would log a line every 30 s)."""
    exe = Path(sysconfig.get_path("scripts")) / "dagster-daemon"
    return [str(exe), "run", "-m", DEFINITIONS, "--log-level", "warning",
            "--code-server-log-level", "warning"]  # fmt: skip


def sync_command(db: Path) -> list[str]:
    """The sync of the days ``calpipe run`` / ``calpipe demo`` computed (:mod:`.sync`)."""
    return [sys.executable, "-m", "calpipe.dagster_project.sync", "--db", str(db)]


@contextlib.asynccontextmanager
async def _lifespan(app):
    """Ctrl-C cancels the server's lifespan task: that is the normal way to stop, not an error
    (dagster-webserver's own lifespan does the same)."""
    with contextlib.suppress(asyncio.CancelledError):
        yield


#: Set by SIGINT and SIGTERM (and by the death of ``calpipe ui``, see :func:`watch_parent`):
#: the process stops at its next step. The handler only sets it: raising KeyboardInterrupt
#: from the handler once landed inside a weakref callback of sqlalchemy's, where Python prints
#: and drops exceptions; the stop was lost, and ``calpipe ui`` killed this process after 90 s,
#: leaving its daemon and sync running.
STOP = threading.Event()


def _request_stop(signum, frame) -> None:
    STOP.set()


def _parent_gone(parent: int | None) -> bool:
    return parent is not None and os.getppid() != parent


def _check(parent: int | None) -> None:
    """Between the steps of a start: stop (main's KeyboardInterrupt) if asked to."""
    if STOP.is_set() or _parent_gone(parent):
        raise KeyboardInterrupt


def watch_parent(parent: int | None) -> None:
    """Stop when ``calpipe ui`` (process ``parent``) dies, even by SIGKILL: on Linux the kernel
    sends this process SIGTERM then (``PR_SET_PDEATHSIG``); elsewhere, and for a death before
    that was set, the serving loop compares its parent's pid with ``parent``. Without it a
    killed ``calpipe ui`` left the UI, its daemon and the sync running and listening."""
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _start_deaf_to_ctrl_c(cmd: list[str]) -> subprocess.Popen:
    """``cmd`` started with SIGINT ignored (Python keeps an inherited SIG_IGN): the terminal's
    Ctrl-C, which reaches the whole process group, does not print its traceback; it stops when
    :func:`_stop` terminates it (what the sync reported so far stays; the next start reports
    the rest)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.Popen(cmd)
    finally:
        signal.signal(signal.SIGINT, previous)


def serve(port: int, db: Path | None, parent: int | None = None) -> int:
    """Open the guarded port on 127.0.0.1:``port`` at once with the starting page
    (:class:`calpipe.cli.ui_guard.Starting`), prepare the instance, start the daemon (and the
    sync), load the code location, then serve dagster's app on the same port until Ctrl-C or
    SIGTERM (or until ``parent``, the ``calpipe ui`` process, is gone); then stop the server and
    the children. The server runs in a thread; this one checks :data:`STOP` between the steps
    of the start and while it waits."""
    starting = ui_guard.Starting()
    server = ui_guard.server(starting, port)
    thread = threading.Thread(target=server.run, name="calpipe-ui-server", daemon=True)
    thread.start()
    while not server.started:  # the port is open before anything slow starts
        if not thread.is_alive():  # uvicorn could not bind it (it logged why)
            return 2
        time.sleep(0.02)
    instance = None
    children: list[subprocess.Popen] = []
    home = Path(os.environ.get("DAGSTER_HOME") or ".")
    home.mkdir(parents=True, exist_ok=True)
    daemon_log = open(home / DAEMON_LOG, "a")  # closed in the finally below
    try:
        _check(parent)
        instance = prepare_instance()
        instance.optimize_for_webserver(*WEBSERVER_DB)
        _check(parent)
        # the daemon stops cleanly on SIGINT (the terminal's Ctrl-C) and on SIGTERM (from _stop);
        # its output goes to DAGSTER_HOME/daemon.log: a Ctrl-C while its code server still
        # loaded the location (seconds after "ready") printed that server's traceback
        children.append(subprocess.Popen(daemon_command(), stdout=daemon_log,
                                         stderr=subprocess.STDOUT))  # fmt: skip
        if db is not None and db.exists():
            children.append(_start_deaf_to_ctrl_c(sync_command(db)))
        _check(parent)
        target = ModuleTarget(
            module_name=DEFINITIONS, attribute=None, working_directory=None, location_name=None
        )
        with WorkspaceProcessContext(
            instance, target, version=__version__, code_server_log_level="WARNING"
        ) as context:
            _check(parent)
            starting.serve_app(create_app_from_workspace_process_context(
                context, "", LIVE_DATA_POLL_MS, lifespan=_lifespan
            ))  # fmt: skip
            # until Ctrl-C, SIGTERM, or calpipe ui's death
            while thread.is_alive() and not STOP.wait(0.5) and not _parent_gone(parent):
                pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # stopping: another signal is no traceback
            signal.signal(sig, signal.SIG_IGN)
        server.should_exit = True
        thread.join(STOP_SECONDS)
        _stop(children)
        daemon_log.close()
        if instance is not None:
            instance.dispose()
    return 130 if STOP.is_set() or _parent_gone(parent) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m calpipe.dagster_project.webserver", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--port", type=int, required=True, help="the one port, on 127.0.0.1")
    ap.add_argument("--db", type=Path, help="calpipe database whose stored days to sync")
    ap.add_argument("--parent", type=int, help="stop when this process (calpipe ui) is gone")
    args = ap.parse_args(argv)
    watch_parent(args.parent)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # calpipe ui starts this process in a session of its own (the terminal's Ctrl-C reaches
    # calpipe ui alone, which terminates it); run by hand, it stops on either signal
    signal.signal(signal.SIGINT, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)
    try:
        return serve(args.port, args.db, args.parent)
    except KeyboardInterrupt:  # stopped: calpipe ui says so, in one line
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
