"""Stage ``calibration_map`` and the serving map: each stream's map p -> p' at the end of a day.

Owns the map's SQL form (:func:`map_weights`, :func:`map_terms`: the weighted terms of the
protected methods' mixture, which the ``calibrate_score`` macros of ``sql/003_macros.sql``
evaluate), the table's rows (:func:`_map_rows`, written by the stage :func:`map_days` and by the
fused run) and :func:`serving_map`, the map applied to fresh scores in polars for every method.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from calpipe import store
from calpipe.calibrators import ProtectedCalibrator
from calpipe.errors import StateError
from calpipe.frame import state_from_rows
from calpipe.pipeline.chain import _require_chain
from calpipe.pipeline.classes import stored_n_classes
from calpipe.pipeline.settings import Settings, StageResult, _as_date
from calpipe.pipeline.transactions import day_range


def map_weights(state: pl.DataFrame, settings: Settings) -> tuple[np.ndarray, np.ndarray]:
    """The serving map's weights of each state row: ``(P (n,), W (n, T))``, from the calibrator
    (:meth:`calpipe.calibrators.protected.ProtectedCalibrator.map_weights`)."""
    cal = settings.calibrator()
    return cal.map_weights(state_from_rows(cal, state, 2))


def has_sql_map(cal) -> bool:
    """Whether ``cal``'s serving map has the SQL form (the log-loss mixtures: the protected
    methods, and ``composite-experts`` over inputs with a logistic map)."""
    if not hasattr(cal, "map_terms"):
        return False
    if isinstance(cal, ProtectedCalibrator):
        return cal.loss == "log"
    return all(c.has_logistic_map() for c in cal._inputs(2))


def map_terms(state: pl.DataFrame, settings: Settings) -> pl.DataFrame:
    """``calibration_map`` rows of state rows (columns ``date``/``stream`` kept): the terms of
    each stream's map (:class:`calpipe.calibrators.base.MapTerms`, from the calibrator), one
    row per term, with the term's input map (``in_*``, NULL: the clipped base)."""
    cal = settings.calibrator()
    mt = cal.map_terms(state_from_rows(cal, state, 2))
    n, t = mt.weight.shape
    inputs = mt.inputs if mt.inputs is not None else np.full((n, t, 4), np.nan)
    flat = inputs.reshape(n * t, 4)
    terms = pl.DataFrame(
        {
            "term": pl.Series(np.tile(np.arange(t), n), dtype=pl.Int32),
            "family": np.tile(mt.family, n),
            "a": np.tile(mt.a, n),
            "b": np.tile(mt.b, n),
            "weight": mt.weight.ravel(),
            **{c: flat[:, j] for j, c in enumerate(_INPUT_COLUMNS)},
        }
    ).with_columns(pl.col(c).fill_nan(None) for c in _INPUT_COLUMNS)
    keys = state.select("date", "stream").select(pl.all().repeat_by(t).explode())
    return pl.concat([keys, terms], how="horizontal").with_columns(
        pl.lit(float(cal.params["clip"])).alias("clip"),
        pl.lit(cal.name).alias("method"),
        pl.lit(cal.fingerprint(2)).alias("config_fingerprint"),
    )


#: Columns of a term's input map in ``calibration_map`` (NULL: the clipped base).
_INPUT_COLUMNS = ("in_w1", "in_w2", "in_w0", "in_eps")


def _map_rows(state: pl.DataFrame, settings: Settings) -> pl.DataFrame:
    """``calibration_map`` rows of state rows: :func:`map_terms` for the binary chains of the
    methods whose map has the SQL form (:func:`has_sql_map`); none for the others (no SQL
    form of a fitted isotonic/Venn/... map, nor of K-class maps yet: serve with serving_map())."""
    binary = state.height and int(state["n_classes"][0]) == 2
    if binary and has_sql_map(settings.calibrator()):
        return map_terms(state, settings)
    return pl.DataFrame(schema={"date": pl.Date, "stream": pl.String, "term": pl.Int32})


def map_days(con, start: dt.date, end: dt.date, settings: Settings) -> StageResult:
    """Stage ``calibration_map``: the serving map of every stream at the end of each day.

    The map's SQL form (terms of the mixture, ``calpipe_protect`` macro) exists for the protected
    methods; for the other methods the partitions are left empty (use :func:`serving_map`)."""
    start, end = _as_date(start), _as_date(end)
    _require_chain(con, start, end, "calibration_map")
    fp = settings.fingerprint_for(stored_n_classes(con) or 2)
    res = StageResult(start, end, {"calibration_map": 0})
    for c0, c1 in day_range(start, end):
        state = store.read_partitions(con, "calibrator_state", c0, c1)
        other = state.filter(pl.col("config_fingerprint") != fp)
        if other.height:
            r = other.row(0, named=True)
            raise StateError(
                f"calibrator_state of {r['date']} was written with config fingerprint "
                f"{r['config_fingerprint']}, the map is asked for {fp}"
            )
        terms = _map_rows(state, settings)
        store.replace_partitions(con, c0, c1, {"calibration_map": terms})
        res.rows["calibration_map"] += terms.height
    return res


def serving_map(
    state: pl.DataFrame,
    scores: pl.DataFrame,
    settings: Settings | None = None,
    *,
    score: str = "score",
    stream: str = "stream",
) -> pl.DataFrame:
    """Apply each stream's serving map (its state's next forecast, docs/ARCHITECTURE.md §4) to fresh scores.

    ``state`` is a state frame (one row per stream, from :func:`calpipe.protect_with_state` or the
    ``calibrator_state`` table); ``scores`` has the stream column and a ``score`` column (binary:
    Float64; K classes: a list of K floats). Returns ``scores`` with ``protected_score`` (or
    ``protected_scores``), null for streams without state. Uses the calibrator's own
    :meth:`~calpipe.calibrators.protected.ProtectedCalibrator.serving_map` (the kernel), one
    vectorized call for all rows.

    >>> import calpipe, polars as pl
    >>> ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": [1, 2, 3], "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [0, 1, 1]})
    >>> st = calpipe.protect_with_state(ev).state
    >>> out = serving_map(st, pl.DataFrame({"stream": ["a", "b"], "score": [0.5, 0.5]}))
    >>> round(out["protected_score"][0], 4), out["protected_score"][1]
    (0.5067, None)
    """
    settings = settings or Settings()
    cal = settings.calibrator()
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
