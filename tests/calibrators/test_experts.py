"""calpipe.calibrators.experts (the default method) and calpipe.kernels.expert_mixture: against a
plain loop of paper 001 Algorithm 1 over input forecasts, reduction to the Composite Jumper, and
the regret bounds of the module docstring on adversarial and real sequences."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe import config
from calpipe.calibrators import make_calibrator
from calpipe.errors import ParameterError, StateError
from calpipe.families import binary_family, evaluate, multiclass_family
from calpipe.kernels.expert_mixture import expert_mixture_binary, expert_mixture_multiclass
from calpipe.kernels.mixture import jump_mix, jump_mix_restart, restart_terms
from calpipe.kernels.ops import OP_STEP
from tests import naive_online_scaling as naive

BANK = Path(__file__).resolve().parents[2] / "data" / "bank_marketing_scored.parquet"


def loop(q, y, fam, rates, pi, restart=0.0):
    """Paper 001 Algorithm 1 over experts (input i, function t), one event at a time; a jump
    goes to an input's identity (each with probability 1 / I) with probability ``restart``,
    else to a uniform expert (``restart`` 0: Algorithm 1's line 5)."""
    n, n_in = q.shape[:2]
    t_n = fam.size
    experts = [(i, t) for i in range(n_in) for t in range(t_n)]
    ident = fam.identity_index
    w = {(j, e): 0.0 for j in range(len(rates)) for e in experts}
    for j in range(len(rates)):
        for i in range(n_in):
            w[(j, (i, ident))] = (1 - pi) / (len(rates) * n_in)
    passive, log10s, out = pi, 0.0, []
    for e in range(n):
        f = {(i, t): evaluate(fam, q[e, i][None])[0][t] for i in range(n_in) for t in range(t_n)}
        for j, rate in enumerate(rates):
            tot = sum(w[(j, x)] for x in experts)
            for x in experts:
                to = (1 - restart) / len(experts) + (restart / n_in if x[1] == ident else 0.0)
                w[(j, x)] = (1 - rate) * w[(j, x)] + rate * tot * to
        base = q[e, 0]
        pred = passive * base + sum(w[k] * f[k[1]] for k in w)
        out.append(pred)
        lab = y[e]

        def lik(v, lab=lab):  # B_v({y}): v if y = 1 else 1 - v; v[y] for K classes
            return (v if lab == 1 else 1 - v) if q.ndim == 2 else v[lab]

        passive *= lik(base)
        for k in w:
            w[k] *= lik(f[k[1]])
        c = passive + sum(w.values())
        log10s += math.log10(c / lik(base))
        passive /= c
        for k in w:
            w[k] /= c
    return np.array(out), log10s


def _initial(fam, n_in, rates, pi, s=1):
    act = np.zeros((s, len(rates), n_in * fam.size))
    act[:, :, fam.identity_index :: fam.size] = (1 - pi) / (len(rates) * n_in)
    return np.full(s, pi), act, np.zeros(s)


def test_binary_kernel_equals_the_loop():
    rng = np.random.default_rng(0)
    q = rng.uniform(0.05, 0.95, (150, 3))
    y = rng.integers(0, 2, 150)
    fam = binary_family("cox2", [(0, 1), (2, 0.5), (-4, 2), (1, 0.25)])
    rates = np.array([0.05, 0.001])
    p, m, *_ = expert_mixture_binary(q, y, np.arange(150), np.full(150, OP_STEP, np.int8),
                                     np.array([0, 150]), fam.params, rates,
                                     *_initial(fam, 3, rates, 0.3))  # fmt: skip
    want, log10s = loop(q, y, fam, rates, 0.3)
    np.testing.assert_allclose(p, want, atol=1e-12, rtol=0)
    assert abs(m[-1] - log10s) < 1e-10


def test_multiclass_kernel_equals_the_loop():
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.ones(3), (80, 2))
    y = rng.integers(0, 3, 80)
    fam = multiclass_family(3, "cox2", betas=(1.0, 0.5), alpha_shifts=(1.0, 2.0))
    rates = np.array([0.01])
    p, m, *_ = expert_mixture_multiclass(q, y, np.arange(80), np.full(80, OP_STEP, np.int8),
                                         np.array([0, 80]), fam.betas, fam.alphas, rates,
                                         *_initial(fam, 2, rates, 0.5))  # fmt: skip
    want, log10s = loop(q, y, fam, rates, 0.5)
    np.testing.assert_allclose(p, want, atol=1e-12, rtol=0)
    assert abs(m[-1] - log10s) < 1e-10


def _restart_to(fam, n_in):
    to = np.zeros(n_in * fam.size)
    to[fam.identity_index :: fam.size] = 1.0 / n_in
    return to


@pytest.mark.parametrize("lanes", [False, None])
def test_binary_kernel_with_restarting_jumps_equals_the_loop(lanes):
    """restart w: a jump goes to an input's identity (1 / I each) with probability w, else to a
    uniform expert: the kernels (one stream at a time, and in lanes for many streams) equal the
    loop, which draws the jump from that distribution."""
    rng = np.random.default_rng(10)
    n_streams = 1 if lanes is False else 40  # None: 40 copies of the stream run in lanes
    q = rng.uniform(0.05, 0.95, (150, 3))
    y = rng.integers(0, 2, 150)
    fam = binary_family("cox2", [(0, 1), (2, 0.5), (-4, 2), (1, 0.25)])
    rates = np.array([0.05, 0.001])
    want, log10s = loop(q, y, fam, rates, 0.3, restart=0.5)
    qq = np.tile(q, (n_streams, 1))
    yy = np.tile(y, n_streams)
    off = np.arange(0, 150 * n_streams + 1, 150)
    p, m, *_ = expert_mixture_binary(qq, yy, np.arange(qq.shape[0]),
                                     np.full(qq.shape[0], OP_STEP, np.int8), off, fam.params,
                                     rates, *_initial(fam, 3, rates, 0.3, n_streams), lanes=lanes,
                                     restart=0.5, restart_to=_restart_to(fam, 3))  # fmt: skip
    np.testing.assert_allclose(p, np.tile(want, n_streams), atol=1e-12, rtol=0)
    assert abs(m[-1] - log10s) < 1e-10
    uniform, _ = loop(q, y, fam, rates, 0.3)
    assert np.abs(want - uniform).max() > 1e-3  # restarting is another mixture


def test_multiclass_kernel_with_restarting_jumps_equals_the_loop():
    rng = np.random.default_rng(11)
    q = rng.dirichlet(np.ones(3), (80, 2))
    y = rng.integers(0, 3, 80)
    fam = multiclass_family(3, "cox2", betas=(1.0, 0.5), alpha_shifts=(1.0, 2.0))
    rates = np.array([0.05, 0.01])
    p, m, *_ = expert_mixture_multiclass(q, y, np.arange(80), np.full(80, OP_STEP, np.int8),
                                         np.array([0, 80]), fam.betas, fam.alphas, rates,
                                         *_initial(fam, 2, rates, 0.5), restart=0.25,
                                         restart_to=_restart_to(fam, 2))  # fmt: skip
    want, log10s = loop(q, y, fam, rates, 0.5, restart=0.25)
    np.testing.assert_allclose(p, want, atol=1e-12, rtol=0)
    assert abs(m[-1] - log10s) < 1e-10


def test_restart_zero_is_paper_001s_jumps_bit_for_bit():
    """restart=0 runs the operations of the uniform jumps exactly (jump_mix_restart with
    restart 0 gives jump_mix's bits, weights down to 1e-300 included), and the states written
    before the restart existed keep their fingerprint."""
    rng = np.random.default_rng(12)
    x = rng.uniform(0.01, 0.99, 400)
    y = (rng.uniform(size=400) < x**1.5).astype(np.int64)
    zero = make_calibrator("composite-experts", restart=0.0)
    _, st = zero.run(x, y)
    assert "restart" not in zero.config(2)
    active = rng.uniform(0, 1, (3, 40)) * 10.0 ** rng.integers(-300, 0, (3, 40))
    rates = np.array([0.3, 1e-2, 1e-4])
    want, got = (np.empty((3, 40)), np.empty(40)), (np.empty((3, 40)), np.empty(40))
    jump_mix(active, rates, *want)
    jump_mix_restart(active, rates, *restart_terms(0.0, None, 40), *got)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    default = make_calibrator("composite-experts")
    assert default.config(2)["restart"] == config.EXPERT_JUMP_RESTART
    assert default.fingerprint(2) != zero.fingerprint(2)
    with pytest.raises(StateError, match="fingerprint"):
        default.run(x[:3], y[:3], state=st)


def test_switching_between_inputs_costs_ln_2i_over_j_per_switch():
    """Bound 3 with restarting jumps: for a sequence of k switches between inputs' identities,
    L <= L(sequence) + ln(R I / (1 - pi)) + k ln(I / (w J)) + (n - 1 - k) ln(1 / (1 - J)) for
    every rate J (w = 1/2: ln(2 I / J) a switch, against ln(I |Theta| / J) for uniform jumps).
    Two inputs take turns being right (the base, then a forecast the base knows nothing of):
    the restart loses less than the uniform jumps, by about k ln(|Theta| / 2)."""
    rng = np.random.default_rng(13)
    n, block = 3000, 500
    x = rng.uniform(0.05, 0.95, n)
    u = rng.uniform(0.05, 0.95, n)
    odd = (np.arange(n) // block) % 2 == 1
    y = (rng.uniform(size=n) < np.where(odd, u, x)).astype(np.int64)
    q = np.column_stack([x, u])
    grid = [(a, b) for a in config.EXPERT_COX_ALPHAS for b in config.EXPERT_COX_BETAS]
    fam = binary_family("cox2", grid)
    rates = np.array(config.DEFAULT_JUMPING_RATES)
    pi, w = config.DEFAULT_PI, config.EXPERT_JUMP_RESTART
    ops = (q, y, np.arange(n), np.full(n, OP_STEP, np.int8), np.array([0, n]), fam.params, rates)
    p, *_ = expert_mixture_binary(*ops, *_initial(fam, 2, rates, pi), restart=w,
                                  restart_to=_restart_to(fam, 2))  # fmt: skip
    p0, *_ = expert_mixture_binary(*ops, *_initial(fam, 2, rates, pi))
    best = _loss(np.where(odd, u, x), y)  # the right input's identity, k = 5 switches
    k = n // block - 1
    loss, loss0 = _loss(p, y), _loss(p0, y)
    for j in rates:
        slack = (math.log(len(rates) * 2 / (1 - pi)) + k * math.log(2 / (w * j))
                 + (n - 1 - k) * math.log(1 / (1 - j)))  # fmt: skip
        assert loss <= best + slack + 1e-9
    assert loss < loss0 - k * math.log(fam.size / 2) / 2  # measured: 12.7 nats less


def test_without_inputs_it_is_the_composite_jumper():
    """inputs=(), paper 001's grid and its uniform jumps (restart 0): exactly Algorithm 1 on
    the base (paper numbers hold)."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0.01, 0.99, 500)
    y = (rng.uniform(size=500) < x**1.5).astype(np.int64)
    grid = [(a, b) for a in config.DEFAULT_COX_ALPHAS for b in config.DEFAULT_COX_BETAS]
    ce, _ = make_calibrator("composite-experts", inputs=(), family_params=grid,
                            restart=0.0).run(x, y)  # fmt: skip
    cj, _ = make_calibrator("composite-jumper").run(x, y)
    np.testing.assert_allclose(ce.protected, cj.protected, atol=1e-14, rtol=0)
    np.testing.assert_allclose(ce.log10_martingale, cj.log10_martingale, atol=1e-12, rtol=0)


def _loss(p, y):
    p = np.clip(p, 1e-300, 1.0)
    return float(-np.sum(np.log(np.where(y == 1, p, 1 - p))))


def _bounds_hold(x, y):
    """Bounds 1 and 2 of calpipe.calibrators.experts on one binary stream."""
    cal = make_calibrator("composite-experts")
    out, _ = cal.run(x, y)
    loss = _loss(out.protected, y)
    n = y.shape[0]
    base = np.clip(x, config.DEFAULT_CLIP_EPS, 1 - config.DEFAULT_CLIP_EPS)
    assert loss <= _loss(base, y) + math.log(1 / config.DEFAULT_PI) + 1e-9  # insurance
    # each input, held throughout (rate 1e-4: one start, no switch)
    ops = np.clip(naive.ons_stream(x, y, kind="platt", eps=config.OPS_RHO), 1e-3, 1 - 1e-3)
    r, n_in = len(config.DEFAULT_JUMPING_RATES), 1 + len(config.EXPERT_INPUTS_BINARY)
    j = min(config.DEFAULT_JUMPING_RATES)
    slack = math.log(r * n_in / (1 - config.DEFAULT_PI)) + (n - 1) * math.log(1 / (1 - j))
    assert loss <= _loss(ops, y) + slack + 1e-9
    # ... and the beta refits on forgotten counts (the practitioner's refit), run on their own
    for spec in config.EXPERT_INPUTS_BINARY[2:]:
        name, *kv = spec.split(":")
        params = {k: int(v) for k, v in (t.split("=") for t in kv)}
        beta, _ = make_calibrator(name, **params).run(x, y)
        beta = np.clip(beta.protected, config.DEFAULT_CLIP_EPS, 1 - config.DEFAULT_CLIP_EPS)
        assert loss <= _loss(beta, y) + slack + 1e-9
    return loss, _loss(base, y), _loss(ops, y)


def test_bounds_on_an_adversarial_sequence():
    """Labels chosen against the default's own forecast (y = 1 iff p' < 1/2)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.01, 0.99, 300)
    cal = make_calibrator("composite-experts")
    state, ys = None, []
    for t in range(300):  # the adversary sees each forecast before choosing the label
        out, _ = cal.run(x[t : t + 1], np.array([-1]), state=state)
        ys.append(int(out.protected[0] < 0.5))
        _, state = cal.run(x[t : t + 1], np.array([ys[-1]]), state=state)
    _bounds_hold(x, np.array(ys))


@pytest.mark.parametrize("shift", [0.0, 3.0])
def test_bounds_on_drifting_and_stationary_streams(shift):
    rng = np.random.default_rng(4)
    x = rng.uniform(0.01, 0.99, 3000)
    z = np.log(x / (1 - x)) + np.where(np.arange(3000) > 1500, shift, 0.0)
    y = (rng.uniform(size=3000) < 1 / (1 + np.exp(-z))).astype(np.int64)
    loss, base, ops = _bounds_hold(x, y)
    if shift:  # on a real shift it beats the base by far, and OPS too
        assert loss < base - 300 and loss < ops


@pytest.mark.slow
def test_bounds_on_the_bank_stream_and_it_beats_ops_there():
    df = pl.read_parquet(BANK).sort("event_date", "event_id")
    x, y = df["score_rf1000"].to_numpy(), df["label"].to_numpy().astype(np.int64)
    loss, base, ops = _bounds_hold(x, y)
    assert loss < ops < base


def test_delayed_labels_through_protect():
    """Labels arriving later update the mixture then, each input forecasting at that time."""
    t0 = pl.datetime(2026, 1, 1)
    rng = np.random.default_rng(5)
    n = 200
    df = pl.DataFrame({"event_id": np.arange(n), "score": rng.uniform(0.05, 0.95, n),
                       "label": rng.integers(0, 2, n)}).with_columns(
        (t0 + pl.duration(seconds=pl.col("event_id"))).alias("event_time"))  # fmt: skip
    late = df.with_columns((pl.col("event_time") + pl.duration(seconds=30)).alias("label_time"))
    out = calpipe.protect(late, label_time="label_time")
    assert out["protected_score"].is_between(0, 1).all()
    # the first 31 events see no label: the mixture's forecast is its initial one
    first = calpipe.protect(df.head(1).with_columns(pl.lit(None, pl.Int64).alias("label")))
    np.testing.assert_allclose(out["protected_score"][:31].to_numpy()[:1],
                               first["protected_score"].to_numpy(), atol=1e-15)  # fmt: skip


def test_inputs_are_given_by_name_spec_or_pair_and_errors_name_the_input():
    a = make_calibrator("composite-experts", inputs=("ops", "beta:window=50:refit_every=10"))
    b = make_calibrator("composite-experts",
                        inputs=[("ops", {}), ("beta", {"refit_every": 10, "window": 50})])  # fmt: skip
    assert a.params["inputs"] == b.params["inputs"] == (
        ("ops", ()), ("beta", (("refit_every", 10), ("window", 50))))  # fmt: skip
    assert a.fingerprint(2) == b.fingerprint(2)
    assert a.classes == "binary"  # beta is binary-only, so the mixture is
    assert make_calibrator("composite-experts", inputs=("ops",)).classes == "both"
    with pytest.raises(ParameterError, match=r"input 'beta': .*window=0 is invalid"):
        make_calibrator("composite-experts", inputs=("beta:window=0",))
    with pytest.raises(ParameterError, match=r"inputs=.* is invalid: None or distinct inputs"):
        make_calibrator("composite-experts", inputs=("ops", "ops"))
    with pytest.raises(ParameterError, match=r"inputs=.* is invalid"):
        make_calibrator("composite-experts", inputs=("composite-jumper",))


def test_a_windowed_input_equals_its_method_run_alone():
    """With a windowed input, the mixture is paper 001's loop over (base, the windowed method's
    own forecasts run alone): the input column is exactly that method, refits included."""
    rng = np.random.default_rng(8)
    x = rng.uniform(0.02, 0.98, 300)
    y = (rng.uniform(size=300) < x**2).astype(np.int64)
    grid = ((0.0, 1.0), (1.0, 0.5), (-2.0, 2.0))
    cal = make_calibrator("composite-experts", inputs=("beta:window=60:refit_every=20",),
                          family_params=grid)  # fmt: skip
    out, _ = cal.run(x, y)
    beta, _ = make_calibrator("beta", window=60, refit_every=20).run(x, y)
    eps = config.DEFAULT_CLIP_EPS
    q = np.clip(np.column_stack([x, beta.protected]), eps, 1 - eps)
    want, log10s = loop(q, y, binary_family("cox2", grid), config.DEFAULT_JUMPING_RATES,
                        config.DEFAULT_PI, config.EXPERT_JUMP_RESTART)  # fmt: skip
    np.testing.assert_allclose(out.protected, want, rtol=0, atol=1e-12)
    assert abs(out.log10_martingale[-1] - log10s) < 1e-10


def test_a_state_with_a_wrong_input_part_is_refused():
    rng = np.random.default_rng(9)
    x = rng.uniform(0.05, 0.95, 80)
    y = rng.integers(0, 2, 80)
    cal = make_calibrator("composite-experts", inputs=("ops", "platt:window=10:refit_every=5"))
    _, st = cal.run(x, y)
    short = dataclasses.replace(st, weights=st.weights[:-1])
    with pytest.raises(StateError, match="impossible length"):
        cal.run(x, y, state=short)
    longer = dataclasses.replace(st, weights=[*st.weights, 0.0])
    with pytest.raises(StateError, match="1 values after the last input"):
        cal.run(x, y, state=longer)
    # a state of the old layout (no lengths) has another fingerprint: refused, never misread
    assert "state_layout" in cal.config(2)


@pytest.mark.parametrize("spec", ["ops", "obs", "platt:window=40:refit_every=10",
                                  "beta:window=40:refit_every=10", "beta:window=500",
                                  "decay-beta:memory=60", "decay-beta:memory=1000"])  # fmt: skip
def test_an_inputs_logistic_map_is_its_serving_map(spec):
    """The SQL form of each input: sigmoid(w1 ln c(p) - w2 ln(1 - c(p)) + w0) (NaN: the base)
    equals the input's own next forecast."""
    from calpipe.calibrators.experts import input_spec, make_input

    cal = make_input(input_spec(spec), config.DEFAULT_CLIP_EPS)
    rng = np.random.default_rng(10)
    x = rng.uniform(0.01, 0.99, 300)
    y = (rng.uniform(size=300) < x**1.3).astype(np.int64)
    _, st = cal.run(x, y)
    w = np.asarray(st.weights)
    state = cal.load_state(w, np.array([0, w.size]), np.zeros(1), 2)
    p = np.linspace(0, 1, 101)
    want = cal.serving_map(state, p[None, :])[0]
    w1, w2, w0, eps = cal.logistic_map(state)[0]
    if np.isnan(w1):  # a window still filling: the base passes through
        np.testing.assert_array_equal(want, p)
        return
    c = np.clip(p, eps, 1 - eps)
    got = 1 / (1 + np.exp(-(w1 * np.log(c) - w2 * np.log(1 - c) + w0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_the_default_reads_its_state_in_place_and_refuses_what_departs_from_its_layout():
    """The default's fused run reads the state as an (S, L) matrix (CompositeExperts._uniform):
    a state that departs from the fixed layout (a value short or extra, a length field edited
    with the total kept, a negative weight) is refused with _split's messages, and a valid
    state resumes to the same bits as one pass."""
    rng = np.random.default_rng(10)
    x = rng.uniform(0.05, 0.95, 120)
    y = rng.integers(0, 2, 120)
    cal = make_calibrator("composite-experts")
    assert cal.lane_inputs() is not None  # the fused engine's inputs
    whole, _ = cal.run(x, y)
    first, st = cal.run(x[:70], y[:70])
    rest, _ = cal.run(x[70:], y[70:], state=st)
    np.testing.assert_array_equal(np.concatenate([first.protected, rest.protected]),
                                  whole.protected)  # fmt: skip
    with pytest.raises(StateError, match="impossible length"):
        cal.run(x, y, state=dataclasses.replace(st, weights=st.weights[:-1]))
    with pytest.raises(StateError, match="1 values after the last input"):
        cal.run(x, y, state=dataclasses.replace(st, weights=[*st.weights, 0.0]))
    h = 1 + len(cal.rates) * (1 + len(cal.input_specs(2))) * cal.family(2).size  # [P, A]
    edited = list(st.weights)
    assert edited[h] == 6  # the first input's (OPS) length field
    edited[h] -= 1  # one less, the total kept: its last value would read as the next input's
    with pytest.raises(StateError, match=r"'ops': state weights have length 5\.\.5, its state"):
        cal.run(x, y, state=dataclasses.replace(st, weights=edited))
    negative = list(st.weights)
    negative[1] = -negative[1]
    with pytest.raises(StateError, match="mixture weights"):
        cal.run(x, y, state=dataclasses.replace(st, weights=negative))


@pytest.mark.parametrize("inputs", [("obs",), ("ops", "obs")])
def test_an_overflowing_obs_input_state_is_refused_not_nan_forecasts(inputs):
    # an OBS input's A of 1e300 overflowed to NaN forecasts with no error: the fixed-layout
    # path (_uniform) checks each input's vector as the input's own state_from_flat would
    from calpipe.calibrators.base import StreamState

    cal = make_calibrator("composite-experts", inputs=inputs)
    x, y = np.array([0.2, 0.7, 0.9]), np.array([0, 1, 0])
    _, st = cal.run(x, y)
    w = np.array(st.weights)
    w[-9:] = 1e300  # the last input, obs: [..., theta (3), A (3x3)]
    st.weights = w.tolist()
    with pytest.raises(StateError, match="A has an entry beyond"):
        cal.run(x, np.array([1, -1, 0]), state=StreamState.from_json(st.to_json()))
