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

The caller (:func:`calpipe.frame.protect`, or :meth:`calpipe.calibrators.base.Calibrator.run` for
one stream) builds the list from the replay order: an event whose label is known at its own
time is an ``OP_STEP``; with ``label_time`` an event is an ``OP_FORECAST`` and its label an
``OP_UPDATE`` placed at the label's time. Prequential by construction: a forecast only sees the
updates before it in its stream's segment. The kernels using it: :mod:`calpipe.kernels.mixture`,
:mod:`calpipe.kernels.brier_compat`, :mod:`calpipe.kernels.venn` (online Venn predictor),
:mod:`calpipe.kernels.calibrated_regression`, and the window driver of the batch calibrators.
"""

from __future__ import annotations

#: Forecast the event, then learn its label at once (the usual online step).
OP_STEP = 0
#: Forecast only (the label is unknown, or arrives later as an OP_UPDATE).
OP_FORECAST = 1
#: Learn the label of an event forecast earlier (delayed feedback, at its label_time).
OP_UPDATE = 2
