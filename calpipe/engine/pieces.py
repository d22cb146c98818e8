"""A batch's operation list run in pieces with the kernel state carried: one kernel call's
outputs and end state, bit for bit, with progress told after each piece.

What a long call (``calpipe protect`` on millions of events) needs to draw a bar: the kernels
run a whole batch in one call and say nothing until it returns. Here the operation list the
driver built for that one call (:mod:`calpipe.engine.driver`, with its delayed updates already
placed: :mod:`calpipe.engine.operations`) is cut, never rebuilt, and each piece runs through
:meth:`~calpipe.calibrators.base.Calibrator.run_batch` from the state the pieces before it left.
That is the protocol's "chunked" invariant (every method, every stream cut at any operation:
:func:`calpipe.calibrators.checks.check_calibrator`) with its "streams independent" one, so the
result is the one call's.

How it is cut (:func:`plan_pieces`): into about ``ops / piece_ops`` pieces. Streams long
enough (``min_stream_ops`` operations or more in each piece, on average) are cut at the same
fractions, every stream in every piece, so a piece is as wide as the batch (the binary kernels
run 64 streams at once in SIMD lanes from 128 streams on) and the state passes from piece to
piece as it is; a stream too short for a fraction has no operation in that piece, which leaves
its state as it was. Short streams are grouped instead, whole, into consecutive groups of about
``piece_ops`` operations, each from its own streams' state: cutting them would copy every
stream's state for a few operations each (``run_batch`` returns a new state).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from calpipe.calibrators.base import Calibrator, EndOfCallWarning, FlatState, RunOutput
from calpipe.kernels.ops import OP_UPDATE


@dataclass(frozen=True)
class Plan:
    """How a batch is cut: its streams in consecutive groups (``groups``: the G + 1 stream
    boundaries), each group's streams cut at the same ``fractions`` (F) of their operations.
    G x F pieces, run group by group, fraction by fraction."""

    groups: np.ndarray
    fractions: int

    @property
    def n_pieces(self) -> int:
        return (self.groups.shape[0] - 1) * self.fractions


def plan_pieces(op_offsets: np.ndarray, piece_ops: int, min_stream_ops: int) -> Plan:
    """The cut of a batch whose stream s has operations ``op_offsets[s]:op_offsets[s + 1]``
    into pieces of about ``piece_ops`` operations (see the module's docstring).

    >>> p = plan_pieces(np.array([0, 500, 1000]), 100, 10)  # two long streams: fractions
    >>> p.groups.tolist(), p.fractions
    ([0, 2], 10)
    >>> p = plan_pieces(np.arange(0, 1001, 10), 250, 64)  # 100 streams of 10: groups
    >>> p.groups.tolist(), p.fractions
    ([0, 25, 50, 75, 100], 1)
    """
    op_offsets = np.asarray(op_offsets, dtype=np.int64)
    n_streams = op_offsets.shape[0] - 1
    m = int(op_offsets[-1])
    wanted = max(1, -(-m // max(piece_ops, 1)))
    fractions = int(max(1, min(wanted, m // max(n_streams, 1) // max(min_stream_ops, 1))))
    n_groups = -(-wanted // fractions)
    cuts = np.searchsorted(op_offsets, m * np.arange(1, n_groups) / n_groups)
    groups = np.unique(np.concatenate([[0], cuts, [n_streams]])).astype(np.int64)
    return Plan(groups, fractions)


def run_pieces(
    cal: Calibrator,
    n_classes: int,
    scores: np.ndarray,
    labels: np.ndarray,
    op_event: np.ndarray,
    op_kind: np.ndarray,
    op_offsets: np.ndarray,
    state,
    inputs: dict[str, np.ndarray],
    *,
    n_events: int,
    plan: Plan,
    progress: Callable[[int], None],
) -> tuple[RunOutput, object]:
    """``cal.run_batch(scores, labels, op_event, op_kind, op_offsets, state, inputs)`` run in
    the pieces of ``plan``: its outputs for events ``0 .. n_events - 1`` (the events with a
    forecast operation; a delayed batch's pending labels come after them) and its end state,
    after each piece ``progress(events forecast in it)``. The end state is the kernels' own
    when the plan has one group of streams, else its flat form (a :class:`FlatState`: what the
    driver reads of it, ``flat()`` and ``log10m``, is the same). A method's once-a-call
    warnings (:class:`~calpipe.calibrators.base.EndOfCallWarning`) are given once, at the end
    (:meth:`~calpipe.calibrators.base.Calibrator.end_warnings`), not once a piece."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EndOfCallWarning)
        outputs, end = _run_pieces(cal, n_classes, scores, labels, op_event, op_kind, op_offsets,
                                   state, inputs, n_events, plan, progress)  # fmt: skip
    cal.end_warnings(end, n_classes)
    return outputs, end


def _run_pieces(cal, n_classes, scores, labels, op_event, op_kind, op_offsets, state, inputs,
                n_events, plan, progress):  # fmt: skip
    """:func:`run_pieces` without its warnings."""
    op_offsets = np.asarray(op_offsets, dtype=np.int64)
    delayed = bool((op_kind == OP_UPDATE).any())
    outputs: RunOutput | None = None
    groups = plan.groups
    whole = groups.shape[0] == 2
    if not whole:
        values, offsets = state.flat()
        log10m = np.asarray(state.log10m)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for g in range(groups.shape[0] - 1):
        s0, s1 = int(groups[g]), int(groups[g + 1])
        if whole:
            st = state
        else:
            lo, hi = int(offsets[s0]), int(offsets[s1])
            st = _state_of(cal, values[lo:hi], offsets[s0 : s1 + 1] - lo, log10m[s0:s1],
                           n_classes, type(state) is FlatState)  # fmt: skip
        first = op_offsets[s0:s1]
        lengths = op_offsets[s0 + 1 : s1 + 1] - first
        for c in range(plan.fractions):
            a = first + (c * lengths) // plan.fractions
            b = first + ((c + 1) * lengths) // plan.fractions
            ops = _ranges(a, b - a)
            if ops.shape[0] == 0:  # streams too short for this fraction: nothing to run
                continue
            local_offsets = np.concatenate([[0], np.cumsum(b - a)]).astype(np.int64)
            ev, kind = op_event[ops], op_kind[ops]
            if delayed:  # an event's update may come pieces after its forecast
                events, local = np.unique(ev, return_inverse=True)
                local = local.astype(np.int64)
            else:  # one operation per event: the piece's events are its operations'
                events, local = ev, np.arange(ev.shape[0], dtype=np.int64)
            out, st = cal.run_batch(
                np.ascontiguousarray(scores[events]), np.ascontiguousarray(labels[events]),
                local, np.ascontiguousarray(kind), local_offsets, st,
                {k: np.ascontiguousarray(v[events]) for k, v in inputs.items()},
            )  # fmt: skip
            shown = kind != OP_UPDATE
            rows, at = (local[shown], ev[shown]) if delayed else (None, ev)
            outputs = _with_rows(outputs, out, rows, at, n_events)
            progress(int(at.shape[0]))
        if not whole:
            v, o = st.flat()
            parts.append((v[o[0] : o[-1]], np.diff(o), np.asarray(st.log10m)))
    if whole:
        return outputs, st
    lengths = np.concatenate([p[1] for p in parts])
    end = FlatState(
        np.ascontiguousarray(np.concatenate([p[0] for p in parts]), dtype=np.float64),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        np.concatenate([p[2] for p in parts]).astype(np.float64),
    )
    return outputs, end


def _state_of(cal, values, offsets, log10m, n_classes: int, flat: bool):
    """The kernel state of these streams' flat vectors (a :class:`FlatState` as it is: it came
    from the kernels or a checked state row, as :func:`calpipe.engine.state.take_streams`)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    log10m = np.array(log10m, dtype=np.float64)
    if flat:
        return FlatState(values, offsets, log10m)
    return cal.state_from_flat(values, offsets, log10m, n_classes)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a loop."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


def _with_rows(acc: RunOutput | None, out: RunOutput, rows, at, n: int) -> RunOutput:
    """``acc`` (allocated for ``n`` events at the first piece) with ``out``'s rows ``rows``
    (all of them: None) written at events ``at``."""
    if acc is None:

        def room(x: np.ndarray) -> np.ndarray:
            return np.empty((n, *x.shape[1:]), dtype=x.dtype)

        acc = RunOutput(room(out.protected), room(out.log10_martingale),
                        {k: room(v) for k, v in out.extra.items()})  # fmt: skip

    def take(x: np.ndarray) -> np.ndarray:
        return x if rows is None else x[rows]

    acc.protected[at] = take(out.protected)
    acc.log10_martingale[at] = take(out.log10_martingale)
    for k, v in out.extra.items():
        acc.extra[k][at] = take(v)
    return acc
