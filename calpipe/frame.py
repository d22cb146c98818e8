"""Polars transforms: partitioned (by stream), ordered (by time) application of the calibrators.

:func:`protect` is the public entry point; :func:`protect_with_state` also takes and returns the
per-stream state that makes nightly partitions and backfills resumable (docs/ARCHITECTURE.md §3, §4).

How a batch runs (no Python loop per event or per stream):

1. validate the frame against the data contract (first offending row, column and rule);
2. group the rows by stream and order each stream by the order keys (:func:`replay_order`: O(n)
   hashing and a counting sort; a sort only when rows are out of time order within a stream);
3. join the carried state of each stream (config fingerprint and order checked);
4. build the operation list (forecast/update per event, naming the input rows in replay order;
   with ``label_time``, updates at the label's time, carrying not-yet-applied labels in the state)
   and call the kernel once for all streams; it writes each event's outputs at its input row;
5. write one state row per stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from calpipe import config
from calpipe.calibrators import Calibrator, make_calibrator
from calpipe.calibrators.base import output_column, weights_series
from calpipe.contract import (
    _TIME_US,
    Columns,
    Rule,
    _lex_greater,
    as_polars,
    check_rules,
    replay_order,
    resolve_columns,
    validate_frame,
)
from calpipe.errors import InputError, ParameterError, StateError
from calpipe.kernels import grouping as G
from calpipe.kernels import ops
from calpipe.ordering import key_order

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


@dataclass
class ProtectResult:
    """Output of :func:`protect_with_state`: the protected rows and one state row per stream."""

    scores: pl.DataFrame
    state: pl.DataFrame


# ----------------------------------------------------------------------------------------------
# State frame <-> arrays
# ----------------------------------------------------------------------------------------------
def empty_state(df_schema: pl.Schema, cols: Columns) -> pl.DataFrame:
    """A state frame with no streams and the right schema."""
    fields = {c: df_schema[c] for c in cols.by}
    fields |= {
        "method": pl.String,
        "config_fingerprint": pl.String,
        "n_classes": pl.Int32,
        "n_events": pl.Int64,
        "n_labelled": pl.Int64,
    }
    fields |= {f"last_{c}": df_schema[c] for c in cols.order_by}
    fields |= {
        "log10_martingale": pl.Float64,
        "log10_martingale_max": pl.Float64,
        "weights": pl.List(pl.Float64),
        "pending_label_time": pl.List(_TIME_US),
        "pending_scores": pl.List(pl.Float64),
        "pending_labels": pl.List(pl.Int64),
    }
    return pl.DataFrame(schema=fields)


def _key_after(first: Sequence[str], last: Sequence[str]) -> pl.Expr:
    """Lexicographic (first...) > (last...) of two sets of columns."""
    return _lex_greater([pl.col(c) for c in first], [pl.col(c) for c in last])


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def protect(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    score: str | None = None,
    scores: str | None = None,
    label: str = "label",
    label_time: str | None = None,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    method: str = config.DEFAULT_METHOD,
    base_method: str | None = None,
    base_params: dict | None = None,
    **params,
) -> pl.DataFrame | pl.LazyFrame:
    r"""Protect the base probabilities of every stream with a test martingale over calibrating functions.

    Replays each stream (rows sharing the ``by`` keys) in ``order_by`` order and returns the same
    rows, in the input's row order, with ``protected_score`` (binary; or ``protected_scores`` for
    K classes) and ``log10_martingale``, the running log10 test martingale of the row's stream
    after that row. Forecasts are prequential: an event's forecast uses only labels of events
    strictly before it (or, with ``label_time``, labels whose ``label_time`` is before its time).

    The default method (:data:`calpipe.config.DEFAULT_METHOD`, ``composite-experts``,
    :mod:`calpipe.calibrators.experts`) is paper 001's Composite Jumper over experts: calibrating
    functions :math:`f_\theta` applied to the base forecast, to online Platt and beta scaling
    (Gupta & Ramdas 2023) of it and to beta calibration on forgotten bin counts. With passive weight :math:`P` on the base, active weights
    :math:`A^J_k` on the experts :math:`k = (i, \theta)` (start :math:`P=\pi`, each input's
    identity :math:`(1-\pi)/(|\mathbf J| I)`), per labelled event

    .. math::

        A^J_k &\leftarrow (1-J) A^J_k + \tfrac{J}{E} \textstyle\sum_{k'} A^J_{k'},\\
        p'_n &= P p_n + \textstyle\sum_{J,k} A^J_k f_k(n),\\
        P &\leftarrow P B_{p_n}(\{y_n\})/C,\quad A^J_k \leftarrow A^J_k B_{f_k(n)}(\{y_n\})/C,
        \quad C = p'_n(y_n),\\
        \log_{10} S_n &= \textstyle\sum_{i \le n} \log_{10} p'_i(y_i) - \log_{10} p_i(y_i).

    Its cumulative log loss is at most the base's + ln(1/π) (= ln 2), and each input's + ln 30 + n/10⁴.
    ``composite-jumper`` is paper 001's Algorithm 1 on the base alone (its paper numbers are
    reproduced); ``jumper`` and ``mean-jumper`` are paper 000's Algorithm 2 (with the martingale
    of Algorithm 1) and its average over jumping rates; ``loss="brier"`` reproduces
    ``protected-classification`` 0.1.5. See ``calpipe methods`` for every parameter.

    Parameters
    ----------
    frame : polars DataFrame or LazyFrame
        Scored events (docs/ARCHITECTURE.md §3). A LazyFrame is collected; the result is then lazy too.
    score, scores : str
        Binary base probability of label 1, or a list/array column of K class probabilities
        summing to 1. Default ``score="score"``.
    label : str
        Integer label in {0, 1} or 0..K-1; null = not known yet (forecast, no update).
    label_time : str, optional
        When each label became known. A label then updates the state at that time in the replay:
        events at or before it do not see it. A null label time on a labelled event means the
        label was known at its event (as without ``label_time``: the stream's next event sees
        it), so instant and delayed labels mix in one frame. Labels not yet applied at the end
        of a batch are kept in the state (:func:`protect_with_state`).
    by : str or sequence of str, optional
        Stream keys; default ``stream`` if the frame has it, else one stream. ``()`` = one stream.
    order_by : str or sequence of str
        Replay order within a stream; the last column is the event id, unique per stream.
    method : str
        ``composite-experts`` (default), ``composite-jumper``, ``ops``, ... any method of
        :data:`calpipe.calibrators.METHODS` (``calpipe methods`` lists them with parameters).
    base_method, base_params : str, dict, optional
        Stacking: run ``base_method`` (with ``base_params``) first and give its forecasts to
        ``method`` as the base probabilities (e.g. protect Venn-ABERS with the Composite Jumper).
        The output then has ``base_method_score(s)``, that forecast (the martingale bets on it clipped).
    **params
        Method parameters (for the protected methods ``family``, ``family_params``,
        ``jumping_rates``, ``pi``, ``loss``, ``clip``), validated against the method's table.

    Raises
    ------
    calpipe.errors.InputError
        Bad input: missing column; null/NaN/out-of-range scores; wrong-length or non-normalised
        score vectors; labels outside the classes; duplicate (stream, event id).
    calpipe.errors.ParameterError
        Unknown method, unknown parameter, or a value outside its range.

    Examples
    --------
    >>> import polars as pl, calpipe
    >>> events = pl.DataFrame({
    ...     "stream": ["a", "a", "a", "b"],
    ...     "event_time": [1, 2, 3, 1],
    ...     "event_id": [1, 2, 3, 1],
    ...     "score": [0.2, 0.7, 0.4, 0.9],
    ...     "label": [0, 1, None, 1],
    ... })
    >>> out = calpipe.protect(events)
    >>> out.select("stream", "protected_score").with_columns(pl.col("protected_score").round(4))
    shape: (4, 2)
    ┌────────┬─────────────────┐
    │ stream ┆ protected_score │
    │ ---    ┆ ---             │
    │ str    ┆ f64             │
    ╞════════╪═════════════════╡
    │ a      ┆ 0.2002          │
    │ a      ┆ 0.6988          │
    │ a      ┆ 0.4004          │
    │ b      ┆ 0.8998          │
    └────────┴─────────────────┘
    """
    lazy = isinstance(frame, pl.LazyFrame)
    df, back = as_polars(frame)
    result = protect_with_state(
        df, score=score, scores=scores, label=label, label_time=label_time,
        by=by, order_by=order_by, method=method, base_method=base_method,
        base_params=base_params, **params,
    ).scores  # fmt: skip
    if lazy:
        return result.lazy()
    return back(result) if back is not None else result


def protect_with_state(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    score: str | None = None,
    scores: str | None = None,
    label: str = "label",
    label_time: str | None = None,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    method: str = config.DEFAULT_METHOD,
    base_method: str | None = None,
    base_params: dict | None = None,
    state: pl.DataFrame | None = None,
    **params,
) -> ProtectResult:
    """:func:`protect`, resuming from ``state`` and returning the new state (one row per stream).

    The state frame has the stream keys, ``method``, ``config_fingerprint``, ``n_classes``,
    counters ``n_events``/``n_labelled``, the last processed order key (``last_<col>`` for each
    ``order_by`` column), ``log10_martingale`` and its running maximum, the kernel ``weights``
    and the labels not yet applied (``pending_*``). Streams of ``state`` that have no events in
    ``frame`` are passed through unchanged. Running a stream in k chunks, carrying the state,
    gives the same rows as one pass.

    Raises :class:`calpipe.errors.StateError` if a stream's state was written under another
    configuration, or if the frame has an event of a stream at or before that stream's last
    processed key.
    """
    cal = make_calibrator(method, base_method=base_method, base_params=base_params, **params)
    df, back = as_polars(frame)
    result = _protect_frame(df, cal, state, score=score, scores=scores, label=label,
                            label_time=label_time, by=by, order_by=order_by)  # fmt: skip
    if back is None:
        return result
    # pandas / Arrow in: the scores go back in that kind (the state stays a polars frame)
    return ProtectResult(back(result.scores), result.state)


def _protect_frame(
    df: pl.DataFrame, cal: Calibrator, state, *, score, scores, label, label_time, by, order_by
) -> ProtectResult:
    """:func:`protect_with_state` on a polars frame with its calibrator built."""
    cols = resolve_columns(
        df.columns, score=score, scores=scores, label=label, label_time=label_time,
        by=by, order_by=order_by,
    )  # fmt: skip
    n_classes = (
        validate_frame(df, cols, check_duplicates=False)
        if df.height
        else _empty_n_classes(df, cols)
    )
    cal.check_classes(n_classes)
    if cols.label_time is not None and not cal.supports_label_time:
        raise ParameterError(
            f"method {cal.name!r} does not take delayed labels (label_time={cols.label_time!r})"
        )
    _check_input_columns(df, cal)
    state0 = empty_state(df.schema, cols) if state is None else state
    _check_state_schema(state0, cols)
    if df.height == 0:
        return ProtectResult(_empty_output(df, cols, cal), state0)
    return _run(df, cols, cal, n_classes, state0)


def arrive_labels(
    state: pl.DataFrame,
    labels: pl.DataFrame,
    *,
    by: str | Sequence[str] = "stream",
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    score: str = "score",
    label: str = "label",
    label_time: str = "label_time",
) -> pl.DataFrame:
    """The state with labels of already processed events added to its pending lists: the label
    feed of a nightly chain (labels that arrive days after their events).

    ``labels`` has the stream keys ``by``, the event's order keys ``order_by`` (to order equal
    label times as one pass does: by event), its raw base ``score`` (Float64, or a list of K
    floats), its ``label`` and ``label_time``. The next :func:`protect_with_state` call applies
    each label at its ``label_time`` as an update, before the stream's events after it and after
    those at or before it (pending updates, docs/ARCHITECTURE.md §4), so that a chain fed this
    way equals one pass over the events carrying their labels and label times::

        one pass:  forecast(e_i) at t_i;  update(e_i, y_i) at s_i        (s_i >= t_i)
        chain:     night d forecasts its events; labels with s_i on day d arrive on night d

    Labels already pending come first on equal label times (in a nightly chain they are of an
    earlier day). Raises StateError for a stream without state (its events were never
    processed) or a label time before the stream's last processed event (that event was
    forecast without it: the label arrived too late to replay as one pass).

    >>> import calpipe, datetime as dt, polars as pl
    >>> t = [dt.datetime(2024, 1, 1, h) for h in (1, 2, 3)]
    >>> ev = pl.DataFrame({"stream": ["a"] * 3, "event_time": t, "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [None, None, None]},
    ...                   schema_overrides={"label": pl.Int64})
    >>> st = calpipe.protect_with_state(ev).state
    >>> late = pl.DataFrame({"stream": ["a"], "event_time": [t[0]], "event_id": [1],
    ...                      "score": [0.2], "label": [0],
    ...                      "label_time": [dt.datetime(2024, 1, 2)]})
    >>> arrive_labels(st, late)["pending_labels"].to_list()
    [[0]]
    """
    by_t = (by,) if isinstance(by, str) else tuple(by)
    order_t = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    for c in (*by_t, *order_t, score, label, label_time):
        if c not in labels.columns:
            raise InputError(c, None, f"missing column (the labels have {labels.columns})")
    if labels.height == 0:
        return state
    keyed = state.select(*by_t, f"last_{order_t[0]}").with_row_index("__sid")
    j = labels.join(keyed, on=list(by_t), how="left", nulls_equal=True, maintain_order="left")
    check_rules(j, [
        Rule(by_t[0], "label of a stream without state (its events were never processed)",
             pl.col("__sid").is_null(), pl.struct(list(by_t))),
        Rule(label, "null label", pl.col(label).is_null()),
        Rule(label_time, "label_time before the stream's last processed event (it was forecast "
             "without this label: the label arrived too late)",
             pl.col(label_time).cast(_TIME_US) < pl.col(f"last_{order_t[0]}").cast(_TIME_US)),
    ])  # fmt: skip
    width = 1 if j.schema[score].is_numeric() else int(j[score].list.len().max())
    # The updates of each stream in apply order, by (label time, then pending before new, then
    # new ones by event): the pending updates (in their order) followed by the new ones in
    # their events' order, stably sorted by (stream, label time). Numpy sorts: polars' rank of
    # the (event_time, event_id) struct and its 4-key sort took 1 s of a 2M-label night.
    seq = key_order(j, order_t)
    new_sc = j[score].cast(pl.Float64) if width == 1 else j[score].cast(pl.Array(pl.Float64, width))
    n_pend = state["pending_labels"].list.len().fill_null(0).to_numpy()
    old_sc = state["pending_scores"].explode().drop_nulls().to_numpy()
    sid = np.concatenate(
        [
            np.repeat(np.arange(state.height, dtype=np.int64), n_pend),
            j["__sid"].cast(pl.Int64).to_numpy()[seq],
        ]
    )
    t = np.concatenate(
        [
            state["pending_label_time"]
            .explode()
            .drop_nulls()
            .cast(_TIME_US)
            .to_physical()
            .to_numpy(),
            j[label_time].cast(_TIME_US).to_physical().to_numpy()[seq],
        ]
    ).astype(np.int64, copy=False)
    y = np.concatenate(
        [
            state["pending_labels"].explode().drop_nulls().to_numpy().astype(np.int64),
            j[label].cast(pl.Int64).to_numpy()[seq],
        ]
    )
    sc = np.concatenate([old_sc.reshape(-1, width), new_sc.to_numpy().reshape(-1, width)[seq]])
    # stable: equal (stream, time) keep the order above; a counting sort by stream, then each
    # stream's updates by time
    order = G.group_key_order(sid, state.height, t)
    sid, t, y, sc = sid[order], t[order], y[order], sc[order]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(sid, minlength=state.height))])
    return state.with_columns(
        _list_series(t, offsets, pl.Int64).cast(pl.List(_TIME_US)).alias("pending_label_time"),
        _list_series(np.ascontiguousarray(sc).ravel(), offsets * width, pl.Float64)
        .alias("pending_scores"),
        _list_series(y, offsets, pl.Int64).alias("pending_labels"),
    )  # fmt: skip


def _check_input_columns(df: pl.DataFrame, cal: Calibrator) -> None:
    """The method's extra input columns (a user taxonomy): present, integer, in range."""
    n_cat = cal.n_categories_input()
    for col in cal.input_columns().values():
        if col not in df.columns:
            raise InputError(col, None, f"missing column (method {cal.name!r} reads it)")
        if not df.schema[col].is_integer():
            raise InputError(col, None, f"must be an integer category column, not {df.schema[col]}")
        c = pl.col(col)
        check_rules(df, [
            Rule(col, "category must not be null", c.is_null()),
            Rule(col, f"category must be in [0, {n_cat})", (c < 0) | (c >= n_cat)),
        ])  # fmt: skip


def _empty_n_classes(df: pl.DataFrame, cols: Columns) -> int:
    dt = df.schema[cols.base]
    return dt.size if isinstance(dt, pl.Array) else 2


def _empty_output(df: pl.DataFrame, cols: Columns, cal: Calibrator) -> pl.DataFrame:
    out_dtype = pl.Float64 if cols.score is not None else df.schema[cols.scores]
    extra = [
        pl.lit(None, out_dtype).alias(cols.out),
        pl.lit(None, pl.Float64).alias("log10_martingale"),
    ]
    for name in cal.extra_outputs:
        dtype = pl.List(pl.Float64) if name == "log10_martingale_by_rate" else out_dtype
        extra.append(pl.lit(None, dtype).alias(output_column(name, cols.score is None)))
    return df.with_columns(extra)


def _check_state_schema(state: pl.DataFrame, cols: Columns) -> None:
    missing = [c for c in (*cols.by, *STATE_FIXED_COLUMNS) if c not in state.columns]
    missing += [f"last_{c}" for c in cols.order_by if f"last_{c}" not in state.columns]
    if missing:
        raise StateError(f"state frame lacks column(s) {missing}; was it written with other keys?")


def _run(
    df: pl.DataFrame, cols: Columns, cal: Calibrator, n_classes: int, state0: pl.DataFrame
) -> ProtectResult:
    replay = replay_order(df, cols)
    order, counts = replay.order, replay.counts
    n = df.height
    n_streams = counts.shape[0]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    ends = starts + counts - 1
    first_idx = starts if order is None else order[starts]  # input rows
    last_idx = ends if order is None else order[ends]
    first_rows = df.select([*cols.by, *cols.order_by])[first_idx]
    streams = first_rows.select(cols.by) if cols.by else pl.DataFrame()
    last_rows = df.select(cols.order_by)[last_idx]

    # Event arrays. Without label_time they stay in the input's row order: the operation list
    # names input rows stream by stream (op_event = the replay permutation), so the kernels read
    # each event where it is and write its outputs in place, and nothing is gathered into replay
    # order and back. Delayed labels need per-stream time arithmetic, so there the events are
    # put in replay order (event i = sorted row i) and the outputs put back at the end.
    # Carried labels not applied yet (of an earlier batch with label_time) need the operation
    # list of delayed labels even when this batch's labels are all known at their events.
    pending0 = state0.height > 0 and bool(state0["pending_labels"].list.len().sum())
    delayed = cols.label_time is not None or pending0
    needed = [cols.base, cols.label]
    needed += [cols.order_by[0]] if delayed else []
    needed += [cols.label_time] if cols.label_time is not None else []
    needed += list(cal.input_columns().values())
    events = df.select(list(dict.fromkeys(needed)))
    if delayed and order is not None:
        events = events[order]
    ev_sid = np.repeat(np.arange(n_streams, dtype=np.int64), counts) if delayed else replay.ids
    base = base_array(events, cols, n_classes)
    lab_s = events[cols.label]
    labelled = lab_s.is_not_null().to_numpy()
    # Unknown labels read as class 0: the kernels read a label only at an update operation, and
    # there is none for an unlabelled event. One int64 array (no -1 marker, no clamped copy).
    labels = lab_s.fill_null(0).cast(pl.Int64).to_numpy()

    # Carried state: join on the stream keys, check config and order.
    bstate, prev = _join_state(cal, cols, n_classes, streams, first_rows, state0, n_streams)

    if not delayed:
        op_event = np.arange(n, dtype=np.int64) if order is None else order
        op_labelled = labelled if order is None else labelled[order]
        op_kind = np.where(op_labelled, ops.OP_STEP, ops.OP_FORECAST).astype(np.int8)
        op_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ext_scores, ext_labels = cal.prepare_scores(base), labels
        applied = np.bincount(ev_sid[labelled], minlength=n_streams)
        pending = prev.select(["pending_label_time", "pending_scores", "pending_labels"])
    else:
        (op_event, op_kind, op_offsets, ext_scores, ext_labels, applied, pending) = _delayed_ops(
            cal, cols, events, ev_sid, counts, base, labels, labelled, prev, n_classes
        )

    inputs = {
        key: np.ascontiguousarray(events[col].cast(pl.Int64).to_numpy())
        for key, col in cal.input_columns().items()
    }
    out, new_state = cal.run_batch(
        ext_scores, ext_labels, op_event, op_kind, op_offsets, bstate, inputs
    )
    protected = out.protected[:n]
    log10m = out.log10_martingale[:n]

    def in_input_order(values: np.ndarray) -> np.ndarray:
        """Event outputs at their input rows (events in replay order: out[order[i]] = v[i])."""
        if not delayed or order is None:
            return values
        back = np.empty_like(values)
        back[order] = values
        return back

    extra = {name: in_input_order(out.extra[name][:n]) for name in cal.extra_outputs}
    scored = df.with_columns(
        output_columns(
            df.schema, cols, n_classes, in_input_order(protected), in_input_order(log10m), extra
        )
    )

    # New state rows.
    peak = G.group_max(log10m, ev_sid, prev["log10_martingale_max"].to_numpy())
    new_state_df = state_frame(
        cal, cols, n_classes, streams,
        n_events=prev["n_events"].to_numpy() + counts,
        n_labelled=prev["n_labelled"].to_numpy() + applied,
        log10m=new_state.log10m, peak=peak, weights=weights_series(*new_state.flat()),
        last_rows=last_rows, pending=pending,
    )  # fmt: skip
    return ProtectResult(scored, merge_state(state0, new_state_df, streams, cols))


def base_array(events: pl.DataFrame, cols: Columns, n_classes: int) -> np.ndarray:
    """The base forecasts of ``events`` as a contiguous float64 array: (n,) binary, (n, K)."""
    if cols.score is not None:
        base = events[cols.score].cast(pl.Float64).to_numpy()
    else:
        v = pl.col(cols.scores)
        as_arr = (
            v if isinstance(events.schema[cols.scores], pl.Array) else v.list.to_array(n_classes)
        )
        base = events.select(as_arr.cast(pl.Array(pl.Float64, n_classes))).to_series().to_numpy()
    return np.ascontiguousarray(base, dtype=np.float64)


def output_columns(
    schema: pl.Schema,
    cols: Columns,
    n_classes: int,
    protected: np.ndarray,
    log10m: np.ndarray,
    extra: dict[str, np.ndarray],
) -> list[pl.Series]:
    """The output columns of the engine's values at their input rows: the forecast (K classes:
    a vector of the input's kind, Array or List), ``log10_martingale`` and the method's extra
    outputs (``extra``: name -> values)."""
    out_series = pl.Series(cols.out, protected)
    if cols.score is None:
        out_series = out_series.cast(pl.Array(pl.Float64, n_classes))
        if isinstance(schema[cols.scores], pl.List):
            out_series = out_series.cast(pl.List(pl.Float64))
    new_cols = [out_series, pl.Series("log10_martingale", log10m)]
    for name, values in extra.items():
        new_cols.append(_output_series(name, values, out_series.dtype))
    return new_cols


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
        state_out = pl.concat([untouched.cast(new.schema), new])
    if cols.by:
        state_out = state_out.sort(list(cols.by))
    return state_out


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
    (:func:`_run`) and a day of a span (:mod:`calpipe.frame_days`) write the same bytes."""
    n = streams.height if cols.by else log10m.shape[0]
    new_rows = pl.DataFrame(
        {
            "method": pl.repeat(cal.name, n, dtype=pl.String, eager=True),
            "config_fingerprint": pl.repeat(
                cal.fingerprint(n_classes), n, dtype=pl.String, eager=True
            ),
            "n_classes": pl.repeat(n_classes, n, dtype=pl.Int32, eager=True),
            "n_events": n_events,
            "n_labelled": n_labelled,
            "log10_martingale": log10m,
            "log10_martingale_max": peak,
            "weights": weights,
        }
    )
    last_keys = last_rows.select([pl.col(c).alias(f"last_{c}") for c in cols.order_by])
    frame = pl.concat([streams, new_rows, last_keys, pending], how="horizontal")
    # empty_state's column order: keys, the five bookkeeping columns, last keys, the rest.
    state_columns = [*cols.by, *STATE_FIXED_COLUMNS[:5]]
    state_columns += [f"last_{c}" for c in cols.order_by] + list(STATE_FIXED_COLUMNS[5:])
    return frame.select(state_columns)


def _output_series(name: str, values: np.ndarray, forecast_dtype: pl.DataType) -> pl.Series:
    """An extra output column: like the forecast column (p_lower, ...), or a list per row."""
    if values.ndim == 1:
        return pl.Series(name, values)
    series = pl.Series(output_column(name, name != "log10_martingale_by_rate"), values)
    if name == "log10_martingale_by_rate" or isinstance(forecast_dtype, pl.List):
        return series.cast(pl.List(pl.Float64))
    return series.cast(forecast_dtype)


def state_from_rows(cal: Calibrator, rows: pl.DataFrame, n_classes: int, keys=None):
    """Kernel state of state-frame ``rows`` (their ``weights`` and ``log10_martingale``).

    The one parser of stored state vectors. Raises StateError if a ``weights`` vector does not
    fit the calibrator's layout, naming the row's stream by its key (``keys``: the key columns,
    default ``stream`` if present), not by its position in the batch.
    """
    arr = rows["weights"].cast(pl.List(pl.Float64)).to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_list(pa.float64()))
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    try:
        return cal.load_state(
            values, offsets - offsets[0], rows["log10_martingale"].to_numpy(), n_classes
        )
    except StateError as exc:
        keys = [c for c in (keys or ("stream",)) if c in rows.columns]
        if exc.stream is None or not keys:
            raise
        key = rows.select(keys).row(exc.stream)
        name = ", ".join(f"{c}={v!r}" for c, v in zip(keys, key, strict=True))
        raise StateError(f"state row of {name}: {exc}", stream=exc.stream) from None


def _empty_lists(n: int, inner: pl.DataType) -> pl.Series:
    """n empty lists (one broadcast, not a Python list of n lists)."""
    return pl.Series([[]], dtype=pl.List(inner)).new_from_index(0, n)


def _list_series(values: np.ndarray, offsets: np.ndarray, inner: pl.DataType) -> pl.Series:
    """The list column whose row s is ``values[offsets[s]:offsets[s + 1]]``, built from Arrow
    buffers (no Python loop over rows). Datetime values are given as int64 microseconds."""
    arr = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values))
    return pl.Series(pl.from_arrow(arr)).cast(pl.List(inner))


def _join_state(cal, cols, n_classes, streams, first_rows, state0, n_streams):
    """Initial kernel state of each stream in the batch and its previous state row (or zeros)."""
    bstate = cal.initial_state(n_streams, n_classes)
    zeros = pl.DataFrame(
        {
            "n_events": np.zeros(n_streams, np.int64),
            "n_labelled": np.zeros(n_streams, np.int64),
            "log10_martingale_max": np.zeros(n_streams),
            "pending_label_time": _empty_lists(n_streams, _TIME_US),
            "pending_scores": _empty_lists(n_streams, pl.Float64),
            "pending_labels": _empty_lists(n_streams, pl.Int64),
        }
    )
    if state0.height == 0:
        return bstate, zeros
    keyed = (
        streams.with_row_index("__sid")
        if cols.by
        else pl.DataFrame({"__sid": pl.Series([0], dtype=pl.UInt32)})
    )
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
    loaded = state_from_rows(cal, joined[idx.tolist()], n_classes, cols.by)
    bstate = bstate.scatter(idx, loaded)
    prev = joined.select(
        pl.col("n_events").fill_null(0).cast(pl.Int64),
        pl.col("n_labelled").fill_null(0).cast(pl.Int64),
        pl.col("log10_martingale_max").fill_null(0.0),
        pl.col("pending_label_time").fill_null(pl.lit([], pl.List(_TIME_US))),
        pl.col("pending_scores").fill_null(pl.lit([], pl.List(pl.Float64))),
        pl.col("pending_labels").fill_null(pl.lit([], pl.List(pl.Int64))),
    )
    return bstate, prev


def _merge_updates(sid, te, a_sid, a_t, a_seq) -> np.ndarray:
    """The order of the operations ``[events..., updates...]`` by (stream, time, phase, seq):
    events (phase 0, seq = position) before the updates at their time (phase 1, seq ``a_seq``).

    The events come sorted by (stream, time) already, so only the updates are sorted (by a key
    packing stream and time into one int64, stably after ordering them by seq) and merged in
    one linear pass (:func:`calpipe.kernels.grouping.merge_after`): O(n_a log n_a + n) instead
    of a 4-key lexsort of all operations (1.3 s of a 2M-event, 2M-label night; a binary
    search and boolean masks took 0.35 s). Falls back to the lexsort when the events
    are not sorted or the packed key would overflow."""
    sid, a_sid = sid.astype(np.int64, copy=False), a_sid.astype(np.int64, copy=False)
    n, n_a = sid.shape[0], a_sid.shape[0]
    t_min = int(min(te.min(initial=0), a_t.min(initial=0)))  # Python ints: no overflow here
    span = int(max(te.max(initial=0), a_t.max(initial=0))) - t_min + 1
    n_streams = int(max(sid.max(initial=0), a_sid.max(initial=0))) + 1
    if n_streams * span <= np.iinfo(np.int64).max:
        ek = sid * span + (te - t_min)
        if n < 2 or bool(np.all(ek[1:] >= ek[:-1])):
            by_seq = np.argsort(a_seq, kind="stable")  # (linear on sorted input: pending ones)
            uk = a_sid[by_seq] * span + (a_t[by_seq] - t_min)
            by_key = np.argsort(uk, kind="stable")
            return G.merge_after(ek, uk[by_key], by_seq[by_key])
    op_sid = np.concatenate([sid, a_sid])
    op_t = np.concatenate([te, a_t])
    op_phase = np.concatenate([np.zeros(n, np.int64), np.ones(n_a, np.int64)])
    op_seq = np.concatenate([np.arange(n, dtype=np.int64), a_seq])
    return np.lexsort((op_seq, op_phase, op_t, op_sid))


def _delayed_ops(cal, cols, sorted_df, sid, counts, base, labels, labelled, prev, n_classes):
    """Operation list with labels applied at their ``label_time`` (delayed feedback).

    Forecast of event i at its time; update of event i at its label_time; at equal times forecasts
    come first (a label is seen only by events strictly after it). A labelled event without a
    label time (null, or no ``label_time`` column: a label known at its event) is updated right
    after its own forecast, before the stream's next event even at an equal time, as without
    ``label_time``. Timed updates at or after the batch's last event time of the stream (its
    horizon) are deferred to the state's pending list, so that k chunks equal one pass (an
    update known at its event is never deferred: applied at once it keeps one pass's order, as
    every later operation of its stream comes after it). Pending updates of earlier batches
    enter as extra pseudo-events; they keep the raw score (``base``), which the calibrator
    prepares (clips) again on replay.

    Sort key of an operation: (stream, time, phase, seq) with the events (phase 0, seq = event:
    a forecast, or a step = forecast + update for a label known at its event) before the timed
    updates at their time (phase 1, seq = event, or the pending position < 0: pending first).
    """
    n = sorted_df.height
    n_streams = counts.shape[0]
    te = sorted_df[cols.order_by[0]].cast(_TIME_US).to_physical().to_numpy().astype(np.int64)
    if cols.label_time is None:
        timed = np.zeros(n, dtype=bool)
        tl = np.zeros(n, dtype=np.int64)
    else:
        lt = sorted_df[cols.label_time].cast(_TIME_US)
        timed = lt.is_not_null().to_numpy()
        tl = lt.to_physical().fill_null(0).to_numpy().astype(np.int64)
    ends = np.cumsum(counts) - 1
    horizon = te[ends]

    # Pending updates from the state, flattened.
    plen = prev["pending_labels"].list.len().to_numpy().astype(np.int64)
    m = int(plen.sum())
    p_sid = np.repeat(np.arange(n_streams, dtype=np.int64), plen)
    p_tl = prev["pending_label_time"].explode().drop_nulls().cast(_TIME_US).to_physical().to_numpy()
    p_lab = prev["pending_labels"].explode().drop_nulls().to_numpy().astype(np.int64)
    width = 1 if base.ndim == 1 else n_classes
    p_sc = prev["pending_scores"].explode().drop_nulls().to_numpy().astype(np.float64)
    if p_sc.shape[0] != m * width:
        raise StateError("pending_scores does not hold one score vector per pending label")
    p_sc = p_sc if width == 1 else p_sc.reshape(m, width)
    p_tl = p_tl.astype(np.int64)

    lab_idx = np.flatnonzero(labelled & timed)
    now_idx = np.flatnonzero(labelled & ~timed)  # known at their event
    u_sid = np.concatenate([sid[lab_idx], p_sid])
    u_t = np.concatenate([tl[lab_idx], p_tl])
    u_seq = np.concatenate([lab_idx, np.arange(m, dtype=np.int64) - m])  # pending first on ties
    u_ev = np.concatenate([lab_idx, n + np.arange(m, dtype=np.int64)])
    apply_now = u_t < horizon[u_sid]

    a_sid, a_t, a_seq, a_ev = (x[apply_now] for x in (u_sid, u_t, u_seq, u_ev))
    n_a = a_sid.shape[0]
    op_sid = np.concatenate([sid, a_sid])
    op_ev = np.concatenate([np.arange(n, dtype=np.int64), a_ev])
    order = _merge_updates(sid, te, a_sid, a_t, a_seq)
    op_event = np.ascontiguousarray(op_ev[order])
    # an event whose label is known at it is one step (forecast, then its update), as without
    # label_time: its row's martingale is then the one after its own label
    kind = np.full(n + n_a, ops.OP_UPDATE, dtype=np.int8)
    kind[:n] = ops.OP_FORECAST
    kind[now_idx] = ops.OP_STEP
    op_kind = np.ascontiguousarray(kind[order])
    op_offsets = np.concatenate([[0], np.cumsum(np.bincount(op_sid, minlength=n_streams))]).astype(
        np.int64
    )

    raw_scores = np.concatenate([base, p_sc])
    ext_scores = cal.prepare_scores(raw_scores)
    ext_labels = np.concatenate([labels, p_lab])
    applied = np.bincount(np.concatenate([a_sid, sid[now_idx]]), minlength=n_streams)
    applied = applied.astype(np.int64)

    # Deferred updates become the new pending lists (in apply order).
    d = ~apply_now
    d_sid, d_t, d_seq, d_ev = u_sid[d], u_t[d], u_seq[d], u_ev[d]
    o = np.lexsort((d_seq, d_t, d_sid))
    d_sid, d_t, d_ev = d_sid[o], d_t[o], d_ev[o]
    d_scores = raw_scores[d_ev]
    d_offsets = np.concatenate([[0], np.cumsum(np.bincount(d_sid, minlength=n_streams))])
    pending = pl.DataFrame(
        [
            _list_series(d_t, d_offsets, pl.Int64)
            .cast(pl.List(_TIME_US))
            .alias("pending_label_time"),
            _list_series(d_scores.ravel(), d_offsets * width, pl.Float64).alias("pending_scores"),
            _list_series(ext_labels[d_ev], d_offsets, pl.Int64).alias("pending_labels"),
        ]
    )
    return op_event, op_kind, op_offsets, ext_scores, ext_labels, applied, pending
