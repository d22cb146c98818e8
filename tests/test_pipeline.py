"""calpipe.pipeline: the nightly job on real DuckDB files and Parquet landing folders.

The module-scoped ``demo`` fixture runs the whole demo (bank stream + synthetic streams, 892 daily
partitions) once into a temporary database; the other tests use small synthetic chains.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io

import duckdb
import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe import cli, config, generate, metrics, pipeline, storage
from calpipe.cli import pipeline as cli_pipeline
from calpipe.errors import InputError, ParameterError, StateError
from calpipe.generate import StreamSpec
from calpipe.pipeline import Settings, nightly, transactions
from calpipe.storage import StoreError

START = generate.DEFAULT_START
TOL = 1e-12


def day(i: int) -> dt.date:
    return START + dt.timedelta(days=i)


# ----------------------------------------------------------------------------------------------
# Oracles (numpy, straight from the definitions)
# ----------------------------------------------------------------------------------------------
def np_log_loss(p, y):
    q = np.where(y == 1, p, 1 - p)
    return float(np.mean(-np.log(np.clip(q, 1e-15, 1))))


def np_ece(p, y, bins=10):
    b = np.clip(np.floor(p * bins), 0, bins - 1)
    gaps = [
        abs(p[b == k].mean() - y[b == k].mean()) * (b == k).sum()
        for k in range(bins)
        if (b == k).any()
    ]
    return float(sum(gaps) / len(p))


def table(con, name: str) -> pl.DataFrame:
    return storage.query(con, f"SELECT * FROM {name} ORDER BY ALL")


ALL_TABLES = tuple(storage.PARTITION_COLUMN)


# ----------------------------------------------------------------------------------------------
# The demo
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    res = pipeline.demo(tmp / "demo.duckdb", generated=tmp / "generated" / "synthetic.parquet")
    con = storage.connect(res.db)
    yield res, con
    con.close()


@pytest.fixture(scope="module")
def demo_one_pass(demo):
    """The demo's events through one calpipe.protect pass (the chain's oracle)."""
    _res, _ = demo
    events = pl.concat([pipeline.bank_events(), generate.generate()], how="vertical_relaxed")
    return calpipe.protect(events, by="stream", method=Settings().method)


def test_demo_covers_every_day_of_both_sets(demo):
    res, con = demo
    assert (res.run.start, res.run.end) == (pipeline.DEMO_FIRST_DAY, pipeline.DEMO_LAST_DAY)
    days = storage.partition_dates(con, "pipeline_days")
    assert days == list(storage.iter_days(pipeline.DEMO_FIRST_DAY, pipeline.DEMO_LAST_DAY))
    counts = dict(
        storage.query(con, "SELECT stream, count(*) FROM protected_scores GROUP BY 1").iter_rows()
    )
    assert counts[pipeline.BANK_STREAM] == 35_211
    bank_days = storage.query(
        con,
        "SELECT count(DISTINCT event_date) FROM protected_scores WHERE stream = 'bank-telemarketing'",
    ).item()
    assert bank_days == 537
    assert res.run.events == sum(counts.values())


def test_day_by_day_chain_equals_one_protect_pass(demo, demo_one_pass):
    _, con = demo
    chain = storage.query(
        con, "SELECT stream, event_id, protected_score, log10_martingale FROM protected_scores"
    )
    joined = demo_one_pass.join(chain, on=["stream", "event_id"], how="inner", suffix="_chain")
    assert joined.height == demo_one_pass.height == chain.height
    for col in ("protected_score", "log10_martingale"):
        diff = (joined[col] - joined[f"{col}_chain"]).abs().max()
        assert diff <= TOL, col


def test_bank_protected_beats_base_and_raises_an_alarm(demo):
    res, con = demo
    bank = res.summary.filter(pl.col("stream") == pipeline.BANK_STREAM).row(0, named=True)
    assert bank["prot_LL"] < bank["base_LL"]
    assert bank["prot_Brier"] < bank["base_Brier"]
    # cumulative log loss (not just the mean) and the reference number of docs/REFERENCE_DATA.md
    rows = storage.query(
        con,
        "SELECT base_score, protected_score, label FROM protected_scores "
        "WHERE stream = 'bank-telemarketing'",
    )
    p, q, y = (rows[c].to_numpy() for c in ("base_score", "protected_score", "label"))
    cum = lambda f: -np.sum(np.log(np.clip(np.where(y == 1, f, 1 - f), 1e-15, 1)))  # noqa: E731
    assert cum(q) < cum(p)
    # docs/REFERENCE_DATA.md: score_rf1000 clipped to [0.001, 0.999], mean ln loss 0.5169; the
    # default method gives 0.2490 (QUALITY.md, bank-time; paper 001's composite-jumper: 0.2793,
    # tests/test_published.py)
    assert bank["base_LL"] == pytest.approx(0.5169, abs=5e-5)
    assert bank["prot_LL"] == pytest.approx(0.2490, abs=5e-5)
    # the martingale bets against the base the engine used: base - protected loss = ln 10 log10 S
    assert cum(p) - cum(q) == pytest.approx(np.log(10) * bank["final_log10_S"], rel=1e-9)
    alarms = storage.query(
        con, "SELECT * FROM martingale_alarms WHERE stream = 'bank-telemarketing'"
    )
    assert alarms.height == 1 and alarms["log10_martingale"][0] >= config.ALARM_LOG10_THRESHOLD


def test_generated_streams_alarm_only_after_their_drift(demo):
    _, con = demo
    truth = generate.drift_table()
    alarms = storage.query(con, "SELECT stream, date FROM martingale_alarms")
    got = dict(alarms.iter_rows())
    peaks = dict(
        storage.query(
            con, "SELECT stream, max(log10_martingale) FROM protected_scores GROUP BY 1"
        ).iter_rows()
    )
    for name, _kind, drift_date in truth.iter_rows():
        if drift_date is None:
            assert name not in got, f"false alarm on calibrated stream {name}"
            assert peaks[name] < config.ALARM_LOG10_THRESHOLD
        else:
            assert name in got, f"drift of {name} not detected"
            assert drift_date <= got[name] <= drift_date + dt.timedelta(days=30)


def test_alarm_rows_are_the_first_crossings(demo):
    _, con = demo
    first = storage.query(
        con,
        """SELECT stream, event_date AS date, event_id, log10_martingale FROM v_protected_scores
           WHERE log10_martingale >= 2
           QUALIFY row_number() OVER (PARTITION BY stream ORDER BY event_time, event_id) = 1
           ORDER BY stream""",
    )
    alarms = storage.query(
        con,
        "SELECT stream, date, event_id, log10_martingale FROM martingale_alarms ORDER BY stream",
    )
    assert alarms.equals(first)
    assert table(con, "v_alarms").height == alarms.height


def test_calibration_daily_matches_numpy(demo):
    _, con = demo
    daily = storage.query(con, "SELECT * FROM calibration_daily")
    assert (
        daily.height
        == storage.query(
            con, "SELECT count(*) FROM (SELECT DISTINCT event_date, stream FROM protected_scores)"
        ).item()
    )
    picks = [(pipeline.BANK_STREAM, dt.date(2008, 7, 10)), ("drift-shift", dt.date(2010, 10, 11)),
             ("stable-c", dt.date(2010, 8, 1))]  # fmt: skip
    for stream, d in picks:
        rows = storage.query(
            con,
            "SELECT * FROM v_protected_scores WHERE stream = ? AND event_date = ? "
            "ORDER BY event_time, event_id",
            [stream, d],
        )
        got = daily.filter((pl.col("stream") == stream) & (pl.col("date") == d)).row(0, named=True)
        lab = rows.filter(pl.col("label").is_not_null())
        p, q, y = (
            lab[c].to_numpy().astype(float) for c in ("base_score", "protected_score", "label")
        )
        assert got["n_events"] == rows.height and got["n_labelled"] == lab.height
        assert got["base_log_loss"] == pytest.approx(np_log_loss(p, y), rel=1e-12)
        assert got["protected_log_loss"] == pytest.approx(np_log_loss(q, y), rel=1e-12)
        assert got["base_brier"] == pytest.approx(np.mean((p - y) ** 2), rel=1e-12)
        assert got["protected_brier"] == pytest.approx(np.mean((q - y) ** 2), rel=1e-12)
        assert got["base_ece"] == pytest.approx(np_ece(p, y), rel=1e-12)
        assert got["protected_ece"] == pytest.approx(np_ece(q, y), rel=1e-12)
        for who, v in (("base", p), ("protected", q)):
            one = np.zeros(v.size, np.int64)
            assert got[f"{who}_smooth_ece"] == pytest.approx(
                metrics.grouped_smooth_ece(v, y, one, 1)[0]
            )
            d = metrics.grouped_corp(v, y, one, 1)
            for score, name in (("log", "log_loss"), ("brier", "brier")):
                assert got[f"{who}_{name}_mcb"] == pytest.approx(d[f"{score}_miscalibration"][0])
                assert got[f"{who}_{name}_dsc"] == pytest.approx(d[f"{score}_discrimination"][0])
                assert got[f"{name}_unc"] == pytest.approx(d[f"{score}_uncertainty"][0])
                assert got[f"{who}_{name}"] == pytest.approx(
                    got[f"{who}_{name}_mcb"] - got[f"{who}_{name}_dsc"] + got[f"{name}_unc"]
                )
        assert got["mean_score"] == pytest.approx(rows["base_score"].mean(), rel=1e-12)
        assert got["mean_label"] == pytest.approx(y.mean(), rel=1e-12)
        assert got["log10_martingale"] == rows["log10_martingale"][-1]
        assert got["log10_martingale_max"] == rows["log10_martingale"].max()
        assert got["alarm"] == (rows["log10_martingale"].max() >= 2)


def test_sql_macro_equals_the_polars_serving_map(demo):
    _, con = demo
    rng = np.random.default_rng(0)
    fresh_p = np.concatenate([np.linspace(0, 1, 1001), rng.random(200), [1e-9, 0.0005, 0.9995]])
    streams = storage.query(con, "SELECT DISTINCT stream FROM calibrator_state ORDER BY 1")[
        "stream"
    ].to_list()
    fresh = pl.DataFrame(
        {"stream": np.repeat(streams, fresh_p.size), "score": np.tile(fresh_p, len(streams))}
    )
    latest = storage.query(
        con,
        "SELECT * FROM calibrator_state QUALIFY row_number() OVER (PARTITION BY stream ORDER BY date DESC) = 1",
    )
    want = pipeline.serving_map(latest.drop("date"), fresh)["protected_score"].to_numpy()
    con.register("fresh_scores", fresh.with_row_index("i").to_arrow())
    got = storage.query(
        con, "SELECT calibrate_score(stream, score) AS p FROM fresh_scores ORDER BY i"
    )["p"].to_numpy()
    con.unregister("fresh_scores")
    assert np.max(np.abs(got - want)) <= TOL
    # the drifted map really moves scores (the test could not pass with an identity map)
    i = streams.index("drift-overconfident")
    over = want[i * fresh_p.size : (i + 1) * fresh_p.size]
    assert np.max(np.abs(over - np.clip(fresh_p, 1e-3, 1 - 1e-3))) > 0.05


def test_sql_macro_as_of_a_day_uses_that_days_state(demo):
    _, con = demo
    for stream, d in [
        (pipeline.BANK_STREAM, dt.date(2009, 3, 1)),
        ("drift-shift", dt.date(2010, 10, 20)),
    ]:
        state = pipeline.state_as_of(con, d).filter(pl.col("stream") == stream)
        assert state.height == 1
        # 2009-03-01 is a Sunday without bank events: the map in force is an earlier day's
        assert (state["date"][0] < d) == (stream == pipeline.BANK_STREAM)
        p = np.linspace(0.01, 0.99, 99)
        want = pipeline.serving_map(
            state.drop("date"), pl.DataFrame({"stream": [stream] * p.size, "score": p})
        )
        got = con.execute(
            "SELECT calibrate_score_as_of(?, s, ?) FROM unnest(?) AS t(s)", [stream, d, p.tolist()]
        ).fetchall()
        assert (
            np.max(np.abs(np.array([g[0] for g in got]) - want["protected_score"].to_numpy()))
            <= TOL
        )


def test_demo_checks_pass_and_warn_on_alarms(demo):
    res, _ = demo
    by_name = {c.name: c for c in res.run.checks}
    assert by_name["probabilities_valid"].passed
    assert by_name["rows_in_equal_rows_out"].passed
    assert by_name["state_continuity"].passed
    alarm = by_name["no_martingale_alarm"]
    assert not alarm.passed and alarm.warning
    assert set(alarm.details["stream"]) == {
        pipeline.BANK_STREAM,
        "drift-overconfident",
        "drift-shift",
        "drift-underconfident",
    }


def test_the_alarm_check_warns_the_night_a_stream_crosses_not_every_night_after(demo):
    """Regression: no_martingale_alarm failed on every partition once any stream had ever
    crossed; it now names the streams that crossed on the checked days and counts the others."""
    _, con = demo
    alarms = storage.query(con, "SELECT stream, date FROM martingale_alarms ORDER BY date")
    first = alarms.row(0, named=True)
    on_it = pipeline.check_alarms(con, first["date"], first["date"])
    assert not on_it.passed and first["stream"] in on_it.description
    assert on_it.values["new_alarms"] >= 1
    later = pipeline.DEMO_LAST_DAY
    assert later > alarms["date"].max()
    after = pipeline.check_alarms(con, later, later)
    assert after.passed and after.values == {"new_alarms": 0, "streams_in_alarm": alarms.height}
    assert f"{alarms.height} stream(s) alarmed before" in after.description


def test_demo_command_prints_the_summary_and_next_steps(demo, monkeypatch):
    res, _ = demo
    monkeypatch.setattr(pipeline, "demo", lambda db, log=None, progress=None: res)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["demo", "--db", str(res.db)]) == 0
    text = out.getvalue()
    for needle in (
        "bank-telemarketing",
        "first_alarm",
        "prot_LL",
        "ui --db",
        "calibrate_score",
        "v_alarms",
    ):
        assert needle in text
    assert "892 daily partitions" in text


# ----------------------------------------------------------------------------------------------
# Small chains
# ----------------------------------------------------------------------------------------------
SMALL = (
    StreamSpec("a", events_per_day=30),
    StreamSpec("b", "overconfident", 2, 20, strength=0.3),
)


@pytest.fixture
def small(tmp_path):
    """8 days of two small streams in a landing folder, and an empty database."""
    events = generate.generate(n_days=8, streams=SMALL, seed=5)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "db.duckdb")
    yield con, storage.EventSource.parse(str(tmp_path / "landing")), events, tmp_path
    con.close()


def snapshot(con) -> dict[str, pl.DataFrame]:
    return {t: table(con, t) for t in ALL_TABLES}


def run_days(con, source, a, b, settings=None, first_day=START):
    """Days [a, b] as a dagster partition range runs them: explicit days, no replay."""
    return pipeline.run_range(con, source, a, b, settings or Settings(), first_day=first_day)


def test_days_without_events_are_reported(small):
    con, source, _, tmp = small
    (tmp / "landing" / f"date={day(3).isoformat()}" / "events.parquet").unlink()
    res = pipeline.run_range(con, source, day(0), day(7))
    assert res.empty_days == [day(3)]
    assert res.rows["pipeline_days"] == 8 and res.rows["scored_events"] == res.events


def test_run_range_defaults_to_the_source_and_then_to_nothing(small):
    con, source, events, _ = small
    s = pipeline.run_range(con, source)
    assert (s.start, s.end, s.days, s.events) == (day(0), day(7), 8, events.height)
    assert pipeline.run_range(con, source).days == 0  # up to date
    out = calpipe.protect(events, method=Settings().method)
    chain = table(con, "protected_scores")
    j = out.join(chain, on=["stream", "event_id"], suffix="_c")
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() <= TOL


def test_rerunning_a_day_replaces_its_rows_and_state_exactly(small):
    con, source, _, _ = small
    pipeline.run_range(con, source)
    before = snapshot(con)
    run_days(con, source, day(4), day(4))  # reads the state of day 3, not day 4's own
    for t in ALL_TABLES:
        assert snapshot(con)[t].equals(before[t]), t
    run_days(con, source, day(2), day(6))  # a range re-run too
    for t in ALL_TABLES:
        assert snapshot(con)[t].equals(before[t]), t


def test_state_is_keyed_by_day(small):
    con, source, events, _ = small
    pipeline.run_range(con, source)
    state = table(con, "calibrator_state")
    n_by_day = events.group_by(pl.col("event_time").dt.date().alias("date"), "stream").len()
    cum = n_by_day.sort("date").with_columns(pl.col("len").cum_sum().over("stream").alias("n"))
    joined = state.join(cum, on=["date", "stream"])
    assert (joined["n_events"] == joined["n"]).all()
    assert state.group_by("date").len()["len"].to_list() == [2] * 8


def test_a_day_without_the_previous_state_fails_clearly(small):
    con, source, _, _ = small
    run_days(con, source, day(0), day(0), first_day=day(0))
    before = snapshot(con)
    with pytest.raises(
        StateError, match=r"day 2010-07-23 has no calibrator state.*first missing day: 2010-07-22"
    ):
        run_days(con, source, day(3), day(3), first_day=day(0))
    with pytest.raises(StateError, match="before the chain's first day"):
        run_days(con, source, day(0), day(0), first_day=day(1))
    with pytest.raises(
        StateError, match=r"cannot start a chain on 2010-07-23.*starts on 2010-07-21"
    ):
        run_days(con, source, day(2), day(2), first_day=day(2))
    for t in ALL_TABLES:
        assert table(con, t).equals(before[t]), t


def test_another_configuration_is_a_state_error(small):
    con, source, _, _ = small
    run_days(con, source, day(0), day(1))
    before = snapshot(con)
    with pytest.raises(StateError, match="config fingerprint"):
        run_days(con, source, day(2), day(2), Settings.make(pi=0.25), first_day=day(0))
    for t in ALL_TABLES:
        assert table(con, t).equals(before[t]), t


def test_bad_events_fail_the_partition_and_write_nothing(small):
    con, source, _events, tmp = small
    run_days(con, source, day(0), day(3))
    before = snapshot(con)
    target = tmp / "landing" / f"date={day(2).isoformat()}" / "events.parquet"
    good = pl.read_parquet(target)
    bad = good.with_columns(
        pl.when(pl.col("event_id") == good["event_id"][3])
        .then(1.5)
        .otherwise(pl.col("score"))
        .alias("score")
    )
    bad.write_parquet(target)
    with pytest.raises(
        InputError,
        match=rf"day {day(2)}, stream '\w+', event {good['event_id'][3]}: score outside \[0, 1\]",
    ):
        run_days(con, source, day(2), day(2))
    with pytest.raises(InputError):
        pipeline.run_range(con, source, day(1), day(3))
    for t in ALL_TABLES:
        assert table(con, t).equals(before[t]), t


def test_events_outside_their_landing_day_are_refused(small):
    con, source, _, tmp = small
    target = tmp / "landing" / f"date={day(1).isoformat()}" / "events.parquet"
    pl.read_parquet(target).with_columns(pl.col("event_time") + dt.timedelta(days=1)).write_parquet(
        target
    )
    with pytest.raises(InputError, match="outside its day"):
        run_days(con, source, day(0), day(1))
    assert table(con, "scored_events").height == 0


@pytest.mark.parametrize("renamed", ["Stream", "segment"])
def test_a_renamed_stream_column_merged_every_stream_into_default(small, renamed):
    """Day 4's `stream` column renamed: it was read as one stream `default` and committed."""
    con, source, _, tmp = small
    target = tmp / "landing" / f"date={day(3).isoformat()}" / "events.parquet"
    pl.read_parquet(target).rename({"stream": renamed}).write_parquet(target)
    before = snapshot(con)
    with pytest.raises(InputError, match=rf"column 'stream': .*date={day(3).isoformat()}.*"
                                         r"missing column .*--stream-col none"):  # fmt: skip
        pipeline.run_range(con, source)
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)  # nothing written


def test_a_nested_partition_in_a_day_folder_was_committed_as_an_empty_day(small):
    con, source, _, tmp = small
    folder = tmp / "landing" / f"date={day(3).isoformat()}"
    (folder / "part=0").mkdir()
    (folder / "events.parquet").rename(folder / "part=0" / "events.parquet")
    before = snapshot(con)
    with pytest.raises(StoreError, match=r"sub-folder 'part=0'"):
        pipeline.run_range(con, source)
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_a_mistyped_stream_column_is_an_error_not_one_stream(small):
    con, _, _, tmp = small
    src = storage.EventSource.parse(str(tmp / "landing"), storage.ColumnMap(stream="strem"))
    with pytest.raises(InputError, match=r"column 'strem': .*missing column"):
        pipeline.run_range(con, src)
    assert table(con, "scored_events").height == 0


def test_a_nan_weight_in_a_stored_state_committed_nan_scores_before_the_check(small):
    """A NaN in day 2's stored state: day 3 used to commit 200 NaN protected scores, then fail
    probabilities_valid, and the next run said "nothing to run". Now: refused, nothing written."""
    con, source, _, _ = small
    pipeline.run_range(con, source, day(0), day(2))
    con.execute("UPDATE calibrator_state SET weights = list_prepend('nan'::DOUBLE, "
                "weights[2:]) WHERE date = ? AND stream = 'a'", [day(2)])  # fmt: skip
    before = snapshot(con)
    # the stored hash chain catches the edit first, naming the day
    with pytest.raises(StateError, match=rf"the stored state of day {day(2)} was altered"):
        pipeline.run_range(con, source, day(3), day(3))
    # without a recorded hash (a database of schema version < 5), the state's own check
    con.execute("UPDATE pipeline_days SET state_hash = NULL, prev_state_hash = NULL")
    before = snapshot(con)
    with pytest.raises(StateError, match=r"state vector \d+ holds nan at position 0"):
        pipeline.run_range(con, source, day(3), day(3))
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_an_altered_change_detector_column_is_refused_with_nothing_written(small):
    """The detector's state (#35) is in the stored state's hash once a row carries it: raising
    a stream's CUSUM statistic by hand (which would fire or hold back its next change point)
    is refused by the hash chain, naming the day, and nothing is written."""
    con, source, _, _ = small
    pipeline.run_range(con, source, day(0), day(2))
    carried = storage.query(con, "SELECT count(*) FROM calibrator_state WHERE date = ? AND "
                                 "change_log10_cusum IS NOT NULL", [day(2)]).item()  # fmt: skip
    assert carried > 0  # the rows carry the detector, so the edit below is a real one
    con.execute("UPDATE calibrator_state SET change_log10_cusum = change_log10_cusum + 1 "
                "WHERE date = ? AND stream = 'a'", [day(2)])  # fmt: skip
    before = snapshot(con)
    with pytest.raises(StateError, match=rf"the stored state of day {day(2)} was altered"):
        pipeline.run_range(con, source, day(3), day(3))
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_a_stored_state_breaking_a_carried_rule_is_refused_naming_its_stream(small):
    """The rules `engine.state.check_carried` holds a loaded state to (#36 review), through a
    whole `calpipe run`: without a recorded hash (a database of schema version < 5), a NaN
    running peak of the martingale is refused naming the stream and the column, and nothing is
    written."""
    con, source, _, _ = small
    pipeline.run_range(con, source, day(0), day(2))
    con.execute("UPDATE pipeline_days SET state_hash = NULL, prev_state_hash = NULL")
    con.execute("UPDATE calibrator_state SET log10_martingale_max = 'nan'::DOUBLE "
                "WHERE date = ? AND stream = 'b'", [day(2)])  # fmt: skip
    before = snapshot(con)
    with pytest.raises(StateError, match=r"stream='b'.*column 'log10_martingale_max': must be "
                                         r"a finite number"):  # fmt: skip
        pipeline.run_range(con, source, day(3), day(3))
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)


def test_deleted_state_rows_restarted_their_streams_from_scratch(small):
    """Deleting one stream's calibrator_state row of day 2: day 3 restarted that stream and
    state_continuity passed. Now day 3 is refused (nothing written) and the check fails."""
    con, source, _, _ = small
    pipeline.run_range(con, source, day(0), day(2))
    con.execute("DELETE FROM calibrator_state WHERE date = ? AND stream = 'a'", [day(2)])
    before = snapshot(con)
    with pytest.raises(StateError, match=rf"calibrator_state of {day(2)} has 1 rows, but "
                                         r"pipeline_days recorded 2 streams whose state "
                                         r"changed that day"):  # fmt: skip
        pipeline.run_range(con, source, day(3), day(3))
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)
    outcome = pipeline.check_state_continuity(con, day(0), day(2))
    assert not outcome.passed
    assert f"calibrator_state of {day(2)} has 1 rows for the 2 streams" in outcome.description


def test_outputs_that_are_no_probability_are_refused_before_the_commit():
    from calpipe.night.chain import check_outputs

    ok = pl.DataFrame({"stream": ["a"], "event_id": [1], "protected_score": [0.3],
                       "log10_martingale": [0.1]})  # fmt: skip
    check_outputs(ok, day(0))
    for col, v in (("protected_score", float("nan")), ("protected_score", 1.5),
                   ("log10_martingale", float("inf"))):  # fmt: skip
        with pytest.raises(StateError, match=r"day .*, stream 'a', event 1: .*nothing of the day"):
            check_outputs(ok.with_columns(pl.lit(v).alias(col)), day(0))


def test_duplicate_events_across_a_day_are_refused(small):
    con, source, _, tmp = small
    target = tmp / "landing" / f"date={day(1).isoformat()}" / "events.parquet"
    ev = pl.read_parquet(target)
    pl.concat([ev, ev.head(1)]).write_parquet(target)
    with pytest.raises(InputError, match="duplicate"):
        run_days(con, source, day(0), day(1))


def test_chunked_backfill_equals_single_days(small, monkeypatch):
    con, source, _, tmp = small
    monkeypatch.setattr(transactions, "CHUNK_DAYS", 3)  # 8 days = 3 transactions
    pipeline.run_range(con, source)
    chunked = snapshot(con)
    con2 = storage.connect(tmp / "db2.duckdb")
    try:
        for i in range(8):
            run_days(con2, source, day(i), day(i))
        for t in ALL_TABLES:
            assert table(con2, t).equals(chunked[t]), t
    finally:
        con2.close()


# ----------------------------------------------------------------------------------------------
# The nightly run writes the same rows whatever its batches, transactions and spans
# ----------------------------------------------------------------------------------------------
DRIFTING = (
    StreamSpec("calm", events_per_day=40),
    StreamSpec("hot", "overconfident", 0, 60, strength=4.0),
    StreamSpec("late", "shift", 4, 50, strength=2.5),
    StreamSpec("quiet", events_per_day=3),
)


@pytest.fixture
def drifting(tmp_path):
    """8 days of streams that cross the alarm level on different days; event times are
    truncated to the hour, so the event id orders many events of a stream (ties in time)."""
    events = generate.generate(n_days=8, streams=DRIFTING, seed=11).with_columns(
        pl.col("event_time").dt.truncate("1h")
    )
    return events, tmp_path


@pytest.mark.parametrize(
    ("batch_rows", "transaction_rows", "label_dtype"),
    [
        (10**9, 10**9, pl.Int32),  # one batch per day, the whole range in one transaction
        (25, 1, pl.Int32),  # batches of streams, a transaction per day
        (60, 200, pl.Int64),  # another label type: events cast after the engine validated them
    ],
)
def test_nightly_run_writes_the_same_rows_in_batches_transactions_and_spans(
    drifting, monkeypatch, batch_rows, transaction_rows, label_dtype
):
    """Batches of streams, transactions of several days and spans of days (one engine pass)
    write exactly the rows of one batch a day, a transaction a day, no span: each day run
    on its own (a dagster partition)."""
    events, tmp = drifting
    storage.write_landing(events.with_columns(pl.col("label").cast(label_dtype)), tmp / "landing")
    source = storage.EventSource.parse(str(tmp / "landing"))
    fused, staged = storage.connect(tmp / "fused.duckdb"), storage.connect(tmp / "staged.duckdb")
    try:
        for i in range(8):  # the reference: each day on its own, one batch
            pipeline.run_range(staged, source, day(i), day(i), first_day=day(0), spans=False)
        monkeypatch.setattr(nightly, "PROTECT_BATCH_ROWS", batch_rows)
        monkeypatch.setattr(transactions, "TRANSACTION_ROWS", transaction_rows)
        monkeypatch.setattr(transactions, "CHUNK_DAYS", 5)
        summary = pipeline.run_range(fused, source)
        assert (summary.days, summary.events) == (8, events.height)
        for t in ALL_TABLES:
            assert table(fused, t).equals(table(staged, t)), t
        # the alarms are there (the test could not pass with empty tables) and are the first
        # crossings in replay order (event_time, then event_id)
        alarms = table(fused, "martingale_alarms")
        assert set(alarms["stream"]) >= {"hot", "late"}
        first = (
            table(fused, "v_protected_scores")
            .filter(pl.col("log10_martingale") >= config.ALARM_LOG10_THRESHOLD)
            .sort("stream", "event_time", "event_id")
            .group_by("stream", maintain_order=True)
            .first()
        )
        assert alarms.select("stream", "event_id", "log10_martingale").equals(
            first.select("stream", "event_id", "log10_martingale")
        )
        # and the engine's one pass over all the events
        one = calpipe.protect(events, method=Settings().method).join(
            table(fused, "protected_scores"), on=["stream", "event_id"], suffix="_c"
        )
        assert one.height == events.height
        assert (one["protected_score"] - one["protected_score_c"]).abs().max() <= TOL
    finally:
        fused.close()
        staged.close()


def test_transactions_span_whole_days_up_to_the_event_budget(monkeypatch):
    """A transaction starts at a day and takes as many days as fit in TRANSACTION_ROWS at that
    day's size (at least one, at most CHUNK_DAYS): what bounds a backfill's memory."""
    sizes = [5, 5, 50, 5, 5, 5, 5, 0]
    monkeypatch.setattr(transactions, "TRANSACTION_ROWS", 10)
    monkeypatch.setattr(transactions, "CHUNK_DAYS", 3)
    spans, d = [], day(0)
    while d <= day(7):
        e = transactions.transaction_end(d, day(7), sizes[(d - START).days])
        spans.append(((d - START).days, (e - START).days))
        d = e + dt.timedelta(days=1)
    assert spans == [(0, 1), (2, 2), (3, 4), (5, 6), (7, 7)]


def test_a_run_commits_in_the_transactions_the_days_sizes_make(tmp_path, monkeypatch):
    """The run's loop (nightly._Nights.write) replaces partitions in the transactions
    transaction_end makes of its days' sizes, reads each day once and in order, and writes
    each day's rows (days of 3,000 events at TRANSACTION_ROWS = 5,000: one day a
    transaction; at 10,000: three days, run as one span)."""
    import calpipe.pipeline.nightly as nightly

    landing = tmp_path / "landing"
    streams = (StreamSpec("a", events_per_day=1_000), StreamSpec("b", events_per_day=2_000))
    storage.write_landing(generate.generate(n_days=3, streams=streams, seed=5), landing)
    real, spans = storage.replacing_partitions, []

    def replacing(con, start, end, tables, *, background=False):
        spans.append((start, end))
        return real(con, start, end, tables, background=background)

    monkeypatch.setattr(storage, "replacing_partitions", replacing)
    for budget, want in ((5_000, 3), (10_000, 1)):
        spans.clear()
        monkeypatch.setattr(transactions, "TRANSACTION_ROWS", budget)
        con = storage.connect(tmp_path / f"db{budget}.duckdb")
        try:
            s = nightly.run_range(con, storage.EventSource.parse(str(landing)))
            n = storage.fetch_one(con, "SELECT count(DISTINCT event_date) FROM scored_events")
        finally:
            con.close()
        assert len(spans) == want and s.days == 3 and n == (3,)
        assert spans[0][0] == s.start and spans[-1][1] == s.end


def test_daily_metrics_equal_the_metrics_expressions():
    """The per-group sums of daily_metrics against calpipe.metrics' polars expressions (the
    definitions), with a group without labels (nulls) and clipped log losses."""
    rng = np.random.default_rng(3)
    n = 5_000
    label = pl.Series((rng.random(n) < 0.4).astype(np.int32)).set(
        pl.Series(rng.random(n) < 0.2), None
    )
    scores = pl.DataFrame(
        {
            "stream": rng.choice(["a", "b", "c"], n),
            "base_score": np.where(rng.random(n) < 0.01, 0.0, rng.random(n)),
            "protected_score": rng.random(n),
            "label": label,
            "log10_martingale": rng.normal(size=n),
        }
    ).vstack(
        pl.DataFrame(
            {"stream": ["d"] * 2, "base_score": [0.5, 0.6], "protected_score": [0.4, 0.7],
             "label": [None, None], "log10_martingale": [0.1, 0.3]},
            schema_overrides={"label": pl.Int32},
        )
    )  # fmt: skip
    got = pipeline.daily_metrics(scores, keys=["stream"])
    b, p, y = "base_score", "protected_score", "label"
    want = (
        scores.group_by("stream")
        .agg(
            pl.len().cast(pl.Int64).alias("n_events"),
            pl.col(y).is_not_null().sum().cast(pl.Int64).alias("n_labelled"),
            *calpipe.metrics.base_vs_protected(b, p, y),
            calpipe.metrics.ece(b, y, n_bins=pipeline.ECE_BINS).alias("base_ece"),
            calpipe.metrics.ece(p, y, n_bins=pipeline.ECE_BINS).alias("protected_ece"),
            calpipe.metrics.smooth_ece(b, y).alias("base_smooth_ece"),
            calpipe.metrics.smooth_ece(p, y).alias("protected_smooth_ece"),
            *[
                calpipe.metrics.corp(col, y, score=s).struct.field(f).alias(f"{who}_{name}_{a}")
                for who, col in (("base", b), ("protected", p))
                for s, name in (("log", "log_loss"), ("brier", "brier"))
                for f, a in (("miscalibration", "mcb"), ("discrimination", "dsc"))
            ],
            *[
                calpipe.metrics.corp(b, y, score=s).struct.field("uncertainty").alias(f"{n}_unc")
                for s, n in (("log", "log_loss"), ("brier", "brier"))
            ],
            pl.col(b).mean().alias("mean_score"),
            pl.col(p).mean().alias("mean_protected"),
            pl.col(y).cast(pl.Float64).mean().alias("mean_label"),
            pl.col("log10_martingale").max().alias("log10_martingale_max"),
        )
        .sort("stream")
        .select(got.columns)
    )
    assert got.select("stream", "n_events", "n_labelled").equals(
        want.select("stream", "n_events", "n_labelled")
    )
    for c in got.columns[3:]:
        g, w = got[c].to_numpy(), want[c].to_numpy()
        assert np.array_equal(np.isnan(g), np.isnan(w)), c  # null -> NaN in both
        assert np.allclose(g[~np.isnan(g)], w[~np.isnan(w)], rtol=1e-12, atol=0), c
    assert got.filter(pl.col("stream") == "d")["base_log_loss"].is_null().all()


def test_a_bad_event_in_a_batched_day_names_its_event_and_writes_nothing(small, monkeypatch):
    con, source, _events, tmp = small
    monkeypatch.setattr(nightly, "PROTECT_BATCH_ROWS", 10)
    pipeline.run_range(con, source, day(0), day(1))
    before = snapshot(con)
    target = tmp / "landing" / f"date={day(2).isoformat()}" / "events.parquet"
    good = pl.read_parquet(target)
    bad_id = good.filter(pl.col("stream") == "b")["event_id"][1]
    good.with_columns(
        pl.when(pl.col("event_id") == bad_id).then(None).otherwise(pl.col("score")).alias("score")
    ).write_parquet(target)
    with pytest.raises(InputError, match=rf"day {day(2)}, stream 'b', event {bad_id}: null score"):
        pipeline.run_range(con, source, day(2), day(3))
    for t in ALL_TABLES:
        assert table(con, t).equals(before[t]), t


# ----------------------------------------------------------------------------------------------
# The serving map
# ----------------------------------------------------------------------------------------------
FAMILIES = [
    ("composite-jumper", {}),
    ("composite-jumper", {"family": "cox"}),
    ("jumper", {"family": "quadratic"}),
    ("mean-jumper", {"family": "cubic"}),
]


@pytest.mark.parametrize(("method", "params"), FAMILIES)
def test_serving_map_is_the_next_forecast_and_the_exact_terms(method, params):
    settings = Settings.make(method, **params)
    events = generate.generate(n_days=6, streams=SMALL, seed=9)
    st = calpipe.protect_with_state(events, method=method, **params).state
    p = np.concatenate([np.linspace(0, 1, 101), [1e-6, 1 - 1e-6]])
    fresh = pl.DataFrame({"stream": np.repeat(["a", "b"], p.size), "score": np.tile(p, 2)})
    mapped = pipeline.serving_map(st, fresh, settings)["protected_score"].to_numpy()
    # 1. the forecast an unlabelled next event gets from the engine
    nxt = fresh.with_columns(
        pl.lit(dt.datetime(2030, 1, 1)).alias("event_time"),
        (pl.int_range(pl.len()) + 10**9).cast(pl.Int64).alias("event_id"),
        pl.lit(None, pl.Int32).alias("label"),
    )
    # one event per call: the state does not move on unlabelled events, so all share it
    engine = calpipe.protect_with_state(nxt, state=st, method=method, **params).scores
    assert np.max(np.abs(engine["protected_score"].to_numpy() - mapped)) <= TOL
    # 2. the exact weighted terms stored in calibration_map
    terms = pipeline.map_terms(st.with_columns(pl.lit(START).alias("date")), settings)
    cal = settings.calibrator()
    fam = cal.family(2)
    q = np.clip(p, cal.params["clip"], 1 - cal.params["clip"])
    f = calpipe.families.evaluate(fam, q)  # (n, T)
    for i, s in enumerate(["a", "b"]):
        w = terms.filter(pl.col("stream") == s).sort("term")["weight"].to_numpy()
        by_terms = w[0] * q + f @ w[1:]
        assert np.max(np.abs(by_terms - mapped[i * p.size : (i + 1) * p.size])) <= TOL
        assert w.sum() == pytest.approx(1.0, abs=1e-12)  # the weights are a mixture


def test_sql_macro_is_exact_for_other_families_too(tmp_path):
    settings = Settings.make("jumper", family="quadratic")
    events = generate.generate(n_days=4, streams=SMALL, seed=2)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(
            con, storage.EventSource.parse(str(tmp_path / "landing")), settings=settings
        )
        state = storage.query(con, "SELECT * FROM calibrator_state WHERE date = ?", [day(3)]).drop(
            "date"
        )
        p = np.linspace(0, 1, 201)
        want = pipeline.serving_map(
            state, pl.DataFrame({"stream": ["b"] * p.size, "score": p}), settings
        )
        got = con.execute(
            "SELECT calibrate_score('b', s) FROM unnest(?) AS t(s)", [p.tolist()]
        ).fetchall()
        assert (
            np.max(np.abs(np.array([g[0] for g in got]) - want["protected_score"].to_numpy()))
            <= TOL
        )
        assert con.execute("SELECT calibrate_score('nope', 0.5)").fetchall() == [(None,)]
    finally:
        con.close()


def test_serving_map_multiclass_is_the_next_forecast():
    rng = np.random.default_rng(4)
    n = 300
    raw = rng.dirichlet(np.ones(3), n)
    labels = np.array([rng.choice(3, p=r[[1, 2, 0]]) for r in raw])  # miscalibrated on purpose
    ev = pl.DataFrame(
        {
            "event_time": np.arange(n),
            "event_id": np.arange(n),
            "scores": raw.tolist(),
            "label": labels,
        }
    )
    st = calpipe.protect_with_state(ev, scores="scores").state.with_columns(
        pl.lit("x").alias("stream")
    )  # the pipeline's default method, which serving_map uses without settings
    fresh_v = rng.dirichlet(np.ones(3), 5)
    fresh = pl.DataFrame({"stream": ["x"] * 5, "score": fresh_v.tolist()})
    got = np.array(pipeline.serving_map(st, fresh)["protected_scores"].to_list())
    nxt = pl.DataFrame(
        {
            "event_time": [n + 1] * 5,
            "event_id": n + np.arange(5),
            "scores": fresh_v.tolist(),
            "label": [None] * 5,
        },
        schema_overrides={"label": pl.Int64},
    )
    engine = calpipe.protect_with_state(nxt, scores="scores", state=st.drop("stream")).scores
    np.testing.assert_allclose(
        got, np.array(engine["protected_scores"].to_list()), atol=TOL, rtol=0
    )
    assert np.abs(got - fresh_v).max() > 1e-3


def test_serving_map_of_an_unknown_stream_is_null():
    ev = generate.generate(n_days=2, streams=SMALL[:1], seed=1)
    st = calpipe.protect_with_state(ev).state
    out = pipeline.serving_map(st, pl.DataFrame({"stream": ["a", "zz"], "score": [0.5, 0.5]}))
    assert out["protected_score"][1] is None and out["protected_score"][0] is not None


def test_serving_map_refuses_a_state_of_another_configuration():
    ev = generate.generate(n_days=2, streams=SMALL[:1], seed=1)
    st = calpipe.protect_with_state(ev, method="composite-jumper", pi=0.25).state
    with pytest.raises(StateError, match="another configuration"):
        pipeline.serving_map(st, pl.DataFrame({"stream": ["a"], "score": [0.5]}))


# ----------------------------------------------------------------------------------------------
# Settings, checks, CLI
# ----------------------------------------------------------------------------------------------
def test_settings_round_trip():
    s = Settings.make("composite-jumper", jumping_rates=[0.1, 0.01], pi=0.3)
    assert Settings.from_json(s.to_json()) == s
    assert s.fingerprint != Settings().fingerprint
    brier = Settings.make("composite-jumper", loss="brier", clip=None)
    assert Settings.from_json(brier.to_json()) == brier
    with pytest.raises(ParameterError):
        Settings.make(pi=2.0)


def test_checks_catch_broken_tables(small):
    con, source, _, _ = small
    pipeline.run_range(con, source)
    assert pipeline.check_row_counts(con, day(0), day(7)).passed
    con.execute("DELETE FROM protected_scores WHERE event_date = ? AND stream = 'a'", [day(5)])
    con.execute(
        "UPDATE protected_scores SET protected_score = 1.5 WHERE event_date = ? AND stream = 'b'",
        [day(6)],
    )
    con.execute("DELETE FROM pipeline_days WHERE date = ?", [day(3)])
    con.execute("UPDATE calibrator_state SET n_events = n_events + 1 WHERE date = ?", [day(6)])
    rows = pipeline.check_row_counts(con, day(0), day(7))
    assert not rows.passed and rows.details.row(0)[:2] == (day(5), "a")
    assert not pipeline.check_probabilities(con, day(0), day(7)).passed
    cont = pipeline.check_state_continuity(con, day(0), day(7))
    assert not cont.passed and "2010-07-24" in cont.description and "counts" in cont.description
    assert pipeline.check_probabilities(con, day(0), day(5)).passed


def test_the_estimates_check_finds_missing_stale_and_invalid_estimates(small):
    """#35: each day and stream with protected rows has one valid performance estimate; a row
    deleted (as in a database made before they existed), one out of its loss's range, one
    outside its own interval and one without events are each named with their rule."""
    con, source, _, _ = small
    pipeline.run_range(con, source)
    assert pipeline.check_estimates(con, day(0), day(7)).passed
    con.execute("DELETE FROM performance_estimates WHERE date = ? AND stream = 'a'", [day(2)])
    con.execute("UPDATE performance_estimates SET base_expected_accuracy = 1.5 "
                "WHERE date = ? AND stream = 'b'", [day(4)])  # fmt: skip
    con.execute("UPDATE performance_estimates SET expected_log_loss_low = expected_log_loss + 1 "
                "WHERE date = ? AND stream = 'a'", [day(5)])  # fmt: skip
    con.execute("INSERT INTO performance_estimates (date, stream, events) VALUES (?, 'gone', 3)",
                [day(6)])  # fmt: skip
    out = pipeline.check_estimates(con, day(0), day(7))
    assert not out.passed and out.values == {"bad_day_streams": 4}
    assert out.details.select("date", "stream", "rule").rows() == [
        (day(2), "a", "no estimate"),
        (day(4), "b", "base_expected_accuracy out of range"),
        (day(5), "a", "expected_log_loss outside its interval"),
        (day(6), "gone", "an estimate without protected rows"),
    ]
    assert out.description.startswith(
        f"4 (day, stream) with a missing or invalid performance estimate, first {day(2)} stream "
        f"'a': no estimate (a database made before schema version 12: re-run the days from {day(2)}"
    )
    assert pipeline.check_estimates(con, day(7), day(7)).passed  # the other days' rows only


def test_cli_run_sql_and_ui(small, capsys):
    con, source, _, tmp = small
    con.close()
    db = tmp / "cli.duckdb"
    assert (
        cli.main(["run", "--events", source.location, "--db", str(db), "--end", day(3).isoformat()])
        == 0
    )
    assert (
        cli.main(["run", "--events", source.location, "--db", str(db)]) == 0
    )  # the nightly increment
    out = capsys.readouterr().out
    assert (
        f"ran 4 day(s) {day(0)} .. {day(3)}" in out and f"ran 4 day(s) {day(4)} .. {day(7)}" in out
    )
    assert cli.main(["run", "--events", source.location, "--db", str(db), "--pi", "0.3"]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert (
        cli.main(
            [
                "run",
                "--events",
                source.location,
                "--db",
                str(db),
                "--start",
                day(7).isoformat(),
                "--pi",
                "0.3",
            ]
        )
        == 2
    )
    assert "config fingerprint" in capsys.readouterr().err
    assert (
        cli.main(["sql", "--db", str(db), "SELECT count(*) AS n FROM v_protected_scores", "--csv"])
        == 0
    )
    n = int(capsys.readouterr().out.split()[-1])
    assert (
        n
        == storage.query(
            storage.connect(db, read_only=True), "SELECT count(*) FROM scored_events"
        ).item()
    )
    assert cli.main(["sql", "--db", str(db), "SELECT * FROM nowhere"]) == 2
    assert cli.main(["ui", "--db", str(db), "--dry-run", "--port", "3999"]) == 0
    out = capsys.readouterr().out
    # dagster's app served behind the guard in one process, on 3999 only (no internal port)
    assert "-m calpipe.dagster_project.webserver --port 3999 --db " in out
    # one dagster instance per database, beside it: another database's runs never show
    assert f"DAGSTER_HOME={db.resolve().with_name(db.stem + '.dagster')}" in out
    other = db.resolve().parent / "other.duckdb"
    assert cli_pipeline.dagster_home(other) != cli_pipeline.dagster_home(db.resolve())
    # the partitions follow the database and its landing folder (#37: a frozen last_day, or
    # "up to yesterday", were handed to the location here)
    assert "CALPIPE_START_DATE" not in out and "CALPIPE_END_DATE" not in out
    assert "does not exist yet" not in out
    # a database that does not exist: said, and not created (the UI would create it)
    assert cli.main(["ui", "--db", str(other), "--dry-run", "--events", "landing"]) == 0
    out = capsys.readouterr().out
    assert f"note: {other} does not exist yet" in out and "from landing" in out
    assert not other.exists()


def test_cli_run_from_a_table_with_renamed_columns(tmp_path, capsys):
    events = generate.generate(n_days=3, streams=SMALL, seed=8).rename(
        {"stream": "segment", "event_time": "ts", "score": "p", "label": "y"}
    )
    db = tmp_path / "t.duckdb"
    con = storage.connect(db)
    con.register("ev", events.to_arrow())
    con.execute("CREATE TABLE raw_events AS SELECT * FROM ev")
    con.close()
    rc = cli.main(["run", "--events", "raw_events", "--db", str(db), "--stream-col", "segment",
                   "--time-col", "ts", "--score-col", "p", "--label-col", "y"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    con = storage.connect(db, read_only=True)
    try:
        assert storage.query(con, "SELECT count(*) FROM protected_scores").item() == events.height
        assert set(
            storage.query(con, "SELECT DISTINCT stream FROM protected_scores")["stream"]
        ) == {
            "a",
            "b",
        }
    finally:
        con.close()


def test_cli_run_from_csv_equals_the_same_events_from_parquet(tmp_path, capsys):
    """CSV files (a header row; DuckDB sniffs the types, the contract checks them) give the
    same tables as the same events in Parquet, and a bad CSV value names its column."""
    events = generate.generate(n_days=3, streams=SMALL, seed=12).rename({"event_time": "ts"})
    events.write_parquet(tmp_path / "ev.parquet")
    for d, part in events.group_by(events["ts"].dt.date()):
        part.write_csv(tmp_path / f"ev_{d[0]}.csv")
    for name, src in (("p", "ev.parquet"), ("c", "ev_*.csv")):
        rc = cli.main(["run", "--events", str(tmp_path / src), "--db", str(tmp_path / f"{name}.duckdb"),
                       "--time-col", "ts", "--no-progress"])  # fmt: skip
        assert rc == 0, capsys.readouterr().err
    tables = {}
    for name in ("p", "c"):
        con = storage.connect(tmp_path / f"{name}.duckdb", read_only=True)
        tables[name] = {
            t: storage.query(con, f"SELECT * FROM {t}")
            for t in ("protected_scores", "calibration_daily", "calibrator_state")
        }
        con.close()
    for t, frame in tables["p"].items():
        assert frame.sort(frame.columns[:3]).equals(tables["c"][t].sort(frame.columns[:3])), t
    bad = events.with_columns(
        score=pl.when(pl.col("event_id") == 5).then(pl.lit(1.7)).otherwise("score")
    )
    bad.write_csv(tmp_path / "bad.csv")
    assert cli.main(["run", "--events", str(tmp_path / "bad.csv"), "--db", str(tmp_path / "b.duckdb"),
                     "--time-col", "ts", "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "column 'score'" in err and "outside [0, 1]" in err, err
    assert not (tmp_path / "b.duckdb").exists()  # nothing written: not even the file


@pytest.mark.parametrize("module", ["storage", "pipeline", "generate", "plots"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    mod = importlib.import_module(f"calpipe.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_cli_sql_queries_run_with_duckdbs_default_memory_limit(tmp_path, capsys):
    """The pipeline's read-write connections use a small buffer pool; a user's query does not."""
    db = tmp_path / "q.duckdb"
    storage.connect(db).close()
    assert (
        cli.main(["sql", "SELECT current_setting('memory_limit') AS m", "--db", str(db), "--csv"])
        == 0
    )
    shown = capsys.readouterr().out.strip().splitlines()[-1]
    default = duckdb.connect().sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert shown == default


def test_only_errors_of_the_source_were_meant_to_read_reading_the_source(small, capsys):
    """Every duckdb.Error of `calpipe run` was labelled "reading <source>"; a broken Parquet
    file is still a read error, and names the file."""
    con, source, _, tmp = small
    con.close()
    target = tmp / "landing" / f"date={day(2).isoformat()}" / "events.parquet"
    target.write_bytes(b"PAR1 not really parquet PAR1")
    db = tmp / "cli.duckdb"
    assert cli.main(["run", "--events", source.location, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"calpipe: error: reading {target}: not a readable Parquet file" in err
    with pytest.raises(StoreError, match=r"reading table no_such_table: .*no_such_table"):
        storage.EventSource.parse("no_such_table").date_range(storage.connect(tmp / "x.duckdb"))


def test_calpipe_run_piped_into_head_ran_its_checks(small):
    """`calpipe run | head -1`: the BrokenPipeError of a progress line aborted the run after its
    commit, skipping the data checks, with a traceback. It now runs to its end, exit 0."""
    import os
    import subprocess
    import sys

    con, source, _, tmp = small
    con.close()
    db = tmp / "piped.duckdb"
    cmd = (f'"{sys.executable}" -m calpipe.cli run --events "{source.location}" --db "{db}" '
           '| head -c 1 > /dev/null; exit "${PIPESTATUS[0]}"')  # fmt: skip
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr
    con = storage.connect(db)
    assert storage.fetch_one(con, "SELECT count(*) FROM pipeline_days")[0] == 8
    con.close()


def test_a_megabyte_stream_name_committed_its_day_then_broke_the_checks(small):
    con, source, _, tmp = small
    target = tmp / "landing" / f"date={day(2).isoformat()}" / "events.parquet"
    ev = pl.read_parquet(target)
    huge = "s" * 1_000_000
    ev.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.lit(huge))
                    .otherwise(pl.col("stream")).alias("stream")).write_parquet(target)  # fmt: skip
    before = snapshot(con)
    with pytest.raises(InputError) as info:
        pipeline.run_range(con, source)
    msg = str(info.value)
    assert f"day {day(2)}" in msg and "stream name longer than 1024 bytes" in msg
    assert "(value: 1000000)" in msg and len(msg) < 600  # the name is cut, not printed whole
    after = snapshot(con)
    assert all(after[t].equals(before[t]) for t in before)
    assert table(con, "scored_events").height == 0


def test_calpipe_sql_is_read_only_and_never_creates_a_file(small, capsys):
    """A read-only `calpipe sql` ran the DDL (installing, or migrating a newer database), and a
    mistyped --db created an empty file and exited 0."""
    con, source, _, tmp = small
    con.close()
    db = tmp / "cli.duckdb"
    assert cli.main(["run", "--events", source.location, "--db", str(db), "--end",
                     day(1).isoformat()]) == 0  # fmt: skip
    capsys.readouterr()
    assert cli.main(["sql", "--db", str(db), "CREATE TABLE t (x INT)"]) == 2
    assert "read-only" in capsys.readouterr().err
    assert cli.main(["sql", "--db", str(db), "--write", "CREATE TABLE t (x INT)"]) == 0
    missing = tmp / "typo.duckdb"
    for extra in ([], ["--write"]):
        assert cli.main(["sql", "--db", str(missing), *extra, "SELECT 1"]) == 2
        assert f"database {missing}" in capsys.readouterr().err and not missing.exists()


@pytest.mark.parametrize(
    "inputs",
    [
        None,
        (
            "ops",
            "obs",
            "platt:window=30:refit_every=10",
            "beta:window=40:refit_every=20",
            "beta:window=400:refit_every=50",
            "decay-beta:memory=40",
        ),
    ],
)
def test_sql_macro_equals_the_serving_map_of_composite_experts(tmp_path, inputs):
    """composite-experts had no SQL serving map: each term now carries its input's logistic map
    (OPS, OBS, windowed Platt/beta; an unfilled window is the base), so calibrate_score equals
    serving_map. The second grid mixes filled windows (30, 40) and one still filling (400)."""
    settings = Settings.make("composite-experts", **({"inputs": inputs} if inputs else {}))
    events = generate.generate(n_days=4, streams=SMALL, seed=2)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(
            con, storage.EventSource.parse(str(tmp_path / "landing")), settings=settings
        )
        state = storage.query(con, "SELECT * FROM calibrator_state WHERE date = ?", [day(3)]).drop(
            "date"
        )
        p = np.linspace(0, 1, 201)
        for stream in ("a", "b"):
            want = pipeline.serving_map(
                state, pl.DataFrame({"stream": [stream] * p.size, "score": p}), settings
            )["protected_score"].to_numpy()
            got = con.execute(
                "SELECT calibrate_score(?, s) FROM unnest(?) AS t(s)", [stream, p.tolist()]
            ).fetchall()
            assert np.max(np.abs(np.array([g[0] for g in got]) - want)) <= TOL
        n_terms = storage.query(con, "SELECT count(DISTINCT term) AS n FROM calibration_map")["n"][
            0
        ]
        assert n_terms == 1 + (1 + len(settings.calibrator().input_specs(2))) * 21
    finally:
        con.close()


def test_composite_experts_over_a_temperature_input_has_no_sql_map(tmp_path):
    """An input without a logistic map or a table of its own (a windowed temperature fit) has
    no SQL form: no calibration_map rows (serving_map() serves it). Inputs that are tables
    (isotonic, ...) have one: tests/pipeline/test_mapping.py."""
    settings = Settings.make("composite-experts", inputs=("ops", "temperature:window=20"))
    events = generate.generate(n_days=2, streams=SMALL, seed=2)
    storage.write_landing(events, tmp_path / "landing")
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        pipeline.run_range(
            con, storage.EventSource.parse(str(tmp_path / "landing")), settings=settings
        )
        assert storage.query(con, "SELECT count(*) AS n FROM calibration_map")["n"][0] == 0
    finally:
        con.close()


def test_checks_that_outgrow_their_small_pool_run_again_at_the_default_one(small, monkeypatch):
    """calpipe run checks its days at storage.session.CHECKS_MEMORY_LIMIT (their scans cached 240 MB of
    a 60-night run at the default pool); a check that needs more memory than that is run again
    at the default pool (the days are committed already), and the connection keeps the default
    pool afterwards."""
    from calpipe.pipeline import checks

    con, source, _, _ = small
    default = storage.fetch_one(con, "SELECT current_setting('memory_limit')")[0]
    pool, limits = [None], []
    real_drop, real = storage.drop_block_cache, checks.check_probabilities

    def drop(con, limit=None):  # the pool the pipeline asks for
        pool[0] = limit
        real_drop(con, limit)

    def probabilities_at(con, start, end):  # the pool each attempt ran at (not asked of DuckDB:
        limits.append(pool[0])  # at a 1 MB pool that query itself may run out of memory)
        return real(con, start, end)

    monkeypatch.setattr(storage, "drop_block_cache", drop)
    monkeypatch.setattr(checks, "check_probabilities", probabilities_at)
    monkeypatch.setattr(storage.session, "CHECKS_MEMORY_LIMIT", "1MB")  # too small for the checks
    s = pipeline.run_range(con, source)
    assert all(c.passed or c.warning for c in s.checks)
    assert limits == ["1MB", None]  # the small pool, then the retry at the default one
    assert storage.fetch_one(con, "SELECT current_setting('memory_limit')")[0] == default


def test_the_change_points_check_passes_on_the_demo_and_names_a_tampered_row(demo, tmp_path):
    _, con = demo
    ok = pipeline.check_change_points(con, pipeline.DEMO_FIRST_DAY, pipeline.DEMO_LAST_DAY)
    n = storage.query(con, "SELECT count(*) AS n FROM change_points")["n"][0]
    assert ok.passed and n > 0 and ok.values == {"change_points": n, "bad_change_points": 0}
    copy = duckdb.connect()
    try:
        copy.register("cp", storage.query(con, "SELECT * FROM change_points").to_arrow())
        copy.register("st", storage.query(con, "SELECT * FROM calibrator_state").to_arrow())
        copy.execute("CREATE TABLE change_points AS SELECT * FROM cp")
        copy.execute("CREATE TABLE calibrator_state AS SELECT * FROM st")
        first = copy.execute(
            "SELECT detected_date, stream FROM change_points ORDER BY ALL LIMIT 1"
        ).fetchone()
        copy.execute("UPDATE change_points SET log10_statistic = 1.0 "
                     "WHERE detected_date = ? AND stream = ?", list(first))  # fmt: skip
        bad = pipeline.check_change_points(copy, pipeline.DEMO_FIRST_DAY, pipeline.DEMO_LAST_DAY)
    finally:
        copy.close()
    assert not bad.passed and not bad.warning
    assert f"first {first[0]} stream {first[1]!r}" in bad.description
    assert "below its threshold" in bad.description
