"""Daily partitions on ``event_time`` (docs/ARCHITECTURE.md §5): the days of the data.

The partitions span the database and its sources (:func:`calpipe.pipeline.data_span`): from the
stored chain's first day (or, before the first run, the first landed day) through the last day
stored or landed. They are computed when the code location loads, so a day that ``calpipe run``
added or that landed appears once the definitions are reloaded (the UI's "Reload") or ``calpipe
ui`` restarts. Not the calendar: a three-day database has three partitions, not one per day up
to today; not a value frozen in ``calpipe_meta``. A database with no day and no landed file (a
new one, before anything landed) has no partition at all; land a day and reload.

A ``DailyPartitionsDefinition`` with its start and end computed at load is enough, and keeps
what the graph needs: dynamic partitions would follow the data without a reload, but lose the
time window the previous-day mapping of the state (:data:`PREVIOUS_DAY`), ranges (single-run
backfills) and the nightly schedule are built on.

Two variables override the data: ``CALPIPE_START_DATE`` (the first partition: the chain's
first day) and ``CALPIPE_END_DATE`` (the last one, or ``none`` for "up to yesterday" (UTC): a
nightly deployment whose schedule and landing sensor need tomorrow's partition to appear
without a reload). ``calpipe ui`` sets neither.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

from dagster import DailyPartitionsDefinition, TimeWindowPartitionMapping

from calpipe import pipeline, storage
from calpipe.errors import StoreError

from .resources import DB, CalpipeResource

#: The run tags of a run over a partition range (a single-run backfill): dagster's documented
#: tag names (its constants for them live in a private module, so they are spelled out here).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


#: How long loading the location waits for a database another process writes (s), before it
#: takes the span of the landed days alone (a ``calpipe run`` in progress holds it).
SPAN_LOCK_WAIT_SECONDS: float = 5.0

_log = logging.getLogger(__name__)


def _env_date(name: str) -> dt.date | str | None:
    """The date of the variable ``name``; "unset" when it is not set, None for ``none``."""
    value = os.environ.get(name)
    if value is None:
        return "unset"
    return None if value.lower() == "none" else dt.date.fromisoformat(value)


def span(db: Path) -> tuple[dt.date, dt.date] | None:
    """The days of ``db`` and its sources (:func:`calpipe.pipeline.data_span`). A source that
    cannot be read (a landing folder not created yet, a table not loaded yet) adds no day, and
    a database another process writes for longer than :data:`SPAN_LOCK_WAIT_SECONDS` none
    either (both logged as warnings: the next reload sees them)."""
    resource = CalpipeResource.from_env(db)
    try:
        source, labels = resource.source(), resource.label_feed()
    except StoreError as exc:
        if Path(resource.events).is_absolute() and not Path(resource.events).exists():
            pass  # a landing folder not created yet: no day landed, nothing to say
        else:
            _log.warning("partitions: the landed days are not counted: %s", exc)
        source = labels = None
    con = None
    if db.exists():
        try:
            con = storage.connect(db, read_only=True, lock_wait=SPAN_LOCK_WAIT_SECONDS)
        except StoreError as exc:
            _log.warning("partitions: the stored days are not counted: %s", exc)
    try:
        try:
            return pipeline.data_span(con, source, labels)
        except StoreError as exc:
            _log.warning("partitions: the landed days are not counted: %s", exc)
            return None if con is None else pipeline.data_span(con, None)
    finally:
        if con is not None:
            con.close()


def _daily() -> DailyPartitionsDefinition:
    first, last = _env_date("CALPIPE_START_DATE"), _env_date("CALPIPE_END_DATE")
    if first is None:
        raise ValueError("CALPIPE_START_DATE must be a date (the chain's first day), not none")
    if first == "unset" or last == "unset":
        found = span(DB)
        if found is None:  # no day anywhere: no partition (today's date, zero days)
            today = dt.datetime.now(dt.UTC).date()
            found = (today, today - dt.timedelta(days=1))
        first = found[0] if first == "unset" else first
        last = found[1] if last == "unset" else last
    end = None if last is None else (last + dt.timedelta(days=1)).isoformat()
    return DailyPartitionsDefinition(start_date=first.isoformat(), end_date=end)


#: One partition per day from the chain's first day through the last day of the data.
daily = _daily()

#: The first partition's day: the chain starts there from an empty state.
FIRST_DAY: dt.date = daily.start.date()

#: The state of day d is computed from the state of day d - 1 (and only that day).
PREVIOUS_DAY = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


def partition_range(context) -> tuple[dt.date, dt.date]:
    """The days [start, end] a run materializes: one partition, or a range (single-run backfill)."""
    keys = context.partition_key_range
    return dt.date.fromisoformat(keys.start), dt.date.fromisoformat(keys.end)
