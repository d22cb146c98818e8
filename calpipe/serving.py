"""The serving map in polars: each stream's map p -> p' at the end of its state, applied to fresh
scores (docs/ARCHITECTURE.md §4), for every method. The SQL form of the same maps is
:mod:`calpipe.pipeline.mapping` with ``sql/003_macros.sql``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from calpipe import config
from calpipe.calibrators import Calibrator, make_calibrator
from calpipe.contract import Rule, check_rules
from calpipe.frame import state_from_rows


def serving_map(
    state: pl.DataFrame,
    scores: pl.DataFrame,
    *,
    method: str = config.DEFAULT_METHOD,
    base_method: str | None = None,
    base_params: dict | None = None,
    score: str = "score",
    stream: str = "stream",
    **params,
) -> pl.DataFrame:
    """Apply each stream's serving map (its state's next forecast) to fresh scores.

    ``state`` is a state frame (one row per stream, from :func:`calpipe.protect_with_state` or
    the ``calibrator_state`` table), made by ``method`` with ``params`` (and ``base_method`` /
    ``base_params`` for a stack: give what made the state, as to :func:`calpipe.protect`; a
    state of another configuration is refused by its fingerprint). ``scores`` has the stream
    column and a ``score`` column (binary: Float64; K classes: a list of K floats); a score
    (a class probability) outside [0, 1] is an :class:`~calpipe.errors.InputError` naming its
    row, as in :func:`calpipe.protect` (the map would clip it silently). Returns
    ``scores`` with ``protected_score`` (or ``protected_scores``), null for streams without
    state: what an unlabelled event with that score would be forecast, learning nothing. Uses
    the calibrator's own :meth:`~calpipe.calibrators.base.Calibrator.serving_map` (the kernel),
    one vectorized call for all rows.

    >>> import calpipe, polars as pl
    >>> ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [0, 1, 1]})
    >>> st = calpipe.protect_with_state(ev).state
    >>> fresh = pl.DataFrame({"stream": ["a", "b"], "score": [0.5, 0.5]})
    >>> out = calpipe.serving_map(st, fresh)
    >>> round(out["protected_score"][0], 4), out["protected_score"][1]
    (0.5067, None)
    """
    cal = make_calibrator(method, base_method=base_method, base_params=base_params, **params)
    return apply_serving_map(state, scores, cal, score=score, stream=stream)


def apply_serving_map(
    state: pl.DataFrame,
    scores: pl.DataFrame,
    cal: Calibrator,
    *,
    score: str = "score",
    stream: str = "stream",
) -> pl.DataFrame:
    """:func:`serving_map` with a calibrator object."""
    multiclass = isinstance(scores.schema[score], pl.List | pl.Array)
    out_name = "protected_scores" if multiclass else "protected_score"
    joined = scores.with_row_index("__row").join(
        state.select(stream, "method", "weights", "log10_martingale", "config_fingerprint"),
        on=stream, how="left", maintain_order="left",
    )  # fmt: skip
    has = joined["weights"].is_not_null().to_numpy()
    k = 2
    if multiclass:
        k = (
            int(joined[score].list.len().max())
            if isinstance(scores.schema[score], pl.List)
            else scores.schema[score].size
        )
    _check_scores(scores, score, multiclass)
    fp = cal.fingerprint(k)
    bad = joined.filter(
        pl.col("config_fingerprint").is_not_null() & (pl.col("config_fingerprint") != fp)
    )
    if bad.height:
        cal.check_state(bad["config_fingerprint"][0], bad["method"][0], k)
    sub = joined.filter(pl.Series(has))
    n = sub.height
    result = np.full((joined.height, k) if multiclass else joined.height, np.nan)
    if n:
        bstate = state_from_rows(cal, sub, k)
        if multiclass:
            col_in = sub[score]
            arr = col_in.list.to_array(k) if isinstance(col_in.dtype, pl.List) else col_in
            x = arr.cast(pl.Array(pl.Float64, k)).to_numpy().reshape(n, 1, k)
        else:
            x = sub[score].cast(pl.Float64).to_numpy()[:, None]
        mapped = cal.serving_map(bstate, np.ascontiguousarray(x))
        result[has] = mapped[:, 0]
    if multiclass:
        col = pl.Series(out_name, result).cast(pl.Array(pl.Float64, k)).cast(pl.List(pl.Float64))
        col = pl.select(pl.when(pl.Series(has)).then(col)).to_series().alias(out_name)
    else:
        col = pl.Series(out_name, result).fill_nan(None)
    return scores.with_columns(col)


def _check_scores(scores: pl.DataFrame, score: str, multiclass: bool) -> None:
    """InputError naming the row of the first score (class probability) outside [0, 1],
    infinities included; null and NaN scores are no forecast (null out), as in the SQL map."""
    c = pl.col(score)
    if multiclass:
        x = c.arr.to_list() if isinstance(scores.schema[score], pl.Array) else c
        out = x.list.eval((pl.element() < 0) | ((pl.element() > 1) & pl.element().is_not_nan()))
        rule = Rule(score, "a class probability outside [0, 1] (scores are base probabilities)",
                    out.list.any())  # fmt: skip
    else:
        x = c.cast(pl.Float64)
        rule = Rule(score, "score outside [0, 1] (scores are base probabilities)",
                    (x < 0) | ((x > 1) & x.is_not_nan()))  # fmt: skip
    check_rules(scores, [rule])
