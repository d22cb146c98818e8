"""Ctrl-C in every command: one line on standard error, exit 130, nothing half-written (#36
item 15). SIGINT sent to the real command, at points where it once printed a traceback:

* while it imports (polars, numba, DuckDB: a KeyboardInterrupt traceback from inside an import,
  once ``SystemError: CPUDispatcher(...) returned a result with an exception set``, exit 1);
* while ``storage.connect`` waits for a database another process holds;
* while ``calpipe protect`` computes (a 35-line traceback), its output then not written.

Ctrl-C in the middle of ``calpipe run`` and ``calpipe demo``: ``tests/test_faults.py``; in
``calpipe ui``: ``tests/dagster_project/test_ui_process.py``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calpipe import generate, storage
from calpipe.cli.interrupts import INTERRUPTS, STARTING_MESSAGE, is_interrupt, is_the_command
from calpipe.generate import StreamSpec
from tests.test_faults import hold_database

COMMAND = [sys.executable, "-m", "calpipe.cli"]
SCRIPT = Path(sys.executable).with_name("calpipe")  # the console script beside this Python


def _mapped(pid: int, name: str) -> bool:
    """Whether the process has loaded a library whose path contains ``name``."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return name in f.read()
    except OSError:
        return False


def _sleeping(pid: int) -> bool:
    """Whether the process's main thread sleeps in ``time.sleep`` (its kernel wait channel)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return "nanosleep" in f.read()
    except OSError:
        return False


def _interrupt(child: subprocess.Popen) -> tuple[str, str]:
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, (child.returncode, err)
    assert "Traceback" not in err, err
    return out, err


@pytest.mark.parametrize(
    ("command", "library"),
    [(COMMAND, "polars"), (COMMAND, "duckdb"), ([str(SCRIPT)], "numba")],
    ids=["python-m-polars", "python-m-duckdb", "console-script-numba"],
)
def test_ctrl_c_while_importing_printed_a_traceback(tmp_path, command, library):
    """SIGINT once the command has loaded ``library`` (its imports go on for seconds): exactly
    the one starting line, exit 130, no database created."""
    if not SCRIPT.exists() and command[0] == str(SCRIPT):
        pytest.skip("no calpipe console script beside this Python")
    db = tmp_path / "never.duckdb"
    child = subprocess.Popen(
        [*command, "run", "--events", str(tmp_path), "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    t0 = time.monotonic()
    while not _mapped(child.pid, library):
        assert child.poll() is None and time.monotonic() - t0 < 300, child.communicate()
        time.sleep(0.005)
    out, err = _interrupt(child)
    assert err == STARTING_MESSAGE + "\n" and out == ""
    assert not db.exists()


def test_ctrl_c_while_waiting_for_a_held_database_printed_a_traceback(tmp_path):
    """`calpipe run` waiting in ``storage.connect`` for a database a notebook holds: one line,
    exit 130, the database file byte for byte as it was."""
    events = generate.generate(n_days=2, streams=(StreamSpec("a", events_per_day=10),), seed=3)
    storage.write_landing(events, tmp_path / "landing")
    db = tmp_path / "held.duckdb"
    storage.connect(db).close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    # (generous: on a loaded machine the command's imports alone took over a minute)
    holder = hold_database(db, 600)
    try:
        child = subprocess.Popen(
            [*COMMAND, "run", "--events", str(tmp_path / "landing"), "--db", str(db),
             "--lock-wait", "500", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # imported (DuckDB loaded) and then idle: sleeping between attempts to open the file
        t0 = time.monotonic()
        while not _mapped(child.pid, "duckdb"):
            assert child.poll() is None and time.monotonic() - t0 < 300, child.communicate()
            time.sleep(0.05)
        # in the lock's retry loop: its main thread sleeps between attempts (imports never
        # do), seen twice in a row. Two idle seconds (CPU ticks unchanged) were no proof: an
        # import stalled on a loaded machine's disk gives them too, and the attempts
        # themselves tick, which kept a loaded CI machine waiting past its budget.
        sleeping = 0
        while sleeping < 2:
            assert child.poll() is None and time.monotonic() - t0 < 400, child.communicate()
            sleeping = sleeping + 1 if _sleeping(child.pid) else 0
            time.sleep(0.2)
        _, err = _interrupt(child)
    finally:
        holder.kill()
        holder.wait()
    assert err == "calpipe run: interrupted (Ctrl-C): nothing was written\n", err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_ctrl_c_in_calpipe_protect_printed_a_35_line_traceback(tmp_path):
    """`calpipe protect` at a terminal, interrupted while it protects 4M events: its last line
    says the output was not written, exit 130, and neither the output nor its temporary file
    exists."""
    # 4M events: on a fast machine 2M were protected and written within the half second this
    # test waited after "protecting" (exit 0: the Ctrl-C came too late to test anything)
    streams = tuple(StreamSpec(f"s{i}", events_per_day=20_000) for i in range(20))
    src = tmp_path / "big.parquet"
    generate.generate(n_days=10, streams=streams, seed=1).write_parquet(src)
    out = tmp_path / "out.parquet"
    master, terminal = pty.openpty()  # standard error a terminal: its progress line is shown
    child = subprocess.Popen(
        [*COMMAND, "protect", str(src), str(out), "--order-by", "event_time", "event_id"],
        stdout=subprocess.PIPE, stderr=terminal, text=True,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    t0 = time.monotonic()
    while b"protecting" not in seen:  # imported, read: it is computing now (~8 s of work)
        assert child.poll() is None and time.monotonic() - t0 < 300, seen
        if select.select([master], [], [], 1.0)[0]:
            seen += os.read(master, 4096)
    time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    stdout, _ = child.communicate(timeout=120)
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    err = seen.decode(errors="replace")
    assert child.returncode == 130, (child.returncode, err[-300:])
    assert "Traceback" not in err, err[-4000:]
    last = err.replace("\r", "\n").rstrip().splitlines()[-1]
    assert last.endswith(f"calpipe protect: interrupted (Ctrl-C): {out} was not written"), last
    assert stdout == ""
    assert not out.exists() and not out.with_suffix(".parquet.tmp").exists()


def test_only_the_command_gets_the_starting_handler():
    """The starting handler is for the calpipe command's process alone, never for a program or
    a notebook that imports calpipe."""
    assert is_the_command(["x"], ["python", "-m", "calpipe.cli", "run"])
    assert is_the_command(["x"], ["python", "-m", "calpipe", "run"])  # calpipe/__main__.py
    assert is_the_command(["/venv/bin/calpipe", "run"], ["/venv/bin/python", "x"])
    assert not is_the_command(["-c"], ["python", "-c", "import calpipe"])
    assert not is_the_command(["x"], ["python", "-m", "pytest", "-m", "slow"])
    assert not is_the_command(["nb.py"], ["python", "nb.py", "-m"])
    # here, under pytest, calpipe installed nothing (another library may have: a Spark
    # context started earlier in this process installs its own; this test once failed so)
    assert getattr(signal.getsignal(signal.SIGINT), "__module__", None) != "calpipe._starting"


def test_a_systemerror_over_a_keyboardinterrupt_is_ctrl_c():
    """numba's dispatcher turned a Ctrl-C into ``SystemError(... returned a result with an
    exception set)``: it is an interruption (one line, 130), other SystemErrors are not."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise SystemError("CPUDispatcher returned a result with an exception set") from inner
    except SystemError as exc:
        assert is_interrupt(exc)
    assert not is_interrupt(SystemError("something else"))
    assert is_interrupt(KeyboardInterrupt()) and not is_interrupt(RuntimeError("boom"))


def test_a_polars_panic_over_a_keyboardinterrupt_is_ctrl_c():
    """A CI run's Ctrl-C landed while polars' numpy bridge imported numpy: a Rust panic naming
    the KeyboardInterrupt, exit 1 with its message; it is an interruption, other panics not."""
    from polars.exceptions import PanicException

    panic = PanicException(
        "Failed to access NumPy array API capsule: PyErr { type: <class 'KeyboardInterrupt'>, "
        "value: KeyboardInterrupt(), traceback: None }"
    )
    assert isinstance(panic, INTERRUPTS) and is_interrupt(panic)
    assert not is_interrupt(PanicException("index out of bounds"))


def test_a_systemerror_two_links_above_a_keyboardinterrupt_was_a_traceback():
    """Ctrl-C while numba loaded a cached kernel: its SystemError was raised over another error
    that was raised over the KeyboardInterrupt, and only the first link was looked at (exit 1
    and a traceback). The whole chain is followed now, also when it loops."""
    try:
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise EOFError("the cache file was cut short")  # noqa: B904 (its context)
        except EOFError as inner:
            raise SystemError("CPUDispatcher returned a result with an exception set") from inner
    except SystemError as exc:
        assert is_interrupt(exc)
    a, b = SystemError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # a loop without a KeyboardInterrupt: answered, no hang
    assert not is_interrupt(a)


@pytest.fixture
def sigint_restored():
    """The commands ignore SIGINT once interrupted (``interrupts.settle``); in this process,
    pytest's own handler comes back after the test."""
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_after_the_run_committed_said_it_was_rolled_back(tmp_path, monkeypatch,
                                                                capsys, sigint_restored):  # fmt: skip
    """Ctrl-C while `calpipe run` printed its report, every day committed: the message said the
    transaction in progress was rolled back, and how to resume, on two lines. It says, in one
    line, that the run committed and there is nothing to resume."""
    from calpipe import cli, pipeline

    events = generate.generate(n_days=3, streams=(StreamSpec("a", events_per_day=20),), seed=4)
    storage.write_landing(events, tmp_path / "landing")
    db = tmp_path / "c.duckdb"

    def report(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "day_report", report)
    argv = ["run", "--events", str(tmp_path / "landing"), "--db", str(db), "--no-progress"]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    last = max(events["event_time"]).date()
    assert err == (f"calpipe run: interrupted (Ctrl-C) after the run committed (the days up to "
                   f"{last}): nothing to resume\n")  # fmt: skip


def test_ctrl_c_after_the_demo_committed_said_it_was_rolled_back(tmp_path, monkeypatch,
                                                                 capsys, sigint_restored):  # fmt: skip
    """The same for `calpipe demo`: a Ctrl-C while it printed says its database is whole, and
    up to which day. That day comes from the demo's result: it was read from the database,
    which printed "(the days up to None)" when the file could not be read at that moment (here
    it does not exist: the demo is faked)."""
    import types

    from calpipe import cli, pipeline

    last = pipeline.DEMO_LAST_DAY
    run = types.SimpleNamespace(days=3, start=last - dt.timedelta(days=2), end=last, events=9)

    class Printing:  # the demo's result: printing its summary is where Ctrl-C lands
        def __init__(self):
            self.run = run

        @property
        def summary(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "demo", lambda *a, **k: Printing())
    db = tmp_path / "demo.duckdb"
    assert cli.main(["demo", "--db", str(db), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert err.endswith(f"calpipe demo: interrupted (Ctrl-C) after its run committed (the days "
                        f"up to {last}): {db} is whole\n"), err  # fmt: skip
    assert "rolled back" not in err and "None" not in err, err


def test_python_m_calpipe_was_no_command():
    """`python -m calpipe` said "No module named calpipe.__main__"; it is the calpipe command."""
    res = subprocess.run([sys.executable, "-m", "calpipe", "--help"], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: calpipe [-h] {protect,"), res.stdout
