"""A span of days in one pass: :func:`protect_with_state` day after day, with each day's end state.

A nightly chain stores, for every day, the state of each stream whose state changed that day
(``calibrator_state``): the state a later night resumes from. Calling
:func:`calpipe.protect_with_state` once per day gives those states, but costs a validation, a
grouping, a state join and a state frame per day: ~10 ms of frame work a day, most of a small
day's time (the demo's 892 days). :func:`protect_by_day` gives the same rows and the same states
for a whole span of days at once:

1. validate the span and group it by stream (:func:`calpipe.contract.replay_order`) once, and
   join the carried state once (config fingerprint and order checked);
2. order the events day by day, within a day stream by stream in replay order: each day is then
   a contiguous slice of the event arrays, and each stream's events of a day a segment of it;
3. per day with events, one kernel call (:meth:`Calibrator.run_batch`) over the slice, from the
   streams' kernel state carried in memory (taken and scattered back through its flat form, the
   form a stored state row has, so that it is bit-identical to reloading the state frame);
4. build the end-of-day state rows of every (day, stream) once, with :func:`state_frame`.

A Python step per day (a handful of numpy calls and one kernel call), none per event or stream.
The equality with one :func:`protect_with_state` per day is tested bit for bit
(``tests/test_frame_days.py``). Labels known at their events only: a span with ``label_time``
or with labels pending in the state (a label feed) runs day by day instead.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from calpipe import config
from calpipe.calibrators import Calibrator, make_calibrator
from calpipe.calibrators.base import FlatState, weights_series
from calpipe.contract import Rule, check_rules, replay_order, resolve_columns, validate_frame
from calpipe.errors import InputError
from calpipe.frame import (
    _TIME_US,
    _check_input_columns,
    _check_state_schema,
    _empty_lists,
    _empty_output,
    _join_state,
    base_array,
    empty_state,
    merge_state,
    output_columns,
    state_frame,
)
from calpipe.kernels import grouping as G
from calpipe.kernels import ops


@dataclass
class DaysResult:
    """Output of :func:`protect_by_day`.

    ``scores``: the input rows (input order) with the outputs; ``states``: the end-of-day state
    row of every stream with events that day, with its ``date`` (ordered by date, then stream
    key); ``state``: the state at the end of the span (every stream of the input state and of the
    span, sorted by stream key); per day with events (``days``, in order): its events
    (``n_events``), streams with events (``n_active``) and streams in the state at its end
    (``n_streams``)."""

    scores: pl.DataFrame
    states: pl.DataFrame
    state: pl.DataFrame
    days: list[dt.date]
    n_events: np.ndarray
    n_active: np.ndarray
    n_streams: np.ndarray


def _take(cal: Calibrator, state, idx: np.ndarray, n_classes: int):
    """Streams ``idx`` of a kernel state, through its flat form (a new state: the carried one is
    not shared with the kernel call). A plain :class:`FlatState` is taken as it is: it came from
    the kernels or from a state row already validated (``state_from_flat`` would check its
    layout again, ~0.5 ms a day for the default method)."""
    values, offsets = state.flat()
    lengths = np.diff(offsets)[idx]
    new_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    take = np.repeat(offsets[idx] - new_off[:-1], lengths) + np.arange(new_off[-1], dtype=np.int64)
    values, log10m = np.ascontiguousarray(values[take]), state.log10m[idx].copy()
    if type(state) is FlatState:
        return FlatState(values, new_off, log10m)
    return cal.state_from_flat(values, new_off, log10m, n_classes)


def protect_by_day(
    frame: pl.DataFrame,
    *,
    day: str = "event_date",
    score: str | None = None,
    scores: str | None = None,
    label: str = "label",
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    method: str = config.DEFAULT_METHOD,
    state: pl.DataFrame | None = None,
    **params,
) -> DaysResult:
    r""":func:`calpipe.protect_with_state` called once per day of ``frame`` (its Date column
    ``day``), in day order, carrying the state: the same rows, the same final state, and the
    state at the end of each day of the streams with events that day.

    With :math:`s_{d}` the state of a stream at the end of day :math:`d` and :math:`E_d` its
    events of day :math:`d` in replay order,

    .. math:: (\hat p_{E_d}, s_d) = \mathrm{protect}(E_d \mid s_{d-1}),

    the recursion of the method (Jumper: paper 000 Algorithms 1-2; Composite Jumper: paper 001
    Algorithm 1) run over each day's events from the previous day's end state; a day is one kernel call.
    Each stream's events must lie in day order (an event's ``day`` is the day it is processed
    on, e.g. its ``event_time``'s date). Labels are known at their events (no ``label_time``)
    and ``state`` holds no pending labels: a label feed runs day by day.

    >>> import calpipe, datetime as dt, polars as pl
    >>> from calpipe.frame_days import protect_by_day
    >>> t = [dt.datetime(2024, 1, d, 9) for d in (1, 1, 2)]
    >>> ev = pl.DataFrame({"stream": ["a", "b", "a"], "event_time": t, "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [0, 1, 0]})
    >>> r = protect_by_day(ev.with_columns(pl.col("event_time").dt.date().alias("event_date")))
    >>> r.states.select("date", "stream", "n_events").rows()
    [(datetime.date(2024, 1, 1), 'a', 1), (datetime.date(2024, 1, 1), 'b', 1), (datetime.date(2024, 1, 2), 'a', 2)]
    """
    cal = make_calibrator(method, **params)
    cols = resolve_columns(
        frame.columns, score=score, scores=scores, label=label, label_time=None,
        by=by, order_by=order_by,
    )  # fmt: skip
    if day not in frame.columns or frame.schema[day] != pl.Date:
        raise InputError(day, None, "the day column must be a Date column")
    state0 = empty_state(frame.schema, cols) if state is None else state
    if frame.height == 0:  # days without events: nothing runs, every state is kept
        _check_state_schema(state0, cols)
        none = np.zeros(0, dtype=np.int64)
        states = state0.clear().with_columns(pl.lit(None, pl.Date).alias("date"))
        return DaysResult(_empty_output(frame, cols, cal), states, state0, [], none, none, none)
    n_classes = validate_frame(frame, cols, check_duplicates=False)
    cal.check_classes(n_classes)
    _check_input_columns(frame, cal)
    check_rules(frame, [Rule(day, "day must not be null", pl.col(day).is_null())])
    _check_state_schema(state0, cols)
    if state0.height and bool(state0["pending_labels"].list.len().sum()):
        raise InputError("pending_labels", None, "a span runs labels known at their events only")

    # 1. group by stream, replay order, the carried state of each stream
    replay = replay_order(frame, cols)
    n = frame.height
    sid_of_row, counts = replay.ids, replay.counts
    n_streams = counts.shape[0]
    rep = np.arange(n, dtype=np.int64) if replay.order is None else replay.order
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    first_rows = frame.select([*cols.by, *cols.order_by])[rep[starts]]
    streams = first_rows.select(cols.by) if cols.by else pl.DataFrame()
    bstate, prev = _join_state(cal, cols, n_classes, streams, first_rows, state0, n_streams)

    # 2. day-major order: a day is a slice, a stream's events of a day a segment of it
    code = frame[day].to_physical().cast(pl.Int64).to_numpy()
    c_rep, s_rep = code[rep], sid_of_row[rep]
    back = np.flatnonzero((s_rep[1:] == s_rep[:-1]) & (c_rep[1:] < c_rep[:-1]))
    if back.size:
        r = int(rep[back[0] + 1])
        raise InputError(day, r, "a stream's events must be in day order (replay order)")
    perm = rep[np.argsort(c_rep, kind="stable")]
    sid, dcode = sid_of_row[perm], code[perm]
    new_seg = np.ones(n, dtype=bool)
    new_seg[1:] = (sid[1:] != sid[:-1]) | (dcode[1:] != dcode[:-1])
    seg_start = np.flatnonzero(new_seg).astype(np.int64)
    seg_end = np.append(seg_start[1:], n)
    seg_sid = sid[seg_start]
    day_first = np.ones(seg_start.shape[0], dtype=bool)
    day_first[1:] = dcode[seg_start[1:]] != dcode[seg_start[:-1]]
    day_seg = np.append(np.flatnonzero(day_first), seg_start.shape[0])  # segments of each day

    base = np.ascontiguousarray(base_array(frame, cols, n_classes)[perm])
    lab = frame[cols.label]
    labelled = lab.is_not_null().to_numpy()[perm]
    labels = lab.fill_null(0).cast(pl.Int64).to_numpy()[perm]
    inputs = {
        key: frame[col].cast(pl.Int64).to_numpy()[perm] for key, col in cal.input_columns().items()
    }

    # 3. one kernel call per day, the kernel state carried between days
    n_ev = prev["n_events"].to_numpy().astype(np.int64)
    n_lab = prev["n_labelled"].to_numpy().astype(np.int64)
    peak = prev["log10_martingale_max"].to_numpy().astype(np.float64)
    protected = np.empty_like(base)
    log10m = np.empty(n)
    extra: dict[str, np.ndarray] = {}
    snap: dict[str, list[np.ndarray]] = {
        k: [] for k in ("values", "lengths", "log10m", "n_events", "n_labelled", "peak")
    }
    for j in range(day_seg.shape[0] - 1):
        s0, s1 = int(day_seg[j]), int(day_seg[j + 1])
        a, b = int(seg_start[s0]), int(seg_end[s1 - 1])
        ids = seg_sid[s0:s1]
        seg_n = seg_end[s0:s1] - seg_start[s0:s1]
        op_offsets = np.append(seg_start[s0:s1], b) - a
        day_lab = labelled[a:b]
        op_kind = np.where(day_lab, ops.OP_STEP, ops.OP_FORECAST).astype(np.int8)
        out, new = cal.run_batch(
            cal.prepare_scores(base[a:b]), np.ascontiguousarray(labels[a:b]),
            np.arange(b - a, dtype=np.int64), op_kind, op_offsets,
            _take(cal, bstate, ids, n_classes),
            {k: np.ascontiguousarray(x[a:b]) for k, x in inputs.items()},
        )  # fmt: skip
        protected[a:b] = out.protected[: b - a]
        log10m[a:b] = out.log10_martingale[: b - a]
        for name in cal.extra_outputs:
            values = out.extra[name][: b - a]
            if name not in extra:
                extra[name] = np.empty((n, *values.shape[1:]), dtype=values.dtype)
            extra[name][a:b] = values
        local = np.repeat(np.arange(ids.shape[0], dtype=np.int64), seg_n)
        n_ev[ids] += seg_n
        n_lab[ids] += np.bincount(local[day_lab], minlength=ids.shape[0])
        peak[ids] = G.group_max(log10m[a:b], local, peak[ids])
        values, offsets = new.flat()
        snap["values"].append(np.asarray(values[offsets[0] : offsets[-1]], dtype=np.float64))
        snap["lengths"].append(np.diff(offsets))
        snap["log10m"].append(np.array(new.log10m, dtype=np.float64))
        snap["n_events"].append(n_ev[ids].copy())
        snap["n_labelled"].append(n_lab[ids].copy())
        snap["peak"].append(peak[ids].copy())
        bstate = bstate.scatter(ids, new)

    # 4. outputs at their input rows, the end-of-day state rows, the final state
    def at_input(values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        out[perm] = values
        return out

    scored = frame.with_columns(
        output_columns(
            frame.schema, cols, n_classes, at_input(protected), at_input(log10m),
            {name: at_input(extra[name]) for name in cal.extra_outputs},
        )
    )  # fmt: skip

    lengths = np.concatenate(snap["lengths"])
    n_seg = seg_start.shape[0]
    pending = pl.DataFrame(
        [
            _empty_lists(n_seg, _TIME_US).alias("pending_label_time"),
            _empty_lists(n_seg, pl.Float64).alias("pending_scores"),
            _empty_lists(n_seg, pl.Int64).alias("pending_labels"),
        ]
    )
    states = state_frame(
        cal, cols, n_classes, streams[seg_sid] if cols.by else pl.DataFrame(),
        n_events=np.concatenate(snap["n_events"]),
        n_labelled=np.concatenate(snap["n_labelled"]),
        log10m=np.concatenate(snap["log10m"]), peak=np.concatenate(snap["peak"]),
        weights=weights_series(
            np.concatenate(snap["values"]),
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        ),
        last_rows=frame.select(cols.order_by)[perm[seg_end - 1]], pending=pending,
    )  # fmt: skip
    seg_code = dcode[seg_start]
    dates = pl.Series("date", seg_code, dtype=pl.Int32).cast(pl.Date)
    last_seg = np.full(n_streams, -1, dtype=np.int64)
    np.maximum.at(last_seg, seg_sid, np.arange(n_seg, dtype=np.int64))
    final = merge_state(state0, states[last_seg], streams, cols)
    states = states.with_columns(dates).sort(["date", *cols.by])

    # streams in the state at the end of each day: the carried ones, and those new by then
    first_seg = np.full(n_streams, n_seg, dtype=np.int64)
    np.minimum.at(first_seg, seg_sid, np.arange(n_seg, dtype=np.int64))
    known = _in_state(streams, state0, cols) if state0.height else np.zeros(n_streams, bool)
    day_of_first = np.searchsorted(day_seg, first_seg[~known], side="right") - 1
    new_by_day = np.cumsum(np.bincount(day_of_first, minlength=day_seg.shape[0] - 1))
    day_codes = seg_code[day_seg[:-1]]
    return DaysResult(
        scored, states, final,
        days=pl.Series(day_codes, dtype=pl.Int32).cast(pl.Date).to_list(),
        n_events=np.diff(np.append(seg_start, n)[day_seg]),
        n_active=np.diff(day_seg),
        n_streams=state0.height + new_by_day,
    )  # fmt: skip


def _in_state(streams: pl.DataFrame, state0: pl.DataFrame, cols) -> np.ndarray:
    """Whether each of ``streams`` has a row in ``state0``."""
    if not cols.by:
        return np.ones(1, dtype=bool)
    keys = state0.select(cols.by).with_columns(pl.lit(True).alias("__in"))
    j = streams.join(keys, on=list(cols.by), how="left", nulls_equal=True, maintain_order="left")
    return j["__in"].fill_null(False).to_numpy()
