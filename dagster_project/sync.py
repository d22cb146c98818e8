"""Days computed outside dagster (``calpipe run``, ``calpipe demo``) reported to the instance.

dagster only knows what its own runs materialized: after ``calpipe demo`` the UI showed every
asset 0 % materialized although the tables held every day. ``calpipe ui`` runs this module
(``python -m calpipe.dagster_project.sync --db PATH``, in the background while the UI starts):
each day of ``pipeline_days`` that the instance has no materialization of, or that a previous
sync reported with another state hash (the day was recomputed since), gets a runless
materialization of every asset with that day's own row count (``dagster/row_count``), the
method and the state hash. Days dagster materialized itself are left as they are.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

from dagster import AssetKey, AssetMaterialization, DagsterInstance

from calpipe import pipeline, storage

#: Metadata key of the state hash a sync reported (days without it came from dagster runs).
HASH_KEY = "calpipe/state_hash"
#: Materializations read back per request when finding what the instance knows.
PAGE = 10_000


def _reported(instance: DagsterInstance) -> dict[str, str | None]:
    """partition -> the state hash of its latest ``protected_scores`` materialization (None
    when a dagster run made it)."""
    out: dict[str, str | None] = {}
    cursor = None
    while True:
        res = instance.fetch_materializations(
            AssetKey("protected_scores"), limit=PAGE, cursor=cursor
        )
        for rec in res.records:  # newest first: the first seen of a partition is its latest
            mat = rec.asset_materialization
            if mat is not None and mat.partition is not None and mat.partition not in out:
                value = mat.metadata.get(HASH_KEY)
                out[mat.partition] = None if value is None else str(value.value)
        if not res.has_more:
            return out
        cursor = res.cursor


def report_stored_days(instance: DagsterInstance, db: str | Path) -> int:
    """Report the days of ``db`` the instance does not know (see the module docstring); returns
    how many days were reported."""
    con = storage.connect(db, read_only=True)
    try:
        days = pipeline.stored_days(con)
    finally:
        con.close()
    known = _reported(instance)
    n = 0
    for row in days.iter_rows(named=True):
        key = row["date"].isoformat()
        if key in known and known[key] in (None, row["state_hash"]):
            continue
        _report_day(instance, row, pipeline.ASSET_TABLES,
                    "computed by calpipe run / calpipe demo, outside dagster")  # fmt: skip
        n += 1
    return n


def _report_day(instance: DagsterInstance, row: dict, assets, description: str, **extra) -> None:
    """A runless materialization of each of ``assets`` for the day of ``row`` (a row of
    :func:`calpipe.pipeline.stored_days`) with that day's own row count, method and state
    hash."""
    for asset in assets:
        instance.report_runless_asset_event(
            AssetMaterialization(
                AssetKey(asset),
                partition=row["date"].isoformat(),
                description=description,
                metadata={
                    "dagster/row_count": row[asset],
                    "method": row["method"],
                    HASH_KEY: row["state_hash"],
                    **extra,
                },
            )
        )


def report_range_days(
    instance: DagsterInstance, db: str | Path, start: dt.date, end: dt.date, run_id: str,
    assets,
) -> int:  # fmt: skip
    """After a run over the partitions [start, end] (a single-run backfill): each day's own
    metadata for each of ``assets``, as runless materializations after the run's. dagster gives
    every partition of a range run the run's one metadata (upstream issue dagster#18123; a
    materialization yielded per partition inside the run is not kept either, dagster#29846),
    so the latest materialization of each partition is this one, with that day's counts and
    the run it came from. Returns the days reported."""
    con = storage.connect(db, read_only=True)
    try:
        days = pipeline.stored_days(con, start, end)
    finally:
        con.close()
    for row in days.iter_rows(named=True):
        _report_day(instance, row, assets, f"day {row['date']} of the range run {run_id}",
                    run=run_id)  # fmt: skip
    return days.height


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m calpipe.dagster_project.sync", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--db", required=True, help="calpipe DuckDB file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with DagsterInstance.get() as instance:
        n = report_stored_days(instance, args.db)
    if n:
        print(
            f"dagster: {n} day(s) computed outside dagster recorded as materializations ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
