"""Issue 4, items 5-6: the nightly run against the I/O floor, and its memory.

``python -m benchmarks.pipeline [--size smoke|full]`` prints two markdown tables:

5. ``calpipe run`` of one daily partition (Parquet landing file in -> DuckDB ``protected_scores``,
   ``calibrator_state``, monitoring, alarms and map out; checks included) against DuckDB loading the
   same Parquet file into a table (``CREATE TABLE t AS SELECT * FROM read_parquet(...)``), each in
   a fresh child process on a fresh database file, same run;
6. memory: peak RSS of that child against the in-memory (Arrow) size of the partition, and the
   peak RSS of a 30-day backfill against a single day of the same size: memory bounded by a
   partition (one commit chunk), not by history.

Both items measure ``composite-jumper`` (their targets were set for it); two more rows run the
same day and backfill with the default method and give its time and peak against it.

Every child is a new Python process (``--child``) and reports its own peak RSS (VmHWM). Inputs are
generated from a fixed seed. Sizes: full = 10M events in the day over 1,000 streams and a 30-day
backfill at 1M events per day (the issue's sizes); smoke = 200k and 20k (CI keeps it working);
``--events N`` / ``--per-day N`` override the day and backfill sizes (e.g. 2M for a middle size).

The calpipe child starts its clock after start-up: imports, and the numba cache loads and lazy
imports of a first (three-event) ``calpipe.protect`` call, which item 8 measures. Its peak RSS
includes them (a process's baseline of ~280 MiB). With ``--repeat N`` the two timed kinds run
alternately N times and the best time of each is kept (the machine is shared).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SEED = 20240607
#: Items 5-6's targets were set for paper 001's Composite Jumper, the pipeline's method when they
#: were written; they keep measuring it, and rows marked "default" measure the default method.
TARGET_METHOD = "composite-jumper"
SIZES = {
    "smoke": {"day": 200_000, "streams": 1_000, "backfill_per_day": 20_000, "backfill_days": 30},
    "full": {
        "day": 10_000_000,
        "streams": 1_000,
        "backfill_per_day": 1_000_000,
        "backfill_days": 30,
    },
}
DAY0 = dt.date(2024, 3, 1)


def day_events(n: int, n_streams: int, day: dt.date, seed: int):
    """One day of scored events: streams s0000.., event times spread over the day, a miscalibrated
    base (truth p^0.7), 90 % labelled. Event ids are unique per stream across days."""
    import polars as pl

    rng = np.random.default_rng(seed)
    stream = rng.integers(0, n_streams, n)
    micros = np.sort(rng.integers(0, 86_400_000_000, n))
    p = rng.beta(2.0, 3.0, n)
    y = (rng.random(n) < p**0.7).astype(np.int32)
    labelled = rng.random(n) < 0.9
    start = np.datetime64(day.isoformat(), "us")
    return pl.DataFrame(
        {
            "stream": pl.Series(stream).cast(pl.String).str.zfill(4).str.replace(r"^", "s"),
            "event_id": (day.toordinal() * 100_000_000 + np.arange(n)).astype(np.int64),
            "event_time": start + micros.astype("timedelta64[us]"),
            "score": p,
            "label": pl.Series(np.where(labelled, y, 0))
            .cast(pl.Int32)
            .set(pl.Series(~labelled), None),
        }
    )


def write_days(root: Path, per_day: int, n_streams: int, n_days: int) -> Path:
    from calpipe import storage

    for i in range(n_days):
        d = DAY0 + dt.timedelta(days=i)
        storage.write_landing(day_events(per_day, n_streams, d, SEED + i), root)
    return root


# ----------------------------------------------------------------------------------------------
# Children: each measures itself and prints one JSON line.
# ----------------------------------------------------------------------------------------------
def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM, the high-water mark of its own memory map. (ru_maxrss is
    inherited through fork + exec: a child would report at least the parent's RSS, which holds
    the generated events.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def warm_up(method: str) -> None:
    """Start-up of a calpipe process: imports, and a first ``calpipe.protect`` call on three events
    (it loads the kernels from numba's cache and imports what they import lazily)."""
    import polars as pl

    import calpipe
    from calpipe import config, pipeline, storage  # noqa: F401

    calpipe.protect(
        pl.DataFrame(
            {"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
             "score": [0.2, 0.5, 0.7], "label": [0, 1, None]}
        ),
        method=method,
    )  # fmt: skip


def child(spec: dict) -> dict:
    import duckdb

    kind, landing, db = spec["kind"], spec["landing"], spec["db"]
    method = spec.get("method", TARGET_METHOD)
    if kind == "calpipe_run":  # imports and numba cache loads are start-up, measured in item 8
        warm_up(method)
    t0 = time.perf_counter()
    if kind == "duckdb_load":
        con = duckdb.connect(db)
        files = sorted(Path(landing).glob("date=*/events.parquet"))
        con.execute(f"CREATE TABLE t AS SELECT * FROM read_parquet({[str(f) for f in files]!r})")
        rows = con.sql("SELECT count(*) FROM t").fetchall()[0][0]
        con.close()
    elif kind == "calpipe_run":
        from calpipe import pipeline, storage

        con = storage.connect(db)
        s = pipeline.run_range(
            con, storage.EventSource.parse(landing), settings=pipeline.Settings.make(method)
        )
        rows = s.events
        con.close()
    elif kind == "arrow_size":
        import polars as pl

        files = sorted(Path(landing).glob("date=*/events.parquet"))
        rows = 0
        size = 0
        for f in files:
            df = pl.read_parquet(f)
            rows, size = rows + df.height, max(size, df.estimated_size())
        return {"rows": rows, "arrow_mib": size / 2**20}
    else:
        raise ValueError(kind)
    return {"rows": rows, "seconds": time.perf_counter() - t0, "peak_mib": peak_rss_mib()}


def run_child(spec: dict) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.pipeline", "--child", json.dumps(spec)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(
    size: str, repeat: int = 1, events: int | None = None, per_day: int | None = None
) -> list[dict]:
    cfg = dict(SIZES[size])
    if events:
        cfg["day"] = events
    if per_day:
        cfg["backfill_per_day"] = per_day
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="calpipe-bench-") as tmp:
        tmp = Path(tmp)
        one = write_days(tmp / "one_day", cfg["day"], cfg["streams"], 1)
        arrow = run_child({"kind": "arrow_size", "landing": str(one), "db": ""})
        best: dict[str, dict] = {}
        for r in range(repeat):
            for kind in ("duckdb_load", "calpipe_run"):
                res = run_child(
                    {"kind": kind, "landing": str(one), "db": str(tmp / f"{kind}{r}.duckdb")}
                )
                if kind not in best or res["seconds"] < best[kind]["seconds"]:
                    best[kind] = res
        load, run = best["duckdb_load"], best["calpipe_run"]
        rows.append({
            "item": "5", "what": "calpipe run, one day", "events": run["rows"],
            "streams": cfg["streams"], "seconds": run["seconds"],
            "events_per_s": run["rows"] / run["seconds"], "peak_mib": run["peak_mib"],
            "figure": f"{run['seconds'] / load['seconds']:.2f}x the DuckDB load (target <= 3x)",
        })  # fmt: skip
        rows.append({
            "item": "5", "what": "DuckDB CTAS read_parquet, same file", "events": load["rows"],
            "streams": cfg["streams"], "seconds": load["seconds"],
            "events_per_s": load["rows"] / load["seconds"], "peak_mib": load["peak_mib"],
            "figure": "the I/O floor",
        })  # fmt: skip
        rows.append({
            "item": "6", "what": "peak RSS of the nightly run / Arrow size of the day",
            "events": run["rows"], "streams": cfg["streams"], "seconds": float("nan"),
            "events_per_s": float("nan"), "peak_mib": run["peak_mib"],
            "figure": f"{run['peak_mib'] / arrow['arrow_mib']:.2f}x of {arrow['arrow_mib']:.0f} MiB (target <= 4x)",
        })  # fmt: skip

        per_day, n_days = cfg["backfill_per_day"], cfg["backfill_days"]
        single = write_days(tmp / "single", per_day, cfg["streams"], 1)
        month = write_days(tmp / "month", per_day, cfg["streams"], n_days)
        r1 = run_child({"kind": "calpipe_run", "landing": str(single), "db": str(tmp / "s.duckdb")})
        r30 = run_child({"kind": "calpipe_run", "landing": str(month), "db": str(tmp / "m.duckdb")})
        rows.append({
            "item": "6", "what": f"single day ({per_day:,} events)",
            "events": r1["rows"], "streams": cfg["streams"], "seconds": r1["seconds"],
            "events_per_s": r1["rows"] / r1["seconds"], "peak_mib": r1["peak_mib"],
            "figure": "the backfill's reference",
        })  # fmt: skip
        rows.append({
            "item": "6", "what": f"backfill of {n_days} days vs 1 day ({per_day:,} events/day)",
            "events": r30["rows"], "streams": cfg["streams"], "seconds": r30["seconds"],
            "events_per_s": r30["rows"] / r30["seconds"], "peak_mib": r30["peak_mib"],
            "figure": f"peak {r30['peak_mib']:.0f} vs {r1['peak_mib']:.0f} MiB = "
                      f"{r30['peak_mib'] / r1['peak_mib'] - 1:+.0%} (target within +-20 %)",
        })  # fmt: skip
        # the default method (composite-experts): the same day and backfill, no targets
        from calpipe import config

        default = config.PIPELINE_DEFAULT_METHOD
        for label, landing, ref in (
            ("one day", one, run),
            (f"backfill of {n_days} days", month, r30),
        ):
            d = run_child({"kind": "calpipe_run", "landing": str(landing),
                           "db": str(tmp / f"default-{label[:3]}.duckdb"), "method": default})  # fmt: skip
            rows.append({
                "item": "5-6", "what": f"calpipe run, {label}, default method ({default})",
                "events": d["rows"], "streams": cfg["streams"], "seconds": d["seconds"],
                "events_per_s": d["rows"] / d["seconds"], "peak_mib": d["peak_mib"],
                "figure": f"{d['seconds'] / ref['seconds']:.2f}x the time and "
                          f"{d['peak_mib'] / ref['peak_mib']:.2f}x the peak of {TARGET_METHOD}",
            })  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| item | measurement | events | streams | wall s | events/s | peak RSS MiB | figure |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        secs = "" if np.isnan(r["seconds"]) else f"{r['seconds']:.2f}"
        eps = "" if np.isnan(r["events_per_s"]) else f"{r['events_per_s'] / 1e6:.2f}M"
        lines.append(
            f"| {r['item']} | {r['what']} | {r['events']:,} | {r['streams']:,} | {secs} | {eps} "
            f"| {r['peak_mib']:.0f} | {r['figure']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="smoke")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--events", type=int, default=None, help="events in the one-day run")
    ap.add_argument("--per-day", type=int, default=None, help="events per day of the backfill")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    print(markdown(measure(args.size, args.repeat, args.events, args.per_day)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
