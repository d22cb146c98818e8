"""calpipe.estimates: the performance of calibrated forecasts, before labels (#35 part 1).

Oracles: each event's mean and variance by enumerating its outcomes with the realized losses
of calpipe.metrics (a slow loop over events and labels, written from the definitions), and the
coverage of the interval on simulated calibrated nights against its nominal level.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe import config, metrics
from calpipe.estimates import expected_terms, grouped_estimates, normal_quantile

REALIZED = {
    "log_loss": metrics.grouped_log_loss,
    "brier": metrics.grouped_brier,
    "accuracy": metrics.grouped_accuracy,
}


def enumerate_outcomes(p: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per event: sum over its labels y of P(y) loss(y) and P(y) loss(y)^2 - mean^2, each
    loss the realized one of calpipe.metrics on that one event with that label."""
    n = p.shape[0]
    k = 2 if p.ndim == 1 else p.shape[1]
    out = {}
    for name, realized in REALIZED.items():
        mean, var = np.zeros(n), np.zeros(n)
        for i in range(n):
            m1 = m2 = 0.0
            for y in range(k):
                prob = (p[i] if y == 1 else 1.0 - p[i]) if p.ndim == 1 else p[i, y]
                loss = realized(p[i : i + 1], np.array([float(y)]), np.zeros(1, np.int64), 1)[0]
                m1 += prob * loss
                m2 += prob * loss * loss
            mean[i], var[i] = m1, m2 - m1 * m1
        out[name] = (mean, var)
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_binary_terms_equal_the_enumerated_outcomes(ps):
    p = np.array(ps)
    got, want = expected_terms(p), enumerate_outcomes(p)
    for name in REALIZED:
        np.testing.assert_allclose(got[name][0], want[name][0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[name][1], want[name][1], rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("k", [3, 5])
def test_k_class_terms_equal_the_enumerated_outcomes(k):
    rng = np.random.default_rng(k)
    p = rng.dirichlet(np.full(k, 0.7), 50)
    p[0] = np.eye(k)[1]  # a certain forecast: no variance
    got, want = expected_terms(p), enumerate_outcomes(p)
    for name in REALIZED:
        np.testing.assert_allclose(got[name][0], want[name][0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[name][1], want[name][1], rtol=1e-7, atol=1e-10)


def test_a_two_class_vector_gives_the_binary_estimate():
    p = np.array([0.1, 0.5, 0.93])
    binary, vector = expected_terms(p), expected_terms(np.column_stack([1 - p, p]))
    for name in ("log_loss", "accuracy"):
        np.testing.assert_allclose(vector[name][0], binary[name][0], rtol=1e-12)
    # K-class Brier sums both classes' squares: twice the binary (p - y)^2
    np.testing.assert_allclose(vector["brier"][0], 2 * binary["brier"][0], rtol=1e-12)


def test_grouped_estimates_are_each_group_s_means_and_intervals():
    p = np.array([0.9, 0.5, 0.2, 0.7, 0.6])
    ids = np.array([0, 0, 1, 1, 1])
    est = grouped_estimates(p, ids, 3, min_events=2)
    assert est["events"].tolist() == [2, 3, 0]
    terms = expected_terms(p)
    z = normal_quantile(config.ESTIMATE_LEVEL)
    for name, (mean, var) in terms.items():
        for g in (0, 1):
            rows = ids == g
            mu, sd = mean[rows].mean(), math.sqrt(var[rows].sum()) / rows.sum()
            assert est[f"expected_{name}"][g] == pytest.approx(mu, rel=1e-12)
            assert est[f"expected_{name}_low"][g] == pytest.approx(mu - z * sd, rel=1e-12)
            assert est[f"expected_{name}_high"][g] == pytest.approx(mu + z * sd, rel=1e-12)
        assert np.isnan(est[f"expected_{name}"][2])  # no events
    few = grouped_estimates(p, ids, 2, min_events=3)
    assert np.isnan(few["expected_brier_low"][0]) and not np.isnan(few["expected_brier_low"][1])
    assert not np.isnan(few["expected_brier"][0])  # the expected value without an interval


@pytest.mark.parametrize("k", [2, 3])
def test_grouped_estimates_in_chunks_are_the_whole_night_s_bit_for_bit(k, monkeypatch):
    """The terms are summed chunk by chunk (config.CHUNK_ROWS): the same sums in row order as
    np.bincount of each whole term, so every estimate is the same double."""
    rng = np.random.default_rng(k)
    p = rng.uniform(0, 1, 1000) if k == 2 else rng.dirichlet(np.ones(k), 1000)
    ids = rng.integers(0, 7, 1000)
    want = {}
    for name, (mean, var) in expected_terms(p).items():
        want[name] = (np.bincount(ids, weights=mean, minlength=7),
                      np.bincount(ids, weights=var, minlength=7))  # fmt: skip
    for chunk in (1, 33, 1 << 15):
        monkeypatch.setattr(config, "CHUNK_ROWS", chunk)
        est = grouped_estimates(p, ids, 7, min_events=1)
        n = np.bincount(ids, minlength=7)
        z = normal_quantile(config.ESTIMATE_LEVEL)
        for name, (m, v) in want.items():
            np.testing.assert_array_equal(est[f"expected_{name}"], m / n)
            np.testing.assert_array_equal(
                est[f"expected_{name}_high"], m / n + z * (np.sqrt(v) / n)
            )


def test_normal_quantile():
    assert normal_quantile(0.9) == pytest.approx(1.6448536269514722, abs=1e-12)
    assert normal_quantile(0.95) == pytest.approx(1.959963984540054, abs=1e-12)
    with pytest.raises(ValueError, match="level"):
        normal_quantile(1.0)


@pytest.mark.parametrize(
    ("events", "forecasts"),
    [(200, "uniform"), (200, "u-shaped"), (200, "k=4"),
     (config.ESTIMATE_MIN_EVENTS, "uniform"), (config.ESTIMATE_MIN_EVENTS, "k=4")],
)  # fmt: skip
def test_the_interval_covers_calibrated_nights_at_its_level(events, forecasts):
    """1,000 seeded nights of calibrated forecasts (labels drawn from them): the realized mean
    log loss, Brier score and accuracy fall inside the 90 % interval on a share of nights within
    3.3 binomial standard deviations of 0.90 (a two-sided 0.1 % test per loss). U-shaped
    forecasts on nights of few events: the next test."""
    rng = np.random.default_rng(sum(map(ord, forecasts)) + events)
    nights = 1_000
    n = nights * events
    if forecasts == "uniform":
        p = rng.uniform(0.02, 0.98, n)
        y = (rng.random(n) < p).astype(np.float64)
    elif forecasts == "u-shaped":
        p = rng.beta(0.5, 0.5, n).clip(1e-4, 1 - 1e-4)
        y = (rng.random(n) < p).astype(np.float64)
    else:
        p = rng.dirichlet(np.ones(4), n)
        y = (rng.random(n)[:, None] > p.cumsum(axis=1)).sum(axis=1).astype(np.float64)
    for name, share in coverage(p, y, events, nights).items():
        assert abs(share - LEVEL) <= tol(nights), (name, share)


LEVEL = config.ESTIMATE_LEVEL


def tol(nights: int) -> float:
    return 3.3 * math.sqrt(LEVEL * (1 - LEVEL) / nights)


def coverage(p, y, events: int, nights: int) -> dict[str, float]:
    ids = np.repeat(np.arange(nights), events)
    est = grouped_estimates(p, ids, nights)
    out = {}
    for name, realized in REALIZED.items():
        r = realized(p, y, ids, nights)
        inside = (r >= est[f"expected_{name}_low"]) & (r <= est[f"expected_{name}_high"])
        out[name] = float(inside.mean())
    return out


def test_few_events_of_u_shaped_forecasts_are_covered_at_least_at_the_level():
    """U-shaped forecasts (Beta(0.5, 0.5): many near 0 or 1) on nights of the fewest events
    with an interval: a mean of skewed log-loss terms, where the normal interval covers more
    than its level (0.93 measured), not less."""
    rng = np.random.default_rng(11)
    nights, events = 1_000, config.ESTIMATE_MIN_EVENTS
    p = rng.beta(0.5, 0.5, nights * events).clip(1e-4, 1 - 1e-4)
    y = (rng.random(p.shape[0]) < p).astype(np.float64)
    for name, share in coverage(p, y, events, nights).items():
        assert share >= LEVEL - tol(nights), (name, share)


def test_the_interval_misses_a_miscalibrated_forecaster():
    """Forecasts of 0.8 for events of frequency 0.5: the expected log loss (what the forecasts
    believe) is far below the realized one, outside its interval on nearly every night."""
    rng = np.random.default_rng(7)
    nights, events = 200, 100
    p = np.full(nights * events, 0.8)
    y = (rng.random(p.shape[0]) < 0.5).astype(np.float64)
    ids = np.repeat(np.arange(nights), events)
    est = grouped_estimates(p, ids, nights)
    r = metrics.grouped_log_loss(p, y, ids, nights)
    assert (r > est["expected_log_loss_high"]).mean() > 0.95
