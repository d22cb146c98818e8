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
