"""Fault injection on the nightly run (the hardening issue's suite): SIGKILLs at random points of
a multi-day run, a full disk (a real 3 MB tmpfs where mounting is permitted, and an injected
ENOSPC everywhere), a read-only database file (chattr +i when running as root) and a lock held by
another process. Each must end in a consistent database and a clear message, and resuming must
give exactly the tables of an uninterrupted run."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import polars as pl
import pytest

from calpipe import generate, pipeline, storage
from calpipe.generate import StreamSpec
from calpipe.pipeline import transactions

#: 18 stable streams and 2 that drift (so that the change points and the detector's state are
#: among the tables a killed run must resume exactly)
STREAMS = (
    *(StreamSpec(f"s{i}", events_per_day=60) for i in range(18)),
    StreamSpec("shift", events_per_day=80, drift="shift", drift_day=3, strength=2.0),
    StreamSpec("over", events_per_day=80, drift="overconfident", drift_day=5, strength=0.4),
)
N_DAYS = 12
ALL_TABLES = tuple(storage.PARTITION_COLUMN)

#: A child running the whole range with small transactions (a commit every ~2 days), so that
#: kills land inside and between transactions.
RUN_CHILD = textwrap.dedent(
    """
    import sys
    from calpipe import pipeline, storage
    from calpipe.pipeline import transactions
    transactions.TRANSACTION_ROWS = 2_000
    con = storage.connect(sys.argv[1])
    print("STARTED", flush=True)
    pipeline.run_range(con, storage.EventSource.parse(sys.argv[2]))
    con.close()
    print("DONE", flush=True)
    """
)


def _tables(db) -> dict[str, pl.DataFrame]:
    con = storage.connect(db, read_only=True)
    try:
        return {t: storage.query(con, f"SELECT * FROM {t} ORDER BY ALL") for t in ALL_TABLES}
    finally:
        con.close()


def _consistent(db) -> None:
    """Every committed day is whole: the data checks pass on the committed range."""
    con = storage.connect(db, read_only=True)
    try:
        if not storage.query(
            con, "SELECT * FROM duckdb_tables() WHERE table_name = 'pipeline_days'"
        ).height:
            return  # interrupted while its tables were being created: nothing was committed
        days = storage.query(con, "SELECT min(date) AS a, max(date) AS b FROM pipeline_days")
        a, b = days["a"][0], days["b"][0]
        if a is None:
            assert storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0] == 0
            return
        for check in (pipeline.check_row_counts, pipeline.check_state_continuity,
                      pipeline.check_probabilities):  # fmt: skip
            outcome = check(con, a, b)
            assert outcome.passed, outcome.description
    finally:
        con.close()


@pytest.fixture(scope="module")
def landing(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=17)
    storage.write_landing(events, tmp / "landing")
    reference = tmp / "reference.duckdb"
    subprocess.run([sys.executable, "-c", RUN_CHILD, str(reference), str(tmp / "landing")],
                   check=True, capture_output=True)  # fmt: skip
    tables = _tables(reference)
    assert tables["change_points"].height >= 1  # (the detector has something to resume)
    return tmp, tables


@pytest.mark.slow
def test_ten_sigkills_at_random_points_then_resume_equal_one_uninterrupted_run(landing):
    tmp, reference = landing
    db = tmp / "killed.duckdb"
    rng = np.random.default_rng(20241124)
    kills = 0
    for _ in range(40):  # at most 40 starts; each kill lands at a random time of the run
        child = subprocess.Popen(
            [sys.executable, "-c", RUN_CHILD, str(db), str(tmp / "landing")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout.readline().strip() == "STARTED", child.stderr.read()
        if kills < 10:
            time.sleep(float(rng.uniform(0.0, 0.6)))
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
                kills += 1
                _consistent(db)
                continue
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        if "DONE" in out and kills >= 10:
            break
    assert kills >= 10
    got = _tables(db)
    for t in ALL_TABLES:
        assert got[t].equals(reference[t]), t


def test_a_full_disk_keeps_a_consistent_prefix_and_says_so(landing, monkeypatch):
    """ENOSPC in the middle of the run (injected where rows are written): the error is the
    disk's, the committed days are whole, and resuming gives the uninterrupted tables."""
    tmp, reference = landing
    db = tmp / "full.duckdb"
    real = storage.PartitionWriter.insert
    calls = {"n": 0}

    def insert(self, table, frame, **kw):
        calls["n"] += 1
        if calls["n"] == 25:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, table, frame, **kw)

    monkeypatch.setattr(storage.PartitionWriter, "insert", insert)
    monkeypatch.setattr(transactions, "TRANSACTION_ROWS", 2_000)
    con = storage.connect(db)
    try:
        with pytest.raises(OSError, match="No space left on device"):
            pipeline.run_range(con, storage.EventSource.parse(str(tmp / "landing")))
    finally:
        con.close()
    _consistent(db)
    assert 0 < _tables(db)["pipeline_days"].height < N_DAYS  # a prefix, not nothing, not all
    monkeypatch.setattr(storage.PartitionWriter, "insert", real)
    con = storage.connect(db)
    try:
        pipeline.run_range(con, storage.EventSource.parse(str(tmp / "landing")))
    finally:
        con.close()
    got = _tables(db)
    for t in ALL_TABLES:
        assert got[t].equals(reference[t]), t


def _mount_tmpfs(where, size: str) -> bool:
    """Mount a small tmpfs at *where*; False where mounting is not permitted (not root, no
    CAP_SYS_ADMIN in the container)."""
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True).returncode == 0  # fmt: skip
    except OSError:
        return False


def test_a_real_full_disk_is_the_disks_error_and_resuming_after_freeing_space_completes(
    landing, tmp_path, capsys, monkeypatch
):
    """The database on a 3 MB tmpfs: the run stops with "No space left on device" (exit 2), the
    committed days are whole, and once the disk is larger the resumed run equals the
    uninterrupted one."""
    from calpipe import cli

    tmp, reference = landing
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount_tmpfs(disk, "3m"):
        pytest.skip("mounting a tmpfs is not permitted here (the injected ENOSPC test stands in)")
    try:
        monkeypatch.setattr(transactions, "TRANSACTION_ROWS", 2_000)
        db = disk / "full.duckdb"
        assert cli.main(["run", "--events", str(tmp / "landing"), "--db", str(db)]) == 2
        assert "No space left on device" in capsys.readouterr().err
        _consistent(db)
        assert 0 < _tables(db)["pipeline_days"].height < N_DAYS
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        assert cli.main(["run", "--events", str(tmp / "landing"), "--db", str(db)]) == 0
        got = _tables(db)
        for t in ALL_TABLES:
            assert got[t].equals(reference[t]), t
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _chattr(flag, path):
    """Set or clear a file attribute; False where chattr or the file system does not allow it."""
    try:
        return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0
    except OSError:
        return False


def test_a_read_only_database_file_is_a_clear_error_and_stays_as_it_was(landing, capsys):
    from calpipe import cli

    tmp, _ = landing
    db = tmp / "ro.duckdb"
    storage.connect(db).close()
    before = _tables(db)
    os.chmod(db, 0o444)
    # root writes through mode bits; the immutable attribute stops root too (CI runs as root).
    immutable = os.access(db, os.W_OK) and _chattr("+i", db)
    try:
        if os.access(db, os.W_OK) and not immutable:
            pytest.skip("root, and chattr +i is not available to make the file read-only")
        assert cli.main(["run", "--events", str(tmp / "landing"), "--db", str(db)]) == 2
        assert f"cannot open {db} for writing" in capsys.readouterr().err
    finally:
        if immutable:
            _chattr("-i", db)
        os.chmod(db, 0o644)
    after = _tables(db)
    assert all(after[t].equals(before[t]) for t in ALL_TABLES)


def hold_database(db, seconds: float, *, read_only: bool = False) -> subprocess.Popen:
    """Another process holding ``db`` (as a notebook would) for ``seconds``."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; "
         "c = duckdb.connect(sys.argv[1], read_only=sys.argv[3] == '1'); "
         "print('HOLDING', flush=True); time.sleep(float(sys.argv[2])); c.close()",
         str(db), str(seconds), "1" if read_only else "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "HOLDING"
    return holder


def test_a_lock_held_by_another_process_is_a_clear_error(landing, capsys, monkeypatch):
    from calpipe import cli

    tmp, _ = landing
    db = tmp / "locked.duckdb"
    storage.connect(db).close()
    monkeypatch.setattr(storage.locks, "LOCK_WAIT_SECONDS", 0.5)
    holder = hold_database(
        db, 120, read_only=True
    )  # a notebook's read-only connection blocks writers
    try:
        t0 = time.monotonic()
        assert cli.main(["run", "--events", str(tmp / "landing"), "--db", str(db)]) == 2
        assert time.monotonic() - t0 >= 0.3  # it retried before giving up
        err = capsys.readouterr().err
        assert f"cannot open {db} for writing" in err and "one writing process" in err
        assert f"(PID {holder.pid})" in err  # names the process holding the lock
    finally:
        holder.kill()
        holder.wait()
    assert _tables(db)["pipeline_days"].height == 0  # nothing was written


def test_a_lock_let_go_within_the_wait_is_waited_for(landing, capsys):
    """calpipe run retries with backoff while another process holds the file (a dagster step,
    a notebook's query): a lock held for a second delays the night, it does not fail it; and
    calpipe sql waits for a writer the same way."""
    from calpipe import cli

    tmp, _ = landing
    db = tmp / "waited.duckdb"
    storage.connect(db).close()
    holder = hold_database(db, 1.0)
    try:
        assert cli.main(["run", "--events", str(tmp / "landing"), "--db", str(db)]) == 0
    finally:
        holder.wait()
    assert _tables(db)["pipeline_days"].height > 0
    holder = hold_database(db, 1.0)
    try:
        capsys.readouterr()
        assert cli.main(["sql", "SELECT count(*) AS n FROM pipeline_days", "--db", str(db)]) == 0
        assert "n" in capsys.readouterr().out
    finally:
        holder.wait()
    # --lock-wait 0 fails at once instead, naming the holder
    holder = hold_database(db, 30)
    try:
        t0 = time.monotonic()
        query = ["sql", "SELECT 1", "--db", str(db), "--lock-wait", "0"]
        assert cli.main(query) == 2
        assert time.monotonic() - t0 < 2.0
        assert f"(PID {holder.pid})" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()


def _ctrl_c(cmd: list[str], under_way) -> str:
    """Start ``cmd``, wait until ``under_way(child)`` returns, send SIGINT (Ctrl-C): its standard
    error, after checking it ended with exit 130 and no traceback (skipped if it finished
    first)."""
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    under_way(child)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    if child.returncode == 0:  # pragma: no cover - finished before the signal landed
        pytest.skip("the command finished before the interrupt")
    # 130, or ended by the SIGINT itself after saying so (-2 here; a shell shows both as 130):
    # CPython sometimes re-raises the signal at exit after the command returned 130 (seen about
    # one time in six for `python -m calpipe.cli demo`, never under strace)
    assert child.returncode in (130, -signal.SIGINT), err
    assert "Traceback" not in err
    return err


def test_ctrl_c_ends_calpipe_run_with_one_line_and_the_run_resumes(landing):
    """Ctrl-C (SIGINT) in `calpipe run` printed a traceback, though the data was safe; now one
    line says which days are committed and the command to resume, exit 130, and running it
    again completes the chain exactly."""
    tmp, reference = landing
    db = tmp / "interrupted.duckdb"
    code = textwrap.dedent(
        """
        import sys
        from calpipe.cli import main
        from calpipe.pipeline import transactions
        transactions.TRANSACTION_ROWS = 2_000  # a commit every ~2 days: the interrupt lands mid-run
        sys.exit(main(["run", "--events", sys.argv[2], "--db", sys.argv[1]]))
        """
    )

    def under_way(child):  # the first day's log line
        assert child.stdout.readline().strip(), child.stderr.read()

    err = _ctrl_c([sys.executable, "-c", code, str(db), str(tmp / "landing")], under_way)
    assert ("calpipe run: interrupted (Ctrl-C): " in err and "to resume, run the same command: "
            in err) or "interrupted (Ctrl-C) after the run committed" in err, err  # fmt: skip
    assert len(err.strip().splitlines()) == 1, err  # one line (it was two)
    _consistent(db)
    from calpipe import cli

    assert cli.main(["run", "--events", str(tmp / "landing"), "--db", str(db)]) == 0
    got = _tables(db)
    for t in ALL_TABLES:
        assert got[t].equals(reference[t]), t


def test_ctrl_c_ends_calpipe_demo_with_one_line(tmp_path):
    """Ctrl-C in `calpipe demo` printed a traceback; now one line says what is committed and to
    run it again (exit 130), and the database holds whole days only."""
    import time

    db = tmp_path / "demo.duckdb"
    cmd = [sys.executable, "-m", "calpipe.cli", "demo", "--db", str(db), "--no-progress"]

    def under_way(child):  # the run has begun (its database exists) and has ~5 s to go
        t0 = time.monotonic()
        while not db.exists() and child.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        time.sleep(1.0)

    # (the demo took ~25 s, and a fixed 8 s wait landed after its run once it took ~8 s)
    err = _ctrl_c(cmd, under_way)
    assert ("calpipe demo: interrupted (Ctrl-C): " in err and "run it again: " in err) or (
        "interrupted (Ctrl-C) after its run committed" in err), err  # fmt: skip
    assert len(err.strip().splitlines()) == 1, err
    if db.exists():  # (interrupted while landing the files: no database yet)
        _consistent(db)
    else:
        assert "no day is committed yet" in err
