"""The tables ``calpipe spark-run`` writes, read back and compared with ``calpipe run``'s."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from calpipe import storage
from calpipe.spark_run import SPARK_TABLES


def read_table(out: Path, name: str) -> pl.DataFrame:
    """Table ``name`` under spark-run's ``out`` (a glob: Spark's .crc files break folder reads;
    the partition column from the folder names); None if no file holds it."""
    if not list((out / name).glob("**/*.parquet")):
        return None
    return pl.read_parquet(out / name / "**" / "*.parquet", hive_partitioning=True)


def exact(v):
    """A value compared bit for bit: a float by its hex form (-0.0 is not 0.0), lists by item."""
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, list):
        return [exact(x) for x in v]
    return v


def assert_same(got: pl.DataFrame, want: pl.DataFrame, key: list[str], what: str) -> None:
    """``got`` and ``want`` hold the same rows by ``key`` and, in every column of ``want``, the
    same values, floats bit for bit; the message names each column that differs and its first
    rows."""
    assert got.select(key).sort(key).equals(want.select(key).sort(key)), f"{what}: rows differ"
    assert not got.select(key).is_duplicated().any(), f"{what}: {key} is not a key"
    g, w = got.sort(key), want.sort(key)
    diffs = []
    for c in want.columns:
        a, b = g[c].to_list(), w[c].to_list()
        bad = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if exact(x) != exact(y)]
        if bad:
            keys = g.select(key)
            rows = "; ".join(
                f"{keys.row(i)}: spark-run {a[i]!r}, calpipe run {b[i]!r}" for i in bad[:3]
            )
            diffs.append(f"  {c}: {len(bad)} of {len(a)} rows, e.g. {rows}")
    assert not diffs, f"{what} differ:\n" + "\n".join(diffs)


def assert_tables_equal(out: Path, db: Path) -> dict[str, int]:
    """Every table spark-run wrote under ``out`` equals ``calpipe run``'s in the database
    ``db``: the same rows by the table's sort keys, every column of the DuckDB table, floats
    bit for bit. Returns each table's row count."""
    con = storage.connect(db)
    try:
        counts = {}
        for name in SPARK_TABLES:
            want = storage.query(con, f"SELECT * FROM {name}")
            got = read_table(out, name)
            counts[name] = want.height
            if got is None:
                assert want.height == 0, f"{name}: spark-run wrote no file, calpipe run has rows"
                continue
            missing = set(want.columns) - set(got.columns)
            assert not missing, f"{name}: spark-run lacks columns {missing}"
            # the types as stored, but the partition column's (its folder names' text)
            part = storage.LAYOUT[name].partition_column
            types = {c: (got.schema[c], t) for c, t in want.schema.items() if c != part}
            drift = {c: ts for c, ts in types.items() if ts[0] != ts[1]}
            assert not drift, f"{name}: column types (spark-run, calpipe run) differ: {drift}"
            got = got.select(want.columns).cast({part: want.schema[part]})
            assert_same(got, want, list(storage.LAYOUT[name].sort_keys), name)
        return counts
    finally:
        con.close()
