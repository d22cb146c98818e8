"""The state frame and the kernels' state arrays: one row per stream, and its parsing and building.

The carried state of a stream (docs/ARCHITECTURE.md §3) as a polars frame: the stream keys,
``method``, ``config_fingerprint``, ``n_classes``, the counters, the last processed order key
(``last_<col>``), the running and maximum log10 martingale, the kernel state as one float64 vector
(``weights``) and the labels not applied yet (``pending_*``). This module is its one home:
:func:`empty_state` (the schema), :func:`join_state` (a batch's streams joined with their stored
rows, configuration and order checked, vectors parsed by :func:`state_from_rows`),
:func:`state_frame` (the one builder of state rows), :func:`merge_state` (new rows over the old),
and the list-column helpers the operation list and the label feed build pending lists with.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import polars as pl

from calpipe import config
from calpipe.calibrators import Calibrator
from calpipe.calibrators.base import FlatState
from calpipe.engine.contract import TIME_US, Columns, lex_greater
from calpipe.errors import StateError

STATE_FIXED_COLUMNS = (
    "method",
    "config_fingerprint",
    "n_classes",
    "n_events",
    "n_labelled",
    "log10_martingale",
    "log10_martingale_max",
    "weights",
    "pending_label_time",
    "pending_scores",
    "pending_labels",
)


def empty_state(df_schema: pl.Schema, cols: Columns) -> pl.DataFrame:
    """A state frame with no streams and the right schema.

    Built once per key and order column types (~0.08 ms a build, paid by every call without a
    state); each caller gets its own clone, since polars frames have in-place methods."""
    keys = tuple((c, df_schema[c]) for c in cols.by)
    last = tuple((c, df_schema[c]) for c in cols.order_by)
    try:
        return _empty_state(keys, last).clone()
    except TypeError:  # a column type that does not hash: build it each time
        return _empty_state.__wrapped__(keys, last)


@lru_cache(maxsize=config.EMPTY_STATE_CACHE_SIZE)
def _empty_state(keys: tuple, last: tuple) -> pl.DataFrame:
    """:func:`empty_state` of key columns ``keys`` and order columns ``last`` ((name, type))."""
    df_schema = dict(keys + last)
    fields = {c: df_schema[c] for c, _ in keys}
    fields |= {
        "method": pl.String,
        "config_fingerprint": pl.String,
        "n_classes": pl.Int32,
        "n_events": pl.Int64,
        "n_labelled": pl.Int64,
    }
    fields |= {f"last_{c}": df_schema[c] for c, _ in last}
    fields |= {
        "log10_martingale": pl.Float64,
        "log10_martingale_max": pl.Float64,
        "weights": pl.List(pl.Float64),
        "pending_label_time": pl.List(TIME_US),
        "pending_scores": pl.List(pl.Float64),
        "pending_labels": pl.List(pl.Int64),
    }
    return pl.DataFrame(schema=fields)


def _key_after(first: Sequence[str], last: Sequence[str]) -> pl.Expr:
    """Lexicographic (first...) > (last...) of two sets of columns."""
    return lex_greater([pl.col(c) for c in first], [pl.col(c) for c in last])


def check_state_schema(state: pl.DataFrame, cols: Columns) -> None:
    missing = [c for c in (*cols.by, *STATE_FIXED_COLUMNS) if c not in state.columns]
    missing += [f"last_{c}" for c in cols.order_by if f"last_{c}" not in state.columns]
    if missing:
        raise StateError(f"state frame lacks column(s) {missing}; was it written with other keys?")


def state_frame(
    cal: Calibrator,
    cols: Columns,
    n_classes: int,
    streams: pl.DataFrame,
    *,
    n_events: np.ndarray,
    n_labelled: np.ndarray,
    log10m: np.ndarray,
    peak: np.ndarray,
    weights: pl.Series,
    last_rows: pl.DataFrame,
    pending: pl.DataFrame,
) -> pl.DataFrame:
    """State rows (:func:`empty_state`'s columns, in its order) of the streams ``streams``
    (their key columns), from their counters, martingale and running maximum, kernel state
    vectors (``weights``), last processed order keys (``last_rows``: the ``order_by`` columns)
    and labels not applied yet (``pending``). The one builder of state rows, so that a batch
    (:func:`_run`) and a day of a span (:mod:`calpipe.engine.driver`) write the same bytes."""
    n = streams.height if cols.by else log10m.shape[0]
    # One frame of Series in empty_state's column order: keys, the five bookkeeping columns,
    # last keys, the rest. (Built as a dict frame, concatenated and reordered by a select, with
    # each constant column a polars query, it was ~0.4 ms of a 2,000-event protect.)
    columns = [streams[c] for c in cols.by] + [
        _constant("method", cal.name, pl.String, n),
        _constant("config_fingerprint", cal.fingerprint(n_classes), pl.String, n),
        _constant("n_classes", n_classes, pl.Int32, n),
        pl.Series("n_events", n_events),
        pl.Series("n_labelled", n_labelled),
    ]
    columns += [last_rows[c].alias(f"last_{c}") for c in cols.order_by]
    columns += [
        pl.Series("log10_martingale", log10m),
        pl.Series("log10_martingale_max", peak),
        weights.alias("weights"),
    ]
    columns += [pending[c] for c in STATE_FIXED_COLUMNS[8:]]
    return pl.DataFrame(columns)


def _constant(name: str, value, dtype: pl.DataType, n: int) -> pl.Series:
    """``n`` copies of ``value``: one value broadcast (not a polars query per column)."""
    return (
        pl.Series(name, [value], dtype=dtype).new_from_index(0, n)
        if n
        else pl.Series(name, [], dtype=dtype)
    )


def merge_state(
    state0: pl.DataFrame, new: pl.DataFrame, streams: pl.DataFrame, cols: Columns
) -> pl.DataFrame:
    """The state after a run: the rows ``new`` of the run's ``streams`` and ``state0``'s rows of
    the other streams (passed through unchanged), sorted by the stream keys."""
    if state0.height == 0:
        state_out = new
    else:
        untouched = (
            state0.join(streams, on=list(cols.by), how="anti", nulls_equal=True)
            if cols.by
            else state0.clear()
        )
        state_out = pl.concat([untouched.cast(new.schema), new]) if untouched.height else new
    if cols.by and not (state_out is new and _sorted_distinct(new, cols.by)):
        state_out = state_out.sort(list(cols.by))
    return state_out


def _sorted_distinct(frame: pl.DataFrame, by: Sequence[str]) -> bool:
    """Whether ``frame``'s one key column is already strictly increasing with no null: then
    sorting it would give the same frame (its keys are distinct), and its state vectors need
    not be moved again (a copy of every vector, ~1 s for 100,000 default-method streams)."""
    if len(by) != 1:
        return False
    key = frame[by[0]]
    return key.null_count() == 0 and key.is_sorted() and key.n_unique() == key.len()


def state_from_rows(cal: Calibrator, rows: pl.DataFrame, n_classes: int, keys=None):
    """Kernel state of state-frame ``rows`` (their ``weights`` and ``log10_martingale``).

    The one parser of stored state vectors. Raises StateError if a ``weights`` vector does not
    fit the calibrator's layout, naming the row's stream by its key (``keys``: the key columns,
    default ``stream`` if present), not by its position in the batch.
    """
    # through polars, not pyarrow: pyarrow's to_numpy imports pandas (0.5 s of a night's start)
    weights = rows["weights"].cast(pl.List(pl.Float64))
    offsets = np.zeros(weights.len() + 1, np.int64)
    np.cumsum(weights.list.len().fill_null(0).to_numpy(), out=offsets[1:])
    values = weights.explode(empty_as_null=False, keep_nulls=False).to_numpy()  # null -> NaN
    try:
        return cal.load_state(
            np.ascontiguousarray(values, dtype=np.float64), offsets,
            rows["log10_martingale"].to_numpy(), n_classes,
        )  # fmt: skip
    except StateError as exc:
        keys = [c for c in (keys or ("stream",)) if c in rows.columns]
        if exc.stream is None or not keys:
            raise
        key = rows.select(keys).row(exc.stream)
        name = ", ".join(f"{c}={v!r}" for c, v in zip(keys, key, strict=True))
        raise StateError(f"state row of {name}: {exc}", stream=exc.stream) from None


def check_carried(rows: pl.DataFrame, n_classes: int, keys=None) -> None:
    """StateError unless state-frame ``rows`` carry what a run wrote besides the vectors, naming
    the row's stream by its key (``keys``, as :func:`state_from_rows`), the column and the rule:
    ``log10_martingale_max`` a finite number; per row, the ``pending_*`` lists of one label time
    and one score (K classes: one vector of K) per pending label, none null, the scores finite
    probabilities (K classes: summing to 1 within :data:`calpipe.config.SCORES_SUM_TOL`), the
    labels classes 0..K-1 (a null time broke the operation list with a raw broadcast error, a
    score of 7 was clipped silently, a label of 5 named an event that does not exist).
    Vectorized in polars; the lists are read only when some row has pending labels."""
    width = 1 if n_classes == 2 else n_classes

    def refuse(mask: np.ndarray, column: str, rule: str) -> None:
        bad = np.flatnonzero(mask)
        if not bad.size:
            return
        i = int(bad[0])
        names = [c for c in (keys or ("stream",)) if c in rows.columns]
        where = ", ".join(f"{c}={v!r}" for c, v in zip(names, rows.select(names).row(i),
                                                            strict=True))  # fmt: skip
        raise StateError(f"state row {'of ' + where if where else i}: column {column!r}: {rule}",
                         stream=i)  # fmt: skip

    peak = rows["log10_martingale_max"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    refuse(~np.isfinite(peak), "log10_martingale_max", "must be a finite number")
    n_lab = rows["pending_labels"].list.len().fill_null(0).to_numpy()
    if not n_lab.any() and not rows["pending_scores"].list.len().fill_null(0).to_numpy().any():
        if not rows["pending_label_time"].list.len().fill_null(0).to_numpy().any():
            return
    n_t = rows["pending_label_time"].list.len().fill_null(0).to_numpy()
    n_s = rows["pending_scores"].list.len().fill_null(0).to_numpy()
    refuse(n_t != n_lab, "pending_label_time", "one label time per pending label is needed")
    refuse(n_s != n_lab * width, "pending_scores",
           f"one score {'vector of ' + str(width) + ' ' if width > 1 else ''}per pending label "
           "is needed")  # fmt: skip
    e = pl.element()
    flags = rows.select(
        pl.col("pending_label_time").list.eval(e.is_null()).list.any().fill_null(False),
        pl.col("pending_scores").list.eval(
            e.is_null() | e.is_nan() | (e < 0.0) | (e > 1.0)).list.any().fill_null(False),
        pl.col("pending_labels").list.eval(
            e.is_null() | (e < 0) | (e >= n_classes)).list.any().fill_null(False),
    )  # fmt: skip
    refuse(flags["pending_label_time"].to_numpy(), "pending_label_time", "a label time is null")
    refuse(flags["pending_scores"].to_numpy(), "pending_scores",
           "a score is null, NaN or outside [0, 1]")  # fmt: skip
    refuse(flags["pending_labels"].to_numpy(), "pending_labels",
           f"a label is null or outside the classes 0..{n_classes - 1}")  # fmt: skip
    if width > 1:
        sums = rows["pending_scores"].explode(keep_nulls=False).to_numpy().reshape(-1, width)
        off = np.abs(sums.sum(axis=1) - 1.0) > config.SCORES_SUM_TOL
        if off.any():
            row_of = np.repeat(np.arange(rows.height), n_lab)
            refuse(np.isin(np.arange(rows.height), row_of[off]), "pending_scores",
                   f"a score vector does not sum to 1 (tolerance {config.SCORES_SUM_TOL:g})")  # fmt: skip


def empty_lists(n: int, inner: pl.DataType) -> pl.Series:
    """n empty lists (one broadcast, not a Python list of n lists)."""
    return _one_empty_list(inner).new_from_index(0, n)


@lru_cache(maxsize=8)  # the pending columns' three inner types
def _one_empty_list(inner: pl.DataType) -> pl.Series:
    """One empty list of ``inner`` values: the seed of :func:`empty_lists` (a Series built from
    a Python list costs ~10 us; new_from_index copies, so the seed is never shared)."""
    return pl.Series([[]], dtype=pl.List(inner))


def join_state(cal, cols, n_classes, streams, first_rows, state0, n_streams):
    """Initial kernel state of each stream in the batch and its previous state row (or zeros)."""
    bstate = cal.initial_state(n_streams, n_classes)
    zeros = pl.DataFrame(
        [
            pl.Series("n_events", np.zeros(n_streams, np.int64)),
            pl.Series("n_labelled", np.zeros(n_streams, np.int64)),
            pl.Series("log10_martingale_max", np.zeros(n_streams)),
            empty_lists(n_streams, TIME_US).alias("pending_label_time"),
            empty_lists(n_streams, pl.Float64).alias("pending_scores"),
            empty_lists(n_streams, pl.Int64).alias("pending_labels"),
        ]
    )
    if state0.height == 0:
        return bstate, zeros
    keyed = (
        streams.with_row_index("__sid")
        if cols.by
        else pl.DataFrame({"__sid": pl.Series([0], dtype=pl.UInt32)})
    )
    # The joins carry the narrow columns and each state row's position; the state vectors
    # (``weights``, ~760 floats a stream for the default method) are taken once, by position,
    # for the streams that have them (joined along, they were copied three times).
    full, state0 = state0, state0.drop("weights").with_row_index("__row")
    firsts = first_rows.select([*cols.by, *cols.order_by]).with_columns(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("__sid")
    )
    if cols.by:
        joined = keyed.join(
            state0, on=list(cols.by), how="left", nulls_equal=True, maintain_order="left"
        )
    else:
        if state0.height > 1:
            raise StateError("state has several rows but the frame is one stream (by=())")
        joined = keyed.join(state0, how="cross")
    joined = joined.join(firsts.drop(cols.by), on="__sid", how="left")
    has = joined["config_fingerprint"].is_not_null().to_numpy()
    if not has.any():
        return bstate, zeros

    expected = cal.fingerprint(n_classes)
    bad = joined.filter(
        pl.col("config_fingerprint").is_not_null() & (pl.col("config_fingerprint") != expected)
    )
    if bad.height:
        r = bad.row(0, named=True)
        cal.check_state(r["config_fingerprint"], r["method"], n_classes)
    last_cols = [f"last_{c}" for c in cols.order_by]
    late = joined.filter(
        pl.col("config_fingerprint").is_not_null() & ~_key_after(cols.order_by, last_cols)
    )
    if late.height:
        r = late.row(0, named=True)
        key = {c: r[c] for c in cols.by}
        first = ", ".join(f"{c}={r[c]!r}" for c in cols.order_by)
        last = ", ".join(f"{c}={r['last_' + c]!r}" for c in cols.order_by)
        raise StateError(
            f"stream {key}: event ({first}) is not after the state's last processed key "
            f"({last}); a state resumes only with later events (re-run from the previous state)"
        )

    idx = np.flatnonzero(has)
    rows = joined["__row"].fill_null(0).to_numpy().astype(np.int64)[idx]  # null: no state
    if not np.array_equal(rows, np.arange(full.height)):
        full = full[rows]
    loaded = state_from_rows(cal, full, n_classes, cols.by)
    check_carried(full, n_classes, cols.by)
    bstate = bstate.scatter(idx, loaded)
    prev = joined.select(
        pl.col("n_events").fill_null(0).cast(pl.Int64),
        pl.col("n_labelled").fill_null(0).cast(pl.Int64),
        pl.col("log10_martingale_max").fill_null(0.0),
        pl.col("pending_label_time").fill_null(pl.lit([], pl.List(TIME_US))),
        pl.col("pending_scores").fill_null(pl.lit([], pl.List(pl.Float64))),
        pl.col("pending_labels").fill_null(pl.lit([], pl.List(pl.Int64))),
    )
    return bstate, prev


def take_streams(cal: Calibrator, state, idx: np.ndarray, n_classes: int):
    """Streams ``idx`` of a kernel state, through its flat form (a new state: the carried one is
    not shared with the kernel call). A plain :class:`FlatState` is taken as it is: it came from
    the kernels or from a state row already validated (``state_from_flat`` would check its
    layout again, ~0.5 ms a day for the default method)."""
    values, offsets = state.flat()
    lengths = np.diff(offsets)[idx]
    new_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    take = np.repeat(offsets[idx] - new_off[:-1], lengths) + np.arange(new_off[-1], dtype=np.int64)
    values, log10m = np.ascontiguousarray(values[take]), state.log10m[idx].copy()
    if type(state) is FlatState:
        return FlatState(values, new_off, log10m)
    return cal.state_from_flat(values, new_off, log10m, n_classes)


def streams_in_state(streams: pl.DataFrame, state0: pl.DataFrame, cols) -> np.ndarray:
    """Whether each of ``streams`` has a row in ``state0``."""
    if not cols.by:
        return np.ones(1, dtype=bool)
    keys = state0.select(cols.by).with_columns(pl.lit(True).alias("__in"))
    j = streams.join(keys, on=list(cols.by), how="left", nulls_equal=True, maintain_order="left")
    return j["__in"].fill_null(False).to_numpy()
