"""Transactions of whole days: how the nightly run replaces partitions.

:func:`write_days` replaces the partitions of a range day by day
in transactions of whole consecutive days, sized by :data:`TRANSACTION_ROWS`
events, so that a crash leaves whole days and memory is bounded by a day, not by the range.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import polars as pl

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

_NO_DAY = pl.DataFrame()

#: Tables that reading a day consults for the days before it (the history duplicate check, the
#: label feed's lookup of its events, their forecasts and earlier labels): their rows of the
#: transaction's earlier days are sent to DuckDB before the next day is read (the writer
#: buffers rows across days).
READ_BACK = ("scored_events", "event_labels", "protected_scores")


def write_days(
    con,
    start: dt.date,
    end: dt.date,
    tables: Sequence[str],
    read: Callable[[dt.date], Any],
    write: Callable[[storage.PartitionWriter, dt.date, Any], None],
    *,
    background: bool = False,
    finish: Callable[[storage.PartitionWriter, dt.date, dt.date], None] | None = None,
    span: Callable[[storage.PartitionWriter, dt.date, dt.date, Any], bool] | None = None,
) -> dict[str, int]:
    """Replace the partitions of ``tables`` day by day over [start, end], in transactions of whole
    consecutive days; returns the rows written per table.

    Day d's input is ``read(d)`` (a frame, or anything with its number of rows as ``height``)
    and ``write(writer, d, input)`` writes its rows; ``finish`` is
    called at the end of each transaction with its days. A transaction starts at a day whose
    input is read first, and spans as many days as fit in :data:`TRANSACTION_ROWS`
    rows at that day's size (at least one day, at most :data:`CHUNK_DAYS`):
    DuckDB keeps a transaction's new rows in memory until the commit, so a month of a big
    backfill in one transaction would hold a month, while small days still share a few commits.
    Every day's partitions of every table are replaced in one transaction (a crash leaves whole
    days).

    ``span(writer, d, e, input of d)``, if given, may write a transaction of several days at
    once (returning True); when it returns False (having written nothing) the days run one by
    one."""
    rows = dict.fromkeys(tables, 0)
    d = start
    while d <= end:
        data = read(d)
        fit = TRANSACTION_ROWS // max(data.height, 1)  # days of the first day's size
        e = min(end, d + dt.timedelta(days=min(max(fit, 1), CHUNK_DAYS) - 1))
        with storage.replacing_partitions(con, d, e, tables, background=background) as writer:
            spanned = span is not None and e > d and span(writer, d, e, data)
            for day in [] if spanned else storage.iter_days(d, e):
                if day != d:
                    # the day's reads see the earlier days of this transaction, and the
                    # connection is free once the INSERTs sent so far are done
                    for t in READ_BACK:
                        if t in tables:
                            writer.flush(t)
                    writer.wait()
                    data = read(day)
                write(writer, day, data)
                data = _NO_DAY  # free the day before reading the next one
            if finish is not None:
                finish(writer, d, e)
        for table, n in writer.rows.items():
            rows[table] += n
        storage.drop_block_cache(con)  # the days just committed are not read again
        d = e + dt.timedelta(days=1)
    return rows
