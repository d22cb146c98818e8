"""calpipe/cli/pipeline.py: ``run``, ``sql``, ``report`` and ``ui`` at their edges.

Regression tests of the hardening issue (round 2), each named after what a user met: a run
that failed before its first day left a database file behind, ``--start`` after ``--end`` said
"up to date", foreign files gave CatalogException tracebacks, ``sql --csv`` of a list column a
polars traceback.
"""

from __future__ import annotations

import csv
import io
import json

import duckdb
import pytest

from calpipe import cli, generate, storage
from calpipe.generate import StreamSpec

STREAMS = (StreamSpec("a", events_per_day=20), StreamSpec("b", events_per_day=15))
START = generate.DEFAULT_START


@pytest.fixture
def landing(tmp_path):
    events = generate.generate(n_days=3, streams=STREAMS, seed=2)
    storage.write_landing(events, tmp_path / "landing")
    return tmp_path / "landing"


def _run(landing, db, *extra) -> int:
    return cli.main(["run", "--events", str(landing), "--db", str(db), "--no-progress", *extra])


def test_start_after_end_said_up_to_date_and_created_an_empty_database(tmp_path, landing, capsys):
    db = tmp_path / "db.duckdb"
    assert _run(landing, db, "--start", "2010-07-25", "--end", "2010-07-21") == 2
    err = capsys.readouterr().err
    assert "--start 2010-07-25 is after --end 2010-07-21" in err
    assert not db.exists()


def test_events_nope_created_the_database_before_failing(tmp_path, capsys):
    db = tmp_path / "db.duckdb"
    assert cli.main(["run", "--events", "nope", "--db", str(db), "--no-progress"]) == 2
    assert "nope" in capsys.readouterr().err
    assert not db.exists() and not db.with_name("db.duckdb.wal").exists()


def test_a_failed_first_run_left_an_empty_database_file(tmp_path, landing, capsys):
    bad = landing / f"date={START.isoformat()}" / "events.parquet"
    bad.write_bytes(b"not parquet")
    db = tmp_path / "db.duckdb"
    assert _run(landing, db) == 2
    assert "events.parquet" in capsys.readouterr().err
    assert not db.exists()


def test_a_failed_later_run_keeps_the_committed_days(tmp_path, landing, capsys):
    db = tmp_path / "db.duckdb"
    assert _run(landing, db, "--end", START.isoformat()) == 0
    with storage.connect(db, read_only=True) as con:
        before = storage.query(con, "SELECT * FROM protected_scores ORDER BY ALL")
    assert cli.main(["run", "--events", "nope", "--db", str(db), "--no-progress"]) == 2
    with storage.connect(db, read_only=True) as con:
        assert storage.query(con, "SELECT * FROM protected_scores ORDER BY ALL").equals(before)


def _foreign(path):
    raw = duckdb.connect(str(path))
    raw.execute("CREATE TABLE mine AS SELECT 1 AS x")
    raw.close()
    return path.read_bytes()


def test_report_of_a_foreign_file_was_a_catalog_exception_traceback(tmp_path, capsys):
    db = tmp_path / "foreign.duckdb"
    before = _foreign(db)
    assert cli.main(["report", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a calpipe database (no calpipe_meta table)" in err
    assert db.read_bytes() == before
    assert not db.with_name("foreign.report.html").exists()


def test_ui_dry_run_of_a_foreign_file_was_a_catalog_exception_traceback(tmp_path, capsys):
    db = tmp_path / "foreign.duckdb"
    before = _foreign(db)
    assert cli.main(["ui", "--db", str(db), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a calpipe database" in err
    assert db.read_bytes() == before


def test_report_of_a_schema_version_11a_was_an_int_traceback(tmp_path, landing, capsys):
    db = tmp_path / "db.duckdb"
    assert _run(landing, db) == 0
    with duckdb.connect(str(db)) as raw:
        raw.execute("UPDATE calpipe_meta SET value = '11a' WHERE key = 'schema_version'")
    capsys.readouterr()
    assert cli.main(["report", "--db", str(db)]) == 2
    assert "calpipe_meta.schema_version is '11a', not a whole number" in capsys.readouterr().err


def test_sql_csv_of_a_list_column_was_a_polars_traceback(tmp_path, landing, capsys):
    db = tmp_path / "db.duckdb"
    assert _run(landing, db) == 0
    capsys.readouterr()
    q = ("SELECT 1 AS i, [0.25, 0.75] AS p, {'a': 1, 'b': [2]} AS s, NULL::DOUBLE[] AS n, "
         "[DATE '2024-01-02'] AS d")  # fmt: skip
    assert cli.main(["sql", "--db", str(db), "--csv", q]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows == [
        {"i": "1", "p": "[0.25, 0.75]", "s": '{"a": 1, "b": [2]}', "n": "", "d": '["2024-01-02"]'}
    ]
    assert json.loads(rows[0]["p"]) == [0.25, 0.75]
