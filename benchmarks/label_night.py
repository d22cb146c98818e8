"""The label feed's speed and memory targets (#12): a night of scores plus labels of earlier days.

1. **One night**: N scores of day d (unlabelled) and N labels arriving on day d for the events of
   day d - 1 (already stored), into a database holding day d - 1. ``calpipe run --labels``
   (the targets' method, and the default method beside it) against the floor: DuckDB alone
   storing the night's three tables (the label lookup's join included) from the same files,
   with no engine (:func:`_floor`, on :func:`benchmarks.pipeline.store_floor`; target <= 2x,
   issue #32); against the time DuckDB takes to load both Parquet files into tables (the
   older target, <= 3x, which the floor alone nearly fills); and its peak RSS against the
   night's Arrow size (target <= 4x).
2. **A chain**: ``--nights`` nights of M scores each, 70 % labelled the same night and 30 %
   arriving 1-30 days late, run night by night in one process (``calpipe run`` with the label
   feed): its peak RSS against one night of the same size run alone (target: equal, +-20 %).
   Two such nights: the chain's first (no history, no late labels) and its last, run in a
   fresh process on a database holding the nights before it (the same work as the chain's
   last night: its late labels' lookups and a month of history); the second is the
   like-for-like control for "memory does not grow with the chain".

Each measurement runs in a fresh process (peak RSS = its own ``VmHWM``); the CPU model is printed
(ratios, not absolute rates, are the targets).

    python -m benchmarks.label_night [--size smoke|full] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.cli import emit, size_parser
from benchmarks.pipeline import clock, peak_rss_mib, store_floor, vs_target, warm_up
from benchmarks.quality import cpu_model

#: (night scores = night labels, chain nights, chain scores per night)
SIZES = {
    "smoke": (200_000, 8, 20_000),
    "medium": (2_000_000, 30, 100_000),
    "full": (10_000_000, 60, 200_000),
}
DAY0 = dt.date(2024, 3, 1)
SEED = 20241126
#: The targets' method (as the pipeline benchmarks' items 5-6); the default method is shown too.
TARGET_METHOD, DEFAULT_METHOD = "composite-jumper", "composite-experts"
#: Of the chain's labels, the share arriving 1-30 days after their event's day.
LATE_SHARE, MAX_DELAY_DAYS = 0.3, 30


def _scores(n: int, n_streams: int, day: dt.date, seed: int):
    """One day of unlabelled scored events (streams s0000.., ids unique across days)."""
    import polars as pl

    rng = np.random.default_rng(seed)
    start = np.datetime64(day.isoformat(), "us")
    micros = np.sort(rng.integers(0, 86_400_000_000, n))
    return pl.DataFrame({
        "stream": pl.Series(rng.integers(0, n_streams, n)).cast(pl.String).str.zfill(4)
        .str.replace(r"^", "s"),
        "event_id": (day.toordinal() * 100_000_000 + np.arange(n)).astype(np.int64),
        "event_time": start + micros.astype("timedelta64[us]"),
        "score": rng.beta(2.0, 3.0, n),
        "label": pl.Series([None] * n, dtype=pl.Int32),
    })  # fmt: skip


def _labels(events, arrival_days: np.ndarray, seed: int):
    """Labels of ``events`` (truth p^0.7) arriving on the given days, at a time of that day after
    the event; in arrival order (``label_time``), as a label feed is appended: not in the
    events' order, which made the night's lookup of their events look twice as fast."""
    import polars as pl

    rng = np.random.default_rng(seed)
    n = events.height
    p = events["score"].to_numpy()
    ev_t = events["event_time"].to_numpy()
    day_start = arrival_days.astype("datetime64[D]").astype("datetime64[us]")
    lo = np.maximum(day_start, ev_t + np.timedelta64(1, "us"))
    span = (day_start + np.timedelta64(86_400_000_000 - 1, "us") - lo).astype(np.int64)
    label_time = lo + (rng.random(n) * span).astype("timedelta64[us]")
    return pl.DataFrame({
        "stream": events["stream"], "event_id": events["event_id"],
        "label": pl.Series((rng.random(n) < p**0.7).astype(np.int32)),
        "label_time": label_time,
    }).sort("label_time", maintain_order=True)  # fmt: skip


def prepare(root: Path, size: str) -> dict:
    """Landing folders and the database holding the day before the night."""
    from calpipe import pipeline, storage

    n, nights, per_night = SIZES[size]
    n_streams = max(100, n // 1000)
    prev, night = DAY0, DAY0 + dt.timedelta(days=1)
    ev_prev = _scores(n, n_streams, prev, SEED)
    storage.write_landing(ev_prev, root / "landing")
    for method in (TARGET_METHOD, DEFAULT_METHOD):
        con = storage.connect(root / f"history-{method}.duckdb")
        pipeline.run_range(con, storage.EventSource.parse(str(root / "landing")),
                           settings=pipeline.Settings.make(method))  # fmt: skip
        con.close()
    # the night lands beside the stored day (as a nightly landing folder grows); a copy alone
    # for DuckDB's load and the Arrow size
    tonight = _scores(n, n_streams, night, SEED + 1)
    storage.write_landing(tonight, root / "landing")
    storage.write_landing(tonight, root / "night")
    arrive = np.full(n, np.datetime64(night.isoformat()))
    storage.write_landing(_labels(ev_prev, arrive, SEED + 2), root / "night_labels",
                        time_column="label_time")  # fmt: skip
    # the chain: nights of per_night scores, 70 % labelled the same night, 30 % 1-30 days late
    rng = np.random.default_rng(SEED + 3)
    chain_streams = max(100, per_night // 100)
    for i in range(nights):
        d = DAY0 + dt.timedelta(days=i)
        ev = _scores(per_night, chain_streams, d, SEED + 10 + i)
        late = rng.random(per_night) < LATE_SHARE
        delay = np.where(late, rng.integers(1, MAX_DELAY_DAYS + 1, per_night), 0)
        arrive = np.datetime64(d.isoformat()) + delay.astype("timedelta64[D]")
        keep = arrive < np.datetime64((DAY0 + dt.timedelta(days=nights)).isoformat())
        lab = _labels(ev, arrive, SEED + 100 + i).filter(keep)
        storage.write_landing(ev, root / "chain")
        storage.write_landing(lab, root / "chain_labels", time_column="label_time")
        if i == 0:  # one night of the chain's size, alone
            storage.write_landing(ev, root / "one")
            storage.write_landing(lab.filter(lab["label_time"].dt.date() == d),
                                root / "one_labels", time_column="label_time")  # fmt: skip
    return {"events": n, "streams": n_streams, "nights": nights, "per_night": per_night}


def child(spec: dict) -> dict:
    """One measurement in this (fresh) process."""
    import duckdb
    import polars as pl

    kind, root = spec["kind"], Path(spec["root"])
    if kind == "duckdb_load":
        stop = clock()
        con = duckdb.connect(str(root / "load.duckdb"))
        for name in ("night", "night_labels"):
            files = [str(f) for f in sorted((root / name).glob("date=*/*.parquet"))]
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet({files!r})")
        con.close()
        return stop()
    if kind == "floor":
        return _floor(root)
    if kind == "arrow_size":
        size = sum(
            pl.read_parquet(f).estimated_size()
            for name in ("night", "night_labels")
            for f in (root / name).glob("date=*/*.parquet")
        )
        return {"arrow_mib": size / 2**20}
    from calpipe import pipeline, storage
    from calpipe.pipeline.labels import label_source

    method = spec["method"]
    warm_up(method)
    events, labels, db = {
        "night": ("landing", "night_labels", f"night-{method}.duckdb"),
        "chain": ("chain", "chain_labels", "chain.duckdb"),
        "one": ("one", "one_labels", "one.duckdb"),
        "history": ("chain", "chain_labels", "last.duckdb"),
        "last": ("chain", "chain_labels", "last.duckdb"),
    }[kind]
    end = None
    if kind == "history":  # the chain but its last night (not measured)
        end = DAY0 + dt.timedelta(days=spec["nights"] - 2)
    stop = clock()
    con = storage.connect(root / db)
    s = pipeline.run_range(con, storage.EventSource.parse(str(root / events)),
                           end=end, settings=pipeline.Settings.make(method),
                           labels=label_source(str(root / labels)))  # fmt: skip
    con.close()
    return {**stop(), "peak_mib": peak_rss_mib(), "days": s.days}


#: The label night's floor adds its label lookup to the store floor (``pipeline.STORE_SQL``):
#: each label's event (its date, time and base score) from the history. ``{lb}``: the labels'
#: files.
_LOOKUP_SQL = """INSERT INTO event_labels (date, stream, event_id, event_date, event_time, score,
        label, label_time, file)
    SELECT DATE '{day}', k.stream, k.event_id, e.event_date, e.event_time, e.score, k.label,
        k.label_time, 'date={day}/part-0.parquet'
    FROM read_parquet({lb}) k JOIN scored_events e
      ON e.stream = k.stream AND e.event_id = k.event_id AND e.event_date < DATE '{day}'"""


def _floor(root: Path) -> dict:
    """The night's floor: DuckDB alone storing its three 10M-row tables (``scored_events``,
    ``protected_scores``, ``event_labels`` with the label lookup's join) in one transaction on
    a copy of the history, as the night does, and closing (:func:`benchmarks.pipeline.store_floor`)."""
    db = root / "floor.duckdb"
    shutil.copy(root / f"history-{TARGET_METHOD}.duckdb", db)
    files = {n: [str(f) for f in sorted((root / n).glob("date=*/*.parquet"))]
             for n in ("night", "night_labels")}  # fmt: skip
    day = (DAY0 + dt.timedelta(days=1)).isoformat()
    return store_floor(db, day, files["night"], (_LOOKUP_SQL,), lb=files["night_labels"])


def _run_child(spec: dict) -> dict:
    cmd = [sys.executable, "-W", "ignore", "-m", "benchmarks.label_night", "--child",
           json.dumps(spec)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{spec['kind']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(size: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        info = prepare(root, size)
        for method in (TARGET_METHOD, DEFAULT_METHOD):
            shutil.copy(root / f"history-{method}.duckdb", root / f"night-{method}.duckdb")
        load = _run_child({"kind": "duckdb_load", "root": str(root)})
        arrow = _run_child({"kind": "arrow_size", "root": str(root)})
        floor = _run_child({"kind": "floor", "root": str(root)})
        spec = {"root": str(root), "method": TARGET_METHOD}
        night = _run_child({**spec, "kind": "night"})
        default = _run_child({**spec, "kind": "night", "method": DEFAULT_METHOD})
        one = _run_child({**spec, "kind": "one"})
        _run_child({**spec, "kind": "history", "nights": info["nights"]})
        last = _run_child({**spec, "kind": "last"})
        chain = _run_child({**spec, "kind": "chain"})
    n = info["events"]
    timed = (load, floor, night, default)  # the night's four runs, side by side

    def cpu(r: dict) -> str:
        return f"CPU {r['cpu']:.1f} s ({r['cpu'] / r['seconds']:.1f} cores)"

    rows = [
        ("DuckDB loads the night's scores and labels (2 tables)", load["seconds"], "",
         f"1.00x; {cpu(load)}"),
        ("DuckDB alone stores the night's 3 tables with the label lookup (no engine)",
         floor["seconds"], "", f"{floor['seconds'] / load['seconds']:.2f}x the load: the "
         f"floor of the night's writes; {cpu(floor)}"),
        ("calpipe run --labels, one night", night["seconds"], f"{night['peak_mib']:,.0f}",
         f"{vs_target(night['seconds'] / floor['seconds'], 2, 'the floor')}; "
         f"{vs_target(night['seconds'] / load['seconds'], 3, 'the load')}; {cpu(night)}; peak "
         + vs_target(night["peak_mib"] / arrow["arrow_mib"], 4,
                     f"the night's Arrow size {arrow['arrow_mib']:,.0f} MiB")),
        (f"the same night, default method ({DEFAULT_METHOD})", default["seconds"],
         f"{default['peak_mib']:,.0f}",
         f"{default['seconds'] / floor['seconds']:.2f}x the floor, "
         f"{default['seconds'] / load['seconds']:.2f}x the load; peak "
         f"{default['peak_mib'] / arrow['arrow_mib']:.2f}x the Arrow size (informational)"),
        (f"calpipe run --labels, one night of {info['per_night']:,} scores", one["seconds"],
         f"{one['peak_mib']:,.0f}", "the chain's first night alone"),
        (f"calpipe run --labels, the chain's last night alone (on the {info['nights'] - 1} "
         "nights before it)", last["seconds"], f"{last['peak_mib']:,.0f}",
         "the same work as the chain's last night"),
        (f"calpipe run --labels, {info['nights']} nights (30 % of labels 1-30 days late)",
         chain["seconds"], f"{chain['peak_mib']:,.0f}",
         f"peak {chain['peak_mib'] / last['peak_mib']:.2f}x its last night's alone, "
         f"{chain['peak_mib'] / one['peak_mib']:.2f}x its first night's (target 1 +- 0.2)"),
    ]  # fmt: skip
    lines = [
        f"### Label feed: a night of {n:,} scores + {n:,} labels of the day before; a "
        f"{info['nights']}-night chain",
        "",
        f"CPU: {cpu_model()}; method {TARGET_METHOD} (the targets', as BENCHMARKS items 5-6) "
        f"unless named; {info['streams']:,} streams. Each row is a fresh process; peak = its "
        "VmHWM.",
        "",
        "| run | wall s | peak MiB | figure |",
        "|---|---:|---:|---|",
        *[f"| {r} | {s:.2f} | {m} | {f} |" for r, s, m, f in rows],
        "",
        # what the time targets leave beside the floor (the writes and the lookup)
        f"The target relative to the floor (2x) is {2 * floor['seconds']:.2f} s: the floor's "
        f"{floor['seconds']:.2f} s ({floor['cpu']:.1f} CPU-s) and as much again for everything "
        "else the night does (reading both files into memory, the checks, the engine, the "
        f"monitoring); the night takes {night['seconds'] - floor['seconds']:.2f} s and "
        f"{night['cpu'] - floor['cpu']:.1f} CPU-s beyond the floor's. The older target (3x the "
        f"load, {3 * load['seconds']:.2f} s) leaves "
        f"{3 * load['seconds'] - floor['seconds']:.2f} s beyond the floor. Other processes used "
        f"{min(r['others'] for r in timed):.2f}-{max(r['others'] for r in timed):.2f} cores "
        "while these runs were timed (each run's mean, from /proc/stat).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = size_parser(SIZES)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    return emit(run(a.size), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
