"""calpipe/engine/contract.py ``as_polars``: protect takes pandas, Arrow and numpy inputs (#14) and gives
the scores back in the caller's kind; they used to fail with ``AttributeError: ... 'height'``."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import calpipe
from calpipe.errors import InputError
from tests.conftest import make_events

pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def events() -> pl.DataFrame:
    return make_events(7, n_events=90, n_streams=3)


def test_pandas_in_pandas_out(events):
    want = calpipe.protect(events)
    got = calpipe.protect(events.to_pandas())
    assert isinstance(got, pd.DataFrame)
    np.testing.assert_array_equal(got["protected_score"].to_numpy(), want["protected_score"])
    res = calpipe.protect_with_state(events.to_pandas())
    assert isinstance(res.scores, pd.DataFrame) and isinstance(res.state, pl.DataFrame)
    # the state (calpipe's own frame) resumes a pandas chunk as it resumes a polars one
    timed = events.sort("event_time", "event_id")
    half = timed.height // 2
    first = calpipe.protect_with_state(timed.head(half).to_pandas())
    second = calpipe.protect_with_state(timed.slice(half).to_pandas(), state=first.state)
    both = np.concatenate([first.scores["protected_score"], second.scores["protected_score"]])
    one = calpipe.protect(timed)["protected_score"].to_numpy()
    np.testing.assert_array_equal(both, one)


def test_arrow_in_arrow_out(events):
    got = calpipe.protect(events.to_arrow())
    assert isinstance(got, pa.Table)
    assert pl.from_arrow(got).equals(calpipe.protect(events))


def test_numpy_columns_with_nan_as_the_missing_label(events):
    columns = {c: events[c].to_numpy() for c in events.columns}
    assert np.isnan(columns["label"]).any()  # numpy's missing label
    got = calpipe.protect(columns)
    want = calpipe.protect(events)
    assert got.drop("label").equals(want.drop("label"))


def test_anything_else_names_its_type():
    with pytest.raises(InputError, match=r"got builtins\.list"):
        calpipe.protect([0.2, 0.7])


def test_a_mapping_that_is_not_a_table_names_the_problem():
    with pytest.raises(InputError, match="events as a mapping of columns"):
        calpipe.protect({"stream": ["a", "b"], "score": [0.5]})
