"""calpipe/cli/progress.py: the run's progress bar and the protect status line (#14)."""

from __future__ import annotations

import datetime as dt
import os
import pty
import select
import subprocess
import sys

import polars as pl
import pytest

from calpipe import generate, pipeline, storage
from calpipe.errors import InputError
from calpipe.generate import StreamSpec

STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", events_per_day=20))


class Recorder:
    """A DayProgress that records what run_range told it."""

    def __init__(self):
        self.calls = []

    def start(self, total):
        self.calls.append(("start", total))

    def advance(self, day, events):
        self.calls.append(("advance", day, events))

    def stop(self):
        self.calls.append(("stop",))


def test_run_range_tells_its_progress_every_day_in_order(tmp_path):
    events = generate.generate(n_days=5, streams=STREAMS, seed=1)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "p.duckdb")
    rec = Recorder()
    pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "landing")), progress=rec)
    days = sorted(events["event_time"].dt.date().unique().to_list())
    per_day = dict(events.group_by(events["event_time"].dt.date()).len().iter_rows())
    assert rec.calls[0] == ("start", 5) and rec.calls[-1] == ("stop",)
    assert rec.calls[1:-1] == [("advance", d, per_day[d]) for d in days]


def test_progress_stops_when_the_run_fails(tmp_path):
    events = generate.generate(n_days=3, streams=STREAMS, seed=2)
    day2 = events["event_time"].dt.date() == dt.date(2010, 7, 22)
    bad = events.with_columns(score=pl.when(day2).then(1.5).otherwise(pl.col("score")))
    storage.write_landing(bad, tmp_path / "landing")
    con = storage.connect(tmp_path / "f.duckdb")
    rec = Recorder()
    with pytest.raises(InputError, match="score"):
        pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "landing")), progress=rec)
    assert rec.calls[0] == ("start", 3) and rec.calls[-1] == ("stop",)
    assert [c[1] for c in rec.calls if c[0] == "advance"] == [dt.date(2010, 7, 21)]


def _on_a_terminal(cmd: list[str], cwd) -> str:
    """Run ``cmd`` with standard error on a pseudo-terminal (as in a shell); its output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave, cwd=cwd,
                            env=os.environ | {"COLUMNS": "160"})  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_calpipe_run_draws_a_bar_on_a_terminal_and_not_with_no_progress(tmp_path):
    events = generate.generate(n_days=4, streams=STREAMS, seed=3)
    storage.write_landing(events, tmp_path / "landing")
    calpipe = [sys.executable, "-m", "calpipe.cli"]
    shown = _on_a_terminal([*calpipe, "run", "--events", "landing", "--db", "a.duckdb"], tmp_path)
    assert "calpipe run" in shown and "days ·" in shown and "events" in shown
    quiet = _on_a_terminal(
        [*calpipe, "run", "--events", "landing", "--db", "b.duckdb", "--no-progress"], tmp_path
    )
    assert "days ·" not in quiet
    done = subprocess.run([*calpipe, "run", "--events", "landing", "--db", "c.duckdb"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "days ·" not in done.stderr  # not a terminal: no bar
