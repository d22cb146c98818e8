"""The label-feed issue, item 3: the cost of checking a night's event ids against the whole
history (``calpipe.pipeline.events.check_history_duplicates``), side by side with the night's
``calpipe run`` in one process.

A history of ``days`` days of ``per_day`` events over 1,000 streams is run once; then one more
night is run, and the duplicate check of that night is timed on its own against the stored
history (its share of the night is the cost). Event ids increase with time, as in an event log:
DuckDB then skips most of the history's row groups by their min/max. A second row times the
check with the ids shuffled over the history (no row group can be skipped).

    python -m benchmarks.history_duplicates [--per-day 1000000] [--days 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.pipeline import day_events
from benchmarks.quality import cpu_model
from calpipe import pipeline, storage
from calpipe.pipeline.events import check_history_duplicates


def measure(per_day: int, days: int, shuffled: bool) -> dict:
    tmp = Path(tempfile.mkdtemp())
    start = dt.date(2024, 1, 1)
    frames = []
    for i in range(days + 1):
        frames.append(day_events(per_day, 1_000, start + dt.timedelta(days=i), seed=i))
    if shuffled:  # ids of every day drawn from the whole id range: no row group is skipped
        ids = np.random.default_rng(0).permutation((days + 1) * per_day)
        frames = [f.with_columns(pl.Series("event_id", ids[i * per_day : (i + 1) * per_day]))
                  for i, f in enumerate(frames)]  # fmt: skip
    storage.write_landing(pl.concat(frames), tmp / "landing")
    source = storage.EventSource.parse(str(tmp / "landing"))
    con = storage.connect(tmp / "db.duckdb")
    last = start + dt.timedelta(days=days)
    pipeline.run_range(con, source, start, last - dt.timedelta(days=1))
    t0 = time.perf_counter()
    pipeline.run_range(con, source, last, last)
    night = time.perf_counter() - t0
    chunk = pl.read_parquet(tmp / "landing" / f"date={last}" / "*.parquet")
    t0 = time.perf_counter()
    check_history_duplicates(con, chunk, last, last, source)
    check = time.perf_counter() - t0
    con.close()
    return {"shuffled": shuffled, "night": night, "check": check}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-day", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=30)
    a = ap.parse_args(argv)
    print(f"CPU: {cpu_model()}; history {a.days} days x {a.per_day:,} events, 1,000 streams")
    print("| event ids | night (calpipe run, incl. the check) s | duplicate check s | share |")
    print("|---|---:|---:|---:|")
    for shuffled in (False, True):
        r = measure(a.per_day, a.days, shuffled)
        what = "shuffled over the history" if shuffled else "increasing with time"
        print(f"| {what} | {r['night']:.2f} | {r['check']:.3f} | {r['check'] / r['night']:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
