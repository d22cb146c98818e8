"""calpipe.landing: the landing folder layout (a day folder's files, one read of several files)."""

from __future__ import annotations

import datetime as dt

import duckdb
import polars as pl
import pytest

from calpipe.errors import StoreError
from calpipe.landing import FILE_COLUMN, day_files, read_parquet_files, write_landing


def test_read_parquet_files_numbers_each_row_s_file_in_the_given_order(tmp_path):
    """Each row's file as its index in the list (not a path string per row: ~600 MB of a
    10M-event read's peak), the files' rows in the list's order; a quote in a name is escaped."""
    names = ["b.parquet", "it's.parquet", "a.parquet"]
    for k, name in enumerate(names):
        pl.DataFrame({"x": [10 * k, 10 * k + 1], "y": ["p", "q"]}).write_parquet(tmp_path / name)
    files = [tmp_path / n for n in names]
    with duckdb.connect() as con:
        got = read_parquet_files(con, files)
    assert got.columns == ["x", "y", FILE_COLUMN]
    assert got.rows() == [
        (0, "p", 0), (1, "q", 0), (10, "p", 1), (11, "q", 1), (20, "p", 2), (21, "q", 2)
    ]  # fmt: skip
    assert got.schema[FILE_COLUMN] == pl.Int32


def test_day_files_reads_parquet_skips_markers_and_refuses_the_rest(tmp_path):
    write_landing(
        pl.DataFrame({"event_time": [dt.datetime(2024, 1, 2, 9)], "v": [1]}), tmp_path / "land"
    )
    day = tmp_path / "land" / "date=2024-01-02"
    (day / "_SUCCESS").touch()
    (day / ".part.crc").touch()
    pl.DataFrame({"v": [2]}).write_parquet(day / "more.PARQ")
    assert [f.name for f in day_files(day)] == ["events.parquet", "more.PARQ"]
    (day / "notes.txt").touch()
    with pytest.raises(StoreError, match=r"'notes\.txt' is not Parquet"):
        day_files(day)


def test_read_parquet_files_refuses_rows_it_cannot_give_a_file_and_no_files(tmp_path):
    """A path DuckDB reports otherwise than given (here a glob it expands) would leave rows
    without a file, hence without a day: an error, not NULL days."""
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "a.parquet")
    with duckdb.connect() as con:
        with pytest.raises(StoreError, match="named a file otherwise than it was given"):
            read_parquet_files(con, [tmp_path / "*.parquet"])
        with pytest.raises(ValueError, match="at least one file"):
            read_parquet_files(con, [])
