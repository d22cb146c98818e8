"""The data contract of an input frame, and the order in which its rows replay.

One home for what :func:`calpipe.protect` (and the pipeline's event loader) checks before any
kernel runs (docs/ARCHITECTURE.md §3): the resolved column names of a call (:class:`Columns`,
:func:`resolve_columns`), the row-level rules with the first offending row, column and rule
(:class:`Rule`, :func:`check_rules`, :func:`validate_frame`), and how the rows group into
streams and replay in order (:func:`stream_ids`, :func:`replay_order`: O(n) hashing and a
counting sort, a sort only for rows out of order within a stream).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from calpipe import config
from calpipe.errors import InputError
from calpipe.kernels import grouping as G

#: Times compare (and are stored in states) as microsecond datetimes.
TIME_US = pl.Datetime("us")


@dataclass(frozen=True)
class Columns:
    """Resolved column names of one call."""

    score: str | None
    scores: str | None
    label: str
    label_time: str | None
    by: tuple[str, ...]
    order_by: tuple[str, ...]

    @property
    def base(self) -> str:
        return self.score if self.score is not None else self.scores  # type: ignore[return-value]

    @property
    def out(self) -> str:
        return "protected_score" if self.score is not None else "protected_scores"


def as_polars(frame) -> tuple[pl.DataFrame, Callable[[pl.DataFrame], object] | None]:
    """The events as a polars DataFrame, and how to give a result back in the caller's kind
    (None: as polars).

    polars (eager or lazy: collected), pandas (back as pandas; NaN is missing, as in pandas),
    Arrow tables and record batches (back as Arrow), or a mapping of column name to array/list
    such as numpy arrays (back as polars; NaN is missing). Anything else is an
    :class:`InputError` naming its type (it used to fail deep inside with ``AttributeError:
    ... no attribute 'height'``)."""
    if isinstance(frame, pl.DataFrame):
        return frame, None
    if isinstance(frame, pl.LazyFrame):
        return frame.collect(), None
    kind = type(frame).__module__.split(".")[0]
    if kind == "pandas" and hasattr(frame, "columns"):
        return pl.from_pandas(frame), lambda df: df.to_pandas()
    if kind == "pyarrow" and hasattr(frame, "schema"):
        return pl.from_arrow(frame), lambda df: df.to_arrow()
    if isinstance(frame, Mapping):
        try:
            # NaN is numpy's only missing value: null, as pandas' conversion makes it
            return pl.DataFrame(dict(frame)).fill_nan(None), None
        except (TypeError, ValueError, pl.exceptions.PolarsError) as exc:
            raise InputError(None, None, f"events as a mapping of columns: {exc}") from exc
    raise InputError(
        None, None,
        f"events must be a polars, pandas or Arrow table or a mapping of columns to arrays, "
        f"got {type(frame).__module__}.{type(frame).__name__}",
    )  # fmt: skip


def resolve_columns(
    frame_columns: Sequence[str],
    *,
    score: str | None,
    scores: str | None,
    label: str,
    label_time: str | None,
    by: str | Sequence[str] | None,
    order_by: str | Sequence[str],
) -> Columns:
    """Apply the defaults of the data contract and check that every named column exists."""
    if score is not None and scores is not None:
        raise InputError(
            None, None, "give either score= (binary) or scores= (multiclass), not both"
        )
    if score is None and scores is None:
        score = "score"
    if by is None:  # default: the `stream` column if there is one, else one stream
        by = ("stream",) if "stream" in frame_columns else ()
    by_t = (by,) if isinstance(by, str) else tuple(by)
    order_t = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    if not order_t:
        raise InputError(None, None, "order_by must name at least one column (the replay order)")
    cols = Columns(score, scores, label, label_time, by_t, order_t)
    needed = [cols.base, label, *by_t, *order_t] + ([label_time] if label_time else [])
    for name in needed:
        if name not in frame_columns:
            raise InputError(name, None, f"missing column (the frame has {list(frame_columns)})")
    for out in (cols.out, "log10_martingale"):
        if out in frame_columns:
            raise InputError(out, None, "output column already exists in the input; rename it")
    return cols


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """One row-level rule of the data contract: rows where ``bad`` is true break it."""

    column: str
    rule: str
    bad: pl.Expr
    show: pl.Expr | None = None  # what to print as the offending value (default: the column)
    #: A cheap proof that no row breaks the rule (a column's null count, min and max), or None:
    #: True lets :func:`check_rules` leave the rule out of its query; False proves nothing.
    clean: Callable[[pl.DataFrame], bool] | None = None


def check_rules(df: pl.DataFrame, rules: Sequence[Rule]) -> None:
    """Raise InputError for the first rule (in list order) that some row breaks, at its first row.

    All rules are evaluated in one parallel pass over the frame, but for those a rule's
    ``clean`` proves unbroken: the first broken rule is the same, and a small frame whose rules
    all prove clean costs no query (the pass was ~0.2 ms of a 2,000-event protect).
    """
    rules = [r for r in rules if r.clean is None or not r.clean(df)]
    if not rules:
        return
    firsts = df.select(
        [r.bad.fill_null(False).arg_true().first().alias(f"r{i}") for i, r in enumerate(rules)]
    ).row(0)
    for r, row in zip(rules, firsts, strict=True):
        if row is not None:
            value = df.select(r.show if r.show is not None else pl.col(r.column)).row(row)[0]
            raise InputError(r.column, int(row), f"{r.rule} (value: {value!r})")


def no_null(column: str) -> Callable[[pl.DataFrame], bool]:
    """A rule's ``clean``: ``column`` has no null (its null count, kept by polars)."""
    return lambda df: df[column].null_count() == 0


def no_nan(column: str) -> Callable[[pl.DataFrame], bool]:
    """A rule's ``clean`` of ``is_nan``: an integer column, or a float one without NaN."""

    def clean(df: pl.DataFrame) -> bool:
        s = df[column]
        return s.dtype.is_integer() or (s.dtype.is_float() and not s.is_nan().any())

    return clean


def within(column: str, low: float, high: float) -> Callable[[pl.DataFrame], bool]:
    """A rule's ``clean`` of "outside [low, high]": a plain integer or float column without
    NaN (polars orders NaN above every number) whose min and max lie in [low, high]; nulls
    break no such rule and are left out of min and max."""

    def clean(df: pl.DataFrame) -> bool:
        s = df[column]
        if not (s.dtype.is_integer() or s.dtype.is_float()) or s.null_count() == s.len():
            return False
        if s.dtype.is_float() and s.is_nan().any():
            return False
        return low <= s.min() and s.max() <= high

    return clean


def probability_rules(column: str, value: pl.Expr, *, multiclass: bool) -> list[Rule]:
    """What makes a present, non-NaN base forecast ``value`` a probability: binary, in [0, 1];
    K classes (a list), each class probability in [0, 1] and the sum 1 within
    :data:`calpipe.config.SCORES_SUM_TOL`. The engine's contract (:func:`validate_frame`) and
    the serving map (:func:`calpipe.serving.apply_serving_map`) refuse the same scores."""
    if not multiclass:
        return [Rule(column, "score outside [0, 1]", (value < 0) | (value > 1))]
    return [
        Rule(column, "a class probability outside [0, 1]",
             (value.list.min() < 0) | (value.list.max() > 1)),
        Rule(column, f"scores do not sum to 1 (tolerance {config.SCORES_SUM_TOL:g})",
             (value.list.sum() - 1.0).abs() > config.SCORES_SUM_TOL, value.list.sum()),
    ]  # fmt: skip


def validate_frame(df: pl.DataFrame, cols: Columns, *, check_duplicates: bool = True) -> int:
    """Check the data contract (docs/ARCHITECTURE.md §3); return K (2 for a binary score). Raises InputError.

    ``check_duplicates=False`` leaves out the rule "(stream, event id) unique", the one rule that
    needs a hash of every row: :func:`protect_with_state` checks it after grouping the streams,
    where strictly increasing event ids prove it in one vectorised pass (:func:`_check_unique`).
    """
    schema = df.schema
    check_time_keys(schema, cols.order_by)
    rules = [
        Rule(c, "null in a stream or order key", pl.col(c).is_null(), clean=no_null(c))
        for c in (*cols.by, *cols.order_by)
    ]
    lab_dtype = schema[cols.label]
    if lab_dtype.is_float():  # 0.0 / 1.0 labels, as scikit-learn and pandas often give them
        lab = pl.col(cols.label)
        rules += [
            Rule(cols.label, "label is NaN (a missing label is null)", lab.is_nan()),
            Rule(cols.label, "label is not a whole number (a float label must be 0.0, 1.0, ...)",
                 lab.is_finite() & (lab != lab.floor())),
            Rule(cols.label, "label is infinite", lab.is_infinite()),
        ]  # fmt: skip
    elif not (lab_dtype.is_integer() or lab_dtype == pl.Boolean or lab_dtype == pl.Null):
        raise InputError(
            cols.label, None, f"labels must be integers or whole floats (got dtype {lab_dtype})"
        )

    if cols.score is not None:
        dt = schema[cols.score]
        if not (dt.is_numeric() and not dt.is_decimal()):
            raise InputError(cols.score, None, f"score must be a float column (got dtype {dt})")
        s = pl.col(cols.score)
        rules += [
            Rule(cols.score, "null score (every event needs a base forecast)", s.is_null(),
                 clean=no_null(cols.score)),
            Rule(cols.score, "score is NaN", s.cast(pl.Float64).is_nan(),
                 clean=no_nan(cols.score)),
            # the column itself is the value: its min and max can prove the range
            *(replace(r, clean=within(cols.score, 0, 1))
              for r in probability_rules(cols.score, s, multiclass=False)),
        ]  # fmt: skip
        n_classes = 2
    else:
        name = cols.scores
        dt = schema[name]
        if not isinstance(dt, pl.List | pl.Array) or not dt.inner.is_numeric():
            raise InputError(name, None, f"scores must be a list/array of floats (got {dt})")
        v = pl.col(name)
        lengths = v.list.len() if isinstance(dt, pl.List) else pl.lit(dt.size)
        n_classes = int(df.select(lengths.first()).item() or 0)
        lst = v if isinstance(dt, pl.List) else v.arr.to_list()
        rules += [
            Rule(name, "null scores (every event needs a base forecast)", v.is_null()),
            Rule(name, "a scores vector needs >= 2 classes", lengths < 2),
            Rule(name, f"scores vector of another length than the first row's {n_classes}",
                 lengths != n_classes),
            Rule(name, "null inside scores", lst.list.eval(pl.element().is_null()).list.any()),
            Rule(name, "NaN inside scores",
                 lst.list.eval(pl.element().cast(pl.Float64).is_nan()).list.any()),
            *probability_rules(name, lst, multiclass=True),
        ]  # fmt: skip

    # NaN / inf float labels: rules above; integers compared as they are (a UInt64 2**64 - 1
    # cast to Int64 is null: it passed as "unknown" and failed later in a polars cast)
    y = (
        pl.col(cols.label)
        if lab_dtype.is_integer()
        else pl.col(cols.label).cast(pl.Int64, strict=False)
    )
    rules.append(
        Rule(cols.label, f"label outside the classes 0..{n_classes - 1}",
             y.is_not_null() & ((y < 0) | (y >= n_classes)),
             clean=within(cols.label, 0, n_classes - 1) if lab_dtype.is_integer() else None)
    )  # fmt: skip

    if cols.label_time is not None:
        lt, t0 = cols.label_time, cols.order_by[0]
        for name in (lt, t0):
            if not schema[name].is_temporal():
                raise InputError(
                    name,
                    None,
                    f"with label_time, {name!r} must be a Date/Datetime (got {schema[name]})",
                )
        rules += [
            Rule(lt, "label_time given for an event without a label",
                 pl.col(lt).is_not_null() & pl.col(cols.label).is_null()),
            Rule(lt, f"label_time before the event's {t0!r} (a label cannot be known before its event)",
                 pl.col(lt).cast(TIME_US) < pl.col(t0).cast(TIME_US)),
        ]  # fmt: skip

    if check_duplicates:
        rules.append(_duplicate_rule(cols))
    check_rules(df, rules)
    return n_classes


def check_time_keys(schema: pl.Schema, order_by: Sequence[str]) -> None:
    """InputError unless every order key before the last (the event time: ``event_time``) is
    a Date/Datetime or a number: text (``"2020-1-9"``, ``"tuesday"``) would replay in text
    order (``"2020-1-10"`` before ``"2020-1-9"``), so it is refused, never parsed with a guessed
    format. The last key (the event id) may be text: it only breaks ties."""
    for name in order_by[:-1]:
        dtype = schema[name]
        if not (dtype.is_temporal() or (dtype.is_numeric() and not dtype.is_decimal())):
            raise InputError(
                name, None,
                f"the replay order's time column must be a Date/Datetime (or a number), got "
                f"{dtype}: text times would replay in text order ('2020-1-10' before '2020-1-9'); "
                "parse it first, e.g. pl.col(...).str.to_datetime(FORMAT)",
            )  # fmt: skip


def _duplicate_rule(cols: Columns) -> Rule:
    key = [*cols.by, cols.order_by[-1]]
    return Rule(
        cols.order_by[-1],
        f"duplicate ({', '.join(key)}): each event must be unique within its stream",
        ~pl.struct(key).is_first_distinct(),
        pl.struct(key),
    )


# ----------------------------------------------------------------------------------------------
# Streams and replay order
# ----------------------------------------------------------------------------------------------
def lex_greater(a: Sequence[pl.Expr], b: Sequence[pl.Expr]) -> pl.Expr:
    """Lexicographic (a_0, a_1, ...) > (b_0, b_1, ...) as one expression."""
    expr = a[-1] > b[-1]
    for x, y in zip(reversed(a[:-1]), reversed(b[:-1]), strict=True):
        expr = (x > y) | ((x == y) & expr)
    return expr


@dataclass(frozen=True)
class Replay:
    """How the rows of a frame replay: ``order`` sorts them by (stream, order keys) (None: they
    already do), and the sorted rows are ``counts[0]`` rows of stream 0, then stream 1, ...;
    ``ids[i]`` is the stream of input row i (streams numbered by first appearance) and
    ``first[s]`` the first input row of stream s."""

    order: np.ndarray | None
    counts: np.ndarray
    ids: np.ndarray
    first: np.ndarray


def stream_ids(df: pl.DataFrame, by: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, first_row): a dense id per row for its stream (rows with equal ``by`` keys), numbered
    in order of first appearance, and the first row of each stream. O(n), no sort.

    The ids come from a 64-bit hash of the keys (:func:`calpipe.kernels.grouping.dense_ids`).
    Every row's keys are then compared with its stream's first row, so a hash collision cannot
    merge two streams: if one ever did, the ids are recomputed by a sort of the keys.
    """
    if not by or _one_key(df, by):
        return np.zeros(df.height, np.int64), np.zeros(min(df.height, 1), np.int64)
    key = pl.col(by[0]) if len(by) == 1 else pl.struct(list(by))
    hashes = df.select(key.hash()).to_series().to_numpy()
    ids, first = G.dense_ids(hashes)
    if not _same_keys_as(df, by, first[ids]):
        ids, first = _stream_ids_by_sort(df, by)
    return ids, first


def _one_key(df: pl.DataFrame, by: Sequence[str]) -> bool:
    """Whether every row has the same one key, none null: one stream, decided by the column's
    min and max (~10 us) instead of hashing it and comparing every row with its stream's first
    (~0.15 ms on 2,000 rows, most of a small call's grouping). Only for types whose min and max
    are the order of distinct values (text, integers, times): not floats (NaN), not nested."""
    if len(by) != 1:
        return False
    key = df[by[0]]
    dtype = key.dtype
    if not (dtype == pl.String or dtype.is_integer() or dtype.is_temporal()):
        return False
    return key.len() > 0 and key.null_count() == 0 and key.min() == key.max()


def _same_keys_as(df: pl.DataFrame, by: Sequence[str], rep: np.ndarray) -> bool:
    """Whether row i has the same ``by`` keys as row ``rep[i]``, for every row."""
    idx = pl.Series(rep)
    same = [pl.col(c).eq_missing(pl.col(c).gather(idx)) for c in by]
    # One contiguous chunk first: a random gather across the many chunks of a frame read from
    # Parquet or DuckDB costs ~3x the copy (10M rows in 100 chunks: 170 ms vs 57 ms).
    keys = df.select(by).rechunk()
    return bool(keys.select(pl.all_horizontal(same).all()).item())


def _stream_ids_by_sort(df: pl.DataFrame, by: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stream_ids` by a dense rank of the keys (a sort): the fallback after a collision."""
    key = pl.col(by[0]) if len(by) == 1 else pl.struct(list(by))
    ids = df.select(key.rank("dense")).to_series().to_numpy().astype(np.int64) - 1
    _, first = np.unique(ids, return_index=True)
    # renumbered by first appearance, as the hashed ids are (the same ids either way)
    by_first = np.argsort(first, kind="stable")
    renumber = np.empty_like(by_first)
    renumber[by_first] = np.arange(by_first.shape[0])
    return renumber[ids].astype(np.int64), first[by_first].astype(np.int64)


def replay_order(df: pl.DataFrame, cols: Columns) -> Replay:
    """Group the rows by stream and order each stream by ``order_by``; check that every
    (stream, event id) is unique (the data contract's last rule, left out of
    :func:`validate_frame` by :func:`protect_with_state`).

    Cheapest first, each step O(n) but the last:

    1. stream ids by hashing (:func:`stream_ids`);
    2. rows already grouped by stream (ids never decrease): no permutation; otherwise a stable
       counting sort by stream id, which keeps the input's order within each stream;
    3. if within every stream the order keys now increase strictly (the usual case: an event log
       in time order, or a presorted frame), that is the replay order; otherwise a sort by
       (stream id, order keys).

    Streams are numbered by first appearance, not by key; nothing depends on their relative
    order (streams are independent, and the state frame is sorted by its keys at the end). The
    order keys are unique within a stream (validated), so every correct sort gives the same
    rows in the same order.
    """
    ids, first = stream_ids(df, cols.by)
    n_streams = first.shape[0]
    order = None
    if n_streams > 1 and bool(np.any(ids[1:] < ids[:-1])):
        order, counts = G.counting_sort(ids, n_streams)
    else:
        counts = np.bincount(ids, minlength=n_streams)
    # Order keys increasing over the whole input (an event log in time order) stay increasing in
    # every stream after a stable grouping: one sequential pass decides it.
    increasing, ids_increasing = _within_stream_increasing(df, cols.order_by, None, None)
    if not (increasing and ids_increasing):
        increasing, ids_increasing = _within_stream_increasing(df, cols.order_by, ids, order)
    if not increasing:
        keyed = df.select(cols.order_by).with_columns(pl.Series("__sid", ids))
        order = keyed.select(pl.arg_sort_by(["__sid", *cols.order_by])).to_series().to_numpy()
        order = order.astype(np.int64)
        increasing, ids_increasing = _within_stream_increasing(df, cols.order_by, ids, order)
    if not ids_increasing:  # event ids not increasing in replay order: check by hashing
        check_rules(df, [_duplicate_rule(cols)])
    return Replay(order, counts, ids, first)


def _within_stream_increasing(
    df: pl.DataFrame,
    order_by: Sequence[str],
    ids: np.ndarray | None,
    order: np.ndarray | None,
) -> tuple[bool, bool]:
    """In the row order ``order`` (None: as given), with rows grouped by stream id ``ids`` (None:
    all rows as one sequence): do the order keys increase strictly (lexicographically) within
    every stream, and does the last order key (the event id) alone? The second implies that
    (stream, event id) is unique."""
    arrays = _plain_keys(df, order_by)
    if arrays is not None:
        return _increasing_np(arrays, ids, order)
    keys = df.select(order_by)
    if ids is not None:
        keys = keys.with_columns(pl.Series("__sid", ids))
    if order is not None:
        keys = keys[order]
    cur = [pl.col(c) for c in order_by]
    lex = lex_greater(cur, [c.shift(1) for c in cur])
    last = cur[-1] > cur[-1].shift(1)
    if ids is not None:
        new_stream = pl.col("__sid") != pl.col("__sid").shift(1)
        lex, last = new_stream | lex, new_stream | last
    row = keys.select(lex.slice(1).all(), last.slice(1).all().alias("__last")).row(0)
    return bool(row[0]), bool(row[1])


def _plain_keys(df: pl.DataFrame, order_by: Sequence[str]) -> list[np.ndarray] | None:
    """The order keys as numpy arrays when all are integers or times without nulls (their
    physical integers order as they do), else None: then polars compares them (text ids,
    floats, where NaN orders and equals as polars says, nulls)."""
    arrays = []
    for c in order_by:
        s = df[c]
        if not (s.dtype.is_integer() or s.dtype.is_temporal()) or s.null_count():
            return None
        arrays.append(s.to_physical().to_numpy())
    return arrays


def _increasing_np(
    arrays: list[np.ndarray], ids: np.ndarray | None, order: np.ndarray | None
) -> tuple[bool, bool]:
    """:func:`_within_stream_increasing` on integer key arrays, in numpy: one small call's
    polars query cost ~60 us, about as much as the comparisons on 100,000 rows."""
    if order is not None:
        arrays = [a[order] for a in arrays]
        ids = ids[order] if ids is not None else None
    last = arrays[-1][1:] > arrays[-1][:-1]
    lex = last
    for a in reversed(arrays[:-1]):  # lex_greater, from the last key out
        lex = (a[1:] > a[:-1]) | ((a[1:] == a[:-1]) & lex)
    if ids is not None:
        new_stream = ids[1:] != ids[:-1]
        lex, last = new_stream | lex, new_stream | last
    return bool(lex.all()), bool(last.all())
