"""Every non-protected method (batch, online, stacked) through :func:`calpipe.protect`.

The invariants of docs/ARCHITECTURE.md §7 on random multi-stream frames (shuffled rows, ties in time, null
labels, base forecasts exactly 0 or 1): prequential, k chunks with the state carried = one pass
(bit for bit), row order irrelevant, streams independent, valid probabilities, intervals ordered.
"""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import calpipe
from calpipe.calibrators import METHODS, PROTECTED_METHODS
from tests.conftest import make_events

FAST = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
ORDER = ["event_time", "event_id"]

#: name -> (method, params, classes it takes). Small windows so the fits happen in small frames.
CASES: dict[str, tuple[str, dict, tuple[int, ...]]] = {
    "platt": ("platt", {"window": 5, "refit_every": 3}, (2,)),
    "beta": ("beta", {"window": 6}, (2,)),
    "temperature": ("temperature", {"window": 5, "refit_every": 4}, (2, 3)),
    "venn-predictor": ("venn-predictor", {"n_bins": 3}, (2, 3)),
    "histogram": ("histogram", {"window": 8, "refit_every": 4, "n_bins": 3}, (2, 3)),
    "isotonic": ("isotonic", {"window": 8, "refit_every": 4}, (2,)),
    "roc-isotonic": ("roc-isotonic", {"window": 9, "refit_every": 5, "max_regions": 3}, (2, 3)),
    "venn-abers": ("venn-abers", {"window": 8, "refit_every": 4}, (2, 3)),
    "cvap": ("venn-abers", {"window": 10, "cross": True, "n_folds": 3, "merge": "brier"}, (2,)),
    "venn": ("venn", {"window": 8, "refit_every": 5, "n_bins": 2}, (2, 3)),
    "calibrated-regression": ("calibrated-regression", {"powers": 2, "score_tents": 3}, (2,)),
    "cj+platt": ("composite-jumper", {"base_method": "platt", "base_params": {"window": 5}}, (2,)),
    "ops": ("ops", {"rho": 1.0}, (2, 3)),
    "oms": ("oms", {"rho": 1.0}, (2, 3)),
    "ce+oms": ("composite-experts", {"inputs": ("ops", "oms")}, (3,)),
    "tops": ("tops", {"n_bins": 4}, (2,)),
    "hops": ("hops", {}, (2,)),
    "obs": ("obs", {}, (2,)),
    "tobs": ("tobs", {"n_bins": 3}, (2,)),
    "hobs": ("hobs", {"rho": 1.0}, (2,)),
    "online-histogram": ("online-histogram", {"n_bins": 4}, (2,)),
    "composite-experts": ("composite-experts", {}, (2, 3)),
    "decay-beta": ("decay-beta", {"memory": 8, "warmup": 3, "refit_every": 2}, (2,)),
    "decay-venn-abers": ("decay-venn-abers", {"memory": 8, "warmup": 3, "refit_every": 2}, (2,)),
    "cj+ops": ("composite-jumper", {"base_method": "ops"}, (2,)),
}
PARAMS = [
    pytest.param(name, k, id=f"{name}-K{k}") for name, (_, _, ks) in CASES.items() for k in ks
]


def _run(df, name, **kw):
    method, params, _ = CASES[name]
    cols = {"scores": "scores"} if "scores" in df.columns else {}
    return calpipe.protect_with_state(df, method=method, **cols, **params, **kw)


def _out_col(k):
    return "protected_score" if k == 2 else "protected_scores"


def test_every_method_has_a_case_here():
    others = set(METHODS) - set(PROTECTED_METHODS)
    covered = {m for m, p, _ in CASES.values()} | {
        p["base_method"] for _, p, _ in CASES.values() if "base_method" in p
    }
    assert others <= covered


@pytest.mark.parametrize(("name", "k"), PARAMS)
@FAST
@given(seed=st.integers(0, 10_000))
def test_outputs_are_valid_probabilities(name, k, seed):
    df = make_events(seed, n_events=60, n_classes=k)
    out = _run(df, name).scores
    col = _out_col(k)
    p = np.asarray(out[col].to_list(), dtype=float)
    assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
    if k > 2:
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    assert out["log10_martingale"].is_finite().all()
    if "p_lower" in out.columns:
        lo = np.asarray(out["p_lower"].to_list(), dtype=float)
        hi = np.asarray(out["p_upper"].to_list(), dtype=float)
        known = ~np.isnan(lo)  # multiclass Venn-ABERS gives no class bounds (NaN)
        assert np.all(lo[known] <= p[known] + 1e-12) and np.all(p[known] <= hi[known] + 1e-12)


@pytest.mark.parametrize(("name", "k"), PARAMS)
@FAST
@given(seed=st.integers(0, 10_000), which=st.integers(0, 59))
def test_prequential_a_label_never_changes_its_own_or_earlier_forecasts(name, k, seed, which):
    df = make_events(seed, n_events=60, n_classes=k, null_frac=0.1).sort(["stream", *ORDER])
    flipped = df.with_columns(
        pl.when(pl.int_range(pl.len()) == which)
        .then(pl.when(pl.col("label") == 0).then(1).otherwise(0))
        .otherwise(pl.col("label"))
        .alias("label")
    )
    col = _out_col(k)
    a = _run(df, name).scores.with_row_index()
    b = _run(flipped, name).scores.with_row_index()
    same = (pl.col("stream") == df["stream"][which]) & (pl.col("index") <= which)
    assert_frame_equal(a.filter(same).select(col), b.filter(same).select(col))


@pytest.mark.parametrize(("name", "k"), PARAMS)
@FAST
@given(seed=st.integers(0, 10_000), n_chunks=st.integers(2, 4))
def test_chunks_with_state_equal_one_pass(name, k, seed, n_chunks):
    df = make_events(seed, n_events=60, n_classes=k, time_dtype="int")
    whole = _run(df, name)
    cuts = np.quantile(df["event_time"].to_numpy(), np.linspace(0, 1, n_chunks + 1)[1:-1])
    bounds = [-np.inf, *cuts, np.inf]
    state, parts = None, []
    for lo, hi in itertools.pairwise(bounds):
        chunk = df.filter((pl.col("event_time") > lo) & (pl.col("event_time") <= hi))
        r = _run(chunk, name, state=state)
        state, parts = r.state, [*parts, r.scores]
    got = pl.concat(parts).sort(["stream", *ORDER])
    assert_frame_equal(got, whole.scores.sort(["stream", *ORDER]))
    assert_frame_equal(state, whole.state)


@pytest.mark.parametrize(("name", "k"), PARAMS)
def test_row_order_and_other_streams_do_not_matter(name, k):
    df = make_events(7, n_events=80, n_classes=k)
    a = _run(df, name).scores
    shuffled = _run(df.sample(fraction=1.0, shuffle=True, seed=1), name).scores
    assert_frame_equal(a.sort(["stream", *ORDER]), shuffled.sort(["stream", *ORDER]))
    alone = _run(df.filter(pl.col("stream") == "s1"), name).scores
    assert_frame_equal(
        a.filter(pl.col("stream") == "s1").sort(ORDER), alone.sort(ORDER), check_row_order=True
    )


def test_stack_equals_running_the_base_then_the_top():
    df = make_events(3, n_events=120, n_streams=None, null_frac=0.0)
    base = calpipe.protect(df, method="platt", window=20)
    top = calpipe.protect(
        base.drop("score", "log10_martingale").rename({"protected_score": "score"}),
        method="composite-jumper",
    )
    stacked = calpipe.protect(df, method="composite-jumper", base_method="platt",
                              base_params={"window": 20})  # fmt: skip
    np.testing.assert_array_equal(stacked["protected_score"], top["protected_score"])
    np.testing.assert_array_equal(stacked["log10_martingale"], top["log10_martingale"])
    # the base method's forecast as it made it (regression: it was returned clipped)
    np.testing.assert_array_equal(stacked["base_method_score"], base["protected_score"])


def test_a_k_class_stack_names_its_base_forecasts_in_the_plural():
    # regression: a K-class stack returned a list column under the singular name
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.ones(3), 200)
    df = pl.DataFrame({"event_id": np.arange(200), "label": rng.integers(0, 3, 200),
                       "scores": p.tolist()})  # fmt: skip
    out = calpipe.protect(df, scores="scores", order_by="event_id", method="composite-jumper",
                          base_method="temperature", base_params={"window": 50})  # fmt: skip
    alone = calpipe.protect(df, scores="scores", order_by="event_id", method="temperature",
                            window=50)  # fmt: skip
    assert "base_method_scores" in out.columns and "base_method_score" not in out.columns
    assert out["base_method_scores"].to_list() == alone["protected_scores"].to_list()


def test_a_stack_refuses_delayed_labels():
    df = make_events(3, n_events=20, label_time=True)
    with pytest.raises(calpipe.ParameterError, match="does not take delayed labels"):
        calpipe.protect(df, label_time="label_time", method="composite-jumper",
                        base_method="platt")  # fmt: skip


def test_binary_only_methods_refuse_class_vectors():
    df = make_events(3, n_events=20, n_classes=3)
    with pytest.raises(calpipe.ParameterError, match="'platt' is binary-only"):
        calpipe.protect(df, scores="scores", method="platt")


def test_a_category_column_is_read_validated_and_used():
    df = make_events(5, n_events=80).with_columns((pl.col("event_id") % 3).alias("segment"))
    kw = {"category_column": "segment", "n_categories": 3}
    out = calpipe.protect(df, method="venn-predictor", **kw)
    one = calpipe.protect(df.filter(pl.col("segment") == 1), method="venn-predictor",
                          category_column="segment", n_categories=3)  # fmt: skip
    both = out.filter(pl.col("segment") == 1).sort("stream", *ORDER)
    # a category's forecasts depend only on that category's earlier labels
    assert (
        both["protected_score"].to_list() == one.sort("stream", *ORDER)["protected_score"].to_list()
    )
    out2 = calpipe.protect(df, method="calibrated-regression", **kw)
    assert out2["protected_score"].is_between(0, 1).all()
    with pytest.raises(
        calpipe.InputError, match=r"column 'segment', row \d+: category must be in \[0, 2\)"
    ):
        calpipe.protect(df, method="venn-predictor", category_column="segment", n_categories=2)
    with pytest.raises(calpipe.InputError, match="column 'seg': missing column"):
        calpipe.protect(df, method="venn-predictor", category_column="seg", n_categories=3)
    with pytest.raises(calpipe.ParameterError, match="go together"):
        calpipe.protect(df, method="venn-predictor", category_column="segment")


def test_venn_outputs_carry_the_interval():
    df = make_events(2, n_events=50)
    out = calpipe.protect(df, method="venn-predictor")
    assert {"p_lower", "p_upper"} <= set(out.columns)
    lo, p, hi = (out[c].to_numpy() for c in ("p_lower", "protected_score", "p_upper"))
    assert np.all(lo <= p) and np.all(p <= hi)
