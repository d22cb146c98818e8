"""calpipe.calibrators.base: the ragged state container."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.calibrators.base import (
    FlatState,
    StreamState,
    ragged_concat,
    ragged_take,
    weights_series,
)


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


@pytest.mark.parametrize("idx", [[0, 1, 2], [2, 0, 1], [1]])
def test_scatter_of_every_stream_in_order_is_the_loaded_state(idx):
    """Every stream replaced in order (a chain resuming all its streams) takes the loaded
    state as it is; in another order, or some streams, each goes where ``idx`` says."""
    base = ragged([3, 0, 2], 0.0)
    loaded = ragged([1, 4, 2][: len(idx)], 0.5)
    got = base.scatter(np.array(idx), loaded)
    for j, s in enumerate(idx):
        assert got.vector(s).tolist() == loaded.vector(j).tolist()
        assert got.log10m[s] == loaded.log10m[j]
    for s in set(range(3)) - set(idx):
        assert got.vector(s).tolist() == base.vector(s).tolist()


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


# -- regressions of the hardening issue: the calibrator objects validated nothing -------------
def _cal():
    from calpipe.calibrators import make_calibrator

    return make_calibrator("composite-jumper")


def test_run_refuses_labels_of_another_length_than_the_scores():
    # 3 labels for 1,000 scores read out of bounds (garbage; a segfault at 5e7)
    from calpipe.errors import InputError

    with pytest.raises(InputError, match=r"column 'labels': labels must be \(n,\) with n = 1000"):
        _cal().run(np.full(1000, 0.3), np.array([1, 0, 1]))


@pytest.mark.parametrize(
    ("label", "rule"),
    [(2, "label 2 outside the classes 0..1"), (-5, "label -5 outside"),
     (0.5, "label 0.5 is not an integer")],
)  # fmt: skip
def test_run_refuses_a_label_outside_the_classes(label, rule):
    from calpipe.errors import InputError

    with pytest.raises(InputError, match=rf"column 'labels', row 1: {rule}"):
        _cal().run(np.array([0.2, 0.3, 0.4]), np.array([1, label, 0]))


@pytest.mark.parametrize(
    ("score", "rule"),
    [(np.nan, "NaN or infinite"), (np.inf, "NaN or infinite"), (1.5, r"outside \[0, 1\]")],
)
def test_run_refuses_a_score_that_is_no_probability(score, rule):
    # a NaN score poisoned every later output
    from calpipe.errors import InputError

    with pytest.raises(InputError, match=rf"column 'scores', row 2: score (is )?{rule}"):
        _cal().run(np.array([0.2, 0.3, score]), np.array([1, 0, 0]))


def test_run_refuses_multiclass_scores_that_do_not_sum_to_one():
    from calpipe.errors import InputError

    with pytest.raises(InputError, match=r"row 1: scores do not sum to 1"):
        _cal().run(np.array([[0.5, 0.5], [0.5, 0.6]]), np.array([0, 1]))


@pytest.mark.parametrize(("value", "rule"), [(np.nan, "must be finite"), (-0.1, "must be >= 0")])
def test_run_refuses_a_state_with_a_nan_or_negative_weight(value, rule):
    import dataclasses

    from calpipe.errors import StateError

    cal = _cal()
    _, state = cal.run(np.array([0.2, 0.7]), np.array([0, 1]))
    bad = dataclasses.replace(state, weights=[value, *state.weights[1:]])
    with pytest.raises(StateError, match=rule):
        cal.run(np.array([0.4]), np.array([1]), state=bad)
    zero = dataclasses.replace(state, weights=[0.0] * len(state.weights))
    with pytest.raises(StateError, match="sum to 1"):
        cal.run(np.array([0.4]), np.array([1]), state=zero)


def test_protect_with_state_refuses_a_stored_nan_weight():
    import calpipe
    from calpipe.errors import StateError

    df = pl.DataFrame({"event_id": [1, 2, 3], "score": [0.2, 0.6, 0.4], "label": [0, 1, 1]})
    first = calpipe.protect_with_state(df, order_by="event_id", method="composite-experts")
    w = first.state["weights"].to_list()[0]
    w[5] = float("nan")
    bad = first.state.with_columns(pl.Series("weights", [w]))
    later = df.with_columns(pl.col("event_id") + 3)
    with pytest.raises(StateError, match="holds nan at position 5"):
        calpipe.protect_with_state(later, order_by="event_id", method="composite-experts",
                                   state=bad)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "not JSON text"),
        ("[1]", "a JSON object is needed, got list"),
        ('{"method": 1}', "missing fields ['config_fingerprint', 'n_classes']"),
        ('{"method": "a", "config_fingerprint": "b", "n_classes": 2, "x": 1}', "unknown fields ['x']"),
        ('{"method": "a", "config_fingerprint": "b", "n_classes": "2"}', "'n_classes' must be an integer >= 0"),
        ('{"method": "a", "config_fingerprint": "b", "n_classes": 2, "weights": [1, "a"]}', "'weights' must be a list of finite numbers"),
        ('{"method": "a", "config_fingerprint": "b", "n_classes": 2, "log10_martingale": NaN}', "'log10_martingale' must be a finite number"),
    ],
)  # fmt: skip
def test_malformed_stream_state_json_gave_index_or_type_error(text, words):
    from calpipe.errors import StateError

    with pytest.raises(StateError) as e:
        StreamState.from_json(text)
    assert words in str(e.value)


@pytest.mark.parametrize("method", ["ops", "venn-predictor", "platt"])
def test_k_class_label_out_of_range_on_a_forecast_op_gave_index_error(method):
    # likelihood_gale indexed every op's K-class row with its label: a forecast op's label is
    # never read (7 here), so it must not be used; on an update op it is the InputError
    from calpipe.calibrators import make_calibrator
    from calpipe.errors import InputError

    cal = make_calibrator(method)
    x = np.full((3, 3), 1 / 3)
    st0 = cal.initial_state(1, 3)
    args = (np.arange(3), np.array([0, 1, 0], np.int8), np.array([0, 3]), st0)
    out, _ = cal.run_batch(x, np.array([0, 7, 1]), *args)
    ref, _ = cal.run_batch(x, np.array([0, 0, 1]), *args)
    assert np.array_equal(out.protected, ref.protected)
    assert np.array_equal(out.log10_martingale, ref.log10_martingale, equal_nan=True)
    with pytest.raises(InputError, match="row 2: label 7 of a learnt event"):
        cal.run_batch(x, np.array([0, 0, 7]), *args)


@pytest.mark.parametrize("method", ["ops", "venn-predictor", "composite-experts", "platt"])
@pytest.mark.parametrize("fault", ["short", "offsets"])
def test_run_batch_with_a_flat_state_of_wrong_lengths_gave_raw_numpy_errors(method, fault):
    # a FlatState given to run_batch whose vectors miss the method's layout reached the
    # kernels' reshape / ragged_take: raw ValueErrors; now a StateError naming stream 1
    from calpipe.calibrators import make_calibrator
    from calpipe.errors import StateError

    cal = make_calibrator(method)
    st = cal.initial_state(2, 2)
    if fault == "short":  # stream 1 one value short
        bad = FlatState(st.values[:-1], np.append(st.offsets[:-1], st.offsets[-1] - 1), st.log10m)
    else:  # offsets past the values
        bad = FlatState(st.values, st.offsets + 1, st.log10m)
    with pytest.raises(StateError, match=f"method '{method}': state vector 1 ") as exc:
        cal.run_batch(np.array([0.2, 0.7]), np.array([0, 1]), np.arange(2),
                      np.zeros(2, np.int8), np.array([0, 1, 2]), bad)  # fmt: skip
    assert exc.value.stream == 1
