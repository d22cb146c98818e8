"""Transactions of whole days: how the nightly run (:func:`calpipe.pipeline.nightly.run_range`)
replaces partitions day by day, in transactions of whole consecutive days each sized by
:func:`transaction_end` (:data:`TRANSACTION_ROWS` events), so that a crash leaves whole days and
memory is bounded by a day, not by the range; :func:`before_read` is what a transaction does
before it reads its next day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from calpipe import storage

#: A pipeline transaction spans whole days up to about this many events (at least one day):
#: measured, a transaction's peak RSS grows ~350 bytes per event it holds (DuckDB's uncommitted
#: rows and the small tables' buffers), so 20k-event days share 5-day transactions (+24 % over a
#: day's peak instead of +75 % for a 30-day one) and 1M-event days commit one by one.
TRANSACTION_ROWS: int = 100_000


#: At most this many days per transaction of a run over a range (fewer for big days, see
#: TRANSACTION_ROWS); a month keeps a backfill's commits few while a transaction's small tables
#: (state, monitoring, map: streams x days rows) stay small in memory.
CHUNK_DAYS: int = 31


#: Tables that reading a day consults for the days before it (the history duplicate check, the
#: label feed's lookup of its events, their forecasts and earlier labels): their rows of the
#: transaction's earlier days are sent to DuckDB before the next day is read (the writer
#: buffers rows across days).
READ_BACK = ("scored_events", "event_labels", "protected_scores")


def transaction_end(d: dt.date, end: dt.date, height: int) -> dt.date:
    """The last day of the transaction that starts at day ``d`` (of a run through ``end``)
    whose first day has ``height`` events: as many days as fit in :data:`TRANSACTION_ROWS`
    events at that size, at least one and at most :data:`CHUNK_DAYS`. DuckDB keeps a
    transaction's new rows in memory until the commit, so a month of a big backfill in one
    transaction would hold a month, while small days still share a few commits.

    >>> transaction_end(dt.date(2024, 1, 1), dt.date(2024, 12, 31), 40_000)
    datetime.date(2024, 1, 2)
    """
    fit = TRANSACTION_ROWS // max(height, 1)  # days of the first day's size
    return min(end, d + dt.timedelta(days=min(max(fit, 1), CHUNK_DAYS) - 1))


def before_read(writer: storage.PartitionWriter, tables: Sequence[str]) -> None:
    """Before a transaction reads its next day: send DuckDB the rows of :data:`READ_BACK` that
    the writer buffers (the day's reads see the transaction's earlier days), and wait until the
    connection is free (the INSERTs sent so far done)."""
    for t in READ_BACK:
        if t in tables:
            writer.flush(t)
    writer.wait()
