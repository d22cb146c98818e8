"""The type of event id a database stores: BIGINT (integer ids) or VARCHAR (strings, UUIDs).

The DDL creates the id columns as BIGINT; the first events stored with string ids switch an
empty database's id columns to VARCHAR (:func:`ensure_id_type`). A database keeps one type: the
replay order (event_time, event_id) of equal times differs between 9 < 10 and "10" < "9", so a
source with the other type is an error naming both, never a silent cast.
"""

from __future__ import annotations

import duckdb
import polars as pl

from calpipe import storage
from calpipe.storage import EventSource

#: Every stored column holding an event id. A database stores one type of id, BIGINT (integer
#: ids, the DDL's) or VARCHAR (string or UUID ids): set by the first events stored
#: (:func:`ensure_id_type`), because the replay order (event_time, event_id) of equal times
#: differs between 9 < 10 and "10" < "9".
ID_COLUMNS = {
    "scored_events": "event_id",
    "protected_scores": "event_id",
    "martingale_alarms": "event_id",
    "change_points": "detected_event_id",
    "event_labels": "event_id",
    "quarantined_labels": "event_id",
    "calibrator_state": "last_event_id",
}


def stored_id_type(con) -> pl.DataType:
    """The event id type this database stores: ``pl.Int64`` (BIGINT) or ``pl.String``."""
    row = storage.fetch_one(
        con,
        "SELECT data_type FROM duckdb_columns() WHERE table_name = 'scored_events' AND "
        "column_name = 'event_id' AND database_name = current_database() AND "
        "schema_name = current_schema()",
    )
    return pl.String if row is not None and row[0] == "VARCHAR" else pl.Int64


def ensure_id_type(con, ids: pl.DataType, source: EventSource) -> pl.DataType:
    """The stored id type for a source whose ids are ``ids``: the database's, after switching an
    empty database's id columns to VARCHAR for string ids. StoreError naming both types if the
    database already holds events with the other type (nothing is changed). Call it with the
    connection free (no INSERT pending); inside an open transaction the switch is part of it."""
    want = pl.Int64 if ids.is_integer() else pl.String
    have = stored_id_type(con)
    if want == have:
        return have
    sql = {pl.Int64: "BIGINT (integers)", pl.String: "VARCHAR (strings)"}
    mismatch = storage.StoreError(
        f"{source.describe()}: its event ids are {sql[want]}, but this database stores "
        f"{sql[have]} event ids; one database stores one type of id (their order breaks "
        "ties in event_time): use a new database, or convert the ids"
    )
    used = storage.fetch_one(
        con,
        "SELECT (SELECT count(*) FROM scored_events) + (SELECT count(*) FROM calibrator_state)",
    )
    if used is not None and used[0]:
        raise mismatch
    try:
        for table, col in ID_COLUMNS.items():
            to = "VARCHAR" if want == pl.String else "BIGINT"
            con.execute(f"ALTER TABLE {table} ALTER {col} TYPE {to}")
    except duckdb.ConversionException:  # rows deleted by the open transaction still hold ids
        raise mismatch from None
    return want
