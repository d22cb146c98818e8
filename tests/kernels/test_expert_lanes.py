"""calpipe.kernels.expert_lanes (the default method's kernel: inputs and mixture in SIMD lanes)
against the kernels it replaces, bit for bit, and against the paper oracles at 1e-12.

The reference is the per-input path as ``CompositeExperts`` ran it before lanes: each input's own
kernel (:mod:`calpipe.kernels.online_scaling`, :mod:`calpipe.kernels.decay_beta`) over the
operation list with a forecast op on a copy of each delayed label's event, then the mixture one
stream at a time (``expert_mixture._binary``). Every stream's outputs, end state and input
forecasts must equal it to the bit, in lanes and one stream at a time, for batches around the
lane count, with delayed labels and with the state carried across chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calpipe import config
from calpipe.families import binary_family
from calpipe.kernels import decay_beta as DB
from calpipe.kernels import expert_lanes as EL
from calpipe.kernels import expert_mixture as EM
from calpipe.kernels import online_scaling as OS
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE, with_forecast_copies
from tests import naive_online_scaling as naive
from tests.calibrators.test_experts import loop
from tests.kernels.kernel_cases import FEW, SEEDS, case_labels, case_scores
from tests.kernels.ops import stream_ops

GRID = [(a, b) for a in config.EXPERT_COX_ALPHAS for b in config.EXPERT_COX_BETAS]
RATES = np.array(config.DEFAULT_JUMPING_RATES)
CLIP = config.DEFAULT_CLIP_EPS
LANES = config.EXPERT_LANES

# Input sets: (kind, params); decay-beta with short memories so that refits (and, at memory 4,
# the rescale of its counts) happen within the test streams; radius 1.5 makes the ONS project.
DEFAULT_KINDS = [
    ("ops", {}),
    ("obs", {}),
    ("decay", {"memory": 12, "n_bins": 100, "eps": 1e-4}),
    ("decay", {"memory": 30, "n_bins": 100, "eps": 1e-4}),
]
EDGE_KINDS = [
    ("obs", {"radius": 1.5}),
    ("decay", {"memory": 4, "n_bins": 7, "eps": 1e-2, "warmup": 2, "refit_every": 1}),
    ("ops", {"radius": 1.5, "score_clip": 0.05}),
    ("decay", {"memory": 6, "n_bins": 7, "eps": 1e-2, "warmup": 3, "refit_every": 2}),
]
INPUT_SETS = {"default": DEFAULT_KINDS, "edges": EDGE_KINDS}


class Inputs:
    """Kernel codes and fresh states of an input set."""

    def __init__(self, spec, n_streams):
        self.spec = spec
        kinds, pars, edges, states = [], [], [], []
        for kind, kw in spec:
            if kind in ("ops", "obs"):
                kinds.append(EL.IN_OPS if kind == "ops" else EL.IN_OBS)
                pars.append(EL.ons_row(kw.get("gamma", 0.1), kw.get("radius", 100.0),
                                       kw.get("score_clip", 0.01)))  # fmt: skip
                model = OS.MODEL_PLATT if kind == "ops" else OS.MODEL_BETA
                theta, a, _ = OS.initial_state(n_streams, model, 2, OS.CALIBEAT_NONE, 10, 100.0)
                states.append(np.hstack([theta, a.reshape(n_streams, -1)]))
                edges.append(np.zeros(1))
            else:
                m = kw["memory"]
                kinds.append(EL.IN_DECAY)
                pars.append(EL.decay_row(m, kw["eps"], kw.get("warmup", m // 2),
                                         kw.get("refit_every", max(1, m // 10)), 1e-3, 50, 1e-12,
                                         kw["n_bins"]))  # fmt: skip
                edges.append(DB.bin_edges(kw["n_bins"], kw["eps"]))
                states.append(DB.initial_state(n_streams, kw["n_bins"]))
        self.kinds = np.array(kinds, np.int64)
        self.par = np.array(pars)
        self.edges = np.zeros((len(spec), max(len(e) for e in edges)))
        for i, e in enumerate(edges):
            self.edges[i, : len(e)] = e
        self.widths = [s.shape[1] for s in states]
        self.cols = np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(np.int64)
        self.state = np.hstack(states)


def mixture_state(n_streams, n_in, pi=0.5):
    """Paper 001 Alg. 1 lines 1-2 over (1 + I) inputs x 21 functions: on every identity."""
    fam = binary_family("cox2", GRID)
    act = np.zeros((n_streams, len(RATES), (1 + n_in) * fam.size))
    act[:, :, fam.identity_index :: fam.size] = (1 - pi) / (len(RATES) * (1 + n_in))
    return np.full(n_streams, pi), act, np.zeros(n_streams)


def make_batch(seed, n_streams, max_len=40, p_delayed=0.2):
    """Streams of lengths 1..max_len, events at random positions, steps, unlabelled forecasts
    and delayed labels (an update 1-5 ops later, possibly after the stream's last event)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, n_streams)
    n = int(lengths.sum())
    x = case_scores(rng, n, 2, CLIP)
    y = case_labels(rng, x)
    positions = rng.permutation(n)
    ev, kd, off, at = [], [], [0], 0
    for length in lengths:
        ops = stream_ops(rng, positions[at : at + length], 0.1, p_delayed)
        at += length
        ev += [e for e, _ in ops]
        kd += [k for _, k in ops]
        off.append(len(ev))
    return x, y, np.array(ev, np.int64), np.array(kd, np.int8), np.array(off, np.int64)


def run_fused(batch, inputs, state, lanes, **restart):
    x, y, ev, kd, off = batch
    passive, active, log10m, in_state = state
    return EL.composite_experts_binary(
        x[:, None], y, ev, kd, off, inputs.kinds, inputs.cols, inputs.par, inputs.edges,
        binary_family("cox2", GRID).params, RATES, CLIP, passive, active, log10m, in_state,
        lanes=lanes, **restart,
    )  # fmt: skip


def run_reference(batch, inputs, state, **restart):
    """The per-input path: each input's kernel over the op list with forecast copies, then the
    mixture one stream at a time (what CompositeExperts.run_batch ran before lanes)."""
    x, y, ev, kd, off = batch
    passive, active, log10m, in_state = state
    n = x.shape[0]
    ext_ev, ext_kd, ext_off, src, pos, upd_only = with_forecast_copies(ev, kd, off, n)
    ext_ev[pos[upd_only]] = ext_ev[pos[upd_only] - 1]
    xe, ye = x[src], y[src]
    cols, new_states, fin = [xe], [], []
    for i, (kind, kw) in enumerate(inputs.spec):
        sub = in_state[:, inputs.cols[i] : inputs.cols[i] + inputs.widths[i]]
        if kind in ("ops", "obs"):
            d = 2 if kind == "ops" else 3
            p, theta, a, _ = OS.online_scaling(
                xe, ye, ext_ev, ext_kd, ext_off, sub[:, :d], sub[:, d:].reshape(-1, d, d),
                np.zeros((sub.shape[0], 0, 0)), OS.MODEL_PLATT if d == 2 else OS.MODEL_BETA,
                OS.CALIBEAT_NONE, kw.get("gamma", 0.1), kw.get("radius", 100.0),
                kw.get("score_clip", 0.01), 10,
            )  # fmt: skip
            new_states.append(np.hstack([theta, a.reshape(a.shape[0], -1)]))
        else:
            m = kw["memory"]
            p, new = DB.decay_beta(
                xe, ye, ext_ev, ext_kd, ext_off, sub, memory=m, n_bins=kw["n_bins"],
                eps=kw["eps"], warmup=kw.get("warmup", m // 2),
                refit_every=kw.get("refit_every", max(1, m // 10)), rho=1e-3, max_iter=50,
                tol=1e-12,
            )  # fmt: skip
            new_states.append(new)
        cols.append(np.clip(p, CLIP, 1 - CLIP))
        fin.append(p[ext_ev[pos]])  # each input's forecast at each original op
    q = np.ascontiguousarray(np.stack(cols, axis=1))
    out = EM.expert_mixture_binary(
        q, ye, ext_ev, ext_kd, ext_off, binary_family("cox2", GRID).params, RATES, passive,
        active, log10m, lanes=False, **restart,
    )  # fmt: skip
    return (out[0][:n], out[1][:n], *out[2:], np.hstack(new_states), np.array(fin))


def assert_same(got, want):
    names = ["p'", "log10 S", "P", "A", "log10 S end", "input states", "input forecasts"]
    for name, g, w in zip(names, got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=name)


def fresh_state(inputs, n_streams):
    return (*mixture_state(n_streams, len(inputs.spec)), inputs.state)


# ----------------------------------------------------------------------------------------------
# Bit for bit: lanes and one stream at a time == the per-input kernels
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_streams", [1, LANES - 1, LANES, LANES + 1, 63, 64, 65, 200])
@pytest.mark.parametrize("lanes", [True, False])
@pytest.mark.parametrize("which", sorted(INPUT_SETS))
def test_fused_kernel_equals_the_per_input_kernels_bit_for_bit(n_streams, lanes, which):
    batch = make_batch(n_streams * 7 + len(which), n_streams)
    inputs = Inputs(INPUT_SETS[which], n_streams)
    state = fresh_state(inputs, n_streams)
    assert_same(run_fused(batch, inputs, state, lanes), run_reference(batch, inputs, state))


def test_long_streams_handed_back_from_the_lanes_equal_the_reference():
    """A few long streams among many short ones: the lanes run nearly empty while they last and
    hand them back to the one-stream engine mid-way; every stream still equals the reference."""
    short = make_batch(10, 3 * LANES, max_len=15)
    long = make_batch(11, 3, max_len=400)
    x = np.concatenate([long[0], short[0]])
    y = np.concatenate([long[1], short[1]])
    n_long = long[0].shape[0]
    ev = np.concatenate([long[2], short[2] + n_long])
    kd = np.concatenate([long[3], short[3]])
    off = np.concatenate([long[4], short[4][1:] + long[4][-1]])
    batch = (x, y, ev, kd, off)
    n_streams = off.shape[0] - 1
    inputs = Inputs(DEFAULT_KINDS, n_streams)
    state = fresh_state(inputs, n_streams)
    assert_same(run_fused(batch, inputs, state, True), run_reference(batch, inputs, state))


@pytest.mark.parametrize("n_streams", [65, 200])
def test_each_stream_alone_equals_its_lane(n_streams):
    batch = make_batch(3 + n_streams, n_streams)
    inputs = Inputs(DEFAULT_KINDS, n_streams)
    state = fresh_state(inputs, n_streams)
    together = run_fused(batch, inputs, state, True)
    x, y, ev, kd, off = batch
    for s in range(0, n_streams, 7):
        lo, hi = off[s], off[s + 1]
        alone = run_fused((x, y, ev[lo:hi], kd[lo:hi], np.array([0, hi - lo])), inputs,
                          tuple(v[s : s + 1] for v in state), False)  # fmt: skip
        seen = ev[lo:hi][kd[lo:hi] != OP_UPDATE]
        np.testing.assert_array_equal(alone[0][seen], together[0][seen])
        np.testing.assert_array_equal(alone[1][seen], together[1][seen])
        for a, t in zip(alone[2:6], together[2:6], strict=True):
            np.testing.assert_array_equal(a[0], t[s])
        np.testing.assert_array_equal(alone[6], together[6][:, lo:hi])


@FEW
@given(seed=SEEDS, cut=st.floats(0.0, 1.0), lanes=st.booleans())
def test_two_chunks_with_state_carried_equal_one_pass_bit_for_bit(seed, cut, lanes):
    """Resumable (docs/ARCHITECTURE.md §4): labels of the first chunk's events arriving in the
    second included."""
    n_streams = int(np.random.default_rng(seed).integers(1, 3 * LANES))
    batch = make_batch(seed, n_streams, max_len=30)
    x, y, ev, kd, off = batch
    inputs = Inputs(DEFAULT_KINDS, n_streams)
    state = fresh_state(inputs, n_streams)
    one = run_fused(batch, inputs, state, lanes)
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
    r1 = run_fused(first, inputs, state, lanes)
    r2 = run_fused(second, inputs, (r1[2], r1[3], r1[4], r1[5]), lanes)
    for k in (0, 1):
        np.testing.assert_array_equal(np.where(np.isnan(r2[k]), r1[k], r2[k]), one[k])
    for a, b in zip(r2[2:6], one[2:6], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.concatenate([r1[6], r2[6]], axis=1)[:, np.argsort(
        np.concatenate([firsts, seconds]), kind="stable")], one[6])  # fmt: skip


@pytest.mark.parametrize("n_streams", [1, LANES + 1, 65])
@pytest.mark.parametrize("lanes", [True, False])
def test_restarting_jumps_equal_the_per_input_kernels_bit_for_bit(n_streams, lanes):
    """A jump back to the inputs' identities with probability 1/2 (the default method's
    ``restart``): the lanes run jump_mix_restart's operations, so the same bits as the
    per-input kernels and the mixture one stream at a time; and another mixture than
    paper 001's uniform jumps."""
    batch = make_batch(n_streams * 3 + 1, n_streams)
    inputs = Inputs(DEFAULT_KINDS, n_streams)
    fam = binary_family("cox2", GRID)
    n_in = 1 + len(DEFAULT_KINDS)
    to = np.zeros(n_in * fam.size)
    to[fam.identity_index :: fam.size] = 1.0 / n_in
    kw = {"restart": 0.5, "restart_to": to}
    got = run_fused(batch, inputs, fresh_state(inputs, n_streams), lanes, **kw)
    assert_same(got, run_reference(batch, inputs, fresh_state(inputs, n_streams), **kw))
    uniform = run_fused(batch, inputs, fresh_state(inputs, n_streams), lanes)
    assert not np.array_equal(got[0], uniform[0])


@pytest.mark.parametrize("n_streams", [2 * LANES + 1, 200])
def test_mixture_of_given_inputs_in_lanes_equals_one_stream_at_a_time(n_streams):
    """expert_mixture_binary runs a batch of many streams in lanes (every input a given
    column): the same bits as its one-stream engine."""
    x, y, ev, kd, off = make_batch(5, n_streams)
    rng = np.random.default_rng(6)
    q = np.column_stack([x, np.clip(x[:, None] + rng.normal(0, 0.1, (x.size, 3)), CLIP, 1 - CLIP)])
    fam = binary_family("cox2", [(0.0, 1.0), (1.0, 0.5), (-2.0, 2.0), (0.5, 1.3)])
    act = np.full((n_streams, 2, 4 * fam.size), 0.6 / (8 * fam.size))
    args = (q, y, ev, kd, off, fam.params, np.array([0.05, 1e-3]), np.full(n_streams, 0.4), act,
            np.zeros(n_streams))  # fmt: skip
    for a, b in zip(EM.expert_mixture_binary(*args), EM.expert_mixture_binary(*args, lanes=False),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)


def test_a_mixture_too_large_for_the_stack_runs_the_heap_lanes_with_the_same_bits():
    """Past config.EXPERT_LANE_EXPERTS experts the lanes' scratch is on the heap
    (``_lanes_heap``, the same body): the same bits as one stream at a time."""
    n_streams = 2 * LANES + 3
    x, y, ev, kd, off = make_batch(8, n_streams)
    rng = np.random.default_rng(9)
    q = np.column_stack([x, np.clip(x[:, None] + rng.normal(0, 0.1, (x.size, 5)), CLIP, 1 - CLIP)])
    grid = [(a, b) for a in np.linspace(-3, 3, 11) for b in (0.5, 1.0, 2.0, 1.3, 0.8)]
    fam = binary_family("cox2", grid)
    n_exp = 6 * fam.size
    assert not EL.stack_fits(2, n_exp)  # the heap path
    act = np.full((n_streams, 2, n_exp), 0.6 / (2 * n_exp))
    args = (q, y, ev, kd, off, fam.params, np.array([0.05, 1e-3]), np.full(n_streams, 0.4), act,
            np.zeros(n_streams))  # fmt: skip
    for a, b in zip(EM.expert_mixture_binary(*args), EM.expert_mixture_binary(*args, lanes=False),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------
# The paper oracles (1e-12)
# ----------------------------------------------------------------------------------------------
def test_fused_kernel_equals_the_online_scaling_oracle_and_paper001_algorithm1():
    """One stream of steps with OPS and OBS inputs: each input's forecasts are the per-event
    Online Newton Step loop's (tests/naive_online_scaling.py) and the protected forecasts and
    martingale are paper 001 Algorithm 1 over them (tests/calibrators/test_experts.py)."""
    rng = np.random.default_rng(12)
    n = 300
    x = np.clip(rng.uniform(0, 1, n), CLIP, 1 - CLIP)
    y = (rng.uniform(size=n) < x**1.6).astype(np.int64)
    inputs = Inputs([("ops", {}), ("obs", {})], 1)
    batch = (x, y, np.arange(n), np.full(n, OP_STEP, np.int8), np.array([0, n]))
    p, m, *_, fin = run_fused(batch, inputs, fresh_state(inputs, 1), False)
    ops = naive.ons_stream(x, y, kind="platt", eps=100.0)
    obs = naive.ons_stream(x, y, kind="beta", eps=100.0)
    np.testing.assert_allclose(fin[0], ops, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fin[1], obs, rtol=0, atol=1e-12)
    q = np.column_stack([x, np.clip(ops, CLIP, 1 - CLIP), np.clip(obs, CLIP, 1 - CLIP)])
    want, log10s = loop(q, y, binary_family("cox2", GRID), RATES, 0.5)
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-12)
    assert abs(m[-1] - log10s) < 1e-10


def test_an_update_only_op_uses_every_inputs_forecast_at_the_labels_time():
    """A delayed label: the mixture's Bayes step reads each input's forecast made when the label
    arrives (after the inputs learnt the labels in between), not the one made at the event."""
    x = np.array([0.3, 0.8, 0.6, 0.7])
    y = np.array([1, 1, 0, 1])
    ev = np.array([0, 1, 2, 0, 3])
    kd = np.array([OP_FORECAST, OP_STEP, OP_STEP, OP_UPDATE, OP_FORECAST], np.int8)
    inputs = Inputs([("ops", {})], 1)
    p, m, *_, fin = run_fused((x, y, ev, kd, np.array([0, 5])), inputs, fresh_state(inputs, 1),
                              False)  # fmt: skip
    assert fin[0, 3] != fin[0, 0]  # OPS moved between the event and its label
    assert np.isnan(p).sum() == 0 and np.all(np.isfinite(m))
    ref = run_reference((x, y, ev, kd, np.array([0, 5])), inputs, fresh_state(inputs, 1))
    assert_same((p, m, *_, fin), ref)


def test_arguments_are_checked():
    inputs = Inputs([("ops", {})], 2)
    x, y, ev, kd, off = make_batch(1, 2)
    passive, active, log10m = mixture_state(2, 1)
    fam = binary_family("cox2", GRID)
    with pytest.raises(ValueError, match="state shapes"):
        EL.composite_experts_binary(x[:, None], y, ev, kd, off, inputs.kinds, inputs.cols,
                                    inputs.par, inputs.edges, fam.params, RATES, CLIP, passive,
                                    active[:, :, :-1], log10m, inputs.state)  # fmt: skip
    with pytest.raises(ValueError, match="column"):
        EL.composite_experts_binary(x[:, None], y, ev, kd, off, np.array([EL.IN_GIVEN]),
                                    np.array([3]), inputs.par, inputs.edges, fam.params, RATES,
                                    CLIP, passive, active, log10m, inputs.state)  # fmt: skip
    before = inputs.state.copy(), active.copy()
    run_fused((x, y, ev, kd, off), inputs, (passive, active, log10m, inputs.state), True)
    np.testing.assert_array_equal(inputs.state, before[0])  # inputs are not modified
    np.testing.assert_array_equal(active, before[1])


@pytest.mark.parametrize("n_streams", [1, 65])
@pytest.mark.parametrize("lanes", [True, False])
def test_packed_state_gives_the_bits_of_the_split_state(n_streams, lanes):
    """packed=True (P, A and the inputs in one (S, L) matrix, as a calibrator stores its
    state, with a gap of carried columns before each input): the same outputs and new state
    as the split arguments, the packed matrix not modified, its columns outside P, A and the
    inputs carried unchanged."""
    batch = make_batch(5 + n_streams, n_streams)
    inputs = Inputs(DEFAULT_KINDS, n_streams)
    passive, active, log10m, in_state = fresh_state(inputs, n_streams)
    want = run_fused(batch, inputs, (passive, active, log10m, in_state), lanes)
    head = 1 + active[0].size
    gap = np.full((n_streams, 2), 7.5)  # e.g. an input's stored length and log10 S
    packed = np.hstack([passive[:, None], active.reshape(n_streams, -1), gap, in_state])
    before = packed.copy()
    x, y, ev, kd, off = batch
    got = EL.composite_experts_binary(
        x[:, None], y, ev, kd, off, inputs.kinds, inputs.cols + head + 2, inputs.par,
        inputs.edges, binary_family("cox2", GRID).params, RATES, CLIP, None, None, log10m,
        packed, lanes=lanes, packed=True,
    )  # fmt: skip
    np.testing.assert_array_equal(packed, before)
    new = got[5]
    np.testing.assert_array_equal(new[:, head : head + 2], gap)
    got_split = (*got[:2], new[:, 0], new[:, 1:head].reshape(active.shape), got[4],
                 new[:, head + 2 :], got[6])  # fmt: skip
    assert_same(got_split, want)
    np.testing.assert_array_equal(got[2], new[:, 0])  # P and A are views of the new state
    with pytest.raises(ValueError, match="inside the mixture state"):
        EL.composite_experts_binary(
            x[:, None], y, ev, kd, off, inputs.kinds, inputs.cols, inputs.par, inputs.edges,
            binary_family("cox2", GRID).params, RATES, CLIP, None, None, log10m, packed,
            packed=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match="passive and active are None"):
        EL.composite_experts_binary(
            x[:, None], y, ev, kd, off, inputs.kinds, inputs.cols + head + 2, inputs.par,
            inputs.edges, binary_family("cox2", GRID).params, RATES, CLIP, passive, active,
            log10m, packed, packed=True,
        )  # fmt: skip
