"""Issue #35's speed target: what the performance estimates and the change detector add to a night.

``python -m benchmarks.monitoring [--size smoke|full] [--repeat N]`` prints one markdown table.

Two nights of the default method, each ``calpipe run`` of one day resuming from the day before,
in a fresh child process on a fresh database, run twice side by side in one run:

* **with**: the nightly run as shipped;
* **without**: the same run with the ``performance_estimates`` rows and the change detector
  (:func:`calpipe.night.phases.detect_changes`) replaced by nothing (the detector's state columns
  still carried, as initial values, so the state rows keep their layout).

The events are :func:`benchmarks.pipeline.day_events` (a miscalibrated base, 90 % labelled): the
detector finds a change point in every stream on night 1 (each freezes its map: the serving map
at 97 scores per stream) and tests night 2's labels against the frozen maps (the interpolation
for every label): the detector's most expensive nights. The "with" child also times the two
parts themselves (estimates, detector) inside the night. Sizes: full = 10M events a night over
1,000 streams (the issue's size); smoke = 200k (CI keeps it working). The CPU model is printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time
from pathlib import Path

from benchmarks.pipeline import DAY0, clock, landing_files, run_child, warm_up, write_days
from benchmarks.run import machine

SIZES = {"smoke": {"day": 200_000, "streams": 1_000}, "full": {"day": 10_000_000, "streams": 1_000}}
METHOD = "composite-experts"


def _switch_off() -> None:
    """The night without the estimates and the detector (see the module docstring)."""
    import dataclasses

    import polars as pl

    from calpipe.engine import ProtectResult
    from calpipe.night import changes, phases
    from calpipe.pipeline import tables

    def no_detector(chain, batch, state, late):
        batch.changes = pl.DataFrame(schema=changes.CHANGE_SCHEMA)
        batch.result = ProtectResult(
            batch.result.scores, changes.with_detector(batch.result.state, state, None),
            batch.result.groups,  # (as the night's: the monitoring reuses the engine's grouping)
        )  # fmt: skip

    phases.detect_changes = no_detector
    t = tables.TABLES["performance_estimates"]
    tables.TABLES["performance_estimates"] = dataclasses.replace(t, rows=lambda b: pl.DataFrame())


def _timed(seconds: dict) -> None:
    """Time the estimates' rows and the detector inside the night (into ``seconds``)."""
    import dataclasses

    from calpipe.night import phases
    from calpipe.pipeline import tables

    def timer(name, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0

        return run

    phases.detect_changes = timer("detector", phases.detect_changes)
    t = tables.TABLES["performance_estimates"]
    tables.TABLES["performance_estimates"] = dataclasses.replace(t, rows=timer("estimates", t.rows))


def child(spec: dict) -> dict:
    warm_up(METHOD)
    seconds: dict[str, float] = {}
    if spec["with"]:
        _timed(seconds)
    else:
        _switch_off()
    from calpipe import pipeline, storage

    nights = []
    con = storage.connect(spec["db"])
    try:
        for i, day in enumerate((DAY0, DAY0 + dt.timedelta(days=1))):
            seconds.clear()
            stop = clock()
            pipeline.run_range(
                con, storage.EventSource.parse(spec["landing"]), day, day,
                pipeline.Settings.make(METHOD), first_day=DAY0 if i == 0 else None,
                raise_on_failed_check=spec["with"],  # (without: estimates_valid fails, rightly)
            )  # fmt: skip
            found = storage.query(
                con, "SELECT count(*) AS n FROM change_points WHERE detected_date = $1", [day]
            )["n"][0]
            nights.append({**stop(), **seconds, "change_points": int(found)})
    finally:
        con.close()
    return {"nights": nights}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="smoke")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many (default 2)")
    ap.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory(prefix="calpipe-monitoring-") as tmp:
        landing = write_days(Path(tmp) / "landing", size["day"], size["streams"], 2)
        assert len(landing_files(landing)) >= 2
        best: dict[bool, list[dict]] = {}
        for r in range(args.repeat):  # side by side: with, without, with, without ...
            for on in (True, False):
                spec = {"with": on, "landing": str(landing), "db": str(Path(tmp) / f"{on}-{r}.db")}
                res = run_child(spec, "benchmarks.monitoring")["nights"]
                if on not in best:
                    best[on] = res
                else:
                    best[on] = [min(a, b, key=lambda x: x["seconds"])
                                for a, b in zip(best[on], res, strict=True)]  # fmt: skip
    rows = [
        f"## What the estimates and the change detector add to a night ({args.size}: "
        f"{size['day']:,} events over {size['streams']:,} streams, {METHOD})\n",
        machine() + f" Best of {args.repeat}, wall seconds of each night's `calpipe run`.\n",
        "| night | with s | without s | added | of which: estimates s | detector s | change "
        "points |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (w, wo) in enumerate(zip(best[True], best[False], strict=True), 1):
        added = w["seconds"] / wo["seconds"] - 1
        rows.append(
            f"| {i} | {w['seconds']:.2f} | {wo['seconds']:.2f} | {added:+.1%} | "
            f"{w.get('estimates', 0):.2f} | {w.get('detector', 0):.2f} | {w['change_points']} |"
        )
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
