"""Random operation lists for the op-list kernels' tests (calpipe.kernels.ops convention:
OP_STEP, OP_FORECAST, OP_UPDATE; one segment of ops per stream)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calpipe.kernels import ops as K


@dataclass
class Ops:
    op_event: np.ndarray
    op_kind: np.ndarray
    op_offsets: np.ndarray

    def stream(self, s: int) -> list[tuple[int, int]]:
        lo, hi = self.op_offsets[s], self.op_offsets[s + 1]
        return list(zip(self.op_event[lo:hi].tolist(), self.op_kind[lo:hi].tolist(), strict=True))


def stream_ops(rng, events, p_unlabelled: float, p_delayed: float) -> list[tuple[int, int]]:
    """One stream's ops over ``events`` (in order): each event is, at random, an OP_STEP; an
    OP_FORECAST never updated; or an OP_FORECAST whose OP_UPDATE comes 1..5 operations later
    (possibly after the stream's last event)."""
    ops: list[tuple[int, int]] = []
    pending: list[tuple[int, int]] = []  # (due at op count, event)
    for e in events:
        u = rng.random()
        if u < p_unlabelled:
            ops.append((int(e), K.OP_FORECAST))
        elif u < p_unlabelled + p_delayed:
            ops.append((int(e), K.OP_FORECAST))
            pending.append((len(ops) + int(rng.integers(1, 6)), int(e)))
        else:
            ops.append((int(e), K.OP_STEP))
        for due, ev in sorted(pending):
            if due <= len(ops):
                ops.append((ev, K.OP_UPDATE))
                pending.remove((due, ev))
    return ops + [(ev, K.OP_UPDATE) for _, ev in sorted(pending)]


def make_ops(rng, n: int, n_streams: int, *, p_unlabelled=0.15, p_delayed=0.15) -> Ops:
    """Each of the n events (at random positions) goes to a random stream (:func:`stream_ops`)."""
    owner = rng.integers(0, n_streams, n)
    positions = rng.permutation(n)
    op_event, op_kind, offsets = [], [], [0]
    for s in range(n_streams):
        ops = stream_ops(rng, positions[owner[positions] == s], p_unlabelled, p_delayed)
        op_event += [e for e, _ in ops]
        op_kind += [k for _, k in ops]
        offsets.append(len(op_event))
    return Ops(
        np.array(op_event, dtype=np.int64),
        np.array(op_kind, dtype=np.int8),
        np.array(offsets, dtype=np.int64),
    )


def step_ops(n: int) -> Ops:
    return Ops(np.arange(n, dtype=np.int64), np.zeros(n, np.int8), np.array([0, n], np.int64))
