"""calpipe/pipeline/ids.py: string and UUID event ids in the pipeline (#12 item 4).

The pipeline stored only integer ids ("event ids must be integers to be stored"). A database now
stores one id type, set by its first events: the chain over string or UUID ids equals one
``calpipe.protect`` pass, both paths write the same tables, the label feed and the history
duplicate check work on them, and a source with the other type is a clear error.
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid

import duckdb
import polars as pl
import pytest

import calpipe
from calpipe import generate, pipeline, storage
from calpipe.generate import StreamSpec
from calpipe.pipeline import Settings
from calpipe.pipeline.labels import label_source
from tests.pipeline.test_labels import split_feed

STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", "shift", 2, 20, strength=1.5))
N_DAYS = 5
START = generate.DEFAULT_START
METHOD = "composite-jumper"


def day(i: int) -> dt.date:
    return START + dt.timedelta(days=i)


def with_string_ids(events: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Ids as strings whose order is not the integers' ("ev-10" < "ev-9"), or random UUIDs."""
    if kind == "string":
        return events.with_columns(pl.format("ev-{}", pl.col("event_id")).alias("event_id"))
    gen = [str(uuid.UUID(int=(i * 2654435761) % 2**128)) for i in range(events.height)]
    return events.with_columns(pl.Series("event_id", gen))


def write_uuid_landing(events: pl.DataFrame, root) -> None:
    """A landing whose ids are Parquet UUIDs (written by DuckDB), as a warehouse exports them."""
    con = duckdb.connect()
    for (d,), part in (
        events.with_columns(pl.col("event_time").dt.date().alias("__d"))
        .partition_by("__d", as_dict=True)
        .items()
    ):
        sub = root / f"date={d.isoformat()}"
        sub.mkdir(parents=True)
        con.register("part", part.drop("__d").to_arrow())
        con.execute(
            f"COPY (SELECT * REPLACE (CAST(event_id AS UUID) AS event_id) FROM part) TO "
            f"'{sub / 'events.parquet'}'"
        )
        con.unregister("part")


@pytest.mark.parametrize("kind", ["string", "uuid"])
def test_a_chain_over_string_or_uuid_ids_equals_one_pass(tmp_path, kind):
    events = with_string_ids(generate.generate(n_days=N_DAYS, streams=STREAMS, seed=3), kind)
    if kind == "uuid":
        write_uuid_landing(events, tmp_path / "landing")
    else:
        storage.write_landing(events, tmp_path / "landing")
    source = storage.EventSource.parse(str(tmp_path / "landing"))
    settings = Settings.make(METHOD)
    fused, staged = storage.connect(tmp_path / "f.duckdb"), storage.connect(tmp_path / "s.duckdb")
    try:
        # night by night, so each night resumes a stored state keyed by a string id
        for i in range(N_DAYS):
            pipeline.run_range(fused, source, settings=settings, end=day(i))
        pipeline.run_range(staged, source, settings=settings)  # all nights in one run
        for t in storage.PARTITION_COLUMN:
            a = storage.query(fused, f"SELECT * FROM {t} ORDER BY ALL")
            b = storage.query(staged, f"SELECT * FROM {t} ORDER BY ALL")
            if t == "pipeline_inputs":
                a, b = a.drop("mtime_ns"), b.drop("mtime_ns")
            assert a.equals(b), t
        chain = storage.query(fused, "SELECT * FROM v_protected_scores")
        assert chain.schema["event_id"] == pl.String
        state = storage.query(fused, "SELECT last_event_id FROM calibrator_state")
        assert state.schema["last_event_id"] == pl.String
    finally:
        fused.close()
        staged.close()
    one = calpipe.protect(events, method=METHOD)
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() == 0.0
    assert (j["log10_martingale"] - j["log10_martingale_c"]).abs().max() == 0.0


def test_a_label_feed_with_string_ids(tmp_path):
    events = with_string_ids(generate.generate(n_days=N_DAYS, streams=STREAMS, seed=4), "string")
    scores, labels, truth = split_feed(events, seed=9)
    storage.write_landing(scores, tmp_path / "scores")
    storage.write_landing(labels, tmp_path / "labels", time_column="label_time")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(
            con, storage.EventSource.parse(str(tmp_path / "scores")),
            settings=Settings.make(METHOD), labels=label_source(str(tmp_path / "labels")),
        )  # fmt: skip
        chain = storage.query(con, "SELECT * FROM protected_scores")
        assert storage.query(con, "SELECT count(*) AS n FROM event_labels")["n"][0] == labels.height
    finally:
        con.close()
    one = calpipe.protect(truth, method=METHOD, label_time="label_time")
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() <= 1e-12


def test_a_database_keeps_one_id_type(tmp_path):
    """Integer ids into a database of string ids (and back) is an error naming both types;
    nothing is written. An event re-sent with a string id on another day is still found."""
    events = generate.generate(n_days=N_DAYS, streams=STREAMS, seed=5)
    strings = with_string_ids(events, "string")
    storage.write_landing(strings.filter(pl.col("event_time").dt.date() <= day(2)), tmp_path / "s")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "s")))
        n = storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0]
        # day 3 lands with integer ids
        storage.write_landing(
            events.filter(pl.col("event_time").dt.date() == day(3)), tmp_path / "s"
        )
        with pytest.raises(storage.StoreError, match=r"BIGINT \(integers\).*VARCHAR \(strings\)"):
            pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "s")))
        assert storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0] == n
        shutil.rmtree(tmp_path / "s" / f"date={day(3).isoformat()}")
        # a duplicate over the history, with string ids
        d1 = strings.filter(pl.col("event_time").dt.date() == day(1)).head(1)
        resent = d1.with_columns(
            pl.lit(dt.datetime.combine(day(3), dt.time(12))).alias("event_time")
        )
        storage.write_landing(resent, tmp_path / "s")
        with pytest.raises(
            calpipe.errors.InputError, match=f"event {d1['event_id'][0]}: duplicate"
        ):
            pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "s")))
    finally:
        con.close()
