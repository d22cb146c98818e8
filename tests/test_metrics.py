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
