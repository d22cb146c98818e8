"""Forecast quality as polars expressions: log loss, Brier, accuracy, ECE, reliability bins.

Binary forecasts are the probability of label 1 (a Float64 column); multiclass forecasts are
list/array columns of class probabilities. Every function returns a ``pl.Expr`` so it can be used
in ``select``, ``group_by().agg`` and ``over`` alike; rows with a null label are ignored (their
outcome is unknown).

Example
-------
>>> import polars as pl
>>> df = pl.DataFrame({"p": [0.9, 0.2, 0.6], "y": [1, 0, 0]})
>>> df.select(
...     log_loss("p", "y").alias("log_loss"),
...     brier("p", "y").alias("brier"),
...     accuracy("p", "y").alias("accuracy"),
... ).select(pl.all().round(4)).row(0)
(0.4149, 0.1367, 0.6667)
"""

from __future__ import annotations

import math

import polars as pl

from calpipe import config

#: Probabilities are clipped to [LOG_LOSS_FLOOR, 1] inside log loss so that a 0 forecast of the
#: outcome costs -ln(1e-15) = 34.5 nats instead of infinity (scikit-learn's convention).
LOG_LOSS_FLOOR = 1e-15


def _vector(p: str) -> pl.Expr:
    """A multiclass forecast column as List[Float64], whether it is stored as List or Array."""
    return pl.col(p).cast(pl.List(pl.Float64))


def _p_of_label(p: str, y: str, multiclass: bool) -> pl.Expr:
    """The probability the forecast gave to the label that occurred."""
    if multiclass:
        return _vector(p).list.get(pl.col(y).cast(pl.Int64), null_on_oob=True)
    return pl.when(pl.col(y) == 1).then(pl.col(p)).otherwise(1.0 - pl.col(p))


def _labelled(expr: pl.Expr, y: str) -> pl.Expr:
    return expr.filter(pl.col(y).is_not_null())


def log_loss(p: str, y: str, *, multiclass: bool = False, base: float = math.e) -> pl.Expr:
    """Mean log loss -log p(y) (natural log by default; ``base=10`` for decimal)."""
    q = _p_of_label(p, y, multiclass).clip(LOG_LOSS_FLOOR, 1.0)
    return _labelled(-(q.log(base)), y).mean()


def cumulative_log10_loss(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Cumulative decimal log loss -sum log10 p(y) (paper 000 §5's measure)."""
    q = _p_of_label(p, y, multiclass).clip(LOG_LOSS_FLOOR, 1.0)
    return _labelled(-(q.log(10)), y).sum()


def brier(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Mean Brier loss: (p - y)^2 binary; sum_c (p_c - 1{y = c})^2 for K classes."""
    if multiclass:
        sq = _vector(p).list.eval(pl.element() ** 2).list.sum()
        expr = sq - 2.0 * _p_of_label(p, y, True) + 1.0
    else:
        expr = (pl.col(p) - pl.col(y).cast(pl.Float64)) ** 2
    return _labelled(expr, y).mean()


def accuracy(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Share of labelled events whose most probable class is the label (p >= 0.5 -> 1 binary)."""
    if multiclass:
        hit = _vector(p).list.arg_max() == pl.col(y).cast(pl.UInt32)
    else:
        hit = (pl.col(p) >= 0.5).cast(pl.Int64) == pl.col(y).cast(pl.Int64)
    return _labelled(hit.cast(pl.Float64), y).mean()


def ece(p: str, y: str, *, n_bins: int = 10) -> pl.Expr:
    """Binary expected calibration error with ``n_bins`` equal-width bins on [0, 1]:
    sum_b (n_b / n) |mean p in b - mean y in b|."""
    b = (pl.col(p) * n_bins).floor().clip(0, n_bins - 1)
    yy = pl.col(y).cast(pl.Float64)
    labelled = pl.col(y).is_not_null()
    n = labelled.sum()
    # Per-bin gaps via over(): each row carries its bin's |mean p - mean y| / n_b share.
    pm = pl.col(p).filter(labelled).mean().over(b)
    ym = yy.filter(labelled).mean().over(b)
    share = pl.when(labelled).then((pm - ym).abs()).otherwise(0.0)
    return (share.sum() / n).fill_nan(None)


def reliability_table(df: pl.DataFrame, p: str, y: str, *, n_bins: int = 10) -> pl.DataFrame:
    """Reliability-diagram bins: bin, count, mean forecast, observed frequency."""
    return (
        df.filter(pl.col(y).is_not_null())
        .with_columns((pl.col(p) * n_bins).floor().clip(0, n_bins - 1).cast(pl.Int32).alias("bin"))
        .group_by("bin")
        .agg(
            pl.len().alias("count"),
            pl.col(p).mean().alias("mean_forecast"),
            pl.col(y).cast(pl.Float64).mean().alias("observed"),
        )
        .sort("bin")
    )


def base_vs_protected(
    base: str, protected: str, y: str, *, multiclass: bool = False
) -> list[pl.Expr]:
    """Mean log loss and Brier of the base and of the protected forecasts, named
    ``base_log_loss``, ``protected_log_loss``, ``base_brier``, ``protected_brier``."""
    return [
        log_loss(base, y, multiclass=multiclass).alias("base_log_loss"),
        log_loss(protected, y, multiclass=multiclass).alias("protected_log_loss"),
        brier(base, y, multiclass=multiclass).alias("base_brier"),
        brier(protected, y, multiclass=multiclass).alias("protected_brier"),
    ]


def alarm(log10_martingale: str) -> pl.Expr:
    """True where the test martingale has reached the alarm level (S >= 100, Ville)."""
    return pl.col(log10_martingale) >= config.ALARM_LOG10_THRESHOLD
