"""The nightly job and its schedule: every night, yesterday's partition of every asset."""

from __future__ import annotations

from dagster import AssetSelection, build_schedule_from_partitioned_job, define_asset_job

from .assets import GROUP

#: The schedule fires at 01:30 UTC: late enough for yesterday's landing files (and labels) to
#: be complete, early enough for the monitoring tables to be ready in the morning.
NIGHTLY_HOUR, NIGHTLY_MINUTE = 1, 30


def build_nightly():
    """The ``nightly`` job (all calpipe assets) and its schedule (stopped until turned on)."""
    job = define_asset_job(
        "nightly",
        selection=AssetSelection.groups(GROUP),  # partitioning is inferred from the assets
        description="Load, protect, monitor and map one day (the schedule: yesterday).",
    )
    schedule = build_schedule_from_partitioned_job(
        job,
        name="nightly_schedule",
        hour_of_day=NIGHTLY_HOUR,
        minute_of_hour=NIGHTLY_MINUTE,
        description="Materializes yesterday's partition every night.",
    )
    return job, schedule
