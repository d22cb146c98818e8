"""calpipe.storage.landing: the landing folder layout (a day folder's files, one read of several files)."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import polars as pl
import pytest

from calpipe.errors import StoreError
from calpipe.storage.landing import (
    FILE_COLUMN,
    day_files,
    part_sql,
    part_where,
    read_parquet_files,
    stream_part,
    write_landing,
)


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


NAMES = ["a", "b", "it's", 'q"uote', "é", "", "x" * 40, None, "default", "s1", "s2", "s3"]


@pytest.mark.parametrize("k", [1, 2, 7, 256])
def test_part_where_reads_each_stream_in_exactly_the_part_stream_part_gives_it(tmp_path, k):
    """The rows DuckDB reads for part i (Parquet, by part_where on the stream column, or on the
    one stream of a source without one) are those whose names stream_part puts in part i: every
    row in one part, a null name too (the checks then find it there)."""
    rng = np.random.default_rng(k)
    names = pl.Series("stream", [NAMES[j] for j in rng.integers(0, len(NAMES), 3000)])
    frame = pl.DataFrame({"stream": names, "row": np.arange(names.len())})
    frame.write_parquet(tmp_path / "f.parquet")
    want = stream_part(names, k)
    assert want.dtype == np.uint8 and want.shape == (names.len(),) and want.max() < k
    seen = []
    with duckdb.connect() as con:
        for i in range(k):
            got = read_parquet_files(
                con, [tmp_path / "f.parquet"], part_where("stream", (i, k), "x")
            )
            assert (want[got["row"].to_numpy()] == i).all()
            seen.append(got["row"])
        one = [
            read_parquet_files(con, [tmp_path / "f.parquet"], part_where(None, (i, k), "default"))
            for i in range(k)
        ]
    rows = pl.concat(seen).sort()
    assert rows.to_list() == list(range(names.len()))  # each row once
    # without a stream column every row is in the part of the source's one stream
    assert [p.height for p in one] == [
        names.len() if i == stream_part(pl.Series(["default"]), k)[0] else 0 for i in range(k)
    ]


def test_stream_part_keeps_the_order_of_a_long_series():
    """One DuckDB scan of 300k names gives each name's part in the series' order (the same as
    each distinct name's part)."""
    rng = np.random.default_rng(2)
    names = pl.Series([f"stream-{j}" for j in rng.integers(0, 5000, 300_000)])
    got = stream_part(names, 13)
    distinct = names.unique()
    by_name = dict(zip(distinct.to_list(), stream_part(distinct, 13).tolist(), strict=True))
    assert got.tolist() == [by_name[n] for n in names.to_list()]


def test_a_part_outside_0_to_256_is_refused():
    assert part_sql("s", (0, 1)) == "hash(CAST(s AS VARCHAR)) % 1 = 0"
    assert part_where("s", None, "default") == "TRUE"
    for bad in [(1, 1), (-1, 3), (0, 257)]:
        with pytest.raises(ValueError, match="part must be"):
            part_sql("s", bad)
    with pytest.raises(ValueError, match="k must be"):
        stream_part(pl.Series(["a"]), 0)
