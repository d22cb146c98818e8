"""The Brier compatibility kernels (calpipe/kernels/brier_compat.py, brier_binary.py) against a
transcription of protected-classification 0.1.5 (tests/naive.py) and against each other."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.kernels import brier_binary as BB
from calpipe.kernels import brier_compat as B
from calpipe.kernels import ops as O
from tests import naive
from tests.kernels.kernel_cases import (
    ATOL,
    CJ_RATES,
    FEW,
    SEEDS,
    Batch,
    brier_state,
    case_labels,
    case_scores,
    case_snapshot,
    case_state_slice,
    make_batch,
    naive_inputs,
    run_brier,
    split_each_stream,
    stream_alone,
)
from tests.kernels.ops import stream_ops


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


@FEW
@given(seed=SEEDS, pi=st.sampled_from([0.5, 0.1, 0.9]))
def test_brier_binary_equals_generic_brier_kernel(seed, pi):
    batch = make_batch(seed, 2, max_streams=4, max_len=60, clip=None)
    state = brier_state(batch.n_streams, 3, 15, pi)
    fast = run_brier_binary(batch, state)
    alphas, betas = naive.package_grid(2)
    generic = run_brier(_as_two_columns(batch), betas, alphas, CJ_RATES, state)
    seen = batch.op_event[batch.op_kind != O.OP_UPDATE]
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
    _assert_close_to_generic(fast, generic, batch.op_event[batch.op_kind != O.OP_UPDATE])


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
        alone = run_brier_binary(stream_alone(batch, s), case_state_slice(state, s))
        _assert_bitwise_stream(alone, together, batch, s)


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0), many=st.booleans())
def test_brier_binary_chunks_with_state_carried_equal_one_pass_bit_for_bit(seed, cut, many):
    """Resumable (docs/ARCHITECTURE.md §4): each stream's ops split anywhere, chunk 1's end state fed to chunk 2,
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


def test_brier_engines_equal_each_other_bit_for_bit():
    """The literal-size, stack-scratch one-stream engine of the default shape, the general one and
    the lanes engine run the same operations: identical outputs and end states, to the bit."""
    batch = brier_streams_batch(5, 140, n_long=3, long_len=90)
    state = brier_state(batch.n_streams, 3, 15, 0.3)
    engines = (BB.brier_streams, BB.brier_streams_3x15, BB.brier_lanes)
    runs = [_engine_run(e, batch, state) for e in engines]
    for other in runs[1:]:
        for x, z in zip(runs[0], other, strict=True):
            np.testing.assert_array_equal(x, z)


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
    seen = np.unique(batch.op_event[batch.op_kind != O.OP_UPDATE])
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
    before = case_snapshot(*args, *state)
    out_p, out_cj, out_sj, passive, active, capital, log_sj = run_brier_binary(batch, state)
    for x, z in zip(before, [*args, *state], strict=True):
        np.testing.assert_array_equal(x, z)
    assert not any(
        np.shares_memory(o, i) for o in (passive, active, capital, log_sj) for i in state
    )
    seen = np.unique(batch.op_event[batch.op_kind != O.OP_UPDATE])
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
    got = B.cj_rows(np.ascontiguousarray(lsj))
    finite = np.isfinite(lsj).all(axis=1)
    expected = [naive.log_mean([0.0, naive.log_mean(list(row))]) for row in lsj[finite]]
    np.testing.assert_allclose(got[finite], expected, rtol=0, atol=1e-12)
    assert np.isnan(got[5]) and np.isnan(got[200])
    np.testing.assert_array_equal(got[[4, 150]], B.log10_cj_rows(lsj[[4, 150]]))
    np.testing.assert_array_equal(B.cj_rows(lsj[:7]), got[:7])  # a row's value: its own only


def _as_matrix(ps: list) -> np.ndarray:
    """Naive scores as an (n, K) matrix (binary P(y=1) -> columns (1 - p, p))."""
    arr = np.array(ps, dtype=np.float64)
    return arr if arr.ndim == 2 else np.column_stack([1.0 - arr, arr])


def run_brier_binary(batch: Batch, state, betas=None, alphas=None, rates=CJ_RATES):
    """B.brier_binary on P(y = 1) (binary batches), with the package's grid by default."""
    if betas is None:
        alphas, betas = naive.package_grid(2)
    return B.brier_binary(
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
    p = case_scores(rng, n, 2, None)
    y = case_labels(rng, p)
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


def _assert_bitwise_stream(alone, together, batch, s):
    lo, hi = batch.op_offsets[s], batch.op_offsets[s + 1]
    seen = batch.op_event[lo:hi][batch.op_kind[lo:hi] != O.OP_UPDATE]
    for x, z in zip(alone[:3], together[:3], strict=True):
        np.testing.assert_array_equal(x[seen], z[seen])
    for x, z in zip(alone[3:], together[3:], strict=True):
        np.testing.assert_array_equal(x[0], z[s])


def _engine_run(engine, batch: Batch, state):
    alphas, betas = naive.package_grid(2)
    passive, active, capital, log_sj = (np.array(x, copy=True) for x in state)
    out_p = np.full(batch.p.shape[0], np.nan)
    out_sj = np.full((batch.p.shape[0], 3), np.nan)
    args = (batch.p, batch.y, batch.op_event, batch.op_kind, batch.op_offsets)
    grid = (np.array(betas), np.array(alphas), CJ_RATES)
    rest = (passive, active, capital, log_sj, out_p, out_sj)
    start = batch.op_offsets[:-1].copy()
    if engine is BB.brier_lanes:
        order = np.arange(batch.n_streams)
        engine(*args, order, start, *grid, *rest)
        BB.brier_streams(*args, start, *grid, *rest)  # the handed-back tails
    else:
        engine(*args, start, *grid, *rest)
    assert np.array_equal(start, batch.op_offsets[1:])
    return out_p, out_sj, passive, active, capital, log_sj


def _steps_and_split(seed: int, n_streams: int) -> tuple[Batch, Batch, np.ndarray]:
    """The same labelled streams twice: all OP_STEP; and with some steps split into OP_FORECAST
    immediately followed by OP_UPDATE. Returns (steps, split, events that were split)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, n_streams)
    n = int(lengths.sum())
    p = case_scores(rng, n, 2, None)
    y = case_labels(rng, p)
    events = rng.permutation(n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    steps = Batch(p, y, events, np.zeros(n, np.int8), offsets, n_streams)
    mask = rng.random(n) < 0.4
    ev, kind, off = [], [], [0]
    for s in range(n_streams):
        for e in events[offsets[s] : offsets[s + 1]].tolist():
            ev += [e, e] if mask[e] else [e]
            kind += [O.OP_FORECAST, O.OP_UPDATE] if mask[e] else [O.OP_STEP]
        off.append(len(ev))
    split = Batch(p, y, np.array(ev, np.int64), np.array(kind, np.int8), np.array(off, np.int64),
                  n_streams)  # fmt: skip
    return steps, split, mask
