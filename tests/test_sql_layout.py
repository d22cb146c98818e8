"""The layout of ``sql/`` (issue #32): the tables, numbered migrations, the views and the macros
split by concern, installed in the order of :data:`calpipe.storage.SQL_LAYOUT`.

A database the layout makes must equal one made by the three single files it was split from
(``001_tables.sql`` with its 46 ``ALTER TABLE`` inline, ``002_views.sql``, ``003_macros.sql``):
the same tables, columns (names, types, defaults, nullability, order), constraints, views and
macros, for a new database and for one created by an older calpipe and upgraded; but for the
macros changed or added since the split (:data:`CHANGED_SINCE_SPLIT`, :data:`ADDED_SINCE_SPLIT`:
listed with the reason, and each checked to differ) and the tables and views added since
(:data:`RELATIONS_ADDED_SINCE_SPLIT`, each checked to exist). Those files
are frozen under ``tests/data/sql_history/`` (gzipped copies of ``sql/`` at a commit, named
``v<schema version>-<commit>``; see its README): a clone without history (CI) has them too.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import duckdb
import pytest

from calpipe import paths, storage
from calpipe.pipeline.tables import table_schemas

HISTORY = Path(__file__).parent / "data" / "sql_history"
#: The single files the layout was split from (schema version 11, commit cc11af2).
SINGLE_FILES = HISTORY / "v11-cc11af2"
#: Tables and views of older schema versions: a database is created with them, then upgraded.
#: v1: before any migration (protected_scores with the copied inputs, no Venn interval);
#: v3: before n_state_rows; v6: the label feed, before K classes; v10: before kids.
OLDER = ["v1-a2c70a3", "v3-9e7ea28", "v6-42bae29", "v10-e8a5aaf", "v11-cc11af2"]


def _frozen(layout: Path) -> list[str]:
    """The frozen ``.sql`` files of a layout, in their (file-name) install order."""
    return [gzip.decompress(f.read_bytes()).decode() for f in sorted(layout.glob("*.sql.gz"))]


def _run(con: duckdb.DuckDBPyConnection, texts: list[str]) -> None:
    """Run SQL files in one transaction, as ``install_sql`` did before the split."""
    con.begin()
    for text in texts:
        con.execute(text)
    con.commit()


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    """A catalog function's rows without what names the database or counts creation order
    (``*_oid``, ``database_name``), sorted."""
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    keep = [i for i, n in enumerate(names) if not n.endswith("_oid") and n != "database_name"]
    rows = [{names[i]: row[i] for i in keep} for row in cur.fetchall()]
    return sorted(rows, key=repr)


def _catalog(con: duckdb.DuckDBPyConnection) -> dict[str, list[dict]]:
    """Everything the SQL layer makes in a database, and the rows of its tables but
    ``calpipe_meta`` (whose ``sql_hash`` names the files that made it)."""
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT internal ORDER BY table_name"
    ).fetchall()]  # fmt: skip
    out = {
        "tables": _rows(con, "SELECT * EXCLUDE (estimated_size) FROM duckdb_tables() "
                             "WHERE NOT internal"),
        "columns": _rows(con, "SELECT * FROM duckdb_columns() WHERE NOT internal"),
        "constraints": _rows(con, "SELECT * FROM duckdb_constraints() WHERE schema_name = 'main'"),
        "views": _rows(con, "SELECT * FROM duckdb_views() WHERE NOT internal"),
        "macros": _rows(con, "SELECT * FROM duckdb_functions() WHERE NOT internal"),
    }  # fmt: skip
    for t in tables:
        if t != "calpipe_meta":
            out[f"rows of {t}"] = _rows(con, f'SELECT * FROM "{t}"')
    return out


#: The macros changed since the split (name: why), and those added since: the layout equals the
#: single files but for these, and each listed one must differ from (or be absent in) them, so
#: that the list cannot outlive its changes. A macro change adds its name here.
CHANGED_SINCE_SPLIT = {
    "calpipe_kscores": "#36 item 16: a bad vector's message shows at most 8 of its values",
    "calpipe_points_layer": "#33: a term layer evaluated compiled (calpipe_term_layers), 20x faster",
    "calpipe_kpoints_layer": "#33: a K-class term layer evaluated compiled (calpipe_kterm_layers)",
    "calibrate_table_as_of": "#33: compiles the term layers once (calpipe_points_layer's terms)",
    "calibrate_scores_table_as_of": "#33: compiles the K-class term layers once, for both layers",
    "calpipe_kinput": "#34: a matrix scaling input (oms: ka the K^2 entries of W)",
    "calibrate_score_as_of": "#33: each layer's input tables at its input (a stack's top's)",
}
ADDED_SINCE_SPLIT = {
    "calpipe_kshow": "#36 item 16: a score vector as an error message shows it",
    "calpipe_term_layers": "#33: the set form's term layers as lists (no join per term)",
    "calpipe_term_inputs": "#33: a compiled term layer's input maps, once per score",
    "calpipe_term_ratios": "#33: a compiled term layer's Cox powers, once per (input, beta)",
    "calpipe_terms_value": "#33: a compiled term layer's value, the terms as list arithmetic",
    "calpipe_kterm_layers": "#33: the K-class set form's term layers as lists",
    "calpipe_kterm_inputs": "#33: a compiled K-class term layer's input maps, once per vector",
    "calpipe_kterm_powers": "#33: a compiled K-class term layer's q_c^beta, once per group",
    "calpipe_kterm_scales": "#33: a compiled K-class Cox term's weight over its normaliser",
    "calpipe_kterms_value": "#33: a compiled K-class term layer's vector, by dot products",
    "calpipe_in_tables": "#33: a layer's input tables at its input (a stack's top: the base's)",
    "calpipe_in_table_values": "#33: the set form's input tables by an ASOF join, once a layer",
}


#: The tables and views added since the split (name: why): the layout makes them besides the
#: single files' catalog, which is compared without them; each must exist.
RELATIONS_ADDED_SINCE_SPLIT = {
    "performance_estimates": "#35: performance estimated from the forecasts (schema version 12)",
    "v_performance_estimates": "#35: the estimates beside the performance realized on labels",
    "change_points": "#35: change points after the first alarm (schema version 13)",
    "v_change_points": "#35: the change points, how long each took to detect",
}


#: The columns added since the split to a table of the single files ((table, column): why): the
#: catalog and the rows are compared without them; each must exist.
COLUMNS_ADDED_SINCE_SPLIT = {
    ("calibrator_state", c): "#35: the change detector's state (schema version 13, migration 014)"
    for c in ("change_log10_cusum", "change_run_start", "change_run_labels", "change_count",
              "change_settle_labels", "change_reference_date", "change_reference")
}  # fmt: skip


def _without_added(new: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """``new``'s catalog without :data:`RELATIONS_ADDED_SINCE_SPLIT` and
    :data:`COLUMNS_ADDED_SINCE_SPLIT`, which it must hold."""
    have = {(r["table_name"], r["column_name"]) for r in new["columns"]}
    assert have >= COLUMNS_ADDED_SINCE_SPLIT.keys(), COLUMNS_ADDED_SINCE_SPLIT.keys() - have
    new = dict(new)
    added: dict[str, set[str]] = {}
    for t, c in COLUMNS_ADDED_SINCE_SPLIT:
        added.setdefault(t, set()).add(c)
    new["columns"] = [r for r in new["columns"]
                      if (r["table_name"], r["column_name"]) not in COLUMNS_ADDED_SINCE_SPLIT]  # fmt: skip

    def strip(r: dict) -> dict:  # the table's row as it was without the added columns
        cols = added.get(r["table_name"], set())
        if not cols:
            return r
        sql = r["sql"]
        for c in cols:
            sql = re.sub(rf", \"?{c}\"? [A-Z]+(\[\])?", "", sql)
        return {**r, "column_count": r["column_count"] - len(cols), "sql": sql}

    new["tables"] = [strip(r) for r in new["tables"]]
    for t, cols in added.items():
        key = f"rows of {t}"
        if key in new:
            new[key] = [{k: v for k, v in row.items() if k not in cols} for row in new[key]]
    names = {r.get("table_name") or r.get("view_name") for k in ("tables", "views") for r in new[k]}
    assert names >= RELATIONS_ADDED_SINCE_SPLIT.keys(), RELATIONS_ADDED_SINCE_SPLIT.keys() - names
    out = {
        k: v
        for k, v in new.items()
        if k.removeprefix("rows of ") not in RELATIONS_ADDED_SINCE_SPLIT
    }
    for what in ("tables", "columns", "constraints", "views"):
        out[what] = [r for r in new[what] if r.get("table_name", r.get("view_name"))
                     not in RELATIONS_ADDED_SINCE_SPLIT]  # fmt: skip
    return out


def _unnumbered(constraints: list[dict]) -> list[dict]:
    """Constraints without ``constraint_index``: DuckDB numbers them across tables in name
    order, so a table added since the split (performance_estimates) renumbers those after it."""
    return sorted(({k: v for k, v in c.items() if k != "constraint_index"} for c in constraints),
                  key=repr)  # fmt: skip


def _assert_same(old: dict[str, list[dict]], new: dict[str, list[dict]]) -> None:
    new = _without_added(new)
    assert old.keys() == new.keys()
    old["constraints"], new["constraints"] = (
        _unnumbered(old["constraints"]),
        _unnumbered(new["constraints"]),
    )
    since = CHANGED_SINCE_SPLIT.keys() | ADDED_SINCE_SPLIT.keys()
    for what in old:
        if what == "macros":  # (the macros changed or added since the split: compared apart)
            assert {m["function_name"] for m in new[what]} >= since
            old[what], new[what] = (
                [m for m in rows if m["function_name"] not in since]
                for rows in (old[what], new[what])
            )
        assert new[what] == old[what], what


#: A value of each column type the older layouts have, varied by the column's position (so that
#: a migration that copies one column into another is seen).
_VALUES = {
    "DATE": lambda i: f"DATE '2024-03-01' + {i}",
    "TIMESTAMP": lambda i: f"TIMESTAMP '2024-03-01 00:00:00' + INTERVAL {i} MINUTE",
    "VARCHAR": lambda i: f"'text {i}'",
    "INTEGER": lambda i: str(i + 1),
    "BIGINT": lambda i: str(100 + i),
    "DOUBLE": lambda i: str((i + 1) / 64),
    "BOOLEAN": lambda i: "true" if i % 2 else "false",
    "DOUBLE[]": lambda i: f"[{(i + 1) / 64}, {1 - (i + 1) / 64}]",
    "BIGINT[]": lambda i: f"[{i}, 1]",
    "TIMESTAMP[]": lambda i: f"[TIMESTAMP '2024-03-02 00:00:00' + INTERVAL {i} MINUTE]",
}


def _older_database(layout: str) -> duckdb.DuckDBPyConnection:
    """An in-memory database as the calpipe of ``layout`` left it: its tables and views (and
    macros, where frozen), one row in each table, and its calpipe_meta."""
    con = duckdb.connect()
    _run(con, _frozen(HISTORY / layout))
    columns = con.execute(
        "SELECT table_name, list(data_type ORDER BY column_index) FROM duckdb_columns() "
        "WHERE table_name IN (SELECT table_name FROM duckdb_tables() WHERE NOT internal) "
        "AND table_name <> 'calpipe_meta' GROUP BY table_name"
    ).fetchall()
    for table, types in columns:
        values = ", ".join(_VALUES[t](i) for i, t in enumerate(types))
        con.execute(f'INSERT INTO "{table}" VALUES ({values})')
    version = int(layout.split("-")[0][1:])
    con.execute("INSERT INTO calpipe_meta VALUES ('sql_hash', 'older')")
    if version > 1:  # version 1: the databases written before it was recorded
        con.execute("INSERT INTO calpipe_meta VALUES ('schema_version', ?)", [str(version)])
    return con


def test_the_install_order_is_tables_migrations_views_macros():
    files = [f.relative_to(paths.SQL_DIR).as_posix() for f in storage.sql_files()]
    migrations = sorted(f.name for f in (paths.SQL_DIR / "migrations").glob("*.sql"))
    macros = sorted(f.name for f in (paths.SQL_DIR / "macros").glob("*.sql"))
    assert files == [
        "001_tables.sql",
        *(f"migrations/{m}" for m in migrations),
        "002_views.sql",
        *(f"macros/{m}" for m in macros),
    ]
    # every .sql file of sql/ is installed, once
    on_disk = sorted(f.relative_to(paths.SQL_DIR).as_posix() for f in paths.SQL_DIR.rglob("*.sql"))
    assert sorted(files) == on_disk
    assert [f.name for f in storage.sql_files(parts=storage.TABLE_PARTS)] == [
        "001_tables.sql",
        *migrations,
    ]
    with pytest.raises(ValueError, match="unknown sql/ parts"):
        storage.sql_files(parts=["tables", "indexes"])


def test_a_missing_part_of_the_layout_is_refused(tmp_path):
    (tmp_path / "001_tables.sql").write_text("SELECT 1;")
    (tmp_path / "002_views.sql").write_text("SELECT 1;")
    with pytest.raises(storage.StoreError, match=r"no SQL files migrations/\*\.sql in"):
        storage.sql_files(tmp_path)


def test_the_migrations_are_numbered_idempotent_and_say_why():
    """One file a change, ``NNN_[vVERSION_]what.sql`` numbered 001, 002, ... in the order they
    apply, headed by a comment that names it; only ``ALTER TABLE`` / ``UPDATE`` statements that
    are no-ops the second time; the tables' file holds none (it only creates)."""
    files = sorted((paths.SQL_DIR / "migrations").glob("*.sql"))
    assert len(files) == 14
    for n, f in enumerate(files, 1):
        m = re.fullmatch(r"(\d{3})_(?:v(\d+)_)?[a-z0-9_]+\.sql", f.name)
        assert m and int(m[1]) == n, f.name
        assert m[2] is None or int(m[2]) <= storage.SCHEMA_VERSION, f.name
        text = f.read_text()
        assert text.startswith(f"-- Migration {n:03d}"), f.name
        if m[2] is not None:
            assert f"schema version {m[2]}" in text.split("\n", 1)[0], f.name
        code = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
        for statement in filter(None, (s.strip() for s in code.split(";"))):
            assert re.fullmatch(
                r"ALTER TABLE \w+ (ADD COLUMN IF NOT EXISTS \w+ .+|DROP COLUMN IF EXISTS \w+"
                r"|ALTER \w+ DROP NOT NULL)"
                r"|UPDATE \w+ SET (\w+) = \w+ WHERE \2 IS NULL",
                statement,
            ), f"{f.name}: {statement}"
    tables = (paths.SQL_DIR / "001_tables.sql").read_text()
    assert not re.search(r"^\s*(ALTER|UPDATE|DROP)\b", tables, re.MULTILINE | re.IGNORECASE)


def _macros(texts: list[str]) -> dict[str, str]:
    """Each ``CREATE OR REPLACE MACRO`` statement of the texts by its macro's name."""
    found = [
        (m[1], m[0])
        for text in texts
        for m in re.finditer(r"^CREATE OR REPLACE MACRO (\w+)\(.*?;$", text, re.S | re.M)
    ]
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), "a macro defined twice"
    return dict(found)


def test_the_macros_are_the_single_file_s_text_for_text():
    """But for the macros changed or added since the split, each of which does differ."""
    new = _macros([f.read_text() for f in storage.sql_files(parts=["macros"])])
    old = _macros(_frozen(SINGLE_FILES))
    assert len(old) == 53
    for name in CHANGED_SINCE_SPLIT:
        assert new.pop(name) != old.pop(name), f"{name} is listed as changed but is not"
    for name in ADDED_SINCE_SPLIT:
        assert name not in old and name in new, f"{name} is listed as added but is not"
        new.pop(name)
    assert new == old


def test_duckdb_refuses_a_macro_that_uses_one_not_yet_defined():
    """What makes the macros' file order checked by every install: DuckDB binds a macro's
    functions when it is created (so each file may use only the macros before it)."""
    con = duckdb.connect()
    with pytest.raises(duckdb.CatalogException, match="calpipe_not_yet"):
        con.execute("CREATE MACRO calpipe_uses(x) AS calpipe_not_yet(x) + 1")
    con.close()


def test_a_new_database_equals_one_made_by_the_single_files():
    old = duckdb.connect()
    _run(old, _frozen(SINGLE_FILES))
    new = duckdb.connect()
    assert storage.install_sql(new) is True
    try:
        _assert_same(_catalog(old), _catalog(new))
        assert len(_catalog(new)["macros"]) == 53 + len(ADDED_SINCE_SPLIT)
    finally:
        old.close()
        new.close()


@pytest.mark.parametrize("layout", OLDER)
def test_an_older_database_upgrades_as_with_the_single_files(layout):
    """A database of an older calpipe, with a row in each table, upgraded by the layout and by
    the single files: the same catalog and the same rows (the migrations' UPDATEs included)."""
    old, new = _older_database(layout), _older_database(layout)
    try:
        before = _catalog(new)
        _run(old, _frozen(SINGLE_FILES))
        assert storage.install_sql(new) is True
        upgraded = _catalog(new)
        _assert_same(_catalog(old), upgraded)
        assert storage.install_sql(new) is False  # up to date: nothing more to do
        if layout != "v11-cc11af2":
            assert upgraded["columns"] != before["columns"]  # the migrations did something
        assert storage.get_meta(new, "schema_version") == str(storage.SCHEMA_VERSION)
    finally:
        old.close()
        new.close()


def test_table_schemas_hold_the_columns_the_migrations_add():
    """What the code location shows: every table's columns, those of the migrations included
    (the tables' file alone lacks e.g. pipeline_days.state_hash and calibration_map.in_layer)."""
    con = duckdb.connect()
    _run(con, _frozen(SINGLE_FILES)[:1])  # what table_schemas ran before: 001_tables.sql
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE NOT internal ORDER BY table_name, column_index"
    ).fetchall()
    con.close()
    expected: dict[str, list[tuple[str, str]]] = {}
    for table, column, dtype in rows:
        expected.setdefault(table, []).append((column, dtype))
    schemas = {
        t: tuple(x for x in c if (t, x[0]) not in COLUMNS_ADDED_SINCE_SPLIT)
        for t, c in table_schemas().items()
        if t not in RELATIONS_ADDED_SINCE_SPLIT
    }
    assert schemas == {t: tuple(cols) for t, cols in expected.items()}
    assert ("change_reference", "DOUBLE[]") in table_schemas()["calibrator_state"]
    assert table_schemas()["performance_estimates"][:3] == (
        ("date", "DATE"), ("stream", "VARCHAR"), ("events", "BIGINT")
    )  # fmt: skip
    assert ("in_layer", "INTEGER") in table_schemas()["calibration_map"]
    assert ("state_hash", "VARCHAR") in table_schemas()["pipeline_days"]
