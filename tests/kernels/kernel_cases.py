"""Random streams, operation lists, initial states and kernel calls shared by the tests of the
op-list kernels (tests/kernels/test_mixture.py, test_brier_compat.py, test_ops.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from calpipe import families
from calpipe.kernels import brier_compat as B
from calpipe.kernels import mixture as M
from calpipe.kernels import numeric as N
from calpipe.kernels import ops as O
from tests.kernels.ops import stream_ops

ATOL = 1e-12
SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(max_examples=15, deadline=None)
CJ_RATES = np.array([1e-2, 1e-3, 1e-4])


def make_batch(
    seed: int,
    k: int = 2,
    *,
    max_streams: int = 4,
    max_len: int = 60,
    clip: float | None = 1e-3,
    p_unlabelled: float = 0.2,
    p_delayed: float = 0.15,
) -> Batch:
    """Random streams with interleaved event positions. Each event is, at random: an OP_STEP; an
    OP_FORECAST never updated (unlabelled); or an OP_FORECAST whose OP_UPDATE comes 1..5 operations
    later in its stream (delayed label), possibly after the stream's last event."""
    rng = np.random.default_rng(seed)
    n_streams = int(rng.integers(1, max_streams + 1))
    lengths = rng.integers(1, max_len + 1, n_streams)
    n = int(lengths.sum())
    p = case_scores(rng, n, k, clip)
    y = case_labels(rng, p)
    positions = rng.permutation(n)  # stream s's events sit anywhere in the event arrays
    op_event, op_kind, offsets = [], [], [0]
    start = 0
    for length in lengths:
        events = positions[start : start + length]
        start += length
        ops = stream_ops(rng, events, p_unlabelled, p_delayed)
        op_event += [e for e, _ in ops]
        op_kind += [kind for _, kind in ops]
        offsets.append(len(op_event))
    return Batch(
        p=np.ascontiguousarray(p),
        y=y,
        op_event=np.array(op_event, dtype=np.int64),
        op_kind=np.array(op_kind, dtype=np.int8),
        op_offsets=np.array(offsets, dtype=np.int64),
        n_streams=n_streams,
    )


def naive_inputs(batch: Batch, s: int) -> tuple[list, list, list[int]]:
    """Stream s's operation list as a naive event sequence: OP_STEP -> a labelled event,
    OP_FORECAST -> an unlabelled event (forecast, no state change), OP_UPDATE -> a labelled event
    whose forecast is discarded. Returns (scores, labels, event index of each forecast or -1)."""
    ps, ys, who = [], [], []
    for e, kind in batch.stream_ops(s):
        ps.append(batch.p[e] if batch.p.ndim == 2 else float(batch.p[e]))
        ys.append(-1 if kind == O.OP_FORECAST else int(batch.y[e]))
        who.append(-1 if kind == O.OP_UPDATE else e)
    return ps, ys, who


def jumper_state(n_streams: int, n_fun: int):
    """Paper 000 Alg. 1 line 1 (normalised Alg. 2 line 1): C_eps = 1/|E|, no passive weight."""
    return np.zeros(n_streams), np.full((n_streams, 1, n_fun), 1.0 / n_fun), np.zeros(n_streams)


def mean_jumper_state(n_streams: int, n_rates: int, n_fun: int):
    """Equal prior 1/|J| on each Jumper, each starting uniform on E."""
    a = np.full((n_streams, n_rates, n_fun), 1.0 / (n_rates * n_fun))
    return np.zeros(n_streams), a, np.zeros(n_streams)


def cj_state(n_streams: int, n_rates: int, n_fun: int, pi: float = 0.5, identity: int = 0):
    """Paper 001 Alg. 1 lines 1-2."""
    a = np.zeros((n_streams, n_rates, n_fun))
    a[:, :, identity] = (1.0 - pi) / n_rates
    return np.full(n_streams, pi), a, np.zeros(n_streams)


def brier_state(n_streams: int, n_rates: int, n_fun: int, pi: float = 0.5):
    passive, active, _ = cj_state(n_streams, n_rates, n_fun, pi)
    capital = np.zeros((n_streams, n_rates, n_fun))
    capital[:, :, 0] = 1.0
    return passive, active, capital, np.zeros((n_streams, n_rates))


# ----------------------------------------------------------------------------------------------
# Kernel calls (dtypes as the calibrators pass them, so the numba cache is reused)
# ----------------------------------------------------------------------------------------------
def run_binary(batch: Batch, fam: families.Family, rates, state):
    return M.mixture_binary(
        batch.p, batch.y.astype(np.int8), batch.op_event, batch.op_kind, batch.op_offsets,
        fam.code, fam.params, np.asarray(rates, float), *state,
    )  # fmt: skip


def run_multiclass(batch: Batch, betas, alphas, rates, state):
    return M.mixture_multiclass(
        batch.p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets,
        np.ascontiguousarray(betas, dtype=float), np.ascontiguousarray(alphas, dtype=float),
        np.asarray(rates, float), *state,
    )  # fmt: skip


def run_brier(batch: Batch, betas, alphas, rates, state):
    p = (
        batch.p
        if batch.p.ndim == 2
        else np.ascontiguousarray(np.column_stack([1 - batch.p, batch.p]))
    )
    return B.brier_compat(
        p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets,
        np.ascontiguousarray(betas, dtype=float), np.ascontiguousarray(alphas, dtype=float),
        np.asarray(rates, float), *state,
    )  # fmt: skip


def split_each_stream(batch: Batch, cut: float) -> tuple[Batch, Batch]:
    """The batch as two chunks: each stream's first ``cut`` fraction of ops, then the rest."""
    firsts, seconds, off1, off2 = [], [], [0], [0]
    for s in range(batch.n_streams):
        ops = batch.stream_ops(s)
        c = round(cut * len(ops))
        firsts += ops[:c]
        seconds += ops[c:]
        off1.append(len(firsts))
        off2.append(len(seconds))

    def part(ops, off):
        return Batch(
            batch.p, batch.y, np.array([e for e, _ in ops], np.int64).reshape(-1),
            np.array([kd for _, kd in ops], np.int8).reshape(-1), np.array(off, np.int64),
            batch.n_streams,
        )  # fmt: skip

    return part(firsts, off1), part(seconds, off2)


def case_snapshot(*arrays):
    return [np.array(a, copy=True) for a in arrays]


# ----------------------------------------------------------------------------------------------
# Speed engines: the multi-stream lanes engine of _mixture_binary, its hand-back of
# long streams to the one-stream engine, the libm-free log10 and the cached multiclass powers
# ----------------------------------------------------------------------------------------------
LANE_STREAMS = 2 * N.LANES + 9  # _mixture_binary runs batches of >= 2 * _LANES streams in lanes


def stream_alone(batch: Batch, s: int) -> Batch:
    """Stream s of ``batch`` as a batch of its own (the one-stream engine runs it)."""
    lo, hi = batch.op_offsets[s], batch.op_offsets[s + 1]
    return Batch(
        batch.p, batch.y, batch.op_event[lo:hi], batch.op_kind[lo:hi],
        np.array([0, hi - lo], np.int64), 1,
    )  # fmt: skip


def case_state_slice(state, s: int):
    return tuple(np.ascontiguousarray(x[s : s + 1]) for x in state)


# ----------------------------------------------------------------------------------------------
# Random streams and operation lists
# ----------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """Events of several streams and the kernel operation list that replays them."""

    p: np.ndarray  # (n,) clipped P(y=1), or (n, K)
    y: np.ndarray  # (n,) int64 labels; a valid class even where the label is "unknown"
    op_event: np.ndarray
    op_kind: np.ndarray
    op_offsets: np.ndarray
    n_streams: int

    def stream_ops(self, s: int) -> list[tuple[int, int]]:
        lo, hi = self.op_offsets[s], self.op_offsets[s + 1]
        return list(zip(self.op_event[lo:hi].tolist(), self.op_kind[lo:hi].tolist(), strict=True))


def case_scores(rng, n: int, k: int, clip: float | None) -> np.ndarray:
    """Base forecasts with some extreme values; clipped as the log-loss calibrators clip them."""
    if k == 2:
        p = rng.uniform(0.0, 1.0, n)
        edge = rng.random(n) < 0.15
        p[edge] = rng.choice([0.0, 1e-6, 0.02, 0.98, 1.0 - 1e-6, 1.0], size=edge.sum())
        return p if clip is None else np.clip(p, clip, 1.0 - clip)
    p = rng.dirichlet(np.full(k, rng.choice([0.3, 1.0, 3.0])), size=n)
    if clip is None:
        return p
    q = np.maximum(p, clip)
    return q / q.sum(axis=1, keepdims=True)


def case_labels(rng, p: np.ndarray) -> np.ndarray:
    """Labels drawn from a distorted version of the base forecasts (so calibrators can win)."""
    if p.ndim == 1:
        truth = np.clip(p + 0.25 * (0.5 - p) + 0.1, 0.0, 1.0)
        return (rng.random(p.shape[0]) < truth).astype(np.int64)
    k = p.shape[1]
    tilt = p**0.6 * np.exp(rng.normal(0.0, 0.5, k))
    tilt /= tilt.sum(axis=1, keepdims=True)
    return np.array([rng.choice(k, p=row) for row in tilt], dtype=np.int64)
