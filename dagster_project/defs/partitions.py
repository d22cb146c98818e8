"""Daily partitions on ``event_time`` (docs/ARCHITECTURE.md §5), from the environment.

``CALPIPE_START_DATE`` is the chain's first day (its state starts empty; default: the demo's,
2008-06-09), ``CALPIPE_END_DATE`` the last partition, or ``none`` for "up to yesterday" (UTC:
the nightly setting, where today's partition appears once the day is over; default: the
demo's last day). Partitions are the shape of the asset graph, not run configuration, so they
are read when the code location loads (``calpipe ui`` sets both from the database's chain).
"""

from __future__ import annotations

import datetime as dt
import os

from dagster import DailyPartitionsDefinition, TimeWindowPartitionMapping

from calpipe import pipeline

#: The run tags of a run over a partition range (a single-run backfill): dagster's documented
#: tag names (its constants for them live in a private module, so they are spelled out here).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def _env_date(name: str, default: dt.date) -> dt.date | None:
    value = os.environ.get(name)
    if value is None:
        return default
    return None if value.lower() == "none" else dt.date.fromisoformat(value)


def _daily() -> DailyPartitionsDefinition:
    first = _env_date("CALPIPE_START_DATE", pipeline.DEMO_FIRST_DAY)
    if first is None:
        raise ValueError("CALPIPE_START_DATE must be a date (the chain's first day), not none")
    last = _env_date("CALPIPE_END_DATE", pipeline.DEMO_LAST_DAY)
    end = None if last is None else (last + dt.timedelta(days=1)).isoformat()
    return DailyPartitionsDefinition(start_date=first.isoformat(), end_date=end)


#: One partition per calendar day from the chain's first day through the last one.
daily = _daily()

#: The first partition's day: the chain starts there from an empty state.
FIRST_DAY: dt.date = daily.start.date()

#: The state of day d is computed from the state of day d - 1 (and only that day).
PREVIOUS_DAY = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


def partition_range(context) -> tuple[dt.date, dt.date]:
    """The days [start, end] a run materializes: one partition, or a range (single-run backfill)."""
    keys = context.partition_key_range
    return dt.date.fromisoformat(keys.start), dt.date.fromisoformat(keys.end)
