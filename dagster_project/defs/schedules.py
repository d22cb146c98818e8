"""The nightly job and its schedule: every night, yesterday's partition of every asset."""

from __future__ import annotations

from dagster import AssetSelection, build_schedule_from_partitioned_job, define_asset_job

from .assets import GROUP

#: The schedule fires at 01:30 UTC: late enough for yesterday's landing files (and labels) to
#: be complete, early enough for the monitoring tables to be ready in the morning.
NIGHTLY_HOUR, NIGHTLY_MINUTE = 1, 30

#: All calpipe assets (partitioning is inferred from them); the landing sensor runs it too.
nightly = define_asset_job(
    "nightly",
    selection=AssetSelection.groups(GROUP),
    description="Load, protect, monitor and map one day (the schedule: yesterday).",
)

#: Stopped until turned on in the UI.
nightly_schedule = build_schedule_from_partitioned_job(
    nightly,
    name="nightly_schedule",
    hour_of_day=NIGHTLY_HOUR,
    minute_of_hour=NIGHTLY_MINUTE,
    description="Materializes yesterday's partition every night.",
)
