"""The number of classes K a database stores: binary ``score`` columns, or K-class ``scores`` lists.

A database holds one kind of forecast, set by its first events like the event id type
(:mod:`calpipe.pipeline.ids`): binary (K = 2, a Float64 ``score`` of label 1 in
``scored_events``, ``base_score``/``protected_score`` in ``protected_scores``) or K classes
(K >= 3, ``scores``/``base_scores``/``protected_scores`` lists of K floats, the binary columns
NULL). K is read off the stored rows (every row has the same form, so one row tells), never
recorded apart from them: it cannot disagree with what is stored. A source's score column
holding lists of two probabilities [p0, p1] is binary: it is stored as ``score = p1``.

The frames of a night carry ``score`` (binary) or ``scores`` (K classes): :func:`score_column`.
"""

from __future__ import annotations

import polars as pl

from calpipe import storage
from calpipe.engine.contract import resolve_columns, validate_frame
from calpipe.storage import EventSource

#: The stored K: the first row of ``scored_events`` (binary if its ``score`` is set, else the
#: length of its ``scores``), else a ``calibrator_state`` row's ``n_classes``; NULL for a
#: database without either. Both reads stop at one row.
_STORED_SQL = """
SELECT coalesce(
    (SELECT CASE WHEN score IS NOT NULL THEN 2 ELSE len(scores) END FROM scored_events LIMIT 1),
    (SELECT n_classes FROM calibrator_state LIMIT 1))
"""


def stored_n_classes(con) -> int | None:
    """The number of classes of the forecasts this database stores (None before any event)."""
    row = storage.fetch_one(con, _STORED_SQL)
    return None if row is None or row[0] is None else int(row[0])


def score_column(n_classes: int) -> str:
    """The forecast column of a night's frames: ``score`` (binary) or ``scores`` (K classes)."""
    return "score" if n_classes == 2 else "scores"


def frame_n_classes(frame: pl.DataFrame) -> int:
    """K of a night's frame (:func:`score_column`): 2 with ``score``, else its vectors' length."""
    if "scores" not in frame.columns:
        return 2
    lengths = frame["scores"].list.len().drop_nulls()
    return int(lengths[0]) if lengths.len() else 2


def is_multiclass(dtype: pl.DataType) -> bool:
    """Whether a source's score column holds vectors of class probabilities."""
    return isinstance(dtype, pl.List | pl.Array)


def split_scores(chunk: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """A source's events (``score`` column: Float64, or lists/arrays of K probabilities) in the
    night's form (:func:`score_column`) and their K. Lists of two [p0, p1] are validated as
    vectors (lengths, values, sum 1) and stored binary, ``score = p1``. Vectors of K >= 3 keep
    their column, as ``scores`` (List(Float64)); the engine validates them."""
    dtype = chunk.schema["score"]
    if not is_multiclass(dtype):
        return chunk, 2
    vec = pl.col("score").cast(pl.List(pl.Float64)).alias("scores")
    out = chunk.with_columns(vec).drop("score")
    lengths = out["scores"].list.len().drop_nulls()
    k = int(lengths[0]) if lengths.len() else 2
    if k > 2:
        return out, k
    cols = resolve_columns(
        out.columns, score=None, scores="scores", label="label", label_time=None,
        by=("stream",), order_by=("event_time", "event_id"),
    )  # fmt: skip
    validate_frame(out, cols, check_duplicates=False)
    return out.with_columns(pl.col("scores").list.get(1).alias("score")).drop("scores"), 2


def ensure_n_classes(con, n_classes: int, source: EventSource, day) -> int:
    """``n_classes`` if this database stores forecasts of that many classes or none yet;
    StoreError naming both otherwise (one database keeps one kind of forecast: a chain's state
    and its metrics are those of K classes)."""
    have = stored_n_classes(con)
    if have is None or have == n_classes:
        return n_classes
    raise storage.StoreError(
        f"{source.describe()}, day {day}: its forecasts have {n_classes} classes, but this "
        f"database stores forecasts of {have} classes; one database keeps one number of classes: "
        "use a new database for this source"
    )
