"""The canonical form of a table's rows, their digests, and the comparison with committed ones.

A table is compared as its columns (names and types, in order) and its rows in a canonical
order: sorted by the table's sort keys (:data:`calpipe.storage.SORT_KEYS`; no calpipe table defines
a physical row order, ``storage.read_partitions`` reads them in this one), ties broken by the
row's canonical bytes. Each row is the concatenation of its fields, each field
self-delimiting and independent of the library that read it:

==========================  ================================================================
value                       bytes
==========================  ================================================================
NULL (any type)             ``N`` + 8 zero bytes
float (DOUBLE)              ``F`` + its IEEE 754 binary64 bit pattern, big-endian (NaN
                            payloads, -0.0 kept: compared bit for bit)
integer (any width)         ``I`` + int64 big-endian two's complement
boolean                     ``B`` + int64 0 or 1
DATE                        ``D`` + days since 1970-01-01 as int64
TIMESTAMP (no zone)         ``T`` + microseconds since 1970-01-01 as int64
string                      ``S`` + UTF-8 length as int64 + the UTF-8 bytes
list                        ``L`` + its length as int64 + its elements' fields
==========================  ================================================================

A table's digest per day (its partition column; ``*`` for a table without one) is the SHA-256
of that day's fields column after column (each column's fields in the canonical row order); a
column's digest is the SHA-256 of its fields over all rows. The column types are compared separately, as the database names them (DuckDB's
``duckdb_columns()``) or as the Parquet schema reads (Spark's output).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_NULL = b"N" + bytes(8)
_I64 = struct.Struct(">q")
_EPOCH = dt.datetime(1970, 1, 1)
#: how many differences a comparison names in detail per table (then it counts them)
DETAIL = 3


# ----------------------------------------------------------------------------------------------
# A captured table
# ----------------------------------------------------------------------------------------------
@dataclass
class Captured:
    """A table as read: ``columns`` (name, type as the source names it), the row order's
    ``keys``, the ``day`` column whose values split it into days (None: one part, ``*``) and
    its rows ``data`` (normalized, :data:`NORMALIZED`)."""

    name: str
    columns: list[tuple[str, str]]
    keys: tuple[str, ...]
    day: str | None
    data: pa.Table


def read_duckdb(con, name: str, keys: Iterable[str], day: str | None) -> Captured:
    """Table or view ``name`` of a DuckDB connection, with its DuckDB column types."""
    columns = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
        "ORDER BY column_index",
        [name],
    ).fetchall()
    data = con.sql(f'SELECT * FROM "{name}"').to_arrow_table()
    return Captured(name, [(c, t) for c, t in columns], tuple(keys), day, data)


def read_partitioned_parquet(root: Path, name: str, keys: Iterable[str], day: str) -> Captured:
    """A Parquet table partitioned hive-style by ``day`` (``root/day=YYYY-MM-DD/*.parquet``, as
    Spark writes it): every data file of every partition, the partition as a DATE column first;
    the column types are the files' Parquet schema as pyarrow reads it."""
    parts = []
    for folder in sorted(root.glob(f"{day}=*")):
        d = dt.date.fromisoformat(folder.name.split("=", 1)[1])
        for f in sorted(folder.glob("*.parquet")):
            t = pq.read_table(f)
            parts.append(t.add_column(0, day, pa.array([d] * t.num_rows, pa.date32())))
    if not parts:
        raise AssertionError(f"{root}: no {day}=* partitions")
    data = pa.concat_tables(parts)
    columns = [(f.name, str(f.type)) for f in data.schema]
    return Captured(name, columns, tuple(keys), day, data)


# ----------------------------------------------------------------------------------------------
# Normalization: the values that legitimately differ between two runs of the same scenario
# ----------------------------------------------------------------------------------------------
@dataclass
class Context:
    """What a normalizer may look at: the scenario's temporary folder ``root`` (replaced by
    ``$ROOT`` in stored paths) and its landing folders by ``pipeline_inputs.kind``."""

    root: Path
    landings: dict[str, Path] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _landing_file(ctx: Context, row: dict) -> Path | None:
    root = ctx.landings.get(row["kind"])
    return None if root is None or not row["file"] else root / row["file"]


def _inputs_size(row: dict, ctx: Context):
    path = _landing_file(ctx, row)
    if path is not None and row["size_bytes"] == path.stat().st_size:
        return 0
    return row["size_bytes"]


def _inputs_mtime(row: dict, ctx: Context):
    path = _landing_file(ctx, row)
    if path is not None and row["mtime_ns"] == path.stat().st_mtime_ns:
        return 0
    return row["mtime_ns"]


def _inputs_hash(row: dict, ctx: Context):
    path = _landing_file(ctx, row)
    if path is not None and row["content_hash"] == _sha256(path):
        return "sha256 of the file"
    return row["content_hash"]


def _meta_value(row: dict, ctx: Context):
    if row["key"] == "sql_hash":
        return "excluded"
    value = row["value"]
    for root in {str(ctx.root.resolve()), str(ctx.root)}:
        value = value.replace(root, "$ROOT")
    return value


#: (table, column) -> (what it becomes, why, the function of (row, context) that normalizes
#: it). Every other column of every table is compared exactly.
NORMALIZED: dict[tuple[str, str], tuple[str, str, Callable[[dict, Context], object]]] = {
    ("pipeline_inputs", "mtime_ns"): (
        "0 where it equals the landing file's `st_mtime_ns` now, else kept",
        "wall-clock time at which the scenario wrote the file",
        _inputs_mtime,
    ),
    ("pipeline_inputs", "size_bytes"): (
        "0 where it equals the landing file's size now, else kept",
        "the Parquet writer's output size (polars version, compression), not calpipe's",
        _inputs_size,
    ),
    ("pipeline_inputs", "content_hash"): (
        "`sha256 of the file` where it equals the SHA-256 of the landing file's bytes now, "
        "else kept",
        "a hash of the Parquet writer's bytes (they embed the writer's version)",
        _inputs_hash,
    ),
    ("calpipe_meta", "value"): (
        "`events`, `labels`: the scenario's temporary folder replaced by `$ROOT`; "
        "`sql_hash`: `excluded`",
        "absolute temporary paths; `sql_hash` is a hash of the text of `sql/*.sql` (which "
        "#32 splits into files), the marker that re-installs the SQL layer, not a result",
        _meta_value,
    ),
}


def normalize(t: Captured, ctx: Context) -> Captured:
    """``t`` with the :data:`NORMALIZED` columns of its table replaced (same types)."""
    fns = {c: fn for (table, c), (_, _, fn) in NORMALIZED.items() if table == t.name}
    if not fns or t.data.num_rows == 0:
        return t
    rows = t.data.to_pylist()
    new = [{**r, **{c: fn(r, ctx) for c, fn in fns.items()}} for r in rows]
    data = pa.Table.from_pylist(new, schema=t.data.schema)
    return Captured(t.name, t.columns, t.keys, t.day, data)


# ----------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------
@dataclass
class Column:
    """A column's canonical fields, one after the other in ``buf``; field ``i`` is
    ``buf[off[i]:off[i + 1]]``."""

    buf: np.ndarray  # uint8
    off: np.ndarray  # int64, one more than the rows
    width: int | None = None  # every field's size, if they all have one

    def field(self, i: int) -> bytes:
        return self.buf[self.off[i] : self.off[i + 1]].tobytes()

    def span(self, a: int, b: int) -> bytes:
        """The fields of rows [a, b)."""
        return self.buf[self.off[a] : self.off[b]].tobytes()

    def take(self, rows: np.ndarray) -> Column:
        """The fields of ``rows``, in that order."""
        if self.width is not None:
            buf = self.buf.reshape(-1, self.width)[rows].reshape(-1)
            return Column(buf, np.arange(len(rows) + 1, dtype=np.int64) * self.width, self.width)
        sizes = self.off[1:][rows] - self.off[:-1][rows]
        return Column(self.buf[_ranges(self.off[:-1][rows], sizes)], _offsets(sizes))


def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The indices start, start + 1, ..., start + size - 1 of each (start, size), in order."""
    starts, sizes = starts.astype(np.int64), sizes.astype(np.int64)
    total = int(sizes.sum())
    first = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.repeat(starts, sizes) + (np.arange(total, dtype=np.int64) - first)


def _fixed(tag: bytes, values: np.ndarray, null: np.ndarray) -> Column:
    """9-byte fields of 8-byte values (viewed as unsigned, big-endian), NULL where ``null``."""
    n = values.shape[0]
    buf = np.zeros((n, 9), np.uint8)
    buf[:, 0] = tag[0]
    buf[:, 1:] = values.view(np.uint64).astype(">u8").view(np.uint8).reshape(n, 8)
    buf[null] = np.frombuffer(_NULL, np.uint8)
    return Column(buf.reshape(-1), np.arange(n + 1, dtype=np.int64) * 9, 9)


def _headed(tag: bytes, count: np.ndarray, null: np.ndarray, body: Column) -> Column:
    """Fields of a tag, an int64 ``count`` and the bytes of ``body``'s row (NULL: the null
    field alone): strings (count = bytes) and lists (count = elements)."""
    n = null.shape[0]
    head = _fixed(tag, np.where(null, 0, count).astype(np.int64), null)
    body_sizes = np.where(null, 0, np.diff(body.off))
    sizes = 9 + body_sizes
    off = _offsets(sizes)
    buf = np.empty(int(off[-1]), np.uint8)
    buf[_ranges(off[:-1], np.full(n, 9))] = head.buf
    buf[_ranges(off[:-1] + 9, body_sizes)] = body.buf[_ranges(body.off[:-1], body_sizes)]
    return Column(buf, off)


def _null_mask(arr: pa.Array) -> np.ndarray:
    return arr.is_null().to_numpy(zero_copy_only=False).astype(bool)


def column(arr: pa.Array | pa.ChunkedArray) -> Column:
    """The canonical fields of the values of ``arr`` (module docstring)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    t = arr.type
    if len(arr) == 0:
        return Column(np.zeros(0, np.uint8), np.zeros(1, np.int64))
    null = _null_mask(arr)
    if pa.types.is_floating(t):
        values = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        return _fixed(b"F", np.ascontiguousarray(values, np.float64), null)
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        values = pc.fill_null(arr.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        tag = b"B" if pa.types.is_boolean(t) else b"I"
        return _fixed(tag, np.ascontiguousarray(values, np.int64), null)
    if pa.types.is_date(t):
        days = pc.fill_null(arr.cast(pa.date32()).cast(pa.int32()), 0).cast(pa.int64())
        return _fixed(b"D", days.to_numpy(zero_copy_only=False), null)
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            raise TypeError(f"a timestamp with a time zone ({t}): not a calpipe type")
        us = pc.fill_null(arr.cast(pa.timestamp("us")).cast(pa.int64()), 0)
        return _fixed(b"T", us.to_numpy(zero_copy_only=False), null)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        arr = arr.cast(pa.large_string())
        offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + len(arr) + 1]
        data = arr.buffers()[2]
        raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        body = Column(raw, offsets.astype(np.int64))
        return _headed(b"S", np.diff(body.off), null, body)
    if pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        arr = arr.cast(pa.list_(t.value_type))
        t = arr.type
    if pa.types.is_list(t):
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        child = column(arr.values)  # every element of the child array (offsets index it)
        body = Column(child.buf, child.off[offsets])
        return _headed(b"L", np.diff(offsets), null, body)
    raise TypeError(f"no canonical form for the Arrow type {t}")


def fields(arr: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """The canonical field of each value of ``arr``, one by one."""
    c = column(arr)
    return [c.field(i) for i in range(len(c.off) - 1)]


@dataclass
class Encoded:
    """A :class:`Captured` table in canonical form: its columns' fields in the canonical order
    (``order``: the rows of ``captured.data`` in it) and each day's rows [a, b) in it (days are
    contiguous: the day is the first sort key)."""

    captured: Captured
    columns: dict[str, Column]
    spans: dict[str, tuple[int, int]]
    order: np.ndarray

    @property
    def name(self) -> str:
        return self.captured.name

    @property
    def n_rows(self) -> int:
        return len(self.order)

    def row(self, i: int) -> bytes:
        return b"".join(c.field(i) for c in self.columns.values())

    def field(self, column: str, i: int) -> bytes:
        return self.columns[column].field(i)

    def day_digests(self) -> dict[str, tuple[int, str]]:
        """Each day's (rows, SHA-256 of its fields column after column)."""
        out = {}
        for d, (a, b) in self.spans.items():
            h = hashlib.sha256()
            for c in self.columns.values():
                h.update(c.span(a, b))
            out[d] = (b - a, h.hexdigest())
        return out

    def column_digests(self) -> dict[str, str]:
        return {n: hashlib.sha256(c.buf.tobytes()).hexdigest() for n, c in self.columns.items()}

    def value(self, column: str, i: int):
        """The Python value of ``column`` at canonical row ``i`` (for messages)."""
        return self.captured.data.column(column)[int(self.order[i])].as_py()

    def key(self, i: int) -> dict:
        return {k: self.value(k, i) for k in self.captured.keys}


def _day_text(v) -> str:
    return "*" if v is None else v.isoformat() if hasattr(v, "isoformat") else str(v)


def encode(t: Captured) -> Encoded:
    """The canonical form of ``t``: rows sorted by (day, keys) (strings by their UTF-8 bytes,
    NULL last), ties by the rows' bytes."""
    data = t.data
    names = [c for c, _ in t.columns]
    if data.column_names != names:
        raise AssertionError(f"{t.name}: read columns {data.column_names}, declared {names}")
    raw = {c: column(data.column(c)) for c in names}
    by = ([t.day] if t.day else []) + list(t.keys)
    n = data.num_rows
    if by:
        order = pc.sort_indices(
            data.select(by), sort_keys=[(k, "ascending", "at_end") for k in by]
        ).to_numpy()
    else:
        order = np.arange(n)
    order = _break_ties(data.select(by).take(pa.array(order)), order, raw)
    spans: dict[str, tuple[int, int]] = {}
    if n and t.day:
        days = data.column(t.day).take(pa.array(order))
        starts = np.flatnonzero(np.append(True, ~_same_as_previous(days)))
        ends = np.append(starts[1:], n)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            spans[_day_text(days[a].as_py())] = (a, b)
    elif n:
        spans["*"] = (0, n)
    return Encoded(t, {c: raw[c].take(order) for c in names}, spans, order)


def _same_as_previous(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """For rows 1..n-1: whether the value equals the row before's (NULL equals NULL)."""
    a, b = col[1:], col[:-1]
    eq = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.or_(eq, both_null).to_numpy(zero_copy_only=False).astype(bool)


def _break_ties(keys: pa.Table, order: np.ndarray, raw: dict[str, Column]) -> np.ndarray:
    """``order`` (sorted by ``keys``, its rows in that order) with each run of rows of equal
    keys sorted by the rows' bytes."""
    n = len(order)
    if n < 2:
        return order
    same = np.ones(n - 1, bool)
    for k in keys.column_names:
        same &= _same_as_previous(keys.column(k))
    if not same.any():
        return order
    order = order.copy()
    starts = np.flatnonzero(np.append(True, ~same))
    ends = np.append(starts[1:], n)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if b - a > 1:
            rows = order[a:b].tolist()
            order[a:b] = sorted(rows, key=lambda r: b"".join(c.field(r) for c in raw.values()))
    return order


# ----------------------------------------------------------------------------------------------
# Golden files
# ----------------------------------------------------------------------------------------------
COLUMNS_FILE = "columns.tsv"
DAYS_FILE = "days.tsv"
ROWS_DIR = "rows"


def write_golden(
    out: Path, tables: dict[str, Encoded], full_days: Callable[[Encoded], set[str] | None]
) -> None:
    """Write a scenario's golden files into ``out``: ``columns.tsv`` (each table's columns, types
    and column digests), ``days.tsv`` (each table's rows and digest per day) and, for the days
    ``full_days(table)`` names (None: every day), the rows themselves as
    ``rows/<table>.parquet`` (zstd), normalized, in canonical order."""
    out.mkdir(parents=True, exist_ok=True)
    rows_dir = out / ROWS_DIR
    rows_dir.mkdir(exist_ok=True)
    for old in rows_dir.glob("*.parquet"):
        old.unlink()
    with open(out / COLUMNS_FILE, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["table", "column", "type", "sha256"])
        for name in sorted(tables):
            e = tables[name]
            digests = e.column_digests()
            for c, typ in e.captured.columns:
                w.writerow([name, c, typ, digests[c]])
    with open(out / DAYS_FILE, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["table", "day", "rows", "sha256"])
        for name in sorted(tables):
            for d, (n, h) in tables[name].day_digests().items():
                w.writerow([name, d, n, h])
    for name in sorted(tables):
        e = tables[name]
        days = full_days(e)
        spans = [s for d, s in e.spans.items() if days is None or d in days]
        keep = np.concatenate([e.order[a:b] for a, b in spans]) if spans else []
        if len(keep):  # in canonical order
            rows = e.captured.data.take(pa.array(keep, pa.int64()))
            pq.write_table(rows, rows_dir / f"{name}.parquet", compression="zstd")


@dataclass
class Golden:
    """A scenario's committed golden files, read back."""

    columns: dict[str, list[tuple[str, str, str]]]
    days: dict[str, dict[str, tuple[int, str]]]
    root: Path

    @classmethod
    def read(cls, root: Path) -> Golden:
        columns: dict[str, list[tuple[str, str, str]]] = {}
        with open(root / COLUMNS_FILE, newline="") as f:
            for r in csv.DictReader(f, delimiter="\t"):
                columns.setdefault(r["table"], []).append((r["column"], r["type"], r["sha256"]))
        days: dict[str, dict[str, tuple[int, str]]] = {}
        with open(root / DAYS_FILE, newline="") as f:
            for r in csv.DictReader(f, delimiter="\t"):
                days.setdefault(r["table"], {})[r["day"]] = (int(r["rows"]), r["sha256"])
        return cls(columns, days, root)

    def rows(self, table: str, like: Captured) -> Encoded | None:
        """The committed rows of ``table`` (None if none were committed), encoded with the
        column types and keys of ``like``."""
        path = self.root / ROWS_DIR / f"{table}.parquet"
        if not path.exists():
            return None
        data = pq.read_table(path)
        cols = [(c, t) for c, t, _ in self.columns[table]]
        return encode(Captured(table, cols, like.keys, like.day, data))


# ----------------------------------------------------------------------------------------------
# Comparison
# ----------------------------------------------------------------------------------------------
def show(v) -> str:
    """A value for a message: floats also as their exact hexadecimal form."""
    if isinstance(v, float):
        return f"{v!r} ({v.hex()})"
    if isinstance(v, list) and len(v) > 6:
        return f"[{', '.join(show(x) for x in v[:6])}, ... {len(v)} values]"
    return repr(v)


def _first_list_difference(a, b) -> str:
    if not (isinstance(a, list) and isinstance(b, list)):
        return ""
    if len(a) != len(b):
        return f" (lengths {len(a)} and {len(b)})"
    for j, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y or (isinstance(x, float) and struct.pack(">d", x) != struct.pack(">d", y)):
            return f" (first at element {j}: committed {show(x)}, now {show(y)})"
    return ""


def _rows_of(e: Encoded, day: str) -> range:
    a, b = e.spans.get(day, (0, 0))
    return range(a, b)


def _keyed(e: Encoded, rows: Iterable[int]) -> dict[tuple, int]:
    """Canonical row positions by sort key (a repeated key counted: key + its occurrence)."""
    out: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}
    for i in rows:
        k = tuple(repr(v) for v in e.key(i).values())
        seen[k] = seen.get(k, 0) + 1
        out[(*k, seen[k])] = i
    return out


def _fmt_key(e: Encoded, i: int) -> str:
    if not e.captured.keys:  # one row a day, or a table without keys: its position
        a = next(a for a, b in e.spans.values() if a <= i < b)
        return f"#{i - a + 1} of the day"
    return ", ".join(f"{k}={v!r}" for k, v in e.key(i).items())


def diff_day(where: str, old: Encoded, new: Encoded, day: str) -> list[str]:
    """The rows of ``day`` in committed (``old``) and rebuilt (``new``) form, aligned by sort
    key: the first differences, each naming the row's key, the column and both values."""
    a, b = _keyed(old, _rows_of(old, day)), _keyed(new, _rows_of(new, day))
    out = []
    missing = [k for k in a if k not in b]
    extra = [k for k in b if k not in a]
    if missing:
        out.append(
            f"{where}: {len(missing)} committed row(s) missing now, first "
            f"({_fmt_key(old, a[missing[0]])})"
        )
    if extra:
        out.append(
            f"{where}: {len(extra)} row(s) not in the committed data, first "
            f"({_fmt_key(new, b[extra[0]])})"
        )
    differing = 0
    for k, i in a.items():
        j = b.get(k)
        if j is None or old.row(i) == new.row(j):
            continue
        differing += 1
        if differing > 1:
            continue
        cols = [c for c in old.columns if old.field(c, i) != new.field(c, j)]
        c = cols[0]
        x, y = old.value(c, i), new.value(c, j)
        out.append(
            f"{where}, row ({_fmt_key(old, i)}): column {c!r} differs: committed {show(x)}, now "
            f"{show(y)}{_first_list_difference(x, y)}"
            + (f"; also {', '.join(cols[1:])}" if len(cols) > 1 else "")
        )
    if differing > 1:
        out.append(f"{where}: {differing} rows differ in all")
    return out


def compare(scenario: str, golden: Golden, tables: dict[str, Encoded]) -> list[str]:
    """Every difference between the rebuilt ``tables`` of ``scenario`` and its golden files,
    as messages naming the scenario, table, day, row and column (empty: identical)."""
    problems: list[str] = []
    for name in sorted(set(golden.columns) - set(tables)):
        problems.append(f"scenario {scenario!r}: table {name!r} was committed but is gone")
    for name in sorted(set(tables) - set(golden.columns)):
        problems.append(f"scenario {scenario!r}: table {name!r} is new (not in the golden data)")
    first: dict[str, str] = {}  # table -> its first differing day
    for name in sorted(set(tables) & set(golden.columns)):
        found, bad = _compare_table(scenario, golden, tables[name])
        problems += found
        if bad:
            first[name] = bad[0]
    if first:  # the earliest day first: where a difference starts is where to look
        day = min(first.values())
        names = [t for t, d in first.items() if d == day]
        problems.insert(
            0,
            f"scenario {scenario!r}: {len(first)} table(s) differ; the earliest day is {day}, "
            f"in {', '.join(names)}",
        )
    return problems


def _compare_table(scenario: str, golden: Golden, new: Encoded) -> tuple[list[str], list[str]]:
    """The differences of one table (messages) and its differing days (sorted)."""
    name = new.name
    where = f"scenario {scenario!r}, table {name!r}"
    out = []
    want_cols = [(c, t) for c, t, _ in golden.columns[name]]
    if want_cols != new.captured.columns:
        n = min(len(want_cols), len(new.captured.columns))
        pos = next(
            (i for i in range(n) if want_cols[i] != new.captured.columns[i]), n
        )  # first differing position
        out.append(
            f"{where}: columns differ at position {pos}: committed "
            f"{want_cols[pos : pos + 3]}, now {new.captured.columns[pos : pos + 3]} (committed "
            f"{len(want_cols)} columns, now {len(new.captured.columns)})"
        )
        return out, []
    want_days, got_days = golden.days.get(name, {}), new.day_digests()
    bad = [d for d in sorted(set(want_days) | set(got_days)) if want_days.get(d) != got_days.get(d)]
    if not bad:
        return out, []
    old = golden.rows(name, new.captured)
    changed = [c for c, _, h in golden.columns[name] if new.column_digests()[c] != h]
    for d in bad[:DETAIL]:
        w, g = want_days.get(d), got_days.get(d)
        at = f"{where}, day {d}"
        if w is None:
            out.append(f"{at}: {g[0]} rows, a day the committed data does not have")
            continue
        if g is None:
            out.append(f"{at}: no rows now, committed {w[0]}")
            continue
        if old is not None and d in old.spans:
            detail = diff_day(at, old, new, d)
            if detail:
                out += detail
                continue
        out.append(
            f"{at}: {g[0]} rows (committed {w[0]}), digest differs; columns whose digest over "
            f"all days differs: {changed or 'none (the rows moved between days)'} (no committed "
            "rows of this day to name the row)"
        )
    if len(bad) > DETAIL:
        out.append(f"{where}: {len(bad)} days differ in all ({bad[0]} .. {bad[-1]})")
    return out, bad
