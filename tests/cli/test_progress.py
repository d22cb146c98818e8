"""calpipe/cli/progress.py: the run's progress bar, the protect status line (#14) and the bar
over the events of a long protect (#33)."""

from __future__ import annotations

import datetime as dt
import os
import pty
import re
import select
import subprocess
import sys

import polars as pl
import pytest

from calpipe import generate, pipeline, storage
from calpipe.errors import InputError
from calpipe.generate import StreamSpec
from tests.conftest import make_events

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


def _protect_lowered(piece_ops: int) -> list[str]:
    """``calpipe protect`` in a process whose bar and pieces start at 1,000 events (not
    ``config.PROGRESS_MIN_EVENTS``' millions: seconds of work) and whose pieces have
    ``piece_ops`` operations: small files then run in pieces as a big one does."""
    code = (
        "import sys; from calpipe import config; config.PROGRESS_MIN_EVENTS = 1_000; "
        "config.PIECES_MIN_EVENTS = 1_000; "
        f"config.PIECE_OPS = {piece_ops}; from calpipe.cli import main; "
        "sys.exit(main())"
    )
    return [sys.executable, "-c", code, "protect"]


#: The bar's line at its end: events done of the total, the rate, the time spent and left.
BAR = re.compile(r"protecting ([\d,]+) events with .*? ([\d,]+)/([\d,]+) events "
                 r"([\d,]+) events/s \d+:\d\d:\d\d ETA \d+:\d\d:\d\d")  # fmt: skip


def test_calpipe_protect_draws_an_event_bar_on_a_terminal_and_not_piped_or_with_no_progress(
    tmp_path,
):
    streams = tuple(StreamSpec(f"s{i}", events_per_day=800) for i in range(3))
    events = generate.generate(n_days=5, streams=streams, seed=4)
    events.write_parquet(tmp_path / "in.parquet")
    n = f"{events.height:,}"
    shown = _on_a_terminal([*_protect_lowered(1_000), "in.parquet", "a.parquet"], tmp_path)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # the terminal's colours and moves
    ends = [m.groups() for m in BAR.finditer(plain)]
    assert ends, plain[-2000:]
    assert ends[-1][:3] == (n, n, n) and int(ends[-1][3].replace(",", "")) > 0  # done, a rate
    assert "ETA" in plain
    quiet = _on_a_terminal(
        [*_protect_lowered(1_000), "in.parquet", "b.parquet", "--no-progress"], tmp_path
    )
    assert "events/s" not in quiet and "protecting" not in quiet
    piped = subprocess.run([*_protect_lowered(1_000), "in.parquet", "c.parquet"], cwd=tmp_path,
                           capture_output=True, text=True)  # fmt: skip
    assert piped.returncode == 0 and "events/s" not in piped.stderr
    assert "protecting" not in piped.stderr
    # the bar's run (in pieces) wrote the file the others (one pass) wrote, byte for byte
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "c.parquet").read_bytes()


def _frame(kind: str) -> pl.DataFrame:
    if kind == "k3":
        return make_events(11, n_events=6_000, n_streams=4, n_classes=3)
    if kind == "delayed":
        return make_events(12, n_events=6_000, n_streams=4, label_time="mixed")
    return make_events(13, n_events=6_000, n_streams=4)  # null labels: forecast-only rows


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("binary", ["--method", "composite-jumper"]),
        ("binary", []),  # the default, composite-experts
        ("k3", ["--scores", "scores"]),
        ("delayed", ["--label-time", "label_time"]),
    ],
    ids=["composite-jumper", "composite-experts", "k3", "delayed-labels"],
)
def test_the_bar_s_pieces_write_the_one_pass_file_byte_for_byte(tmp_path, kind, options):
    """With the bar, the events run in pieces (700 operations here) with the state carried;
    with --no-progress in one kernel call, as before the bar: the same Parquet file."""
    df = _frame(kind)
    assert df["label"].null_count() > 0  # forecast-only rows too
    df.write_parquet(tmp_path / "in.parquet")
    cmd = [*_protect_lowered(700), "in.parquet"]
    shown = _on_a_terminal([*cmd, "pieces.parquet", *options], tmp_path)
    assert "events/s" in shown  # the bar was drawn: the pieces ran
    _on_a_terminal([*cmd, "one.parquet", *options, "--no-progress"], tmp_path)
    assert (tmp_path / "pieces.parquet").read_bytes() == (tmp_path / "one.parquet").read_bytes()
    out = pl.read_parquet(tmp_path / "one.parquet")
    assert out.height == df.height and "log10_martingale" in out.columns
