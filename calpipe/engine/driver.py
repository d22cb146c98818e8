"""The engine's one driver: a frame of scored events through a calibrator, all streams at once.

:func:`protect` is the public entry point; :func:`protect_with_state` also takes and returns the
per-stream state that makes nightly partitions and backfills resumable (docs/ARCHITECTURE.md §3,
§4); :func:`protect_by_day` runs a span of days in one pass and returns each day's end state.

How a batch runs (no Python loop per event or per stream):

1. validate the frame against the data contract (first offending row, column and rule);
2. group the rows by stream and order each stream by the order keys (:func:`replay_order`: O(n)
   hashing and a counting sort; a sort only when rows are out of time order within a stream);
3. join the carried state of each stream (config fingerprint and order checked,
   :func:`calpipe.engine.state.join_state`);
4. build the operation list (forecast/update per event, naming the input rows in replay order;
   with ``label_time``, updates at the label's time, carrying not-yet-applied labels in the
   state: :mod:`calpipe.engine.operations`) and call the kernel once for all streams; it writes
   each event's outputs at its input row (a big call given a ``progress`` runs that one list in
   pieces, the state carried, the same bits: :mod:`calpipe.engine.pieces`);
5. write one state row per stream (:func:`calpipe.engine.state.state_frame`).

A span of days (:func:`protect_by_day`) does steps 1-3 once for all its days, then one kernel
call per day over that day's slice, carrying the kernel state in memory: the same rows and
states as one :func:`protect_with_state` call per day (tested bit for bit), without ~10 ms of
frame work a day (most of a small day's time: the demo's 892 days).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from calpipe import config
from calpipe.calibrators import Calibrator, make_calibrator
from calpipe.calibrators.base import RunOutput, output_column, two_class_output, weights_series
from calpipe.engine.contract import (
    TIME_US,
    Columns,
    Rule,
    as_polars,
    check_rules,
    replay_order,
    resolve_columns,
    validate_frame,
)
from calpipe.engine.operations import delayed_ops
from calpipe.engine.pieces import plan_pieces, run_pieces
from calpipe.engine.state import (
    check_state_schema,
    empty_lists,
    empty_state,
    join_state,
    merge_state,
    state_frame,
    streams_in_state,
    take_streams,
)
from calpipe.errors import InputError, ParameterError
from calpipe.kernels import grouping as G
from calpipe.kernels import ops


@dataclass
class ProtectResult:
    """Output of :func:`protect_with_state`: the protected rows and one state row per stream.

    ``groups``, when the call had rows: ``(ids, first)``, the stream of each row of ``scores``
    (dense ids numbered by first appearance, as :func:`calpipe.kernels.grouping.dense_ids`
    numbers them) and each stream's first row -- the grouping the engine computed, which the
    nightly monitoring reuses instead of grouping the same rows again (~0.25 s per 2M rows)."""

    scores: pl.DataFrame
    state: pl.DataFrame
    groups: tuple[np.ndarray, np.ndarray] | None = None


def protect(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    score: str | None = None,
    scores: str | None = None,
    label: str = "label",
    label_time: str | None = None,
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    method: str | Calibrator = config.DEFAULT_METHOD,
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

    Its cumulative log loss is at most the base's + ln(1/π) (= ln 2), and each input's + ln 36 + n/10⁴
    (K classes: ln 18).
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
    method : str or Calibrator
        ``composite-experts`` (default), ``composite-jumper``, ``ops``, ... any method of
        :data:`calpipe.calibrators.METHODS` (``calpipe methods`` lists them with parameters), or
        a calibrator object built with :func:`calpipe.make_calibrator` (no parameters then).
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
    │ a      ┆ 0.2001          │
    │ a      ┆ 0.6992          │
    │ a      ┆ 0.4002          │
    │ b      ┆ 0.8999          │
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
    method: str | Calibrator = config.DEFAULT_METHOD,
    base_method: str | None = None,
    base_params: dict | None = None,
    state: pl.DataFrame | None = None,
    progress: Callable[[int], None] | None = None,
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

    ``method`` is a method name (built with ``base_method``, ``base_params`` and ``params``) or
    a calibrator already built (:func:`calpipe.make_calibrator`; then no parameters): a
    nightly chain builds its calibrator once and hands the object to every call.

    ``progress``, a callable, is told ``progress(events)`` as the kernels protect them (the
    counts add up to the frame's events; ``calpipe protect``'s bar). A frame of
    :data:`calpipe.config.PIECES_MIN_EVENTS` events or more runs its operation list in pieces
    of about :data:`calpipe.config.PIECE_OPS` operations with the kernel state carried
    (:mod:`calpipe.engine.pieces`: the same rows and state, bit for bit, and faster, the
    kernels reading each piece's rows in order), told after each piece; a smaller frame runs
    in one kernel call, told once at the end.
    """
    cal = calibrator_of(method, base_method=base_method, base_params=base_params, **params)
    df, back = as_polars(frame)
    result = _protect_frame(df, cal, state, score=score, scores=scores, label=label,
                            label_time=label_time, by=by, order_by=order_by,
                            progress=progress)  # fmt: skip
    if back is None:
        return result
    # pandas / Arrow in: the scores go back in that kind (the state stays a polars frame)
    return ProtectResult(back(result.scores), result.state, result.groups)


def calibrator_of(method: str | Calibrator, **params) -> Calibrator:
    """The calibrator a call runs: ``method`` built with ``params``
    (:func:`calpipe.make_calibrator`), or ``method`` itself when it is a calibrator object,
    which then takes no parameters (ParameterError naming those given; ``None``, the default
    of ``base_method`` and ``base_params``, is none)."""
    if not isinstance(method, Calibrator):
        return make_calibrator(method, **params)
    given = sorted(k for k, v in params.items() if v is not None)
    if given:
        raise ParameterError(
            f"method is a calibrator object ({method.name!r}): its parameters are set already; "
            f"got {given} too"
        )
    return method


def _untold(events: int) -> None:
    """The progress of a call that asked for none."""


def _protect_frame(
    df: pl.DataFrame, cal: Calibrator, state, *, score, scores, label, label_time, by, order_by,
    progress=None,
) -> ProtectResult:  # fmt: skip
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
    check_state_schema(state0, cols)
    if df.height == 0:
        return ProtectResult(_empty_output(df, cols, cal), state0)
    return _run(df, cols, cal, n_classes, state0, progress)


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


def _run(
    df: pl.DataFrame,
    cols: Columns,
    cal: Calibrator,
    n_classes: int,
    state0: pl.DataFrame,
    progress: Callable[[int], None] | None = None,
) -> ProtectResult:
    replay = replay_order(df, cols)
    order, counts = replay.order, replay.counts
    n = df.height
    n_streams = counts.shape[0]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    ends = starts + counts - 1
    first_idx = starts if order is None else order[starts]  # input rows
    last_idx = ends if order is None else order[ends]
    # df[names][rows], not df.select(names)[rows]: a selection by name is no polars query
    first_rows = df[[*cols.by, *cols.order_by]][first_idx]
    streams = first_rows[list(cols.by)] if cols.by else pl.DataFrame()
    last_rows = df[list(cols.order_by)][last_idx]

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
    events = df[list(dict.fromkeys(needed))]  # by name: no polars query
    if delayed and order is not None:
        events = events[order]
    ev_sid = np.repeat(np.arange(n_streams, dtype=np.int64), counts) if delayed else replay.ids
    base = base_array(events, cols, n_classes)
    lab_s = events[cols.label]
    # every label known (the usual small call): no null mask and no fill to compute
    all_known = lab_s.null_count() == 0
    labelled = np.ones(n, dtype=bool) if all_known else lab_s.is_not_null().to_numpy()
    # Unknown labels read as class 0: the kernels read a label only at an update operation, and
    # there is none for an unlabelled event. One int64 array (no -1 marker, no clamped copy).
    labels = (lab_s if all_known else lab_s.fill_null(0)).cast(pl.Int64).to_numpy()

    # Carried state: join on the stream keys, check config and order.
    bstate, prev = join_state(cal, cols, n_classes, streams, first_rows, state0, n_streams)

    if not delayed:
        op_event = np.arange(n, dtype=np.int64) if order is None else order
        op_labelled = labelled if order is None else labelled[order]
        op_kind = np.where(op_labelled, ops.OP_STEP, ops.OP_FORECAST).astype(np.int8)
        op_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ext_scores, ext_labels = cal.prepare_scores(base), labels
        applied = np.bincount(ev_sid[labelled], minlength=n_streams)
        pending = prev[["pending_label_time", "pending_scores", "pending_labels"]]
    else:
        (op_event, op_kind, op_offsets, ext_scores, ext_labels, applied, pending) = delayed_ops(
            cal, cols, events, counts, base, labels, labelled, prev, n_classes
        )

    inputs = {
        key: np.ascontiguousarray(events[col].cast(pl.Int64).to_numpy())
        for key, col in cal.input_columns().items()
    }
    if n >= config.PIECES_MIN_EVENTS:  # the same bits, in pieces: contiguous reads
        plan = plan_pieces(op_offsets, config.PIECE_OPS, config.PIECE_MIN_STREAM_OPS)
        out, new_state = run_pieces(
            cal, n_classes, ext_scores, ext_labels, op_event, op_kind, op_offsets, bstate,
            inputs, n_events=n, plan=plan, progress=progress or _untold,
        )  # fmt: skip
    else:
        out, new_state = cal.run_batch(
            ext_scores, ext_labels, op_event, op_kind, op_offsets, bstate, inputs
        )
        if progress is not None:
            progress(n)
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
    scored = with_outputs(
        df,
        output_columns(
            df.schema, cols, n_classes, in_input_order(protected), in_input_order(log10m), extra
        ),
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
    return ProtectResult(
        scored, merge_state(state0, new_state_df, streams, cols), (replay.ids, replay.first)
    )


def with_outputs(df: pl.DataFrame, columns: list[pl.Series]) -> pl.DataFrame:
    """``df.with_columns(columns)``: appended without a polars query (~50 us) when none of
    their names is in ``df`` already (an extra output, e.g. ``p_lower``, may replace one)."""
    if any(c.name in df.columns for c in columns):
        return df.with_columns(columns)
    return df.hstack(columns)


def base_array(events: pl.DataFrame, cols: Columns, n_classes: int) -> np.ndarray:
    """The base forecasts of ``events`` as a contiguous float64 array: (n,) binary, (n, K).
    Two-class vectors ``[p0, p1]`` (validated as vectors) are the binary p1: the run is the
    binary run, bit for bit, and :func:`output_columns` gives its forecasts back as vectors."""
    if cols.score is not None:
        base = events[cols.score].cast(pl.Float64).to_numpy()
    elif n_classes == 2:
        v = pl.col(cols.scores)
        p1 = v.arr.get(1) if isinstance(events.schema[cols.scores], pl.Array) else v.list.get(1)
        base = events.select(p1.cast(pl.Float64)).to_series().to_numpy()
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
    outputs (``extra``: name -> values). Two-class vector input ran as the binary p1
    (:func:`base_array`): its forecasts come back as vectors ``[1 - p', p']``."""
    if cols.score is None and n_classes == 2 and protected.ndim == 1:
        two = two_class_output(RunOutput(protected, log10m, extra))
        protected, extra = two.protected, two.extra
    out_series = pl.Series(cols.out, protected)
    if cols.score is None:
        out_series = out_series.cast(pl.Array(pl.Float64, n_classes))
        if isinstance(schema[cols.scores], pl.List):
            out_series = out_series.cast(pl.List(pl.Float64))
    new_cols = [out_series, pl.Series("log10_martingale", log10m)]
    for name, values in extra.items():
        new_cols.append(_output_series(name, values, out_series.dtype))
    return new_cols


def _output_series(name: str, values: np.ndarray, forecast_dtype: pl.DataType) -> pl.Series:
    """An extra output column: like the forecast column (p_lower, ...), or a list per row."""
    if values.ndim == 1:
        return pl.Series(name, values)
    series = pl.Series(output_column(name, name != "log10_martingale_by_rate"), values)
    if name == "log10_martingale_by_rate" or isinstance(forecast_dtype, pl.List):
        return series.cast(pl.List(pl.Float64))
    return series.cast(forecast_dtype)


@dataclass
class DaysResult:
    """Output of :func:`protect_by_day`.

    ``scores``: the input rows (input order) with the outputs; ``states``: the end-of-day state
    row of every stream with events that day, with its ``date`` (ordered by date, then stream
    key); ``state``: the state at the end of the span (every stream of the input state and of the
    span, sorted by stream key); per day with events (``days``, in order): its events
    (``n_events``), streams with events (``n_active``) and streams in the state at its end
    (``n_streams``)."""

    scores: pl.DataFrame
    states: pl.DataFrame
    state: pl.DataFrame
    days: list[dt.date]
    n_events: np.ndarray
    n_active: np.ndarray
    n_streams: np.ndarray


def protect_by_day(
    frame: pl.DataFrame,
    *,
    day: str = "event_date",
    score: str | None = None,
    scores: str | None = None,
    label: str = "label",
    by: str | Sequence[str] | None = None,
    order_by: str | Sequence[str] = ("event_time", "event_id"),
    method: str | Calibrator = config.DEFAULT_METHOD,
    state: pl.DataFrame | None = None,
    **params,
) -> DaysResult:
    r""":func:`calpipe.protect_with_state` called once per day of ``frame`` (its Date column
    ``day``), in day order, carrying the state: the same rows, the same final state, and the
    state at the end of each day of the streams with events that day.

    With :math:`s_{d}` the state of a stream at the end of day :math:`d` and :math:`E_d` its
    events of day :math:`d` in replay order,

    .. math:: (\hat p_{E_d}, s_d) = \mathrm{protect}(E_d \mid s_{d-1}),

    the recursion of the method (Jumper: paper 000 Algorithms 1-2; Composite Jumper: paper 001
    Algorithm 1) run over each day's events from the previous day's end state; a day is one kernel call.
    Each stream's events must lie in day order (an event's ``day`` is the day it is processed
    on, e.g. its ``event_time``'s date). Labels are known at their events (no ``label_time``)
    and ``state`` holds no pending labels: a label feed runs day by day.

    >>> import calpipe, datetime as dt, polars as pl
    >>> from calpipe.engine.driver import protect_by_day
    >>> t = [dt.datetime(2024, 1, d, 9) for d in (1, 1, 2)]
    >>> ev = pl.DataFrame({"stream": ["a", "b", "a"], "event_time": t, "event_id": [1, 2, 3],
    ...                    "score": [0.2, 0.7, 0.4], "label": [0, 1, 0]})
    >>> r = protect_by_day(ev.with_columns(pl.col("event_time").dt.date().alias("event_date")))
    >>> r.states.select("date", "stream", "n_events").rows()
    [(datetime.date(2024, 1, 1), 'a', 1), (datetime.date(2024, 1, 1), 'b', 1), (datetime.date(2024, 1, 2), 'a', 2)]
    """
    cal = calibrator_of(method, **params)
    cols = resolve_columns(
        frame.columns, score=score, scores=scores, label=label, label_time=None,
        by=by, order_by=order_by,
    )  # fmt: skip
    if day not in frame.columns or frame.schema[day] != pl.Date:
        raise InputError(day, None, "the day column must be a Date column")
    state0 = empty_state(frame.schema, cols) if state is None else state
    if frame.height == 0:  # days without events: nothing runs, every state is kept
        check_state_schema(state0, cols)
        none = np.zeros(0, dtype=np.int64)
        states = state0.clear().with_columns(pl.lit(None, pl.Date).alias("date"))
        return DaysResult(_empty_output(frame, cols, cal), states, state0, [], none, none, none)
    n_classes = validate_frame(frame, cols, check_duplicates=False)
    cal.check_classes(n_classes)
    _check_input_columns(frame, cal)
    check_rules(frame, [Rule(day, "day must not be null", pl.col(day).is_null())])
    check_state_schema(state0, cols)
    if state0.height and bool(state0["pending_labels"].list.len().sum()):
        raise InputError("pending_labels", None, "a span runs labels known at their events only")

    # 1. group by stream, replay order, the carried state of each stream
    replay = replay_order(frame, cols)
    n = frame.height
    sid_of_row, counts = replay.ids, replay.counts
    n_streams = counts.shape[0]
    rep = np.arange(n, dtype=np.int64) if replay.order is None else replay.order
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    first_rows = frame.select([*cols.by, *cols.order_by])[rep[starts]]
    streams = first_rows.select(cols.by) if cols.by else pl.DataFrame()
    bstate, prev = join_state(cal, cols, n_classes, streams, first_rows, state0, n_streams)

    # 2. day-major order: a day is a slice, a stream's events of a day a segment of it
    code = frame[day].to_physical().cast(pl.Int64).to_numpy()
    c_rep, s_rep = code[rep], sid_of_row[rep]
    back = np.flatnonzero((s_rep[1:] == s_rep[:-1]) & (c_rep[1:] < c_rep[:-1]))
    if back.size:
        r = int(rep[back[0] + 1])
        raise InputError(day, r, "a stream's events must be in day order (replay order)")
    perm = rep[np.argsort(c_rep, kind="stable")]
    sid, dcode = sid_of_row[perm], code[perm]
    new_seg = np.ones(n, dtype=bool)
    new_seg[1:] = (sid[1:] != sid[:-1]) | (dcode[1:] != dcode[:-1])
    seg_start = np.flatnonzero(new_seg).astype(np.int64)
    seg_end = np.append(seg_start[1:], n)
    seg_sid = sid[seg_start]
    day_first = np.ones(seg_start.shape[0], dtype=bool)
    day_first[1:] = dcode[seg_start[1:]] != dcode[seg_start[:-1]]
    day_seg = np.append(np.flatnonzero(day_first), seg_start.shape[0])  # segments of each day

    base = np.ascontiguousarray(base_array(frame, cols, n_classes)[perm])
    lab = frame[cols.label]
    labelled = lab.is_not_null().to_numpy()[perm]
    labels = lab.fill_null(0).cast(pl.Int64).to_numpy()[perm]
    inputs = {
        key: frame[col].cast(pl.Int64).to_numpy()[perm] for key, col in cal.input_columns().items()
    }

    # 3. one kernel call per day, the kernel state carried between days
    n_ev = prev["n_events"].to_numpy().astype(np.int64)
    n_lab = prev["n_labelled"].to_numpy().astype(np.int64)
    peak = prev["log10_martingale_max"].to_numpy().astype(np.float64)
    protected = np.empty_like(base)
    log10m = np.empty(n)
    extra: dict[str, np.ndarray] = {}
    snap: dict[str, list[np.ndarray]] = {
        k: [] for k in ("values", "lengths", "log10m", "n_events", "n_labelled", "peak")
    }
    for j in range(day_seg.shape[0] - 1):
        s0, s1 = int(day_seg[j]), int(day_seg[j + 1])
        a, b = int(seg_start[s0]), int(seg_end[s1 - 1])
        ids = seg_sid[s0:s1]
        seg_n = seg_end[s0:s1] - seg_start[s0:s1]
        op_offsets = np.append(seg_start[s0:s1], b) - a
        day_lab = labelled[a:b]
        op_kind = np.where(day_lab, ops.OP_STEP, ops.OP_FORECAST).astype(np.int8)
        out, new = cal.run_batch(
            cal.prepare_scores(base[a:b]), np.ascontiguousarray(labels[a:b]),
            np.arange(b - a, dtype=np.int64), op_kind, op_offsets,
            take_streams(cal, bstate, ids, n_classes),
            {k: np.ascontiguousarray(x[a:b]) for k, x in inputs.items()},
        )  # fmt: skip
        protected[a:b] = out.protected[: b - a]
        log10m[a:b] = out.log10_martingale[: b - a]
        for name in cal.extra_outputs:
            values = out.extra[name][: b - a]
            if name not in extra:
                extra[name] = np.empty((n, *values.shape[1:]), dtype=values.dtype)
            extra[name][a:b] = values
        local = np.repeat(np.arange(ids.shape[0], dtype=np.int64), seg_n)
        n_ev[ids] += seg_n
        n_lab[ids] += np.bincount(local[day_lab], minlength=ids.shape[0])
        peak[ids] = G.group_max(log10m[a:b], local, peak[ids])
        values, offsets = new.flat()
        snap["values"].append(np.asarray(values[offsets[0] : offsets[-1]], dtype=np.float64))
        snap["lengths"].append(np.diff(offsets))
        snap["log10m"].append(np.array(new.log10m, dtype=np.float64))
        snap["n_events"].append(n_ev[ids].copy())
        snap["n_labelled"].append(n_lab[ids].copy())
        snap["peak"].append(peak[ids].copy())
        bstate = bstate.scatter(ids, new)

    # 4. outputs at their input rows, the end-of-day state rows, the final state
    def at_input(values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        out[perm] = values
        return out

    scored = frame.with_columns(
        output_columns(
            frame.schema, cols, n_classes, at_input(protected), at_input(log10m),
            {name: at_input(extra[name]) for name in cal.extra_outputs},
        )
    )  # fmt: skip

    lengths = np.concatenate(snap["lengths"])
    n_seg = seg_start.shape[0]
    pending = pl.DataFrame(
        [
            empty_lists(n_seg, TIME_US).alias("pending_label_time"),
            empty_lists(n_seg, pl.Float64).alias("pending_scores"),
            empty_lists(n_seg, pl.Int64).alias("pending_labels"),
        ]
    )
    states = state_frame(
        cal, cols, n_classes, streams[seg_sid] if cols.by else pl.DataFrame(),
        n_events=np.concatenate(snap["n_events"]),
        n_labelled=np.concatenate(snap["n_labelled"]),
        log10m=np.concatenate(snap["log10m"]), peak=np.concatenate(snap["peak"]),
        weights=weights_series(
            np.concatenate(snap["values"]),
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        ),
        last_rows=frame.select(cols.order_by)[perm[seg_end - 1]], pending=pending,
    )  # fmt: skip
    seg_code = dcode[seg_start]
    dates = pl.Series("date", seg_code, dtype=pl.Int32).cast(pl.Date)
    last_seg = np.full(n_streams, -1, dtype=np.int64)
    np.maximum.at(last_seg, seg_sid, np.arange(n_seg, dtype=np.int64))
    final = merge_state(state0, states[last_seg], streams, cols)
    states = states.with_columns(dates).sort(["date", *cols.by])

    # streams in the state at the end of each day: the carried ones, and those new by then
    first_seg = np.full(n_streams, n_seg, dtype=np.int64)
    np.minimum.at(first_seg, seg_sid, np.arange(n_seg, dtype=np.int64))
    known = streams_in_state(streams, state0, cols) if state0.height else np.zeros(n_streams, bool)
    day_of_first = np.searchsorted(day_seg, first_seg[~known], side="right") - 1
    new_by_day = np.cumsum(np.bincount(day_of_first, minlength=day_seg.shape[0] - 1))
    day_codes = seg_code[day_seg[:-1]]
    return DaysResult(
        scored, states, final,
        days=pl.Series(day_codes, dtype=pl.Int32).cast(pl.Date).to_list(),
        n_events=np.diff(np.append(seg_start, n)[day_seg]),
        n_active=np.diff(day_seg),
        n_streams=state0.height + new_by_day,
    )  # fmt: skip
