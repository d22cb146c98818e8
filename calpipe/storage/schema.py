"""The SQL layer of a database: connect, install ``sql/`` (tables, migrations, views, macros) once
per version, meta.

Everything calpipe writes lives in one embedded DuckDB file (docs/ARCHITECTURE.md §5).
:func:`connect` opens it (waiting for another process that holds it,
:mod:`calpipe.storage.locks`) and installs the ``sql/`` files, in the order of
:data:`SQL_LAYOUT`, when the file's recorded hash or :data:`SCHEMA_VERSION` differ
(:func:`install_sql`); ``calpipe_meta`` keeps them, and what a chain was run with
(:func:`get_meta`, :func:`set_meta`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import duckdb

from calpipe.errors import StoreError
from calpipe.paths import SQL_DIR
from calpipe.storage import locks
from calpipe.storage.locks import open_waiting
from calpipe.storage.session import configure_session, db_name, fetch_one, rollback

_META_SQL_HASH = "sql_hash"


_META_SCHEMA = "schema_version"


#: Version of the tables' layout in ``sql/``; bump it with any change that alters a table, so an
#: older calpipe refuses a newer database instead of migrating it backwards. 1 = the databases
#: written before the version was recorded (they upgrade on the next read-write connection);
#: 3 = calibration_map's term inputs (in_w1, in_w2, in_w0, in_eps); 4 = calibrator_state and
#: calibration_map hold the rows of the streams that changed that day (pipeline_days.n_state_rows);
#: 5 = pipeline_inputs and pipeline_days.state_hash (corrected, late and stale days are replayed);
#: 6 = the label feed (event_labels, quarantined_labels, calibration_arrivals,
#: pipeline_days.n_label_arrivals); 7 = K-class forecasts (``scores``, ``base_scores``,
#: ``protected_scores`` lists; the binary columns nullable); 8 = every method's map in
#: ``calibration_map`` (``layer`` of a stack, step/linear tables: ``x``, ``y_at``, ``y_right``,
#: ``x_next``, ``y_next``); 9 = K-class maps (``alphas``, ``in_ka``, ``in_kb``); 10 = a K-class
#: category's forecast and a partition tree (``y_k``, ``kids``: the Venn taxonomies' tables,
#: ROC-isotonic's tree); 11 = a composite-experts input table (``in_layer``, negative ``layer``);
#: 12 = ``performance_estimates`` (issue #35; an older database's nights have none until re-run);
#: 13 = ``change_points`` and the detector's state in ``calibrator_state`` (migration 014; an
#: older database's detector starts at its next night).
SCHEMA_VERSION = 13

#: The parts of ``sql/`` in the order they are installed (the one place the order is stated):
#: part -> its files, a path or a glob relative to ``sql/`` (a glob's files in name order).
#: ``tables`` creates each table with the columns it had when it came; ``migrations`` are the
#: later changes of the tables' layout, one file a change (``NNN_[vVERSION_]what.sql``), each
#: idempotent (``IF NOT EXISTS``), applied to a new database as to an old one; the ``views``
#: read the columns the migrations add; the ``macros`` come last, split by concern, each file
#: using only the macros of the files before it.
SQL_LAYOUT: dict[str, str] = {
    "tables": "001_tables.sql",
    "migrations": "migrations/*.sql",
    "views": "002_views.sql",
    "macros": "macros/*.sql",
}

#: The parts that make the tables' layout (``calpipe.pipeline.tables.table_schemas``).
TABLE_PARTS = ("tables", "migrations")


def sql_files(sql_dir: Path = SQL_DIR, *, parts: Iterable[str] | None = None) -> list[Path]:
    """The ``.sql`` files of the SQL layer, in the order they are installed (:data:`SQL_LAYOUT`);
    ``parts``: only those parts' files (e.g. :data:`TABLE_PARTS`), still in that order."""
    wanted = list(SQL_LAYOUT) if parts is None else list(parts)
    unknown = set(wanted) - set(SQL_LAYOUT)
    if unknown:
        raise ValueError(
            f"unknown sql/ parts {sorted(unknown)}; expected some of {list(SQL_LAYOUT)}"
        )
    files = []
    for part, pattern in SQL_LAYOUT.items():
        if part not in wanted:
            continue
        found = sorted(sql_dir.glob(pattern))
        if not found:
            raise StoreError(
                f"no SQL files {pattern} in {sql_dir}; is calpipe installed from its repository?"
            )
        files += found
    return files


def _sql_hash(files: list[Path], sql_dir: Path = SQL_DIR) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(sql_dir).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


#: Objects a user made in a database (tables, views, macros, sequences, types): a file with any
#: of them and no ``calpipe_meta`` is not calpipe's (a file holding only a macro or a sequence
#: was adopted, the schema installed into it).
_USER_OBJECTS_SQL = """
SELECT (SELECT count(*) FROM duckdb_tables() WHERE NOT internal)
     + (SELECT count(*) FROM duckdb_views() WHERE NOT internal)
     + (SELECT count(*) FROM duckdb_functions() WHERE NOT internal
          AND function_type IN ('macro', 'table_macro'))
     + (SELECT count(*) FROM duckdb_sequences() WHERE NOT temporary)
     + (SELECT count(*) FROM duckdb_types() WHERE NOT internal)
"""


def schema_version(con: duckdb.DuckDBPyConnection, meta: dict[str, str]) -> int:
    """The schema version ``calpipe_meta`` records (1 when none is); StoreError naming the
    database and the value when it is not a whole number (a traceback of ``int()`` before)."""
    text = meta.get(_META_SCHEMA, "1")
    try:
        return int(text)
    except (TypeError, ValueError):
        raise StoreError(
            f"{db_name(con)}: calpipe_meta.schema_version is {text!r}, not a whole number; "
            "the meta table was altered outside calpipe (nothing was changed)"
        ) from None


def require_calpipe(con: duckdb.DuckDBPyConnection) -> None:
    """StoreError unless ``con``'s database is calpipe's (it has ``calpipe_meta`` with a schema
    version this calpipe reads): what a read-only command (``report``, ``ui``) checks before its
    queries, which failed with DuckDB's CatalogException traceback on a foreign file."""
    try:
        meta = dict(con.execute("SELECT key, value FROM calpipe_meta").fetchall())
    except duckdb.CatalogException:
        raise StoreError(
            f"{db_name(con)} is not a calpipe database (no calpipe_meta table); give the file "
            "calpipe run or calpipe demo wrote"
        ) from None
    version = schema_version(con, meta)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{db_name(con)} was written by a newer calpipe (schema version {version}; this "
            f"calpipe knows {SCHEMA_VERSION}): upgrade calpipe"
        )


def install_sql(con: duckdb.DuckDBPyConnection, *, force: bool = False) -> bool:
    """Install the tables, views and macros of ``sql/`` into ``con``'s database.

    The files run in the order of :data:`SQL_LAYOUT`, in one transaction. Every statement is
    idempotent (``CREATE TABLE IF NOT EXISTS``, ``CREATE OR REPLACE``, the migrations' ``ADD
    COLUMN IF NOT EXISTS``): applying them is the migration from any earlier version. The
    hash of the SQL files and :data:`SCHEMA_VERSION` are kept in ``calpipe_meta``, so a database
    that is up to date is left untouched (no write). Refused, with nothing changed: a database
    written by a newer calpipe (its schema version is higher), and a database that is not
    calpipe's (it has tables or views but no ``calpipe_meta``). Returns True if anything was
    (re)installed.
    """
    files = sql_files()
    digest = _sql_hash(files)
    try:
        meta = dict(con.execute("SELECT key, value FROM calpipe_meta").fetchall())
    except duckdb.CatalogException:
        meta = None
    if meta is None:
        others = fetch_one(
            con,
            _USER_OBJECTS_SQL,
        )[0]
        if others:
            raise StoreError(
                f"{db_name(con)} is not a calpipe database: it has {others} objects of its "
                "own (tables, views, macros, sequences, types) and no calpipe_meta; calpipe installs its schema only into a new file or "
                "its own databases (nothing was changed)"
            )
    else:
        version = schema_version(con, meta)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{db_name(con)} was written by a newer calpipe (schema version {version}; "
                f"this calpipe knows {SCHEMA_VERSION}): upgrade calpipe (nothing was changed)"
            )
        if not force and version == SCHEMA_VERSION and meta.get(_META_SQL_HASH) == digest:
            return False
    con.begin()
    try:
        for f in files:
            con.execute(f.read_text())
        _set_meta(con, _META_SQL_HASH, digest)
        _set_meta(con, _META_SCHEMA, str(SCHEMA_VERSION))
        con.commit()
    except BaseException:
        rollback(con)
        raise
    return True


def connect(
    path: str | Path, *, read_only: bool = False, lock_wait: float | None = None
) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) a calpipe DuckDB file and install the SQL layer.

    ``path`` is made absolute; its folder is created. A read-only connection does not install
    anything (the file must have been opened read-write by calpipe before). A read-write
    connection's DuckDB memory limit is :data:`calpipe.storage.session.DUCKDB_MEMORY_LIMIT` (``SET
    memory_limit`` changes it). When another process holds the file's lock (a writer, or a
    read-only connection when this one writes), the connection is retried with backoff for
    ``lock_wait`` seconds (default :data:`calpipe.storage.locks.LOCK_WAIT_SECONDS`), then refused with
    a :class:`StoreError` naming that process.
    """
    p = Path(path).expanduser().resolve()
    if read_only and not p.exists():
        raise StoreError(f"database {p} does not exist")
    if not read_only:
        p.parent.mkdir(parents=True, exist_ok=True)
    con = open_waiting(p, read_only, locks.LOCK_WAIT_SECONDS if lock_wait is None else lock_wait)
    configure_session(con)
    if not read_only:
        install_sql(con)
    return con


def _set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute("DELETE FROM calpipe_meta WHERE key = ?", [key])
    con.execute("INSERT INTO calpipe_meta VALUES (?, ?)", [key, value])


def get_meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    """A value of ``calpipe_meta`` (None if unset)."""
    row = fetch_one(con, "SELECT value FROM calpipe_meta WHERE key = ?", [key])
    return None if row is None else row[0]


def set_meta(con: duckdb.DuckDBPyConnection, **values: str) -> None:
    """Set values of ``calpipe_meta``, key = value, all in one transaction of their own."""
    con.begin()
    try:
        for key, value in values.items():
            _set_meta(con, key, value)
        con.commit()
    except BaseException:
        rollback(con)
        raise
