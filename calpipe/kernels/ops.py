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
``OP_UPDATE`` placed at the label's time. Prequential by construction: a forecast only sees the
updates before it in its stream's segment. The kernels using it: :mod:`calpipe.kernels.mixture`,
:mod:`calpipe.kernels.brier_compat`, :mod:`calpipe.kernels.venn` (online Venn predictor),
:mod:`calpipe.kernels.calibrated_regression`, and the window driver of the batch calibrators.
"""

from __future__ import annotations

import numpy as np

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
