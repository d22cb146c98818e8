"""The serving map in polars: each stream's map p -> p' at the end of its state, applied to fresh
scores (docs/ARCHITECTURE.md §4), for every method. The SQL form of the same maps is
:mod:`calpipe.night.mapping` with the macros of ``sql/macros/``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from calpipe import config
from calpipe.calibrators import Calibrator, make_calibrator
from calpipe.engine import state_from_rows
from calpipe.engine.contract import Rule, check_rules, probability_rules
from calpipe.errors import InputError


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
    column and a ``score`` column (binary: Float64; K classes: a list of K floats). A score
    that :func:`calpipe.protect` refuses is an :class:`~calpipe.errors.InputError` naming its
    row (the maps would clip or renormalise it silently): binary, outside [0, 1]; K classes,
    another number of classes than the state's, a class probability outside [0, 1], a sum off
    1 by more than :data:`calpipe.config.SCORES_SUM_TOL`. Two-class vectors ``[p0, p1]``
    against a binary state are the binary p1 (as :func:`calpipe.protect` takes them): mapped
    as p1, given back as ``[1 - p', p']``. A null or NaN score (or one inside a vector) is no
    forecast. Returns
    ``scores`` with ``protected_score`` (or ``protected_scores``), null for streams without
    state: what an unlabelled event with that score would be forecast, learning nothing. Uses
    the calibrator's own :meth:`~calpipe.calibrators.base.Calibrator.serving_map` (the kernel),
    one vectorized call for all rows.

    Examples
    --------
    >>> import calpipe, polars as pl
    >>> ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [0, 1, 1]})
    >>> st = calpipe.protect_with_state(ev).state
    >>> fresh = pl.DataFrame({"stream": ["a", "b"], "score": [0.5, 0.5]})
    >>> out = calpipe.serving_map(st, fresh)
    >>> round(out["protected_score"][0], 4), out["protected_score"][1]
    (0.5051, None)
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
    for frame, what, names in (
        (scores, "scores", (stream, score)),
        (state, "state", (stream, "method", "weights", "log10_martingale", "config_fingerprint")),
    ):
        for name in names:
            if name not in frame.columns:
                raise InputError(
                    name, None, f"the {what} frame has no column {name!r} (it has "
                    f"{list(frame.columns)[:20]}); serving_map(state, scores, stream=..., "
                    "score=...) names the stream and score columns"
                )  # fmt: skip
    multiclass = isinstance(scores.schema[score], pl.List | pl.Array)
    out_name = "protected_scores" if multiclass else "protected_score"
    joined = scores.with_row_index("__row").join(
        state.select(stream, "method", "weights", "log10_martingale", "config_fingerprint"),
        on=stream, how="left", maintain_order="left",
    )  # fmt: skip
    has = joined["weights"].is_not_null().to_numpy()
    k = 2
    if multiclass:
        # the state's K (its fingerprint holds it); without a state, the vectors' own
        k = int(state["n_classes"].max() or 0) if state.height else 0
        k = k or (
            int(joined[score].list.len().max() or 0)
            if isinstance(scores.schema[score], pl.List)
            else scores.schema[score].size
        )
        usable = _usable(scores, score)
        has &= usable
    else:  # (a null or NaN score: no forecast, not checked)
        usable = scores.select(pl.col(score).cast(pl.Float64).is_not_nan().fill_null(False))
        usable = usable.to_series().to_numpy()
        has &= usable
    _check_scores(scores, score, multiclass, k, usable)
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


def _as_list(scores: pl.DataFrame, score: str) -> pl.Expr:
    """The K-class score column as a list expression (a List or an Array column)."""
    c = pl.col(score)
    return c.arr.to_list() if isinstance(scores.schema[score], pl.Array) else c


def _usable(scores: pl.DataFrame, score: str) -> np.ndarray:
    """K classes: the rows whose vector is a forecast to map: not null, no null or NaN inside
    (no forecast without a score: null out, as a null or NaN binary score, and as in SQL)."""
    x = _as_list(scores, score)
    holes = x.list.eval(pl.element().is_null() | pl.element().cast(pl.Float64).is_nan()).list.any()
    return scores.select((x.is_not_null() & ~holes.fill_null(True)).alias("u"))["u"].to_numpy()


def _check_scores(
    scores: pl.DataFrame, score: str, multiclass: bool, k: int, usable: np.ndarray
) -> None:
    """InputError naming the row of the first score the engine would refuse
    (:func:`calpipe.engine.contract.probability_rules`, infinities included; K classes, also another
    number of classes than ``k``, the state's) among the ``usable`` rows: null and NaN scores
    (a null or NaN inside a vector) are no forecast, not an error (null out, as in SQL)."""
    x = _as_list(scores, score) if multiclass else pl.col(score).cast(pl.Float64)
    rules = probability_rules(score, x, multiclass=multiclass)
    if multiclass:
        rules.insert(0, Rule(score, f"scores of another number of classes than the state's "
                             f"forecasts ({k})", x.list.len() != k, x.list.len()))  # fmt: skip
    whole = pl.lit(pl.Series(usable))
    check_rules(scores, [Rule(r.column, r.rule, whole & r.bad, r.show) for r in rules])
