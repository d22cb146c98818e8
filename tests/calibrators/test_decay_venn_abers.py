"""calpipe.kernels.decay_venn_abers and the ``decay-venn-abers`` calibrator: against a slow
per-event loop written from the module docstring, whose every label is kept with its explicit
weight lambda^age and whose IVAP refits use scikit-learn's weighted isotonic regression (an
independent PAV, ties pooled by weight), so the two agree to rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from calpipe import config
from calpipe.calibrators import make_calibrator
from calpipe.calibrators.experts import input_spec, make_input
from calpipe.kernels import decay_beta as DB
from calpipe.kernels import decay_venn_abers as DVA


def _ivap(bins, labels, weights, b):
    """The log-loss merge of the IVAP of a test score in bin b: isotonic regression of the
    label on the bin (weighted) with the test event (b, 0) then (b, 1) of weight 1 added."""
    p = []
    for lab in (0.0, 1.0):
        x = np.r_[bins, b].astype(float)
        ir = IsotonicRegression().fit(x, np.r_[labels, lab], sample_weight=np.r_[weights, 1.0])
        p.append(float(ir.predict([float(b)])[0]))
    p0, p1 = p
    return p1 / (1 - p0 + p1)


def slow_decay_venn_abers(x, y, memory, n_bins, eps, warmup, refit):
    """One stream, one event at a time: forecast from the last refit's table, then count the
    label; every refit recomputes each bin's IVAP from the explicit weights."""
    lam = 1 - 2 / memory
    edges = DB.bin_edges(n_bins, eps)
    seen_bins, seen_y, t_seen = [], [], []
    table, u, out = None, 0, np.empty(x.size)
    for t in range(x.size):
        q = min(max(x[t], eps), 1 - eps)
        z = math.log(q) - math.log1p(-q)
        k = min(max(int(np.searchsorted(edges, z, side="right")) - 1, 0), n_bins - 1)
        out[t] = x[t] if table is None else table[k]
        if y[t] < 0:
            continue
        seen_bins.append(k)
        seen_y.append(float(y[t]))
        u += 1
        t_seen.append(u)
        if u >= warmup and (u - warmup) % refit == 0:
            w = lam ** (u - np.array(t_seen, dtype=float))  # the newest label: weight 1
            table = [_ivap(np.array(seen_bins), np.array(seen_y), w, b) for b in range(n_bins)]
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_equals_the_slow_loop(seed):
    rng = np.random.default_rng(seed)
    n = 300
    x = 1 / (1 + np.exp(-rng.normal(0, 4, n)))  # extreme scores, as a naive Bayes base gives
    drift = np.where(np.arange(n) < n // 2, 0.0, 1.5)  # the map changes halfway
    z = np.log(x / (1 - x))
    y = rng.uniform(size=n) < 1 / (1 + np.exp(-(np.sign(z) * np.abs(z) ** 0.5 + drift)))
    y = y.astype(int)
    y[rng.uniform(size=n) < 0.1] = -1  # some labels unknown: forecast only
    cal = make_calibrator("decay-venn-abers", memory=80, n_bins=12)
    out, st = cal.run(x, y)
    want = slow_decay_venn_abers(x, y, 80, 12, config.DECAY_BETA_EPS, cal.warmup,
                                 cal.refit_every)  # fmt: skip
    np.testing.assert_allclose(out.protected, want, rtol=0, atol=1e-12)
    assert len(st.weights) == DVA.state_size(12)  # fixed size, whatever the stream's length


def test_pav_reads_the_block_of_the_test_bin():
    scratch = (np.empty(4), np.empty(4), np.empty(4, np.int64))
    pos = np.array([0.0, 0.0, 3.0, 0.0])
    neg = np.array([2.0, 0.0, 1.0, 0.0])  # bins 1 and 3 empty: skipped
    # a 1 in bin 1: 0/2, 1/1, 3/4 -> the last two pool to 4/5
    assert DVA.pav_value_at(pos, neg, 1, 1.0, 0.0, *scratch) == pytest.approx(0.8)
    assert DVA.pav_value_at(pos, neg, 0, 1.0, 0.0, *scratch) == pytest.approx(1 / 3)
    # a 0 in bin 3: 0/2, 3/4, 0/1 -> 3/5 pooled over bins 2, 3
    assert DVA.pav_value_at(pos, neg, 3, 0.0, 1.0, *scratch) == pytest.approx(0.6)
    out = np.empty(4)
    DVA.ivap_table(
        pos, neg, out, np.empty((DVA.IVAP_ROWS, 4)), np.empty((DVA.IVAP_IROWS, 4), np.int64)
    )
    assert np.all(np.diff(out) >= 0) and np.all((out > 0) & (out < 1))


def test_its_table_is_monotone_and_its_map_is_the_step_table():
    """The served map is the table's value of the score's log-odds bin: constant between the
    breakpoints sigmoid(edge) that the SQL step form tabulates, non-decreasing in the score."""
    rng = np.random.default_rng(4)
    x = rng.uniform(0.001, 0.999, 600)
    y = (rng.uniform(size=600) < x**3).astype(np.int64)
    cal = make_calibrator("decay-venn-abers", memory=200, n_bins=30)
    _, st = cal.run(x, y)
    w = np.asarray(st.weights)
    state = cal.load_state(w, np.array([0, w.size]), np.zeros(1), 2)
    ((bp, linear),) = cal.map_breakpoints(state)
    assert not linear and bp.size == 29
    mids = np.r_[bp[0] / 2, (bp[1:] + bp[:-1]) / 2, (bp[-1] + 1) / 2]
    got = cal.serving_map(state, mids[None, :])[0]
    table = w[2 + 2 * 30 :]
    np.testing.assert_array_equal(got, table)
    assert np.all(np.diff(table) >= -1e-15)
    # before the warm-up: the base passes through, no table
    fresh = cal.initial_state(1, 2)
    assert cal.map_breakpoints(fresh) == [None]


def test_it_follows_an_extreme_non_logistic_miscalibration_better_than_decay_beta():
    """Issue #34's case: scores pushed to the extremes by a non-logistic (cube-root-like)
    distortion of the log-odds; the IVAP's monotone step map beats decay-beta's beta map."""
    rng = np.random.default_rng(5)
    n = 8000
    z_true = rng.normal(-1.5, 1.5, n)
    z = np.sign(z_true) * np.abs(z_true) ** 3  # extreme, badly calibrated, monotone
    x = 1 / (1 + np.exp(-z))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z_true))).astype(np.int64)

    def loss(method):
        p = make_calibrator(method, memory=2000).run(x, y)[0].protected[-4000:]
        return float(-np.mean(np.log(np.clip(np.where(y[-4000:] == 1, p, 1 - p), 1e-300, 1))))

    assert loss("decay-venn-abers") < loss("decay-beta") - 0.005


def test_it_is_an_input_of_the_default_method():
    spec = input_spec("decay-venn-abers:memory=60:n_bins=20")
    assert spec == ("decay-venn-abers", (("memory", 60), ("n_bins", 20)))
    cal = make_calibrator("composite-experts", inputs=("ops", "decay-venn-abers:memory=60"))
    assert cal.classes == "binary" and cal.sql_form(2) == "terms"
    assert cal.table_input_indices() == [1]  # its map is a step table of its own
    kinds, _, _ = cal.lane_inputs()  # learnt inside the SIMD lanes kernel
    from calpipe.kernels import expert_lanes as EL

    assert kinds.tolist() == [EL.IN_OPS, EL.IN_DECAY_VA]
    # the input's column is the method run alone (the per-input path)
    rng = np.random.default_rng(6)
    x = rng.uniform(0.01, 0.99, 300)
    y = (rng.uniform(size=300) < x**2).astype(np.int64)
    inp = make_input(input_spec("decay-venn-abers:memory=60"), config.DEFAULT_CLIP_EPS)
    alone, _ = inp.run(x, y)
    grid = ((0.0, 1.0), (1.0, 0.5))
    mix = make_calibrator("composite-experts", inputs=("decay-venn-abers:memory=60",),
                          family_params=grid)  # fmt: skip
    out, _ = mix.run(x, y)
    assert np.all(np.isfinite(out.protected))
    assert np.any(alone.protected != x)  # it fitted (warm-up 30 labels)
