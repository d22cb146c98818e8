"""calpipe.calibrators.base: the ragged state container."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.calibrators.base import FlatState, ragged_concat, ragged_take, weights_series


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


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=1,
                        max_size=4), seed=st.integers(0, 1000))  # fmt: skip
def test_ragged_concat_then_take_equals_a_loop_over_streams(lengths, seed):
    """parts[j] has one segment per stream; concat = per stream the segments in part order, and
    taking each part's segments back gives the part again."""
    n = len(lengths[0])
    lengths = [(row + [0] * n)[:n] for row in lengths]
    rng = np.random.default_rng(seed)
    parts = []
    for row in lengths:
        off = np.concatenate([[0], np.cumsum(row)]).astype(np.int64)
        parts.append((rng.normal(size=int(off[-1])), off))
    values, offsets = ragged_concat(parts)
    want = [np.concatenate([v[o[s] : o[s + 1]] for v, o in parts]) for s in range(n)]
    assert values.tolist() == np.concatenate(want).tolist()
    assert np.diff(offsets).tolist() == [w.size for w in want]
    at = offsets[:-1].copy()
    for v, o in parts:
        got, got_off = ragged_take(values, at, np.diff(o))
        assert got.tolist() == v.tolist() and got_off.tolist() == o.tolist()
        at += np.diff(o)


def test_ragged_take_refuses_a_segment_outside_the_values():
    # the copy is compiled without bounds checks: a corrupt length must stop here
    with pytest.raises(ValueError, match="outside"):
        ragged_take(np.zeros(5), np.array([0, 3]), np.array([2, 3]))
    with pytest.raises(ValueError, match="outside"):
        ragged_take(np.zeros(5), np.array([-1]), np.array([1]))

