"""What a calibrator is given, checked before any kernel (calpipe/calibrators/inputs.py): each
case of issue 36 items 8, 12 and 16 by what broke, with the message it now gives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calpipe.calibrators import StreamState, make_calibrator
from calpipe.errors import InputError, StateError

P = np.array([0.2, 0.5, 0.7])
Y = np.array([0, 1, 1])
EV = np.arange(3)
KIND = np.zeros(3, np.int8)
OFF = np.array([0, 3])
FAST = ("composite-jumper", "composite-experts", "jumper", "venn-abers")


def _run_batch(method, scores=P, labels=Y, op_event=EV, op_kind=KIND, op_offsets=OFF, streams=1):
    cal = make_calibrator(method)
    st = cal.initial_state(streams, 2)
    return cal.run_batch(scores, labels, op_event, op_kind, op_offsets, st)


def _refused(column, row, *words, **kw):
    for method in FAST:
        with pytest.raises(InputError) as e:
            _run_batch(method, **kw)
        assert (e.value.column, e.value.row) == (column, row), (method, str(e.value))
        for w in words:
            assert w in str(e.value), (method, str(e.value))


@pytest.mark.parametrize("label", [5, -7])
def test_run_batch_with_a_label_outside_the_classes_produced_output(label):
    _refused("labels", 1, f"label {label}", "classes 0..1", labels=np.array([0, label, 1]))


def test_run_batch_ignores_labels_of_events_only_forecast():
    # labels are read at updates only: a -1 where nothing learns it is no error
    out, _ = _run_batch("composite-jumper", labels=np.array([0, -1, 1]),
                        op_kind=np.array([0, 1, 0], np.int8))  # fmt: skip
    assert np.isfinite(out.protected).all()


def test_run_batch_with_op_kind_7_produced_output():
    _refused("op_kind", 1, "kind 7", "OP_UPDATE (2)", op_kind=np.array([0, 7, 0], np.int8))


@pytest.mark.parametrize(("event", "row"), [(-1, 1), (10**9, 2)])
def test_run_batch_with_an_op_event_outside_the_events_gave_nan_or_segfaulted(event, row):
    op_event = np.array([0, 1, 2])
    op_event[row] = event
    _refused("op_event", row, f"event {event}", "outside the events 0..2", op_event=op_event)


def test_run_batch_with_op_offsets_past_the_operations_segfaulted():
    _refused("op_offsets", None, "from 0 to the number of operations (3)",
             op_offsets=np.array([0, 10**9]))  # fmt: skip


def test_run_batch_with_more_offsets_than_the_state_has_streams_segfaulted():
    _refused("op_offsets", None, "3 offsets for a state of 1 stream(s)",
             op_offsets=np.array([0, 1, 3]))  # fmt: skip


def test_run_batch_with_decreasing_offsets_is_refused():
    _refused("op_offsets", 2, "never decrease", op_offsets=np.array([0, 2, 1, 3]), streams=3)


def test_run_batch_with_two_class_vectors_gave_garbage():
    _refused("scores", None, "K = 2 vectors are the binary p1", scores=np.c_[1 - P, P])


def test_run_batch_with_a_score_that_is_not_a_probability():
    _refused("scores", 1, "not a probability", scores=np.array([0.2, np.nan, 0.7]))


def test_serving_map_of_a_score_of_1_7_returned_0_999():
    for method in FAST:
        cal = make_calibrator(method)
        with pytest.raises(InputError, match=r"serving score 1.7 at position 1 of stream row 0"):
            cal.serving_map(cal.initial_state(1, 2), np.array([[0.3, 1.7]]))
        with pytest.raises(InputError, match=r"S = 1 \(the state's streams\)"):
            cal.serving_map(cal.initial_state(1, 2), np.array([[0.3], [0.4]]))


def test_a_uint64_label_of_2_64_minus_1_was_unknown_in_run():
    cal = make_calibrator("composite-jumper")
    labels = np.array([0, 2**64 - 1, 1], dtype=np.uint64)
    with pytest.raises(InputError, match=r"row 1: label 18446744073709551615 outside"):
        cal.run(P, labels)


@pytest.mark.parametrize("scores", [["0.2", "x"], np.array(["a", "b"])])
def test_run_with_string_scores_gave_numpy_s_value_error(scores):
    with pytest.raises(InputError) as e:
        make_calibrator("composite-jumper").run(scores, [0, 1])
    assert e.value.column == "scores" and "must be numbers" in str(e.value)


@pytest.mark.parametrize("weight", [1e308, 1e-320])
def test_state_weights_of_1e308_or_1e_320_yielded_inf_or_nan(weight):
    for method in ("composite-jumper", "jumper", "mean-jumper", "composite-experts"):
        cal = make_calibrator(method)
        _, st = cal.run(P, Y)
        data = json.loads(st.to_json())
        data["weights"] = [weight] * len(data["weights"])
        with pytest.raises(StateError, match=r"must be >= 0 and sum to 1"):
            cal.run(P, Y, state=StreamState.from_json(json.dumps(data)))


def test_run_batch_accepted_k_class_rows_that_do_not_sum_to_1():
    # run() refused them (check_arrays); run_batch ran them: a forecast of no distribution
    x = np.array([[0.2, 0.3, 0.5], [0.5, 0.5, 0.5], [0.1, 0.1, 0.8]])
    _refused("scores", 1, "sums to 1.5, not 1", "tolerance 1e-06", scores=x)
    ok = x.copy()
    ok[1] = [0.5, 0.5, 1e-7]  # within the tolerance: accepted as it is
    for method in ("ops", "composite-experts"):
        cal = make_calibrator(method)
        out, _ = cal.run_batch(ok, Y, EV, KIND, OFF, cal.initial_state(1, 3))
        assert np.isfinite(out.protected).all()
