"""Properties of the public frame API, :func:`calpipe.protect` and :func:`calpipe.protect_with_state`
(docs/ARCHITECTURE.md §3 data contract, §4 decisions, §7 invariants), for every method, binary and K = 3.

Each property is checked with hypothesis on random multi-stream frames from ``conftest.make_events``
(shuffled rows, ties in event_time, null labels, some base forecasts exactly 0 or 1).
"""

from __future__ import annotations

import datetime as dt
import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import calpipe
from tests.conftest import make_events

FAST = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)

#: name -> (method, params): the four configurations the brief asks for.
CONFIGS: dict[str, tuple[str, dict]] = {
    "jumper": ("jumper", {}),
    "mean-jumper": ("mean-jumper", {}),
    "composite-log": ("composite-jumper", {}),
    "composite-brier": ("composite-jumper", {"loss": "brier", "clip": None}),
}
CASES = [pytest.param(name, k, id=f"{name}-K{k}") for name in CONFIGS for k in (2, 3)]
LOG_METHODS = ["jumper", "mean-jumper", "composite-jumper"]

ORDER = ["event_time", "event_id"]
RID = "rid"  # an extra input column: the original row number, to line rows up across runs


def run(df: pl.DataFrame, name: str, k: int, **kw) -> calpipe.ProtectResult:
    method, params = CONFIGS[name]
    col = {"score": "score"} if k == 2 else {"scores": "scores"}
    return calpipe.protect_with_state(df, method=method, **col, **params, **kw)


def protected(out: pl.DataFrame, k: int) -> np.ndarray:
    """Protected forecasts as an (n, 1) or (n, K) array, in the frame's row order."""
    if k == 2:
        return out["protected_score"].to_numpy()[:, None]
    return np.array(out["protected_scores"].to_list(), dtype=np.float64).reshape(out.height, k)


def base_of(df: pl.DataFrame, k: int) -> np.ndarray:
    if k == 2:
        return df["score"].to_numpy()[:, None]
    return np.array(df["scores"].to_list(), dtype=np.float64).reshape(df.height, k)


def interior(x: np.ndarray) -> np.ndarray:
    """Rows whose every class probability is strictly inside (0, 1) (all forecasts depend on the
    weights there; at 0 or 1 every Cox calibrator returns the base)."""
    return np.all((x > 1e-9) & (x < 1 - 1e-9), axis=1)


@st.composite
def frames(draw, k: int, *, label_time: bool | str = False, streams=(None, 1, 2, 3), max_events=40):
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, max_events))
    return make_events(
        seed,
        n_events=n,
        n_streams=draw(st.sampled_from(streams)),
        n_classes=k,
        null_frac=draw(st.sampled_from([0.0, 0.3, 0.8])),
        label_time=label_time,
        id_dtype=draw(st.sampled_from(["int", "str"])),
        time_dtype=draw(
            st.sampled_from(["datetime", "date"] if label_time else ["datetime", "int"])
        ),
    ).with_row_index(RID)


def stream_key(df: pl.DataFrame) -> np.ndarray:
    if "stream" in df.columns:
        return df["stream"].to_numpy()
    return np.zeros(df.height, dtype=object)


def replay_rank(df: pl.DataFrame) -> np.ndarray:
    """Position of each row in its stream's replay order (event_time, event_id)."""
    by = ["stream"] if "stream" in df.columns else []
    rank = pl.int_range(pl.len()).over(by) if by else pl.int_range(pl.len())
    return (
        df.with_row_index("__i")
        .sort([*by, *ORDER])
        .with_columns(rank.alias("__r"))
        .sort("__i")["__r"]
        .to_numpy()
    )


def assert_same_rows(a: pl.DataFrame, b: pl.DataFrame, k: int, tol: float = 0.0) -> None:
    """Same protected forecasts and martingales row by row (to ``tol``; 0 = bit for bit)."""
    np.testing.assert_allclose(protected(a, k), protected(b, k), rtol=0, atol=tol)
    np.testing.assert_allclose(
        a["log10_martingale"].to_numpy(), b["log10_martingale"].to_numpy(), rtol=0, atol=tol
    )
    if "log10_martingale_by_rate" in a.columns:
        np.testing.assert_allclose(
            np.array(a["log10_martingale_by_rate"].to_list()),
            np.array(b["log10_martingale_by_rate"].to_list()),
            rtol=0,
            atol=tol,
        )


# ----------------------------------------------------------------------------------------------
# Prequential
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_changing_a_label_changes_no_earlier_forecast_and_no_other_stream(name, k, data):
    df = data.draw(frames(k))
    i = data.draw(st.integers(0, df.height - 1), label="row")
    old = df["label"][i]
    choices = [c for c in [None, *range(k)] if c != old]
    new = data.draw(st.sampled_from(choices), label="new label")
    df2 = df.with_columns(df["label"].scatter(i, new))

    a, b = run(df, name, k).scores, run(df2, name, k).scores
    same_stream = stream_key(df) == stream_key(df)[i]
    rank = replay_rank(df)
    at_or_before = same_stream & (rank <= rank[i])
    before = same_stream & (rank < rank[i])
    pa, pb = protected(a, k), protected(b, k)
    # forecasts: the event's own and every earlier one of its stream; every other stream
    np.testing.assert_array_equal(pa[at_or_before], pb[at_or_before])
    np.testing.assert_array_equal(pa[~same_stream], pb[~same_stream])
    ma, mb = a["log10_martingale"].to_numpy(), b["log10_martingale"].to_numpy()
    np.testing.assert_array_equal(ma[before], mb[before])
    np.testing.assert_array_equal(ma[~same_stream], mb[~same_stream])

    # the test can fail: the label does reach later forecasts of its stream
    x = base_of(df, k)
    later = same_stream & (rank > rank[i]) & interior(x)
    if interior(x)[i] and later.any():
        assert not np.array_equal(pa[later], pb[later]), "the changed label is never learnt"


# ----------------------------------------------------------------------------------------------
# Resumable: k chunks with the state carried = one pass
# ----------------------------------------------------------------------------------------------
def split_by_order_key(df: pl.DataFrame, cuts: list[int]) -> list[pl.DataFrame]:
    """Cut the events at positions of the global (event_time, event_id, stream) order: within every
    stream, chunk j holds only events after those of chunk j - 1. Rows keep their input order."""
    keys = [*ORDER, "stream"] if "stream" in df.columns else ORDER
    pos = df.select(pl.int_range(pl.len()).sort_by(keys).arg_sort()).to_series().to_numpy()
    bounds = [0, *cuts, df.height]
    return [df.filter(pl.Series((pos >= lo) & (pos < hi))) for lo, hi in itertools.pairwise(bounds)]


def check_chunks_equal_one_pass(data, name: str, k: int, label_time: bool | str) -> None:
    df = data.draw(frames(k, label_time=label_time, max_events=50))
    n_cuts = data.draw(st.integers(1, min(3, max(1, df.height - 1))), label="cuts")
    cuts = sorted(
        data.draw(st.sets(st.integers(1, max(1, df.height - 1)), min_size=n_cuts, max_size=n_cuts))
    )
    cuts = [c for c in cuts if 0 < c < df.height]
    kw = {"label_time": "label_time"} if label_time else {}

    one = run(df, name, k, **kw)
    state, parts = None, []
    for chunk in split_by_order_key(df, cuts):
        res = run(chunk, name, k, state=state, **kw)
        parts.append(res.scores)
        state = res.state
    chunked = pl.concat(parts).sort(RID)
    assert chunked.height == df.height
    assert_same_rows(chunked, one.scores.sort(RID), k, tol=1e-12)
    assert_frame_equal(state, one.state, rel_tol=0, abs_tol=1e-12)


@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_chunks_with_state_carried_equal_one_pass(name, k, data):
    check_chunks_equal_one_pass(data, name, k, label_time=False)


@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_chunks_with_delayed_labels_equal_one_pass(name, k, data):
    check_chunks_equal_one_pass(data, name, k, label_time=True)


@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_chunks_with_labels_known_at_the_event_and_delayed_labels_equal_one_pass(name, k, data):
    check_chunks_equal_one_pass(data, name, k, label_time="mixed")


@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_a_null_label_time_is_a_label_known_at_its_event(name, k, data):
    """label_time null on every labelled event = no label_time at all, bit for bit (rows and
    state): instant labels mix with delayed ones in one frame (the pipeline's label feed)."""
    df = data.draw(frames(k, label_time=True))
    none = df.with_columns(pl.lit(None, pl.Datetime("us")).alias("label_time"))
    a = run(df.drop("label_time"), name, k)
    b = run(none, name, k, label_time="label_time")
    assert_frame_equal(b.scores.drop("label_time"), a.scores, check_exact=True)
    assert_frame_equal(b.state, a.state, check_exact=True)


@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_pending_labels_are_applied_by_a_call_without_label_time(name, k, data):
    """Regression: a state with labels still pending (a batch run with label_time) resumed by a
    call without label_time passed the pending labels through and never applied them. Now
    the second call applies them at their times: = one pass with those labels' times and
    the second batch's labels known at their events."""
    df = data.draw(frames(k, label_time=True, max_events=50))
    assume(df.height > 1)
    cut = data.draw(st.integers(1, df.height - 1), label="cut")
    first, second = split_by_order_key(df, [cut])
    second = second.with_columns(pl.lit(None, pl.Datetime("us")).alias("label_time"))
    r1 = run(first, name, k, label_time="label_time")
    r2 = run(second.drop("label_time"), name, k, state=r1.state)
    one = run(pl.concat([first, second]), name, k, label_time="label_time")
    chunked = pl.concat([r1.scores, r2.scores], how="diagonal").sort(RID)
    assert_same_rows(chunked, one.scores.sort(RID), k, tol=1e-12)
    assert_frame_equal(r2.state, one.state, rel_tol=0, abs_tol=1e-12)


# ----------------------------------------------------------------------------------------------
# Row order, streams
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_shuffling_the_input_rows_changes_nothing(name, k, data):
    label_time = data.draw(st.booleans(), label="label_time")
    df = data.draw(frames(k, label_time=label_time))
    perm = data.draw(st.permutations(range(df.height)), label="perm")
    kw = {"label_time": "label_time"} if label_time else {}
    a = run(df, name, k, **kw)
    b = run(df[list(perm)], name, k, **kw)
    # rows come back in the shuffled frame's order; undo the shuffle
    assert_frame_equal(b.scores.sort(RID), a.scores, check_exact=True)
    assert_frame_equal(b.state, a.state, check_exact=True)


@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_many_streams_in_one_call_equal_each_stream_alone(name, k, data):
    label_time = data.draw(st.booleans(), label="label_time")
    df = data.draw(frames(k, label_time=label_time, streams=(2, 3, 5)))
    kw = {"label_time": "label_time"} if label_time else {}
    together = run(df, name, k, **kw)
    for s in df["stream"].unique().to_list():
        alone = run(df.filter(pl.col("stream") == s), name, k, **kw)
        part = together.scores.filter(pl.col("stream") == s)
        assert_frame_equal(alone.scores, part, check_exact=True)
        assert_frame_equal(
            alone.state, together.state.filter(pl.col("stream") == s), check_exact=True
        )


def test_streams_keyed_by_two_columns_are_separate_streams():
    df = make_events(7, n_events=40, n_streams=2).with_columns(
        (pl.col("event_id") % 2).alias("segment")
    )
    both = calpipe.protect_with_state(df, by=["stream", "segment"])
    assert both.state.height == df.select("stream", "segment").n_unique()
    for (s, g), part in df.group_by(["stream", "segment"]):
        alone = calpipe.protect(part, by=())
        got = both.scores.filter((pl.col("stream") == s) & (pl.col("segment") == g))
        assert_frame_equal(got, alone, check_exact=True)


# ----------------------------------------------------------------------------------------------
# Outputs are probabilities; identity family
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_outputs_are_probabilities(name, k, data):
    label_time = data.draw(st.booleans(), label="label_time")
    df = data.draw(frames(k, label_time=label_time))
    out = run(df, name, k, **({"label_time": "label_time"} if label_time else {})).scores
    p = protected(out, k)
    assert np.all(np.isfinite(p))
    assert np.all((p >= 0.0) & (p <= 1.0))
    if k > 2:
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(out["log10_martingale"].to_numpy()))


def clipped_base(df: pl.DataFrame, k: int, eps: float = 1e-3) -> np.ndarray:
    """The base as log-loss mode sees it (docs/ARCHITECTURE.md §4): binary clip to [eps, 1 - eps]; K classes
    max(p_c, eps) renormalised."""
    x = base_of(df, k)
    if k == 2:
        return np.clip(x, eps, 1 - eps)
    q = np.maximum(x, eps)
    return q / q.sum(axis=1, keepdims=True)


#: identity-only family per K: quadratic eps = 0 (binary only), Cox beta = 1 (any K)
IDENTITY = {
    2: {"family": "quadratic", "family_params": [0.0]},
    3: {"family": "cox", "family_params": [1.0]},
}


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("method", LOG_METHODS)
@FAST
@given(data=st.data())
def test_identity_family_returns_the_clipped_base(method, k, data):
    df = data.draw(frames(k))
    col = {"score": "score"} if k == 2 else {"scores": "scores"}
    out = calpipe.protect(df, method=method, **col, **IDENTITY[k])
    # p' = (P + sum A) p with P + sum A = 1: equal up to the rounding of that sum (a few ulp)
    # p' = (P + sum of the weights) p: the weights sum to 1 within a few ulp of rounding (a
    # hypothesis example reached 4 ulp of 0.84 = 4.4e-16), so the bound is 8 ulp of 1.
    np.testing.assert_allclose(protected(out, k), clipped_base(df, k), rtol=0, atol=8.9e-16)
    np.testing.assert_allclose(out["log10_martingale"].to_numpy(), 0.0, rtol=0, atol=1e-13)


def test_identity_family_binary_cox_beta_one_also_returns_the_clipped_base():
    df = make_events(3, n_events=60)
    out = calpipe.protect(df, method="jumper", family="cox", family_params=[1.0], clip=0.01)
    np.testing.assert_allclose(protected(out, 2), clipped_base(df, 2, eps=0.01), rtol=0, atol=4e-16)


# ----------------------------------------------------------------------------------------------
# Delayed feedback
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_an_event_forecast_before_a_label_time_does_not_see_that_label(name, k, data):
    df = data.draw(frames(k, label_time=True))
    labelled = np.flatnonzero(df["label"].is_not_null().to_numpy())
    if labelled.size == 0:
        return
    i = int(data.draw(st.sampled_from(labelled.tolist()), label="row"))
    hidden = df.with_columns(df["label"].scatter(i, None), df["label_time"].scatter(i, None))
    a = run(df, name, k, label_time="label_time").scores
    b = run(hidden, name, k, label_time="label_time").scores

    t_event = df["event_time"].cast(pl.Datetime("us")).to_numpy()
    t_label = df["label_time"][i]
    same = stream_key(df) == stream_key(df)[i]
    blind = same & (t_event <= np.datetime64(t_label, "us"))  # equal times: forecast first
    pa, pb = protected(a, k), protected(b, k)
    np.testing.assert_array_equal(pa[blind], pb[blind])
    np.testing.assert_array_equal(pa[~same], pb[~same])
    # the test can fail: events after the label's time do learn from it
    x = base_of(df, k)
    seeing = same & ~blind & interior(x)
    if interior(x)[i] and seeing.any():
        assert not np.array_equal(pa[seeing], pb[seeing]), "a delayed label is never learnt"


def _two_events(label_time: dt.datetime) -> pl.DataFrame:
    t = dt.datetime(2024, 5, 1)
    return pl.DataFrame(
        {
            "event_time": [t, t + dt.timedelta(hours=1)],
            "event_id": [1, 2],
            "score": [0.3, 0.3],
            "label": [1, None],
            "label_time": [label_time, None],
        }
    )


def test_a_label_known_at_the_next_event_time_is_not_seen_by_that_event():
    t = dt.datetime(2024, 5, 1)
    at_next = calpipe.protect(_two_events(t + dt.timedelta(hours=1)), label_time="label_time")
    never = calpipe.protect(
        _two_events(t + dt.timedelta(hours=1)).with_columns(
            pl.lit(None, pl.Int64).alias("label"),
            pl.lit(None, pl.Datetime("us")).alias("label_time"),
        ),
        label_time="label_time",
    )
    assert at_next["protected_score"][1] == never["protected_score"][1]


def test_a_label_known_before_the_next_event_is_seen_by_it():
    t = dt.datetime(2024, 5, 1)
    early = calpipe.protect(_two_events(t), label_time="label_time")  # known at its own time
    late = calpipe.protect(_two_events(t + dt.timedelta(hours=1)), label_time="label_time")
    no_delay = calpipe.protect(_two_events(t).drop("label_time"))
    assert early["protected_score"][1] != late["protected_score"][1]
    assert early["protected_score"][1] == no_delay["protected_score"][1]


def test_labels_not_yet_known_at_the_end_of_a_batch_are_kept_in_the_state():
    t = dt.datetime(2024, 5, 1)
    res = calpipe.protect_with_state(_two_events(t + dt.timedelta(days=3)), label_time="label_time")
    row = res.state.row(0, named=True)
    assert row["pending_labels"] == [1]
    assert row["pending_label_time"] == [t + dt.timedelta(days=3)]
    assert row["pending_scores"] == [0.3]
    assert row["n_labelled"] == 0 and row["n_events"] == 2


# ----------------------------------------------------------------------------------------------
# Shape of the output
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(data=st.data())
def test_output_is_the_input_rows_in_input_order_with_columns_unchanged(name, k, data):
    df = data.draw(frames(k)).drop(RID)
    out = run(df, name, k).scores
    assert out.columns[: df.width] == df.columns
    assert_frame_equal(out.select(df.columns), df, check_exact=True)
    extra = {"protected_score" if k == 2 else "protected_scores", "log10_martingale"}
    if name == "composite-brier":
        extra.add("log10_martingale_by_rate")
    assert set(out.columns[df.width :]) == extra
    assert out.schema["log10_martingale"] == pl.Float64
    if k == 2:
        assert out.schema["protected_score"] == pl.Float64
    else:
        assert out.schema["protected_scores"] == df.schema["scores"]


def test_multiclass_array_input_gives_array_output_equal_to_list_input():
    lst = make_events(11, n_events=30, n_classes=3)
    arr = lst.with_columns(pl.col("scores").cast(pl.Array(pl.Float64, 3)))
    a = calpipe.protect(lst, scores="scores")
    b = calpipe.protect(arr, scores="scores")
    assert b.schema["protected_scores"] == pl.Array(pl.Float64, 3)
    assert_frame_equal(
        b.with_columns(pl.col("scores", "protected_scores").cast(pl.List(pl.Float64))), a
    )


def test_lazyframe_in_lazyframe_out():
    df = make_events(5, n_events=25)
    out = calpipe.protect(df.lazy())
    assert isinstance(out, pl.LazyFrame)
    assert_frame_equal(out.collect(), calpipe.protect(df), check_exact=True)
    res = calpipe.protect_with_state(df.lazy())
    assert_frame_equal(res.scores, calpipe.protect(df), check_exact=True)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("k", [2, 3])
def test_empty_input_gives_empty_output_with_the_schema_of_a_nonempty_one(name, k):
    df = make_events(1, n_events=10, n_classes=k)
    full = run(df, name, k).scores
    empty = run(df.clear(), name, k)
    assert empty.scores.height == 0
    assert empty.scores.schema == full.schema
    assert empty.scores.schema["log10_martingale"] == pl.Float64
    if k == 2:
        assert empty.scores.schema["protected_score"] == pl.Float64
    assert empty.state.height == 0
    lazy = calpipe.protect(
        df.clear().lazy(), **({"score": "score"} if k == 2 else {"scores": "scores"})
    )
    assert isinstance(lazy, pl.LazyFrame) and lazy.collect().height == 0


def test_empty_input_passes_the_state_through():
    df = make_events(2, n_events=20)
    first = calpipe.protect_with_state(df)
    again = calpipe.protect_with_state(df.clear(), state=first.state)
    assert again.scores.height == 0
    assert_frame_equal(again.state, first.state, check_exact=True)


def test_streams_missing_from_a_batch_keep_their_state_unchanged():
    df = make_events(4, n_events=40, n_streams=3)
    first = calpipe.protect_with_state(df)
    later = df.filter(pl.col("stream") == "s0").with_columns(
        pl.col("event_time") + dt.timedelta(days=30)
    )
    second = calpipe.protect_with_state(later, state=first.state)
    assert second.state["stream"].to_list() == first.state["stream"].to_list()
    assert_frame_equal(
        second.state.filter(pl.col("stream") != "s0"),
        first.state.filter(pl.col("stream") != "s0"),
        check_exact=True,
    )
    s0 = second.state.filter(pl.col("stream") == "s0").row(0, named=True)
    assert s0["n_events"] == df.filter(pl.col("stream") == "s0").height * 2


def test_state_counts_events_labels_and_tracks_the_martingale():
    df = make_events(9, n_events=60, n_streams=2, null_frac=0.25)
    res = calpipe.protect_with_state(df, method="composite-jumper")
    for row in res.state.iter_rows(named=True):
        part = res.scores.filter(pl.col("stream") == row["stream"]).sort(ORDER)
        assert row["n_events"] == part.height
        assert row["n_labelled"] == part["label"].is_not_null().sum()
        assert row["log10_martingale"] == part["log10_martingale"][-1]
        assert row["log10_martingale_max"] == max(0.0, part["log10_martingale"].max())
        assert row["last_event_time"] == part["event_time"][-1]
        assert row["last_event_id"] == part["event_id"][-1]
        assert row["config_fingerprint"] == calpipe.make_calibrator("composite-jumper").fingerprint(
            2
        )


def test_a_calibrator_object_runs_as_its_name_and_parameters(make_events):
    """``method`` may be a calibrator already built: the same rows and state as the name and
    its parameters (a nightly chain builds its calibrator once and hands the object on)."""
    ev = make_events(3, n_events=60)
    cal = calpipe.make_calibrator("composite-jumper", pi=0.25)
    by_name = calpipe.protect_with_state(ev, method="composite-jumper", pi=0.25)
    by_object = calpipe.protect_with_state(ev, method=cal)
    assert_frame_equal(by_object.scores, by_name.scores)
    assert_frame_equal(by_object.state, by_name.state)
    again = calpipe.protect_with_state(ev, method=cal)  # the object is not used up by a call
    assert_frame_equal(again.scores, by_name.scores)


def test_a_calibrator_object_with_parameters_is_refused(make_events):
    ev = make_events(3, n_events=10)
    cal = calpipe.make_calibrator("composite-jumper")
    with pytest.raises(calpipe.ParameterError, match=r"calibrator object .*\['pi'\]"):
        calpipe.protect_with_state(ev, method=cal, pi=0.25)
    with pytest.raises(calpipe.ParameterError, match=r"\['base_method'\]"):
        calpipe.protect(ev, method=cal, base_method="platt")
