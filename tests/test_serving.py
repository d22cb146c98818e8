"""calpipe/serving.py: ``calpipe.serving_map`` at the top level (no pipeline Settings needed) is
the pipeline's serving map, and the next forecast of the state."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe.errors import StateError
from calpipe.pipeline import Settings, serving_map
from tests.conftest import make_events


@pytest.mark.parametrize(
    ("method", "params"),
    [("composite-experts", {}), ("isotonic", {"window": 20}), ("ops", {}),
     ("composite-jumper", {"base_method": "platt", "base_params": {"window": 20}})],
)  # fmt: skip
def test_the_top_level_serving_map_is_the_pipeline_s(method, params):
    events = make_events(11, n_events=240, n_streams=3)
    state = calpipe.protect_with_state(events, method=method, **params).state
    fresh = pl.DataFrame({
        "stream": np.repeat(state["stream"].to_numpy(), 21),
        "score": np.tile(np.linspace(0.0, 1.0, 21), state.height),
    })  # fmt: skip
    got = calpipe.serving_map(state, fresh, method=method, **params)
    want = serving_map(state, fresh, Settings.make(method, **params))
    assert got.equals(want)
    assert got["protected_score"].is_not_null().all()


def test_a_state_of_another_configuration_is_refused():
    events = make_events(3, n_events=60, n_streams=2)
    state = calpipe.protect_with_state(events, method="composite-jumper").state
    fresh = pl.DataFrame({"stream": state["stream"], "score": [0.5] * state.height})
    with pytest.raises(StateError):
        calpipe.serving_map(state, fresh, method="jumper")


def test_metrics_is_reachable_from_the_top_level():
    frame = pl.DataFrame({"p": [0.2, 0.9], "y": [0, 1]})
    got = frame.select(calpipe.metrics.log_loss("p", "y")).item()
    assert got == pytest.approx(-(np.log(0.8) + np.log(0.9)) / 2)


def _state():
    ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
                       "score": [0.2, 0.7, 0.4], "label": [0, 1, 1]})  # fmt: skip
    return calpipe.protect_with_state(ev).state


@pytest.mark.parametrize(
    ("fresh", "column"),
    [({"s": ["a"], "score": [0.5]}, "stream"), ({"stream": ["a"], "p": [0.5]}, "score")],
)
def test_a_missing_stream_or_score_column_named_an_internal_column(fresh, column):
    # issue 36 item 16: polars' ColumnNotFoundError naming '__row', or KeyError: 'score'
    from calpipe.errors import InputError

    with pytest.raises(InputError) as e:
        calpipe.serving_map(_state(), pl.DataFrame(fresh))
    assert e.value.column == column
    assert "__row" not in str(e.value) and f"has no column {column!r}" in str(e.value)


def test_two_class_vectors_are_served_as_the_binary_p1():
    # issue 36 item 3: K = 2 vectors are the binary p1 wherever scores go in
    st = _state()
    one = calpipe.serving_map(st, pl.DataFrame({"stream": ["a"], "score": [0.3]}))
    two = calpipe.serving_map(st, pl.DataFrame({"stream": ["a"], "score": [[0.7, 0.3]]}))
    p = one["protected_score"][0]
    assert two["protected_scores"].to_list() == [[1.0 - p, p]]


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_a_null_or_nan_binary_score_was_refused_not_no_forecast(missing):
    # the docstring's "a null or NaN score is no forecast": the binary branch mapped it anyway
    # and check_serving_scores refused it (the K-class branch dropped such rows already)
    fresh = pl.DataFrame({"stream": ["a", "a", "b"], "score": [0.5, missing, 0.5]},
                         schema={"stream": pl.String, "score": pl.Float64})  # fmt: skip
    got = calpipe.serving_map(_state(), fresh)["protected_score"].to_list()
    want = calpipe.serving_map(_state(), fresh[:1])["protected_score"].to_list()
    assert got[1] is None and got[2] is None  # no forecast; stream b has no state
    assert got[0] == want[0] and 0.0 < got[0] < 1.0
