"""calpipe/pipeline/nightly.py: a big night read, checked and protected in parts of whole streams
(#12: a 10M-score + 10M-label night held at once peaked at 5x its Arrow size).

The oracle: the same nights in one part. Every table is equal (ORDER BY ALL), and the chain
equals one ``calpipe.protect`` pass, with late labels, K classes, a late scores day replayed with
quarantined labels, and table sources; a bad label in a part is refused with nothing written,
and a night whose parts do not add up to its files is refused.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from calpipe import generate, pipeline, storage
from calpipe.errors import InputError, StateError
from calpipe.pipeline import Settings, nightly
from calpipe.pipeline.inputs import run_inputs
from calpipe.pipeline.labels import LabelColumns, label_source
from calpipe.storage.landing import stream_part
from tests.pipeline.test_labels import (
    N_DAYS,
    T2,
    assert_chain_equals_one_pass,
    day,
    land_two_nights,
    run_nights,
    split_feed,
    with_classes,
    write_day,
)

#: More streams than the labels tests' three, so that every night has several non-empty parts.
STREAMS = tuple(
    generate.StreamSpec(f"s{i}", events_per_day=6 + 3 * i, drift="shift", drift_day=3)
    for i in range(7)
)


@pytest.fixture(scope="module")
def events():
    return generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11)


@pytest.fixture
def parts(monkeypatch):
    """Nights of more than 12 scores or labels run in parts; the parts of each night run are
    recorded (the comparisons check that parts did run)."""
    monkeypatch.setattr(nightly, "NIGHT_PART_ROWS", 12)
    seen: list[int] = []
    parts_of_night = nightly.parts_of_night

    def spy(inputs, d):
        seen.append(parts_of_night(inputs, d))
        return seen[-1]

    monkeypatch.setattr(nightly, "parts_of_night", spy)
    return seen


def _tables(con) -> dict[str, pl.DataFrame]:
    out = {}
    for t in storage.PARTITION_COLUMN:
        frame = storage.query(con, f"SELECT * FROM {t} ORDER BY ALL")
        out[t] = frame.drop("mtime_ns") if t == "pipeline_inputs" else frame
    return out


def _assert_same_tables(a, b) -> None:
    ta, tb = _tables(a), _tables(b)
    for t in ta:
        assert ta[t].equals(tb[t]), t


@pytest.mark.parametrize(("k", "late"), [(2, None), (4, 2)])
def test_a_night_in_parts_writes_the_rows_of_one_part(tmp_path, events, parts, k, late):
    """Late labels (reordered), K classes, and (late=2) a scores day landing two nights late:
    its labels quarantined as unknown, then replayed."""
    scores, labels, truth = split_feed(with_classes(events, k, seed=3), seed=6)
    kw = {"late": late, "on_unknown_label": "quarantine"} if late else {}
    parted, *_ = run_nights(tmp_path / "parts", scores, labels, method="composite-jumper", **kw)
    assert max(parts) >= 3 and len(parts) >= N_DAYS, parts  # (nights did run in parts)
    n_parted = len(parts)
    nightly.NIGHT_PART_ROWS = 10**9  # (restored by the fixture's monkeypatch)
    whole, *_ = run_nights(tmp_path / "whole", scores, labels, method="composite-jumper", **kw)
    try:
        assert set(parts[n_parted:]) == {1}
        _assert_same_tables(parted, whole)
        assert_chain_equals_one_pass(parted, truth, "composite-jumper")
        n = storage.query(parted, "SELECT count(*) AS n FROM event_labels")["n"][0]
        assert n == labels.height
    finally:
        parted.close()
        whole.close()


def test_table_sources_and_string_ids_in_parts(tmp_path, events, parts):
    """Scores and labels in tables of the database (the parts' condition on the table's rows)
    with other column names (the condition on the mapped stream column), string event ids in a
    new database (regression: a first part without events checked its empty labels' ids
    against the new database's integer default before a part with events set the type)."""
    ids = events.with_columns(pl.format("e-{}", "event_id").alias("event_id"))
    scores, labels, truth = split_feed(ids, seed=7)
    dbs = []
    for name, rows in (("parts", 12), ("whole", 10**9)):
        nightly.NIGHT_PART_ROWS = rows
        con = storage.connect(tmp_path / f"{name}.duckdb")
        con.register("s", scores.rename({"stream": "model"}).to_arrow())
        con.register("l", labels.rename({"stream": "model"}).to_arrow())
        con.execute("CREATE TABLE landed AS SELECT * FROM s")
        con.execute("CREATE TABLE arrived AS SELECT * FROM l")
        src = storage.EventSource.parse("landed", storage.ColumnMap(stream="model"))
        lsrc = label_source("arrived", LabelColumns(stream="model"))
        pipeline.run_range(con, src, labels=lsrc, settings=Settings.make("composite-jumper"))
        dbs.append(con)
    try:
        assert max(parts[:N_DAYS]) >= 3 and set(parts[N_DAYS:]) == {1}, parts
        for t in ("landed", "arrived"):
            dbs[0].execute(f"DROP TABLE {t}")
            dbs[1].execute(f"DROP TABLE {t}")
        _assert_same_tables(*dbs)
        assert_chain_equals_one_pass(dbs[0], truth, "composite-jumper")
    finally:
        for con in dbs:
            con.close()


def _two_nights(tmp: Path, events):
    """Days 0-1 run with their labels; day 2's scores and labels landed."""
    return land_two_nights(tmp, events, seed=8, label_days=3)[:4]


def test_a_bad_label_in_a_part_is_refused_and_nothing_is_written(tmp_path, events, parts):
    """An unknown event's label in night 2's last part: the parts before it ran and sent their
    rows to DuckDB; the error names file, stream, event and rule, and the day's transaction
    keeps nothing of them."""
    con, src, lsrc, scores = _two_nights(tmp_path, events)
    try:
        before = _tables(con)
        n_before = len(parts)
        folder = tmp_path / "labels" / f"date={day(2).isoformat()}"

        def land_bad(stream: str) -> None:
            pl.DataFrame(
                [{"stream": stream, "event_id": 10**9, "label": 1, "label_time": T2}],
                schema={"stream": pl.String, "event_id": pl.Int64, "label": pl.Int32,
                        "label_time": pl.Datetime("us")},
            ).write_parquet(folder / "bad.parquet")  # fmt: skip

        land_bad("s0")  # (counted in the night's rows, which set its number of parts)
        k = nightly.parts_of_night(run_inputs(con, src, lsrc, day(2), day(2)), day(2))
        n_before = len(parts)  # (the call above is counted too)
        names = scores.filter(pl.col("event_time").dt.date() == day(2))["stream"].unique()
        part = stream_part(names, k)
        last = names[int(part.argmax())]  # a stream of the night's last non-empty part
        land_bad(last)
        with pytest.raises(InputError) as e:
            pipeline.run_range(con, src, labels=lsrc)
        assert parts[n_before:] == [k] and part.max() > 0
        msg = str(e.value)
        assert "bad.parquet" in msg and f"stream {last!r}, event 1000000000" in msg, msg
        assert "label of an unknown event" in msg, msg
        after = _tables(con)
        for t in before:
            assert after[t].equals(before[t]), t
        assert not _spools(tmp_path / "db.duckdb")  # (the failed night's spools removed)
    finally:
        con.close()


def _spools(db: Path) -> list[Path]:
    """The part spools in ``db``'s spill folder (storage.PartSpool)."""
    return list(Path(f"{db}.tmp").glob("calpipe-parts-*"))


def test_a_night_in_parts_reads_its_files_once_and_leaves_no_spool(
    tmp_path, events, parts, monkeypatch
):
    """Each night in parts reads its scores and its labels once, split into its parts
    (storage.PartSpool, in the database's spill folder), not once per part; every row read is
    in one part, and no spool is left after the run."""
    made: list[tuple[int, int]] = []
    create = storage.PartSpool.create

    def spy(*args, **kw):
        spool = create(*args, **kw)
        made.append((spool.k, spool.rows))
        return spool

    monkeypatch.setattr(storage.PartSpool, "create", spy)
    scores, labels, _ = split_feed(events, seed=6)
    con, *_ = run_nights(tmp_path, scores, labels, method="composite-jumper")
    try:
        in_parts = [k for k in parts if k > 1]
        assert len(in_parts) >= 3
        # per night in parts: its scores and its labels, each read once into its k parts
        assert len(made) == 2 * len(in_parts)
        assert sorted({k for k, _ in made}) == sorted(set(in_parts))
        n_rows = sum(n for _, n in made)
        stored = storage.query(
            con,
            "SELECT (SELECT count(*) FROM scored_events) + (SELECT count(*) FROM event_labels) n",
        )["n"][0]
        assert n_rows <= stored and n_rows > 0
        assert not _spools(tmp_path / "db.duckdb")
    finally:
        con.close()


def test_a_night_in_parts_whose_spill_folder_cannot_be_made_is_refused_and_nothing_is_written(
    tmp_path, events, parts
):
    """DuckDB's temp_directory names a file: the night's spool (storage.PartSpool) cannot be
    made; the error names the folder and what to do, and the day's transaction keeps
    nothing."""
    con, src, lsrc, _ = _two_nights(tmp_path, events)
    con.close()  # (DuckDB sets its temp_directory only before it has spilled)
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        before = _tables(con)
        assert before["scored_events"].height > 0  # (the two nights before, stored)
        (tmp_path / "not-a-folder").write_text("a file")
        con.execute(f"SET temp_directory = '{tmp_path / 'not-a-folder'}'")
        n_before = len(parts)
        with pytest.raises(storage.StoreError) as e:
            pipeline.run_range(con, src, labels=lsrc)
        assert max(parts[n_before:]) > 1  # (the night ran in parts)
        msg = str(e.value)
        assert "spools its read in" in msg and "not-a-folder" in msg, msg
        assert "temp_directory" in msg, msg
        after = _tables(con)
        for t in before:
            assert after[t].equals(before[t]), t
    finally:
        con.close()


def test_a_night_whose_parts_miss_a_row_of_its_files_is_refused(
    tmp_path, events, parts, monkeypatch
):
    """The parts' rows must add up to the rows the night's files hold (every row in exactly one
    part): a night that read fewer (here: its files counted one more) is an error, and nothing
    of it is written."""
    con, src, lsrc, _ = _two_nights(tmp_path, events)
    recorded = nightly.recorded_rows
    monkeypatch.setattr(
        nightly, "recorded_rows",
        lambda inputs, d, kind: recorded(inputs, d, kind) + (kind == "scores" and d == day(2)),
    )  # fmt: skip
    try:
        before = _tables(con)
        with pytest.raises(StateError, match=rf"day {day(2)}: its \d+ parts read \d+ events"):
            pipeline.run_range(con, src, labels=lsrc)
        after = _tables(con)
        for t in before:
            assert after[t].equals(before[t]), t
    finally:
        con.close()


def test_a_stream_read_into_another_part_is_refused():
    """DuckDB picks a part's rows by the stream name as it reads it, the pipeline splits the
    state by polars' name: a stream whose two names differ would be in two parts."""
    names = pl.Series(["a", "b", "c", "d", "e"])
    k = 4
    part = stream_part(names, k)
    nightly.check_part(names.filter(pl.Series(part == part[0])), (int(part[0]), k), "x")
    wrong = (int(part[0]) + 1) % k
    with pytest.raises(StateError, match=f"x: stream 'a' was read as part {wrong} of 4"):
        nightly.check_part(names[:1], (wrong, k), "x")


def test_a_night_whose_files_have_no_recorded_count_runs_in_parts_unchecked(
    tmp_path, events, parts, monkeypatch
):
    """A file recorded without a row count (None): the night is sized by the counts it has and
    its parts' total is not compared with a count it does not have."""
    con, src, lsrc, _ = _two_nights(tmp_path, events)
    recorded = nightly.recorded_rows
    monkeypatch.setattr(
        nightly, "recorded_rows",
        lambda inputs, d, kind: None if kind == "scores" else recorded(inputs, d, kind),
    )  # fmt: skip
    try:
        n_before = len(parts)
        pipeline.run_range(con, src, labels=lsrc)
        assert parts[n_before:] and min(parts[n_before:]) > 1, parts  # (sized by the labels)
        n = storage.query(
            con, "SELECT count(*) AS n FROM scored_events WHERE event_date = ?", [day(2)]
        )
        assert n["n"][0] > 0
    finally:
        con.close()


def test_a_float_stream_column_that_duckdb_spells_otherwise_is_refused(tmp_path, events, parts):
    """A stream column of floats: DuckDB reads the part of ``1e-07``, polars names the stream
    ``1e-7`` (and splits the state by that name): refused naming the stream, nothing written."""
    names = {f"s{i}": (i + 1) * 1e-7 for i in range(7)}
    scores = events.with_columns(pl.col("stream").replace_strict(names, return_dtype=pl.Float64))
    storage.write_landing(scores, tmp_path / "scores")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        before = _tables(con)
        with pytest.raises(StateError, match=r"stream '\de-7' was read as part \d+ of \d+"):
            pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "scores")))
        after = _tables(con)
        for t in before:
            assert after[t].equals(before[t]), t
    finally:
        con.close()


def test_a_big_night_after_a_stored_chain_of_empty_days_sets_its_types_in_its_transaction(
    tmp_path, events, parts
):
    """A chain whose stored days had no events has no id type stored yet: its first big night
    (string ids, in parts) sets it. The parts' reads once went through the committed reader,
    which then altered the id column outside the night's transaction (a DuckDB transaction
    conflict on the night's first INSERT)."""
    ids = events.with_columns(pl.format("e-{}", "event_id").alias("event_id"))
    landing = tmp_path / "scores"
    empty = landing / f"date={day(0).isoformat()}"
    empty.mkdir(parents=True)
    ids.head(0).write_parquet(empty / "events.parquet")
    write_day(ids, landing, day(1), "event_time")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        src = storage.EventSource.parse(str(landing))
        pipeline.run_range(con, src, end=day(0))
        assert storage.query(con, "SELECT count(*) AS n FROM calibrator_state")["n"][0] == 0
        pipeline.run_range(con, src)
        assert parts[-1] >= 2, parts  # (the night ran in parts)
        n = storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0]
        assert n == ids.filter(pl.col("event_time").dt.date() == day(1)).height
        assert (
            storage.query(con, "SELECT typeof(event_id) AS t FROM scored_events LIMIT 1")["t"][0]
            == "VARCHAR"
        )
    finally:
        con.close()


@pytest.fixture
def reads(monkeypatch):
    """The connection each read of the events went through, in order (a new database's parts
    read ahead go through one of their own, not the run's)."""
    seen: list = []
    read_source = nightly.read_source

    def spy(con, *args, **kw):
        seen.append(con)
        return read_source(con, *args, **kw)

    monkeypatch.setattr(nightly, "read_source", spy)
    return seen


@pytest.mark.parametrize(("k", "string_ids"), [(2, False), (2, True), (4, False)])
def test_a_new_databases_first_night_reads_its_parts_ahead_and_writes_one_parts_rows(
    tmp_path, events, parts, reads, k, string_ids
):
    """A new database's first night (no label feed) reads its parts after the first ahead,
    through a connection of their own: the same tables as one part, string ids (the first
    part switches the id column inside the night's transaction) and K classes included."""
    scores = with_classes(events, k, seed=3)
    if string_ids:
        scores = scores.with_columns(pl.format("e-{}", "event_id").alias("event_id"))
    dbs = []
    for name, rows in (("parts", 12), ("whole", 10**9)):
        nightly.NIGHT_PART_ROWS = rows
        landing = tmp_path / name / "scores"
        for i in range(N_DAYS):
            write_day(scores, landing, day(i), "event_time")
        con = storage.connect(tmp_path / name / "db.duckdb")
        reads.clear()
        pipeline.run_range(con, storage.EventSource.parse(str(landing)), end=day(0),
                           settings=Settings.make("composite-experts"))  # fmt: skip
        own = sum(c is con for c in reads)  # the first night's reads through the run's connection
        if name == "parts":  # the first part, and parts without events (read again there)
            assert parts[0] >= 3 and own < parts[0] and len(reads) > own, (parts, own)
        # the next nights resume the chain: their parts are read through the committed reader
        pipeline.run_range(con, storage.EventSource.parse(str(landing)),
                           settings=Settings.make("composite-experts"))  # fmt: skip
        dbs.append(con)
    try:
        _assert_same_tables(*dbs)
    finally:
        for con in dbs:
            con.close()


def test_a_bad_event_in_a_part_read_ahead_is_refused_and_nothing_is_written(
    tmp_path, events, parts, reads
):
    """A score out of [0, 1] in the first night's last part of a new database: refused with
    the day, stream and event, nothing written (the parts before it were protected and
    sent to the writer)."""
    first = events.filter(pl.col("event_time").dt.date() == day(0))
    k = -(-first.height // 12)  # (the night's parts: nightly.parts_of_night)
    names = first["stream"].unique().sort()
    later = names.filter(pl.Series(stream_part(names, k) > 0))
    assert later.len(), "every stream in the first part: the test would not read ahead"
    bad_stream = later[-1]
    row = first.with_row_index().filter(pl.col("stream") == bad_stream)["index"][-1]
    first = first.with_columns(
        pl.when(pl.int_range(pl.len()) == row).then(1.5).otherwise(pl.col("score")).alias("score")
    )
    landing = tmp_path / "scores"
    write_day(first, landing, day(0), "event_time")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        with pytest.raises(InputError, match=rf"day {day(0)}.*{bad_stream}"):
            pipeline.run_range(con, storage.EventSource.parse(str(landing)))
        assert any(c is not con for c in reads)  # (parts were read ahead)
        for t in ("scored_events", "protected_scores", "calibrator_state", "pipeline_days"):
            assert storage.query(con, f"SELECT count(*) AS n FROM {t}")["n"][0] == 0, t
    finally:
        con.close()
