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
from calpipe.kernels import grouping as G
from calpipe.kernels import ops


def merge_updates(sid, te, a_sid, a_t, a_seq) -> np.ndarray:
    """The order of the operations ``[events..., updates...]`` by (stream, time, phase, seq):
    events (phase 0, seq = position) before the updates at their time (phase 1, seq ``a_seq``).

    The events come sorted by (stream, time) already, so only the updates are sorted (by
    (stream, time), stably after ordering them by seq: a counting sort by stream, then each
    stream's times, :func:`calpipe.kernels.grouping.group_key_order`) and merged in one linear
    pass by the key packing stream and time into one int64
    (:func:`calpipe.kernels.grouping.merge_after`): O(n_a + n) expected instead of a 4-key
    lexsort of all operations (1.3 s of a 2M-event, 2M-label night; a binary search and
    boolean masks took 0.35 s; a stable argsort of the packed keys 1 s of a 10M-label night).
    Falls back to the lexsort when the events
    are not sorted or the packed key would overflow."""
    sid, a_sid = sid.astype(np.int64, copy=False), a_sid.astype(np.int64, copy=False)
    n, n_a = sid.shape[0], a_sid.shape[0]
    t_min = int(min(te.min(initial=0), a_t.min(initial=0)))  # Python ints: no overflow here
    span = int(max(te.max(initial=0), a_t.max(initial=0))) - t_min + 1
    n_streams = int(max(sid.max(initial=0), a_sid.max(initial=0))) + 1
    if n_streams * span <= np.iinfo(np.int64).max:
        ek = sid * span + (te - t_min)
        if n < 2 or bool(np.all(ek[1:] >= ek[:-1])):
            by_seq = np.argsort(a_seq, kind="stable")  # (linear on sorted input: pending ones)
            s_seq, t_seq = a_sid[by_seq], a_t[by_seq]
            uk = s_seq * span + (t_seq - t_min)
            # the stable order by uk is the stable order by (stream, time), which a counting
            # sort by stream and a bucket sort of each stream's times give in O(n_a) expected
            # (np.argsort(uk, kind="stable") was 1 s of a 10M-label night)
            by_key = G.group_key_order(s_seq, n_streams, t_seq)
            return G.merge_after(ek, uk[by_key], by_seq[by_key])
    op_sid = np.concatenate([sid, a_sid])
    op_t = np.concatenate([te, a_t])
    op_phase = np.concatenate([np.zeros(n, np.int64), np.ones(n_a, np.int64)])
    op_seq = np.concatenate([np.arange(n, dtype=np.int64), a_seq])
    return np.lexsort((op_seq, op_phase, op_t, op_sid))


def delayed_ops(cal, cols, sorted_df, sid, counts, base, labels, labelled, prev, n_classes):
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
    updates at their time (phase 1, seq = event, or the pending position < 0: pending first).
    """
    n = sorted_df.height
    n_streams = counts.shape[0]
    te = sorted_df[cols.order_by[0]].cast(TIME_US).to_physical().to_numpy().astype(np.int64)
    if cols.label_time is None:
        timed = np.zeros(n, dtype=bool)
        tl = np.zeros(n, dtype=np.int64)
    else:
        lt = sorted_df[cols.label_time].cast(TIME_US)
        timed = lt.is_not_null().to_numpy()
        tl = lt.to_physical().fill_null(0).to_numpy().astype(np.int64)
    ends = np.cumsum(counts) - 1
    horizon = te[ends]

    # Pending updates from the state, flattened.
    plen = prev["pending_labels"].list.len().to_numpy().astype(np.int64)
    m = int(plen.sum())
    p_sid = np.repeat(np.arange(n_streams, dtype=np.int64), plen)
    p_tl = prev["pending_label_time"].explode().drop_nulls().cast(TIME_US).to_physical().to_numpy()
    p_lab = prev["pending_labels"].explode().drop_nulls().to_numpy().astype(np.int64)
    width = 1 if base.ndim == 1 else n_classes
    p_sc = prev["pending_scores"].explode().drop_nulls().to_numpy().astype(np.float64)
    if p_sc.shape[0] != m * width:
        raise StateError("pending_scores does not hold one score vector per pending label")
    p_sc = p_sc if width == 1 else p_sc.reshape(m, width)
    p_tl = p_tl.astype(np.int64)

    lab_idx = np.flatnonzero(labelled & timed)
    now_idx = np.flatnonzero(labelled & ~timed)  # known at their event
    u_sid = np.concatenate([sid[lab_idx], p_sid])
    u_t = np.concatenate([tl[lab_idx], p_tl])
    u_seq = np.concatenate([lab_idx, np.arange(m, dtype=np.int64) - m])  # pending first on ties
    u_ev = np.concatenate([lab_idx, n + np.arange(m, dtype=np.int64)])
    apply_now = u_t < horizon[u_sid]

    a_sid, a_t, a_seq, a_ev = (x[apply_now] for x in (u_sid, u_t, u_seq, u_ev))
    n_a = a_sid.shape[0]
    op_sid = np.concatenate([sid, a_sid])
    op_ev = np.concatenate([np.arange(n, dtype=np.int64), a_ev])
    order = merge_updates(sid, te, a_sid, a_t, a_seq)
    op_event = np.ascontiguousarray(op_ev[order])
    # an event whose label is known at it is one step (forecast, then its update), as without
    # label_time: its row's martingale is then the one after its own label
    kind = np.full(n + n_a, ops.OP_UPDATE, dtype=np.int8)
    kind[:n] = ops.OP_FORECAST
    kind[now_idx] = ops.OP_STEP
    op_kind = np.ascontiguousarray(kind[order])
    op_offsets = np.concatenate([[0], np.cumsum(np.bincount(op_sid, minlength=n_streams))]).astype(
        np.int64
    )

    raw_scores = np.concatenate([base, p_sc])
    ext_scores = cal.prepare_scores(raw_scores)
    ext_labels = np.concatenate([labels, p_lab])
    applied = np.bincount(np.concatenate([a_sid, sid[now_idx]]), minlength=n_streams)
    applied = applied.astype(np.int64)

    # Deferred updates become the new pending lists (in apply order).
    d = ~apply_now
    d_sid, d_t, d_seq, d_ev = u_sid[d], u_t[d], u_seq[d], u_ev[d]
    o = np.lexsort((d_seq, d_t, d_sid))
    d_sid, d_t, d_ev = d_sid[o], d_t[o], d_ev[o]
    d_scores = raw_scores[d_ev]
    d_offsets = np.concatenate([[0], np.cumsum(np.bincount(d_sid, minlength=n_streams))])
    pending = pl.DataFrame(
        [
            list_series(d_t, d_offsets, pl.Int64)
            .cast(pl.List(TIME_US))
            .alias("pending_label_time"),
            list_series(d_scores.ravel(), d_offsets * width, pl.Float64).alias("pending_scores"),
            list_series(ext_labels[d_ev], d_offsets, pl.Int64).alias("pending_labels"),
        ]
    )
    return op_event, op_kind, op_offsets, ext_scores, ext_labels, applied, pending
