"""calpipe/storage/parts.py: a big night's read once, split into its parts on disk.

The oracle: each part's filtered query (``part_where``), which the nights ran before the
spool. Every part of a spool equals it (rows, order, columns and types), for landing files
(each row's file numbered), a table source with parameters, K-class list columns, nulls and a
one-stream source; a spool leaves nothing behind when closed, and one of a killed run is
removed by the next.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from calpipe import storage
from calpipe.errors import StoreError
from calpipe.pipeline.labels import LabelColumns, label_source, read_arrivals, spool_arrivals
from calpipe.storage import PartSpool, spill_folder
from calpipe.storage.landing import part_where

DAY = dt.date(2024, 3, 2)


def _rows(n: int, n_streams: int, seed: int, k_class: bool = False) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame({
        "stream": [None if s < 0 else f"s{s}" for s in rng.integers(-1, n_streams, n)],
        "event_id": np.arange(n, dtype=np.int64),
        "event_time": np.datetime64("2024-03-02T00:00:00", "us")
        + np.sort(rng.integers(0, 86_400_000_000, n)).astype("timedelta64[us]"),
        "score": rng.uniform(0, 1, n),
        "label": pl.Series(rng.integers(0, 2, n), dtype=pl.Int32),
    })  # fmt: skip
    if k_class:
        p = rng.dirichlet(np.ones(3), n)
        frame = frame.drop("score").with_columns(pl.Series("scores", p.tolist()))
    return frame


def _landing(tmp_path, frames: list[pl.DataFrame]) -> storage.EventSource:
    """``frames`` as the files of one day folder."""
    sub = tmp_path / "landing" / f"date={DAY.isoformat()}"
    sub.mkdir(parents=True)
    for i, f in enumerate(frames):
        f.write_parquet(sub / f"part-{i}.parquet")
    return storage.EventSource.parse(str(tmp_path / "landing"))


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("k_class", [False, True])
def test_each_part_of_a_spooled_landing_day_equals_its_filtered_read(tmp_path, k, k_class):
    """Three files (each row's file numbered), null stream names, K-class list columns."""
    frames = [_rows(n, 9, seed=n, k_class=k_class) for n in (500, 1, 1200)]
    src = _landing(tmp_path, frames)
    con = storage.connect(tmp_path / "db.duckdb")
    with src.spool_range(con, DAY, DAY, k, tmp_path / "spill") as spool:
        assert spool.rows == sum(f.height for f in frames)
        for i in range(k):
            assert_frame_equal(src.read_range(con, DAY, DAY, (i, k), spool),
                               src.read_range(con, DAY, DAY, (i, k)))  # fmt: skip
        folder = spool.folder
        assert folder.parent == tmp_path / "spill" and folder.exists()
    assert not folder.exists()  # (closed: removed, and the folder it made: empty)
    assert not (tmp_path / "spill").exists()
    con.close()


def test_a_spooled_table_source_equals_its_filtered_read_on_another_stream_column(tmp_path):
    """A table of the database, its stream column named otherwise, the range's days as
    parameters: the rows of other days stay out."""
    rows = _rows(3000, 20, seed=4).rename({"stream": "model"})
    later = rows.with_columns(pl.col("event_time") + pl.duration(days=1))
    con = storage.connect(tmp_path / "db.duckdb")
    con.register("r", pl.concat([rows, later]).to_arrow())
    con.execute("CREATE TABLE landed AS SELECT * FROM r")
    src = storage.EventSource.parse("landed", storage.ColumnMap(stream="model"))
    with src.spool_range(con, DAY, DAY, 5, tmp_path / "spill") as spool:
        assert spool.rows == rows.height
        for i in range(5):
            assert_frame_equal(src.read_range(con, DAY, DAY, (i, 5), spool),
                               src.read_range(con, DAY, DAY, (i, 5)))  # fmt: skip
    con.close()


def test_spooled_labels_equal_their_filtered_read_with_each_label_s_file(tmp_path):
    """A label feed's landing day of two files (each label named by its file) and a feed of
    one stream (no stream column: every label in the default stream's part)."""
    rng = np.random.default_rng(2)
    sub = tmp_path / "labels" / f"date={DAY.isoformat()}"
    sub.mkdir(parents=True)
    for i, n in enumerate((700, 300)):
        pl.DataFrame({
            "stream": [f"s{s}" for s in rng.integers(0, 11, n)],
            "event_id": rng.permutation(n).astype(np.int64),
            "label": rng.integers(0, 2, n),
            "label_time": [dt.datetime(2024, 3, 2, 12)] * n,
        }).write_parquet(sub / f"f{i}.parquet")  # fmt: skip
    con = storage.connect(tmp_path / "db.duckdb")
    for columns in (LabelColumns(), LabelColumns(stream=None)):
        lsrc = label_source(str(tmp_path / "labels"), columns)
        spool = spool_arrivals(con, lsrc, DAY, 4, tmp_path / "spill")
        try:
            assert spool.rows == 1000
            for i in range(4):
                assert_frame_equal(read_arrivals(con, lsrc, DAY, (i, 4), spool),
                                   read_arrivals(con, lsrc, DAY, (i, 4)))  # fmt: skip
        finally:
            spool.close()
    assert spool_arrivals(con, lsrc, DAY + dt.timedelta(days=1), 4, tmp_path / "spill") is None
    con.close()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 400),
    n_streams=st.integers(1, 30),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_a_spool_s_parts_are_the_query_s_rows_split_by_part_in_order(n, n_streams, k, seed):
    """Any rows, any k: each part equals the query filtered by ``part_where``, in order; an
    empty part is an empty frame of the query's columns and types."""
    import tempfile

    rows = _rows(n, n_streams, seed)
    with duckdb.connect() as con, tempfile.TemporaryDirectory() as tmp:
        con.register("r", rows.to_arrow())
        with PartSpool.create(con, "SELECT * FROM r", '"stream"', k, tmp) as spool:
            assert spool.rows == n
            for i in range(k):
                want = con.sql(f"SELECT * FROM r WHERE {part_where('stream', (i, k), '')}").pl()
                assert_frame_equal(spool.read(i), want)


def test_a_part_of_another_number_of_parts_than_the_spool_s_is_refused(tmp_path):
    src = _landing(tmp_path, [_rows(50, 4, seed=1)])
    con = storage.connect(tmp_path / "db.duckdb")
    with src.spool_range(con, DAY, DAY, 3, tmp_path / "spill") as spool:
        for part in ((0, 4), None):
            with pytest.raises(ValueError, match="spooled in 3 parts"):
                src.read_range(con, DAY, DAY, part, spool)
    con.close()


def test_a_closed_spool_refuses_to_read_and_a_bad_part_is_refused(tmp_path):
    con = duckdb.connect()
    spool = PartSpool.create(con, "SELECT 'a' AS stream, 1 AS x", "stream", 2, tmp_path)
    with pytest.raises(ValueError, match="part 2 of a spool of 2 parts"):
        spool.read(2)
    spool.close()
    with pytest.raises(StoreError, match="were removed"):
        spool.read(0)
    with pytest.raises(ValueError, match=r"k must be in 1\.\.256"):
        PartSpool.create(con, "SELECT 'a' AS stream", "stream", 0, tmp_path)


def test_a_failed_spool_read_leaves_no_folder(tmp_path):
    con = duckdb.connect()
    with pytest.raises(duckdb.Error):
        PartSpool.create(con, "SELECT error('bad row') AS stream", "stream", 3, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_spool_keeps_a_spill_folder_it_did_not_make_or_that_holds_other_files(tmp_path):
    con = duckdb.connect()
    (tmp_path / "spill").mkdir()
    with PartSpool.create(con, "SELECT 'a' AS stream", "stream", 2, tmp_path / "spill"):
        pass
    assert (tmp_path / "spill").is_dir()  # (there before)
    with PartSpool.create(con, "SELECT 'a' AS stream", "stream", 2, tmp_path / "new") as spool:
        (tmp_path / "new" / "duckdb_temp_block").write_text("DuckDB's spill")
    assert not spool.folder.exists() and (tmp_path / "new" / "duckdb_temp_block").exists()


def test_a_spill_folder_that_cannot_be_made_is_a_store_error_naming_it(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(StoreError, match=r"spools its read in .*taken.*temp_directory"):
        PartSpool.create(duckdb.connect(), "SELECT 'a' AS stream", "stream", 2, tmp_path / "taken")


def test_a_killed_run_s_spool_is_removed_by_the_next_one(tmp_path):
    """The folder of a process that no longer runs goes; a running process's stays."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / f"calpipe-parts-{dead}-x").mkdir()
    (tmp_path / f"calpipe-parts-{os.getppid()}-y").mkdir()  # (alive: the test runner's parent)
    con = duckdb.connect()
    with PartSpool.create(con, "SELECT 'a' AS stream", "stream", 2, tmp_path) as spool:
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == sorted([f"calpipe-parts-{os.getppid()}-y", spool.folder.name])


def test_a_database_spills_next_to_its_file_unless_told_otherwise(tmp_path):
    con = storage.connect(tmp_path / "x.duckdb")
    assert spill_folder(con) == (tmp_path / "x.duckdb.tmp").resolve()
    con.execute(f"SET temp_directory = '{tmp_path / 'elsewhere'}'")
    assert spill_folder(con) == (tmp_path / "elsewhere").resolve()
    con.close()
