"""calpipe/pipeline/chain.py: the state of a chain is stored for the streams that changed.

Regression tests for the hardening issue's item 10: idle days rewrote the state and the serving
map of every stream ever seen (at 200,000 streams, +64 MB and 4.5 s per idle day for
composite-jumper; ~9 KB a stream a day for composite-experts).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe import cli, pipeline, storage
from calpipe.errors import StateError
from calpipe.pipeline import Settings

D0 = dt.date(2024, 3, 1)
N_STREAMS = 30
TOL = 1e-12


def _day(i: int) -> dt.date:
    return D0 + dt.timedelta(days=i)


def _events(rows: list[tuple[str, int, int]], seed: int = 3) -> pl.DataFrame:
    """Events of (stream, day, count) with miscalibrated scores (so the maps move)."""
    rng = np.random.default_rng(seed)
    parts, next_id = [], 0
    for stream, d, n in rows:
        p = rng.uniform(0.05, 0.95, n)
        y = (rng.uniform(size=n) < np.clip(p + 0.25, 0, 1)).astype(np.int64)
        t0 = dt.datetime.combine(_day(d), dt.time(1))
        parts.append(
            pl.DataFrame({
                "stream": [stream] * n,
                "event_id": np.arange(next_id, next_id + n),
                "event_time": [t0 + dt.timedelta(minutes=j) for j in range(n)],
                "score": p,
                "label": y,
            })
        )  # fmt: skip
        next_id += n
    return pl.concat(parts)


@pytest.fixture
def idle(tmp_path):
    """30 streams with events on day 0; then only s0 (days 1-4); then s7 again on day 5."""
    first = [(f"s{i}", 0, 40) for i in range(N_STREAMS)]
    later = [("s0", d, 25) for d in range(1, 5)] + [("s7", 5, 30)]
    events = _events(first + later)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "db.duckdb")
    yield con, storage.EventSource.parse(str(tmp_path / "landing")), events
    con.close()


def _rows_by_day(con, table: str) -> dict[dt.date, int]:
    counts = storage.query(con, f"SELECT date, count(DISTINCT stream) AS n FROM {table} GROUP BY 1")
    return dict(zip(counts["date"].to_list(), counts["n"].to_list(), strict=True))


def test_idle_days_rewrote_the_state_and_map_of_every_known_stream(idle):
    con, source, events = idle
    summary = pipeline.run_range(con, source)
    assert all(c.passed or c.warning for c in summary.checks)
    # rows only for the streams with events: 30 on day 0, s0 on days 1-4, s7 on day 5
    assert _rows_by_day(con, "calibrator_state") == {
        _day(0): N_STREAMS,
        **{_day(d): 1 for d in range(1, 6)},
    }
    assert _rows_by_day(con, "calibration_map") == _rows_by_day(con, "calibrator_state")
    days = storage.query(con, "SELECT n_streams, n_state_rows FROM pipeline_days ORDER BY date")
    assert days["n_streams"].to_list() == [N_STREAMS] * 6
    assert days["n_state_rows"].to_list() == [N_STREAMS, 1, 1, 1, 1, 1]
    # s7 resumed on day 5 from its day-0 row: the chain equals one protect pass
    one = calpipe.protect(events, method=Settings().method)
    chain = storage.query(con, "SELECT stream, event_id, protected_score FROM protected_scores")
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() <= TOL
    # the state at the end of the last day is every stream's, equal to the one pass's
    end = pipeline.state_as_of(con, _day(5))
    assert end.height == N_STREAMS
    assert end.filter(pl.col("stream") == "s7")["date"][0] == _day(5)
    assert end.filter(pl.col("stream") == "s3")["date"][0] == _day(0)
    ref = calpipe.protect_with_state(events, method=Settings().method).state.sort("stream")
    assert end["weights"].to_list() == ref["weights"].to_list()


def test_a_deleted_older_state_row_would_resume_from_an_even_older_one(idle):
    """Sparse rows: deleting s0's row of day 3 would make its state as of day 4 the day-2 row
    (silently stale). The per-day row counts catch it before anything is written."""
    con, source, _ = idle
    pipeline.run_range(con, source, _day(0), _day(4))
    con.execute("DELETE FROM calibrator_state WHERE date = ? AND stream = 's0'", [_day(3)])
    before = {
        t: storage.query(con, f"SELECT * FROM {t} ORDER BY ALL") for t in storage.PARTITION_COLUMN
    }
    with pytest.raises(StateError, match=rf"calibrator_state of {_day(3)} has 0 rows, but "
                                         r"pipeline_days recorded 1 streams"):  # fmt: skip
        pipeline.run_range(con, source, _day(5), _day(5))
    for t, frame in before.items():
        assert storage.query(con, f"SELECT * FROM {t} ORDER BY ALL").equals(frame), t
    outcome = pipeline.check_state_continuity(con, _day(1), _day(4))
    assert not outcome.passed and f"calibrator_state of {_day(3)} has 0 rows" in outcome.description


def test_a_stream_with_events_but_no_state_row_fails_the_continuity_check(idle):
    con, source, _ = idle
    pipeline.run_range(con, source)
    # drop s0's day-2 row and make the recorded count agree: only the event check can see it
    con.execute("DELETE FROM calibrator_state WHERE date = ? AND stream = 's0'", [_day(2)])
    con.execute("UPDATE pipeline_days SET n_state_rows = 0 WHERE date = ?", [_day(2)])
    outcome = pipeline.check_state_continuity(con, _day(1), _day(5))
    assert not outcome.passed
    assert f"stream 's0' has 25 events and 25 labels on {_day(2)} but no calibrator_state row" in (
        outcome.description
    )


def test_a_database_with_a_state_row_for_every_stream_and_day_upgrades_and_continues(idle):
    """Databases of schema version 3 stored every stream's state every day: they upgrade (the
    recorded row counts become the stream counts) and their chain continues exactly."""
    con, source, events = idle
    pipeline.run_range(con, source, _day(0), _day(4))
    # rewrite the history as version 3 stored it: every stream's state on every day
    dense = pl.concat([
        pipeline.state_as_of(con, _day(d)).with_columns(pl.lit(_day(d)).alias("date"))
        for d in range(5)
    ])  # fmt: skip
    storage.replace_partitions(con, _day(0), _day(4), {"calibrator_state": dense})
    con.execute("ALTER TABLE pipeline_days DROP COLUMN n_state_rows")
    # (nor did version 3 record the state's hash chain: schema version 5 brought it)
    con.execute("ALTER TABLE pipeline_days DROP COLUMN state_hash")
    con.execute("ALTER TABLE pipeline_days DROP COLUMN prev_state_hash")
    con.execute("UPDATE calpipe_meta SET value = '3' WHERE key = 'schema_version'")
    path = storage.query(con, "SELECT path FROM duckdb_databases() WHERE NOT internal")["path"][0]
    con.close()
    con = storage.connect(path)
    try:
        rows = storage.query(con, "SELECT n_streams, n_state_rows FROM pipeline_days")
        assert (rows["n_state_rows"] == rows["n_streams"]).all()
        summary = pipeline.run_range(con, source)
        assert summary.days == 1 and all(c.passed or c.warning for c in summary.checks)
        one = calpipe.protect(events, method=Settings().method)
        got = storage.query(con, "SELECT stream, event_id, protected_score FROM protected_scores")
        j = one.join(got, on=["stream", "event_id"], suffix="_c")
        assert j.height == events.height
        assert (j["protected_score"] - j["protected_score_c"]).abs().max() <= TOL
    finally:
        con.close()


def test_a_deleted_state_row_with_its_count_altered_resumed_from_an_older_state(idle):
    """Deleting s0's state row of day 3 and lowering pipeline_days.n_state_rows to match passed
    every check: day 5 resumed s0 from its day-2 state. The stored hash chain now refuses it,
    naming the day, before anything is written."""
    con, source, _ = idle
    pipeline.run_range(con, source, _day(0), _day(4))
    con.execute("DELETE FROM calibrator_state WHERE date = ? AND stream = 's0'", [_day(3)])
    con.execute("UPDATE pipeline_days SET n_state_rows = 0 WHERE date = ?", [_day(3)])
    before = {
        t: storage.query(con, f"SELECT * FROM {t} ORDER BY ALL") for t in storage.PARTITION_COLUMN
    }
    with pytest.raises(StateError, match=rf"the stored state of day {_day(3)} was altered "
                                         r"outside calpipe: its calibrator_state rows do not "
                                         r"hash to its recorded state_hash \(no state row for "
                                         r"the streams 's0', which have events"):  # fmt: skip
        pipeline.run_range(con, source, _day(5), _day(5))
    for t, frame in before.items():
        assert storage.query(con, f"SELECT * FROM {t} ORDER BY ALL").equals(frame), t


def test_an_added_state_row_named_only_the_day_and_all_its_streams(idle):
    """A state row copied onto a day its stream has no events (its count raised to match): the
    refusal names the stream whose row should not be there, not only the day."""
    con, source, _ = idle
    pipeline.run_range(con, source, _day(0), _day(4))
    idle_stream = storage.query(
        con,
        """SELECT DISTINCT stream FROM calibrator_state WHERE stream NOT IN
           (SELECT stream FROM protected_scores WHERE event_date = $1) ORDER BY 1 LIMIT 1""",
        [_day(3)],
    )["stream"]
    assert idle_stream.len() == 1, "the fixture needs a stream idle on day 3"
    con.execute(
        """INSERT INTO calibrator_state SELECT * REPLACE ($1::DATE AS date) FROM calibrator_state
           WHERE stream = $2 AND date = (SELECT max(date) FROM calibrator_state
                                         WHERE stream = $2 AND date < $1)""",
        [_day(3), idle_stream[0]],
    )
    con.execute(
        "UPDATE pipeline_days SET n_state_rows = n_state_rows + 1 WHERE date = ?", [_day(3)]
    )
    with pytest.raises(StateError, match=rf"day {_day(3)} was altered .*\(a state row for the "
                                         rf"streams '{idle_stream[0]}', which have no events"):  # fmt: skip
        pipeline.run_range(con, source, _day(5), _day(5))


def test_a_changed_state_value_resumed_its_stream_from_it(idle):
    """An edited martingale in s0's last state row (counts untouched): refused, naming the day
    and its stream."""
    con, source, _ = idle
    pipeline.run_range(con, source, _day(0), _day(4))
    con.execute(
        "UPDATE calibrator_state SET log10_martingale = 0 WHERE date = ? AND stream = 's0'",
        [_day(4)],
    )
    with pytest.raises(StateError, match=rf"day {_day(4)} was altered .* of the streams 's0'"):
        pipeline.run_range(con, source, _day(5), _day(5))
    # untouched, the chain verifies and resumes
    con2 = storage.connect(con.sql("SELECT path FROM duckdb_databases() WHERE NOT internal")
                           .fetchall()[0][0].replace("db.duckdb", "db2.duckdb"))  # fmt: skip
    try:
        pipeline.run_range(con2, source, _day(0), _day(4))
        assert pipeline.run_range(con2, source, _day(5), _day(5)).days == 1
    finally:
        con2.close()


def test_deleted_protected_scores_left_a_plain_run_up_to_date(idle, capsys):
    """After DELETE FROM protected_scores a plain run said "up to date". Now the stored days
    whose rows are missing (counts against pipeline_days) are named, with the repair."""
    con, source, _ = idle
    pipeline.run_range(con, source)
    db = con.sql("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()[0][0]
    con.close()
    assert cli.main(["sql", "--db", db, "--write", "DELETE FROM protected_scores"]) == 0
    with storage.connect(db) as c:
        before = {t: storage.query(c, f"SELECT * FROM {t} ORDER BY ALL")
                  for t in storage.PARTITION_COLUMN}  # fmt: skip
    argv = ["run", "--events", source.location, "--db", db, "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"day {_day(0)}: protected_scores has 0 rows, but pipeline_days recorded" in err
    assert f"--start {_day(0)}" in err
    with storage.connect(db) as c:
        for t, frame in before.items():
            assert storage.query(c, f"SELECT * FROM {t} ORDER BY ALL").equals(frame), t
        outcome = pipeline.check_state_continuity(c, _day(0), _day(5))
    assert not outcome.passed and "protected_scores has 0 rows" in outcome.description
    # the repair it names
    assert cli.main([*argv, "--start", _day(0).isoformat()]) == 0
    assert "nothing to run" in (capsys.readouterr(), cli.main(argv),
                                capsys.readouterr().out)[2]  # fmt: skip
