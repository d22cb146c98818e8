"""The operation list: how every recursive kernel receives the events of a batch.

Every kernel is a pure function over contiguous arrays: scores, labels, an *operation list* and
the per-stream state go in; forecasts, running log10 martingales and the new state come out. The
inputs are never written. All streams of a batch are handled in one call: the operations are
grouped by stream, ``op_offsets[s]:op_offsets[s + 1]`` being stream ``s``'s operations in replay
order.

Operations
----------
Each operation names an event ``e`` (an index into the event arrays) and a kind:

* ``OP_STEP`` (0): forecast event e, then learn its label right away (the usual online step);
* ``OP_FORECAST`` (1): forecast only (label unknown, or known later);
* ``OP_UPDATE`` (2): learn the label of event e (delayed feedback: at its ``label_time``).

A forecast is the mixture after the jump-mixing step of the next update, computed without
committing it: so an unlabelled event sees exactly the serving map of the current state, and a
run of ``OP_FORECAST`` then ``OP_UPDATE`` on one event equals one ``OP_STEP``.

The caller (:func:`calpipe.engine.driver.protect`, or :meth:`calpipe.calibrators.base.Calibrator.run` for
one stream) builds the list from the replay order: an event whose label is known at its own
time is an ``OP_STEP``; with ``label_time`` an event is an ``OP_FORECAST`` and its label an
``OP_UPDATE`` placed at the label's time (:func:`delayed_op_list`, which also leaves the labels
due after the batch pending; :func:`pending_in_apply_order` adds a label feed's labels to those
lists in the order they apply). Prequential by construction: a forecast only sees the
updates before it in its stream's segment. The kernels using it: :mod:`calpipe.kernels.mixture`,
:mod:`calpipe.kernels.brier_compat`, :mod:`calpipe.kernels.venn` (online Venn predictor),
:mod:`calpipe.kernels.calibrated_regression`, and the window driver of the batch calibrators.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from calpipe.kernels.grouping import stable_key_order_kernel

#: Forecast the event, then learn its label at once (the usual online step).
OP_STEP = 0
#: Forecast only (the label is unknown, or arrives later as an OP_UPDATE).
OP_FORECAST = 1
#: Learn the label of an event forecast earlier (delayed feedback, at its label_time).
OP_UPDATE = 2


def with_forecast_copies(op_event, op_kind, op_offsets, n_events):
    """The operation list with a forecast op on a copy of the event before each update-only op.

    A method whose forecast depends on a state that moves (an online model) makes, for a label
    that arrives later (``OP_UPDATE``), a forecast *at that time*: the likelihood ratio of its
    test martingale, and a mixture's Bayes step, need it. Copy i (event ``n_events + i``) is the
    event of the i-th update-only op, forecast just before that op; the op itself is kept.

    Returns ``(ext_event, ext_kind, ext_offsets, src, pos, upd_only)``: the extended list,
    ``src`` (the original event of each extended event: events 0..n-1, then the copies), ``pos``
    (the position of each original op in the extended list) and ``upd_only`` (which original
    ops are update-only). Plain numpy over the whole batch, no loop per stream.

    >>> import numpy as np
    >>> ev, kind, off, src, pos, upd = with_forecast_copies(
    ...     np.array([0, 1, 0]), np.array([OP_FORECAST, OP_STEP, OP_UPDATE]), np.array([0, 3]), 2)
    >>> ev.tolist(), kind.tolist(), off.tolist(), src.tolist()
    ([0, 1, 2, 0], [1, 0, 1, 2], [0, 4], [0, 1, 0])
    """
    upd_only = op_kind == OP_UPDATE
    slots = 1 + upd_only.astype(np.int64)
    pos = np.cumsum(slots) - 1
    ext_event = np.empty(int(pos[-1]) + 1 if pos.size else 0, dtype=np.int64)
    ext_kind = np.empty_like(ext_event, dtype=np.int8)
    ext_event[pos] = op_event
    ext_kind[pos] = op_kind
    ext_event[pos[upd_only] - 1] = n_events + np.arange(int(upd_only.sum()), dtype=np.int64)
    ext_kind[pos[upd_only] - 1] = OP_FORECAST
    ext_offsets = np.concatenate([[0], np.cumsum(slots)])[op_offsets]
    src = np.concatenate([np.arange(n_events), op_event[upd_only]])
    return ext_event, ext_kind, ext_offsets, src, pos, upd_only


@njit(cache=True)
def _delayed_op_list(counts, te, timed, tl, step, plen, p_tl):
    """The operation list of a batch with delayed labels, stream by stream (the module's
    order): see :func:`delayed_op_list`. ``err`` is the first stream whose event times
    decrease (-1: none); the outputs are then not valid."""
    n_streams = counts.shape[0]
    n = te.shape[0]
    m = p_tl.shape[0]
    n_timed = 0
    for i in range(n):
        if timed[i]:
            n_timed += 1
    n_u = m + n_timed
    op_event = np.empty(n + n_u, np.int64)
    op_kind = np.empty(n + n_u, np.int8)
    op_offsets = np.zeros(n_streams + 1, np.int64)
    applied = np.zeros(n_streams, np.int64)
    d_ev = np.empty(n_u, np.int64)
    d_t = np.empty(n_u, np.int64)
    d_offsets = np.zeros(n_streams + 1, np.int64)
    ut = np.empty(n_u, np.int64)  # a stream's updates: times and events, pending ones first
    uev = np.empty(n_u, np.int64)
    st = np.empty(n_u, np.int64)
    sev = np.empty(n_u, np.int64)
    k_op = 0
    k_d = 0
    e0 = 0
    p0 = 0
    err = -1
    for s in range(n_streams):
        e1 = e0 + counts[s]
        p1 = p0 + plen[s]
        k = 0
        for j in range(p0, p1):  # (pending: in their apply order, before the new on ties)
            ut[k] = p_tl[j]
            uev[k] = n + j
            k += 1
        n_step = 0
        for i in range(e0, e1):
            if timed[i]:
                ut[k] = tl[i]
                uev[k] = i
                k += 1
            elif step[i]:
                n_step += 1
            if i > e0 and te[i] < te[i - 1] and err < 0:
                err = s
        idx = stable_key_order_kernel(ut[:k])  # stable by time: (time, seq) as built
        for j in range(k):
            st[j] = ut[idx[j]]
            sev[j] = uev[idx[j]]
        # the updates before the stream's last event of the batch apply now; the rest wait
        horizon = te[e1 - 1]
        n_a = 0
        while n_a < k and st[n_a] < horizon:
            n_a += 1
        i = e0
        j = 0
        while i < e1 or j < n_a:  # an update after the events at or before its time
            if j < n_a and (i == e1 or st[j] < te[i]):
                op_event[k_op] = sev[j]
                op_kind[k_op] = OP_UPDATE
                j += 1
            else:
                op_event[k_op] = i
                op_kind[k_op] = OP_STEP if step[i] else OP_FORECAST
                i += 1
            k_op += 1
        op_offsets[s + 1] = k_op
        applied[s] = n_a + n_step
        for j in range(n_a, k):
            d_ev[k_d] = sev[j]
            d_t[k_d] = st[j]
            k_d += 1
        d_offsets[s + 1] = k_d
        e0 = e1
        p0 = p1
    return (
        op_event[:k_op],
        op_kind[:k_op],
        op_offsets,
        applied,
        d_ev[:k_d],
        d_t[:k_d],
        d_offsets,
        err,
    )


def delayed_op_list(counts, te, timed, tl, step, plen, p_tl):
    """The operation list of a batch with delayed labels, and the labels left pending.

    The batch's ``n`` events come in replay order, stream by stream (``counts`` events each,
    every stream at least one), with their times ``te`` (non-decreasing within a stream).
    An event is forecast at its time (``OP_FORECAST``), or stepped (``OP_STEP``: forecast, then
    its label learnt at once) when ``step`` (a label known at its event); a ``timed`` event's
    label is learnt at its label time ``tl`` by an ``OP_UPDATE``, as is each pending label of
    the state (``plen`` per stream, times ``p_tl`` flattened stream by stream in their apply
    order, events ``n + j``). A stream's updates sort by (time, seq): pending ones first, in
    their order, then the batch's by event; each goes after the stream's events at or before
    its time (a label is seen only by events strictly after it). Updates at or after the
    stream's last event time (its horizon) are deferred: the new pending lists, in the same
    order, so that batches equal one pass.

    One linear pass over the streams (a stream's updates are sorted only if they are not in
    time order already: :func:`calpipe.kernels.grouping.stable_key_order_kernel`), the order of the 4-key lexsort of (stream, time, phase, seq) it
    replaces (``tests/kernels/test_ops.py``'s oracle).

    Returns ``(op_event, op_kind, op_offsets, applied, d_ev, d_t, d_offsets)``: the list
    (:mod:`calpipe.kernels.ops`), the labels each stream learns, and the deferred updates'
    events, times and offsets per stream.

    >>> import numpy as np
    >>> ev, kind, off, applied, d_ev, d_t, d_off = delayed_op_list(
    ...     np.array([3]), np.array([0, 5, 9]), np.array([True, False, False]),
    ...     np.array([6, 0, 0]), np.array([False, True, False]), np.array([1]), np.array([2]))
    >>> ev.tolist(), kind.tolist(), applied.tolist(), d_ev.tolist(), d_t.tolist()
    ([0, 3, 1, 0, 2], [1, 2, 0, 2, 1], [3], [], [])
    """
    c = np.ascontiguousarray
    if np.any(np.asarray(counts) < 1):  # (a stream without an event has no horizon)
        raise ValueError("delayed_op_list needs at least one event of every stream")
    out = _delayed_op_list(
        c(counts, dtype=np.int64), c(te, dtype=np.int64), c(timed, dtype=np.bool_),
        c(tl, dtype=np.int64), c(step, dtype=np.bool_), c(plen, dtype=np.int64),
        c(p_tl, dtype=np.int64),
    )  # fmt: skip
    if out[-1] >= 0:
        raise ValueError(f"stream {out[-1]}: its event times decrease (not in replay order)")
    return out[:-1]


@njit(cache=True)
def _pending_in_apply_order(n_pend, p_t, p_y, p_sc, new_sid, seq, new_t, new_y, new_sc, width):
    """See :func:`pending_in_apply_order`."""
    n_streams = n_pend.shape[0]
    n_new = np.zeros(n_streams, np.int64)
    for r in range(new_sid.shape[0]):
        n_new[new_sid[r]] += 1
    offsets = np.zeros(n_streams + 1, np.int64)
    longest = 0
    for s in range(n_streams):
        k = n_pend[s] + n_new[s]
        offsets[s + 1] = offsets[s] + k
        longest = max(longest, k)
    total = offsets[n_streams]
    t = np.empty(total, np.int64)
    y = np.empty(total, np.int64)
    sc = np.empty(total * width, np.float64)
    kt = np.empty(longest, np.int64)
    src = np.empty(longest, np.int64)  # >= 0: pending row; < 0: new row -1 - r
    p0 = 0
    a = 0
    err = -1
    for s in range(n_streams):
        k = 0
        for j in range(p0, p0 + n_pend[s]):  # pending first (earlier nights), in their order
            kt[k] = p_t[j]
            src[k] = j
            k += 1
        for q in range(a, a + n_new[s]):  # then the new ones in their events' order
            r = seq[q]
            if new_sid[r] != s and err < 0:
                err = q
            kt[k] = new_t[r]
            src[k] = -1 - r
            k += 1
        idx = stable_key_order_kernel(kt[:k])
        o = offsets[s]
        for j in range(k):
            g = src[idx[j]]
            t[o + j] = kt[idx[j]]
            if g >= 0:
                y[o + j] = p_y[g]
                for c in range(width):
                    sc[(o + j) * width + c] = p_sc[g * width + c]
            else:
                r = -1 - g
                y[o + j] = new_y[r]
                for c in range(width):
                    sc[(o + j) * width + c] = new_sc[r * width + c]
        p0 += n_pend[s]
        a += n_new[s]
    return t, y, sc, offsets, err


def pending_in_apply_order(n_pend, p_t, p_y, p_sc, new_sid, seq, new_t, new_y, new_sc):
    """Each stream's pending labels with new ones added, in the order a batch applies them.

    ``n_pend`` pending labels per stream (times ``p_t``, labels ``p_y``, score rows ``p_sc``,
    flattened stream by stream) and new labels of streams ``new_sid`` (``seq``: their rows
    grouped by stream, each stream's in its events' order; times ``new_t``, labels ``new_y``,
    scores ``new_sc``: (n,) or (n, width)). A stream's labels sort by time, stably: on equal
    times the pending ones first (an earlier night's), then the new ones by event -- the stable
    sort by (stream, time) of the pending labels followed by the new ones in ``seq`` order
    (``tests/kernels/test_ops.py``'s oracle), one pass over the streams, a stream sorted only
    if out of time order.

    Returns ``(t, y, sc, offsets)``: the lists flattened (``sc`` (total, width) as given) and
    each stream's offsets.

    >>> import numpy as np
    >>> t, y, sc, off = pending_in_apply_order(
    ...     np.array([1, 0]), np.array([5]), np.array([1]), np.array([0.5]),
    ...     np.array([0, 1, 0]), np.array([2, 0, 1]), np.array([5, 7, 3]), np.array([0, 1, 1]),
    ...     np.array([0.1, 0.2, 0.3]))
    >>> t.tolist(), y.tolist(), sc.tolist(), off.tolist()
    ([3, 5, 5, 7], [1, 1, 0, 1], [0.3, 0.5, 0.1, 0.2], [0, 3, 4])
    """
    c = np.ascontiguousarray
    width = 1 if np.ndim(new_sc) == 1 else int(np.shape(new_sc)[1])
    t, y, sc, offsets, err = _pending_in_apply_order(
        c(n_pend, dtype=np.int64), c(p_t, dtype=np.int64), c(p_y, dtype=np.int64),
        c(p_sc, dtype=np.float64).ravel(), c(new_sid, dtype=np.int64), c(seq, dtype=np.int64),
        c(new_t, dtype=np.int64), c(new_y, dtype=np.int64), c(new_sc, dtype=np.float64).ravel(),
        width,
    )  # fmt: skip
    if err >= 0:
        raise ValueError(f"seq[{err}]: the new labels are not grouped by stream in seq")
    return t, y, sc if width == 1 else sc.reshape(-1, width), offsets
