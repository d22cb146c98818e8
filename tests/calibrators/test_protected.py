"""The calibrator objects (:mod:`calpipe.calibrators.protected`): ``run`` on arrays, resuming from a
:class:`StreamState`, its JSON round trip, config fingerprints, and :func:`calpipe.methods`."""

from __future__ import annotations

import itertools
import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import calpipe
from calpipe.calibrators import PROTECTED_METHODS as METHODS
from calpipe.calibrators import CompositeJumper, Jumper, MeanJumper, StreamState
from calpipe.errors import ParameterError, StateError
from calpipe.kernels.ops import OP_FORECAST, OP_STEP

FAST = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)

CONFIGS = {
    "jumper": (Jumper, {}),
    "mean-jumper": (MeanJumper, {}),
    "composite-log": (CompositeJumper, {}),
    "composite-brier": (CompositeJumper, {"loss": "brier"}),
}
CASES = [pytest.param(name, k, id=f"{name}-K{k}") for name in CONFIGS for k in (2, 3)]


def make(name: str):
    cls, params = CONFIGS[name]
    return cls(**params)


def stream(seed: int, n: int, k: int, null_frac: float = 0.3):
    """Scores ((n,) or (n, K)) and labels (-1 = not known) of one drifting stream."""
    rng = np.random.default_rng(seed)
    if k == 2:
        p = rng.beta(2, 2, size=n)
        y = (rng.random(n) < np.clip(p**2 + 0.1, 0, 1)).astype(np.int64)
    else:
        p = rng.dirichlet(np.ones(k), size=n)
        q = p**2 / (p**2).sum(axis=1, keepdims=True)
        y = np.array([rng.choice(k, p=row) for row in q], dtype=np.int64)
    y[rng.random(n) < null_frac] = -1
    return p, y


def state_close(a: StreamState, b: StreamState, tol: float = 1e-12) -> None:
    assert (a.method, a.config_fingerprint, a.n_classes) == (
        b.method,
        b.config_fingerprint,
        b.n_classes,
    )
    assert (a.n_events, a.n_labelled) == (b.n_events, b.n_labelled)
    assert a.log10_martingale == pytest.approx(b.log10_martingale, abs=tol, rel=0)
    assert a.log10_martingale_max == pytest.approx(b.log10_martingale_max, abs=tol, rel=0)
    np.testing.assert_allclose(a.weights, b.weights, rtol=0, atol=tol)


# ----------------------------------------------------------------------------------------------
# run(): resumable, consistent with the frame API
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 60),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    via_json=st.booleans(),
)
def test_run_in_chunks_with_the_state_carried_equals_one_pass(name, k, seed, n, cuts, via_json):
    cal = make(name)
    p, y = stream(seed, n, k)
    one, final = cal.run(p, y)
    bounds = sorted({0, n, *(int(c * n) for c in cuts)})
    state, parts, martingales = None, [], []
    for lo, hi in itertools.pairwise(bounds):
        if via_json and state is not None:
            state = StreamState.from_json(state.to_json())
        out, state = cal.run(p[lo:hi], y[lo:hi], state=state)
        parts.append(out.protected)
        martingales.append(out.log10_martingale)
    np.testing.assert_allclose(np.concatenate(parts), one.protected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        np.concatenate(martingales), one.log10_martingale, rtol=0, atol=1e-12
    )
    state_close(state, final)


@pytest.mark.parametrize(("name", "k"), CASES)
def test_run_on_arrays_equals_protect_on_one_stream(name, k):
    cls, params = CONFIGS[name]
    p, y = stream(5, 40, k)
    out, state = cls(**params).run(p, y)
    frame = pl.DataFrame(
        {
            "event_time": np.arange(40),
            "event_id": np.arange(40),
            ("score" if k == 2 else "scores"): p if k == 2 else p.tolist(),
            "label": pl.Series([int(v) if v >= 0 else None for v in y], dtype=pl.Int64),
        }
    )
    col = {"score": "score"} if k == 2 else {"scores": "scores"}
    res = calpipe.protect_with_state(frame, method=cls.name, **col, **params)
    got = res.scores["protected_score" if k == 2 else "protected_scores"]
    np.testing.assert_array_equal(np.array(got.to_list()), out.protected)
    np.testing.assert_array_equal(res.scores["log10_martingale"].to_numpy(), out.log10_martingale)
    row = res.state.row(0, named=True)
    assert row["config_fingerprint"] == state.config_fingerprint
    assert row["weights"] == state.weights
    assert (row["n_events"], row["n_labelled"]) == (state.n_events, state.n_labelled)


@pytest.mark.parametrize(("name", "k"), CASES)
def test_run_state_counts_and_martingale(name, k):
    cal = make(name)
    p, y = stream(8, 50, k, null_frac=0.4)
    out, state = cal.run(p, y)
    assert state.method == type(cal).name
    assert state.config_fingerprint == cal.fingerprint(k)
    assert state.n_classes == k
    assert state.n_events == 50 and state.n_labelled == int((y >= 0).sum())
    assert state.log10_martingale == out.log10_martingale[-1]
    assert state.log10_martingale_max == max(0.0, float(out.log10_martingale.max()))
    assert out.protected.shape == ((50,) if k == 2 else (50, k))


@pytest.mark.parametrize(("name", "k"), CASES)
def test_an_unlabelled_event_changes_no_state(name, k):
    cal = make(name)
    p, y = stream(9, 30, k, null_frac=0.0)
    _, state = cal.run(p, y)
    out, after = cal.run(p[:3], np.full(3, -1), state=state)
    assert after.weights == state.weights
    assert after.log10_martingale == state.log10_martingale
    assert (after.n_events, after.n_labelled) == (state.n_events + 3, state.n_labelled)
    # the three forecasts are the serving map of the same state
    again, _ = cal.run(p[2:3], np.array([-1]), state=state)
    np.testing.assert_array_equal(again.protected[0], out.protected[2])


@pytest.mark.parametrize(("name", "k"), CASES)
def test_serving_map_is_the_forecast_of_an_unlabelled_event(name, k):
    cal = make(name)
    p, y = stream(10, 30, k, null_frac=0.0)
    _, state = cal.run(p, y)
    fresh, _ = stream(11, 12, k)
    expected, _ = cal.run(fresh, np.full(12, -1), state=state)
    bstate = cal.state_from_vectors(
        np.asarray([state.weights]), np.array([state.log10_martingale]), k
    )
    got = cal.serving_map(bstate, fresh[None])
    np.testing.assert_allclose(got[0], expected.protected, rtol=0, atol=1e-15)


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 120))
def test_brier_binary_scores_equal_the_two_column_k_class_path(seed, n):
    """loss="brier" on binary scores runs the fast two-class kernel; the same scores as two
    columns (1 - p, p) run the K-class kernel of the package's recursion: same forecasts,
    martingales (overall and by rate) and state, to 1e-12. (The public entries take two columns
    as the binary p1, issue 36 item 3: the K-class kernel is reached through run_unchecked.)"""
    cal = CompositeJumper(loss="brier")
    p, y = stream(seed, n, 2)
    p[: min(n, 3)] = [0.0, 1.0, 0.5][: min(n, 3)]  # Brier mode clips nothing
    kind = np.where(y < 0, OP_FORECAST, OP_STEP).astype(np.int8)
    args = (np.maximum(y, 0), np.arange(n), kind, np.array([0, n]))
    fast, fast_state = cal.run_batch(p, *args, cal.initial_state(1, 2))
    two = np.column_stack([1.0 - p, p])
    ref, ref_state = cal.run_unchecked(two, *args, cal.initial_state(1, 2))
    np.testing.assert_allclose(fast.protected, ref.protected[:, 1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(fast.log10_martingale, ref.log10_martingale, rtol=0, atol=1e-12)
    key = "log10_martingale_by_rate"
    np.testing.assert_allclose(fast.extra[key], ref.extra[key], rtol=0, atol=1e-12)
    np.testing.assert_allclose(fast_state.vectors(), ref_state.vectors(), rtol=0, atol=1e-12)


def test_run_with_a_state_of_another_configuration_is_a_state_error():
    p, y = stream(1, 20, 2)
    _, state = CompositeJumper().run(p, y)
    with pytest.raises(StateError) as e:
        CompositeJumper(pi=0.25).run(p, y, state=state)
    assert state.config_fingerprint in str(e.value)
    assert CompositeJumper(pi=0.25).fingerprint(2) in str(e.value)
    with pytest.raises(StateError):
        Jumper().run(p, y, state=state)
    p3, y3 = stream(1, 20, 3)
    with pytest.raises(StateError, match="K = 3"):
        CompositeJumper().run(p3, y3, state=state)


# ----------------------------------------------------------------------------------------------
# StreamState
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "k"), CASES)
def test_stream_state_json_round_trip_is_exact(name, k):
    p, y = stream(3, 40, k)
    _, state = make(name).run(p, y)
    text = state.to_json()
    back = StreamState.from_json(text)
    assert back == state
    assert back.weights == state.weights  # floats survive JSON bit for bit
    assert json.loads(text)["config_fingerprint"] == state.config_fingerprint
    assert set(json.loads(text)) == {
        "method",
        "config_fingerprint",
        "n_classes",
        "n_events",
        "n_labelled",
        "log10_martingale",
        "log10_martingale_max",
        "weights",
    }


def test_stream_state_json_is_canonical():
    s = StreamState("jumper", "abc", 2, 3, 2, -0.5, 0.25, [0.1, 0.9])
    assert s.to_json() == StreamState.from_json(s.to_json()).to_json()
    assert s.to_json().index('"config_fingerprint"') < s.to_json().index('"weights"')


# ----------------------------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------------------------
#: one other valid value for every parameter of every method
OTHER_VALUE = {
    "jumper": {
        "family": "cox",
        "family_params": [(0.0, 1.0), (1.0, 1.0), (-1.0, 2.0)],
        "jumping_rates": [0.1],
        "clip": 0.01,
    },
    "mean-jumper": {
        "family": "cox",
        "family_params": [(0.0, 1.0), (0.0, 2.0)],
        "jumping_rates": [1.0, 0.5],
        "clip": 0.01,
    },
    "composite-jumper": {
        "family": "cox",
        "family_params": [(0.0, 1.0), (1.0, 1.0)],
        "jumping_rates": [0.01],
        "pi": 0.3,
        "loss": "brier",
        "clip": 0.01,
    },
}


def test_other_values_cover_every_parameter():
    for name, cls in METHODS.items():
        assert set(OTHER_VALUE[name]) == set(cls.parameters)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize(
    ("method", "param"), [(m, p) for m, values in OTHER_VALUE.items() for p in values]
)
def test_fingerprint_differs_when_any_parameter_differs(method, param, k):
    base = calpipe.make_calibrator(method)
    other = calpipe.make_calibrator(method, **{param: OTHER_VALUE[method][param]})
    assert other.fingerprint(k) != base.fingerprint(k)


@pytest.mark.parametrize("method", list(METHODS))
def test_fingerprint_is_stable_and_defaults_given_explicitly_change_nothing(method):
    cls = METHODS[method]
    explicit = {p: spec.default for p, spec in cls.parameters.items()}
    a, b = calpipe.make_calibrator(method), calpipe.make_calibrator(method, **explicit)
    assert a.fingerprint(2) == b.fingerprint(2) == calpipe.make_calibrator(method).fingerprint(2)
    assert a.fingerprint(2) != a.fingerprint(3) != a.fingerprint(4)


def test_fingerprint_differs_between_methods():
    fps = {calpipe.make_calibrator(m, jumping_rates=[1.0]).fingerprint(2) for m in METHODS}
    assert len(fps) == len(METHODS)


def test_brier_and_log_clip_defaults_share_one_fingerprint_each():
    assert CompositeJumper(clip=None).fingerprint(2) == CompositeJumper(clip=1e-3).fingerprint(2)
    assert CompositeJumper(loss="brier").fingerprint(2) == CompositeJumper(
        loss="brier", clip=None
    ).fingerprint(2)


# ----------------------------------------------------------------------------------------------
# methods()
# ----------------------------------------------------------------------------------------------
def test_methods_lists_every_method_with_its_parameters():
    table = calpipe.methods()
    assert {"jumper", "mean-jumper", "composite-jumper"} == set(METHODS) <= set(table)
    for name, spec in table.items():
        if name not in METHODS:
            continue
        assert spec["summary"]
        assert set(spec["parameters"]) == set(METHODS[name].parameters)
        for p, d in spec["parameters"].items():
            assert set(d) == {"default", "rule", "help"}, p
            assert d["rule"] and d["help"], p
    assert set(table["composite-jumper"]["parameters"]) == {
        "family",
        "family_params",
        "jumping_rates",
        "pi",
        "loss",
        "clip",
    }
    assert set(table["jumper"]["parameters"]) == {
        "family",
        "family_params",
        "jumping_rates",
        "clip",
    }


@pytest.mark.parametrize("method", list(METHODS))
def test_methods_defaults_are_valid_and_match_the_calibrator(method):
    spec = calpipe.methods()[method]["parameters"]
    cal = calpipe.make_calibrator(method, **{p: d["default"] for p, d in spec.items()})
    assert cal.fingerprint(2) == calpipe.make_calibrator(method).fingerprint(2)


def test_documented_defaults_of_design_section_4():
    cj = calpipe.methods()["composite-jumper"]["parameters"]
    assert cj["pi"]["default"] == 0.5
    assert tuple(cj["jumping_rates"]["default"]) == (1e-2, 1e-3, 1e-4)
    assert cj["family"]["default"] == "cox2"
    assert CompositeJumper().family(2).size == 9
    assert CompositeJumper().family(3).size == 3 * (2 * 3 + 1)
    assert 1.0 in calpipe.methods()["mean-jumper"]["parameters"]["jumping_rates"]["default"]


def test_make_calibrator_unknown_method():
    with pytest.raises(ParameterError, match="unknown method"):
        calpipe.make_calibrator("venn-aber")
