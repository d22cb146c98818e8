"""Operation-list semantics (calpipe/kernels/ops.py) for every recursive kernel: forecast then
update equals a step, chunks with the state carried equal one pass, purity, valid outputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe import families
from calpipe.kernels import brier_compat as B
from calpipe.kernels import mixture as M
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
    cj_state,
    make_batch,
    run_binary,
    run_brier,
    run_multiclass,
    split_each_stream,
)


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


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0))
def test_two_chunks_with_state_carried_equal_one_pass(seed, cut):
    """Resumable (docs/ARCHITECTURE.md §4): ops split anywhere per stream, state of chunk 1 fed to chunk 2."""
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


def test_kernels_do_not_mutate_their_inputs():
    batch = make_batch(21, max_streams=3)
    fam = families.binary_family("cox2")
    state = cj_state(batch.n_streams, 3, fam.size)
    args = (batch.p, batch.y.astype(np.int8), batch.op_event, batch.op_kind, batch.op_offsets)
    before = case_snapshot(*args, fam.params, CJ_RATES, *state)
    out = M.mixture_binary(*args, fam.code, fam.params, CJ_RATES, *state)
    for x, z in zip(before, [*args, fam.params, CJ_RATES, *state], strict=True):
        np.testing.assert_array_equal(x, z)
    assert out[3] is not state[1] and not np.shares_memory(out[3], state[1])

    mb = make_batch(22, 4, max_streams=2)
    mf = families.multiclass_family(4)
    mstate = cj_state(mb.n_streams, 3, mf.size)
    margs = (mb.p, mb.y, mb.op_event, mb.op_kind, mb.op_offsets, mf.betas.copy(), mf.alphas)
    before = case_snapshot(*margs, CJ_RATES, *mstate)
    M.mixture_multiclass(*margs, CJ_RATES, *mstate)
    for x, z in zip(before, [*margs, CJ_RATES, *mstate], strict=True):
        np.testing.assert_array_equal(x, z)

    bstate = brier_state(mb.n_streams, 3, mf.size)
    before = case_snapshot(*margs, CJ_RATES, *bstate)
    B.brier_compat(*margs, CJ_RATES, *bstate)
    for x, z in zip(before, [*margs, CJ_RATES, *bstate], strict=True):
        np.testing.assert_array_equal(x, z)


@FEW
@given(seed=SEEDS, k=st.sampled_from([2, 3, 6]))
def test_family_holding_only_the_identity_returns_the_base(seed, k):
    """Every mixture of copies of p is p: protected == base, log10 martingale == 0 (log loss);
    Brier mode's substitution shortcut also returns p exactly when every expert predicts p."""
    batch = make_batch(seed, k, max_streams=2, max_len=40)
    seen = np.unique(batch.op_event[batch.op_kind != O.OP_UPDATE])
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
    seen = np.unique(batch.op_event[batch.op_kind != O.OP_UPDATE])
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
    seen = np.unique(raw.op_event[raw.op_kind != O.OP_UPDATE])
    assert np.all((b_p[seen] >= 0.0) & (b_p[seen] <= 1.0))
    np.testing.assert_allclose(b_p[seen].sum(axis=1), 1.0, atol=ATOL)
    assert np.all(np.isfinite(b_cj[seen])) and np.all(np.isfinite(b_sj[seen]))


def test_composite_jumper_log10_cj_rows_match_package_log_mean():
    rng = np.random.default_rng(5)
    lsj = rng.normal(0, 30, size=(6, 3))
    lsj[0] = [-500.0, -800.0, -2.0]  # large negative: CJ -> log10(1/2)
    lsj[1] = [900.0, 950.0, 10.0]  # large positive: no overflow
    got = B.log10_cj_rows(np.ascontiguousarray(lsj))
    expected = [naive.log_mean([0.0, naive.log_mean(list(row))]) for row in lsj]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert np.isfinite(got).all()


# ----------------------------------------------------------------------------------------------
# Operation semantics, purity, invariants
# ----------------------------------------------------------------------------------------------
def _step_and_split_batches(seed: int, k: int, clip: float | None = 1e-3):
    """The same labelled stream twice: all OP_STEP; and with some steps split into OP_FORECAST
    immediately followed by OP_UPDATE. Returns (steps, split, events that were split)."""
    rng = np.random.default_rng(seed)
    n = 80
    p = case_scores(rng, n, k, clip)
    y = case_labels(rng, p)
    split_mask = rng.random(n) < 0.4
    ev, kind = [], []
    for e in range(n):
        if split_mask[e]:
            ev += [e, e]
            kind += [O.OP_FORECAST, O.OP_UPDATE]
        else:
            ev.append(e)
            kind.append(O.OP_STEP)
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


def _delayed_oracle(counts, te, timed, tl, step, plen, p_tl):
    """The operation list of delayed labels as a 4-key lexsort of all operations by (stream,
    time, phase, seq): events phase 0 (seq = event), timed updates phase 1 (seq = event, or
    the pending position - m < 0: pending first); updates at or after the stream's last event
    time deferred, in (stream, time, seq) order."""
    n, m = te.shape[0], p_tl.shape[0]
    sid = np.repeat(np.arange(counts.shape[0]), counts)
    p_sid = np.repeat(np.arange(counts.shape[0]), plen)
    horizon = te[np.cumsum(counts) - 1]
    lab = np.flatnonzero(timed)
    u_sid = np.concatenate([sid[lab], p_sid]).astype(np.int64)
    u_t = np.concatenate([tl[lab], p_tl]).astype(np.int64)
    u_seq = np.concatenate([lab, np.arange(m) - m]).astype(np.int64)
    u_ev = np.concatenate([lab, n + np.arange(m)]).astype(np.int64)
    now = u_t < horizon[u_sid]
    order = np.lexsort((
        np.concatenate([np.arange(n), u_seq[now]]),
        np.concatenate([np.zeros(n, np.int64), np.ones(int(now.sum()), np.int64)]),
        np.concatenate([te, u_t[now]]),
        np.concatenate([sid, u_sid[now]]),
    ))  # fmt: skip
    ev = np.concatenate([np.arange(n), u_ev[now]])[order]
    kind = np.concatenate([np.where(step, O.OP_STEP, O.OP_FORECAST),
                           np.full(int(now.sum()), O.OP_UPDATE)])[order]  # fmt: skip
    op_sid = np.concatenate([sid, u_sid[now]])
    offsets = np.concatenate([[0], np.cumsum(np.bincount(op_sid, minlength=counts.shape[0]))])
    applied = np.bincount(np.concatenate([u_sid[now], sid[step]]), minlength=counts.shape[0])
    d = np.lexsort((u_seq[~now], u_t[~now], u_sid[~now]))
    d_offsets = np.concatenate([[0], np.cumsum(np.bincount(u_sid[~now][d],
                                                           minlength=counts.shape[0]))])  # fmt: skip
    return ev, kind, offsets, applied, u_ev[~now][d], u_t[~now][d], d_offsets


@settings(max_examples=300, deadline=None)
@given(
    n_streams=st.integers(1, 4), n=st.integers(0, 40), m=st.integers(0, 20),
    t_range=st.integers(1, 6), seed=st.integers(0, 2**32 - 1), sorted_pending=st.booleans(),
)  # fmt: skip
def test_delayed_op_list_equals_the_four_key_lexsort(n_streams, n, m, t_range, seed,
                                                     sorted_pending):  # fmt: skip
    """Ties everywhere (few streams, few distinct times: events, pending and new updates at one
    time), label times before, at and after each stream's last event, labels known at their
    event beside timed ones; pending lists in their apply order (as a batch leaves them) or
    not (a state written by hand)."""
    rng = np.random.default_rng(seed)
    counts = np.bincount(rng.integers(0, n_streams, n + n_streams), minlength=n_streams)
    counts = counts[counts > 0]  # every stream of a batch has an event
    n = int(counts.sum())
    te = np.concatenate([np.sort(rng.integers(-t_range, t_range, c)) for c in counts])
    known = rng.random(n) < 0.6
    timed = known & (rng.random(n) < 0.7)
    step = known & ~timed
    tl = np.where(timed, te + rng.integers(0, 2 * t_range, n), 0)
    plen = rng.multinomial(m, np.ones(counts.shape[0]) / counts.shape[0])
    p_tl = [rng.integers(-2 * t_range, 2 * t_range, c) for c in plen]
    p_tl = np.concatenate([np.sort(p) if sorted_pending else p for p in p_tl])
    got = O.delayed_op_list(counts, te, timed, tl, step, plen, p_tl.astype(np.int64))
    want = _delayed_oracle(counts, te, timed, tl, step, plen, p_tl)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_delayed_op_list_refuses_a_stream_without_events():
    with pytest.raises(ValueError, match="at least one event of every stream"):
        O.delayed_op_list(np.array([1, 0]), np.array([0]), np.zeros(1, bool),
                          np.zeros(1, np.int64), np.zeros(1, bool), np.array([0, 1]),
                          np.array([3]))  # fmt: skip


def test_delayed_op_list_refuses_event_times_out_of_replay_order():
    with pytest.raises(ValueError, match="stream 1: its event times decrease"):
        O.delayed_op_list(np.array([1, 2]), np.array([0, 5, 3]), np.zeros(3, bool),
                          np.zeros(3, np.int64), np.zeros(3, bool), np.array([0, 0]),
                          np.zeros(0, np.int64))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    n_streams=st.integers(1, 4), m=st.integers(0, 15), r=st.integers(0, 25),
    t_range=st.integers(1, 5), width=st.sampled_from([1, 3]), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_pending_in_apply_order_equals_a_stable_sort_by_stream_and_time(
    n_streams, m, r, t_range, width, seed
):
    """The oracle: the pending labels (flattened by stream) followed by the new ones in ``seq``
    order, stably sorted by (stream, time) with numpy's lexsort; ties everywhere."""
    rng = np.random.default_rng(seed)
    n_pend = rng.multinomial(m, np.ones(n_streams) / n_streams)
    p_t = rng.integers(0, t_range, m)
    p_y, p_sc = rng.integers(0, 2, m), rng.random((m, width))
    new_sid = rng.integers(0, n_streams, r)
    seq = np.lexsort((rng.random(r), new_sid))  # grouped by stream, any order within
    new_t, new_y, new_sc = (
        rng.integers(0, t_range, r),
        rng.integers(0, 2, r),
        rng.random((r, width)),
    )
    sid = np.concatenate([np.repeat(np.arange(n_streams), n_pend), new_sid[seq]])
    t = np.concatenate([p_t, new_t[seq]])
    o = np.lexsort((t, sid))
    sq = (lambda a: a[:, 0]) if width == 1 else (lambda a: a)
    got = O.pending_in_apply_order(n_pend, p_t, p_y, sq(p_sc), new_sid, seq, new_t, new_y,
                                   sq(new_sc))  # fmt: skip
    np.testing.assert_array_equal(got[0], t[o])
    np.testing.assert_array_equal(got[1], np.concatenate([p_y, new_y[seq]])[o])
    np.testing.assert_array_equal(got[2], sq(np.concatenate([p_sc, new_sc[seq]])[o]))
    counts = np.bincount(sid, minlength=n_streams)
    np.testing.assert_array_equal(got[3], np.concatenate([[0], np.cumsum(counts)]))


def test_pending_in_apply_order_refuses_new_labels_not_grouped_by_stream():
    with pytest.raises(ValueError, match="not grouped by stream"):
        O.pending_in_apply_order(np.zeros(2, np.int64), [], [], [], np.array([0, 1, 0]),
                                 np.array([0, 1, 2]), np.array([1, 2, 3]), np.array([0, 1, 0]),
                                 np.array([0.1, 0.2, 0.3]))  # fmt: skip
