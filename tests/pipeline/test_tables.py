"""The table registry (calpipe/pipeline/tables.py): every table of the store and of the DDL has
an entry with its rows' writer, and ``calpipe run`` writes exactly the registered tables, each
with its writer."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
from collections import Counter

import polars as pl
import pytest

from calpipe import generate, pipeline, storage
from calpipe.pipeline import nightly, tables, transactions
from calpipe.pipeline.labels import label_source
from tests.test_pipeline import drifting  # noqa: F401  (the fixture)

from .stored import assert_derived_tables_match

START = generate.DEFAULT_START

#: Tables of sql/ that are not pipeline outputs: key-value facts about the database.
NOT_OUTPUTS = {"calpipe_meta"}


def ddl_tables() -> dict[str, str]:
    """Every ``CREATE TABLE`` of sql/ -> the file that creates it."""
    found = {}
    for f in storage.sql_files():
        for name in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", f.read_text()):
            found[name] = f.name
    return found


def test_every_table_of_the_store_and_the_ddl_is_registered():
    registered = set(tables.TABLES)
    assert registered == set(storage.PARTITION_COLUMN), "store tables without a registry entry"
    assert registered == set(storage.SORT_KEYS)
    assert registered == set(ddl_tables()) - NOT_OUTPUTS, "DDL tables without a registry entry"


def test_every_entry_has_its_ddl_layout_and_writer(tmp_path):
    con = storage.connect(tmp_path / "t.duckdb")
    try:
        for name, t in tables.TABLES.items():
            assert t.name == name
            assert ddl_tables()[name] == t.layout.ddl and t.ddl_path.is_file(), name
            columns = storage.table_columns(con, [name])[name]
            assert t.partition_column in columns, name
            assert set(t.sort_keys) <= set(columns), name
            assert t.sort_keys[0] == t.partition_column, name
            assert callable(t.rows), name
            assert t.phase in tables.PHASES
            # a span writes every table but those written at the end of the transaction
            assert (t.span is None) == (t.phase == "transaction"), name
    finally:
        con.close()


def test_an_entry_without_a_writer_is_refused():
    t = tables.TABLES["calibration_daily"]
    with pytest.raises(TypeError, match="needs its rows' writer"):
        dataclasses.replace(t, rows=None)


def test_a_span_writer_is_needed_before_the_transaction_phase_and_only_there():
    with pytest.raises(TypeError, match="span writer"):
        dataclasses.replace(tables.TABLES["calibration_daily"], span=None)
    t = tables.TABLES["calibration_map"]
    with pytest.raises(TypeError, match="span writer"):
        dataclasses.replace(t, span=t.rows)


def test_an_entry_for_a_table_the_store_does_not_know_is_refused():
    t = tables.TABLES["calibration_daily"]
    with pytest.raises(ValueError, match="no storage layout"):
        dataclasses.replace(t, name="calibration_weekly")
    with pytest.raises(ValueError, match="phase"):
        dataclasses.replace(t, phase="hourly")


def test_a_layout_whose_rows_do_not_sort_by_its_partition_first_is_refused():
    """read_partitions and the writer's sorted inserts order rows by SORT_KEYS; a partition
    column that is not the first key would interleave partitions."""
    layout = storage.LAYOUT["calibration_daily"]
    with pytest.raises(ValueError, match="partition column first"):
        dataclasses.replace(layout, sort_keys=("stream", "date"))
    assert storage.PARTITION_COLUMN == {n: t.partition_column for n, t in storage.LAYOUT.items()}


# ----------------------------------------------------------------------------------------------
# calpipe run goes through the registry
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def landing(request):
    """8 days of streams that cross the alarm level on different days (test_pipeline's
    ``drifting``), in a landing folder."""
    events, tmp = request.getfixturevalue("drifting")
    storage.write_landing(events, tmp / "landing")
    return storage.EventSource.parse(str(tmp / "landing")), tmp


def _count_writer_calls(monkeypatch, which) -> Counter[str]:
    """Calls per table of the writer ``which(entry)`` (``"rows"`` or ``"span"``) of every
    registered table, counted as the run makes them."""
    calls: Counter[str] = Counter()
    for name, t in list(tables.TABLES.items()):
        field = which(t)

        def counted(context, t=t, field=field):
            calls[t.name] += 1
            return getattr(t, field)(context)

        monkeypatch.setitem(tables.TABLES, name, dataclasses.replace(t, **{field: counted}))
    return calls


def test_run_range_replaces_exactly_the_registered_tables_with_their_row_functions(
    landing, monkeypatch
):
    source, tmp = landing
    calls = _count_writer_calls(monkeypatch, lambda t: "rows")
    replaced: list[list[str]] = []
    real = storage.replacing_partitions

    @contextlib.contextmanager
    def spy(con, start, end, names, **kw):
        replaced.append(list(names))
        with real(con, start, end, names, **kw) as writer:
            yield writer

    monkeypatch.setattr(storage, "replacing_partitions", spy)
    # a label feed: every third label arrives an hour after its event, and one label of an
    # unknown event is parked (event_labels and quarantined_labels get rows)
    events = pl.concat([pl.read_parquet(f) for f in sorted((tmp / "landing").rglob("*.parquet"))])
    fed = (pl.int_range(pl.len()) % 3 == 0) & pl.col("label").is_not_null()
    fed_rows = events.filter(fed).filter(
        (pl.col("event_time") + pl.duration(hours=1)) <= pl.col("event_time").max()
    )
    labels = fed_rows.select(
        "stream",
        "event_id",
        "label",
        (pl.col("event_time") + pl.duration(hours=1)).alias("label_time"),
    )
    unknown = labels.head(1).with_columns(pl.lit(10**12).alias("event_id"))
    keep = events.join(fed_rows.select("stream", "event_id"), on=["stream", "event_id"], how="anti")
    shutil.rmtree(tmp / "landing")
    storage.write_landing(
        pl.concat([keep, fed_rows.with_columns(pl.lit(None, pl.Int32).alias("label"))]),
        tmp / "landing",
    )
    storage.write_landing(pl.concat([labels, unknown]), tmp / "labels", time_column="label_time")
    feed = label_source(str(tmp / "labels"))
    con = storage.connect(tmp / "db.duckdb")
    try:
        pipeline.run_range(con, source, labels=feed, on_unknown_label="quarantine")
        assert replaced and all(names == list(tables.TABLES) for names in replaced)
        assert set(calls) == set(tables.TABLES)
        for name in tables.TABLES:  # every table got rows (the hot stream crosses the alarm)
            assert storage.query(con, f"SELECT count(*) AS n FROM {name}")["n"][0] > 0, name
    finally:
        con.close()


def test_a_run_without_a_label_feed_writes_every_table_with_its_span_writer(landing, monkeypatch):
    """Without a label feed the days of a transaction run as one span: every table is written
    by its span writer, or, at the end of the transaction, by its row function."""
    source, tmp = landing
    calls = _count_writer_calls(monkeypatch, lambda t: "span" if t.span is not None else "rows")
    con = storage.connect(tmp / "db.duckdb")
    try:
        pipeline.run_range(con, source)
        assert set(calls) == set(tables.TABLES)
        assert calls["scored_events"] == 1  # the 8 days in one span
    finally:
        con.close()


def test_the_derived_tables_equal_their_recomputation_from_the_stored_rows(landing, monkeypatch):
    """Transactions of two days (a crossing day's state in another transaction) and batches of
    a few streams: the alarms, monitoring and maps the run computed from memory equal their
    recomputation from the stored rows (``tests/pipeline/stored.py``)."""
    source, tmp = landing
    con = storage.connect(tmp / "f.duckdb")
    try:
        monkeypatch.setattr(transactions, "CHUNK_DAYS", 2)
        monkeypatch.setattr(nightly, "PROTECT_BATCH_ROWS", 50)
        pipeline.run_range(con, source)
        assert storage.query(con, "SELECT count(*) AS n FROM martingale_alarms")["n"][0] >= 1
        assert_derived_tables_match(con)
    finally:
        con.close()
