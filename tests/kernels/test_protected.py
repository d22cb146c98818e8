"""The numba kernels of calpipe.kernels.protected against the naive loops of tests/naive.py.

Every kernel (``_mixture_binary``, ``_mixture_multiclass``, ``_brier_compat``) must equal the paper's
per-step loop to 1e-12 on random streams: protected forecasts, running log10 test martingales and
(Brier mode) each rate's log10 SJ. Streams are handled several at a time through ``op_offsets``, with
events of different streams interleaved in the event arrays, unlabelled events (forecast only) and
delayed labels (a forecast, then an update later in the replay).

The initial states are built here from the papers, not taken from calpipe.calibrators:
Jumper (paper 000 Alg. 1 line 1: C_eps = 1/|E|), Mean Jumper (equal prior over rates),
Composite Jumper (paper 001 Alg. 1 lines 1-2: P = pi, A^J_id = (1 - pi)/|J|), Brier compatibility
(the package: the same P and A, ``mart_capital[:, 0] = 1``, log10 SJ = 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from calpipe import families
from calpipe.kernels import protected as K
from tests import naive
from tests.kernels.ops import stream_ops

ATOL = 1e-12
SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(max_examples=15, deadline=None)
CJ_RATES = np.array([1e-2, 1e-3, 1e-4])


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


def _scores(rng, n: int, k: int, clip: float | None) -> np.ndarray:
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


def _labels(rng, p: np.ndarray) -> np.ndarray:
    """Labels drawn from a distorted version of the base forecasts (so calibrators can win)."""
    if p.ndim == 1:
        truth = np.clip(p + 0.25 * (0.5 - p) + 0.1, 0.0, 1.0)
        return (rng.random(p.shape[0]) < truth).astype(np.int64)
    k = p.shape[1]
    tilt = p**0.6 * np.exp(rng.normal(0.0, 0.5, k))
    tilt /= tilt.sum(axis=1, keepdims=True)
    return np.array([rng.choice(k, p=row) for row in tilt], dtype=np.int64)


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
    p = _scores(rng, n, k, clip)
    y = _labels(rng, p)
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
        ys.append(-1 if kind == K.OP_FORECAST else int(batch.y[e]))
        who.append(-1 if kind == K.OP_UPDATE else e)
    return ps, ys, who


def _as_matrix(ps: list) -> np.ndarray:
    """Naive scores as an (n, K) matrix (binary P(y=1) -> columns (1 - p, p))."""
    arr = np.array(ps, dtype=np.float64)
    return arr if arr.ndim == 2 else np.column_stack([1.0 - arr, arr])


def compare_stream(batch, s, got_p, got_m, exp_p, exp_m, who):
    """Kernel outputs at the events forecast by stream s == the naive sequence at those steps."""
    idx = [i for i, e in enumerate(who) if e >= 0]
    events = [who[i] for i in idx]
    np.testing.assert_allclose(got_p[events], np.array([exp_p[i] for i in idx]), rtol=0, atol=ATOL)
    np.testing.assert_allclose(got_m[events], np.array([exp_m[i] for i in idx]), rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# Initial states (from the papers)
# ----------------------------------------------------------------------------------------------
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
    return K._mixture_binary(
        batch.p, batch.y.astype(np.int8), batch.op_event, batch.op_kind, batch.op_offsets,
        fam.code, fam.params, np.asarray(rates, float), *state,
    )  # fmt: skip


def run_multiclass(batch: Batch, betas, alphas, rates, state):
    return K._mixture_multiclass(
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
    return K._brier_compat(
        p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets,
        np.ascontiguousarray(betas, dtype=float), np.ascontiguousarray(alphas, dtype=float),
        np.asarray(rates, float), *state,
    )  # fmt: skip


BINARY_FAMILIES = ["quadratic", "cubic", "cox", "cox2"]


# ----------------------------------------------------------------------------------------------
# The naive oracles agree with each other (paper 000 Lemma 1)
# ----------------------------------------------------------------------------------------------
@FEW
@given(seed=SEEDS, name=st.sampled_from(BINARY_FAMILIES), jump=st.sampled_from([1.0, 0.1, 1e-3]))
def test_naive_jumper_algorithm1_martingale_is_algorithm2_gale_ratio(seed, name, jump):
    """Lemma 1 of paper 000: log10 S_n (Alg. 1) = sum_i log10 p'_i(y_i) - log10 p_i(y_i) (Alg. 2)."""
    rng = np.random.default_rng(seed)
    p = _scores(rng, 120, 2, 1e-3)
    y = _labels(rng, p)
    y[rng.random(120) < 0.2] = -1
    fs = naive.binary_functions(name, families.binary_family(name).params)
    forecasts = naive.jumper_predictor(p, y, fs, jump)
    log10_s = naive.jumper_martingale(p, y, fs, jump)
    ratio = [
        np.log10(naive.bernoulli(q, int(v))) - np.log10(naive.bernoulli(b, int(v))) if v >= 0 else 0
        for q, b, v in zip(forecasts, p, y, strict=True)
    ]
    np.testing.assert_allclose(log10_s, np.cumsum(ratio), rtol=0, atol=1e-11)


def test_naive_jumper_with_identity_only_family_is_the_base():
    p = np.array([0.1, 0.5, 0.93, 0.4])
    fs = [naive.quadratic(0.0)]
    assert naive.jumper_predictor(p, [1, 0, -1, 1], fs, 0.01) == pytest.approx(p.tolist())
    assert naive.jumper_martingale(p, [1, 0, -1, 1], fs, 0.01) == pytest.approx([0, 0, 0, 0])


# ----------------------------------------------------------------------------------------------
# Binary mixture kernel == naive Jumper / Mean Jumper / Composite Jumper
# ----------------------------------------------------------------------------------------------
@FEW
@given(seed=SEEDS, name=st.sampled_from(BINARY_FAMILIES), jump=st.sampled_from([1.0, 0.1, 0.01]))
def test_mixture_binary_jumper_equals_paper000_algorithms_1_and_2(seed, name, jump):
    batch = make_batch(seed)
    fam = families.binary_family(name)
    fs = naive.binary_functions(name, fam.params)
    out_p, out_m, *_ = run_binary(batch, fam, [jump], jumper_state(batch.n_streams, fam.size))
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p = naive.jumper_predictor(ps, ys, fs, jump)
        exp_m = naive.jumper_martingale(ps, ys, fs, jump)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)


@FEW
@given(seed=SEEDS, name=st.sampled_from(BINARY_FAMILIES))
def test_mixture_binary_mean_jumper_equals_average_of_jumpers(seed, name):
    rates = [1.0, 0.1, 0.01]
    batch = make_batch(seed)
    fam = families.binary_family(name)
    fs = naive.binary_functions(name, fam.params)
    state = mean_jumper_state(batch.n_streams, len(rates), fam.size)
    out_p, out_m, *_ = run_binary(batch, fam, rates, state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_m = naive.mean_jumper(ps, ys, fs, rates)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)


@FEW
@given(seed=SEEDS, pi=st.sampled_from([0.5, 0.1, 0.9]))
def test_mixture_binary_composite_jumper_equals_paper001_algorithm1(seed, pi):
    batch = make_batch(seed)
    fam = families.binary_family("cox2")
    fs = naive.binary_functions("cox2", fam.params)
    state = cj_state(batch.n_streams, 3, fam.size, pi)
    out_p, out_m, passive, _, log10m = run_binary(batch, fam, CJ_RATES, state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_m = naive.composite_jumper(ps, ys, fs, CJ_RATES, pi, identity=0)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)
        assert log10m[s] == pytest.approx(exp_m[-1], abs=ATOL)  # end state: last running value
    assert np.all((passive > 0) & (passive <= 1))


def test_mixture_binary_composite_jumper_with_identity_not_first():
    """Paper 001 Alg. 1 line 2 starts on the identity wherever it sits in the grid."""
    batch = make_batch(7, max_streams=2)
    params = [(1.0, 0.5), (-1.0, 2.0), (0.0, 1.0), (0.0, 0.5), (1.0, 1.0)]
    fam = families.binary_family("cox2", params)
    fs = naive.binary_functions("cox2", fam.params)
    state = cj_state(batch.n_streams, 2, fam.size, 0.3, identity=2)
    out_p, out_m, *_ = run_binary(batch, fam, [0.05, 0.5], state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_m = naive.composite_jumper(ps, ys, fs, [0.05, 0.5], 0.3, identity=2)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)


# ----------------------------------------------------------------------------------------------
# Multiclass mixture kernel == naive Composite Jumper / Jumper with paper 001 eq. (1)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [3, 5, 10])
@pytest.mark.parametrize("seed", [11, 12])
def test_mixture_multiclass_composite_jumper_equals_paper001_algorithm1(k, seed):
    batch = make_batch(seed * 100 + k, k, max_streams=3, max_len=40 if k < 10 else 25)
    fam = families.multiclass_family(k)
    fs = naive.multiclass_functions(fam.alphas, fam.betas)
    state = cj_state(batch.n_streams, 3, fam.size)
    out_p, out_m, _, _, log10m = run_multiclass(batch, fam.betas, fam.alphas, CJ_RATES, state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_m = naive.composite_jumper(ps, ys, fs, CJ_RATES, 0.5, identity=0)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)
        assert log10m[s] == pytest.approx(exp_m[-1], abs=ATOL)


@FEW
@given(seed=SEEDS, k=st.sampled_from([3, 5]), jump=st.sampled_from([1.0, 0.05]))
def test_mixture_multiclass_jumper_equals_paper000_algorithms_1_and_2(seed, k, jump):
    batch = make_batch(seed, k, max_streams=3, max_len=30)
    fam = families.multiclass_family(k)
    fs = naive.multiclass_functions(fam.alphas, fam.betas)
    state = jumper_state(batch.n_streams, fam.size)
    out_p, out_m, *_ = run_multiclass(batch, fam.betas, fam.alphas, [jump], state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p = naive.jumper_predictor(ps, ys, fs, jump)
        exp_m = naive.jumper_martingale(ps, ys, fs, jump)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)


@FEW
@given(seed=SEEDS)
def test_mixture_binary_equals_multiclass_with_k2_and_equivalent_nine_function_grid(seed):
    """Binary cox2 (alpha on class 1) == K = 2 Cox with alpha rows (0, alpha): same forecasts of
    class 1, complementary class 0, same martingales, same end states."""
    batch = make_batch(seed)
    fam = families.binary_family("cox2")
    alphas = np.column_stack([np.zeros(fam.size), fam.params[:, 0]])
    state = cj_state(batch.n_streams, 3, fam.size)
    b_p, b_m, b_pw, b_a, b_lm = run_binary(batch, fam, CJ_RATES, state)
    multi = Batch(
        np.ascontiguousarray(np.column_stack([1.0 - batch.p, batch.p])),
        batch.y, batch.op_event, batch.op_kind, batch.op_offsets, batch.n_streams,
    )  # fmt: skip
    m_p, m_m, m_pw, m_a, m_lm = run_multiclass(multi, fam.betas, alphas, CJ_RATES, state)
    seen = ~np.isnan(b_p)
    assert np.array_equal(seen, ~np.isnan(m_p[:, 1]))
    np.testing.assert_allclose(m_p[seen, 1], b_p[seen], rtol=0, atol=ATOL)
    np.testing.assert_allclose(m_p[seen, 0], 1.0 - b_p[seen], rtol=0, atol=ATOL)
    np.testing.assert_allclose(m_m[seen], b_m[seen], rtol=0, atol=ATOL)
    np.testing.assert_allclose(m_pw, b_pw, rtol=0, atol=ATOL)
    np.testing.assert_allclose(m_a, b_a, rtol=0, atol=ATOL)
    np.testing.assert_allclose(m_lm, b_lm, rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# Brier compatibility kernel == transcription of protected-classification 0.1.5
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 5, 10])
def test_brier_compat_equals_package_recursion(k):
    batch = make_batch(500 + k, k, max_streams=3, max_len=40 if k < 10 else 20, clip=None)
    alphas, betas = naive.package_grid(k)
    state = brier_state(batch.n_streams, 3, len(betas))
    out_p, out_cj, out_sj, *_, log_sj = run_brier(batch, betas, alphas, CJ_RATES, state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_cj, exp_sj = naive.brier_compat(_as_matrix(ps), ys, CJ_RATES)
        idx = [i for i, e in enumerate(who) if e >= 0]
        events = [who[i] for i in idx]
        np.testing.assert_allclose(out_p[events], exp_p[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_cj[events], exp_cj[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_sj[events], exp_sj[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(log_sj[s], exp_sj[-1], rtol=0, atol=ATOL)


@settings(max_examples=10, deadline=None)
@given(seed=SEEDS)
def test_brier_compat_binary_random_streams_equal_package_recursion(seed):
    batch = make_batch(seed, 2, max_streams=3, max_len=30, clip=None)
    alphas, betas = naive.package_grid(2)
    state = brier_state(batch.n_streams, 3, len(betas))
    out_p, out_cj, out_sj, *_ = run_brier(batch, betas, alphas, CJ_RATES, state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_cj, exp_sj = naive.brier_compat(_as_matrix(ps), ys, CJ_RATES)
        idx = [i for i, e in enumerate(who) if e >= 0]
        events = [who[i] for i in idx]
        np.testing.assert_allclose(out_p[events], exp_p[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_cj[events], exp_cj[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_sj[events], exp_sj[idx], rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# Operation semantics, purity, invariants
# ----------------------------------------------------------------------------------------------
def _step_and_split_batches(seed: int, k: int, clip: float | None = 1e-3):
    """The same labelled stream twice: all OP_STEP; and with some steps split into OP_FORECAST
    immediately followed by OP_UPDATE. Returns (steps, split, events that were split)."""
    rng = np.random.default_rng(seed)
    n = 80
    p = _scores(rng, n, k, clip)
    y = _labels(rng, p)
    split_mask = rng.random(n) < 0.4
    ev, kind = [], []
    for e in range(n):
        if split_mask[e]:
            ev += [e, e]
            kind += [K.OP_FORECAST, K.OP_UPDATE]
        else:
            ev.append(e)
            kind.append(K.OP_STEP)
    steps = Batch(p, y, np.arange(n, dtype=np.int64), np.zeros(n, np.int8), np.array([0, n]), 1)
    split = Batch(p, y, np.array(ev, np.int64), np.array(kind, np.int8), np.array([0, len(ev)]), 1)
    return steps, split, split_mask


def _assert_split_equals_step(a, b, split_mask, martingale_idx: int):
    """Forecasts and end states equal; the martingale at a split event is its value *before* the
    label (the forecast op records it, the update does not), i.e. the previous event's value."""
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=ATOL)
    m_step, m_split = a[martingale_idx], b[martingale_idx]
    before = np.concatenate([[0.0], m_step[:-1]])
    np.testing.assert_allclose(m_split[~split_mask], m_step[~split_mask], rtol=0, atol=ATOL)
    np.testing.assert_allclose(m_split[split_mask], before[split_mask], rtol=0, atol=ATOL)
    for x, z in zip(a[-3:], b[-3:], strict=True):
        np.testing.assert_allclose(x, z, rtol=0, atol=ATOL)


@pytest.mark.parametrize("k", [2, 3])
def test_forecast_then_update_on_same_event_equals_step(k):
    steps, split, mask = _step_and_split_batches(3 + k, k)
    if k == 2:
        fam = families.binary_family("cox2")
        a = run_binary(steps, fam, CJ_RATES, cj_state(1, 3, fam.size))
        b = run_binary(split, fam, CJ_RATES, cj_state(1, 3, fam.size))
    else:
        fam = families.multiclass_family(k)
        a = run_multiclass(steps, fam.betas, fam.alphas, CJ_RATES, cj_state(1, 3, fam.size))
        b = run_multiclass(split, fam.betas, fam.alphas, CJ_RATES, cj_state(1, 3, fam.size))
    _assert_split_equals_step(a, b, mask, 1)


@pytest.mark.parametrize("k", [2, 4])
def test_brier_forecast_then_update_on_same_event_equals_step(k):
    steps, split, mask = _step_and_split_batches(30 + k, k, clip=None)
    if k == 2:
        steps.p = split.p = np.ascontiguousarray(np.column_stack([1 - steps.p, steps.p]))
    alphas, betas = naive.package_grid(k)
    a = run_brier(steps, betas, alphas, CJ_RATES, brier_state(1, 3, len(betas)))
    b = run_brier(split, betas, alphas, CJ_RATES, brier_state(1, 3, len(betas)))
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=ATOL)
    before = np.vstack([np.zeros((1, 3)), a[2][:-1]])
    np.testing.assert_allclose(b[2][~mask], a[2][~mask], rtol=0, atol=ATOL)
    np.testing.assert_allclose(b[2][mask], before[mask], rtol=0, atol=ATOL)
    for x, z in zip(a[3:], b[3:], strict=True):
        np.testing.assert_allclose(x, z, rtol=0, atol=ATOL)


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


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0))
def test_two_chunks_with_state_carried_equal_one_pass(seed, cut):
    """Resumable (DESIGN §4): ops split anywhere per stream, state of chunk 1 fed to chunk 2."""
    batch = make_batch(seed, max_streams=3)
    fam = families.binary_family("cox2")
    state = cj_state(batch.n_streams, 3, fam.size)
    one = run_binary(batch, fam, CJ_RATES, state)
    first, second = split_each_stream(batch, cut)
    r1 = run_binary(first, fam, CJ_RATES, state)
    r2 = run_binary(second, fam, CJ_RATES, r1[2:])
    got_p = np.where(np.isnan(r2[0]), r1[0], r2[0])
    got_m = np.where(np.isnan(r2[1]), r1[1], r2[1])
    np.testing.assert_allclose(got_p, one[0], rtol=0, atol=ATOL)
    np.testing.assert_allclose(got_m, one[1], rtol=0, atol=ATOL)
    for x, z in zip(r2[2:], one[2:], strict=True):
        np.testing.assert_allclose(x, z, rtol=0, atol=ATOL)


def _snapshot(*arrays):
    return [np.array(a, copy=True) for a in arrays]


def test_kernels_do_not_mutate_their_inputs():
    batch = make_batch(21, max_streams=3)
    fam = families.binary_family("cox2")
    state = cj_state(batch.n_streams, 3, fam.size)
    args = (batch.p, batch.y.astype(np.int8), batch.op_event, batch.op_kind, batch.op_offsets)
    before = _snapshot(*args, fam.params, CJ_RATES, *state)
    out = K._mixture_binary(*args, fam.code, fam.params, CJ_RATES, *state)
    for x, z in zip(before, [*args, fam.params, CJ_RATES, *state], strict=True):
        np.testing.assert_array_equal(x, z)
    assert out[3] is not state[1] and not np.shares_memory(out[3], state[1])

    mb = make_batch(22, 4, max_streams=2)
    mf = families.multiclass_family(4)
    mstate = cj_state(mb.n_streams, 3, mf.size)
    margs = (mb.p, mb.y, mb.op_event, mb.op_kind, mb.op_offsets, mf.betas.copy(), mf.alphas)
    before = _snapshot(*margs, CJ_RATES, *mstate)
    K._mixture_multiclass(*margs, CJ_RATES, *mstate)
    for x, z in zip(before, [*margs, CJ_RATES, *mstate], strict=True):
        np.testing.assert_array_equal(x, z)

    bstate = brier_state(mb.n_streams, 3, mf.size)
    before = _snapshot(*margs, CJ_RATES, *bstate)
    K._brier_compat(*margs, CJ_RATES, *bstate)
    for x, z in zip(before, [*margs, CJ_RATES, *bstate], strict=True):
        np.testing.assert_array_equal(x, z)


@FEW
@given(seed=SEEDS, k=st.sampled_from([2, 3, 6]))
def test_family_holding_only_the_identity_returns_the_base(seed, k):
    """Every mixture of copies of p is p: protected == base, log10 martingale == 0 (log loss);
    Brier mode's substitution shortcut also returns p exactly when every expert predicts p."""
    batch = make_batch(seed, k, max_streams=2, max_len=40)
    seen = np.unique(batch.op_event[batch.op_kind != K.OP_UPDATE])
    rates = [0.3, 1e-3]
    if k == 2:
        for fam in (
            families.binary_family("quadratic", [0.0]),
            families.binary_family("cox2", [(0.0, 1.0)]),
            families.binary_family("cubic", [(0.0, 0.4)]),
        ):
            out_p, out_m, *_ = run_binary(batch, fam, rates, cj_state(batch.n_streams, 2, 1))
            np.testing.assert_allclose(out_p[seen], batch.p[seen], rtol=0, atol=1e-14)
            np.testing.assert_allclose(out_m[seen], 0.0, atol=1e-12)
        p2 = np.column_stack([1 - batch.p, batch.p])
    else:
        out_p, out_m, *_ = run_multiclass(
            batch, [1.0], np.zeros((1, k)), rates, cj_state(batch.n_streams, 2, 1)
        )
        np.testing.assert_allclose(out_p[seen], batch.p[seen], rtol=0, atol=1e-14)
        np.testing.assert_allclose(out_m[seen], 0.0, atol=1e-12)
        p2 = batch.p
    out_p, out_cj, out_sj, *_ = run_brier(
        batch, [1.0], np.zeros((1, k)), rates, brier_state(batch.n_streams, 2, 1)
    )
    np.testing.assert_allclose(out_p[seen], p2[seen], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out_sj[seen], 0.0, atol=1e-12)
    np.testing.assert_allclose(out_cj[seen], 0.0, atol=1e-12)


@FEW
@given(seed=SEEDS, k=st.sampled_from([2, 3, 5]))
def test_outputs_are_probabilities_summing_to_one(seed, k):
    """Protected forecasts in [0, 1] (and rows summing to 1 for K classes), for every kernel,
    including base forecasts at the clip edges (log loss) and exact 0 / 1 (Brier mode)."""
    batch = make_batch(seed, k)
    seen = np.unique(batch.op_event[batch.op_kind != K.OP_UPDATE])
    unseen = np.setdiff1d(np.arange(batch.p.shape[0]), seen)
    if k == 2:
        fam = families.binary_family("cox2")
        out_p, out_m, *_ = run_binary(batch, fam, CJ_RATES, cj_state(batch.n_streams, 3, 9))
        assert np.all((out_p[seen] >= 0.0) & (out_p[seen] <= 1.0))
    else:
        fam = families.multiclass_family(k)
        out_p, out_m, *_ = run_multiclass(
            batch, fam.betas, fam.alphas, CJ_RATES, cj_state(batch.n_streams, 3, fam.size)
        )
        assert np.all((out_p[seen] >= 0.0) & (out_p[seen] <= 1.0))
        np.testing.assert_allclose(out_p[seen].sum(axis=1), 1.0, atol=ATOL)
    assert np.all(np.isfinite(out_m[seen]))
    assert np.all(np.isnan(out_p[unseen]))  # events never forecast keep NaN

    raw = make_batch(seed, k, clip=None)
    alphas, betas = naive.package_grid(k)
    b_p, b_cj, b_sj, *_ = run_brier(
        raw, betas, alphas, CJ_RATES, brier_state(raw.n_streams, 3, len(betas))
    )
    seen = np.unique(raw.op_event[raw.op_kind != K.OP_UPDATE])
    assert np.all((b_p[seen] >= 0.0) & (b_p[seen] <= 1.0))
    np.testing.assert_allclose(b_p[seen].sum(axis=1), 1.0, atol=ATOL)
    assert np.all(np.isfinite(b_cj[seen])) and np.all(np.isfinite(b_sj[seen]))


def test_composite_jumper_log10_cj_rows_match_package_log_mean():
    rng = np.random.default_rng(5)
    lsj = rng.normal(0, 30, size=(6, 3))
    lsj[0] = [-500.0, -800.0, -2.0]  # large negative: CJ -> log10(1/2)
    lsj[1] = [900.0, 950.0, 10.0]  # large positive: no overflow
    got = K._log10_cj_rows(np.ascontiguousarray(lsj))
    expected = [naive._log_mean([0.0, naive._log_mean(list(row))]) for row in lsj]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert np.isfinite(got).all()


# ----------------------------------------------------------------------------------------------
# Speed engines (issue 4): the multi-stream lanes engine of _mixture_binary, its hand-back of
# long streams to the one-stream engine, the libm-free log10 and the cached multiclass powers
# ----------------------------------------------------------------------------------------------
LANE_STREAMS = 2 * K._LANES + 9  # _mixture_binary runs batches of >= 2 * _LANES streams in lanes


def many_streams_batch(seed: int, *, n_long: int = 0, long_len: int = 300) -> Batch:
    """LANE_STREAMS short streams of unequal lengths (events at random positions; OP_STEP,
    unlabelled OP_FORECAST, or OP_FORECAST with its OP_UPDATE 1-3 operations later); the first
    ``n_long`` streams are ``long_len`` events long, so the lanes run nearly empty while they
    are still going and must hand them back."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 20, LANE_STREAMS)
    lengths[:n_long] = long_len
    n = int(lengths.sum())
    p = _scores(rng, n, 2, 1e-3)
    y = _labels(rng, p)
    positions = rng.permutation(n)
    op_event, op_kind, offsets, start = [], [], [0], 0
    for length in lengths:
        ops: list[tuple[int, int]] = []
        late: list[tuple[int, int]] = []
        for e in positions[start : start + length].tolist():
            u = rng.random()
            kind = K.OP_STEP if u < 0.7 else K.OP_FORECAST
            ops.append((e, kind))
            if 0.85 <= u:
                late.append((len(ops) + int(rng.integers(1, 4)), e))
            for due, ev in list(late):
                if due <= len(ops):
                    ops.append((ev, K.OP_UPDATE))
                    late.remove((due, ev))
        ops += [(ev, K.OP_UPDATE) for _, ev in late]
        start += length
        op_event += [e for e, _ in ops]
        op_kind += [kd for _, kd in ops]
        offsets.append(len(op_event))
    return Batch(
        p, y, np.array(op_event, np.int64), np.array(op_kind, np.int8),
        np.array(offsets, np.int64), LANE_STREAMS,
    )  # fmt: skip


def stream_alone(batch: Batch, s: int) -> Batch:
    """Stream s of ``batch`` as a batch of its own (the one-stream engine runs it)."""
    lo, hi = batch.op_offsets[s], batch.op_offsets[s + 1]
    return Batch(
        batch.p, batch.y, batch.op_event[lo:hi], batch.op_kind[lo:hi],
        np.array([0, hi - lo], np.int64), 1,
    )  # fmt: skip


def _state_slice(state, s: int):
    return tuple(np.ascontiguousarray(x[s : s + 1]) for x in state)


LANE_CASES = {  # name: (family, rates, state builder (n_streams, n_fun) -> state)
    "composite-jumper": ("cox2", CJ_RATES, lambda s, t: cj_state(s, 3, t, 0.5)),
    "jumper-quadratic": ("quadratic", [0.01], jumper_state),
    "jumper-cubic": ("cubic", [0.1], jumper_state),
    "mean-jumper-cox": ("cox", [1.0, 0.1, 0.01, 0.001], lambda s, t: mean_jumper_state(s, 4, t)),
}


@pytest.mark.parametrize("case", sorted(LANE_CASES))
@pytest.mark.parametrize("n_long", [0, 3])
def test_stream_outputs_are_bit_identical_alone_and_in_a_lanes_batch(case, n_long):
    """The lanes engine (many streams) and the one-stream engine run the same operations: a
    stream's forecasts, martingale and end state do not depend on its batch, to the bit; long
    streams handed back from the lanes to the one-stream engine mid-way included."""
    name, rates, make_state = LANE_CASES[case]
    batch = many_streams_batch(31 + n_long, n_long=n_long)
    fam = families.binary_family(name)
    state = make_state(batch.n_streams, fam.size)
    together = run_binary(batch, fam, rates, state)
    for s in [*range(n_long), *range(n_long, batch.n_streams, 11)]:
        alone = run_binary(stream_alone(batch, s), fam, rates, _state_slice(state, s))
        lo, hi = batch.op_offsets[s], batch.op_offsets[s + 1]
        seen = batch.op_event[lo:hi][batch.op_kind[lo:hi] != K.OP_UPDATE]
        np.testing.assert_array_equal(alone[0][seen], together[0][seen])
        np.testing.assert_array_equal(alone[1][seen], together[1][seen])
        for x, z in zip(alone[2:], together[2:], strict=True):
            np.testing.assert_array_equal(x[0], z[s])


@pytest.mark.parametrize("n_long", [0, 2])
def test_lanes_engine_composite_jumper_equals_paper001_algorithm1(n_long):
    batch = many_streams_batch(47, n_long=n_long, long_len=150)
    fam = families.binary_family("cox2")
    fs = naive.binary_functions("cox2", fam.params)
    out_p, out_m, passive, _, log10m = run_binary(
        batch, fam, CJ_RATES, cj_state(batch.n_streams, 3, fam.size, 0.3)
    )
    for s in [*range(n_long), *range(n_long, batch.n_streams, 9)]:
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_m = naive.composite_jumper(ps, ys, fs, CJ_RATES, 0.3, identity=0)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)
        assert log10m[s] == pytest.approx(exp_m[-1], abs=ATOL)
    assert np.all((passive > 0) & (passive <= 1))


def test_lanes_engine_jumper_equals_paper000_algorithms_1_and_2():
    batch = many_streams_batch(53)
    fam = families.binary_family("quadratic")
    fs = naive.binary_functions("quadratic", fam.params)
    out_p, out_m, *_ = run_binary(batch, fam, [0.05], jumper_state(batch.n_streams, fam.size))
    for s in range(0, batch.n_streams, 13):
        ps, ys, who = naive_inputs(batch, s)
        exp_p = naive.jumper_predictor(ps, ys, fs, 0.05)
        exp_m = naive.jumper_martingale(ps, ys, fs, 0.05)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0))
def test_lanes_two_chunks_with_state_carried_equal_one_pass_bit_for_bit(seed, cut):
    """Resumable (DESIGN §4) through the lanes engine: the chunked run is the one pass, exactly."""
    batch = many_streams_batch(seed % 1000)
    fam = families.binary_family("cox2")
    state = cj_state(batch.n_streams, 3, fam.size)
    one = run_binary(batch, fam, CJ_RATES, state)
    first, second = split_each_stream(batch, cut)
    r1 = run_binary(first, fam, CJ_RATES, state)
    r2 = run_binary(second, fam, CJ_RATES, r1[2:])
    np.testing.assert_array_equal(np.where(np.isnan(r2[0]), r1[0], r2[0]), one[0])
    np.testing.assert_array_equal(np.where(np.isnan(r2[1]), r1[1], r2[1]), one[1])
    for x, z in zip(r2[2:], one[2:], strict=True):
        np.testing.assert_array_equal(x, z)


def _log10_at(values) -> np.ndarray:
    x = np.ascontiguousarray(values, dtype=np.float64)
    mant = np.empty_like(x)
    return np.array(
        [K._log10_at(x, x.view(np.int64), mant.view(np.int64), mant, i) for i in range(x.size)]
    )


@settings(max_examples=60, deadline=None)
@given(x=st.floats(min_value=2.3e-308, max_value=1e308, allow_subnormal=False))
def test_log10_at_is_within_2_ulp_of_libm_log10(x):
    got = _log10_at([x])[0]
    expected = np.log10(x)
    assert abs(got - expected) <= 2 * np.spacing(abs(expected)) or got == expected


def test_log10_at_on_the_martingale_range_and_exact_points():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(0.5, 2.0, 2000), 1.0 + rng.normal(0, 1e-9, 500),
                        np.exp(rng.uniform(-12, 8, 2000))])  # fmt: skip
    got, expected = _log10_at(x), np.log10(x)
    np.testing.assert_array_less(np.abs(got - expected), 2.01 * np.spacing(np.abs(expected)))
    assert _log10_at([1.0])[0] == 0.0  # log10 S does not drift while forecasts equal the base
    np.testing.assert_allclose(_log10_at([10.0, 0.1, 1e5]), [1.0, -1.0, 5.0], rtol=1e-15)
    assert K._is_normal(np.float64(1.0).view(np.int64))
    for bad in (0.0, 5e-324, np.inf, np.nan):
        assert not K._is_normal(np.float64(bad).view(np.int64))


def test_multiclass_cached_powers_with_an_unordered_custom_grid_equal_paper001_algorithm1():
    """p_c^beta is computed once per distinct beta: a grid whose betas repeat out of order and
    include a general exponent must give the same mixture as evaluating every function."""
    k = 4
    fam = families.multiclass_family(k, "cox2", betas=[1.3, 0.5, 1.0], alpha_shifts=[0.5])
    assert len(np.unique(fam.betas)) == 3 and fam.betas[0] == 1.3
    batch = make_batch(61, k, max_streams=3, max_len=30)
    fs = naive.multiclass_functions(fam.alphas, fam.betas)
    identity = int(np.flatnonzero((fam.alphas == 0).all(axis=1) & (fam.betas == 1.0))[0])
    state = cj_state(batch.n_streams, 3, fam.size, identity=identity)
    out_p, out_m, *_ = run_multiclass(batch, fam.betas, fam.alphas, CJ_RATES, state)
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_m = naive.composite_jumper(ps, ys, fs, CJ_RATES, 0.5, identity=identity)
        compare_stream(batch, s, out_p, out_m, exp_p, exp_m, who)


# ----------------------------------------------------------------------------------------------
# Brier compatibility, binary (issue 4): the libm-free exp / log, the two-class kernel against the
# generic K-class kernel and the package's recursion, its two engines (one stream at a time, SIMD
# lanes) and their bit-for-bit determinism
# ----------------------------------------------------------------------------------------------
@njit(error_model="numpy")
def _exp_fast_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = K._exp_fast(x[i])
    return out


@njit(error_model="numpy")
def _ln_fast_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = K._ln_fast(x[i])
    return out


def _ulps(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|got - expected| in units of the spacing of the doubles at ``expected``."""
    return np.abs(got - expected) / np.spacing(np.abs(expected))


def test_exp_fast_is_within_1_ulp_of_libm_exp_on_a_dense_grid():
    """fdlibm's exp (e_exp.c) keeps its error below 1 ulp; against libm (also < 1 ulp) that is at
    most 1 ulp apart, on the whole range of the fast path and densely where the kernel uses it
    (-Brier in [-2, 0]; ln(10) x of log10 CJ), including the reduction's boundaries k ln2 / 2."""
    rng = np.random.default_rng(0)
    x = np.concatenate([
        np.linspace(-K._EXP_ARG_MAX, K._EXP_ARG_MAX, 400_001),
        np.linspace(-2.0, 0.0, 200_001),
        rng.uniform(-1e-6, 1e-6, 20_000),
        np.log(2.0) * (np.arange(-2040, 2041) / 2.0),  # ties of the rounding of x / ln 2
        np.nextafter(np.log(2.0) * (np.arange(-2040, 2041) / 2.0), np.inf),
    ])  # fmt: skip
    x = x[np.abs(x) <= K._EXP_ARG_MAX]
    got, expected = _exp_fast_all(x), np.exp(x)
    assert np.all(np.isfinite(got)) and np.all(got > 0)
    ulp = _ulps(got, expected)
    assert ulp.max() <= 1.0
    # And < 1 ulp from the exact value (80-bit long double as the reference, where available).
    if np.finfo(np.longdouble).nmant > 52:
        exact = np.exp(x.astype(np.longdouble))
        err = np.abs(got.astype(np.longdouble) - exact) / np.spacing(expected).astype(np.longdouble)
        assert float(err.max()) < 1.0


def test_exp_fast_edge_cases_and_libm_fallback():
    assert K._exp_fast(0.0) == 1.0 and K._exp_fast(-0.0) == 1.0  # log10 CJ's e^0 terms
    assert K._exp_core(0.0) == 1.0
    assert K._exp_fast(1.0) == pytest.approx(np.e, rel=2.3e-16)
    assert K._exp_fast(5e-324) == 1.0 and K._exp_fast(-5e-324) == 1.0
    outside = np.array(
        [-np.inf, -1000.0, -745.2, -709.0, -708.0001, 708.0001, 709.7, 710.0, np.inf]
    )
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_exp_fast_all(outside), np.exp(outside))  # libm's exactly
    assert np.isnan(K._exp_fast(np.nan))


@settings(max_examples=60, deadline=None)
@given(x=st.floats(min_value=-K._EXP_ARG_MAX, max_value=K._EXP_ARG_MAX))
def test_exp_fast_is_within_1_ulp_of_libm_exp(x):
    got, expected = K._exp_fast(x), math.exp(x)
    assert abs(got - expected) <= np.spacing(expected)


def test_ln_fast_is_fdlibm_log_of_log10_at_and_within_1_ulp_of_libm():
    """_ln_fast * (1 / ln 10) is _log10_at bit for bit (the same operations, bit casts in
    registers); _ln_fast is within 1 ulp of libm's log; outside the positive normals it is
    libm's."""
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.uniform(0.05, 1.5, 20_000), np.exp(rng.uniform(-700, 700, 20_000)),
        1.0 + rng.normal(0, 1e-9, 2000), [1.0, 2.0, 0.5, np.sqrt(2.0)],
    ])  # fmt: skip
    got = _ln_fast_all(x)
    np.testing.assert_array_equal(got * K._INV_LN10, _log10_at(x))
    ulp = _ulps(got, np.log(x))
    assert ulp[np.log(x) != 0].max() <= 1.0
    assert K._ln_fast(1.0) == 0.0
    odd = np.array([0.0, -0.0, 5e-324, 2e-310, -1.0, np.inf, -np.inf, np.nan])
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(_ln_fast_all(odd), np.log(odd))
    assert all(K._ln_ok(v) for v in (1.0, 2.3e-308, 1e308)) and not any(
        K._ln_ok(v) for v in (0.0, -0.0, 5e-324, -1.0, np.inf, np.nan)
    )


def run_brier_binary(batch: Batch, state, betas=None, alphas=None, rates=CJ_RATES):
    """K._brier_binary on P(y = 1) (binary batches), with the package's grid by default."""
    if betas is None:
        alphas, betas = naive.package_grid(2)
    return K._brier_binary(
        batch.p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets,
        np.ascontiguousarray(betas, dtype=float), np.ascontiguousarray(alphas, dtype=float),
        np.asarray(rates, float), *state,
    )  # fmt: skip


def _as_two_columns(batch: Batch) -> Batch:
    p2 = np.ascontiguousarray(np.column_stack([1.0 - batch.p, batch.p]))
    return Batch(p2, batch.y, batch.op_event, batch.op_kind, batch.op_offsets, batch.n_streams)


def brier_streams_batch(seed: int, n_streams: int, *, max_len: int = 25, n_long: int = 0,
                        long_len: int = 200) -> Batch:  # fmt: skip
    """``n_streams`` streams of 1..max_len events (the first ``n_long`` of ``long_len``), at random
    positions, unclipped scores with exact 0 and 1, and the operation mix of :func:`make_batch`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, n_streams)
    lengths[:n_long] = long_len
    n = int(lengths.sum())
    p = _scores(rng, n, 2, None)
    y = _labels(rng, p)
    positions = rng.permutation(n)
    op_event, op_kind, offsets, start = [], [], [0], 0
    for length in lengths:
        ops = stream_ops(rng, positions[start : start + length], 0.2, 0.15)
        start += length
        op_event += [e for e, _ in ops]
        op_kind += [kd for _, kd in ops]
        offsets.append(len(op_event))
    return Batch(
        p, y, np.array(op_event, np.int64), np.array(op_kind, np.int8),
        np.array(offsets, np.int64), n_streams,
    )  # fmt: skip


def _assert_close_to_generic(fast, generic, seen):
    """The binary kernel == _brier_compat to 1e-13 relative (absolute near 0): forecasts of class
    1, log10 CJ and SJ at the forecast events, and every part of the end state."""
    rel = 1e-13
    np.testing.assert_allclose(fast[0][seen], generic[0][seen, 1], rtol=rel, atol=1e-15)
    for got, exp in [(fast[1][seen], generic[1][seen]), (fast[2][seen], generic[2][seen]),
                     *zip(fast[3:], generic[3:], strict=True)]:  # fmt: skip
        np.testing.assert_allclose(got, exp, rtol=rel, atol=rel)
    assert np.array_equal(np.isnan(fast[0]), np.isnan(generic[0][:, 1]))
    assert np.array_equal(np.isnan(fast[1]), np.isnan(generic[1]))


@FEW
@given(seed=SEEDS, pi=st.sampled_from([0.5, 0.1, 0.9]))
def test_brier_binary_equals_generic_brier_kernel(seed, pi):
    batch = make_batch(seed, 2, max_streams=4, max_len=60, clip=None)
    state = brier_state(batch.n_streams, 3, 15, pi)
    fast = run_brier_binary(batch, state)
    alphas, betas = naive.package_grid(2)
    generic = run_brier(_as_two_columns(batch), betas, alphas, CJ_RATES, state)
    seen = batch.op_event[batch.op_kind != K.OP_UPDATE]
    _assert_close_to_generic(fast, generic, seen)


@pytest.mark.parametrize("n_streams", [3, 150])
@pytest.mark.parametrize("rates", [CJ_RATES, [0.3, 1e-3], [1.0, 0.1, 0.01, 1e-3, 1e-4]])
def test_brier_binary_equals_generic_for_any_rates_and_both_engines(n_streams, rates):
    """Default shape (3 rates: literal-size engines) and others (heap-scratch engines), few streams
    (one-stream engine) and many (lanes engine, then the one-stream engine for its tail)."""
    batch = brier_streams_batch(70 + n_streams, n_streams, n_long=2)
    state = brier_state(n_streams, len(rates), 15, 0.4)
    fast = run_brier_binary(batch, state, rates=rates)
    alphas, betas = naive.package_grid(2)
    generic = run_brier(_as_two_columns(batch), betas, alphas, rates, state)
    _assert_close_to_generic(fast, generic, batch.op_event[batch.op_kind != K.OP_UPDATE])


@settings(max_examples=10, deadline=None)
@given(seed=SEEDS)
def test_brier_binary_equals_package_recursion(seed):
    """Against the statement-by-statement transcription of protected-classification 0.1.5."""
    batch = make_batch(seed, 2, max_streams=3, max_len=40, clip=None)
    out_p, out_cj, out_sj, _, _, _, log_sj = run_brier_binary(
        batch, brier_state(batch.n_streams, 3, 15)
    )
    for s in range(batch.n_streams):
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_cj, exp_sj = naive.brier_compat(_as_matrix(ps), ys, CJ_RATES)
        idx = [i for i, e in enumerate(who) if e >= 0]
        events = [who[i] for i in idx]
        np.testing.assert_allclose(out_p[events], exp_p[idx, 1], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_cj[events], exp_cj[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_sj[events], exp_sj[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(log_sj[s], exp_sj[-1], rtol=0, atol=ATOL)


def test_brier_binary_lanes_engine_equals_package_recursion():
    batch = brier_streams_batch(81, 140, n_long=2, long_len=120)
    out_p, out_cj, out_sj, *_ = run_brier_binary(batch, brier_state(batch.n_streams, 3, 15))
    for s in [0, 1, *range(2, batch.n_streams, 17)]:
        ps, ys, who = naive_inputs(batch, s)
        exp_p, exp_cj, exp_sj = naive.brier_compat(_as_matrix(ps), ys, CJ_RATES)
        idx = [i for i, e in enumerate(who) if e >= 0]
        events = [who[i] for i in idx]
        np.testing.assert_allclose(out_p[events], exp_p[idx, 1], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_cj[events], exp_cj[idx], rtol=0, atol=ATOL)
        np.testing.assert_allclose(out_sj[events], exp_sj[idx], rtol=0, atol=ATOL)


def _assert_bitwise_stream(alone, together, batch, s):
    lo, hi = batch.op_offsets[s], batch.op_offsets[s + 1]
    seen = batch.op_event[lo:hi][batch.op_kind[lo:hi] != K.OP_UPDATE]
    for x, z in zip(alone[:3], together[:3], strict=True):
        np.testing.assert_array_equal(x[seen], z[seen])
    for x, z in zip(alone[3:], together[3:], strict=True):
        np.testing.assert_array_equal(x[0], z[s])


@FEW
@given(seed=SEEDS, n_long=st.sampled_from([0, 3]))
def test_brier_binary_stream_alone_equals_stream_in_a_batch_of_200_bit_for_bit(seed, n_long):
    """A stream's forecasts, log10 CJ / SJ and end state do not depend on the other streams of
    its batch, to the bit: alone it runs in the one-stream engine, in a batch of 200 in the SIMD
    lanes (long streams handed back to the one-stream engine mid-way)."""
    batch = brier_streams_batch(seed % 10_000, 200, n_long=n_long, long_len=150)
    state = brier_state(200, 3, 15, 0.5)
    together = run_brier_binary(batch, state)
    for s in [*range(n_long), *range(n_long, 200, 23)]:
        alone = run_brier_binary(stream_alone(batch, s), _state_slice(state, s))
        _assert_bitwise_stream(alone, together, batch, s)


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0), many=st.booleans())
def test_brier_binary_chunks_with_state_carried_equal_one_pass_bit_for_bit(seed, cut, many):
    """Resumable (DESIGN §4): each stream's ops split anywhere, chunk 1's end state fed to chunk 2,
    through the one-stream engine (few streams) or the lanes (200 streams): exactly one pass."""
    batch = brier_streams_batch(seed % 10_000, 200 if many else 3, max_len=40)
    state = brier_state(batch.n_streams, 3, 15)
    one = run_brier_binary(batch, state)
    first, second = split_each_stream(batch, cut)
    r1 = run_brier_binary(first, state)
    r2 = run_brier_binary(second, r1[3:])
    for i in range(3):
        np.testing.assert_array_equal(np.where(np.isnan(r2[i]), r1[i], r2[i]), one[i])
    for x, z in zip(r2[3:], one[3:], strict=True):
        np.testing.assert_array_equal(x, z)


def _engine_run(engine, batch: Batch, state):
    alphas, betas = naive.package_grid(2)
    passive, active, capital, log_sj = (np.array(x, copy=True) for x in state)
    out_p = np.full(batch.p.shape[0], np.nan)
    out_sj = np.full((batch.p.shape[0], 3), np.nan)
    args = (batch.p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets)
    grid = (np.array(betas), np.array(alphas), CJ_RATES)
    rest = (passive, active, capital, log_sj, out_p, out_sj)
    start = batch.op_offsets[:-1].copy()
    if engine is K._brier_lanes:
        order = np.arange(batch.n_streams)
        engine(*args, order, start, *grid, *rest)
        K._brier_streams(*args, start, *grid, *rest)  # the handed-back tails
    else:
        engine(*args, start, *grid, *rest)
    assert np.array_equal(start, batch.op_offsets[1:])
    return out_p, out_sj, passive, active, capital, log_sj


def test_brier_engines_equal_each_other_bit_for_bit():
    """The literal-size, stack-scratch one-stream engine of the default shape, the general one and
    the lanes engine run the same operations: identical outputs and end states, to the bit."""
    batch = brier_streams_batch(5, 140, n_long=3, long_len=90)
    state = brier_state(batch.n_streams, 3, 15, 0.3)
    engines = (K._brier_streams, K._brier_streams_3x15, K._brier_lanes)
    runs = [_engine_run(e, batch, state) for e in engines]
    for other in runs[1:]:
        for x, z in zip(runs[0], other, strict=True):
            np.testing.assert_array_equal(x, z)


def _steps_and_split(seed: int, n_streams: int) -> tuple[Batch, Batch, np.ndarray]:
    """The same labelled streams twice: all OP_STEP; and with some steps split into OP_FORECAST
    immediately followed by OP_UPDATE. Returns (steps, split, events that were split)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, n_streams)
    n = int(lengths.sum())
    p = _scores(rng, n, 2, None)
    y = _labels(rng, p)
    events = rng.permutation(n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    steps = Batch(p, y, events, np.zeros(n, np.int8), offsets, n_streams)
    mask = rng.random(n) < 0.4
    ev, kind, off = [], [], [0]
    for s in range(n_streams):
        for e in events[offsets[s] : offsets[s + 1]].tolist():
            ev += [e, e] if mask[e] else [e]
            kind += [K.OP_FORECAST, K.OP_UPDATE] if mask[e] else [K.OP_STEP]
        off.append(len(ev))
    split = Batch(p, y, np.array(ev, np.int64), np.array(kind, np.int8), np.array(off, np.int64),
                  n_streams)  # fmt: skip
    return steps, split, mask


@pytest.mark.parametrize("n_streams", [2, 130])
def test_brier_binary_forecast_then_update_on_same_event_equals_step(n_streams):
    """OP_FORECAST then OP_UPDATE on one event == one OP_STEP, to the bit (both engines): same
    forecasts and end states; log10 CJ / SJ equal where the event was not split (a split event
    records them before its label)."""
    steps, split, mask = _steps_and_split(91 + n_streams, n_streams)
    state = brier_state(n_streams, 3, 15)
    a, b = run_brier_binary(steps, state), run_brier_binary(split, state)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1][~mask], b[1][~mask])
    np.testing.assert_array_equal(a[2][~mask], b[2][~mask])
    for x, z in zip(a[3:], b[3:], strict=True):
        np.testing.assert_array_equal(x, z)


def test_brier_binary_family_holding_only_the_identity_returns_the_base():
    """Every expert predicts p: the substitution shortcut returns p (up to rounding) and the
    capital never moves (log10 SJ = log10 CJ = 0). T = 1 runs the general engines (L = 2)."""
    batch = make_batch(17, 2, max_streams=3, max_len=40, clip=None)
    seen = np.unique(batch.op_event[batch.op_kind != K.OP_UPDATE])
    out_p, out_cj, out_sj, *_ = run_brier_binary(
        batch, brier_state(batch.n_streams, 2, 1), [1.0], np.zeros((1, 2)), [0.3, 1e-3]
    )
    np.testing.assert_allclose(out_p[seen], batch.p[seen], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out_sj[seen], 0.0, atol=1e-12)
    np.testing.assert_allclose(out_cj[seen], 0.0, atol=1e-12)


@FEW
@given(seed=SEEDS)
def test_brier_binary_outputs_are_probabilities_and_purity(seed):
    """Forecasts in [0, 1] (base forecasts of exactly 0 and 1 included), finite martingales, NaN
    where an event is never forecast; inputs are never written."""
    batch = brier_streams_batch(seed % 10_000, 140, max_len=10)
    state = brier_state(batch.n_streams, 3, 15)
    args = (batch.p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets)
    before = _snapshot(*args, *state)
    out_p, out_cj, out_sj, passive, active, capital, log_sj = run_brier_binary(batch, state)
    for x, z in zip(before, [*args, *state], strict=True):
        np.testing.assert_array_equal(x, z)
    assert not any(
        np.shares_memory(o, i) for o in (passive, active, capital, log_sj) for i in state
    )
    seen = np.unique(batch.op_event[batch.op_kind != K.OP_UPDATE])
    unseen = np.setdiff1d(np.arange(batch.p.shape[0]), seen)
    assert np.all((out_p[seen] >= 0.0) & (out_p[seen] <= 1.0))
    assert np.all(np.isfinite(out_cj[seen])) and np.all(np.isfinite(out_sj[seen]))
    assert np.all(np.isnan(out_p[unseen])) and np.all(np.isnan(out_cj[unseen]))
    np.testing.assert_allclose(passive + active.sum(axis=(1, 2)), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(capital.sum(axis=2), 1.0, rtol=0, atol=1e-12)


def test_cj_rows_equals_the_package_log_mean_with_nan_and_inf_rows():
    """log10 CJ of each row (vectorised blocks and a tail) == log_mean([0, log_mean(SJ)]) to
    1e-12, extreme rows included; NaN rows (events never forecast) stay NaN; rows with inf go to
    the libm version."""
    rng = np.random.default_rng(9)
    lsj = rng.normal(0, 30, size=(203, 3))
    lsj[0] = [-500.0, -800.0, -2.0]
    lsj[1] = [900.0, 950.0, 10.0]
    lsj[2] = [-400.0, 0.0, 400.0]
    lsj[3] = [1e-300, -1e-300, 0.0]
    lsj[4] = [-np.inf, 1.0, 2.0]
    lsj[5] = np.nan
    lsj[150] = [np.inf, 0.0, 1.0]
    lsj[200] = np.nan
    got = K._cj_rows(np.ascontiguousarray(lsj))
    finite = np.isfinite(lsj).all(axis=1)
    expected = [naive._log_mean([0.0, naive._log_mean(list(row))]) for row in lsj[finite]]
    np.testing.assert_allclose(got[finite], expected, rtol=0, atol=1e-12)
    assert np.isnan(got[5]) and np.isnan(got[200])
    np.testing.assert_array_equal(got[[4, 150]], K._log10_cj_rows(lsj[[4, 150]]))
    np.testing.assert_array_equal(K._cj_rows(lsj[:7]), got[:7])  # a row's value: its own only
