"""The code location's sensors: the landing sensor, and each day's metadata after a range run.

**The landing sensor**: run the days a ``calpipe run`` would run now, as soon as they land.

Every tick asks :func:`calpipe.pipeline.pending_range` (read only; landing files are stat-ed,
hashed only when their size or time changed) what the database lacks: days landed after the
last stored one, or stored days whose landing files changed (a corrected or late file), from
the earliest such day through the last landed one, since every later day's state follows from
it. It requests one run of the ``nightly`` job (``schedules.py``) over that range (a single-run
backfill, as the assets' backfill policy runs ranges), keyed by the range and the reason, so a
range is requested once. Days past the last partition (today's, until midnight) wait for it.
Stopped until turned on in the UI, like the schedule.

**The range metadata sensor**: dagster gives every partition of a single-run backfill the run's
one metadata (upstream dagster#18123). When a run over a partition range succeeds, this sensor
reports each day's own metadata (its row counts, method, state hash and the run) as the latest
materialization of each of its partitions (``report_range_days`` of ``../sync.py``). Running by
default (it only reports what the run wrote); it needs the daemon, which ``calpipe ui`` starts.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dagster import (
    DagsterEventType,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunStatusSensorContext,
    SensorEvaluationContext,
    SkipReason,
    run_status_sensor,
    sensor,
)
from dagster_duckdb import DuckDBResource

from calpipe import pipeline, storage
from calpipe.errors import StoreError

from ..sync import report_range_days
from . import schedules
from .partitions import RANGE_END_TAG, RANGE_START_TAG, daily
from .resources import CalpipeResource

#: The landing sensor's tick (dagster): every 5 minutes. Each tick stats the landing files (and
#: hashes changed ones); a night's files rarely need a faster reaction than that.
LANDING_SENSOR_SECONDS: int = 300


@sensor(
    job=schedules.nightly,
    name="landing_sensor",
    minimum_interval_seconds=LANDING_SENSOR_SECONDS,
    default_status=DefaultSensorStatus.STOPPED,
    description="Runs the days that landed (or changed) since the last run, through the "
    "last landed day.",
)
def landing_sensor(
    context: SensorEvaluationContext, duckdb: DuckDBResource, calpipe: CalpipeResource
):
    keys = daily.get_partition_keys()
    if not keys:
        return SkipReason("no partition yet")
    last_partition = dt.date.fromisoformat(keys[-1])
    if not Path(duckdb.database).exists():  # a first night: the database starts here
        storage.connect(duckdb.database, lock_wait=0).close()
    try:  # lock_wait=0: a run writing the database now is the next tick's business
        con = storage.connect(duckdb.database, read_only=True, lock_wait=0)
    except StoreError as exc:
        return SkipReason(f"database busy: {exc}")
    try:
        found = pipeline.pending_range(con, calpipe.source(), calpipe.label_feed())
    finally:
        con.close()
    if found is None:
        return SkipReason("up to date with the landing folder")
    start, end, why = found
    end = min(end, last_partition)
    if start > end:
        return SkipReason(f"{start} landed; its partition starts after midnight")
    context.log.info(f"{why}: requesting {start} .. {end}")
    return RunRequest(
        run_key=f"{start}..{end}: {why}",
        tags={RANGE_START_TAG: start.isoformat(), RANGE_END_TAG: end.isoformat()},
    )


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    name="range_metadata_sensor",
    default_status=DefaultSensorStatus.RUNNING,
    description="After a run over a partition range, reports each day's own metadata "
    "(dagster gives a range run's partitions the run's one metadata).",
)
def range_metadata_sensor(context: RunStatusSensorContext, duckdb: DuckDBResource):
    run = context.dagster_run
    start = run.tags.get(RANGE_START_TAG)
    end = run.tags.get(RANGE_END_TAG)
    if start is None or end is None or start == end:
        return SkipReason("not a range run: its partition has its own metadata")
    records = context.instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    done = {r.event_log_entry.dagster_event.asset_key.to_user_string() for r in records}
    # in lineage order, upstream first: reported alphabetically, scored_events came after
    # protected_scores, and the UI marked every day of the range "Unsynced"
    assets = [a for a in pipeline.ASSET_TABLES if a in done]
    if not assets:
        return SkipReason("the run materialized no calpipe table")
    n = report_range_days(
        context.instance, duckdb.database, dt.date.fromisoformat(start),
        dt.date.fromisoformat(end), run, assets,
    )  # fmt: skip
    context.log.info(f"run {run.run_id}: each of {n} day(s) got its own metadata")
    return SkipReason(f"reported the metadata of {n} day(s) of {', '.join(assets)}")
