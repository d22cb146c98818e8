"""Stacking keeps paper 001's insurance: protecting any calibrator costs at most ln(1/pi).

The Composite Jumper's cumulative natural log loss is at most that of its base forecasts plus
ln(1/pi) (paper 001 §2: the passive weight pi keeps S >= pi, and loss(base) - loss(protected) =
ln S). Stacked on a calibrator X, the base forecasts are X's outputs as the Jumper reads them
(the ``base_method_score`` column, clipped to [clip, 1 - clip]), so on the bank stream, for every
method X and several pi, we check

    sum_i -ln p'_i(y_i)  <=  sum_i -ln x_i(y_i) + ln(1/pi)

with p' the stack's forecasts (unclipped) and x the base-method scores, and that the stack's
log10_martingale is exactly the difference.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe.calibrators import METHODS, PROTECTED_METHODS
from calpipe.calibrators.windowed import WindowedCalibrator

ORDER = ("event_date", "event_id")
#: The demo copy the project ships (same rows as shared/data's, see data/README.md).
BANK = Path(__file__).resolve().parents[1] / "data" / "bank_marketing_scored.parquet"
OTHERS = [m for m in METHODS if m not in PROTECTED_METHODS]  # every method takes a binary score


@pytest.fixture(scope="module")
def bank() -> pl.DataFrame:
    return pl.read_parquet(BANK)


def _cum_loss(p, y):
    return float(-np.sum(np.log(np.where(y == 1, p, 1.0 - p))))


@pytest.mark.slow
@pytest.mark.parametrize("pi", [0.5, 0.1])
@pytest.mark.parametrize("method", OTHERS)
def test_protecting_a_calibrator_costs_at_most_ln_one_over_pi(bank, method, pi):
    ev = bank
    cls = METHODS[method]
    params = {"window": 2000, "refit_every": 1000} if issubclass(cls, WindowedCalibrator) else {}
    out = calpipe.protect(
        ev, score="score_rf1000", order_by=ORDER, method="composite-jumper", pi=pi,
        base_method=method, base_params=params,
    ).sort(ORDER)  # fmt: skip
    y = out["label"].to_numpy()
    stack = _cum_loss(out["protected_score"].to_numpy(), y)
    alone = _cum_loss(np.clip(out["base_method_score"].to_numpy(), 1e-3, 1 - 1e-3), y)
    assert stack <= alone + math.log(1 / pi) + 1e-9
    assert math.isclose(alone - stack, math.log(10) * out["log10_martingale"][-1], abs_tol=1e-6)
    # the base-method column is the method alone (the Jumper reads it clipped)
    solo = calpipe.protect(ev, score="score_rf1000", order_by=ORDER, method=method, **params)
    solo = solo.sort(ORDER)["protected_score"].to_numpy()
    np.testing.assert_array_equal(out["base_method_score"].to_numpy(), solo)
