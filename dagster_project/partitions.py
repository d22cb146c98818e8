"""Daily partitions on ``event_time`` (docs/ARCHITECTURE.md §5)."""

from __future__ import annotations

import datetime as dt

from dagster import DailyPartitionsDefinition


def daily_partitions(
    first_day: dt.date, last_day: dt.date | None = None
) -> DailyPartitionsDefinition:
    """One partition per calendar day from ``first_day`` (the chain's first day: its state starts
    empty) to ``last_day`` included, or, without ``last_day``, up to yesterday (UTC) — the nightly
    setting, where today's partition appears once the day is over."""
    end = None if last_day is None else (last_day + dt.timedelta(days=1)).isoformat()
    return DailyPartitionsDefinition(start_date=first_day.isoformat(), end_date=end)


def partition_range(context) -> tuple[dt.date, dt.date]:
    """The days [start, end] a run materializes: one partition, or a range (single-run backfill)."""
    keys = context.partition_key_range
    return dt.date.fromisoformat(keys.start), dt.date.fromisoformat(keys.end)


def first_day_of(partitions_def: DailyPartitionsDefinition) -> dt.date:
    """The first partition's day: the chain starts there from an empty state."""
    return partitions_def.start.date()
