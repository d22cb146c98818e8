"""``performance_estimates`` rows: each night's performance per stream, estimated from its
forecasts alone, before any label arrives (issue #35, part 1).

For the night's protected forecasts and, beside them, the base's: the expected log loss, Brier
score and accuracy if the forecasts are calibrated, each with its
:data:`calpipe.config.ESTIMATE_LEVEL` interval (the maths: :mod:`calpipe.estimates`). The base's
estimate is what a monitoring tool that trusts the model's scores (NannyML's CBPE) would report;
a miscalibrated base makes it misleading, which the realized values show once labels are in.

The table holds only what the night knows for sure, so a partition never changes after its
night (re-running a night writes the same rows). The realized values, which later nights' labels
fill in, are the view ``v_performance_estimates`` (``sql/002_views.sql``): the estimates beside
the losses of every label known now, the event's own and the label feed's.

Example
-------
>>> import datetime as dt
>>> rows = pl.DataFrame({"stream": ["a", "a", "b"], "base_score": [0.9, 0.5, 0.2],
...                      "protected_score": [0.8, 0.5, 0.3]})
>>> est = estimate_rows(rows, dt.date(2024, 3, 1))
>>> est.select("stream", "events", pl.col("expected_accuracy").round(3)).rows()
[('a', 2, 0.65), ('b', 1, 0.7)]
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from calpipe.estimates import ESTIMATES, grouped_estimates
from calpipe.night.monitoring import class_vectors, stream_groups

#: The estimate columns of each forecast, in the table's order (``base_`` before the base's).
ESTIMATE_COLUMNS: tuple[str, ...] = tuple(
    f"expected_{loss}{bound}" for loss in ESTIMATES for bound in ("", "_low", "_high")
)


def _forecasts(rows: pl.DataFrame, column: str) -> np.ndarray:
    """A forecast column as (n,) binary or (n, K) class probabilities."""
    if column.endswith("_scores"):  # K classes: list columns
        return class_vectors(rows[column])
    return rows[column].cast(pl.Float64).to_numpy()


def estimate_rows(
    protected: pl.DataFrame,
    day: dt.date | None,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
) -> pl.DataFrame:
    """``performance_estimates`` rows of ``day``'s ``protected_scores`` rows (``protected``),
    one per stream, sorted by stream: ``date``, ``stream``, ``events``, then
    :data:`ESTIMATE_COLUMNS` of the protected forecasts and the same prefixed ``base_`` of the
    base's (:func:`calpipe.estimates.grouped_estimates`: per-group sums in row order, so the
    same rows in the same order give the same bits). ``groups``: ``stream_groups(protected,
    ["stream"])`` when the caller has it.

    ``day=None``: several days at once, per (``event_date``, stream) (a span of the nightly
    run): the same rows as day by day.
    """
    keys = ["stream"] if day is not None else ["event_date", "stream"]
    ids, first = stream_groups(protected, keys) if groups is None or day is None else groups
    s = "s" if "base_scores" in protected.columns else ""
    values: dict[str, np.ndarray] = {}
    for who, column in (("", f"protected_score{s}"), ("base_", f"base_score{s}")):
        est = grouped_estimates(_forecasts(protected, column), ids, first.shape[0])
        values.setdefault("events", est["events"])
        values |= {f"{who}{c}": est[c] for c in ESTIMATE_COLUMNS}
    keyed = protected.select(keys)[first.tolist()]
    if day is None:
        keyed = keyed.rename({"event_date": "date"})
    else:
        keyed = keyed.select(pl.lit(day, pl.Date).alias("date"), "stream")
    # NaN (no interval below ESTIMATE_MIN_EVENTS events) is stored as NULL: "not estimated"
    out = pl.DataFrame(values).with_columns(
        pl.col(pl.Float64).fill_nan(None), pl.col("events").cast(pl.Int64)
    )
    return pl.concat([keyed, out], how="horizontal").sort("date", "stream")


__all__ = ["ESTIMATE_COLUMNS", "estimate_rows"]
