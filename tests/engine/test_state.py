"""calpipe.engine.state: a stored state row's carried columns are checked on load
(check_carried, through join_state), naming the stream, the column and the rule."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

import calpipe
from calpipe.errors import StateError


def _frame(times, ids, streams, scores, labels, label_times):
    return pl.DataFrame({
        "stream": streams, "event_time": times, "event_id": ids, "score": scores,
        "label": labels, "label_time": label_times,
    }).with_columns(pl.from_epoch("event_time"), pl.from_epoch("label_time"))  # fmt: skip


FIRST = _frame([1, 2, 3], [1, 2, 3], ["a", "a", "b"], [0.2, 0.7, 0.4], [0, 1, 1], [5, 100, 6])
LATER = _frame([10, 11], [4, 5], ["a", "b"], [0.5, 0.5], [1, 0], [12, 13])
KW = {"by": "stream", "label_time": "label_time", "method": "ops"}


def _state():
    st = calpipe.protect_with_state(FIRST, **KW).state
    assert st.filter(pl.col("stream") == "a")["pending_labels"].to_list() == [[0, 1]]
    return st


def _with(state, column, value):
    dtype = state.schema[column]
    new = pl.when(pl.col("stream") == "a").then(pl.lit(value, dtype)).otherwise(pl.col(column))
    return state.with_columns(new.alias(column))


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        # a raw broadcast error from the operation list
        ("pending_label_time", [None, dt.datetime(1970, 1, 1, 0, 1, 40)], "a label time is null"),
        # clipped silently
        ("pending_scores", [7.0, 0.7], "a score is null, NaN or outside [0, 1]"),
        ("pending_scores", [float("nan"), 0.7], "a score is null, NaN or outside [0, 1]"),
        # an InputError naming event row 5, which the frame does not have
        ("pending_labels", [5, 1], "a label is null or outside the classes 0..1"),
        ("pending_label_time", [dt.datetime(1970, 1, 1, 0, 0, 5)], "one label time per pending"),
        ("pending_scores", [0.2], "one score per pending label"),
        ("log10_martingale_max", float("nan"), "must be a finite number"),  # accepted
    ],
)
def test_pending_lists_and_the_martingale_peak_of_a_state_row_are_checked(column, value, rule):
    with pytest.raises(StateError) as exc:
        calpipe.protect_with_state(LATER, **KW, state=_with(_state(), column, value))
    assert f"state row of stream='a': column {column!r}: {rule}" in str(exc.value)


def test_valid_pending_lists_still_resume():
    st = _state()
    got = calpipe.protect_with_state(LATER, **KW, state=st)
    assert got.scores["protected_score"].is_not_null().all()
