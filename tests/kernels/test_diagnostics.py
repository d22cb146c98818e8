"""calpipe.kernels.diagnostics (through calpipe.metrics) against the definitions and the reference
packages:

* smooth ECE: against the integral evaluated point by point from Błasiok & Nakkiran's Definition
  5 (every kernel image, a fine trapezoid), to 1e-3 relative, and its fixed point (Definition 6)
  bracketed to 0.2 % by the exact integral;
  against relplot.smECE (dev oracle, which discretises more coarsely: its bandwidth search stops
  at 2^-10) to 2e-3; the properties the paper states (one-signed residuals give mean |y - f| at
  every sigma; smECE_sigma does not increase with sigma; sigma* is a fixed point).
* CORP: against a literal PAV on exact fractions (tests/naive_isotonic.py) and against
  model_diagnostics.scoring.decompose (dev oracle) for the log and Brier scores, to 1e-12;
  score = MCB - DSC + UNC; MCB, DSC >= 0; a recalibrated forecast has MCB 0.
* Grouped forms: every group equals the group alone; row order does not matter.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe import metrics
from calpipe.kernels.diagnostics import smooth_ece_at
from tests.naive_isotonic import pav


# ----------------------------------------------------------------------------------------------
# Oracles written from the papers
# ----------------------------------------------------------------------------------------------
def smooth_ece_sigma_exact(f, y, sigma):
    """Definition 5 point by point: int_0^1 |(1/n) sum_i K(t, f_i)(y_i - f_i)| dt, K the
    reflected Gaussian (images t - f + 2k and t + f + 2k for every k whose image can lie within
    10 sigma of [0, 1]), trapezoid on max(2001, 80 / sigma) points."""
    points = max(2001, int(80 / sigma))
    t = np.linspace(0.0, 1.0, points)
    g = np.zeros(points)
    r = y - f
    kmax = int(np.ceil(10 * sigma / 2)) + 1
    c = 1.0 / (np.sqrt(2 * np.pi) * sigma)
    for k in range(-kmax, kmax + 1):
        for sgn in (-1.0, 1.0):
            for i in range(0, f.size, 500):
                z = (t[:, None] + sgn * f[None, i : i + 500] + 2 * k) / sigma
                g += (c * np.exp(-0.5 * z * z)) @ r[i : i + 500]
    return np.trapezoid(np.abs(g / f.size), t)


def corp_naive(f, y, score):
    """CORP (Dimitriadis et al. 2021): PAV on exact-tie-pooled forecasts (Fractions), then
    MCB = S(f) - S(f_hat), DSC = S(ybar) - S(f_hat), UNC = S(ybar)."""
    order = np.argsort(f, kind="stable")
    fs, ys = f[order].tolist(), y[order].tolist()
    vals, wts, members = [], [], []
    for v, yy in zip(fs, ys, strict=True):
        if members and v == members[-1][0]:
            members[-1][1].append(yy)
        else:
            members.append((v, [yy]))
    for _, ylist in members:
        vals.append(sum(ylist) / len(ylist))
        wts.append(len(ylist))
    fitted = pav(vals, wts)
    fhat = np.repeat([float(v) for v in fitted], wts)
    yy = np.asarray(ys)

    def s(p):
        p = np.broadcast_to(np.asarray(p, float), yy.shape)
        if score == "brier":
            return float(np.mean((p - yy) ** 2))
        q = np.where(yy == 1, p, 1 - p)
        with np.errstate(divide="ignore"):
            return float(np.mean(-np.log(np.clip(q, metrics.LOG_LOSS_FLOOR, 1))))

    ybar = yy.mean()
    sf, sh, sc = s(np.asarray(fs)), s(fhat), s(ybar)
    return {"miscalibration": sf - sh, "discrimination": sc - sh, "uncertainty": sc, "score": sf}


def _data(seed, n, kind):
    rng = np.random.default_rng(seed)
    f = rng.beta(0.7, 2.5, size=n)
    truth = {"calibrated": f, "over": f**1.5, "under": np.sqrt(f)}[kind]
    y = (rng.uniform(size=n) < truth).astype(float)
    return f, y


def _one(f, y):
    return float(metrics.grouped_smooth_ece(f, y, np.zeros(f.size, np.int64), 1)[0])


# ----------------------------------------------------------------------------------------------
# Smooth ECE
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seed", "n", "kind"),
    [(0, 40, "over"), (1, 300, "calibrated"), (2, 1000, "under"), (3, 1500, "calibrated")],
)
def test_smooth_ece_equals_the_definition(seed, n, kind):
    # Definition 6 by the definition: the exact smECE_sigma is above sigma just below our sigma*
    # and below it just above (so the exact fixed point lies within 0.2 % of ours: smECE_sigma is
    # monotone), and equals our value at sigma*
    f, y = _data(seed, n, kind)
    value, sigma = metrics.grouped_smooth_ece(f, y, np.zeros(n, np.int64), 1, return_sigma=True)
    s = float(sigma[0])
    assert smooth_ece_sigma_exact(f, y, s * 0.998) > s * 0.998
    assert smooth_ece_sigma_exact(f, y, s * 1.002) < s * 1.002
    assert value[0] == pytest.approx(smooth_ece_sigma_exact(f, y, s), rel=1e-3)


@pytest.mark.parametrize("sigma", [0.004, 0.03, 0.2, 0.9])
def test_smooth_ece_at_a_bandwidth_equals_the_integral(sigma):
    f, y = _data(7, 1000, "calibrated")
    got = smooth_ece_at(f, y, sigma)
    assert got == pytest.approx(smooth_ece_sigma_exact(f, y, sigma), rel=1e-3, abs=1e-7)


@pytest.mark.parametrize(("seed", "kind"), [(0, "over"), (1, "calibrated"), (2, "under")])
def test_smooth_ece_equals_relplot(seed, kind):
    relplot = pytest.importorskip("relplot")
    f, y = _data(seed, 5000, kind)
    assert _one(f, y) == pytest.approx(relplot.smECE(f, y), abs=2e-3)


def test_smooth_ece_is_its_own_bandwidth():
    f, y = _data(4, 2000, "under")
    value, sigma = metrics.grouped_smooth_ece(f, y, np.zeros(f.size, np.int64), 1,
                                              return_sigma=True)  # fmt: skip
    assert value[0] == pytest.approx(sigma[0], rel=1e-4)


def test_smooth_ece_of_one_signed_residuals_is_the_mean_gap():
    # g never changes sign, so int |g| = int g = mean (y - f) at every bandwidth
    f = np.array([0.1, 0.3, 0.3, 0.6, 0.95])
    y = np.ones(5)
    assert _one(f, y) == pytest.approx(np.mean(1 - f), rel=1e-6)


def test_smooth_ece_does_not_increase_with_the_bandwidth():
    f, y = _data(5, 3000, "calibrated")
    vals = [smooth_ece_at(f, y, s, 64.0) for s in np.geomspace(0.005, 1.0, 25)]
    assert all(b <= a * (1 + 1e-4) for a, b in itertools.pairwise(vals))


def test_smooth_ece_of_a_calibrated_large_sample_is_small_and_bad_forecasts_large():
    f, y = _data(6, 50_000, "calibrated")
    assert _one(f, y) < 0.01
    assert _one(np.clip(f + 0.2, 0, 1), y) > 0.15


def test_smooth_ece_k_classes_is_the_top_label_problem():
    rng = np.random.default_rng(8)
    p = rng.dirichlet(np.ones(4), size=500)
    y = np.array([rng.choice(4, p=row) for row in p], dtype=float)
    conf, hit = metrics.top_label(p, y)
    ids = np.zeros(500, np.int64)
    assert metrics.grouped_smooth_ece(p, y, ids, 1)[0] == _one(conf, hit)


# ----------------------------------------------------------------------------------------------
# CORP
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("score", ["log", "brier"])
@pytest.mark.parametrize(("seed", "kind"), [(0, "over"), (1, "calibrated"), (2, "under")])
def test_corp_equals_the_literal_pav(score, seed, kind):
    f, y = _data(seed, 400, kind)
    f = np.round(f, 2)  # ties, pooled
    got = metrics.grouped_corp(f, y, np.zeros(f.size, np.int64), 1)
    want = corp_naive(f, y, score)
    for k, v in want.items():
        assert got[f"{score}_{k}"][0] == pytest.approx(v, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("score", ["log", "brier"])
def test_corp_equals_model_diagnostics(score):
    md = pytest.importorskip("model_diagnostics.scoring")
    f, y = _data(9, 3000, "under")
    f = np.round(f, 3)
    sf = md.LogLoss() if score == "log" else md.SquaredError()
    want = md.decompose(y, f, scoring_function=sf).row(0, named=True)
    got = metrics.grouped_corp(f, y, np.zeros(f.size, np.int64), 1)
    for k in metrics.CORP_FIELDS:
        assert got[f"{score}_{k}"][0] == pytest.approx(want[k], rel=1e-10)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 200), n_groups=st.integers(1, 5))
def test_corp_identity_signs_and_groups(seed, n, n_groups):
    rng = np.random.default_rng(seed)
    f = np.round(rng.uniform(size=n), int(rng.integers(1, 4)))
    y = (rng.uniform(size=n) < f).astype(float)
    ids = rng.integers(0, n_groups, size=n)
    d = metrics.grouped_corp(f, y, ids, n_groups)
    for g in range(n_groups):
        m = ids == g
        if not m.any():
            assert all(np.isnan(v[g]) for v in d.values())
            continue
        alone = metrics.grouped_corp(f[m], y[m], np.zeros(m.sum(), np.int64), 1)
        for k, v in d.items():
            assert v[g] == alone[k][0]  # bit for bit: each group's sums run alone
        for s in ("log", "brier"):
            mcb, dsc = d[f"{s}_miscalibration"][g], d[f"{s}_discrimination"][g]
            unc, tot = d[f"{s}_uncertainty"][g], d[f"{s}_score"][g]
            assert mcb >= -1e-12 and dsc >= -1e-12
            assert tot == pytest.approx(mcb - dsc + unc, abs=1e-12)


def test_corp_of_the_recalibrated_forecast_has_no_miscalibration():
    f, y = _data(3, 500, "over")
    f = np.round(f, 2)
    d = metrics.grouped_corp(f, y, np.zeros(f.size, np.int64), 1)
    # the PAV fit itself: recalibrating it again changes nothing
    naive = corp_naive(f, y, "brier")
    fhat_brier = naive["score"] - naive["miscalibration"]
    assert d["brier_score"][0] - d["brier_miscalibration"][0] == pytest.approx(fhat_brier)
    order = np.argsort(f, kind="stable")
    vals = {}
    for v, yy in zip(f[order], y[order], strict=True):
        vals.setdefault(v, []).append(yy)
    fitted = pav([sum(v) / len(v) for v in vals.values()], [len(v) for v in vals.values()])
    lookup = dict(zip(vals, (float(x) for x in fitted), strict=True))
    fh = np.array([lookup[v] for v in f])
    d2 = metrics.grouped_corp(fh, y, np.zeros(f.size, np.int64), 1)
    assert d2["brier_miscalibration"][0] == pytest.approx(0.0, abs=1e-15)
    assert d2["log_miscalibration"][0] == pytest.approx(0.0, abs=1e-12)


def test_corp_rejects_k_class_forecasts():
    with pytest.raises(ValueError, match="binary forecasts only"):
        metrics.grouped_corp(np.full((3, 2), 0.5), np.zeros(3), np.zeros(3, np.int64), 1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 300))
def test_row_order_does_not_matter(seed, n):
    rng = np.random.default_rng(seed)
    f = np.round(rng.uniform(size=n), 2)
    y = (rng.uniform(size=n) < f).astype(float)
    perm = rng.permutation(n)
    ids = np.zeros(n, np.int64)
    a, b = metrics.grouped_corp(f, y, ids, 1), metrics.grouped_corp(f[perm], y[perm], ids, 1)
    for k in a:
        assert a[k][0] == pytest.approx(b[k][0], rel=1e-12, abs=1e-15)
    assert _one(f, y) == pytest.approx(_one(f[perm], y[perm]), rel=1e-9)


def test_grouped_smooth_ece_equals_each_group_alone():
    rng = np.random.default_rng(11)
    f = rng.uniform(size=900)
    y = (rng.uniform(size=900) < f**1.2).astype(float)
    ids = rng.integers(0, 4, size=900)
    got = metrics.grouped_smooth_ece(f, y, ids, 5)
    for g in range(4):
        assert got[g] == _one(f[ids == g], y[ids == g])
    assert math.isnan(got[4])


@pytest.mark.parametrize(
    ("f", "y", "sigma", "match"),
    [
        ([0.2, 1.3], [0.0, 1.0], 0.1, r"f must lie in \[0, 1\]"),
        ([0.2, 0.3], [0.0], 0.1, "1-d of one length"),
        ([0.2, 0.3], [0.0, 1.0], 0.0, "sigma must be > 0"),
    ],
)
def test_smooth_ece_at_refuses_bad_input_by_name(f, y, sigma, match):
    with pytest.raises(ValueError, match=match):
        smooth_ece_at(np.array(f), np.array(y), sigma)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.one_of(st.floats(-0.5, 1.5), st.sampled_from([0.0, 1.0, math.nan, math.inf])),
            st.sampled_from([0.0, 1.0]),
        ),
        max_size=60,
    ),
    st.integers(1, 20),
)
def test_bin_cells_equal_numpy_bincount_to_the_bit(rows, n_bins):
    """The ECE's cells in one pass equal the numpy form they replaced (clip the bin of
    nan_to_num(p) * n_bins into [0, n_bins - 1], then np.bincount), every bit."""
    from calpipe.kernels.diagnostics import bin_cells

    ids = np.array([r[0] for r in rows], dtype=np.int64)
    p = np.array([r[1] for r in rows], dtype=np.float64)
    y = np.array([r[2] for r in rows], dtype=np.float64)
    b = np.clip(np.nan_to_num(p) * n_bins, 0, n_bins - 1).astype(np.int64)
    idx, size = ids * n_bins + b, 3 * n_bins
    count, sum_p, sum_y = bin_cells(p, y, ids, 3, n_bins)
    assert count.tolist() == np.bincount(idx, minlength=size).tolist()
    np.testing.assert_array_equal(sum_p, np.bincount(idx, weights=p, minlength=size))
    np.testing.assert_array_equal(sum_y, np.bincount(idx, weights=y, minlength=size))
