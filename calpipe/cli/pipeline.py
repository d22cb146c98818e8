"""Pipeline commands of ``calpipe``: ``demo``, ``run``, ``ui`` and ``sql``.

They call the same functions as the dagster assets (:mod:`calpipe.pipeline`), so the nightly job
runs without a dagster daemon; ``ui`` starts the dagster UI on 127.0.0.1 over the same database.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import decimal
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb
import polars as pl

from calpipe import config, paths, pipeline, storage
from calpipe.cli import progress, ui_guard
from calpipe.cli.interrupts import INTERRUPTS, is_interrupt, settle
from calpipe.cli.options import add_method_options, method_params
from calpipe.pipeline.html_report import REPORT_MAX_STREAMS
from calpipe.pipeline.inputs import ReplayRequired
from calpipe.pipeline.labels import LabelColumns, label_source
from calpipe.storage.locks import LOCK_WAIT_SECONDS

#: Port of ``calpipe ui``: dagster's own default, so the address people know from its docs works.
UI_PORT: int = 3000

#: Rows ``calpipe sql`` prints by default (``--max-rows``): a screenful; ``--csv`` prints all.
SQL_PRINT_MAX_ROWS: int = 50


def dagster_home(db: Path) -> Path:
    """The dagster instance folder of one database: ``demo.duckdb`` -> ``demo.dagster/`` beside
    it. One instance per database, so the UI never shows another database's runs and asset
    materializations (a shared instance showed a fresh file as fully materialized)."""
    return db.with_name(f"{db.stem}.dagster")


#: Instance settings ``calpipe ui`` writes if the folder has none: no telemetry, no sign-up
#: pop-up, and one run at a time, because DuckDB allows a single writing process per file.
DAGSTER_YAML = """\
telemetry:
  enabled: false
nux:
  enabled: false
concurrency:
  runs:
    max_concurrent_runs: 1
"""

#: The UI listens on the loopback interface only: it can launch jobs, so it must not be exposed.
UI_HOST = "127.0.0.1"
UI_PORT = UI_PORT

EXAMPLE_QUERIES = (
    "SELECT stream, alarm_date, round(log10_martingale_at_alarm, 2) AS log10_S FROM v_alarms",
    "SELECT date, stream, base_log_loss, protected_log_loss, log10_martingale FROM v_calibration_daily "
    "WHERE stream = 'drift-shift' ORDER BY date DESC LIMIT 5",
    "SELECT calibrate_score('bank-telemarketing', 0.30) AS protected_p",
)


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def _prog() -> str:
    """How the user called calpipe (``.venv/bin/calpipe`` from the repo), for the hints."""
    p = Path(sys.argv[0])
    try:
        rel = p.resolve().relative_to(Path.cwd().resolve())
        return str(rel) if p.name == "calpipe" else "calpipe"
    except ValueError:
        return "calpipe"


def _print_frame(df: pl.DataFrame, max_rows: int = SQL_PRINT_MAX_ROWS) -> None:
    with pl.Config(
        tbl_rows=max_rows, tbl_cols=30, float_precision=4, tbl_width_chars=250,
        tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
    ):  # fmt: skip
        print(df)


# ----------------------------------------------------------------------------------------------
# demo
# ----------------------------------------------------------------------------------------------
def _cmd_demo(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    bar = progress.DayBar("calpipe demo", show=progress.enabled(args.no_progress))
    res = None
    try:
        res = pipeline.demo(args.db, log=lambda m: print(f"  {m}", flush=True), progress=bar)
        _print_demo(res, t0)
    except INTERRUPTS as exc:  # while running, or while printing what it did
        if not is_interrupt(exc):
            raise
        settle()
        # the open transaction was rolled back on the way out (none is open once res is set)
        through = None if res is None else res.run.end
        print(_demo_interrupted(Path(args.db), committed_through=through), file=sys.stderr)
        return 130
    return 0


def _print_demo(res, t0: float) -> None:
    """What ``calpipe demo`` did: the run, the per-stream summary, the checks, what to try."""
    run = res.run
    print(
        f"calpipe demo: {run.days} daily partitions {run.start} .. {run.end}, {run.events:,} events, "
        f"{res.summary.height} streams -> {res.db}"
    )
    print(
        "\nPer stream (base = the model's scores as the engine uses them, clipped in log-loss mode;"
        " prot = protected; LL = mean ln loss, ECE 10 bins;"
    )
    print(
        "log10 S = test martingale, alarm when >= 2; drift_date = when a synthetic stream drifts):"
    )
    _print_frame(res.summary)
    print("\nChecks:")
    for c in run.checks:
        status = "ok" if c.passed else ("WARNING" if c.warning else "FAILED")
        print(f"  {c.name:<24} {status}: {c.description}")
    prog = _prog()
    db_opt = "" if Path(res.db) == paths.DEFAULT_DB else f" --db {res.db}"
    print("\nNext:")
    print(f"  {prog} ui{db_opt}    # dagster UI on http://{UI_HOST}:{UI_PORT}")
    print(f"  {prog} report{db_opt}    # one HTML page: trajectories, reliability, metrics, alarms")
    for q in EXAMPLE_QUERIES:
        print(f'  {prog} sql{db_opt} "{q}"')
    print(f"\ndone in {time.perf_counter() - t0:.1f} s")


def _demo_interrupted(db: Path, committed_through: dt.date | None) -> str:
    """One line for Ctrl-C in the demo: what is committed, and that running it again redoes it
    whole (the demo replaces every partition; it is idempotent); once the demo's run has
    committed (``committed_through``: its last day, from its result: it was printing), that
    nothing was rolled back."""
    if committed_through is not None:
        return (f"calpipe demo: interrupted (Ctrl-C) after its run committed (the days up to "
                f"{committed_through}): {db} is whole")  # fmt: skip
    last = None
    try:
        con = storage.connect(db, read_only=True, lock_wait=0)
        try:
            last = con.sql("SELECT max(date) FROM pipeline_days").fetchall()[0][0]
        finally:
            con.close()
    except (duckdb.Error, storage.StoreError, KeyboardInterrupt, RuntimeError):
        pass
    done = f"the days up to {last} are committed" if last else "no day is committed yet"
    return (f"calpipe demo: interrupted (Ctrl-C): {done}, the day in progress was rolled "
            f"back; to run it whole, run it again: {_prog()} demo")  # fmt: skip


# ----------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------
def _cmd_run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    settings = pipeline.Settings.make(args.method, **method_params(args))
    columns = storage.ColumnMap(
        stream=None if args.stream_col.lower() == "none" else args.stream_col,
        event_id=args.id_col, event_time=args.time_col, score=args.score_col, label=args.label_col,
    )  # fmt: skip
    source = storage.EventSource.parse(args.events, columns)
    labels = None
    if args.labels:
        labels = label_source(args.labels, LabelColumns(
            stream=columns.stream, event_id=args.id_col, label=args.label_col,
            label_time=args.label_time_col,
        ))  # fmt: skip
    if args.start and args.end and args.start > args.end:
        raise storage.StoreError(
            f"--start {args.start} is after --end {args.end}: nothing to run (nothing was written)"
        )
    db = Path(args.db).expanduser().resolve()
    new = not db.exists()
    con = storage.connect(db, lock_wait=args.lock_wait)
    summary = None  # set once every day of the run is committed
    try:
        summary = _run_days(con, source, labels, args, settings)
        return 2 if summary is None else _report(con, source, summary, args, settings, t0)
    except INTERRUPTS as exc:
        if not is_interrupt(exc):
            raise
        settle()
        # the open transaction was rolled back on the way out (none is open once summary is set)
        through = None if summary is None else summary.end
        print(_interrupted(con, args, committed_through=through), file=sys.stderr)
        return 130  # the shell's code for a command ended by SIGINT
    except duckdb.Error as exc:  # reading the source is a StoreError that names it
        print(f"calpipe: error: database {args.db}: {exc}", file=sys.stderr)
        return 2
    finally:
        kept = not new or _has_days(con)
        con.close()
        if not kept:  # a new file without a committed day: as if the run had not started
            for f in (db, db.with_name(db.name + ".wal")):
                f.unlink(missing_ok=True)


def _has_days(con) -> bool:
    """Whether the database holds a committed day (a run that committed none leaves no new
    file behind: a failed first run left an empty database, ``--events nope`` created one)."""
    try:
        return storage.fetch_one(con, "SELECT count(*) FROM pipeline_days")[0] > 0
    except (duckdb.Error, KeyboardInterrupt):
        return True  # unsure: keep it


def _interrupted(con, args, committed_through: dt.date | None) -> str:
    """One line for Ctrl-C: what is committed and how to resume (no traceback). A Ctrl-C once
    the run had committed (``committed_through``: its last day, from its summary: it was
    printing its report) rolled nothing back: the line says so, not that a transaction was
    rolled back."""
    if committed_through is not None:
        return (f"calpipe run: interrupted (Ctrl-C) after the run committed (the days up to "
                f"{committed_through}): nothing to resume")  # fmt: skip
    try:
        last = con.sql("SELECT max(date) FROM pipeline_days").fetchall()[0][0]
    except (duckdb.Error, KeyboardInterrupt, RuntimeError):
        last = None
    again = shlex.join([_prog(), *(args.argv or [])])
    done = f"the days up to {last} are committed" if last else "no day is committed yet"
    return (f"calpipe run: interrupted (Ctrl-C): {done}, the day in progress was rolled back; "
            f"to resume, run the same command: {again}")  # fmt: skip


def _run_days(con, source, labels, args, settings):
    """The run's days, committed: its summary, or None when it needs a replay (said, with the
    command that replays)."""
    try:
        return pipeline.run_range(
            con, source, args.start, args.end, settings,
            log=lambda m: print(f"  {m}", flush=True), replay=not args.no_replay,
            labels=labels, on_unknown_label=args.on_unknown_label,
            replay_deleted=args.replay_deleted,
            progress=progress.DayBar("calpipe run", show=progress.enabled(args.no_progress)),
        )  # fmt: skip
    except ReplayRequired as exc:
        argv = [a for a in (args.argv or []) if a != "--no-replay"]
        command = shlex.join([_prog(), *argv, "--start", exc.day.isoformat()])
        print(f"calpipe: error: {exc}\nto replay them, run:\n  {command}", file=sys.stderr)
        return None


def _report(con, source, summary, args, settings, t0: float) -> int:
    """What a committed run did: its days, checks and per-stream report."""
    if summary.days == 0:
        print(f"nothing to run: {args.db} is up to date with {source.describe()}")
        return 0
    # the run's facts, for the dagster UI's asset history (calpipe ui reports them)
    pipeline.record_run_facts(args.db, summary, settings.method, time.perf_counter() - t0,
                              "calpipe run")  # fmt: skip
    print(f"ran {summary.days} day(s) {summary.start} .. {summary.end}: {summary.events:,} events")
    for c in summary.checks:
        status = "ok" if c.passed else ("WARNING" if c.warning else "FAILED")
        print(f"  check {c.name:<24} {status}: {c.description}")
    _print_frame(pipeline.day_report(con, summary.start, summary.end))
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


# ----------------------------------------------------------------------------------------------
# ui
# ----------------------------------------------------------------------------------------------
def ui_command(
    db: Path, *, events: str | None = None, port: int = UI_PORT
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment ``calpipe ui`` runs: dagster's UI served in one process
    behind :mod:`calpipe.cli.ui_guard` on 127.0.0.1:``port``, its only TCP port
    (``calpipe.dagster_project.webserver``, which also creates and migrates the instance, then
    starts the daemon and the sync), the database's own DAGSTER_HOME (:func:`dagster_home`), and
    the code location configured from the database's chain."""
    env = {
        "DAGSTER_HOME": str(dagster_home(db)),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        "CALPIPE_DB": str(db),
    }
    meta: dict[str, str | None] = {}
    if db.exists():
        con = storage.connect(db, read_only=True)
        try:
            storage.require_calpipe(con)
            keys = ("events", "settings", "columns", "labels")
            meta = {k: storage.get_meta(con, k) for k in keys}
        finally:
            con.close()
    ev = events or meta.get("events")
    if ev:
        env["CALPIPE_EVENTS"] = ev
    # no CALPIPE_START_DATE / CALPIPE_END_DATE: the partitions span the database's days and
    # its landed ones, read each time the location loads (a meta value froze the last day)
    if meta.get("settings"):
        env["CALPIPE_SETTINGS"] = meta["settings"]  # type: ignore[assignment]
    if meta.get("columns"):
        env["CALPIPE_COLUMNS"] = meta["columns"]  # type: ignore[assignment]
    if meta.get("labels"):
        env["CALPIPE_LABELS"] = meta["labels"]  # type: ignore[assignment]
    cmd = [
        sys.executable, "-m", "calpipe.dagster_project.webserver", "--port", str(port),
        "--db", str(db),
    ]  # fmt: skip
    return cmd, env


#: How often ``calpipe ui`` asks whether the UI serves its page while it starts (s).
UI_POLL_SECONDS: float = 0.5
#: How long one such request may take (s): a loaded machine's first GraphQL-backed page.
UI_REQUEST_SECONDS: float = 10.0

#: How long ``calpipe ui`` waits for the UI to stop after Ctrl-C before it is killed (s): its
#: daemon and sync get 30 s each (calpipe.dagster_project.webserver.STOP_SECONDS).
UI_STOP_SECONDS: float = 90.0


def _cmd_ui(args: argparse.Namespace) -> int:
    db = Path(args.db).expanduser().resolve()
    cmd, env = ui_command(db, events=args.events, port=args.port)
    if not db.exists():
        src = env.get("CALPIPE_EVENTS", "the landing folder beside it")
        print(f"note: {db} does not exist yet: the UI shows no partition materialized, and "
              f"materializing one creates the database from {src}")  # fmt: skip
    if args.dry_run:
        for k, v in sorted(env.items()):
            print(f"{k}={v}")
        print(" ".join(cmd))
        return 0
    if not ui_guard.port_free(UI_HOST, args.port):
        print(f"calpipe: error: port {args.port} of {UI_HOST} is in use (another calpipe ui?); "
              "choose another with --port", file=sys.stderr)  # fmt: skip
        return 2
    home = dagster_home(db)
    home.mkdir(parents=True, exist_ok=True)
    yaml = home / "dagster.yaml"
    if not yaml.exists():
        yaml.write_text(DAGSTER_YAML)
    url = f"http://{UI_HOST}:{args.port}"
    print(
        f"calpipe ui: starting the dagster UI on {url} (DAGSTER_HOME={home}; foreign Host "
        "and Origin headers and GraphQL mutations over GET are refused); Ctrl-C stops it",
        flush=True,
    )
    # One child, in a session of its own: the terminal's Ctrl-C reaches this process alone,
    # which terminates the UI (one path to stop it, whatever signal came); the UI stops by
    # itself if this process dies, even by SIGKILL (--parent: webserver.watch_parent).
    # SIGTERM and SIGHUP (a closed terminal) stop it as Ctrl-C does: they used to end this
    # process and leave the UI, its daemon and the sync running and listening.
    stopped_by: list[int] = []

    def stop_on(signum, frame):
        stopped_by.append(signum)
        raise KeyboardInterrupt

    proc = subprocess.Popen([*cmd, "--parent", str(os.getpid())], env=os.environ | env,
                            cwd=db.parent, start_new_session=True)  # fmt: skip
    previous = {sig: signal.signal(sig, stop_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if _wait_until_served(proc, url):
            print(f"calpipe ui: ready: {url}", flush=True)
        code = proc.wait()
    except KeyboardInterrupt:
        settle()
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # stopping: a second signal is no traceback
        why = signal.Signals(stopped_by[0]).name if stopped_by else "Ctrl-C"
        if _stop_ui(proc):
            print(f"calpipe ui: stopped ({why}): the UI, its daemon and the sync have exited",
                  file=sys.stderr)  # fmt: skip
        else:
            print(f"calpipe ui: stopped ({why}): the UI did not exit within "
                  f"{UI_STOP_SECONDS:.0f} s; it and every process it started were killed",
                  file=sys.stderr)  # fmt: skip
        return 128 + (stopped_by[0] if stopped_by else signal.SIGINT)  # the shell's codes
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is stop_on:
                signal.signal(sig, handler)
    if code != 0:
        print(f"calpipe: error: the UI exited with code {code} (its log is above)", file=sys.stderr)
        return 1
    return 0


def _wait_until_served(proc: subprocess.Popen, url: str) -> bool:
    """Whether the UI's own page answers (True) before its process exits (False). Until then
    its port answers the starting page (503) or is not open yet: "ready" is said only when a
    browser opened on ``url`` gets the UI."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy: loopback
    while proc.poll() is None:
        try:
            with direct.open(url + "/server_info", timeout=UI_REQUEST_SECONDS) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):  # the starting page's 503, or not open yet
            pass
        time.sleep(UI_POLL_SECONDS)
    return False


def _stop_ui(proc: subprocess.Popen) -> bool:
    """Terminate the UI's process (it stops its daemon and the sync first; a SIGTERM while it
    shuts down already is ignored); whether it exited in time (True), else it and its session,
    every process it started, were killed (False)."""
    proc.terminate()
    try:
        proc.wait(timeout=UI_STOP_SECONDS)
        return True
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: pgid == pid
        proc.wait()
        return False


# ----------------------------------------------------------------------------------------------
# sql
# ----------------------------------------------------------------------------------------------
def _cmd_sql(args: argparse.Namespace) -> int:
    # read-only unless --write: a query must not install the schema into (or create) a file;
    # with --write the database must exist too (a mistyped --db is an error, not a new file)
    if args.write and not Path(args.db).expanduser().exists():
        raise storage.StoreError(f"database {args.db} does not exist")
    con = storage.connect(args.db, read_only=not args.write, lock_wait=args.lock_wait)
    # A user's query gets DuckDB's default memory limit, not the small buffer pool the pipeline's
    # writes use (storage.session.DUCKDB_MEMORY_LIMIT): analytical queries should not spill needlessly.
    con.execute("RESET memory_limit")
    try:
        rel = con.sql(args.query)
        if rel is None:  # a statement without a result (CREATE, INSERT, ...)
            print("ok")
            return 0
        df = rel.pl()
    except duckdb.Error as exc:
        print(f"calpipe: error: {exc}", file=sys.stderr)
        return 2
    finally:
        con.close()
    if args.csv:
        sys.stdout.write(_json_nested(df).write_csv())
    else:
        _print_frame(df, args.max_rows)
    return 0


def _json_nested(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with its list, array and struct columns as JSON text (CSV has no nested values:
    polars refused to write them, a traceback for any ``calibrate_scores`` result); a null
    stays an empty cell."""
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    return df.with_columns(
        pl.Series(c, [None if v is None else json.dumps(v, default=_json_value) for v in df[c].to_list()],
                  dtype=pl.String)
        for c in nested
    )  # fmt: skip


def _json_value(v):
    """What JSON has no type for: a decimal as its number, dates and times as ISO text."""
    return float(v) if isinstance(v, decimal.Decimal) else str(v)


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def _cmd_report(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out = pipeline.write_report(
        args.db, args.out, max_streams=args.max_streams, lock_wait=args.lock_wait
    )
    size = out.stat().st_size
    print(f"calpipe report: {out} ({size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)")
    return 0


# ----------------------------------------------------------------------------------------------
def _progress_option(parser) -> None:
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is drawn only when standard error is a terminal)")  # fmt: skip


def _lock_wait_option(parser) -> None:
    parser.add_argument(
        "--lock-wait", type=float, default=None, metavar="SECONDS",
        help="how long to wait for a database another process holds (default "
             f"{LOCK_WAIT_SECONDS:g} s, retrying with backoff; 0: fail at once)",
    )  # fmt: skip


def register(sub) -> None:
    """Add ``demo``, ``run``, ``ui``, ``sql`` and ``report`` to the ``calpipe`` sub-command parser."""
    default_db = str(paths.DEFAULT_DB)
    d = sub.add_parser(
        "demo", help="load the demo data into DuckDB and run every daily partition in order"
    )
    d.add_argument("--db", default=default_db, help=f"DuckDB file (default: {default_db})")
    _progress_option(d)
    d.set_defaults(func=_cmd_demo)

    r = sub.add_parser("run", help="the nightly job without a dagster daemon")
    r.add_argument("--events", required=True,
                   help="landing folder (date=YYYY-MM-DD/), Parquet file/glob, or DuckDB table")  # fmt: skip
    r.add_argument("--db", required=True, help="DuckDB file (created if needed)")
    _lock_wait_option(r)
    r.add_argument("--start", type=_date,
                   help="first day (default: the day after the last one stored, else the first event's)")  # fmt: skip
    r.add_argument("--end", type=_date, help="last day (default: the last event's day)")
    r.add_argument("--no-replay", action="store_true",
                   help="refuse (with the command to run) instead of replaying stored days whose "
                        "inputs changed since they ran, or that an earlier re-run made stale")  # fmt: skip
    r.add_argument("--replay-deleted", action="store_true",
                   help="recompute stored days whose input files were removed since they ran "
                        "(default: keep their stored rows, e.g. after a retention policy "
                        "deleted old landing folders)")  # fmt: skip
    r.add_argument("--labels", metavar="LABELS",
                   help="label feed: labels that land after their events, as a landing folder "
                        "(date=YYYY-MM-DD/ = the arrival day), Parquet file/glob or table of "
                        "stream, event_id, label, label_time")  # fmt: skip
    r.add_argument("--on-unknown-label", choices=("error", "quarantine"), default="error",
                   help="a label of an event calpipe does not know: fail the night (default), or "
                        "park it in the table quarantined_labels")  # fmt: skip
    g = r.add_argument_group("columns of the source")
    g.add_argument("--stream-col", default="stream", help="stream key ('none': one stream)")
    g.add_argument("--id-col", default="event_id")
    g.add_argument("--time-col", default="event_time")
    g.add_argument("--score-col", default="score")
    g.add_argument("--label-col", default="label")
    g.add_argument(
        "--label-time-col", default="label_time", help="label feed: when a label became known"
    )
    add_method_options(r, config.PIPELINE_DEFAULT_METHOD)
    _progress_option(r)
    r.set_defaults(func=_cmd_run)

    u = sub.add_parser("ui", help=f"start the dagster UI on {UI_HOST} over a calpipe database")
    u.add_argument("--db", default=default_db, help=f"DuckDB file (default: {default_db})")
    u.add_argument("--events", help="event source (default: the one the database was run with)")
    u.add_argument("--port", type=int, default=UI_PORT)
    u.add_argument("--dry-run", action="store_true", help="print the command and environment only")
    u.set_defaults(func=_cmd_ui)

    s = sub.add_parser("sql", help="run a SQL query on a calpipe database and print the result")
    s.add_argument("query", help='e.g. "SELECT * FROM v_alarms"')
    s.add_argument("--db", default=default_db, help=f"DuckDB file (default: {default_db})")
    _lock_wait_option(s)
    s.add_argument("--max-rows", type=int, default=SQL_PRINT_MAX_ROWS)
    s.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    s.add_argument("--write", action="store_true",
                   help="open read-write (default: read-only; the database must exist)")  # fmt: skip
    s.set_defaults(func=_cmd_sql)

    rp = sub.add_parser("report", help="write one self-contained HTML page over a calpipe database")
    rp.add_argument("--db", default=default_db, help=f"DuckDB file (default: {default_db})")
    rp.add_argument("--out", help="HTML file (default: <db name>.report.html beside the database)")
    _lock_wait_option(rp)
    rp.add_argument("--max-streams", type=int, default=REPORT_MAX_STREAMS,
                    help="streams with a section of plots and daily metrics (alarmed first)")  # fmt: skip
    rp.set_defaults(func=_cmd_report)
