"""The label feed's engine step: labels of already processed events added to a state's pending lists.

A nightly chain learns labels days after their events (docs/ARCHITECTURE.md §4): the night
adds them to each stream's pending labels with :func:`arrive_labels`, and the next
:func:`calpipe.protect_with_state` call applies each at its ``label_time``
(:mod:`calpipe.engine.operations`), so the chain equals one pass over the events carrying
their labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from calpipe.calibrators.base import list_series
from calpipe.engine.contract import TIME_US, Rule, check_rules
from calpipe.engine.ordering import group_order
from calpipe.errors import InputError
from calpipe.kernels import ops


def arrive_labels(
    state: pl.DataFrame,
    labels: pl.DataFrame,
    *,
    by: str | Sequence[str] = "stream",
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    score: str = "score",
    label: str = "label",
    label_time: str = "label_time",
) -> pl.DataFrame:
    """The state with labels of already processed events added to its pending lists: the label
    feed of a nightly chain (labels that arrive days after their events).

    ``labels`` has the stream keys ``by``, the event's order keys ``order_by`` (to order equal
    label times as one pass does: by event), its raw base ``score`` (Float64, or a list of K
    floats), its ``label`` and ``label_time``. The next :func:`protect_with_state` call applies
    each label at its ``label_time`` as an update, before the stream's events after it and after
    those at or before it (pending updates, docs/ARCHITECTURE.md §4), so that a chain fed this
    way equals one pass over the events carrying their labels and label times::

        one pass:  forecast(e_i) at t_i;  update(e_i, y_i) at s_i        (s_i >= t_i)
        chain:     night d forecasts its events; labels with s_i on day d arrive on night d

    Labels already pending come first on equal label times (in a nightly chain they are of an
    earlier day). Raises StateError for a stream without state (its events were never
    processed) or a label time before the stream's last processed event (that event was
    forecast without it: the label arrived too late to replay as one pass).

    >>> import calpipe, datetime as dt, polars as pl
    >>> t = [dt.datetime(2024, 1, 1, h) for h in (1, 2, 3)]
    >>> ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": t, "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [None, None, None]},
    ...                   schema_overrides={"label": pl.Int64})
    >>> st = calpipe.protect_with_state(ev).state
    >>> late = pl.DataFrame({"stream": ["a"], "event_time": [t[0]], "event_id": [1],
    ...                      "score": [0.2], "label": [0],
    ...                      "label_time": [dt.datetime(2024, 1, 2)]})
    >>> arrive_labels(st, late)["pending_labels"].to_list()
    [[0]]
    """
    by_t = (by,) if isinstance(by, str) else tuple(by)
    order_t = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    for c in (*by_t, *order_t, score, label, label_time):
        if c not in labels.columns:
            raise InputError(c, None, f"missing column (the labels have {labels.columns})")
    if labels.height == 0:
        return state
    keyed = state.select(*by_t, f"last_{order_t[0]}").with_row_index("__sid")
    j = labels.join(keyed, on=list(by_t), how="left", nulls_equal=True, maintain_order="left")
    check_rules(j, [
        Rule(by_t[0], "label of a stream without state (its events were never processed)",
             pl.col("__sid").is_null(), pl.struct(list(by_t))),
        Rule(label, "null label", pl.col(label).is_null()),
        Rule(label_time, "label_time before the stream's last processed event (it was forecast "
             "without this label: the label arrived too late)",
             pl.col(label_time).cast(TIME_US) < pl.col(f"last_{order_t[0]}").cast(TIME_US)),
    ])  # fmt: skip
    width = 1 if j.schema[score].is_numeric() else int(j[score].list.len().max())
    # The updates of each stream in apply order, by (label time, then pending before new, then
    # new ones by event): the new labels in their events' order within each stream (numpy
    # sorts: polars' rank of the (event_time, event_id) struct and its 4-key sort took 1 s of a
    # 2M-label night), then one pass puts each stream's pending labels and its new ones in
    # time order, stably (numpy concatenations, gathers and a counting sort took 1.2 s of a
    # 10M-label night)
    new_sid = j["__sid"].cast(pl.Int64).to_numpy()
    seq = group_order(new_sid, state.height, j, order_t)
    new_sc = j[score].cast(pl.Float64) if width == 1 else j[score].cast(pl.Array(pl.Float64, width))
    t, y, sc, offsets = ops.pending_in_apply_order(
        state["pending_labels"].list.len().fill_null(0).to_numpy(),
        state["pending_label_time"].explode().drop_nulls().cast(TIME_US).to_physical().to_numpy(),
        state["pending_labels"].explode().drop_nulls().to_numpy(),
        state["pending_scores"].explode().drop_nulls().to_numpy(),
        new_sid,
        seq,
        j[label_time].cast(TIME_US).to_physical().to_numpy(),
        j[label].cast(pl.Int64).to_numpy(),
        new_sc.to_numpy().reshape(-1, width) if width > 1 else new_sc.to_numpy(),
    )
    return state.with_columns(
        list_series(t, offsets, pl.Int64).cast(pl.List(TIME_US)).alias("pending_label_time"),
        list_series(np.ascontiguousarray(sc).ravel(), offsets * width, pl.Float64)
        .alias("pending_scores"),
        list_series(y, offsets, pl.Int64).alias("pending_labels"),
    )  # fmt: skip
