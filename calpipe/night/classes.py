"""The number of classes of a night's forecasts: binary ``score`` or K-class ``scores``.

Pure helpers over frames (:func:`score_column`, :func:`frame_n_classes`, :func:`is_multiclass`,
:func:`split_scores`); which K a database stores is the pipeline's
(:mod:`calpipe.pipeline.classes`).
"""

from __future__ import annotations

import polars as pl

from calpipe.engine.contract import resolve_columns, validate_frame


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
