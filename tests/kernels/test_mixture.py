"""The log-loss mixture kernels (calpipe/kernels/mixture.py) against the paper oracles of
tests/naive.py: Jumper and Mean Jumper (paper 000 Algorithms 1-2), Composite Jumper (paper 001
Algorithm 1), binary and K classes, and the multi-stream lanes engine bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calpipe import families
from calpipe.kernels import ops as O
from tests import naive
from tests.kernels.kernel_cases import (
    ATOL,
    CJ_RATES,
    FEW,
    LANE_STREAMS,
    SEEDS,
    Batch,
    case_labels,
    case_scores,
    case_state_slice,
    cj_state,
    jumper_state,
    make_batch,
    mean_jumper_state,
    naive_inputs,
    run_binary,
    run_multiclass,
    split_each_stream,
    stream_alone,
)

BINARY_FAMILIES = ["quadratic", "cubic", "cox", "cox2"]

LANE_CASES = {  # name: (family, rates, state builder (n_streams, n_fun) -> state)
    "composite-jumper": ("cox2", CJ_RATES, lambda s, t: cj_state(s, 3, t, 0.5)),
    "jumper-quadratic": ("quadratic", [0.01], jumper_state),
    "jumper-cubic": ("cubic", [0.1], jumper_state),
    "mean-jumper-cox": ("cox", [1.0, 0.1, 0.01, 0.001], lambda s, t: mean_jumper_state(s, 4, t)),
}


# ----------------------------------------------------------------------------------------------
# The naive oracles agree with each other (paper 000 Lemma 1)
# ----------------------------------------------------------------------------------------------
@FEW
@given(seed=SEEDS, name=st.sampled_from(BINARY_FAMILIES), jump=st.sampled_from([1.0, 0.1, 1e-3]))
def test_naive_jumper_algorithm1_martingale_is_algorithm2_gale_ratio(seed, name, jump):
    """Lemma 1 of paper 000: log10 S_n (Alg. 1) = sum_i log10 p'_i(y_i) - log10 p_i(y_i) (Alg. 2)."""
    rng = np.random.default_rng(seed)
    p = case_scores(rng, 120, 2, 1e-3)
    y = case_labels(rng, p)
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
        alone = run_binary(stream_alone(batch, s), fam, rates, case_state_slice(state, s))
        lo, hi = batch.op_offsets[s], batch.op_offsets[s + 1]
        seen = batch.op_event[lo:hi][batch.op_kind[lo:hi] != O.OP_UPDATE]
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
    """Resumable (docs/ARCHITECTURE.md §4) through the lanes engine: the chunked run is the one pass, exactly."""
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


def compare_stream(batch, s, got_p, got_m, exp_p, exp_m, who):
    """Kernel outputs at the events forecast by stream s == the naive sequence at those steps."""
    idx = [i for i, e in enumerate(who) if e >= 0]
    events = [who[i] for i in idx]
    np.testing.assert_allclose(got_p[events], np.array([exp_p[i] for i in idx]), rtol=0, atol=ATOL)
    np.testing.assert_allclose(got_m[events], np.array([exp_m[i] for i in idx]), rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# Initial states (from the papers)
# ----------------------------------------------------------------------------------------------
def many_streams_batch(seed: int, *, n_long: int = 0, long_len: int = 300) -> Batch:
    """LANE_STREAMS short streams of unequal lengths (events at random positions; OP_STEP,
    unlabelled OP_FORECAST, or OP_FORECAST with its OP_UPDATE 1-3 operations later); the first
    ``n_long`` streams are ``long_len`` events long, so the lanes run nearly empty while they
    are still going and must hand them back."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 20, LANE_STREAMS)
    lengths[:n_long] = long_len
    n = int(lengths.sum())
    p = case_scores(rng, n, 2, 1e-3)
    y = case_labels(rng, p)
    positions = rng.permutation(n)
    op_event, op_kind, offsets, start = [], [], [0], 0
    for length in lengths:
        ops: list[tuple[int, int]] = []
        late: list[tuple[int, int]] = []
        for e in positions[start : start + length].tolist():
            u = rng.random()
            kind = O.OP_STEP if u < 0.7 else O.OP_FORECAST
            ops.append((e, kind))
            if 0.85 <= u:
                late.append((len(ops) + int(rng.integers(1, 4)), e))
            for due, ev in list(late):
                if due <= len(ops):
                    ops.append((ev, O.OP_UPDATE))
                    late.remove((due, ev))
        ops += [(ev, O.OP_UPDATE) for _, ev in late]
        start += length
        op_event += [e for e, _ in ops]
        op_kind += [kd for _, kd in ops]
        offsets.append(len(op_event))
    return Batch(
        p, y, np.array(op_event, np.int64), np.array(op_kind, np.int8),
        np.array(offsets, np.int64), LANE_STREAMS,
    )  # fmt: skip


@pytest.mark.parametrize("family", ["cox2", "quadratic", "cubic"])
def test_binary_event_one_at_a_time_equals_the_batch_kernel(family):
    """binary_event (the online form, calpipe.river) runs the batch recursion on its own
    buffers: forecast then update per event = the batch's steps bit for bit, and a forecast
    leaves the buffers as they were."""
    from calpipe.kernels.mixture import binary_event, mixture_binary

    fam = families.binary_family(family)
    rates = np.array([1e-2, 1e-3, 1e-4])
    rng = np.random.default_rng(5)
    p = rng.uniform(0.01, 0.99, 300)
    y = (rng.uniform(size=300) < p**2).astype(np.int8)
    a0 = np.full((1, 3, fam.size), 0.5 / (3 * fam.size))
    want = mixture_binary(
        p, y, np.arange(300), np.zeros(300, np.int8), np.array([0, 300]), fam.code, fam.params,
        rates, np.array([0.5]), a0, np.zeros(1),
    )  # fmt: skip
    a, pm = a0[0].ravel().copy(), np.array([0.5, 0.0])
    got = np.empty(300)
    for i in range(300):
        before = a.copy(), pm.copy()
        got[i] = binary_event(p[i], 0, O.OP_FORECAST, fam.code, fam.params, rates, a, pm)
        np.testing.assert_array_equal(a, before[0])
        np.testing.assert_array_equal(pm, before[1])
        assert np.isnan(binary_event(p[i], y[i], O.OP_UPDATE, fam.code, fam.params, rates, a, pm))
    np.testing.assert_array_equal(got, want[0])
    np.testing.assert_array_equal(a, want[3][0].ravel())
    assert (pm[0], pm[1]) == (want[2][0], want[4][0])
