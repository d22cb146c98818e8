"""Where scored events come from: an event source, its column map onto the data contract, normalisation.

Scored events come from a :class:`EventSource`: a Parquet (or CSV) landing folder with
hive-style ``date=YYYY-MM-DD/`` sub-folders (:mod:`calpipe.storage.landing`), a Parquet file
(or glob), or a DuckDB table, with a column map (:class:`ColumnMap`) onto the data contract
(docs/ARCHITECTURE.md §3); :func:`normalize_events` renames and casts what was read.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from calpipe.errors import InputError, StoreError
from calpipe.storage.landing import (
    FILE_COLUMN,
    check_files_named,
    day_files,
    parquet_files_sql,
    part_where,
    stream_sql,
)
from calpipe.storage.parts import PartSpool
from calpipe.storage.session import configure_session, fetch_one, query


@dataclass(frozen=True)
class ColumnMap:
    """Names of the data-contract columns in a source (docs/ARCHITECTURE.md §3). ``stream=None``
    means one stream, called ``default``; otherwise a source without the stream column is an
    error (a renamed or mistyped column must not merge every stream into one)."""

    stream: str | None = "stream"
    event_id: str = "event_id"
    event_time: str = "event_time"
    score: str = "score"
    label: str = "label"

    @property
    def day_time(self) -> str:
        """The column whose date is a row's day (a table or Parquet glob source is split by it)."""
        return self.event_time

    def to_json(self) -> str:
        """The mapping as JSON (``calpipe_meta`` key ``columns``: what the code location reads)."""
        return json.dumps(
            {"stream": self.stream, "event_id": self.event_id, "event_time": self.event_time,
             "score": self.score, "label": self.label}, sort_keys=True,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> ColumnMap:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise StoreError(f"column map {text!r} is not a calpipe column map: {exc}") from None

    def required(self, names: list[str] | None = None) -> list[str]:
        """The columns every file or table must have (the stream's unless ``stream=None``);
        with the source's column ``names``, its score column is :meth:`score_in`'s."""
        score = self.score if names is None else self.score_in(names)
        req = [self.event_id, self.event_time, score, self.label]
        return req if self.stream is None else [self.stream, *req]

    def score_in(self, names: list[str]) -> str:
        """The score column of a source with columns ``names``: ``score`` (a float, or a list of
        K class probabilities), or by default ``scores`` (K classes) if there is no ``score``."""
        if self.score == "score" and "score" not in names and "scores" in names:
            return "scores"
        return self.score

    def check_file(self, path: Path) -> None:
        """InputError naming the file if its Parquet schema lacks a required column (exact
        name: a stream column renamed ``Stream`` must not merge every stream into one)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as exc:
            raise StoreError(f"reading {path}: not a readable Parquet file ({exc})") from exc
        names = schema.names
        if self.event_id in names and not _id_type_ok(schema.field(self.event_id).type):
            raise InputError(
                self.event_id, None, f"{path}: event ids must be integers or strings (UUIDs "
                f"read as strings) to be stored (the file has {schema.field(self.event_id).type})",
            )  # fmt: skip
        missing = [c for c in self.required(names) if c not in names]
        if missing:
            hint = " (one stream: --stream-col none)" if missing[0] == self.stream else ""
            raise InputError(
                missing[0], None, f"{path}: missing column (the file has {names}){hint}"
            )


def _id_type_ok(t) -> bool:
    """An Arrow type calpipe stores as an event id: integers (BIGINT), strings or UUIDs
    (VARCHAR: DuckDB reads a Parquet UUID as its string form)."""
    import pyarrow as pa

    if getattr(t, "extension_name", None) is not None:
        return t.extension_name == "arrow.uuid"
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


#: Name of the single stream of a source that has no stream column.
DEFAULT_STREAM = "default"


#: Column that :meth:`EventSource.read_range` adds: the day a row was read for.
DAY_COLUMN = "__calpipe_day"


@dataclass(frozen=True)
class EventSource:
    """Where scored events land: a Parquet landing folder (``date=YYYY-MM-DD/`` sub-folders), a
    Parquet file or glob, or a DuckDB table (``name`` or ``schema.name``) in the calpipe database.

    Use :meth:`parse` to build one from a command-line string.
    """

    kind: str  # "landing" | "parquet" | "csv" | "table"
    location: str
    columns: ColumnMap = field(default_factory=ColumnMap)

    @classmethod
    def parse(cls, text: str, columns: ColumnMap | None = None) -> EventSource:
        """``PATH`` of a folder with ``date=`` sub-folders -> landing; a ``.csv`` / ``.csv.gz``
        / ``.tsv`` file or glob -> csv (a header row; DuckDB's sniffer reads the types, the
        data contract checks them); ``*.parquet`` / a glob / a Parquet file -> parquet;
        anything else that is a SQL identifier -> table."""
        cm = columns or ColumnMap()
        p = Path(text).expanduser()
        if p.is_dir():
            return cls("landing", str(p.resolve()), cm)
        if text.lower().endswith(CSV_SUFFIXES):
            return cls("csv", str(p.resolve()) if p.exists() else text, cm)
        if text.endswith(".parquet") or any(ch in text for ch in "*?[") or p.is_file():
            return cls("parquet", str(p.resolve()) if p.exists() else text, cm)
        if _IDENT.match(text):
            return cls("table", text, cm)
        raise StoreError(
            f"events {text!r}: neither a folder, a Parquet or CSV file/glob, nor a table name"
        )

    def describe(self) -> str:
        return f"{self.kind} {self.location}"

    # -- raw reads -----------------------------------------------------------------------------
    def _landing_days(self) -> list[tuple[dt.date, Path]]:
        root = Path(self.location)
        if not root.is_dir():
            raise StoreError(f"landing folder {root} does not exist")
        out = []
        for sub in root.iterdir():
            if sub.name.startswith(("_", ".")):  # markers (_SUCCESS), hidden files
                continue
            # exactly date=YYYY-MM-DD: fromisoformat also takes 20240102, a folder the reader
            # (which looks for date=2024-01-02) then never read; any other entry is refused,
            # naming it: a misnamed day folder (Date=, dt=, a bare date) was skipped and its
            # day committed empty
            m = _DAY_FOLDER.fullmatch(sub.name)
            try:
                day = dt.date.fromisoformat(m.group(1)) if m else None
            except ValueError:
                day = None
            if day is None or not sub.is_dir():
                what = "folder" if sub.is_dir() else "file"
                raise StoreError(
                    f"landing folder {root}: {what} {sub.name!r} is not a day folder "
                    "date=YYYY-MM-DD; rename it, move it out, or prefix it with '_' or '.' "
                    "to have it skipped (nothing was read)"
                )
            out.append((day, sub))
        return sorted(out)

    def landing_day_files(self, start: dt.date, end: dt.date) -> list[tuple[dt.date, Path]]:
        """(day, file) of every Parquet file of a landing folder's days in [start, end] (as
        :meth:`read_range` reads them)."""
        return [
            (d, f) for d, sub in self._landing_days() if start <= d <= end for f in day_files(sub)
        ]

    def relation_sql(self) -> str:
        """The source as a SQL relation (a Parquet file/glob or a table source)."""
        return self._relation_sql()

    def _relation_sql(self) -> str:
        if self.kind == "parquet":
            return f"read_parquet('{_sql_str(self.location)}', union_by_name = true)"
        if self.kind == "csv":
            return f"read_csv('{_sql_str(self.location)}', header = true, union_by_name = true)"
        if self.kind == "table":
            return ".".join(f'"{part}"' for part in self.location.split("."))
        raise StoreError(f"no relation for a {self.kind} source")

    def read_file(self) -> pl.DataFrame:
        """Every row of a Parquet or CSV file (or glob) source, typed as ``calpipe run`` reads
        it (DuckDB's reader and CSV sniffer, naive times as UTC), on a connection of its own;
        a read error is a StoreError naming the source.

        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "e.csv")
        >>> _ = open(path, "w").write("stream,event_id,score\\na,1,0.25\\n")
        >>> EventSource.parse(path).read_file().rows()
        [('a', 1, 0.25)]
        """
        if self.kind not in ("parquet", "csv"):
            raise StoreError(f"{self.describe()}: not a Parquet or CSV file")
        with duckdb.connect() as con, self.reading():
            configure_session(con)
            return con.sql(f"SELECT * FROM {self._relation_sql()}").pl()

    def date_range(self, con: duckdb.DuckDBPyConnection) -> tuple[dt.date, dt.date] | None:
        """First and last event date of the source (None if it has no events)."""
        with self.reading():
            return self._date_range(con)

    @contextmanager
    def reading(self):
        """A DuckDB error while reading the source is a StoreError that names the source (and
        only then: the CLI used to label every database error "reading <source>")."""
        try:
            yield
        except duckdb.InterruptException:  # Ctrl-C mid-query: an interrupt, not a bad source
            raise
        except duckdb.Error as exc:
            raise StoreError(f"reading {self.describe()}: {exc}") from exc

    def _date_range(self, con: duckdb.DuckDBPyConnection) -> tuple[dt.date, dt.date] | None:
        if self.kind == "landing":
            days = [d for d, sub in self._landing_days() if day_files(sub)]
            return (days[0], days[-1]) if days else None
        t = sql_ident(self.columns.day_time)
        row = fetch_one(
            con,
            f"SELECT CAST(min({t}) AS DATE), CAST(max({t}) AS DATE) FROM {self._relation_sql()}",
        )
        return None if row is None or row[0] is None else (row[0], row[1])

    def read_raw(self, con: duckdb.DuckDBPyConnection, day: dt.date) -> pl.DataFrame:
        """The source's rows of one day, with the source's own column names."""
        raw = self.read_range(con, day, day)
        return raw.drop(DAY_COLUMN) if DAY_COLUMN in raw.columns else raw

    def read_range(
        self,
        con: duckdb.DuckDBPyConnection,
        start: dt.date,
        end: dt.date,
        part: tuple[int, int] | None = None,
        spool: PartSpool | None = None,
    ) -> pl.DataFrame:
        """The source's rows of [start, end] with the source's column names plus
        :data:`DAY_COLUMN`, the day each row was read for (a landing file's folder date; the
        event's date for a file or table); with ``part = (i, k)``, those of the streams of part
        i of k (:func:`calpipe.storage.landing.part_where`). One query for the range. An empty frame
        (no columns) if there is nothing. With ``spool`` (:meth:`spool_range` of the same
        range into k parts), the part's rows come from it, read no more."""
        if spool is not None:
            if part is None or part[1] != spool.k:
                raise ValueError(f"part {part} of a read spooled in {spool.k} parts")
            raw, files = spool.read(part[0]), spool.files
        else:
            with self.reading():
                found = self._range_query(start, end, part_where(self.columns.stream, part,
                                                                  DEFAULT_STREAM))  # fmt: skip
                if found is None:
                    return pl.DataFrame()
                sql, params, files = found
                raw = query(con, sql, params)
        return self._finish(check_files_named(raw, files) if files else raw, files)

    def spool_range(
        self, con: duckdb.DuckDBPyConnection, start: dt.date, end: dt.date, k: int,
        directory: Path,
    ) -> PartSpool | None:  # fmt: skip
        """The source's rows of [start, end] read once and split into ``k`` parts
        (:class:`calpipe.storage.parts.PartSpool` in ``directory``), for :meth:`read_range`
        to read part by part; None if there is nothing. Close it when done."""
        with self.reading():
            found = self._range_query(start, end, "TRUE")
            if found is None:
                return None
            sql, params, files = found
            stream = stream_sql(self.columns.stream, DEFAULT_STREAM)
            return PartSpool.create(con, sql, stream, k, directory, params, files)

    def _range_query(
        self, start: dt.date, end: dt.date, where: str
    ) -> tuple[str, list, list[tuple[dt.date, Path]]] | None:
        """(SQL, parameters, a landing read's (day, file) pairs) of the rows of [start, end]
        that satisfy ``where``; None for a landing folder without files in the range."""
        if self.kind == "landing":
            files = []
            for day in iter_days(start, end):  # the range's folders, not the whole landing's
                sub = Path(self.location) / f"date={day.isoformat()}"
                files += [(day, f) for f in day_files(sub)] if sub.is_dir() else []
            if not files:
                return None
            for _, f in files:  # per file: union_by_name would fill a renamed column with nulls
                self.columns.check_file(f)
            # one query for the range (one a day cost ~2 ms a day): the files in day order, each
            # file's rows in order; each row's day from its file
            return parquet_files_sql([f for _, f in files], where), [], files
        t = sql_ident(self.columns.day_time)
        return (
            f"SELECT *, CAST({t} AS DATE) AS {DAY_COLUMN} FROM {self._relation_sql()} "
            f"WHERE CAST({t} AS DATE) BETWEEN ? AND ? AND {where}",
            [start, end],
            [],
        )

    @staticmethod
    def _finish(raw: pl.DataFrame, files: list[tuple[dt.date, Path]]) -> pl.DataFrame:
        """A landing read's rows with their day (from their file's number) for the number."""
        if not files or FILE_COLUMN not in raw.columns:
            return raw
        day_of = {i: day for i, (day, _) in enumerate(files)}
        days = raw[FILE_COLUMN].replace_strict(day_of, return_dtype=pl.Date)
        return raw.drop(FILE_COLUMN).with_columns(days.alias(DAY_COLUMN))


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}$")


_DAY_FOLDER = re.compile(r"date=(\d{4}-\d{2}-\d{2})")


#: CSV sources (compared in lower case): a header row, DuckDB's type sniffer.
CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")


def sql_ident(name: str) -> str:
    """A column name as a quoted SQL identifier (``--time-col`` was pasted into SQL as is)."""
    return '"' + name.replace('"', '""') + '"'


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def iter_days(start: dt.date, end: dt.date) -> Iterator[dt.date]:
    """Every calendar day of [start, end]."""
    d = start
    while d <= end:
        yield d
        d += dt.timedelta(days=1)


def normalize_events(raw: pl.DataFrame, columns: ColumnMap) -> pl.DataFrame:
    """Rename a source's columns to the data contract and check the ones calpipe stores.

    Returns columns ``stream, event_id, event_time, score, label`` (String, Int64 or String,
    Datetime(us), source score dtype: a float or K-class vectors, source label dtype); raises InputError for a missing column
    or an event id that is not an integer.
    """
    cm = columns
    score = cm.score_in(raw.columns)
    needed = [cm.event_id, cm.event_time, score, cm.label]
    if raw.width == 0:
        return pl.DataFrame(
            schema={
                "stream": pl.String, "event_id": pl.Int64, "event_time": pl.Datetime("us"),
                "score": pl.Float64, "label": pl.Int32,
            }
        )  # fmt: skip
    if cm.stream is not None:  # no stream column means one stream only when asked for
        needed = [cm.stream, *needed]
    for c in needed:
        if c not in raw.columns:
            hint = " (one stream: --stream-col none)" if c == cm.stream else ""
            raise InputError(c, None, f"missing column (the source has {raw.columns}){hint}")
    id_type = raw.schema[cm.event_id]
    string_ids = id_type in (pl.String, pl.Categorical) or isinstance(id_type, pl.Enum)
    if not (id_type.is_integer() or string_ids):
        raise InputError(
            cm.event_id,
            None,
            f"event ids must be integers or strings to be stored (got {id_type})",
        )
    if raw.schema[cm.event_id] == pl.UInt64:  # ids >= 2^63 do not fit the stored Int64
        big = raw.select((pl.col(cm.event_id) > 2**63 - 1).arg_true().first()).item()
        if big is not None:
            raise InputError(
                cm.event_id, int(big), f"event id {raw[cm.event_id][big]} does not fit a signed "
                "64-bit integer (the stored type)",
            )  # fmt: skip
    if not raw.schema[cm.event_time].is_temporal():
        raise InputError(
            cm.event_time,
            None,
            f"event_time must be a Date or Datetime (got {raw.schema[cm.event_time]})",
        )
    t = pl.col(cm.event_time)
    tz = getattr(raw.schema[cm.event_time], "time_zone", None)
    if tz is not None:  # stored as naive UTC
        t = t.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    stream = (
        pl.lit(DEFAULT_STREAM, pl.String)
        if cm.stream is None
        else pl.col(cm.stream).cast(pl.String)
    )
    return raw.select(
        stream.alias("stream"),
        pl.col(cm.event_id).cast(pl.String if string_ids else pl.Int64).alias("event_id"),
        t.cast(pl.Datetime("us")).alias("event_time"),
        pl.col(score).alias("score"),
        pl.col(cm.label).alias("label"),
    )
