"""Published numbers and the reference package (docs/ARCHITECTURE.md §7 oracles; docs/REFERENCE_DATA.md).

* Jumper (paper 000 Alg. 2, martingale Alg. 1, quadratic family eq. (1)) on ``score_rf100_trunc``:
  final log10 test martingale and cumulative decimal log loss for J = 0.1, 0.01, 0.001.
* Composite Jumper defaults (paper 001 Alg. 1) on ``score_rf100_trunc`` and on ``score_rf1000``
  clipped at the default 1e-3.
* ``loss="brier"`` against ``protected-classification`` 0.1.5: its stored outputs on
  ``score_rf1000`` at every event, and the package itself on random K = 3 and 5 class streams.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import calpipe

#: The project's reference data live in shared/ beside the repository (docs/REFERENCE_DATA.md);
#: CALPIPE_SHARED_DATA points elsewhere.
DATA = Path(
    os.environ.get("CALPIPE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
SCORED = DATA / "bank_marketing_scored.parquet"
REFERENCE = DATA / "bank_reference_protected_classification_0.1.5.parquet"
ORDER = ("event_date", "event_id")


def _read(path: Path) -> pl.DataFrame:
    if not path.exists():
        pytest.skip(f"reference data {path} is absent (shared/data beside the repository)")
    return pl.read_parquet(path)


@pytest.fixture(scope="module")
def bank() -> pl.DataFrame:
    return _read(SCORED).sort("event_id")


def _replayed(out: pl.DataFrame, col: str = "protected_score") -> tuple[np.ndarray, ...]:
    """(protected P(y=1), label, log10 martingale) in replay order."""
    o = out.sort(ORDER)
    return o[col].to_numpy(), o["label"].to_numpy().astype(int), o["log10_martingale"].to_numpy()


def _decimal_log_loss(p: np.ndarray, y: np.ndarray) -> float:
    """Cumulative decimal log loss -sum_n log10 p_n(y_n) (paper 000 §5)."""
    return float(-np.sum(np.log10(np.where(y == 1, p, 1.0 - p))))


# ----------------------------------------------------------------------------------------------
# Paper 000 §5: the Jumper on score_rf100_trunc
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_base_rf100_trunc_decimal_log_loss_is_5684_1(bank):
    assert bank["event_date"].is_sorted()  # replay order (event_date, event_id) = event_id order
    p = bank["score_rf100_trunc"].to_numpy()
    assert p.min() >= 0.1 and p.max() <= 0.9  # the Jumper's default clip 1e-3 leaves it alone
    assert _decimal_log_loss(p, bank["label"].to_numpy()) == pytest.approx(5684.1, abs=0.1)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("jump", "log10_martingale", "loss"),
    [(0.1, 601.7, 5082.4), (0.01, 919.3, 4764.8), (0.001, 959.5, 4724.6)],
)
def test_jumper_quadratic_on_rf100_trunc_matches_published_martingale_and_log_loss(
    bank, jump, log10_martingale, loss
):
    out = calpipe.protect(
        bank,
        score="score_rf100_trunc",
        method="jumper",
        family="quadratic",
        jumping_rates=(jump,),
        order_by=ORDER,
        by=(),
    )
    p, y, m = _replayed(out)
    assert m[-1] == pytest.approx(log10_martingale, abs=0.1)
    assert _decimal_log_loss(p, y) == pytest.approx(loss, abs=0.1)
    # Lemma 1 (paper 000 §4): log10 S_N = base loss - protected loss
    base = _decimal_log_loss(bank["score_rf100_trunc"].to_numpy(), bank["label"].to_numpy())
    assert m[-1] == pytest.approx(base - _decimal_log_loss(p, y), abs=1e-6)


@pytest.mark.slow
def test_composite_jumper_defaults_on_rf100_trunc_match_provenance(bank):
    out = calpipe.protect(
        bank, score="score_rf100_trunc", order_by=ORDER, by=(), method="composite-jumper"
    )
    p, y, m = _replayed(out)
    assert m[-1] == pytest.approx(1554.6, abs=0.1)
    assert _decimal_log_loss(p, y) == pytest.approx(4129.5, abs=0.1)


@pytest.mark.slow
def test_composite_jumper_defaults_on_rf1000_clipped_match_provenance(bank):
    out = calpipe.protect(
        bank, score="score_rf1000", order_by=ORDER, by=(), method="composite-jumper"
    )
    p, y, _ = _replayed(out)
    base = np.clip(out.sort(ORDER)["score_rf1000"].to_numpy(), 1e-3, 1.0 - 1e-3)

    def mean_ln_loss(q):
        return float(-np.mean(np.log(np.where(y == 1, q, 1.0 - q))))

    assert mean_ln_loss(base) == pytest.approx(0.5169, abs=5e-4)
    assert mean_ln_loss(p) == pytest.approx(0.2793, abs=5e-4)
    assert float(np.mean((p - y) ** 2)) == pytest.approx(0.0902, abs=5e-4)
    assert float(np.mean((p > 0.5) == (y == 1))) == pytest.approx(0.8703, abs=5e-4)


# ----------------------------------------------------------------------------------------------
# Brier compatibility: protected-classification 0.1.5
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_brier_mode_on_rf1000_equals_package_reference_at_every_event(bank):
    ref = _read(REFERENCE)
    out = calpipe.protect(
        bank,
        score="score_rf1000",
        order_by=ORDER,
        by=(),
        method="composite-jumper",
        loss="brier",
        clip=None,
    )
    joined = out.join(
        ref.select(pl.exclude("score_rf1000", "label")), on="event_id", how="inner"
    ).sort(ORDER)
    assert joined.height == bank.height == ref.height
    np.testing.assert_allclose(
        joined["protected_score"].to_numpy(),
        joined["ref_protected_score"].to_numpy(),
        rtol=0,
        atol=1e-12,
    )
    np.testing.assert_allclose(
        joined["log10_martingale"].to_numpy(), joined["ref_log10_cj"].to_numpy(), rtol=0, atol=1e-9
    )
    by_rate = np.array(joined["log10_martingale_by_rate"].to_list())  # rates 1e-2, 1e-3, 1e-4
    ref_by_rate = joined.select("ref_log10_sj_1e-2", "ref_log10_sj_1e-3", "ref_log10_sj_1e-4")
    np.testing.assert_allclose(by_rate, ref_by_rate.to_numpy(), rtol=0, atol=1e-9)


def _random_multiclass_stream(k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, 0.8), size=n)
    tilt = p**0.5 * np.exp(rng.normal(0.0, 0.7, k))  # a drifted truth, so the weights move
    tilt /= tilt.sum(axis=1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in tilt])
    y[rng.choice(n, size=k, replace=False)] = np.arange(
        k
    )  # the package encodes the classes it sees
    return p, y


@pytest.mark.parametrize(("k", "seed"), [(3, 0), (5, 1)])
def test_brier_mode_multiclass_equals_package_predict_proba(k, seed):
    from protected_classification import ProtectedClassification

    n = 240
    p, y = _random_multiclass_stream(k, n, seed)
    expected, stats = ProtectedClassification().predict_proba(test_probs=p, y=y, return_stats=True)

    shuffle = np.random.default_rng(seed + 10).permutation(n)  # input row order must not matter
    frame = pl.DataFrame(
        {
            "event_time": np.arange(n)[shuffle],
            "event_id": np.arange(n)[shuffle],
            "scores": p[shuffle].tolist(),
            "label": y[shuffle],
        }
    )
    out = calpipe.protect(
        frame,
        scores="scores",
        method="composite-jumper",
        order_by=("event_time", "event_id"),
        by=(),
        loss="brier",
        clip=None,
    ).sort("event_id")
    got = np.array(out["protected_scores"].to_list())
    assert got.shape == (n, k)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        out["log10_martingale"].to_numpy(), stats["log_cj_martingale"][1:], rtol=0, atol=1e-9
    )
    by_rate = np.array(out["log10_martingale_by_rate"].to_list())
    np.testing.assert_allclose(by_rate, stats["log_sj_martingale"][:, 1:].T, rtol=0, atol=1e-9)
