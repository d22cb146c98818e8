"""calpipe/pipeline/inputs.py: corrected, late and stale days are replayed, never silent.

Regression tests of the label-feed issue's item 3, each named after what a user met: re-landing
day 6 with its labels printed "nothing to run" and left days 6-10 wrong; re-running only day 6
left days 7-10 stale while the continuity check passed; a day landed after the next day ran was
committed empty and never processed; an event re-sent on another day was stored twice.
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from calpipe import cli, generate, pipeline, storage
from calpipe.errors import InputError
from calpipe.generate import StreamSpec
from calpipe.pipeline.inputs import ReplayRequired, SourceRemoved

STREAMS = (StreamSpec("a", events_per_day=40), StreamSpec("b", events_per_day=25))
N_DAYS = 10
START = generate.DEFAULT_START
#: Tables whose rows depend only on the events (pipeline_inputs also records file times).
RESULT_TABLES = tuple(t for t in storage.PARTITION_COLUMN if t != "pipeline_inputs")


def day(i: int) -> dt.date:
    return START + dt.timedelta(days=i)


def _file(root, i: int):
    return root / f"date={day(i).isoformat()}" / "events.parquet"


def _tables(con, tables=RESULT_TABLES) -> dict[str, pl.DataFrame]:
    return {t: storage.query(con, f"SELECT * FROM {t} ORDER BY ALL") for t in tables}


def _everything(con) -> dict[str, pl.DataFrame]:
    return _tables(con, tuple(storage.PARTITION_COLUMN))


@pytest.fixture
def chain(tmp_path):
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "db.duckdb")
    source = storage.EventSource.parse(str(tmp_path / "landing"))
    pipeline.run_range(con, source)
    yield con, source, tmp_path
    con.close()


def _reference(tmp_path, name: str) -> dict[str, pl.DataFrame]:
    """The tables of one uninterrupted run on the landing as it is now, in a fresh database."""
    con = storage.connect(tmp_path / f"{name}.duckdb")
    try:
        pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "landing")))
        return _tables(con)
    finally:
        con.close()


def _correct_labels(path) -> None:
    """Re-land a day with some labels flipped (a corrected file)."""
    ev = pl.read_parquet(path)
    ev.with_columns(
        pl.when(pl.int_range(pl.len()) % 3 == 0).then(1 - pl.col("label")).otherwise("label")
        .alias("label")
    ).write_parquet(path)  # fmt: skip


def test_a_relanded_day_with_its_labels_printed_nothing_to_run(chain):
    con, source, tmp = chain
    _correct_labels(_file(tmp / "landing", 6))
    summary = pipeline.run_range(con, source)
    assert (summary.start, summary.end) == (day(6), day(N_DAYS - 1))
    got = _tables(con)
    want = _reference(tmp, "ref")
    for t in RESULT_TABLES:
        assert got[t].equals(want[t]), t
    assert pipeline.run_range(con, source).days == 0  # replayed: up to date now


def test_no_replay_refuses_with_the_exact_command_and_writes_nothing(chain, capsys):
    con, source, tmp = chain
    db = storage.query(con, "SELECT path FROM duckdb_databases() WHERE NOT internal")["path"][0]
    con.close()
    _correct_labels(_file(tmp / "landing", 6))
    with storage.connect(db) as c:
        before = _everything(c)
    argv = ["run", "--events", source.location, "--db", db, "--no-replay"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"day {day(6)}: scores file 'date={day(6)}/events.parquet' changed after the day ran" in err
    )
    assert f"run --events {source.location} --db {db} --start {day(6)}" in err
    with storage.connect(db) as c:
        after = _everything(c)
    assert all(after[t].equals(before[t]) for t in before)
    with storage.connect(db) as c, pytest.raises(ReplayRequired) as info:
        pipeline.run_range(c, source, replay=False)
    assert info.value.day == day(6)


def test_rerunning_only_day_6_left_days_7_to_10_stale_while_the_check_passed(chain):
    con, source, tmp = chain
    _correct_labels(_file(tmp / "landing", 6))
    pipeline.run_range(con, source, day(6), day(6))  # only day 6, as a user might
    outcome = pipeline.check_state_continuity(con, day(0), day(N_DAYS - 1))
    assert not outcome.passed
    assert f"day {day(7)} is stale" in outcome.description
    with pytest.raises(ReplayRequired, match=rf"day {day(7)}: it ran from a state of {day(6)}"):
        pipeline.run_range(con, source, replay=False)
    summary = pipeline.run_range(con, source)
    assert summary.start == day(7)
    got = _tables(con)
    want = _reference(tmp, "ref")
    for t in RESULT_TABLES:
        assert got[t].equals(want[t]), t
    assert pipeline.check_state_continuity(con, day(0), day(N_DAYS - 1)).passed


def test_rerunning_a_day_with_the_same_inputs_leaves_nothing_stale(chain):
    con, source, _ = chain
    before = _tables(con)
    pipeline.run_range(con, source, day(4), day(4))
    assert pipeline.run_range(con, source).days == 0
    after = _tables(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_a_day_landed_after_the_next_day_was_committed_empty_and_never_processed(tmp_path):
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)
    storage.write_landing(events, tmp_path / "landing")
    late = _file(tmp_path / "landing", 4)
    held = late.read_bytes()
    late.unlink()  # day 4 lands late
    source = storage.EventSource.parse(str(tmp_path / "landing"))
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(con, source)
        assert (
            storage.fetch_one(con, "SELECT n_events FROM pipeline_days WHERE date = ?", [day(4)])[0]
            == 0
        )
        late.write_bytes(held)
        summary = pipeline.run_range(con, source)
        assert summary.start == day(4)
        got = _tables(con)
    finally:
        con.close()
    want = _reference(tmp_path, "ref")
    for t in RESULT_TABLES:
        assert got[t].equals(want[t]), t


def test_a_removed_file_and_a_changed_table_source_are_replayed(chain, tmp_path):
    con, source, tmp = chain
    _file(tmp / "landing", 8).unlink()
    with pytest.raises(ReplayRequired, match=rf"day {day(8)}: scores file .* was removed"):
        pipeline.run_range(con, source, replay=False, replay_deleted=True)
    # a table source: one changed score on day 3
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)
    tcon = storage.connect(tmp_path / "table.duckdb")
    try:
        tcon.register("ev", events.to_arrow())
        tcon.execute("CREATE TABLE landed AS SELECT * FROM ev")
        tsource = storage.EventSource.parse("landed")
        pipeline.run_range(tcon, tsource)
        assert pipeline.run_range(tcon, tsource).days == 0
        tcon.execute(
            "UPDATE landed SET score = 0.5 WHERE event_time = "
            "(SELECT min(event_time) FROM landed WHERE CAST(event_time AS DATE) = ?)",
            [day(3)],
        )
        with pytest.raises(ReplayRequired, match=rf"day {day(3)}: scores rows changed"):
            pipeline.run_range(tcon, tsource, replay=False)
        assert pipeline.run_range(tcon, tsource).start == day(3)
    finally:
        tcon.close()


def _db_of(con) -> str:
    return storage.query(con, "SELECT path FROM duckdb_databases() WHERE NOT internal")["path"][0]


def test_a_deleted_old_landing_folder_deleted_its_stored_day_and_recomputed_every_later_one(
    chain, capsys
):
    """A retention policy deleting day 2's folder made the next run delete day 2's rows and
    recompute days 2-9 with one info line. Now the stored history is kept (the run says so and
    is up to date); recomputing without the folder is the named choice --replay-deleted."""
    con, source, tmp = chain
    db = _db_of(con)
    con.close()
    with storage.connect(db) as c:
        before = _everything(c)
    folder = tmp / "landing" / f"date={day(2).isoformat()}"
    _file(tmp / "landing", 2).unlink()
    folder.rmdir()
    assert cli.main(["run", "--events", source.location, "--db", db, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"1 stored day(s) from {day(2)} on have inputs that were removed" in out
    assert "their stored rows are kept (--replay-deleted recomputes them" in out
    assert "nothing to run" in out
    with storage.connect(db) as c:
        after = _everything(c)
    assert all(after[t].equals(before[t]) for t in before)
    # a correction of a later day replays from it: day 2 is before it, kept
    _correct_labels(_file(tmp / "landing", 6))
    with storage.connect(db) as c:
        assert pipeline.run_range(c, source).start == day(6)
        assert storage.query(c, "SELECT * FROM scored_events WHERE event_date = ? ORDER BY ALL",
                             [day(2)]).equals(before["scored_events"].filter(
                                 pl.col("event_date") == day(2)))  # fmt: skip
    # the named choice: recompute the days without the removed inputs
    assert cli.main(["run", "--events", source.location, "--db", db, "--no-progress",
                     "--replay-deleted"]) == 0  # fmt: skip
    assert f"ran {N_DAYS - 2} day(s) {day(2)} .. {day(N_DAYS - 1)}" in capsys.readouterr().out
    with storage.connect(db) as c:
        assert (
            storage.fetch_one(
                c, "SELECT count(*) FROM scored_events WHERE event_date = ?", [day(2)]
            )[0]
            == 0
        )


def test_a_replay_over_a_day_whose_folder_was_deleted_would_have_lost_its_rows(chain, capsys):
    """A corrected day 3 replays days 3-9; day 5's folder was deleted: the replay would
    recompute day 5 empty. Refused, naming both days and --replay-deleted; nothing written."""
    con, source, tmp = chain
    _correct_labels(_file(tmp / "landing", 3))
    _file(tmp / "landing", 5).unlink()
    before = _everything(con)
    with pytest.raises(SourceRemoved) as info:
        pipeline.run_range(con, source)
    msg = str(info.value)
    assert f"day {day(3)}: scores file 'date={day(3)}/events.parquet' changed" in msg
    assert f"would recompute day {day(5)}, whose inputs were removed" in msg
    assert "--replay-deleted" in msg and "(nothing was written)" in msg
    after = _everything(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_an_explicit_start_over_a_day_whose_folder_was_deleted_would_have_lost_its_rows(chain):
    """``--start`` day 3 with day 5's folder deleted recomputed day 5 empty, deleting its stored
    rows, where a replay refuses: the explicit range is refused the same way, naming the day
    and --replay-deleted, and nothing is written; with ``replay_deleted`` it runs."""
    con, source, tmp = chain
    _file(tmp / "landing", 5).unlink()
    before = _everything(con)
    with pytest.raises(SourceRemoved) as info:
        pipeline.run_range(con, source, start=day(3))
    msg = str(info.value)
    assert f"recomputing day {day(5)}, whose inputs were removed" in msg, msg
    assert "--replay-deleted" in msg and "(nothing was written)" in msg
    after = _everything(con)
    assert all(after[t].equals(before[t]) for t in before)
    # a range that ends before it, or starts after it, runs
    assert pipeline.run_range(con, source, start=day(3), end=day(4)).start == day(3)
    assert pipeline.run_range(con, source, start=day(6)).start == day(6)
    # the named choice
    pipeline.run_range(con, source, start=day(3), replay_deleted=True)
    n = storage.fetch_one(con, "SELECT count(*) FROM scored_events WHERE event_date = ?", [day(5)])
    assert n[0] == 0


def test_an_event_resent_on_another_day_was_stored_twice(chain):
    """An event of day 2 landed again in day 9's folder (with day 9's time): both paths refuse
    it, naming the day it is stored on, and write nothing."""
    con, source, tmp = chain
    d2 = pl.read_parquet(_file(tmp / "landing", 2)).head(1)
    d9 = pl.read_parquet(_file(tmp / "landing", 9))
    resent = d2.with_columns(pl.lit(d9["event_time"][0]).alias("event_time"))
    pl.concat([d9, resent]).write_parquet(_file(tmp / "landing", 9))
    before = _everything(con)
    key = f"stream {d2['stream'][0]!r}, event {d2['event_id'][0]}"
    with pytest.raises(
        InputError, match=rf"day {day(9)}, {key}: duplicate of the event stored on {day(2)}"
    ):
        pipeline.run_range(con, source)
    with pytest.raises(InputError, match=rf"day {day(9)}, {key}: duplicate"):
        pipeline.run_range(con, source, day(9), day(9))
    after = _everything(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_a_duplicate_within_one_transaction_was_not_caught(tmp_path):
    """Regression: the writer buffers rows across the days of a transaction, so day 9's read did
    not see day 8's events of the same transaction and an event landed on both days was stored
    twice. The read-back tables are sent to DuckDB before each day is read."""
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)
    d8 = events.filter(pl.col("event_time").dt.date() == day(8)).head(1)
    resent = d8.with_columns(pl.col("event_time") + dt.timedelta(days=1))
    storage.write_landing(pl.concat([events, resent]), tmp_path / "landing")
    source = storage.EventSource.parse(str(tmp_path / "landing"))
    con = storage.connect(tmp_path / "db.duckdb")
    try:  # the whole range is one transaction (TRANSACTION_ROWS is far above 10 small days)
        key = f"stream {d8['stream'][0]!r}, event {d8['event_id'][0]}"
        with pytest.raises(InputError, match=rf"day {day(9)}, {key}: duplicate of .* {day(8)}"):
            pipeline.run_range(con, source)
        assert storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0] == 0
    finally:
        con.close()
