"""calpipe.calibrators.online_scaling through the public entry points: protect (streams, delayed
labels), the CLI, stacking, K classes; each equal to the paper loop of tests/naive_online_scaling.py."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe.calibrators import METHODS, make_calibrator
from calpipe.calibrators.base import FlatState, StreamState
from calpipe.cli import main
from calpipe.errors import ParameterError, StateError
from tests import naive_online_scaling as naive

PAPER = {
    "ops": ("platt", None),
    "tops": ("platt", naive.tracking),
    "hops": ("platt", naive.hedging),
    "obs": ("beta", None),
    "tobs": ("beta", naive.tracking),
    "hobs": ("beta", naive.hedging),
    "online-histogram": (None, naive.tracking),
}


def _oracle(method, x, y):
    kind, beat = PAPER[method]
    expert = x if kind is None else naive.ons_stream(x, y, kind=kind, eps=100.0)
    return expert if beat is None else beat(expert, y)


def _events(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.02, 0.98, 2 * n)
    y = (rng.uniform(size=2 * n) < np.clip(x + 0.15, 0, 1)).astype(np.int64)
    return pl.DataFrame({
        "stream": ["a"] * n + ["b"] * n,
        "event_time": np.r_[np.arange(n), np.arange(n)],
        "event_id": np.r_[np.arange(n), np.arange(n)],
        "score": x, "label": y,
    })  # fmt: skip


def test_the_paper_methods_are_registered():
    assert set(PAPER) <= set(METHODS)


@pytest.mark.parametrize("method", list(PAPER))
def test_protect_equals_the_paper_loop_per_stream(method):
    df = _events(seed=len(method))
    out = calpipe.protect(df, method=method)
    for s in ("a", "b"):
        part = out.filter(pl.col("stream") == s).sort("event_time")
        want = _oracle(method, part["score"].to_numpy(), part["label"].to_numpy())
        np.testing.assert_allclose(part["protected_score"].to_numpy(), want, atol=1e-12, rtol=0)


def test_ops_with_delayed_labels_learns_each_label_when_it_arrives():
    t0 = pl.datetime(2026, 1, 1)
    df = (
        _events(n=100)
        .filter(pl.col("stream") == "a")
        .with_columns((t0 + pl.duration(seconds=pl.col("event_time"))).alias("event_time"))
    )
    # every label arrives 9.5 s later: event t sees the labels of events <= t - 10
    late = df.with_columns(
        (pl.col("event_time") + pl.duration(milliseconds=9500)).alias("label_time")
    )
    got = calpipe.protect(late, method="ops", label_time="label_time")["protected_score"]
    x, y = df["score"].to_numpy(), df["label"].to_numpy()
    for t in (0, 9, 10, 57, 99):
        seen = max(t - 9, 0)  # labels of events 0 .. t - 10
        xe, ye = np.r_[x[:seen], x[t]], np.r_[y[:seen], 0]
        want = naive.ons_stream(xe, ye, kind="platt", eps=100.0)[-1]
        assert abs(got[t] - want) <= 1e-12, t


def test_ops_on_k_classes_is_online_vector_scaling():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(4), 200)
    y = rng.integers(0, 4, 200)
    df = pl.DataFrame({"event_time": np.arange(200), "event_id": np.arange(200),
                       "scores": p.tolist(), "label": y})  # fmt: skip
    out = calpipe.protect(df, scores="scores", method="ops")
    got = np.array(out["protected_scores"].to_list())
    np.testing.assert_allclose(got, naive.ons_stream(p, y, kind="vector", eps=100.0), atol=1e-12)
    with pytest.raises(ParameterError, match="binary-only"):
        calpipe.protect(df, scores="scores", method="tops")


def test_composite_jumper_protects_ops_with_its_insurance():
    df = _events(seed=3)
    ops = calpipe.protect(df, method="ops")
    stack = calpipe.protect(df, method="composite-jumper", base_method="ops")
    y = df["label"].to_numpy()

    def loss(p):
        q = np.clip(p, 1e-3, 1 - 1e-3)
        return -np.sum(np.where(y == 1, np.log(q), np.log(1 - q)))

    # paper 001: the stack's cumulative log loss <= its base's (clipped) + ln(1/pi) per stream
    assert loss(stack["protected_score"].to_numpy()) <= loss(
        ops["protected_score"].to_numpy()
    ) + 2 * np.log(2)


def test_the_cli_lists_and_runs_them(tmp_path, capsys):
    main(["methods"])
    listing = capsys.readouterr().out
    for m in PAPER:
        assert f"\n{m}\n" in f"\n{listing}"
    src = tmp_path / "events.parquet"
    _events(n=50).write_parquet(src)
    dst = tmp_path / "out.parquet"
    main(["protect", str(src), str(dst), "--method", "hops", "--n-bins", "5"])
    out = pl.read_parquet(dst)
    part = out.filter(pl.col("stream") == "a").sort("event_time")
    want = naive.hedging(
        naive.ons_stream(part["score"].to_numpy(), part["label"].to_numpy(), kind="platt",
                         eps=100.0),
        part["label"].to_numpy(), 5,
    )  # fmt: skip
    np.testing.assert_allclose(part["protected_score"].to_numpy(), want, atol=1e-12)


def test_parameters_are_validated():
    with pytest.raises(ParameterError, match="gamma"):
        make_calibrator("ops", gamma=0)
    with pytest.raises(ParameterError, match="n_bins"):
        make_calibrator("ops", n_bins=4)  # OPS has no calibeating bins
    with pytest.raises(ParameterError, match="radius"):
        make_calibrator("online-histogram", radius=3.0)  # no scaling model


def _tampered(method, mutate, k=2):
    """A stored state of ``method`` after three events, ``mutate``d (its weights as an array),
    through the JSON a user could have edited."""
    cal = make_calibrator(method)
    x = np.array([0.2, 0.7, 0.9]) if k == 2 else np.full((3, k), 1.0 / k)
    _, st = cal.run(x, np.array([0, 1, 0]))
    w = np.array(st.weights)
    mutate(w)
    st.weights = w.tolist()
    return cal, x, StreamState.from_json(st.to_json())


@pytest.mark.parametrize("method", ["tops", "hops", "tobs", "hobs", "ops", "obs"])
def test_a_huge_theta_is_refused_on_load_not_a_heap_abort(method):
    # theta 1e308 overflowed theta . u to NaN (beta: -inf + inf) and int(NaN * n_bins) read the
    # calibeating table out of bounds
    cal, x, st = _tampered(method, lambda w: w.__setitem__(slice(0, 2), 1e308))
    with pytest.raises(StateError, match="theta's norm exceeds the projection radius"):
        cal.run(x, np.array([1, -1, 0]), state=st)


@pytest.mark.parametrize("method", ["ops", "obs", "tobs"])
def test_an_overflowing_ons_curvature_is_refused_on_load(method):
    # A entries of 1e300 overflowed the adjugate: NaN forecasts, no error
    d = 3 if method.endswith("obs") else 2
    cal, x, st = _tampered(method, lambda w: w.__setitem__(slice(d, d + d * d), 1e300))
    with pytest.raises(StateError, match="A has an entry beyond 1e\\+100"):
        cal.run(x, np.array([1, -1, 0]), state=st)


def test_an_all_zero_ons_state_is_refused_not_a_zero_division():
    cal, x, st = _tampered("ops", lambda w: w.__setitem__(slice(None), 0.0))
    with pytest.raises(StateError, match="smallest eigenvalue is below rho / 2"):
        cal.run(x, np.array([1, -1, 0]), state=st)
    cal, x, st = _tampered("ops", lambda w: w.__setitem__(3, w[3] + 1.0))  # A[0, 1] != A[1, 0]
    with pytest.raises(StateError, match="A is not symmetric"):
        cal.run(x, np.array([1, -1, 0]), state=st)


def test_a_k_class_ons_state_is_checked_too():
    cal, x, st = _tampered("ops", lambda w: w.__setitem__(slice(6, None), 0.0), k=3)
    with pytest.raises(StateError, match="smallest eigenvalue"):
        cal.run(x, np.array([1, -1, 0]), state=st)


@pytest.mark.parametrize("method", ["tops", "tobs", "online-histogram"])
@pytest.mark.parametrize("pair", [(7.0, 7.0), (3.0, 1.0), (-1.0, 2.0), (0.5, 1.0)])
def test_tampered_calibeating_counts_are_refused_not_forecasts_outside_0_1(method, pair):
    # (sum of labels, count) of every bin set to ``pair``, bin 0 emptied of its count: a sum
    # above its count, below 0 or fractional forecast outside [0, 1] (online-histogram gave 7)
    cal = make_calibrator(method)
    size = cal.state_size(2)
    start = size - 2 * cal.params["n_bins"]

    def mutate(w):
        w[start::2], w[start + 1 :: 2] = pair
        w[start + 1] = 0.0  # bin 0 empty: sum > count there

    cal, x, st = _tampered(method, mutate)
    with pytest.raises(StateError, match="whole numbers with 0 <= sum <= count"):
        cal.run(x, np.array([1, -1, 0]), state=st)


def test_a_nan_expert_forecast_is_an_error_not_a_bin_read():
    # the guard behind the load checks: a state that bypasses them (run_unchecked on a made-up
    # FlatState) gives a StateError, not int(NaN) as a bin index nor a silent NaN
    cal = make_calibrator("tops")
    st = cal.initial_state(1, 2)
    v = st.values.copy()
    v[:2] = [np.inf, -np.inf]
    bad = FlatState(v, st.offsets, st.log10m)
    with pytest.raises(StateError, match="not a probability"):
        cal.run_unchecked(np.array([0.2, 0.9]), np.array([0, 1]), np.arange(2),
                          np.ones(2, np.int8), np.array([0, 2]), bad)  # fmt: skip


def test_valid_states_still_load_after_many_labels():
    rng = np.random.default_rng(3)
    x = rng.uniform(0.01, 0.99, 400)
    y = (rng.uniform(size=400) < x**2).astype(np.int64)
    for method in ("ops", "tops", "hops", "obs", "tobs", "hobs", "online-histogram"):
        small = {} if method == "online-histogram" else {"radius": 0.5}  # theta_1 outside it
        cal = make_calibrator(method, **small)
        _, fresh = cal.run(x[:1], np.array([-1]))
        cal.run(x, y, state=StreamState.from_json(fresh.to_json()))
        _, st = cal.run(x, y)
        cal.run(x, y, state=StreamState.from_json(st.to_json()))


def test_an_overflowing_obs_state_row_is_refused_by_protect_with_state():
    x, y = np.array([0.2, 0.7, 0.9]), np.array([0, 1, 0])
    df = pl.DataFrame({"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
                       "score": x, "label": y})  # fmt: skip
    r = calpipe.protect_with_state(df, by="stream", method="obs")
    state = r.state.with_columns(pl.col("weights").list.eval(pl.element() * 0 + 1e300))
    later = df.with_columns(pl.col("event_time") + 10)
    with pytest.raises(StateError, match="state row of stream='a'"):
        calpipe.protect_with_state(later, by="stream", method="obs", state=state)
