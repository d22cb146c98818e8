"""calpipe.calibrators.base: the ragged state container."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.calibrators.base import FlatState, weights_series


def ragged(lengths, start):
    vectors = [np.arange(n, dtype=np.float64) + start + 100 * i for i, n in enumerate(lengths)]
    return FlatState.from_vectors(vectors, np.arange(len(lengths), dtype=np.float64) + start)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.data())
def test_scatter_replaces_exactly_the_chosen_streams(lengths, data):
    base = ragged(lengths, 0.0)
    idx = np.array(
        data.draw(st.lists(st.sampled_from(range(len(lengths))), unique=True)), dtype=np.int64
    )
    new_lengths = data.draw(st.lists(st.integers(0, 5), min_size=len(idx), max_size=len(idx)))
    loaded = ragged(new_lengths, 0.5)
    want = [base.vector(s) for s in range(base.n_streams)]  # the obvious loop
    want_m = base.log10m.copy()
    for j, s in enumerate(idx):
        want[s] = loaded.vector(j)
        want_m[s] = loaded.log10m[j]
    got = base.scatter(idx, loaded)
    assert [got.vector(s).tolist() for s in range(got.n_streams)] == [w.tolist() for w in want]
    assert got.log10m.tolist() == want_m.tolist()
    assert got.offsets[0] == 0 and got.offsets[-1] == got.values.shape[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=8), st.booleans())
def test_weights_series_holds_each_vector(lengths, equal):
    if equal and lengths:
        lengths = [lengths[0]] * len(lengths)  # the matrix path (all streams one length)
    state = ragged(lengths, 0.25)
    series = weights_series(*state.flat())
    assert series.dtype == pl.List(pl.Float64)
    assert series.to_list() == [state.vector(s).tolist() for s in range(len(lengths))]
