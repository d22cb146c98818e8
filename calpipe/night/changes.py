"""``change_points`` rows and the change detector's state: change points after the first alarm.

The test martingale (:mod:`calpipe.night.alarms`) is one-shot: once it crosses 100 it says
nothing about the next change. The change detector is a CUSUM e-detector
(:mod:`calpipe.kernels.change_points`, Shin, Ramdas & Rinaldo 2023) over likelihood-ratio
factors, one per label, in the order labels are learnt:

.. math::

    L_n = \\frac{p_n(y_n)}{r_n(y_n)}, \\qquad c_n = \\log_{10} L_n + \\max(c_{n-1}, 0),

where p_n is the protected forecast made at the event (before its label) and r_n the
stream's *reference* forecast of the same event:

* until the stream's first change point, the base forecast the martingale bets against
  (``base_score``): L_n are then the factors of the test martingale itself when labels come
  with their events, and the null is the alarm's: the base forecasts are calibrated;
* after change point k, the protected forecaster's map p -> p' as it stood at the end of the
  night d its settling ended (below; its serving map, frozen on
  :data:`calpipe.config.CHANGE_REFERENCE_KNOTS` scores and interpolated linearly in logit),
  applied to the event's raw score, from night d + 1 on. The null is then: the labels follow the map served after the last change; a new
  change makes the still-learning protected forecaster beat the frozen map, and c grows.

A change point is a crossing c_n >= :data:`calpipe.config.CHANGE_LOG10_THRESHOLD`; under the
current reference's null the mean number of labels to a false one is >= 10^threshold
(the e-detector's average run length). The estimated change is the event time of the first
label of the run that crossed (the CUSUM's argmax). After a crossing the stream's detector lets
the protected forecaster learn :data:`calpipe.config.CHANGE_SETTLE_LABELS` labels of the new
calibration (not counted), freezes its map at the end of the night in which the last of them
came, and restarts from 0 the next night: a map frozen at once, from a few post-change labels,
was an early estimate that the still-learning forecaster soon beat, a "change" that was only
its learning. A stream reports at most one change point a night.

With delayed labels (a label feed) the factors come in the order labels are learnt (label
time, then event order), each with the forecast made at its event, which is fixed before its
label is learnt: the null is the alarm's under delays (docs/ARCHITECTURE.md §4: each label is
Bernoulli with its event's reference probability given every label learnt before it).

K classes: the factor is the forecast's probability of the label class; the reference stays
the base (a frozen map of K-class vectors has no small table), so a K-class stream whose base
stays miscalibrated reports a change point a night until its base is calibrated again. A
method whose map reads more than the score (``input_columns``) keeps the base too.

Pure and in memory, like every module of :mod:`calpipe.night`.

Example
-------
>>> import datetime as dt
>>> f = pl.DataFrame({"stream": ["a"] * 3, "learn_time": [1, 2, 3], "event_time": [1, 2, 3],
...                   "event_id": [1, 2, 3], "log10_factor": [2.5, -1.0, 3.0]})
>>> rows, state, to_freeze = detect(f, None, dt.date(2024, 3, 1))
>>> rows.select("stream", "change_number", "log10_statistic", "labels_in_run").rows()
[('a', 1, 4.5, 3)]
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from calpipe import config
from calpipe.calibrators import Calibrator
from calpipe.engine import state_from_rows
from calpipe.engine.contract import TIME_US
from calpipe.engine.ordering import key_order
from calpipe.errors import ParameterError
from calpipe.kernels.change_points import NO_RUN, cusum_detect
from calpipe.kernels.grouping import counting_sort, lex_increasing_in_groups
from calpipe.night.monitoring import stream_groups

#: The detector's state, carried in ``calibrator_state`` beside the calibrator's (null: a
#: stream whose detector has not started: c = 0, no run, no change point, the base as reference).
DETECTOR_SCHEMA: dict[str, pl.DataType] = {
    "change_log10_cusum": pl.Float64,  # c, the CUSUM's log10 statistic (>= 0)
    "change_run_start": TIME_US,  # the open run's first label's event time (null: none)
    "change_run_labels": pl.Int64,  # the open run's labels
    "change_count": pl.Int32,  # change points so far
    "change_settle_labels": pl.Int64,  # labels still to learn before the map is frozen (0: none)
    "change_reference_date": pl.Date,  # the night whose map is the reference (null: the base)
    "change_reference": pl.List(pl.Float64),  # that map at the knots (null: the base)
}

#: ``change_points`` rows (the table's columns, in its order).
CHANGE_SCHEMA: dict[str, pl.DataType] = {
    "detected_date": pl.Date,
    "stream": pl.String,
    "change_number": pl.Int32,
    "detected_time": TIME_US,
    "detected_event_id": pl.Int64,
    "estimated_change_time": TIME_US,
    "estimated_change_date": pl.Date,
    "log10_statistic": pl.Float64,
    "threshold": pl.Float64,
    "labels_in_run": pl.Int64,
    "reference_date": pl.Date,
}

#: The factors' columns (:func:`factors`, what :func:`detect` reads).
FACTOR_COLUMNS = ("stream", "learn_time", "event_time", "event_id", "log10_factor")


def knots() -> np.ndarray:
    """The raw scores at which a reference map is frozen: equally spaced in logit over
    [eps, 1 - eps] (:data:`calpipe.config.CHANGE_REFERENCE_EPS`)."""
    eps = config.CHANGE_REFERENCE_EPS
    lo = np.log(eps / (1.0 - eps))
    return 1.0 / (1.0 + np.exp(-np.linspace(lo, -lo, config.CHANGE_REFERENCE_KNOTS)))


def _logit(p: np.ndarray) -> np.ndarray:
    eps = config.CHANGE_REFERENCE_EPS
    p = np.clip(p, eps, 1.0 - eps)
    return np.log(p / (1.0 - p))


def reference_probability(tables: np.ndarray, which: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """The reference forecast (probability of class 1) of events with raw scores ``raw`` under
    the frozen maps ``tables`` ((R, knots): each map's values at :func:`knots`), event i under
    ``tables[which[i]]``: linear in logit between the knots, the score clipped to their range."""
    g = _logit(knots())
    step = g[1] - g[0]
    pos = (np.clip(_logit(raw), g[0], g[-1]) - g[0]) / step
    i0 = np.clip(np.floor(pos).astype(np.int64), 0, g.shape[0] - 2)
    w = pos - i0
    t = _logit(tables)
    z = t[which, i0] * (1.0 - w) + t[which, i0 + 1] * w
    return 1.0 / (1.0 + np.exp(-z))


def _label_probability(frame: pl.DataFrame, column: str) -> pl.Expr:
    """The forecast's probability of the event's label, the forecast clipped to
    [eps, 1 - eps] (binary; K classes: each class floored at eps, then renormalised), eps =
    :data:`calpipe.config.CHANGE_REFERENCE_EPS`: a clipped forecast is still a forecast made
    before the label, and every factor is then finite (a method may forecast 0 or 1)."""
    eps = config.CHANGE_REFERENCE_EPS
    c = pl.col(column)
    if isinstance(frame.schema[column], pl.List):
        floored = c.list.eval(pl.element().clip(lower_bound=eps))
        return floored.list.get(pl.col("label").cast(pl.Int64)) / floored.list.sum()
    c = c.clip(eps, 1.0 - eps)
    return pl.when(pl.col("label") == 1).then(c).otherwise(1.0 - c)


def factors(labelled: pl.DataFrame, state: pl.DataFrame | None) -> pl.DataFrame:
    """The detector's factors (:data:`FACTOR_COLUMNS`) of a night's labels, sorted by stream
    and learning order (learn time, then event time and id).

    ``labelled``: one row per label learnt: ``stream``, ``event_id``, ``event_time``,
    ``learn_time`` (when the label was learnt), ``label``, ``base`` and ``protected`` (the
    forecasts made at the event: floats, or K-class lists) and ``raw`` (the event's raw score;
    binary). ``state``: the streams' state before the night (:data:`DETECTOR_SCHEMA` columns;
    None: none), whose frozen maps are the references."""
    prot = _label_probability(labelled, "protected").alias("__p")
    base = _label_probability(labelled, "base").alias("__b")
    frame = labelled.select("stream", "learn_time", "event_time", "event_id", prot, base, "raw")
    p = frame["__p"].cast(pl.Float64).to_numpy()
    r = frame["__b"].cast(pl.Float64).to_numpy().copy()
    if state is not None and "change_reference" in state.columns:
        refs = state.filter(pl.col("change_reference").is_not_null())
        if refs.height and frame["raw"].dtype == pl.Float64:
            which = (
                frame.select("stream")
                .join(refs.select("stream").with_row_index("__r"), on="stream", how="left",
                      maintain_order="left")["__r"]
            )  # fmt: skip
            has = which.is_not_null().to_numpy()
            if has.any():
                tables = np.vstack(refs["change_reference"].to_list())
                p1 = reference_probability(
                    tables, which.to_numpy()[has].astype(np.int64),
                    frame["raw"].to_numpy()[has],
                )  # fmt: skip
                y = labelled["label"].to_numpy()[has]
                r[has] = np.where(y == 1, p1, 1.0 - p1)
    f = np.log10(p / r)  # (one log: 0.1 s of a 10M-label night less than two)
    out = frame.select(*FACTOR_COLUMNS[:4]).with_columns(pl.Series("log10_factor", f))
    order = _learning_order(out)
    if out.height > 1 and not bool(np.all(order[1:] > order[:-1])):
        out = out[order]
    return out


def _learning_order(out: pl.DataFrame) -> np.ndarray:
    """The rows of ``out`` grouped by stream, each stream's in learning order (learn time, then
    event time and id). The usual night's labels already come in that order within each
    stream (a landing sorted by time): then a counting sort by stream suffices, checked row
    by row (a global sort of (stream, learn time, event time, id) was 40 % of the detector's
    time on a 10M-event night); otherwise, or with string ids, the global sort. The streams'
    order among themselves is their first appearance: the detector's results do not depend
    on it, and its rows are sorted where they are written."""
    keys = ["stream", "learn_time", "event_time", "event_id"]
    if out.height < 2 or out["event_id"].dtype != pl.Int64:
        return key_order(out, keys)
    ids, first = stream_groups(out, ["stream"])
    # the counting sort is stable: each stream's rows keep their order, so checking that order
    # in place, row by row, is checking the sorted rows (without gathering three columns)
    in_order = lex_increasing_in_groups(
        *(out[c].to_physical().to_numpy() for c in keys[1:]), ids, first.shape[0]
    )
    return counting_sort(ids, first.shape[0])[0] if in_order else key_order(out, keys)


def _carried(state: pl.DataFrame | None, streams: pl.Series) -> pl.DataFrame:
    """The detector state of ``streams`` (unique) from ``state`` (initial where none)."""
    frame = pl.DataFrame({"stream": streams})
    if state is not None and "change_count" in state.columns:
        frame = frame.join(
            state.select("stream", *DETECTOR_SCHEMA), on="stream", how="left",
            maintain_order="left",
        )  # fmt: skip
    else:
        frame = frame.with_columns(pl.lit(None, t).alias(c) for c, t in DETECTOR_SCHEMA.items())
    return frame.with_columns(
        pl.col("change_log10_cusum").fill_null(0.0),
        pl.col("change_run_labels").fill_null(0),
        pl.col("change_count").fill_null(0),
        pl.col("change_settle_labels").fill_null(0),
    )


def detect(
    f: pl.DataFrame, state: pl.DataFrame | None, day: dt.date
) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series]:
    """One night of the detector: its ``change_points`` rows and the detector state after it.

    ``f``: the night's factors (:func:`factors`: sorted by stream, then learning order);
    ``state``: the state before (:data:`DETECTOR_SCHEMA` columns; None: none). Returns the
    rows (:data:`CHANGE_SCHEMA`, sorted by stream), the state of the streams with factors
    (``stream`` and :data:`DETECTOR_SCHEMA`) and the streams whose reference is to be frozen
    at the night's end (:func:`freeze`: their settling after a change point ended tonight)."""
    s = f["stream"]
    first = np.flatnonzero((s != s.shift(1)).fill_null(True).to_numpy()) if f.height else (
        np.zeros(0, np.int64))  # fmt: skip
    names = s.gather(first)
    offsets = np.append(first, f.height).astype(np.int64)
    before = _carried(state, names)
    start0 = before["change_run_start"].cast(pl.Int64).fill_null(NO_RUN).to_numpy()
    c, start, count, settle, to_freeze, hit, hit_c, hit_start, hit_n = cusum_detect(
        offsets, f["log10_factor"].to_numpy(), f["event_time"].cast(TIME_US).to_physical()
        .to_numpy(), before["change_log10_cusum"].to_numpy(), start0,
        before["change_run_labels"].to_numpy(), config.CHANGE_LOG10_THRESHOLD,
        before["change_settle_labels"].to_numpy(), config.CHANGE_SETTLE_LABELS,
    )  # fmt: skip
    crossed = hit >= 0
    number = before["change_count"].to_numpy().astype(np.int32) + crossed
    after = before.with_columns(
        pl.Series("change_log10_cusum", c),
        pl.Series("change_run_start", start).set(pl.Series(start == NO_RUN), None).cast(TIME_US),
        pl.Series("change_run_labels", count),
        pl.Series("change_count", number, pl.Int32),
        pl.Series("change_settle_labels", settle),
    )  # fmt: skip
    at = hit[crossed]
    run_start = pl.Series(hit_start[crossed]).cast(TIME_US)
    rows = pl.DataFrame(
        {
            "detected_date": pl.Series([day] * int(crossed.sum()), dtype=pl.Date),
            "stream": names.filter(pl.Series(crossed)),
            "change_number": pl.Series(number[crossed], dtype=pl.Int32),
            "detected_time": f["learn_time"].cast(TIME_US).gather(at),
            "detected_event_id": f["event_id"].gather(at),
            "estimated_change_time": run_start,
            "estimated_change_date": run_start.dt.date(),
            "log10_statistic": hit_c[crossed],
            "threshold": pl.Series([config.CHANGE_LOG10_THRESHOLD] * int(crossed.sum()),
                                   dtype=pl.Float64),
            "labels_in_run": hit_n[crossed],
            "reference_date": before["change_reference_date"].filter(pl.Series(crossed)),
        }
    )  # fmt: skip
    return rows, after, names.filter(pl.Series(to_freeze))


def freeze(
    cal: Calibrator, n_classes: int, after: pl.DataFrame, streams: pl.Series,
    end_state: pl.DataFrame, day: dt.date,
) -> pl.DataFrame:  # fmt: skip
    """The detector state ``after`` (:func:`detect`'s) with ``streams`` (:func:`detect`'s third
    output) given the night's map as their reference: the calibrator's serving map of their
    end-of-night state (``end_state``: the engine's state rows) at :func:`knots`. Binary maps of
    the score alone only (module docstring); the others keep their reference (the base)."""
    if not streams.len() or n_classes != 2 or cal.input_columns():
        return after
    sub = end_state.join(
        pl.DataFrame({"stream": streams}), on="stream", how="semi", maintain_order="left"
    )
    if not sub.height:
        return after
    x = np.ascontiguousarray(np.tile(knots(), (sub.height, 1)))
    try:
        mapped = cal.serving_map(state_from_rows(cal, sub, 2), x)
    except ParameterError:  # a method without a map of the score alone
        return after
    eps = config.CHANGE_REFERENCE_EPS
    maps = pl.DataFrame(
        {
            "stream": sub["stream"],
            "__map": pl.Series(np.clip(mapped, eps, 1.0 - eps).tolist(), dtype=pl.List(pl.Float64)),
        }
    )
    return (
        after.join(maps, on="stream", how="left", maintain_order="left")
        .with_columns(
            pl.coalesce("__map", "change_reference").alias("change_reference"),
            pl.when(pl.col("__map").is_not_null())
            .then(pl.lit(day, pl.Date))
            .otherwise(pl.col("change_reference_date"))
            .alias("change_reference_date"),
        )
        .drop("__map")
    )


def with_detector(
    state: pl.DataFrame, before: pl.DataFrame | None, after: pl.DataFrame | None
) -> pl.DataFrame:
    """The engine's state frame ``state`` with the detector's columns: ``after``'s (the streams
    the night's labels moved), else ``before``'s (the state carried), else initial."""
    engine = state.drop([c for c in DETECTOR_SCHEMA if c in state.columns])
    carried = _carried(before, engine["stream"]).cast(DETECTOR_SCHEMA)
    if after is not None and after.height:
        carried = carried.update(
            after.select("stream", *DETECTOR_SCHEMA).cast(DETECTOR_SCHEMA), on="stream",
            how="left", include_nulls=True,
        )  # fmt: skip
    return pl.concat([engine, carried.drop("stream")], how="horizontal")


def merged_detector(det: pl.DataFrame | None, after: pl.DataFrame) -> pl.DataFrame:
    """The detector state of every stream seen (``stream`` and :data:`DETECTOR_SCHEMA`):
    ``det``'s (a state frame or a detector frame; None: none), with ``after``'s streams
    replaced and new ones added, sorted by stream (a span's state from one day to the next)."""
    cols = ["stream", *DETECTOR_SCHEMA]
    after = after.select(cols).cast(DETECTOR_SCHEMA)
    if det is None or "change_count" not in det.columns:
        return after
    kept = det.select(cols).cast(DETECTOR_SCHEMA).join(after, on="stream", how="anti")
    return pl.concat([kept, after]).sort("stream")


def engine_state(state: pl.DataFrame | None) -> pl.DataFrame | None:
    """The calibrator's part of a state frame (the detector's columns dropped), as the engine
    takes it."""
    if state is None:
        return None
    return state.drop([c for c in DETECTOR_SCHEMA if c in state.columns])


def _labelled(frame: pl.DataFrame, binary: bool) -> pl.DataFrame:
    """The columns :func:`factors` reads, in their types."""
    raw = pl.col("raw").cast(pl.Float64) if binary else pl.lit(None, pl.Float64).alias("raw")
    return frame.select(
        "stream", "event_id", pl.col("event_time").cast(TIME_US),
        pl.col("learn_time").cast(TIME_US), pl.col("label").cast(pl.Int64), "base", "protected",
        raw, *(["event_date"] if "event_date" in frame.columns else []),
    )  # fmt: skip


def labelled_in_rows(scores: pl.DataFrame, protected: pl.DataFrame) -> pl.DataFrame:
    """The labels a batch's events carry (``scores``: the engine's output rows; ``protected``:
    their ``protected_scores`` rows, row for row), for :func:`factors`: each learnt at its
    ``label_time`` (a label of the feed for a night's own event), else at its event."""
    s = "s" if "base_scores" in protected.columns else ""
    learn = pl.col("event_time")
    if "label_time" in scores.columns:
        learn = pl.coalesce(pl.col("label_time").cast(TIME_US), learn.cast(TIME_US))
    frame = scores.select(
        "stream", "event_id", "event_time", learn.alias("learn_time"),
        pl.col("score").alias("raw") if not s else pl.lit(None, pl.Float64).alias("raw"),
        *(["event_date"] if "event_date" in scores.columns else []),
    ).with_columns(
        protected["label"], protected[f"base_score{s}"].alias("base"),
        protected[f"protected_score{s}"].alias("protected"),
    )  # fmt: skip
    return _labelled(frame.filter(pl.col("label").is_not_null()), not s)


def late_labelled(rows: pl.DataFrame, forecasts: pl.DataFrame | None, day: dt.date) -> pl.DataFrame:
    """The labels of earlier events a night learns (``rows``: the night's ``event_labels`` rows;
    ``forecasts``: their events' stored forecasts, row for row: ``__base``, ``__prot``), for
    :func:`factors`: each learnt at its ``label_time``."""
    binary = "scores" not in rows.columns
    if forecasts is None or not rows.height:
        frame = (
            rows.head(0)
            .select("stream", "event_id", "event_time", "label")
            .with_columns(
                pl.col("event_time").alias("learn_time"),
                pl.lit(None, pl.Float64 if binary else pl.List(pl.Float64)).alias("base"),
                pl.lit(None, pl.Float64 if binary else pl.List(pl.Float64)).alias("protected"),
                pl.lit(None, pl.Float64).alias("raw"),
            )
        )
        return _labelled(frame, binary)
    frame = pl.concat([rows, forecasts], how="horizontal").filter(pl.col("event_date") < day)
    return _labelled(
        frame.select(
            "stream", "event_id", "event_time", pl.col("label_time").alias("learn_time"),
            "label", pl.col("__base").alias("base"), pl.col("__prot").alias("protected"),
            pl.col("score" if binary else "event_id").alias("raw"),
        ),
        binary,
    )  # fmt: skip
