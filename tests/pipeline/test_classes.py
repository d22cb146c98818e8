"""calpipe/pipeline/classes.py: K-class forecasts in the pipeline (#12 item 4).

A database stores binary ``score``s or K-class ``scores`` vectors, set by its first events. A
K-class chain equals one ``calpipe.protect(scores=...)`` pass (also night by night with a label
feed: tests/pipeline/test_labels.py, K = 4), its monitoring is the metrics' K-class forms, and a
source of another K is refused with nothing written.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
from sklearn.isotonic import IsotonicRegression

import calpipe
from calpipe import generate, metrics, pipeline, storage
from calpipe.errors import InputError, ParameterError
from calpipe.generate import StreamSpec
from calpipe.pipeline import Settings
from calpipe.pipeline.checks import check_probabilities
from calpipe.pipeline.labels import label_source
from tests.pipeline.test_labels import with_classes

STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", events_per_day=12))
N_DAYS = 4
START = generate.DEFAULT_START
K = 4


@pytest.fixture(scope="module")
def events():
    return with_classes(generate.generate(n_days=N_DAYS, streams=STREAMS, seed=11), K, seed=3)


def run(tmp_path, events, name="db", **kw):
    root = tmp_path / f"{name}_landing"
    storage.write_landing(events, root)
    con = storage.connect(tmp_path / f"{name}.duckdb")
    summary = pipeline.run_range(con, storage.EventSource.parse(str(root)), **kw)
    return con, summary


def vectors(col: pl.Series) -> np.ndarray:
    return np.asarray(col.to_list(), dtype=float)


def test_a_k_class_chain_stores_vectors_equal_to_one_pass(tmp_path, events):
    con, summary = run(tmp_path, events, settings=Settings.make("composite-jumper"))
    try:
        assert all(c.passed for c in summary.checks)
        stored = storage.query(con, "SELECT * FROM scored_events ORDER BY stream, event_id")
        assert stored["score"].null_count() == stored.height
        assert stored["scores"].list.len().unique().to_list() == [K]
        one = calpipe.protect(events, scores="scores", method="composite-jumper")
        got = storage.query(con, "SELECT * FROM v_protected_scores").join(
            one.select("stream", "event_id", pl.col("protected_scores").alias("one")),
            on=["stream", "event_id"],
        )
        assert got.height == events.height
        assert got["protected_score"].null_count() == got.height
        np.testing.assert_array_equal(vectors(got["protected_scores"]), vectors(got["one"]))
        assert vectors(got["scores"]).shape == (events.height, K)
        state = storage.query(con, "SELECT DISTINCT n_classes FROM calibrator_state")
        assert state["n_classes"].to_list() == [K]
        fp = storage.query(con, "SELECT DISTINCT config_fingerprint FROM pipeline_days")
        assert fp.item() == Settings.make("composite-jumper").fingerprint_for(K)
        # a second run resumes the K-class chain: nothing to do, nothing refused
        assert pipeline.run_range(con, summary_source(tmp_path)).days == 0
    finally:
        con.close()


def summary_source(tmp_path):
    return storage.EventSource.parse(str(tmp_path / "db_landing"))


def test_k_class_monitoring_is_the_metrics_k_class_forms(tmp_path, events):
    con, _ = run(tmp_path, events)
    try:
        daily = storage.query(con, "SELECT * FROM calibration_daily ORDER BY date, stream")
        rows = storage.query(
            con, "SELECT event_date AS date, * EXCLUDE (event_date) FROM protected_scores"
        )
        for who in ("base", "protected"):
            col = f"{who}_scores"
            want = (
                rows.group_by("date", "stream")
                .agg(
                    metrics.log_loss(col, "label", multiclass=True).alias("ll"),
                    metrics.brier(col, "label", multiclass=True).alias("brier"),
                    metrics.smooth_ece(col, "label", multiclass=True).alias("sece"),
                )
                .sort("date", "stream")
            )
            np.testing.assert_allclose(daily[f"{who}_log_loss"], want["ll"], rtol=1e-12)
            np.testing.assert_allclose(daily[f"{who}_brier"], want["brier"], rtol=1e-12)
            np.testing.assert_allclose(daily[f"{who}_smooth_ece"], want["sece"], atol=1e-9)
            # ECE of the top label, from its definition: (confidence, correct) per labelled event
            for (d, s), g in rows.filter(pl.col("label").is_not_null()).group_by("date", "stream"):
                p, y = vectors(g[col]), g["label"].to_numpy()
                conf, hit = p.max(axis=1), (p.argmax(axis=1) == y).astype(float)
                b = np.minimum((conf * 10).astype(int), 9)
                ece = sum(abs(conf[b == i].sum() - hit[b == i].sum()) for i in range(10)) / len(y)
                got = daily.filter(pl.col("date") == d, pl.col("stream") == s)[f"{who}_ece"]
                assert got.item() == pytest.approx(ece, abs=1e-12)
            # the classwise CORP of the Brier score, from its definition: per class c, PAV of
            # p_c against 1{y = c} (scikit-learn's isotonic regression), summed over classes
            for (d, s), g in rows.filter(pl.col("label").is_not_null()).group_by("date", "stream"):
                p, y = vectors(g[col]), g["label"].to_numpy()
                mcb = dsc = unc = 0.0
                for c in range(p.shape[1]):
                    hit = (y == c).astype(float)
                    pav = IsotonicRegression(y_min=0, y_max=1).fit_transform(p[:, c], hit)
                    score, best = np.mean((p[:, c] - hit) ** 2), np.mean((pav - hit) ** 2)
                    climat = np.mean((hit.mean() - hit) ** 2)
                    mcb, dsc, unc = mcb + score - best, dsc + climat - best, unc + climat
                got = daily.filter(pl.col("date") == d, pl.col("stream") == s)
                assert got[f"{who}_brier_mcb"].item() == pytest.approx(mcb, abs=1e-12)
                assert got[f"{who}_brier_dsc"].item() == pytest.approx(dsc, abs=1e-12)
                assert got["brier_unc"].item() == pytest.approx(unc, abs=1e-12)
                assert mcb - dsc + unc == pytest.approx(got[f"{who}_brier"].item(), abs=1e-12)
        # the binary-only columns are null, not NaN: the K-class log loss has no CORP
        # decomposition (no unique isotonic recalibration of a vector)
        for c in ("base_log_loss_mcb", "protected_log_loss_dsc", "log_loss_unc", "mean_score",
                  "mean_label"):  # fmt: skip
            assert daily[c].null_count() == daily.height, c
    finally:
        con.close()


def test_a_source_of_another_number_of_classes_is_refused_and_nothing_is_written(tmp_path, events):
    binary = generate.generate(n_days=2, streams=STREAMS, seed=12)
    con, _ = run(tmp_path, binary, name="bin")
    try:
        before = {
            t: storage.query(con, f"SELECT * FROM {t} ORDER BY ALL")
            for t in ("scored_events", "pipeline_days")
        }
        later = events.with_columns(pl.col("event_time") + dt.timedelta(days=2))
        root = tmp_path / "bin_landing"
        storage.write_landing(
            later.filter(pl.col("event_time").dt.date() == START + dt.timedelta(days=2)), root
        )
        with pytest.raises(
            storage.StoreError, match=r"4 classes, but this database stores forecasts of 2"
        ):
            pipeline.run_range(con, storage.EventSource.parse(str(root)))
        for t, rows in before.items():
            assert storage.query(con, f"SELECT * FROM {t} ORDER BY ALL").equals(rows), t
    finally:
        con.close()


def test_pairs_of_probabilities_are_stored_binary(tmp_path):
    binary = generate.generate(n_days=2, streams=STREAMS, seed=13)
    pairs = binary.with_columns(pl.concat_list(1 - pl.col("score"), pl.col("score")).alias("score"))
    a, _ = run(tmp_path, binary, name="a")
    b, _ = run(tmp_path, pairs, name="b")
    try:
        for t in ("scored_events", "protected_scores", "calibrator_state", "calibration_daily"):
            x = storage.query(a, f"SELECT * FROM {t} ORDER BY ALL")
            y = storage.query(b, f"SELECT * FROM {t} ORDER BY ALL")
            assert x.equals(y), t
    finally:
        a.close()
        b.close()


def test_a_pair_that_does_not_sum_to_one_names_its_day_stream_and_event(tmp_path):
    binary = generate.generate(n_days=1, streams=STREAMS, seed=14)
    pairs = binary.with_columns(pl.concat_list(pl.col("score"), pl.col("score")).alias("score"))
    with pytest.raises(InputError, match=r"day 20\d\d-\d\d-\d\d, stream '(a|b)', event \d+: .*sum"):
        run(tmp_path, pairs)


def test_a_binary_only_method_on_k_classes_is_a_clear_error(tmp_path, events):
    with pytest.raises(ParameterError, match="binary-only"):
        run(tmp_path, events, settings=Settings.make("isotonic"))


def test_a_label_outside_the_k_classes_names_the_rule(tmp_path, events):
    unlabelled = events.with_columns(pl.lit(None, pl.Int64).alias("label"))
    d0 = unlabelled.filter(pl.col("event_time").dt.date() == START, pl.col("stream") == "a")
    first, second = d0.row(0, named=True), d0.row(1, named=True)
    lt = max(first["event_time"], second["event_time"]) + dt.timedelta(minutes=5)
    feed = pl.DataFrame(
        {"stream": ["a", "a"], "event_id": [first["event_id"], second["event_id"]],
         "label": [K - 1, K], "label_time": [lt, lt]}
    )  # fmt: skip
    storage.write_landing(feed, tmp_path / "labels", time_column="label_time")
    with pytest.raises(InputError, match=rf"stream 'a', event {second['event_id']}: label "
                       r"outside the classes 0\.\.3"):  # fmt: skip
        run(tmp_path, d0, labels=label_source(str(tmp_path / "labels")))


def test_the_probability_check_finds_a_vector_that_is_not_a_distribution(tmp_path, events):
    con, _ = run(tmp_path, events)
    try:
        assert check_probabilities(con, START, START).passed
        con.execute(
            "UPDATE protected_scores SET protected_scores = [0.5, 0.5, 0.5, -0.5] "
            "WHERE event_id = (SELECT min(event_id) FROM protected_scores WHERE event_date = ?)",
            [START],
        )
        out = check_probabilities(con, START, START)
        assert not out.passed and out.details.height >= 1
    finally:
        con.close()


def test_a_k_class_venn_abers_chain_stores_no_bounds(tmp_path, events):
    """Regression: multiclass Venn-ABERS returned its (absent) bounds as class vectors, which
    the binary p_lower / p_upper columns refused; a K-class forecast has no bounds (NULL)."""
    settings = Settings.make("venn-abers", window=30, refit_every=11)
    con, summary = run(tmp_path, events, settings=settings)
    try:
        assert all(c.passed for c in summary.checks)
        rows = storage.query(con, "SELECT protected_scores, p_lower, p_upper FROM protected_scores")
        assert rows.height == events.height
        assert rows["p_lower"].null_count() == rows["p_upper"].null_count() == rows.height
        np.testing.assert_allclose(vectors(rows["protected_scores"]).sum(axis=1), 1.0, atol=1e-12)
    finally:
        con.close()
