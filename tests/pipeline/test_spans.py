"""calpipe/pipeline/nightly.py's spans: a transaction of small days in one pass writes exactly the
rows of its days run one by one (``run_range(spans=False)``), and a bad day is reported as
without spans, with nothing of its transaction written.

The span writers are the registry's (calpipe/pipeline/tables.py); the engine is
:func:`calpipe.engine.driver.protect_by_day` (tests/engine/test_by_day.py checks it against the loop of
one protect_with_state per day). Each comparison checks that spans did run (a spy on the
engine), so that it cannot pass by running day by day both times.
"""

from __future__ import annotations

import datetime as dt
import re
import warnings

import polars as pl
import pytest

from calpipe import generate, pipeline, storage
from calpipe.errors import InputError
from calpipe.generate import StreamSpec
from calpipe.pipeline import Settings, nightly, transactions
from calpipe.pipeline.tables import TABLES
from tests.pipeline.test_ids import with_string_ids
from tests.pipeline.test_labels import with_classes

START = generate.DEFAULT_START
STREAMS = (
    StreamSpec("calm", events_per_day=20),
    StreamSpec("hot", "overconfident", 0, 30, strength=4.0),
    StreamSpec("late", "shift", 3, 25, strength=2.5),
    StreamSpec("quiet", events_per_day=2),
)


def day(i: int) -> dt.date:
    return START + dt.timedelta(days=i)


@pytest.fixture(scope="module")
def events() -> pl.DataFrame:
    """10 days; day 4 has no event at all and day 6 none of 'calm' (empty days and idle
    streams inside a span)."""
    ev = generate.generate(n_days=10, streams=STREAMS, seed=5)
    d = pl.col("event_time").dt.date()
    return ev.filter((d != day(4)) & ~((d == day(6)) & (pl.col("stream") == "calm")))


def all_tables(con) -> dict[str, pl.DataFrame]:
    return {t: storage.query(con, f"SELECT * FROM {t} ORDER BY ALL") for t in TABLES}


@pytest.fixture
def spy(monkeypatch):
    """How many spans ran (calls of the span engine)."""
    calls = []
    real = nightly.protect_by_day

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(nightly, "protect_by_day", counting)
    return calls


def run_both(tmp_path, events, spy, *, settings=None, ranges=((None, None),), source=None):
    """The tables after run_range over ``ranges`` (one run each, in order) in spans and day by
    day, on two databases."""
    if source is None:
        storage.write_landing(events, tmp_path / "landing")
        source = storage.EventSource.parse(str(tmp_path / "landing"))
    out = {}
    for spans in (True, False):
        con = storage.connect(tmp_path / f"spans_{spans}.duckdb")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                for a, b in ranges:
                    pipeline.run_range(con, source, a, b, settings or Settings(), spans=spans,
                                       first_day=START)  # fmt: skip
            out[spans] = all_tables(con)
        finally:
            con.close()
        if spans:
            assert spy, "no span ran: the comparison would be day by day against itself"
            n_spans = len(spy)
    assert len(spy) == n_spans  # spans=False ran none
    return out[True], out[False]


def assert_same(a: dict, b: dict) -> None:
    for t in TABLES:
        assert a[t].equals(b[t]), t
    assert a["protected_scores"].height and a["calibrator_state"].height


@pytest.mark.parametrize(
    "settings",
    [
        Settings(),
        Settings.make("isotonic", window=30, refit_every=7),
        Settings.make("venn-abers", window=30, refit_every=7),  # p_lower / p_upper
        Settings.make("composite-jumper", base_method="platt", base_params={"window": 25}),
    ],
    ids=["composite-jumper", "isotonic", "venn-abers", "stack"],
)
def test_a_run_in_spans_writes_the_rows_of_a_run_day_by_day(tmp_path, events, spy, settings):
    a, b = run_both(tmp_path, events, spy, settings=settings)
    assert_same(a, b)
    assert a["pipeline_days"].height == 10  # the empty day has its row
    assert a["martingale_alarms"].height > 0


def test_k_classes_and_string_ids_in_spans(tmp_path, events, spy):
    ev = with_string_ids(with_classes(events, 4, seed=2), "string")
    a, b = run_both(tmp_path, ev, spy, settings=Settings.make("composite-jumper"))
    assert_same(a, b)
    assert a["protected_scores"]["protected_scores"].list.len().unique().to_list() == [4]


def test_a_later_run_resumes_a_span_from_the_stored_state(tmp_path, events, spy):
    a, b = run_both(tmp_path, events, spy, ranges=[(day(0), day(5)), (day(6), day(9))])
    assert_same(a, b)


def test_a_file_source_out_of_day_order(tmp_path, events, spy):
    """A Parquet file whose rows are not in day order (a range is one query, not one per day
    as for a landing folder): each day's rows keep the file's order."""
    shuffled = events.sample(fraction=1.0, shuffle=True, seed=4)
    shuffled.write_parquet(tmp_path / "events.parquet")
    source = storage.EventSource.parse(str(tmp_path / "events.parquet"))
    a, b = run_both(tmp_path, events, spy, source=source)
    assert_same(a, b)


def test_spans_fit_the_transaction_budget(tmp_path, events, spy, monkeypatch):
    """A transaction is sized by its first day; its other days run as one span only if their
    recorded rows fit TRANSACTION_ROWS too (here: day 1 is far bigger than day 0)."""
    big = pl.concat([events, events.filter(pl.col("event_time").dt.date() == day(1))
                     .with_columns(pl.col("event_id") + 10**6)])  # fmt: skip
    storage.write_landing(big, tmp_path / "landing")
    source = storage.EventSource.parse(str(tmp_path / "landing"))
    n0 = events.filter(pl.col("event_time").dt.date() == day(0)).height
    monkeypatch.setattr(transactions, "TRANSACTION_ROWS", 2 * n0)  # two days of day 0's size
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(con, source, day(0), day(1), Settings())
    finally:
        con.close()
    assert spy == []  # day 1 does not fit beside day 0: the two days ran one by one


def _bad_run(tmp_path, events, spans: bool, name: str):
    storage.write_landing(events, tmp_path / f"landing_{name}")
    source = storage.EventSource.parse(str(tmp_path / f"landing_{name}"))
    con = storage.connect(tmp_path / f"{name}_{spans}.duckdb")
    try:
        with pytest.raises(InputError) as err:
            pipeline.run_range(con, source, None, None, Settings(), spans=spans)
        n = storage.query(con, "SELECT count(*) AS n FROM scored_events")["n"][0]
        days = storage.query(con, "SELECT count(*) AS n FROM pipeline_days")["n"][0]
    finally:
        con.close()
    return str(err.value), n, days


@pytest.mark.parametrize("bad", ["score", "duplicate"])
def test_a_bad_day_inside_a_span_is_reported_as_day_by_day(tmp_path, events, spy, bad):
    d = pl.col("event_time").dt.date()
    if bad == "score":  # a score above 1 on day 7
        first = (d == day(7)) & (pl.col("event_id") == events.filter(d == day(7))["event_id"][3])
        ev = events.with_columns(pl.when(first).then(1.5).otherwise(pl.col("score")).alias("score"))
        rule = "score"
    else:  # an event of day 2 sent again on day 8 (another time, the same key)
        again = events.filter((d == day(2)) & (pl.col("stream") == "calm")).head(1)
        again = again.with_columns(pl.col("event_time") + pl.duration(days=6))
        ev = pl.concat([events, again])
        rule = "duplicate|unique"
    with_spans = _bad_run(tmp_path, ev, True, bad)
    assert spy  # the span was tried, found the bad day, and let the days run one by one
    day_by_day = _bad_run(tmp_path, ev, False, bad)
    assert with_spans == day_by_day
    message, n_events, n_days = with_spans
    assert re.search(rule, message), message
    assert n_events == 0 and n_days == 0  # one transaction: nothing of it is written


def test_a_run_builds_its_calibrator_once(tmp_path, events, monkeypatch):
    """One calibrator per run, handed as an object to every engine call: a 4-day run built
    the same CompositeExperts five times (Settings.make, the chain, the span driver and twice
    for the serving map) when each layer made its own from the method's name."""
    from calpipe.calibrators import registry

    built = []
    make = registry.make_calibrator

    def counting(*a, **kw):
        built.append(a[0] if a else kw.get("method"))
        return make(*a, **kw)

    for module in ("calpipe.night.settings", "calpipe.engine.driver"):
        monkeypatch.setattr(f"{module}.make_calibrator", counting)
    storage.write_landing(events.filter(pl.col("event_time").dt.date() <= day(3)), tmp_path / "l")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        for spans in (True, False):
            built.clear()
            settings = Settings.make("composite-experts")
            pipeline.run_range(con, storage.EventSource.parse(str(tmp_path / "l")), day(0), day(3),
                               settings, first_day=START, spans=spans)  # fmt: skip
            assert built == ["composite-experts"], (spans, built)
    finally:
        con.close()
