"""Days computed outside dagster (``calpipe run``, ``calpipe demo``) reported to the instance.

dagster only knows what its own runs materialized: after ``calpipe demo`` the UI showed every
asset 0 % materialized although the tables held every day. ``calpipe ui`` runs this module
(``python -m calpipe.dagster_project.sync --db PATH``, in the background while the UI starts):
each day of ``pipeline_days`` that the instance has no materialization of, or that a previous
sync reported with another state hash (the day was recomputed since), gets a runless
materialization of every asset with that day's own row count (``dagster/row_count``), the
method, the state hash and the facts of the run that computed it (the command, when it
finished, its days, events and duration: the run log beside the database,
:func:`calpipe.pipeline.record_run_facts`); then the result of each asset check on that day,
:func:`calpipe.pipeline.data_checks` computed on the database for that day alone (the checks a
run computes for its days), as a check evaluation of the day's partition aimed at its
materialization. Days dagster materialized itself are left as they are.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
)

from calpipe import pipeline, storage

from .metadata import CHECK_ASSETS, PAGE, day_check_evaluations, latest_materializations

#: Metadata key of the state hash a sync reported (days without it came from dagster runs).
HASH_KEY = "calpipe/state_hash"


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


def _days_and_checks(db, start=None, end=None) -> tuple[list[dict], dict]:
    """The stored days of ``db`` (in [start, end] if given) and each day's data checks, read on
    one read-only connection closed before anything is reported (it blocks writers)."""
    con = storage.connect(db, read_only=True)
    try:
        days = pipeline.stored_days(con, start, end)
        checks = {d: pipeline.data_checks(con, d, d) for d in days["date"]}
    finally:
        con.close()
    return list(days.iter_rows(named=True)), checks


def _runless_results(instance: DagsterInstance) -> set[tuple[str, str]]:
    """(check, partition) of every check result reported without a run. dagster keeps one per
    check and partition (a second one breaks its unique index, upstream: its storage inserts a
    runless result where it updates a run's), so a day recomputed by ``calpipe run`` keeps its
    first reported result, aimed at its former materialization: dagster then shows the check
    as not evaluated on that day, never a stale result as current."""
    out = set()
    for name, asset in CHECK_ASSETS.items():
        key, cursor = AssetCheckKey(AssetKey(asset), name), None
        while True:
            recs = instance.event_log_storage.get_asset_check_execution_history(
                key, limit=PAGE, cursor=cursor
            )
            out |= {(name, r.partition) for r in recs if r.run_id == "" and r.partition}
            if len(recs) < PAGE:
                break
            cursor = recs[-1].id
    return out


def report_stored_days(instance: DagsterInstance, db: str | Path) -> int:
    """Report the days of ``db`` the instance does not know (see the module docstring); returns
    how many days were reported."""
    con = storage.connect(db, read_only=True)
    try:
        days = pipeline.stored_days(con)
    finally:
        con.close()
    known = _reported(instance)
    todo = [
        row for row in days.iter_rows(named=True)
        if not (row["date"].isoformat() in known
                and known[row["date"].isoformat()] in (None, row["state_hash"]))
    ]  # fmt: skip
    if not todo:
        return 0
    # the checks of the days to report only (a restart after one new day checks one day)
    con = storage.connect(db, read_only=True)
    try:
        checks = {row["date"]: pipeline.data_checks(con, row["date"], row["date"]) for row in todo}
    finally:
        con.close()
    runs = pipeline.run_facts(db)
    for row in todo:
        facts = _run_of(runs, row["date"])
        if facts is None:  # a database from before the runs' facts were recorded
            description, extra = "computed by calpipe run / calpipe demo, outside dagster", {}
        else:
            description, extra = _describe(facts), _facts_metadata(facts)
        _report_materializations(instance, row, pipeline.ASSET_TABLES, description, None, extra)
    # then the checks, aimed at those materializations (read back once, not per day and check)
    once = _runless_results(instance)
    latest = latest_materializations(instance, set(CHECK_ASSETS.values()))
    for row in todo:
        key = row["date"].isoformat()
        day_checks = [c for c in checks[row["date"]] if (c.name, key) not in once]
        _report_checks(instance, key, day_checks, None, latest)
    return len(todo)


def _run_of(runs: list[dict], day: dt.date) -> dict | None:
    """The facts of the latest recorded run that computed ``day`` (None if none says so)."""
    key = day.isoformat()
    return next((r for r in reversed(runs) if r["start"] <= key <= r["end"]), None)


def _describe(facts: dict) -> str:
    return (f"computed by {facts['runner']} (outside dagster, finished {facts['finished']} UTC): "
            f"{facts['days']} day(s) {facts['start']}..{facts['end']}, {facts['events']:,} "
            f"events, method {facts['method']}, {facts['seconds']:.1f} s")  # fmt: skip


def _facts_metadata(facts: dict) -> dict:
    """The run's facts as metadata of each day it computed (the asset's history then tells
    which command computed the day, when, over which days, and how long it took)."""
    return {
        "runner": facts["runner"],
        "run_finished_utc": facts["finished"],
        "run_days": f"{facts['start']}..{facts['end']} ({facts['days']} day(s))",
        "run_events": facts["events"],
        "run_seconds": float(facts["seconds"]),
    }


def _report_materializations(
    instance: DagsterInstance, row: dict, assets, description: str, run, extra: dict
) -> None:
    """A runless materialization of each of ``assets`` for the day of ``row`` (a row of
    :func:`calpipe.pipeline.stored_days`) with that day's own row count, method and state hash
    (and the dagster ``run`` it came from, for a day of a range run)."""
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
                    **({} if run is None else {"run": run.run_id}),
                    **extra,
                },
            )
        )


def _report_checks(instance: DagsterInstance, key: str, checks, run, latest=None) -> None:
    """The result of each of ``checks`` (the day's :func:`calpipe.pipeline.data_checks`) on
    partition ``key``, aimed at its latest materialization: runless, or, for a day of a
    dagster ``run`` (a range run), as that run's result of the check on the day (which
    replaces the one the run recorded, aimed at the run's own materialization)."""
    for evaluation in day_check_evaluations(instance, key, checks, latest):
        if run is None:
            instance.report_runless_asset_event(evaluation)
        else:
            instance.report_dagster_event(
                DagsterEvent(
                    event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION.value,
                    event_specific_data=evaluation,
                    job_name=run.job_name,
                ),
                run_id=run.run_id,
            )


def report_range_days(
    instance: DagsterInstance, db: str | Path, start: dt.date, end: dt.date, run, assets,
) -> int:  # fmt: skip
    """After a run over the partitions [start, end] (a single-run backfill): each day's own
    metadata for each of ``assets``, as runless materializations after the run's, and each
    day's own check results aimed at them. dagster gives every partition of a range run the
    run's one metadata (upstream issue dagster#18123; a materialization yielded per partition
    inside the run is not kept either, dagster#29846), so the latest materialization of each
    partition is this one, with that day's counts and ``run`` (the ``DagsterRun``) it came
    from; each check's result on the day is recorded again as the run's, aimed at it. Returns
    the days reported."""
    days, checks = _days_and_checks(db, start, end)
    for row in days:
        description = f"day {row['date']} of the range run {run.run_id}"
        _report_materializations(instance, row, assets, description, run, {})
        mine = [c for c in checks[row["date"]] if CHECK_ASSETS[c.name] in assets]
        _report_checks(instance, row["date"].isoformat(), mine, run)
    return len(days)


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
