"""The landing sensor: run the days a ``calpipe run`` would run now, as soon as they land.

Every tick asks :func:`calpipe.pipeline.pending_range` (read only; landing files are stat-ed,
hashed only when their size or time changed) what the database lacks: days landed after the
last stored one, or stored days whose landing files changed (a corrected or late file), from
the earliest such day through the last landed one, since every later day's state follows from
it. It requests one run of the ``nightly`` job over that range (a single-run backfill, as the
assets' backfill policy runs ranges), keyed by the range and the reason, so a range is requested
once. Days past the last partition (today's, until midnight) wait for it. Stopped until turned
on in the UI, like the schedule.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)
from dagster_duckdb import DuckDBResource

from calpipe import config, pipeline, store
from calpipe.errors import StoreError

from .resources import CalpipeResource


def build_landing_sensor(job, partitions_def):
    """The sensor over ``job`` (the nightly job) and its daily ``partitions_def``."""

    @sensor(
        job=job,
        name="landing_sensor",
        minimum_interval_seconds=config.LANDING_SENSOR_SECONDS,
        default_status=DefaultSensorStatus.STOPPED,
        description="Runs the days that landed (or changed) since the last run, through the "
        "last landed day.",
    )
    def landing_sensor(
        context: SensorEvaluationContext, duckdb: DuckDBResource, calpipe: CalpipeResource
    ):
        keys = partitions_def.get_partition_keys()
        if not keys:
            return SkipReason("no partition yet")
        last_partition = dt.date.fromisoformat(keys[-1])
        if not Path(duckdb.database).exists():  # a first night: the database starts here
            store.connect(duckdb.database, lock_wait=0).close()
        try:  # lock_wait=0: a run writing the database now is the next tick's business
            con = store.connect(duckdb.database, read_only=True, lock_wait=0)
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
            tags={
                ASSET_PARTITION_RANGE_START_TAG: start.isoformat(),
                ASSET_PARTITION_RANGE_END_TAG: end.isoformat(),
            },
        )

    return landing_sensor
