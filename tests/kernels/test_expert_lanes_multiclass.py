"""calpipe.kernels.expert_lanes_multiclass (the default method's K-class kernel: online vector
scaling and the K-class mixture in SIMD lanes) against the kernels it replaces, bit for bit, and
against the paper oracles at 1e-12.

The reference is the per-input path as ``CompositeExperts`` runs it with ``engine="per-input"``:
each input's own kernel (``online_scaling`` with the vector model) over the operation list with a
forecast op on a copy of each delayed label's event, its forecasts floored and renormalised
(``clip_probabilities``), then the mixture one stream at a time
(``expert_mixture._multiclass``). Every stream's outputs, end state and input forecasts must
equal it to the bit, in lanes and one stream at a time, for K = 2, 3, 4 (and the heap scratch
of larger K), batches around the lane count, delayed labels and the state carried across
chunks; with online vector scaling (``ops``) and online matrix scaling (``oms``, the matrix
model) inputs, alone or together, up to ``config.OMS_MAX_CLASSES`` for ``oms``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calpipe import config
from calpipe.calibrators.gale import clip_probabilities
from calpipe.families import multiclass_family
from calpipe.kernels import expert_lanes_multiclass as EK
from calpipe.kernels import expert_mixture as EM
from calpipe.kernels import online_scaling as OS
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE, with_forecast_copies
from tests import naive_online_scaling as naive
from tests.calibrators.test_experts import loop
from tests.kernels.kernel_cases import FEW, SEEDS
from tests.kernels.ops import stream_ops

RATES = np.array(config.DEFAULT_JUMPING_RATES)
CLIP = config.DEFAULT_CLIP_EPS
LANES = config.EXPERT_LANES
RHO = config.OPS_RHO
GAP = 2  # each input's stored length and log10 S before its vector (carried unchanged)

# Input sets: (model, gamma, radius, score_clip), model "ops" (online vector scaling) or "oms"
# (online matrix scaling); radius 1.5 makes the ONS project.
INPUT_SETS = {
    "default": [("ops", 0.1, 100.0, 0.01)],
    "projections": [("ops", 0.5, 1.5, 0.05)],
    "two": [("ops", 0.1, 100.0, 0.01), ("ops", 0.5, 2.0, 0.2)],
    "base-only": [],
}
#: ... with online matrix scaling: alone, beside ops (the planned default), projecting
OMS_SETS = {
    "oms": [("oms", 0.1, 100.0, 0.01)],
    "ops-oms": [("ops", 0.1, 100.0, 0.01), ("oms", 0.1, 100.0, 0.01)],
    "oms-projections": [("oms", 0.5, 1.5, 0.05), ("ops", 0.5, 2.0, 0.2)],
}
MODELS = {"ops": OS.MODEL_VECTOR, "oms": OS.MODEL_MATRIX}
ROWS = {"ops": EK.ops_row, "oms": EK.oms_row}


def family(k, betas=config.EXPERT_COX_BETAS):
    return multiclass_family(k, "cox2", betas=betas, alpha_shifts=config.EXPERT_CLASS_SHIFTS)


def make_batch(seed, n_streams, k, max_len=40, p_delayed=0.2):
    """Streams of lengths 1..max_len of K-class rows (some with zeros, floored at the clip and
    renormalised as the calibrator passes them), events at random positions, steps, unlabelled
    forecasts and delayed labels (an update 1-5 ops later, possibly after the last event)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, n_streams)
    n = int(lengths.sum())
    p = rng.dirichlet(np.full(k, 0.6), n)
    p[rng.random(n) < 0.05, 0] = 0.0
    hot = rng.random(n) < 0.03  # one-hot rows: every other class at the floor
    p[hot] = np.eye(k)[rng.integers(0, k, int(hot.sum()))]
    x = clip_probabilities(p / p.sum(axis=1, keepdims=True), CLIP)
    tilt = x**0.7 / (x**0.7).sum(axis=1, keepdims=True)
    y = (tilt.cumsum(axis=1) < rng.random(n)[:, None]).sum(axis=1).clip(0, k - 1)
    positions = rng.permutation(n)
    ev, kd, off, at = [], [], [0], 0
    for length in lengths:
        ops = stream_ops(rng, positions[at : at + length], 0.1, p_delayed)
        at += length
        ev += [e for e, _ in ops]
        kd += [kk for _, kk in ops]
        off.append(len(ev))
    return x, y.astype(np.int64), np.array(ev, np.int64), np.array(kd, np.int8), np.array(off)


class State:
    """A packed state: P, A (R x E) on every identity, then per input [gap, theta, A]."""

    def __init__(self, n_streams, k, spec, fam, pi=0.5):
        n_in = 1 + len(spec)
        n_exp = n_in * fam.size
        act = np.zeros((len(RATES), n_exp))
        act[:, fam.identity_index :: fam.size] = (1 - pi) / (len(RATES) * n_in)
        parts = [np.full((n_streams, 1), pi), np.tile(act.ravel(), (n_streams, 1))]
        self.cols, at = [], 1 + act.size
        for model, *_ in spec:
            d = OS.n_params(MODELS[model], k)
            theta, a, _ = OS.initial_state(n_streams, MODELS[model], k, OS.CALIBEAT_NONE, 10, RHO)
            parts += [np.full((n_streams, GAP), 7.5), theta, a.reshape(n_streams, -1)]
            self.cols.append(at + GAP)
            at += GAP + d + d * d
        self.m = np.hstack(parts)
        self.log10m = np.zeros(n_streams)
        self.head = 1 + act.size
        self.spec = spec
        self.par = np.array([ROWS[m](*row) for m, *row in spec]).reshape(len(spec), EK.N_PAR)


def run_fused(batch, fam, state, m=None, log10m=None, lanes=None, **restart):
    x, y, ev, kd, off = batch
    return EK.composite_experts_multiclass(
        x, y, ev, kd, off, np.array(state.cols, np.int64), state.par, fam.betas, fam.alphas,
        RATES, CLIP, state.m if m is None else m, state.log10m if log10m is None else log10m,
        lanes=lanes, **restart,
    )  # fmt: skip


def run_reference(batch, fam, state, m=None, log10m=None, **restart):
    """The per-input path (CompositeExperts with engine="per-input", K classes)."""
    x, y, ev, kd, off = batch
    m = state.m if m is None else m
    log10m = state.log10m if log10m is None else log10m
    n, k = x.shape
    ext_ev, ext_kd, ext_off, src, pos, upd_only = with_forecast_copies(ev, kd, off, n)
    ext_ev[pos[upd_only]] = ext_ev[pos[upd_only] - 1]
    xe, ye = x[src], y[src]
    cols, fin = [xe], []
    new = m.copy()
    for c0, (model, gamma, radius, score_clip) in zip(state.cols, state.spec, strict=True):
        d = OS.n_params(MODELS[model], k)
        p, theta, a, _ = OS.online_scaling(
            xe, ye, ext_ev, ext_kd, ext_off, m[:, c0 : c0 + d],
            m[:, c0 + d : c0 + d + d * d].reshape(-1, d, d), np.zeros((m.shape[0], 0, 0)),
            MODELS[model], OS.CALIBEAT_NONE, gamma, radius, score_clip, 10,
        )  # fmt: skip
        new[:, c0 : c0 + d] = theta
        new[:, c0 + d : c0 + d + d * d] = a.reshape(a.shape[0], -1)
        cols.append(clip_probabilities(p, CLIP))
        fin.append(p[ext_ev[pos]])  # each input's forecast at each original op
    q = np.ascontiguousarray(np.stack(cols, axis=1))
    h = state.head
    p, lm, pw, act, lm_end = EM.expert_mixture_multiclass(
        q, ye, ext_ev, ext_kd, ext_off, fam.betas, fam.alphas, RATES, m[:, 0],
        m[:, 1:h].reshape(m.shape[0], len(RATES), -1), log10m, **restart,
    )  # fmt: skip
    new[:, 0] = pw
    new[:, 1:h] = act.reshape(m.shape[0], -1)
    return p[:n], lm[:n], new, lm_end, np.array(fin).reshape(len(fin), ev.shape[0], k)


def assert_same(got, want):
    names = ["p'", "log10 S", "state", "log10 S end", "input forecasts"]
    for name, g, w in zip(names, got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=name)


# ----------------------------------------------------------------------------------------------
# Bit for bit: lanes and one stream at a time == the per-input kernels
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_streams", [1, LANES - 1, LANES + 1, 2 * LANES, 2 * LANES + 1, 70])
@pytest.mark.parametrize("lanes", [True, False])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_lanes_equal_the_per_input_kernels_bit_for_bit(n_streams, lanes, k):
    batch = make_batch(n_streams * 7 + k, n_streams, k)
    fam = family(k)
    state = State(n_streams, k, INPUT_SETS["default"], fam)
    assert_same(run_fused(batch, fam, state, lanes=lanes), run_reference(batch, fam, state))


@pytest.mark.parametrize("n_streams", [1, LANES + 1, 2 * LANES + 1])
@pytest.mark.parametrize("lanes", [True, False])
@pytest.mark.parametrize("k", [3, 4])
def test_restarting_jumps_equal_the_per_input_kernels_bit_for_bit(n_streams, lanes, k):
    """A jump back to the inputs' identities with probability 1/2 (the default's ``restart``):
    the same bits as the per-input path, and another mixture than the uniform jumps."""
    batch = make_batch(n_streams * 5 + k, n_streams, k)
    fam = family(k)
    state = State(n_streams, k, INPUT_SETS["two"], fam)
    n_in = 1 + len(INPUT_SETS["two"])
    to = np.zeros(n_in * fam.size)
    to[fam.identity_index :: fam.size] = 1.0 / n_in
    kw = {"restart": 0.5, "restart_to": to}
    got = run_fused(batch, fam, state, lanes=lanes, **kw)
    assert_same(got, run_reference(batch, fam, state, **kw))
    assert not np.array_equal(got[0], run_fused(batch, fam, state, lanes=lanes)[0])


@pytest.mark.parametrize("which", sorted(INPUT_SETS))
@pytest.mark.parametrize("k", [3, 4])
def test_input_sets_equal_the_per_input_kernels_bit_for_bit(which, k):
    """Projections on the ball (radius 1.5), a wide score clip, two inputs, no input."""
    n_streams = 2 * LANES + 5
    batch = make_batch(len(which) + k, n_streams, k)
    fam = family(k)
    state = State(n_streams, k, INPUT_SETS[which], fam)
    for lanes in (True, False):
        assert_same(run_fused(batch, fam, state, lanes=lanes), run_reference(batch, fam, state))


@FEW
@given(seed=SEEDS, k=st.integers(2, 4), n_streams=st.integers(1, 3 * LANES + 2),
       which=st.sampled_from(sorted(INPUT_SETS)))  # fmt: skip
def test_random_batches_equal_the_per_input_kernels_bit_for_bit(seed, k, n_streams, which):
    """Many streams (more than one lane group), uneven lengths, delayed labels, by hypothesis."""
    batch = make_batch(seed, n_streams, k, max_len=50, p_delayed=0.3)
    fam = family(k)
    state = State(n_streams, k, INPUT_SETS[which], fam)
    assert_same(run_fused(batch, fam, state), run_reference(batch, fam, state))


def test_long_streams_handed_back_from_the_lanes_equal_the_reference():
    """A few long streams among many short ones: the lanes hand them back to the one-stream
    engine mid-way; every stream still equals the reference."""
    k = 3
    short = make_batch(10, 3 * LANES, k, max_len=15)
    long = make_batch(11, 3, k, max_len=400)
    n_long = long[0].shape[0]
    batch = (
        np.concatenate([long[0], short[0]]), np.concatenate([long[1], short[1]]),
        np.concatenate([long[2], short[2] + n_long]), np.concatenate([long[3], short[3]]),
        np.concatenate([long[4], short[4][1:] + long[4][-1]]),
    )  # fmt: skip
    fam = family(k)
    state = State(batch[4].shape[0] - 1, k, INPUT_SETS["default"], fam)
    assert_same(run_fused(batch, fam, state, lanes=True), run_reference(batch, fam, state))


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0), lanes=st.booleans(), k=st.integers(2, 4))
def test_two_chunks_with_state_carried_equal_one_pass_bit_for_bit(seed, cut, lanes, k):
    """Resumable (docs/ARCHITECTURE.md §4): labels of the first chunk's events arriving in the
    second included; and each chunk equals the per-input path from the same state."""
    n_streams = int(np.random.default_rng(seed).integers(1, 3 * LANES))
    batch = make_batch(seed, n_streams, k, max_len=30)
    x, y, ev, kd, off = batch
    fam = family(k)
    state = State(n_streams, k, INPUT_SETS["projections"], fam)
    one = run_fused(batch, fam, state, lanes=lanes)
    firsts, seconds, off1, off2 = [], [], [0], [0]
    for s in range(n_streams):
        ops = list(range(off[s], off[s + 1]))
        c = round(cut * len(ops))
        firsts += ops[:c]
        seconds += ops[c:]
        off1.append(len(firsts))
        off2.append(len(seconds))
    first = (x, y, ev[firsts], kd[firsts], np.array(off1))
    second = (x, y, ev[seconds], kd[seconds], np.array(off2))
    r1 = run_fused(first, fam, state, lanes=lanes)
    r2 = run_fused(second, fam, state, m=r1[2], log10m=r1[3], lanes=lanes)
    assert_same(r2, run_reference(second, fam, state, m=r1[2], log10m=r1[3]))
    for i in (0, 1):
        np.testing.assert_array_equal(np.where(np.isnan(r2[i]), r1[i], r2[i]), one[i])
    np.testing.assert_array_equal(r2[2], one[2])
    np.testing.assert_array_equal(r2[3], one[3])
    np.testing.assert_array_equal(np.concatenate([r1[4], r2[4]], axis=1)[:, np.argsort(
        np.concatenate([firsts, seconds]), kind="stable")], one[4])  # fmt: skip


@pytest.mark.parametrize("k", [5, 10])
def test_classes_beyond_the_stack_scratch_run_the_heap_lanes_with_the_same_bits(k):
    """K = 5 (the ONS step's scratch past config.EXPERT_LANE_ONS_DIM) and K = 10 (the weights
    past config.EXPERT_LANE_WEIGHTS: ``_lanes_heap``), and a general Cox slope (a pow)."""
    n_streams = 2 * LANES + 3
    batch = make_batch(8 + k, n_streams, k, max_len=25)
    fam = family(k, betas=(1.0, 1.3, 0.5))
    state = State(n_streams, k, INPUT_SETS["default"], fam)
    n_exp = 2 * fam.size
    assert 2 * k > config.EXPERT_LANE_ONS_DIM
    if k == 10:
        assert not EK.stack_fits(len(RATES), n_exp, k)
    assert_same(run_fused(batch, fam, state, lanes=True), run_reference(batch, fam, state))


# ----------------------------------------------------------------------------------------------
# Online matrix scaling (oms) in the lanes: alone and beside ops, bit for bit
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_streams", [1, LANES + 1, 2 * LANES + 1, 70])
@pytest.mark.parametrize("lanes", [True, False])
@pytest.mark.parametrize("which", sorted(OMS_SETS))
@pytest.mark.parametrize("k", [3, 4])
def test_oms_inputs_equal_the_per_input_kernels_bit_for_bit(n_streams, lanes, which, k):
    """("oms",), ("ops", "oms") and a projecting oms (||W = I|| = sqrt(K) > 1.5 at once)."""
    batch = make_batch(n_streams * 5 + k + len(which), n_streams, k)
    fam = family(k)
    state = State(n_streams, k, OMS_SETS[which], fam)
    got = run_fused(batch, fam, state, lanes=lanes)
    want = run_reference(batch, fam, state)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w, equal_nan=True)


@pytest.mark.parametrize("k", [5, 7])
def test_oms_beyond_the_stack_scratch_runs_the_heap_scratch_with_the_same_bits(k):
    """K = 5 (d = 30) and 7 (d = 56): the lanes' ONS step and resident inputs' state past
    config.EXPERT_LANE_ONS_DIM / EXPERT_LANE_INPUT_STATE (heap), the scalar scratch past its
    stack size at K = 7."""
    n_streams = 2 * LANES + 3
    batch = make_batch(20 + k, n_streams, k, max_len=12)
    fam = family(k)
    state = State(n_streams, k, OMS_SETS["ops-oms"], fam)
    assert k * k + k > config.EXPERT_LANE_ONS_DIM
    assert 2 * k + 4 * k * k + (k * k + k) ** 2 > config.EXPERT_LANE_INPUT_STATE
    for lanes in (True, False):
        assert_same(run_fused(batch, fam, state, lanes=lanes), run_reference(batch, fam, state))


def test_oms_at_its_largest_k_equals_the_per_input_kernels_bit_for_bit():
    """K = config.OMS_MAX_CLASSES (d = 272): short streams, in lanes."""
    k = config.OMS_MAX_CLASSES
    n_streams = LANES + 2
    batch = make_batch(16, n_streams, k, max_len=4)
    fam = family(k)
    state = State(n_streams, k, OMS_SETS["ops-oms"], fam)
    assert_same(run_fused(batch, fam, state, lanes=True), run_reference(batch, fam, state))


@FEW
@given(seed=SEEDS, k=st.integers(3, 5), n_streams=st.integers(1, 3 * LANES + 2),
       which=st.sampled_from(sorted(OMS_SETS)))  # fmt: skip
def test_random_batches_with_oms_equal_the_per_input_kernels_bit_for_bit(seed, k, n_streams, which):
    """Uneven lengths, delayed labels (p = 0.3), more streams than a lane group, by hypothesis."""
    batch = make_batch(seed, n_streams, k, max_len=40, p_delayed=0.3)
    fam = family(k)
    state = State(n_streams, k, OMS_SETS[which], fam)
    assert_same(run_fused(batch, fam, state), run_reference(batch, fam, state))


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0), lanes=st.booleans(), k=st.integers(3, 4))
def test_oms_two_chunks_with_state_carried_equal_one_pass_bit_for_bit(seed, cut, lanes, k):
    """Resumable with ("ops", "oms") inputs: each chunk equals the per-input path from the same
    state, and the two chunks equal one pass."""
    n_streams = int(np.random.default_rng(seed).integers(1, 3 * LANES))
    batch = make_batch(seed, n_streams, k, max_len=30)
    x, y, ev, kd, off = batch
    fam = family(k)
    state = State(n_streams, k, OMS_SETS["ops-oms"], fam)
    one = run_fused(batch, fam, state, lanes=lanes)
    firsts, seconds, off1, off2 = [], [], [0], [0]
    for s in range(n_streams):
        ops = list(range(off[s], off[s + 1]))
        c = round(cut * len(ops))
        firsts += ops[:c]
        seconds += ops[c:]
        off1.append(len(firsts))
        off2.append(len(seconds))
    first = (x, y, ev[firsts], kd[firsts], np.array(off1))
    second = (x, y, ev[seconds], kd[seconds], np.array(off2))
    r1 = run_fused(first, fam, state, lanes=lanes)
    assert_same(r1, run_reference(first, fam, state))
    r2 = run_fused(second, fam, state, m=r1[2], log10m=r1[3], lanes=lanes)
    assert_same(r2, run_reference(second, fam, state, m=r1[2], log10m=r1[3]))
    for i in (0, 1):
        np.testing.assert_array_equal(np.where(np.isnan(r2[i]), r1[i], r2[i]), one[i])
    np.testing.assert_array_equal(r2[2], one[2])
    np.testing.assert_array_equal(r2[3], one[3])
    np.testing.assert_array_equal(np.concatenate([r1[4], r2[4]], axis=1)[:, np.argsort(
        np.concatenate([firsts, seconds]), kind="stable")], one[4])  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The paper oracles (1e-12)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [3, 4])
def test_lanes_equal_online_vector_scaling_oracle_and_paper001_algorithm1(k):
    """One stream of steps: the input's forecasts are the per-event Online Newton Step loop's
    (tests/naive_online_scaling.py) and the protected forecasts and martingale are paper 001
    Algorithm 1 over them (tests/calibrators/test_experts.py)."""
    x, y, *_ = make_batch(12 + k, 1, k, max_len=200)
    n = x.shape[0]
    fam = family(k, betas=(1.0, 0.5))
    state = State(1, k, INPUT_SETS["default"], fam)
    batch = (x, y, np.arange(n), np.full(n, OP_STEP, np.int8), np.array([0, n]))
    p, m, *_, fin = run_fused(batch, fam, state, lanes=False)
    ops = naive.ons_stream(x, y, kind="vector", eps=RHO, clip=0.01)
    np.testing.assert_allclose(fin[0], ops, rtol=0, atol=1e-12)
    q = np.stack([x, clip_probabilities(ops, CLIP)], axis=1)
    want, log10s = loop(q, y, fam, RATES, 0.5)
    np.testing.assert_allclose(p, np.array(want), rtol=0, atol=1e-12)
    assert abs(m[-1] - log10s) < 1e-10


@pytest.mark.parametrize("k", [3, 4])
def test_lanes_equal_online_matrix_scaling_oracle_and_paper001_algorithm1(k):
    """("ops", "oms") in lanes (the stream among 2 LANES copies of itself): the oms input's
    forecasts are the per-event matrix scaling ONS loop's (naive.matrix_stream) and the
    protected forecasts and martingale paper 001 Algorithm 1 over the base and both inputs."""
    x, y, *_ = make_batch(40 + k, 1, k, max_len=150)
    n = x.shape[0]
    n_streams = 2 * LANES
    fam = family(k, betas=(1.0, 0.5))
    state = State(n_streams, k, OMS_SETS["ops-oms"], fam)
    xs, ys = np.tile(x, (n_streams, 1)), np.tile(y, n_streams)
    batch = (xs, ys, np.arange(n * n_streams), np.full(n * n_streams, OP_STEP, np.int8),
             np.arange(n_streams + 1) * n)  # fmt: skip
    p, m, *_, fin = run_fused(batch, fam, state, lanes=True)
    ops = naive.ons_stream(x, y, kind="vector", eps=RHO, clip=0.01)
    oms = naive.ons_stream(x, y, kind="matrix", eps=RHO, clip=0.01)
    q = np.stack([x, clip_probabilities(ops, CLIP), clip_probabilities(oms, CLIP)], axis=1)
    want, log10s = loop(q, y, fam, RATES, 0.5)
    for s in (0, n_streams - 1):
        at = slice(s * n, (s + 1) * n)
        np.testing.assert_allclose(fin[1, at], oms, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fin[0, at], ops, rtol=0, atol=1e-12)
        np.testing.assert_allclose(p[at], np.array(want), rtol=0, atol=1e-12)
        assert abs(m[at][-1] - log10s) < 1e-10


def test_an_update_only_op_uses_the_inputs_forecast_at_the_labels_time():
    """A delayed label: the mixture's Bayes step reads the input's forecast made when the label
    arrives (after it learnt the labels in between), not the one made at the event."""
    x = clip_probabilities(np.array([[0.3, 0.5, 0.2], [0.8, 0.1, 0.1], [0.2, 0.2, 0.6],
                                     [0.1, 0.7, 0.2]]), CLIP)  # fmt: skip
    y = np.array([1, 0, 2, 1])
    ev = np.array([0, 1, 2, 0, 3])
    kd = np.array([OP_FORECAST, OP_STEP, OP_STEP, OP_UPDATE, OP_FORECAST], np.int8)
    fam = family(3)
    state = State(1, 3, INPUT_SETS["default"], fam)
    batch = (x, y, ev, kd, np.array([0, 5]))
    got = run_fused(batch, fam, state, lanes=False)
    assert not np.array_equal(got[4][0, 3], got[4][0, 0])  # OPS moved between event and label
    assert_same(got, run_reference(batch, fam, state))


@pytest.mark.parametrize("k", [*range(2, 20), 31, 64, 127, 128])
def test_np_row_sum_is_numpys_sum(k):
    """The renormalisation of clip_probabilities divides by numpy's sum of the row: the
    kernel's np_row_sum reproduces its order (sequential below 8, pairwise blocks of 8)."""
    rng = np.random.default_rng(k)
    w = rng.random((300, k)) * 10.0 ** rng.integers(-9, 3, (300, k))
    want = w.sum(axis=1, keepdims=True)[:, 0]
    got = np.array([EK.np_row_sum(row, k) for row in w])
    np.testing.assert_array_equal(got, want)


def test_arguments_are_checked_and_not_modified():
    k = 3
    batch = make_batch(1, 3, k)
    fam = family(k)
    state = State(3, k, INPUT_SETS["default"], fam)
    before = state.m.copy(), state.log10m.copy()
    run_fused(batch, fam, state, lanes=True)
    np.testing.assert_array_equal(state.m, before[0])  # inputs are not modified
    np.testing.assert_array_equal(state.log10m, before[1])
    x, y, ev, kd, off = batch
    args = (np.array(state.cols), state.par, fam.betas, fam.alphas, RATES, CLIP)
    with pytest.raises(ValueError, match="state must be"):
        EK.composite_experts_multiclass(x, y, ev, kd, off, *args, state.m[:, :5], state.log10m)
    with pytest.raises(ValueError, match="inside the mixture"):
        EK.composite_experts_multiclass(x, y, ev, kd, off, np.array([3]), *args[1:], state.m,
                                        state.log10m)  # fmt: skip
    bad = y.copy()
    bad[ev[kd != OP_FORECAST][0]] = k
    with pytest.raises(ValueError, match="labels read at update ops"):
        EK.composite_experts_multiclass(x, bad, ev, kd, off, *args, state.m, state.log10m)
    with pytest.raises(ValueError, match="alphas"):
        EK.composite_experts_multiclass(x, y, ev, kd, off, *args[:3], fam.alphas[:, :2],
                                        *args[4:], state.m, state.log10m)  # fmt: skip
