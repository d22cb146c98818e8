"""calpipe.metrics versus plain numpy: log loss, Brier, accuracy, ECE and reliability tables, binary
and multiclass, with null labels ignored; used in select, group_by().agg and over."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calpipe import metrics, paths

FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
REL = 1e-12


# ----------------------------------------------------------------------------------------------
# Data and numpy oracles
# ----------------------------------------------------------------------------------------------
def binary_data(seed: int, n: int, null_frac: float) -> tuple[np.ndarray, np.ndarray]:
    """p in [0, 1] (with exact 0, 0.5, 1 and bin edges), y in {0, 1} or NaN for null."""
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    special = rng.random(n) < 0.2
    p[special] = rng.choice([0.0, 0.1, 0.5, 0.7, 1.0], size=int(special.sum()))
    y = (rng.random(n) < p).astype(float)
    y[rng.random(n) < null_frac] = np.nan
    return p, y


def multiclass_data(seed: int, n: int, k: int, null_frac: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k), size=n)
    if n:
        p[0] = np.full(k, 1.0 / k)  # a tie: arg max is the first class
        p[-1] = np.eye(k)[0]  # a one-hot forecast (0 for the other classes)
    y = np.array([rng.choice(k, p=row) for row in p], dtype=float)
    y[rng.random(n) < null_frac] = np.nan
    return p, y


def frame(p: np.ndarray, y: np.ndarray, group: np.ndarray | None = None) -> pl.DataFrame:
    labels = pl.Series("y", [None if np.isnan(v) else int(v) for v in y], dtype=pl.Int64)
    col = (
        pl.Series("p", p) if p.ndim == 1 else pl.Series("p", p.tolist(), dtype=pl.List(pl.Float64))
    )
    df = pl.DataFrame([col, labels])
    return df if group is None else df.with_columns(pl.Series("g", group))


def p_of_label(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Probability given to the observed label, labelled rows only."""
    lab = ~np.isnan(y)
    yi = y[lab].astype(int)
    if p.ndim == 1:
        return np.where(yi == 1, p[lab], 1.0 - p[lab])
    return p[lab][np.arange(yi.size), yi]


def np_log_loss(p, y, base=math.e):
    q = np.clip(p_of_label(p, y), 1e-15, 1.0)
    return float(np.mean(-np.log(q) / np.log(base)))


def np_brier(p, y):
    lab = ~np.isnan(y)
    yi = y[lab].astype(int)
    if p.ndim == 1:
        return float(np.mean((p[lab] - yi) ** 2))
    onehot = np.eye(p.shape[1])[yi]
    return float(np.mean(((p[lab] - onehot) ** 2).sum(axis=1)))


def np_accuracy(p, y):
    lab = ~np.isnan(y)
    yi = y[lab].astype(int)
    pred = (p[lab] >= 0.5).astype(int) if p.ndim == 1 else p[lab].argmax(axis=1)
    return float(np.mean(pred == yi))


def np_bins(p, n_bins):
    return np.clip(np.floor(p * n_bins), 0, n_bins - 1).astype(int)


def np_ece(p, y, n_bins=10):
    lab = ~np.isnan(y)
    pp, yy = p[lab], y[lab]
    b = np_bins(pp, n_bins)
    total = 0.0
    for k in np.unique(b):
        m = b == k
        total += m.sum() / pp.size * abs(pp[m].mean() - yy[m].mean())
    return total


def approx(x):
    return pytest.approx(x, rel=REL, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# Binary
# ----------------------------------------------------------------------------------------------
@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 200),
    null_frac=st.sampled_from([0.0, 0.3, 0.7]),
    n_bins=st.sampled_from([1, 5, 10, 15]),
)
def test_binary_metrics_equal_numpy(seed, n, null_frac, n_bins):
    p, y = binary_data(seed, n, null_frac)
    if np.isnan(y).all():
        y[0] = 1.0
    df = frame(p, y)
    got = df.select(
        metrics.log_loss("p", "y").alias("ll"),
        metrics.log_loss("p", "y", base=10).alias("ll10"),
        metrics.cumulative_log10_loss("p", "y").alias("cum10"),
        metrics.brier("p", "y").alias("brier"),
        metrics.accuracy("p", "y").alias("acc"),
        metrics.ece("p", "y", n_bins=n_bins).alias("ece"),
    ).row(0, named=True)
    assert got["ll"] == approx(np_log_loss(p, y))
    assert got["ll10"] == approx(np_log_loss(p, y, base=10))
    assert got["cum10"] == approx(np_log_loss(p, y, base=10) * (~np.isnan(y)).sum())
    assert got["brier"] == approx(np_brier(p, y))
    assert got["acc"] == approx(np_accuracy(p, y))
    assert got["ece"] == approx(np_ece(p, y, n_bins))


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 200),
    null_frac=st.sampled_from([0.0, 0.3]),
    n_bins=st.sampled_from([3, 10]),
)
def test_reliability_table_equals_numpy(seed, n, null_frac, n_bins):
    p, y = binary_data(seed, n, null_frac)
    table = metrics.reliability_table(frame(p, y), "p", "y", n_bins=n_bins)
    lab = ~np.isnan(y)
    b = np_bins(p[lab], n_bins)
    bins = np.unique(b)
    assert table.columns == ["bin", "count", "mean_forecast", "observed"]
    assert table["bin"].to_list() == bins.tolist()
    assert table["count"].to_list() == [int((b == k).sum()) for k in bins]
    for row, k in zip(table.iter_rows(named=True), bins, strict=True):
        assert row["mean_forecast"] == approx(p[lab][b == k].mean())
        assert row["observed"] == approx(y[lab][b == k].mean())
    # the table and ece agree: ECE = sum count/n |mean_forecast - observed|
    if lab.any():
        ece = (
            table["count"] / lab.sum() * (table["mean_forecast"] - table["observed"]).abs()
        ).sum()
        assert frame(p, y).select(metrics.ece("p", "y", n_bins=n_bins)).item() == approx(ece)


def test_null_labels_are_ignored():
    df = pl.DataFrame({"p": [0.9, 0.2, 0.6, 0.01, 0.99], "y": [1, 0, 0, None, None]})
    full = df.select(
        metrics.log_loss("p", "y").alias("a"),
        metrics.brier("p", "y").alias("b"),
        metrics.accuracy("p", "y").alias("c"),
        metrics.ece("p", "y").alias("d"),
    )
    labelled = df.drop_nulls().select(
        metrics.log_loss("p", "y").alias("a"),
        metrics.brier("p", "y").alias("b"),
        metrics.accuracy("p", "y").alias("c"),
        metrics.ece("p", "y").alias("d"),
    )
    assert full.row(0) == pytest.approx(labelled.row(0), rel=REL)
    assert full.row(0)[0] == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3)
    assert full.row(0)[2] == pytest.approx(2 / 3)


def test_all_labels_null_gives_null_metrics():
    df = pl.DataFrame({"p": [0.3, 0.8]}).with_columns(pl.lit(None, pl.Int64).alias("y"))
    row = df.select(
        metrics.log_loss("p", "y").alias("a"),
        metrics.brier("p", "y").alias("b"),
        metrics.accuracy("p", "y").alias("c"),
        metrics.ece("p", "y").alias("d"),
    ).row(0)
    assert row == (None, None, None, None)
    assert metrics.reliability_table(df, "p", "y").height == 0


def test_log_loss_of_a_zero_forecast_is_finite():
    df = pl.DataFrame({"p": [0.0, 1.0], "y": [1, 0]})
    assert df.select(metrics.log_loss("p", "y")).item() == pytest.approx(-math.log(1e-15))


def test_accuracy_at_one_half_predicts_label_1():
    df = pl.DataFrame({"p": [0.5, 0.5], "y": [1, 0]})
    assert df.select(metrics.accuracy("p", "y")).item() == 0.5
    assert df.filter(pl.col("y") == 1).select(metrics.accuracy("p", "y")).item() == 1.0


def test_ece_of_probability_1_falls_in_the_last_bin():
    df = pl.DataFrame({"p": [1.0, 0.95, 0.05], "y": [1, 1, 0]})
    assert df.select(metrics.ece("p", "y")).item() == pytest.approx(
        np_ece(np.array([1.0, 0.95, 0.05]), np.array([1.0, 1.0, 0.0]))
    )
    assert metrics.reliability_table(df, "p", "y")["bin"].to_list() == [0, 9]


def test_metrics_per_group_equal_numpy_per_group():
    p, y = binary_data(3, 300, 0.3)
    g = np.random.default_rng(4).integers(0, 4, size=300)
    df = frame(p, y, g)
    agg = (
        df.group_by("g")
        .agg(
            metrics.log_loss("p", "y").alias("ll"),
            metrics.brier("p", "y").alias("brier"),
            metrics.accuracy("p", "y").alias("acc"),
            metrics.ece("p", "y").alias("ece"),
        )
        .sort("g")
    )
    over = df.with_columns(metrics.ece("p", "y").over("g").alias("ece_over"))
    for row in agg.iter_rows(named=True):
        m = g == row["g"]
        assert row["ll"] == approx(np_log_loss(p[m], y[m]))
        assert row["brier"] == approx(np_brier(p[m], y[m]))
        assert row["acc"] == approx(np_accuracy(p[m], y[m]))
        assert row["ece"] == approx(np_ece(p[m], y[m]))
        assert over.filter(pl.col("g") == row["g"])["ece_over"][0] == approx(np_ece(p[m], y[m]))


# ----------------------------------------------------------------------------------------------
# Multiclass
# ----------------------------------------------------------------------------------------------
@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 150),
    k=st.integers(2, 5),
    null_frac=st.sampled_from([0.0, 0.3]),
)
def test_multiclass_metrics_equal_numpy(seed, n, k, null_frac):
    p, y = multiclass_data(seed, n, k, null_frac)
    if np.isnan(y).all():
        y[0] = 0.0
    got = (
        frame(p, y)
        .select(
            metrics.log_loss("p", "y", multiclass=True).alias("ll"),
            metrics.log_loss("p", "y", multiclass=True, base=10).alias("ll10"),
            metrics.brier("p", "y", multiclass=True).alias("brier"),
            metrics.accuracy("p", "y", multiclass=True).alias("acc"),
        )
        .row(0, named=True)
    )
    assert got["ll"] == approx(np_log_loss(p, y))
    assert got["ll10"] == approx(np_log_loss(p, y, base=10))
    assert got["brier"] == pytest.approx(np_brier(p, y), rel=1e-12, abs=1e-14)
    assert got["acc"] == approx(np_accuracy(p, y))


def test_multiclass_with_k_2_equals_binary():
    p, y = binary_data(5, 100, 0.2)
    p[p == 0.5] = 0.55  # at an exact tie binary says 1 (p >= 0.5), multiclass the first class
    two = np.column_stack([1 - p, p])
    b = frame(p, y).select(metrics.log_loss("p", "y"), metrics.accuracy("p", "y").alias("a"))
    m = frame(two, y).select(
        metrics.log_loss("p", "y", multiclass=True),
        metrics.accuracy("p", "y", multiclass=True).alias("a"),
    )
    assert m.row(0) == pytest.approx(b.row(0), rel=REL)
    # multiclass Brier sums over both classes: twice the binary (p - y)^2
    assert frame(two, y).select(metrics.brier("p", "y", multiclass=True)).item() == approx(
        2 * np_brier(p, y)
    )


def test_multiclass_metrics_accept_array_columns():
    """The module promises list *or array* multiclass columns, and protect() returns an Array
    column for Array input; the metrics raised InvalidOperationError on pl.Array."""
    p, y = multiclass_data(6, 40, 3, 0.2)
    lst = frame(p, y)
    arr = lst.with_columns(pl.col("p").cast(pl.Array(pl.Float64, 3)))
    exprs = [
        metrics.log_loss("p", "y", multiclass=True).alias("ll"),
        metrics.brier("p", "y", multiclass=True).alias("brier"),
        metrics.accuracy("p", "y", multiclass=True).alias("acc"),
    ]
    assert arr.select(exprs).row(0) == pytest.approx(lst.select(exprs).row(0), rel=REL)


def test_alarm_at_log10_martingale_2():
    df = pl.DataFrame({"m": [-1.0, 1.99, 2.0, 3.5]})
    assert df.select(metrics.alarm("m")).to_series().to_list() == [False, False, True, True]


# ----------------------------------------------------------------------------------------------
# Grouped numpy forms = the polars expressions per group
# ----------------------------------------------------------------------------------------------
def grouped_data(seed: int, n: int, k: int | None, null_frac: float, n_groups: int):
    """Forecasts (binary if ``k`` is None, else K classes), NaN labels, and group ids in which
    the last group has no labelled row and a group may have no row at all."""
    p, y = binary_data(seed, n, null_frac) if k is None else multiclass_data(seed, n, k, null_frac)
    g = np.random.default_rng(seed + 1).integers(0, n_groups - 1, size=n)
    g[-2:] = n_groups - 1
    y[-2:] = np.nan
    return p, y, g


def polars_per_group(df: pl.DataFrame, n_groups: int, exprs: dict) -> dict[str, np.ndarray]:
    """Each expression of ``exprs`` per group ``g``, as arrays over 0..n_groups - 1 (NaN for a
    group without rows or labels, where polars gives null or no row)."""
    agg = df.group_by("g").agg(e.alias(name) for name, e in exprs.items())
    out = {}
    for name in exprs:
        a = np.full(n_groups, np.nan)
        vals = agg[name].cast(pl.Float64).fill_null(np.nan).to_numpy()
        a[agg["g"].to_numpy()] = vals
        out[name] = a
    return out


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=REL, atol=1e-15, err_msg=what)


@FAST
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(3, 300),
    null_frac=st.sampled_from([0.0, 0.3, 0.7]),
    n_groups=st.integers(2, 7),
    n_bins=st.sampled_from([1, 3, metrics.config.ECE_BINS, 15]),
)
def test_grouped_binary_metrics_equal_the_expressions(seed, n, null_frac, n_groups, n_bins):
    p, y, g = grouped_data(seed, n, None, null_frac, n_groups)
    want = polars_per_group(
        frame(p, y, g),
        n_groups,
        {
            "ll": metrics.log_loss("p", "y"),
            "brier": metrics.brier("p", "y"),
            "acc": metrics.accuracy("p", "y"),
            "ece": metrics.ece("p", "y", n_bins=n_bins),
            "mean": pl.col("p").mean(),
        },
    )
    assert_same(metrics.grouped_log_loss(p, y, g, n_groups), want["ll"], "log loss")
    assert_same(metrics.grouped_brier(p, y, g, n_groups), want["brier"], "brier")
    assert_same(metrics.grouped_accuracy(p, y, g, n_groups), want["acc"], "accuracy")
    assert_same(metrics.grouped_ece(p, y, g, n_groups, n_bins=n_bins), want["ece"], "ece")
    assert_same(metrics.grouped_mean(p, g, n_groups), want["mean"], "mean")
    # the labelled rows alone give the same bits (what a caller that subsets once passes)
    lab = ~np.isnan(y)
    for f in (metrics.grouped_log_loss, metrics.grouped_brier, metrics.grouped_ece):
        a, b = f(p, y, g, n_groups), f(p[lab], y[lab], g[lab], n_groups)
        assert np.array_equal(a, b, equal_nan=True), f.__name__


@FAST
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(3, 200),
    null_frac=st.sampled_from([0.0, 0.3]),
    n_groups=st.integers(2, 5),
    n_bins=st.sampled_from([3, metrics.config.ECE_BINS]),
)
def test_grouped_reliability_equals_the_table(seed, n, null_frac, n_groups, n_bins):
    p, y, g = grouped_data(seed, n, None, null_frac, n_groups)
    count, mean_p, observed = metrics.grouped_reliability(p, y, g, n_groups, n_bins=n_bins)
    assert count.shape == mean_p.shape == observed.shape == (n_groups, n_bins)
    df = frame(p, y, g)
    for k in range(n_groups):
        table = metrics.reliability_table(df.filter(pl.col("g") == k), "p", "y", n_bins=n_bins)
        bins = table["bin"].to_numpy()
        assert count[k].sum() == table["count"].sum()
        assert count[k][bins].tolist() == table["count"].to_list()
        assert_same(mean_p[k][bins], table["mean_forecast"].to_numpy(), "mean_forecast")
        assert_same(observed[k][bins], table["observed"].to_numpy(), "observed")
        assert np.isnan(mean_p[k][count[k] == 0]).all()


@FAST
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(3, 150),
    k=st.integers(2, 4),
    null_frac=st.sampled_from([0.0, 0.3]),
    n_groups=st.integers(2, 5),
)
def test_grouped_multiclass_metrics_equal_the_expressions(seed, n, k, null_frac, n_groups):
    p, y, g = grouped_data(seed, n, k, null_frac, n_groups)
    want = polars_per_group(
        frame(p, y, g),
        n_groups,
        {
            "ll": metrics.log_loss("p", "y", multiclass=True),
            "brier": metrics.brier("p", "y", multiclass=True),
            "acc": metrics.accuracy("p", "y", multiclass=True),
        },
    )
    assert_same(metrics.grouped_log_loss(p, y, g, n_groups), want["ll"], "log loss")
    assert_same(metrics.grouped_brier(p, y, g, n_groups), want["brier"], "brier")
    assert_same(metrics.grouped_accuracy(p, y, g, n_groups), want["acc"], "accuracy")


def test_grouped_two_classes_equal_the_binary_forms():
    """K = 2 as (1 - p, p) vectors: log loss and accuracy equal the binary forms, Brier twice
    (away from p = 1/2, where the binary guess is 1 and the arg max the first class)."""
    p, y, g = grouped_data(8, 120, None, 0.3, 4)
    p[p == 0.5] = 0.55
    two = np.column_stack([1 - p, p])
    for f in (metrics.grouped_log_loss, metrics.grouped_accuracy):
        assert_same(f(two, y, g, 4), f(p, y, g, 4), f.__name__)
    assert_same(metrics.grouped_brier(two, y, g, 4), 2 * metrics.grouped_brier(p, y, g, 4), "b")


def test_ece_bins_default_is_the_config_constant():
    """One ECE bin count: the expressions, the grouped forms and the plots default to it, and
    the DDL's comment on calibration_daily states it (SQL cannot import it)."""
    import inspect
    import re

    from calpipe import config, plots

    for f in (metrics.ece, metrics.reliability_table, metrics.grouped_ece,
              metrics.grouped_reliability, plots.reliability_diagram):  # fmt: skip
        assert inspect.signature(f).parameters["n_bins"].default == config.ECE_BINS, f.__name__
    ddl = (paths.SQL_DIR / "001_tables.sql").read_text()
    stated = re.findall(r"base_ece\s+DOUBLE,\s*--\s*(\d+) equal-width bins", ddl)
    assert stated == [str(config.ECE_BINS)]


def test_smooth_ece_and_corp_expressions_equal_the_grouped_forms():
    rng = np.random.default_rng(5)
    n = 600
    p = rng.uniform(size=n).round(2)
    y = (rng.uniform(size=n) < p**1.3).astype(float)
    y[rng.uniform(size=n) < 0.1] = np.nan
    g = rng.integers(0, 3, size=n)
    df = pl.DataFrame({"g": g, "p": p, "y": y}).with_columns(pl.col("y").fill_nan(None))
    got = (
        df.group_by("g")
        .agg(
            metrics.smooth_ece("p", "y").alias("sm"),
            metrics.corp("p", "y").alias("log"),
            metrics.corp("p", "y", score="brier").alias("brier"),
        )
        .sort("g")
    )
    sm = metrics.grouped_smooth_ece(p, y, g, 3)
    d = metrics.grouped_corp(p, y, g, 3)
    assert got["sm"].to_list() == pytest.approx(sm.tolist(), rel=1e-12)
    for s in ("log", "brier"):
        for k in metrics.CORP_FIELDS:
            assert got[s].struct.field(k).to_list() == pytest.approx(
                d[f"{s}_{k}"].tolist(), rel=1e-12
            )
    # the score field is the metric of the same name
    whole = df.select(metrics.corp("p", "y").struct.field("score"), metrics.log_loss("p", "y")).row(
        0
    )
    assert whole[0] == pytest.approx(whole[1], rel=1e-12)


def test_smooth_ece_k_classes_expression():
    rng = np.random.default_rng(6)
    p = rng.dirichlet(np.ones(3), size=300)
    y = np.array([rng.choice(3, p=r) for r in p], dtype=float)
    df = pl.DataFrame({"p": p.tolist(), "y": y.astype(int)})
    got = df.select(metrics.smooth_ece("p", "y", multiclass=True)).item()
    assert got == metrics.grouped_smooth_ece(p, y, np.zeros(300, np.int64), 1)[0]


def test_smooth_ece_and_corp_without_labels_are_null():
    df = pl.DataFrame({"p": [0.3, 0.6], "y": [None, None]}, schema={"p": pl.Float64,
                                                                    "y": pl.Int64})  # fmt: skip
    assert df.select(metrics.smooth_ece("p", "y")).item() is None
    assert df.select(metrics.corp("p", "y")).item() == dict.fromkeys(metrics.CORP_FIELDS)


# ----------------------------------------------------------------------------------------------
# The classwise CORP decomposition (K classes)
# ----------------------------------------------------------------------------------------------
def one_vs_rest_log_score(p: np.ndarray, y: np.ndarray) -> float:
    """sum_c -log |1 - 1{y = c} - p_c| (clipped as the log loss), mean over rows: the score the
    classwise decomposition's log terms decompose."""
    hit = np.eye(p.shape[1])[y.astype(int)]
    q = np.where(hit == 1.0, p, 1.0 - p)
    return float(np.mean(-np.log(np.clip(q, metrics.LOG_LOSS_FLOOR, 1.0)).sum(axis=1)))


@FAST
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 300),
    k=st.integers(2, 6),
    n_groups=st.integers(1, 4),
    digits=st.sampled_from([1, 2, 6]),
)
def test_classwise_corp_identity_signs_and_scores(seed, n, k, n_groups, digits):
    """score = MCB - DSC + UNC to 1e-12 for both scores, MCB >= 0 and DSC >= 0; the Brier
    score decomposed is the K-class Brier and the log one the one-vs-rest log score; each group
    is the group alone."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, 0.7), size=n).round(digits)  # rounded: ties for PAV to pool
    y = np.array([rng.choice(k, p=r / r.sum()) for r in p], dtype=float)
    y[rng.random(n) < 0.1] = np.nan
    g = rng.integers(0, n_groups, size=n)
    d = metrics.grouped_corp_classwise(p, y, g, n_groups)
    brier = metrics.grouped_brier(p, y, g, n_groups)
    for gi in range(n_groups):
        m = (g == gi) & ~np.isnan(y)
        if not m.any():
            assert all(np.isnan(v[gi]) for v in d.values())
            continue
        assert d["brier_score"][gi] == pytest.approx(brier[gi], rel=1e-12, abs=1e-15)
        assert d["log_score"][gi] == pytest.approx(one_vs_rest_log_score(p[m], y[m]), rel=1e-12)
        for s in ("log", "brier"):
            mcb, dsc = d[f"{s}_miscalibration"][gi], d[f"{s}_discrimination"][gi]
            unc, tot = d[f"{s}_uncertainty"][gi], d[f"{s}_score"][gi]
            assert mcb >= -1e-12 and dsc >= -1e-12
            assert tot == pytest.approx(mcb - dsc + unc, abs=1e-12)
        alone = metrics.grouped_corp_classwise(p[m], y[m], np.zeros(m.sum(), np.int64), 1)
        for key, v in d.items():
            assert v[gi] == pytest.approx(alone[key][0], rel=1e-12, abs=1e-15)


def test_classwise_corp_is_the_sum_of_the_one_vs_rest_binary_decompositions():
    p, y = multiclass_data(3, 400, 4, 0.0)
    one = np.zeros(400, np.int64)
    d = metrics.grouped_corp_classwise(p, y, one, 1)
    parts = [metrics.grouped_corp(p[:, c], (y == c).astype(float), one, 1) for c in range(4)]
    for key, v in d.items():
        assert v[0] == pytest.approx(sum(x[key][0] for x in parts), rel=1e-12)


def test_classwise_corp_of_two_classes_is_twice_the_binary_brier_decomposition():
    p, y = binary_data(4, 500, 0.0)
    one = np.zeros(500, np.int64)
    two = metrics.grouped_corp_classwise(np.column_stack([1 - p, p]), y, one, 1)
    bin_ = metrics.grouped_corp(p, y, one, 1)
    for f in metrics.CORP_FIELDS:
        assert two[f"brier_{f}"][0] == pytest.approx(2 * bin_[f"brier_{f}"][0], rel=1e-12)


def test_classwise_corp_of_a_calibrated_forecaster_has_almost_no_miscalibration():
    """Outcomes drawn from the forecasts: MCB is PAV's overfit only, and shrinks with n
    (measured ~n^(-2/3): 0.017, 0.006, 0.0026 at 1,000, 5,000, 20,000 events, K = 4); a
    forecaster that sharpens the same probabilities (p^2 renormalised) is miscalibrated."""
    rng = np.random.default_rng(11)
    n, k = 20_000, 4
    p = rng.dirichlet(np.ones(k), size=n)
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).astype(float)
    one = np.zeros(n, np.int64)
    mcb = [
        metrics.grouped_corp_classwise(p[:m], y[:m], one[:m], 1)["brier_miscalibration"][0]
        for m in (1000, 5000, n)
    ]
    assert mcb[0] > mcb[1] > mcb[2]
    d = metrics.grouped_corp_classwise(p, y, one, 1)
    assert d["brier_miscalibration"][0] < 0.005 * d["brier_score"][0]
    sharp = p**2 / (p**2).sum(axis=1, keepdims=True)
    bad = metrics.grouped_corp_classwise(sharp, y, one, 1)
    assert bad["brier_miscalibration"][0] > 10 * d["brier_miscalibration"][0]


def test_classwise_corp_rejects_binary_forecasts():
    with pytest.raises(ValueError, match="class probabilities only"):
        metrics.grouped_corp_classwise(np.full(3, 0.5), np.zeros(3), np.zeros(3, np.int64), 1)


# ----------------------------------------------------------------------------------------------
# The smooth ECE's block bootstrap
# ----------------------------------------------------------------------------------------------
def miscalibrated_stream(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.beta(1.0, 3.0, size=n)
    y = (rng.random(n) < np.clip(1.3 * p, 0.0, 1.0)).astype(float)
    return p, y


def test_bootstrap_block_length_is_the_ceiling_of_the_cube_root():
    for n in [*range(1, 3000), 35_937, 35_938, 36_169, 10**6, 10**6 + 1]:
        want = next(b for b in range(1, 200) if b**3 >= n)  # the smallest b with b^3 >= n
        assert metrics.bootstrap_block_length(n) == want, n


def test_circular_blocks_are_runs_of_consecutive_events_wrapping_at_the_end():
    n = 50
    starts, length = metrics.circular_block_starts(n, 200, seed=3)
    assert length == 4 and starts.shape == (200, 13)
    rows = (starts[:, :, None] + np.arange(length)) % n  # the documented resample
    for r in rows.reshape(200, -1)[:, :n]:
        blocks = r[: (n // length) * length].reshape(-1, length)
        assert np.all(np.diff(blocks, axis=1) % n == 1)
    # circular: every event is drawn equally often on average, the ends included
    counts = np.bincount(rows.ravel(), minlength=n)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


def test_smooth_ece_bootstrap_is_reproducible_with_its_seed():
    p, y = miscalibrated_stream(0, 3000)
    a = metrics.smooth_ece_bootstrap(p, y, n_resamples=50, seed=7)
    b = metrics.smooth_ece_bootstrap(p, y, n_resamples=50, seed=7)
    c = metrics.smooth_ece_bootstrap(p, y, n_resamples=50, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert metrics.smooth_ece_interval(p, y, n_resamples=50, seed=7) == metrics.smooth_ece_interval(
        p, y, n_resamples=50, seed=7
    )
    # the defaults are the config constants
    from calpipe import config

    assert np.array_equal(
        metrics.smooth_ece_bootstrap(p, y),
        metrics.smooth_ece_bootstrap(
            p, y, n_resamples=config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES,
            seed=config.SMOOTH_ECE_BOOTSTRAP_SEED,
        ),
    )  # fmt: skip


def test_smooth_ece_bootstrap_chunks_do_not_change_the_replicates(monkeypatch):
    """The resamples run in chunks of rows; the chunk size is a memory bound, not a result."""
    p, y = miscalibrated_stream(1, 2000)
    whole = metrics.smooth_ece_bootstrap(p, y, n_resamples=30, seed=2)
    monkeypatch.setattr(metrics, "_BOOTSTRAP_CHUNK_ROWS", 4500)  # two resamples per chunk
    assert np.array_equal(metrics.smooth_ece_bootstrap(p, y, n_resamples=30, seed=2), whole)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["miscalibrated", "calibrated"])
def test_smooth_ece_interval_contains_the_estimate(seed, kind):
    p, y = miscalibrated_stream(seed, 4000)
    if kind == "calibrated":
        y = (np.random.default_rng(seed + 100).random(p.size) < p).astype(float)
    est, lo, hi = metrics.smooth_ece_interval(p, y, n_resamples=200, seed=seed)
    assert est == metrics.grouped_smooth_ece(p, y, np.zeros(p.size, np.int64), 1)[0]
    assert 0.0 <= lo < est < hi


def test_smooth_ece_interval_widens_as_n_shrinks():
    p, y = miscalibrated_stream(5, 16_000)
    widths = []
    for n in (16_000, 4_000, 1_000):
        _, lo, hi = metrics.smooth_ece_interval(p[:n], y[:n], n_resamples=200, seed=0)
        widths.append(hi - lo)
    assert widths[0] < widths[1] < widths[2]


def test_blocks_widen_the_interval_of_a_drifting_stream():
    """Residuals in runs of one sign (the outcome rate alternates 0.3 / 0.7 every 200 events
    under a constant 0.5 forecast): resampling single events (block length 1, the i.i.d.
    bootstrap) breaks the runs and understates the spread; the blocks keep part of it."""
    rng = np.random.default_rng(4)
    n = 8000
    rate = np.where((np.arange(n) // 200) % 2 == 0, 0.3, 0.7)
    rate[-200:] = 0.3  # one more low run: the mean is not exactly 0.5
    y = (rng.random(n) < rate).astype(float)
    p = np.full(n, 0.5)
    _, lo1, hi1 = metrics.smooth_ece_interval(p, y, n_resamples=300, block_length=1, seed=0)
    _, lo, hi = metrics.smooth_ece_interval(p, y, n_resamples=300, seed=0)
    assert hi - lo > 1.3 * (hi1 - lo1)  # measured 1.45 (blocks of 20 in runs of 200)


def test_smooth_ece_interval_drops_unlabelled_rows_and_reduces_k_classes():
    p, y = miscalibrated_stream(6, 1500)
    y_nan = y.copy()
    y_nan[::7] = np.nan
    keep = ~np.isnan(y_nan)
    assert metrics.smooth_ece_interval(p, y_nan, n_resamples=40) == metrics.smooth_ece_interval(
        p[keep], y[keep], n_resamples=40
    )
    pk, yk = multiclass_data(7, 900, 3, 0.0)
    conf, hit = metrics.top_label(pk, yk)
    assert metrics.smooth_ece_interval(pk, yk, n_resamples=40) == metrics.smooth_ece_interval(
        conf, hit, n_resamples=40
    )
    empty = metrics.smooth_ece_interval(np.array([0.3]), np.array([np.nan]), n_resamples=5)
    assert all(math.isnan(v) for v in empty)


def test_smooth_ece_difference_interval_is_paired():
    """The same resamples for both forecasters: a forecaster against itself differs by exactly
    0 in every resample; a clearly worse one is told apart."""
    p, y = miscalibrated_stream(8, 5000)
    assert metrics.smooth_ece_difference_interval(p, p, y, n_resamples=50) == (0.0, 0.0, 0.0)
    worse = np.clip(p * 0.6, 0.0, 1.0)
    diff, lo, hi = metrics.smooth_ece_difference_interval(worse, p, y, n_resamples=100)
    one = np.zeros(p.size, np.int64)
    want = (
        metrics.grouped_smooth_ece(worse, y, one, 1)[0]
        - metrics.grouped_smooth_ece(p, y, one, 1)[0]
    )
    assert diff == pytest.approx(want, rel=1e-12)
    assert 0.0 < lo < diff < hi


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_resamples": 0}, "n_resamples"), ({"block_length": 0}, "block_length"),
     ({"block_length": 10_000}, "block_length"), ({"level": 1.0}, "level")],
)  # fmt: skip
def test_smooth_ece_interval_refuses_bad_arguments_by_name(kwargs, match):
    p, y = miscalibrated_stream(9, 300)
    with pytest.raises(ValueError, match=match):
        metrics.smooth_ece_interval(p, y, **kwargs)


def test_classwise_corp_expression_equals_the_grouped_form():
    p, y = multiclass_data(12, 300, 3, 0.1)
    g = np.random.default_rng(12).integers(0, 3, size=300)
    df = frame(p, y, g)
    got = (
        df.group_by("g")
        .agg(
            metrics.corp("p", "y", score="brier", multiclass=True).alias("brier"),
            metrics.corp("p", "y", multiclass=True).alias("log"),
        )
        .sort("g")
    )
    d = metrics.grouped_corp_classwise(p, y, g, 3)
    for s in ("log", "brier"):
        for k in metrics.CORP_FIELDS:
            assert got[s].struct.field(k).to_list() == pytest.approx(
                d[f"{s}_{k}"].tolist(), rel=1e-12
            )
    assert df.select(metrics.corp("p", "y", score="brier", multiclass=True)).item()[
        "score"
    ] == pytest.approx(df.select(metrics.brier("p", "y", multiclass=True)).item(), rel=1e-12)
    empty = df.filter(pl.col("y").is_null())
    assert empty.select(metrics.corp("p", "y", multiclass=True)).item() == dict.fromkeys(
        metrics.CORP_FIELDS
    )
