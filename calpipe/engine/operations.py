"""The operation list of a batch with delayed labels: forecasts at their events, updates at their label times.

Builds, from a batch's events in replay order and the labels pending in the state, the
operation list every recursive kernel runs (:mod:`calpipe.kernels.ops`: step / forecast /
delayed update, grouped by stream with offsets), and the labels that stay pending for the next
batch (docs/ARCHITECTURE.md §4, "The operation list"). Without delayed labels the list is the
replay order itself (:mod:`calpipe.engine.driver`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from calpipe.calibrators.base import list_series
from calpipe.engine.contract import TIME_US
from calpipe.errors import StateError
from calpipe.kernels import ops


def delayed_ops(cal, cols, sorted_df, counts, base, labels, labelled, prev, n_classes):
    """Operation list with labels applied at their ``label_time`` (delayed feedback).

    Forecast of event i at its time; update of event i at its label_time; at equal times forecasts
    come first (a label is seen only by events strictly after it). A labelled event without a
    label time (null, or no ``label_time`` column: a label known at its event) is updated right
    after its own forecast, before the stream's next event even at an equal time, as without
    ``label_time``. Timed updates at or after the batch's last event time of the stream (its
    horizon) are deferred to the state's pending list, so that k chunks equal one pass (an
    update known at its event is never deferred: applied at once it keeps one pass's order, as
    every later operation of its stream comes after it). Pending updates of earlier batches
    enter as extra pseudo-events; they keep the raw score (``base``), which the calibrator
    prepares (clips) again on replay.

    Sort key of an operation: (stream, time, phase, seq) with the events (phase 0, seq = event:
    a forecast, or a step = forecast + update for a label known at its event) before the timed
    updates at their time (phase 1, seq = event, or the pending position < 0: pending first):
    built stream by stream in one pass by :func:`calpipe.kernels.ops.delayed_op_list` (the
    lexsort of those four keys, and then a merge of the sorted updates into the events, took
    1.3 s and then 0.8 s of a 2M-event, 2M-label part).
    """
    n = sorted_df.height
    te = sorted_df[cols.order_by[0]].cast(TIME_US).to_physical().to_numpy().astype(np.int64)
    if cols.label_time is None:
        timed = np.zeros(n, dtype=bool)
        tl = np.zeros(n, dtype=np.int64)
    else:
        lt = sorted_df[cols.label_time].cast(TIME_US)
        timed = lt.is_not_null().to_numpy()
        tl = lt.to_physical().fill_null(0).to_numpy().astype(np.int64)

    # Pending updates from the state, flattened.
    plen = prev["pending_labels"].list.len().to_numpy().astype(np.int64)
    m = int(plen.sum())
    p_tl = prev["pending_label_time"].explode().drop_nulls().cast(TIME_US).to_physical().to_numpy()
    p_lab = prev["pending_labels"].explode().drop_nulls().to_numpy().astype(np.int64)
    width = 1 if base.ndim == 1 else n_classes
    p_sc = prev["pending_scores"].explode().drop_nulls().to_numpy().astype(np.float64)
    if p_sc.shape[0] != m * width:
        raise StateError("pending_scores does not hold one score vector per pending label")
    p_sc = p_sc if width == 1 else p_sc.reshape(m, width)
    p_tl = p_tl.astype(np.int64)

    op_event, op_kind, op_offsets, applied, d_ev, d_t, d_offsets = ops.delayed_op_list(
        counts, te, labelled & timed, tl, labelled & ~timed, plen, p_tl
    )
    raw_scores = np.concatenate([base, p_sc])
    ext_scores = cal.prepare_scores(raw_scores)
    ext_labels = np.concatenate([labels, p_lab])
    # Deferred updates become the new pending lists (in apply order).
    pending = pl.DataFrame(
        [
            list_series(d_t, d_offsets, pl.Int64)
            .cast(pl.List(TIME_US))
            .alias("pending_label_time"),
            list_series(raw_scores[d_ev].ravel(), d_offsets * width, pl.Float64).alias(
                "pending_scores"
            ),
            list_series(ext_labels[d_ev], d_offsets, pl.Int64).alias("pending_labels"),
        ]
    )
    return op_event, op_kind, op_offsets, ext_scores, ext_labels, applied, pending
