"""calpipe.storage: the SQL layer, transactional partition replace, event sources."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap

import duckdb
import numpy as np
import polars as pl
import pytest

from calpipe import cli, storage
from calpipe.errors import InputError
from calpipe.storage.session import DUCKDB_MEMORY_LIMIT

D1, D2, D3 = dt.date(2024, 3, 1), dt.date(2024, 3, 2), dt.date(2024, 3, 3)


def events_of(day: dt.date, n: int, *, stream: str = "s", score: float = 0.25) -> pl.DataFrame:
    """``n`` scored_events rows of one day (the table's columns)."""
    t0 = dt.datetime.combine(day, dt.time(0))
    return pl.DataFrame(
        {
            "event_date": [day] * n,
            "stream": [stream] * n,
            "event_id": list(range(1, n + 1)),
            "event_time": [t0 + dt.timedelta(seconds=i) for i in range(n)],
            "score": [score] * n,
            "label": [i % 2 for i in range(n)],
        },
        schema_overrides={"label": pl.Int32},
    )


@pytest.fixture
def con(tmp_path):
    c = storage.connect(tmp_path / "db.duckdb")
    yield c
    c.close()


def table_rows(con, table: str) -> pl.DataFrame:
    """A table's rows; without the K-class vector columns, NULL in these binary rows."""
    rows = storage.query(con, f"SELECT * FROM {table} ORDER BY ALL")
    vectors = [c for c in ("scores", "base_scores", "protected_scores") if c in rows.columns]
    assert all(rows[c].null_count() == rows.height for c in vectors)
    return rows.drop(vectors)


# ----------------------------------------------------------------------------------------------
# SQL layer
# ----------------------------------------------------------------------------------------------
def test_connect_installs_tables_views_and_macros(con):
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert set(storage.PARTITION_COLUMN) <= tables
    views = {
        r[0]
        for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    }
    assert {
        "v_protected_scores",
        "v_calibration_daily",
        "v_alarms",
        "v_latest_calibration_map",
    } <= views
    macros = {r[0] for r in con.execute("SELECT function_name FROM duckdb_functions()").fetchall()}
    assert {
        "calibrate_score",
        "calibrate_score_as_of",
        "calibrate_table",
        "calibrate_table_as_of",
        "calibrate_scores",
        "calibrate_scores_table",
        "calibrate_scores_table_as_of",
        "calpipe_term",
        "calibration_curve",
    } <= macros


def test_install_is_skipped_when_up_to_date_and_redone_when_forced(con):
    assert storage.install_sql(con) is False
    assert storage.install_sql(con, force=True) is True
    assert storage.get_meta(con, "sql_hash") is not None


def test_sql_layer_persists_for_read_only_connections(tmp_path):
    path = tmp_path / "db.duckdb"
    storage.connect(path).close()
    ro = storage.connect(path, read_only=True)
    try:
        assert ro.execute("SELECT calpipe_clip(1.5, 0.001)").fetchall() == [(0.999,)]
    finally:
        ro.close()


def test_read_only_connect_to_missing_file_is_an_error(tmp_path):
    with pytest.raises(storage.StoreError, match="does not exist"):
        storage.connect(tmp_path / "nope.duckdb", read_only=True)


def test_term_macro_is_each_family_formula(con):
    got = con.execute(
        """SELECT calpipe_term('identity', 0, 0, 0.3), calpipe_term('quadratic', 0.5, 0, 0.3),
                  calpipe_term('cubic', 1, 0.5, 0.3), calpipe_term('cox', 1, 2, 0.3)"""
    ).fetchall()[0]
    e = 2.718281828459045
    want = (
        0.3,
        0.3 + 0.5 * 0.3 * 0.7,
        0.3 + 0.3 * (0.3 - 0.5) * (0.3 - 1),
        e * 0.09 / (e * 0.09 + 0.49),
    )
    assert got == pytest.approx(want, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# Partition replace
# ----------------------------------------------------------------------------------------------
def test_replace_touches_only_the_given_partitions(con):
    storage.replace_partitions(
        con, D1, D3, {"scored_events": pl.concat([events_of(d, 3) for d in (D1, D2, D3)])}
    )
    storage.replace_partitions(con, D2, D2, {"scored_events": events_of(D2, 5, score=0.5)})
    rows = table_rows(con, "scored_events")
    counts = dict(rows.group_by("event_date").len().iter_rows())
    assert counts == {D1: 3, D2: 5, D3: 3}
    assert rows.filter(pl.col("event_date") == D2)["score"].unique().to_list() == [0.5]
    # an empty frame empties the partition
    storage.replace_partitions(con, D2, D2, {"scored_events": events_of(D2, 0)})
    assert storage.partition_dates(con, "scored_events") == [D1, D3]


def test_replace_is_idempotent(con):
    frame = pl.concat([events_of(D1, 4), events_of(D1, 3, stream="a")])
    storage.replace_partitions(con, D1, D1, {"scored_events": frame})
    first = table_rows(con, "scored_events")
    storage.replace_partitions(
        con, D1, D1, {"scored_events": frame.sample(fraction=1.0, shuffle=True, seed=1)}
    )
    assert table_rows(con, "scored_events").equals(first)


def test_rows_outside_the_partitions_are_refused(con):
    with pytest.raises(storage.StoreError, match="outside the partitions"):
        storage.replace_partitions(con, D1, D1, {"scored_events": events_of(D2, 2)})


def test_a_failed_write_rolls_back_every_table(con):
    storage.replace_partitions(con, D1, D1, {"scored_events": events_of(D1, 3)})
    before = table_rows(con, "scored_events")
    # protected rows without their NOT NULL log10_martingale: the second insert fails
    broken = pl.DataFrame(
        {"event_date": [D1], "stream": ["s"], "event_id": [1], "base_score": [0.2],
         "protected_score": [0.2]}
    )  # fmt: skip
    with pytest.raises(duckdb.ConstraintException):
        storage.replace_partitions(
            con, D1, D1, {"scored_events": events_of(D1, 7), "protected_scores": broken}
        )
    assert table_rows(con, "scored_events").equals(before)
    assert table_rows(con, "protected_scores").height == 0


def registered_views(con) -> list[str]:
    return [
        r[0]
        for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE view_name LIKE '__calpipe_insert%'"
        ).fetchall()
    ]


def protected_of(day: dt.date, n: int, *, score: float = 0.5) -> pl.DataFrame:
    """``n`` protected_scores rows of one day (the table's NOT NULL columns)."""
    return pl.DataFrame(
        {"event_date": [day] * n, "stream": ["s"] * n, "event_id": list(range(1, n + 1)),
         "base_score": [0.25] * n, "protected_score": [score] * n, "log10_martingale": [0.0] * n}
    )  # fmt: skip


@pytest.mark.parametrize("background", [False, True])
def test_streamed_replace_writes_every_insert_in_one_transaction(con, monkeypatch, background):
    monkeypatch.setattr(storage.writer, "WRITE_FLUSH_ROWS", 4)  # some inserts buffered, some sent
    storage.replace_partitions(con, D1, D3, {"scored_events": events_of(D2, 9)})
    parts = [events_of(D1, 3), events_of(D2, 5, stream="a"), events_of(D3, 2)]
    with storage.replacing_partitions(con, D1, D3, ["scored_events"], background=background) as w:
        for part in parts:
            w.insert("scored_events", part, sort=False)
        assert w.rows == {"scored_events": 10}
    rows = table_rows(con, "scored_events")
    assert rows.equals(pl.concat(parts).sort(pl.all()))  # the old D2 rows are gone
    assert registered_views(con) == []


@pytest.mark.parametrize("background", [False, True])
def test_a_failed_streamed_insert_rolls_back_every_day(con, background):
    storage.replace_partitions(con, D1, D2, {"scored_events": events_of(D1, 3)})
    before = table_rows(con, "scored_events")
    with pytest.raises(duckdb.ConstraintException):  # NOT NULL log10_martingale missing
        with storage.replacing_partitions(
            con, D1, D2, ["scored_events", "protected_scores"], background=background
        ) as w:
            w.insert("scored_events", events_of(D2, 300_000), sort=False)  # row groups on disk
            w.insert("protected_scores", protected_of(D2, 2).drop("log10_martingale"))
            w.flush()
            w.wait()
    assert table_rows(con, "scored_events").equals(before)
    assert table_rows(con, "protected_scores").height == 0
    assert registered_views(con) == []
    # an error in the caller's block, with an INSERT still running, rolls back too
    with pytest.raises(RuntimeError, match="caller"):
        with storage.replacing_partitions(con, D1, D2, ["scored_events"], background=True) as w:
            w.insert("scored_events", events_of(D2, 300_000), sort=False)
            w.flush()
            raise RuntimeError("caller")
    assert table_rows(con, "scored_events").equals(before)


def test_buffered_frames_with_different_enums_insert_as_strings(con):
    """A label night's file column is an Enum of that night's files: two nights' rows buffered
    in one INSERT have no common polars type, and go in as the strings they are."""

    def night(day, name):
        return events_of(day, 2, stream=name).with_columns(pl.col("stream").cast(pl.Enum([name])))

    with storage.replacing_partitions(con, D1, D2, ["scored_events"]) as w:
        w.insert("scored_events", night(D1, "file-1.parquet"), sort=False)
        w.insert("scored_events", night(D2, "file-2.parquet"), sort=False)
    got = storage.query(con, "SELECT DISTINCT stream FROM scored_events ORDER BY ALL")
    assert got["stream"].to_list() == ["file-1.parquet", "file-2.parquet"]


def test_the_committed_reader_sees_the_history_while_the_writer_inserts(con):
    """A big night's parts read through a second connection while the writer's background
    INSERTs hold the first (``calpipe.pipeline.nightly``): it sees the committed days and not
    the open transaction's rows, and has every calpipe session setting."""
    storage.replace_partitions(con, D1, D1, {"scored_events": events_of(D1, 3)})
    reader = storage.committed_reader(con)
    try:
        with storage.replacing_partitions(con, D1, D2, ["scored_events"], background=True) as w:
            w.insert("scored_events", events_of(D2, 4), sort=False)
            w.flush()
            w.wait()
            assert storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0] == 4
            seen = storage.query(reader, "SELECT event_date, count(*) AS n FROM scored_events "
                                 "GROUP BY ALL")  # fmt: skip
            assert seen.rows() == [(D1, 3)]  # the deleted day 1, not the inserted day 2
        settings = reader.execute(
            "SELECT current_setting('TimeZone'), current_setting('enable_progress_bar')"
        ).fetchall()
        assert settings == [("UTC", False)]
        assert table_rows(reader, "scored_events")["event_date"].unique().to_list() == [D2]
    finally:
        reader.close()


def test_a_slow_query_draws_no_progress_bar(con):
    """DuckDB's progress bar drew into ``calpipe run``'s output on queries over 2 s."""
    assert con.execute("SELECT current_setting('enable_progress_bar')").fetchall() == [(False,)]


def test_writer_refuses_tables_it_does_not_replace(con):
    with pytest.raises(storage.StoreError, match="not among the tables"):
        with storage.replacing_partitions(con, D1, D1, ["scored_events"]) as w:
            w.insert("protected_scores", protected_of(D1, 1))


def test_protected_scores_keeps_outputs_and_the_view_joins_the_inputs(con):
    ev = events_of(D1, 3, score=0.3)
    day = {
        "date": D1, "first_day": D1, "method": "composite-jumper", "config_fingerprint": "f00d",
        "config_json": "{}", "n_events": 3, "n_streams": 1, "n_active_streams": 1,
        "n_state_rows": 1,
    }  # fmt: skip
    storage.replace_partitions(
        con, D1, D1,
        {"scored_events": ev, "protected_scores": protected_of(D1, 3, score=0.4),
         "pipeline_days": pl.DataFrame([day])},
    )  # fmt: skip
    view = storage.query(con, "SELECT * FROM v_protected_scores ORDER BY event_id")
    assert view.height == 3
    assert view["event_time"].equals(ev["event_time"])
    assert view["score"].to_list() == [0.3] * 3
    assert view["adjustment"].to_list() == pytest.approx([0.4 - 0.25] * 3)
    assert set(view["method"]) == {"composite-jumper"} and set(view["config_fingerprint"]) == {
        "f00d"
    }
    assert {"p_lower", "p_upper", "at_alarm_level"} <= set(view.columns)


def test_the_old_protected_scores_layout_is_migrated(tmp_path):
    path = tmp_path / "old.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute(  # the layout before protected_scores kept only the outputs
        """CREATE TABLE protected_scores (
               event_date DATE NOT NULL, stream VARCHAR NOT NULL, event_id BIGINT NOT NULL,
               event_time TIMESTAMP NOT NULL, score DOUBLE NOT NULL, base_score DOUBLE NOT NULL,
               label INTEGER, protected_score DOUBLE NOT NULL, log10_martingale DOUBLE NOT NULL,
               method VARCHAR NOT NULL, config_fingerprint VARCHAR NOT NULL);
           INSERT INTO protected_scores VALUES (DATE '2024-03-01', 's', 1,
               TIMESTAMP '2024-03-01 00:00:00', 0.3, 0.3, 1, 0.4, 0.1, 'composite-jumper', 'f');
           CREATE TABLE calpipe_meta (key VARCHAR NOT NULL, value VARCHAR NOT NULL);
           INSERT INTO calpipe_meta VALUES ('sql_hash', 'old')"""
    )
    raw.close()
    con = storage.connect(path)
    try:
        cols = storage.query(con, "SELECT * FROM protected_scores").columns
        assert cols == [
            "event_date", "stream", "event_id", "base_score", "label", "protected_score",
            "log10_martingale", "p_lower", "p_upper", "base_scores", "protected_scores",
        ]  # fmt: skip
        storage.replace_partitions(con, D1, D1, {"protected_scores": protected_of(D1, 2)})
        assert storage.query(con, "SELECT count(*) FROM v_protected_scores").item() == 2
    finally:
        con.close()


def test_an_old_calibration_daily_gains_the_smooth_ece_and_corp_columns(tmp_path):
    path = tmp_path / "old.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute(  # the layout before the smooth ECE and the CORP decomposition
        """CREATE TABLE calibration_daily (
               date DATE NOT NULL, stream VARCHAR NOT NULL, n_events BIGINT NOT NULL,
               n_labelled BIGINT NOT NULL, base_log_loss DOUBLE, protected_log_loss DOUBLE,
               base_brier DOUBLE, protected_brier DOUBLE, base_ece DOUBLE, protected_ece DOUBLE,
               mean_score DOUBLE, mean_protected DOUBLE, mean_label DOUBLE,
               log10_martingale DOUBLE NOT NULL, log10_martingale_max DOUBLE NOT NULL,
               log10_martingale_max_to_date DOUBLE NOT NULL, alarm BOOLEAN NOT NULL);
           INSERT INTO calibration_daily VALUES (DATE '2024-03-01', 's', 2, 2, 0.5, 0.4, 0.2,
               0.1, 0.1, 0.05, 0.4, 0.45, 0.5, 0.1, 0.1, 0.1, false);
           CREATE TABLE calpipe_meta (key VARCHAR NOT NULL, value VARCHAR NOT NULL);
           INSERT INTO calpipe_meta VALUES ('sql_hash', 'old')"""
    )
    raw.close()
    con = storage.connect(path)
    try:
        row = storage.query(con, "SELECT * FROM v_calibration_daily").row(0, named=True)
        new = ["base_smooth_ece", "protected_smooth_ece", "base_log_loss_mcb", "log_loss_unc",
               "protected_brier_dsc", "brier_unc"]  # fmt: skip
        assert all(c in row and row[c] is None for c in new)  # unknown until recomputed
        assert row["base_log_loss"] == 0.5 and row["log_loss_gain"] == pytest.approx(0.1)
    finally:
        con.close()


def test_connect_limits_duckdb_memory_and_the_cache_can_be_dropped(con):
    limit = storage.fetch_one(con, "SELECT current_setting('memory_limit')")[0]
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY_LIMIT}'")
    assert storage.fetch_one(con, "SELECT current_setting('memory_limit')")[0] == limit
    rng = np.random.default_rng(0)
    rows = events_of(D1, 300_000).with_columns(pl.Series("score", rng.random(300_000)))
    storage.replace_partitions(con, D1, D1, {"scored_events": rows}, sort=False)
    cached = "SELECT sum(memory_usage_bytes) FROM duckdb_memory()"
    assert storage.fetch_one(con, cached)[0] > 1_000_000
    storage.drop_block_cache(con)
    assert storage.fetch_one(con, cached)[0] < 1_000_000
    assert storage.fetch_one(con, "SELECT current_setting('memory_limit')")[0] == limit
    assert table_rows(con, "scored_events").height == 300_000  # evicted, not lost


def test_unknown_table_is_refused(con):
    with pytest.raises(storage.StoreError, match="unknown calpipe table"):
        storage.read_partitions(con, "nope", D1, D1)


KILL_CHILD = textwrap.dedent(
    """
    import datetime as dt, sys, time
    import polars as pl
    from calpipe import config, storage

    class PauseAtCommit:
        # A connection that stops inside the transaction, just before COMMIT.
        def __init__(self, con):
            self._con = con
        def __getattr__(self, name):
            return getattr(self._con, name)
        def commit(self):
            n = self._con.execute("SELECT count(*) FROM scored_events").fetchall()[0][0]
            print(f"IN_TRANSACTION {n}", flush=True)
            time.sleep(600)

    path, n = sys.argv[1], int(sys.argv[2])
    day = dt.date(2024, 3, 1)
    t0 = dt.datetime(2024, 3, 1)
    new = pl.DataFrame({
        "event_date": [day] * n, "stream": ["s"] * n, "event_id": list(range(n)),
        "event_time": [t0] * n, "score": [0.9] * n, "label": [1] * n,
    })
    con = storage.connect(path)
    storage.replace_partitions(PauseAtCommit(con), day, day, {"scored_events": new})
    """
)


def test_sigkill_inside_the_transaction_leaves_the_previous_partition(tmp_path):
    path = tmp_path / "db.duckdb"
    con = storage.connect(path)
    storage.replace_partitions(con, D1, D1, {"scored_events": events_of(D1, 50)})
    before = table_rows(con, "scored_events")
    con.close()

    n_new = 300_000  # large enough that DuckDB writes row groups before the commit
    child = subprocess.Popen(
        [sys.executable, "-c", KILL_CHILD, str(path), str(n_new)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = child.stdout.readline()
        # The child has deleted the 50 old rows and inserted the new ones, uncommitted.
        assert line.split() == ["IN_TRANSACTION", str(n_new)], child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    con = storage.connect(path)
    try:
        assert table_rows(con, "scored_events").equals(before)
        # and the file is healthy: a new replace commits
        storage.replace_partitions(con, D1, D1, {"scored_events": events_of(D1, 2)})
        assert table_rows(con, "scored_events").height == 2
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------
# Event sources
# ----------------------------------------------------------------------------------------------
def raw_events(days, n=3) -> pl.DataFrame:
    return pl.concat([events_of(d, n).drop("event_date") for d in days])


def test_parse_tells_landing_parquet_and_table_apart(tmp_path):
    (tmp_path / "landing").mkdir()
    f = tmp_path / "ev.parquet"
    raw_events([D1]).write_parquet(f)
    assert storage.EventSource.parse(str(tmp_path / "landing")).kind == "landing"
    assert storage.EventSource.parse(str(f)).kind == "parquet"
    assert storage.EventSource.parse(str(tmp_path / "*.parquet")).kind == "parquet"
    assert storage.EventSource.parse("raw.events").kind == "table"
    with pytest.raises(storage.StoreError, match="neither"):
        storage.EventSource.parse("no such; thing")


def test_landing_folder_round_trip(con, tmp_path):
    ev = raw_events([D1, D3], n=4)
    assert storage.write_landing(ev, tmp_path / "landing") == 2
    assert sorted(p.name for p in (tmp_path / "landing").iterdir()) == [
        "date=2024-03-01",
        "date=2024-03-03",
    ]
    src = storage.EventSource.parse(str(tmp_path / "landing"))
    assert src.date_range(con) == (D1, D3)
    assert src.read_raw(con, D1).equals(ev.filter(pl.col("event_time").dt.date() == D1))
    assert src.read_raw(con, D2).height == 0


def test_a_day_folder_without_dashes_was_read_as_an_empty_day(con, tmp_path):
    # date=20240301 was accepted (fromisoformat takes it) but never read: 400 events dropped
    (tmp_path / "landing" / "date=20240301").mkdir(parents=True)
    raw_events([D1]).write_parquet(tmp_path / "landing" / "date=20240301" / "e.parquet")
    src = storage.EventSource.parse(str(tmp_path / "landing"))
    with pytest.raises(
        storage.StoreError, match=r"folder 'date=20240301' is not a day folder date=YYYY-MM-DD"
    ):
        src.date_range(con)


@pytest.mark.parametrize("name", ["Date=2024-03-01", "dt=2024-03-01", "2024-03-01", "notes.txt"])
def test_a_misnamed_day_folder_was_skipped_and_its_day_committed_empty(tmp_path, name, capsys):
    """Date=, dt= or a bare date beside the day folders was skipped, its day committed empty
    with exit 0. Now any entry that is not date=YYYY-MM-DD (or _/. prefixed) is refused,
    naming it, and the run writes nothing (no database file)."""
    land = tmp_path / "landing"
    storage.write_landing(raw_events([D1, D3], n=4), land)
    wrong = land / name
    if name.endswith(".txt"):
        wrong.write_text("x")
    else:
        wrong.mkdir()
        raw_events([D2], n=4).write_parquet(wrong / "e.parquet")
    (land / "_SUCCESS").write_text("")  # markers stay skipped
    (land / ".hidden").mkdir()
    db = tmp_path / "db.duckdb"
    assert cli.main(["run", "--events", str(land), "--db", str(db), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{name!r} is not a day folder date=YYYY-MM-DD" in err
    assert not db.exists()


@pytest.mark.parametrize(
    ("entry", "match"),
    [("part=0/e.parquet", "sub-folder 'part=0'"), ("notes.csv", "'notes.csv' is not Parquet"),
     ("*.parquet", "glob character")],
)  # fmt: skip
def test_day_folder_entries_that_were_silently_dropped_are_refused(con, tmp_path, entry, match):
    day = tmp_path / "landing" / f"date={D1.isoformat()}"
    (day / entry).parent.mkdir(parents=True)
    raw_events([D1]).write_parquet(day / entry)
    src = storage.EventSource.parse(str(tmp_path / "landing"))
    with pytest.raises(storage.StoreError, match=match):
        src.read_raw(con, D1)


def test_upper_case_and_parq_files_are_read_and_hadoop_markers_skipped(con, tmp_path):
    # *.PARQUET and *.parq days were committed empty
    day = tmp_path / "landing" / f"date={D1.isoformat()}"
    day.mkdir(parents=True)
    ev = raw_events([D1], n=4)
    ev.head(2).write_parquet(day / "a.PARQUET")
    ev.tail(2).write_parquet(day / "b.parq")
    (day / "_SUCCESS").write_text("")
    (day / ".b.parq.crc").write_text("x")
    src = storage.EventSource.parse(str(tmp_path / "landing"))
    assert src.date_range(con) == (D1, D1)
    assert src.read_raw(con, D1).sort("event_id").equals(ev.sort("event_id"))


def test_parquet_and_table_sources_read_one_day(con, tmp_path):
    ev = raw_events([D1, D2, D3])
    ev.write_parquet(tmp_path / "ev.parquet")
    con.register("ev_arrow", ev.to_arrow())
    con.execute("CREATE TABLE raw_events AS SELECT * FROM ev_arrow")
    for text in (str(tmp_path / "ev.parquet"), "raw_events"):
        src = storage.EventSource.parse(text)
        assert src.date_range(con) == (D1, D3)
        got = src.read_raw(con, D2).sort("event_id")
        assert got.equals(ev.filter(pl.col("event_time").dt.date() == D2))


def test_normalize_maps_columns_and_one_stream_only_when_asked():
    raw = pl.DataFrame(
        {"id": [1, 2], "when": [D1, D1], "p": [0.1, 0.2], "y": [0, None]},
        schema_overrides={"y": pl.Int8},
    )
    cm = storage.ColumnMap(stream="segment", event_id="id", event_time="when", score="p", label="y")
    with pytest.raises(InputError, match=r"column 'segment': missing column .*--stream-col none"):
        storage.normalize_events(raw, cm)  # regression: a missing stream column meant one stream
    cm = storage.ColumnMap(stream=None, event_id="id", event_time="when", score="p", label="y")
    out = storage.normalize_events(raw, cm)
    assert out.columns == ["stream", "event_id", "event_time", "score", "label"]
    assert out["stream"].to_list() == [storage.DEFAULT_STREAM] * 2
    assert out.schema["event_time"] == pl.Datetime("us")


def test_normalize_stores_aware_times_as_utc():
    t = dt.datetime(2024, 3, 1, 23, 30)
    raw = pl.DataFrame({"event_id": [1], "event_time": [t], "score": [0.1], "label": [0]})
    aware = raw.with_columns(pl.col("event_time").dt.replace_time_zone("Europe/Paris"))
    out = storage.normalize_events(aware, storage.ColumnMap(stream=None))
    assert out["event_time"][0] == dt.datetime(2024, 3, 1, 22, 30)  # 23:30 CET = 22:30 UTC
    assert out.schema["event_time"] == pl.Datetime("us")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (
            pl.DataFrame({"event_id": [1.5], "event_time": [D1], "score": [0.1], "label": [0]}),
            "integers or strings",
        ),
        (
            pl.DataFrame({"event_id": [1], "event_time": ["x"], "score": [0.1], "label": [0]}),
            "Date or Datetime",
        ),
        (pl.DataFrame({"event_id": [1], "event_time": [D1], "label": [0]}), "missing column"),
    ],
)
def test_normalize_refuses_what_cannot_be_stored(raw, match):
    with pytest.raises(InputError, match=match):
        storage.normalize_events(raw, storage.ColumnMap(stream=None))


_MIXED_TZ_DAY = """
import datetime as dt, sys
from pathlib import Path
import polars as pl
from calpipe import storage
d = Path(sys.argv[1])
con = storage.connect(d / "db.duckdb")
src = storage.EventSource.parse(str(d / "landing"))
raw = src.read_raw(con, dt.date(2024, 3, 1))
out = storage.normalize_events(raw, storage.ColumnMap()).sort("event_id")
print(con.execute("SELECT current_setting('TimeZone')").fetchone()[0], *out["event_time"].to_list())
"""


@pytest.mark.parametrize("tz", ["America/New_York", "Asia/Tokyo"])
def test_a_day_of_naive_and_aware_files_was_shifted_by_the_process_time_zone(tmp_path, tz):
    """Naive 12:00 next to a UTC-aware file was stored as 17:00 under TZ=America/New_York (and
    03:00 under Asia/Tokyo): DuckDB read both as TIMESTAMPTZ in the process's zone."""
    import os
    import subprocess
    import sys

    day = tmp_path / "landing" / "date=2024-03-01"
    day.mkdir(parents=True)
    t = dt.datetime(2024, 3, 1, 12, 0)
    base = {"stream": ["a"], "score": [0.3], "label": [1]}
    pl.DataFrame({**base, "event_id": [1], "event_time": [t]}).write_parquet(day / "naive.parquet")
    pl.DataFrame({**base, "event_id": [2], "event_time": [t]}).with_columns(
        pl.col("event_time").dt.replace_time_zone("UTC")
    ).write_parquet(day / "aware.parquet")
    env = {**os.environ, "TZ": tz}
    res = subprocess.run([sys.executable, "-c", _MIXED_TZ_DAY, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["UTC", "2024-03-01", "12:00:00", "2024-03-01", "12:00:00"]


def test_a_disk_full_error_was_hidden_behind_cannot_rollback(con):
    """DuckDB ends the transaction itself on an I/O error; the ROLLBACK that followed raised
    "cannot rollback - no transaction is active" and hid "No space left on device"."""
    import duckdb

    before = storage.query(con, "SELECT * FROM scored_events")
    with pytest.raises(duckdb.IOException, match="No space left on device"):
        with storage.replacing_partitions(con, D1, D1, ["scored_events"]) as writer:
            writer.insert("scored_events", events_of(D1, 2), sort=False)
            con.execute("ROLLBACK")  # what DuckDB does when a write fails with ENOSPC
            raise duckdb.IOException("No space left on device")  # injected: the real error
    assert storage.query(con, "SELECT * FROM scored_events").equals(before)


def test_a_time_column_name_with_a_quote_was_pasted_into_sql(con, tmp_path):
    ev = raw_events([D1]).rename({"event_time": 'ev"t'})
    ev.write_parquet(tmp_path / "ev.parquet")
    src = storage.EventSource.parse(
        str(tmp_path / "ev.parquet"), storage.ColumnMap(event_time='ev"t')
    )
    assert src.date_range(con) == (D1, D1)
    assert src.read_raw(con, D1).height == ev.height


def test_uint64_event_ids_beyond_int64_were_a_cast_traceback():
    raw = pl.DataFrame({"event_id": [1, 2**63 + 5], "event_time": [D1, D1], "score": [0.1, 0.2],
                        "label": [0, 1]}, schema_overrides={"event_id": pl.UInt64})  # fmt: skip
    with pytest.raises(InputError, match=r"row 1: event id 9223372036854775813 does not fit"):
        storage.normalize_events(raw, storage.ColumnMap(stream=None))


def test_a_float_event_id_on_one_day_names_the_file(con, tmp_path):
    """(String and UUID ids are stored since #12 item 4: tests/pipeline/test_ids.py.)"""
    day = tmp_path / "landing" / f"date={D2.isoformat()}"
    day.mkdir(parents=True)
    raw_events([D2]).with_columns(pl.col("event_id").cast(pl.Float64)).write_parquet(
        day / "e.parquet"
    )
    src = storage.EventSource.parse(str(tmp_path / "landing"))
    with pytest.raises(InputError, match=rf"date={D2.isoformat()}/e.parquet: event ids must be "
                                         "integers or strings"):  # fmt: skip
        src.read_raw(con, D2)


def _user_database(path):
    raw = duckdb.connect(str(path))
    raw.execute("CREATE TABLE my_table (x INTEGER); CREATE VIEW v_alarms AS SELECT 42 AS mine")
    raw.close()


def test_a_users_own_duckdb_file_was_given_calpipes_tables(tmp_path):
    """connect() installed seven tables into a user's DuckDB file and replaced their v_alarms."""
    path = tmp_path / "mine.duckdb"
    _user_database(path)
    with pytest.raises(
        storage.StoreError, match=r"is not a calpipe database: it has 2 objects of its own"
    ):
        storage.connect(path)
    raw = duckdb.connect(str(path), read_only=True)
    assert raw.execute("SELECT mine FROM v_alarms").fetchone() == (42,)
    assert raw.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (1,)
    raw.close()


@pytest.mark.parametrize(
    "ddl",
    ["CREATE MACRO add_one(x) AS x + 1", "CREATE SEQUENCE my_ids",
     "CREATE TYPE mood AS ENUM ('ok', 'not ok')"],
)  # fmt: skip
def test_a_duckdb_file_holding_only_a_macro_or_sequence_was_adopted(tmp_path, ddl):
    """A file with no table or view but a user's macro, sequence or type was taken for a new
    one and calpipe's schema installed into it. Refused now, the file unchanged."""
    path = tmp_path / "mine.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute(ddl)
    raw.close()
    before = path.read_bytes()
    with pytest.raises(storage.StoreError, match=r"is not a calpipe database: it has 1 objects"):
        storage.connect(path)
    assert path.read_bytes() == before
    raw = duckdb.connect(str(path), read_only=True)
    assert raw.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)
    raw.close()


def test_a_schema_version_that_is_no_number_was_an_int_traceback(tmp_path):
    """schema_version = '11a': ValueError: invalid literal for int(). Now a StoreError naming
    the value, for a read-write and a read-only connection alike; nothing changed."""
    path = tmp_path / "db.duckdb"
    storage.connect(path).close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE calpipe_meta SET value = '11a' WHERE key = 'schema_version'")
    con.close()
    before = path.read_bytes()
    with pytest.raises(storage.StoreError, match=r"calpipe_meta.schema_version is '11a', not a"):
        storage.connect(path)
    con = storage.connect(path, read_only=True)
    try:
        with pytest.raises(storage.StoreError, match=r"schema_version is '11a'"):
            storage.require_calpipe(con)
    finally:
        con.close()
    assert path.read_bytes() == before


def test_a_database_of_a_newer_calpipe_was_migrated_backwards(tmp_path):
    path = tmp_path / "new.duckdb"
    storage.connect(path).close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE calpipe_meta SET value = ? WHERE key = 'schema_version'",
                [str(storage.SCHEMA_VERSION + 1)])  # fmt: skip
    con.execute("UPDATE calpipe_meta SET value = 'newer' WHERE key = 'sql_hash'")
    con.close()
    with pytest.raises(storage.StoreError, match=r"written by a newer calpipe \(schema version"):
        storage.connect(path)
    con = duckdb.connect(str(path), read_only=True)
    assert (
        dict(con.execute("SELECT key, value FROM calpipe_meta").fetchall())["sql_hash"] == "newer"
    )
    con.close()


def test_an_unversioned_calpipe_database_is_upgraded_once(tmp_path):
    path = tmp_path / "v1.duckdb"
    storage.connect(path).close()
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM calpipe_meta WHERE key = 'schema_version'")  # as written before
    con.close()
    con = storage.connect(path)
    assert storage.get_meta(con, "schema_version") == str(storage.SCHEMA_VERSION)
    assert storage.install_sql(con) is False  # up to date: no write
    con.close()


def test_a_column_map_round_trips_through_json_and_a_bad_one_is_named():
    cm = storage.ColumnMap(stream=None, event_id="rid", event_time="ts", score="p", label="y")
    assert storage.ColumnMap.from_json(cm.to_json()) == cm
    with pytest.raises(
        storage.StoreError, match=r"column map '\{\"stream\": \"a\", \"x\": 1\}' is not"
    ):
        storage.ColumnMap.from_json('{"stream": "a", "x": 1}')
    with pytest.raises(storage.StoreError, match="is not a calpipe column map"):
        storage.ColumnMap.from_json("not json")
