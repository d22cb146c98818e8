"""Rows of ``calibration_daily`` and ``calibration_arrivals``: forecast quality, base vs protected.

:func:`daily_rows` (:func:`daily_metrics` of a day's protected rows plus the end-of-day
martingale and the alarm flag) and :func:`arrival_rows` (the forecasts whose labels arrived
that night: their :func:`arrival_stats`, with the end-of-night martingale). The metrics
themselves are defined in :mod:`calpipe.metrics`; rows are grouped by stream with the grouping
kernel (:func:`stream_groups`).

**Computed once.** On a night whose labels all came in its rows (no label feed, or none that
night), the arrived forecasts are the night's labelled rows: their statistics are those
``calibration_daily`` computes (:func:`rows_arrival_stats`), bit for bit when each stream's
labelled rows come in event id order (:func:`labels_in_id_order`), and computed apart otherwise.

**The arrived forecasts of a night** (what ``calibration_arrivals`` judges): one row per label
learnt that night, with columns ``date`` (the night), ``stream``, ``event_id``, the base and
protected forecasts made at the event (``base_score``/``protected_score``, or their K-class
vectors), ``label`` and ``delay_s`` (label time minus event time in seconds, the difference of
the two times as doubles; 0 for a label known with its event). They are the labels of the
night's own scored events that came with them, and the labels the feed brought that night for
any event (its forecast looked up when the label was checked), sorted by (date, stream,
event_id).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import numpy as np
import polars as pl

from calpipe import config, metrics
from calpipe.engine.contract import stream_ids
from calpipe.engine.ordering import sort_by_keys
from calpipe.kernels.grouping import dense_ids, increasing_in_groups
from calpipe.night.arrivals import Arrivals

#: The metrics of ``calibration_arrivals`` (those of ``calibration_daily`` over labelled rows).
_ARRIVAL_METRICS = tuple(
    f"{who}_{m}"
    for m in ("log_loss", "brier", "ece", "smooth_ece")
    for who in ("base", "protected")
)


def stream_groups(frame: pl.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, first): a dense group id per row for its ``keys`` and the first row of each group,
    numbered in order of first appearance (:func:`calpipe.kernels.grouping.dense_ids`).

    A single string key without nulls (the stream) is numbered from polars' categorical codes,
    one exact code per distinct string, so no collision check is needed: at the nightly run's
    batch size this costs about the time of :func:`calpipe.engine.contract.stream_ids` (which hashes the
    keys and then compares every row's key with its group's first) and ~50 MB less memory per
    2M rows. Other keys go through :func:`calpipe.engine.contract.stream_ids`."""
    key = frame[keys[0]] if len(keys) == 1 else None
    if key is None or key.dtype != pl.String or key.null_count():
        return stream_ids(frame, keys)
    return dense_ids(key.cast(pl.Categorical).to_physical().to_numpy())


def _corp_columns(
    forecasts: dict[str, np.ndarray],
    y: np.ndarray,
    ids: np.ndarray,
    n_groups: int,
    losses: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The CORP decomposition (:func:`calpipe.metrics.grouped_corp`) of the log loss and the
    Brier score of base and protected (``forecasts``, of labelled rows): the columns
    ``{base,protected}_{log_loss,brier}_{mcb,dsc}`` and the uncertainty ``{log_loss,brier}_unc``
    (the labels' alone, the same for both forecasts). ``losses``: the columns
    ``{base,protected}_{log_loss,brier}`` already computed.

    K classes ((n, K) forecasts): the Brier columns are the classwise decomposition
    (:func:`calpipe.metrics.grouped_corp_classwise`: one vs rest per class, summed), which
    decomposes the K-class Brier score itself; the log loss's columns are NaN, because the
    K-class log loss -log p_y has no CORP decomposition (no unique isotonic recalibration of a
    probability vector)."""
    out: dict[str, np.ndarray] = {}
    for who, p in forecasts.items():
        if p.ndim == 2:
            d = metrics.grouped_corp_classwise(p, y, ids, n_groups)
            nan = np.full(n_groups, np.nan)
            d |= {f"log_{t}": nan for t in ("miscalibration", "discrimination", "uncertainty")}
        else:
            d = metrics.grouped_corp(
                p, y, ids, n_groups,
                log_score=losses[f"{who}_log_loss"], brier_score=losses[f"{who}_brier"],
            )  # fmt: skip
        for score, name in (("log", "log_loss"), ("brier", "brier")):
            out[f"{who}_{name}_mcb"] = d[f"{score}_miscalibration"]
            out[f"{who}_{name}_dsc"] = d[f"{score}_discrimination"]
            out[f"{name}_unc"] = d[f"{score}_uncertainty"]
    return out


def class_vectors(col: pl.Series) -> np.ndarray:
    """(n, K) float array of a column of K-class probability vectors."""
    if col.len() == 0:
        return np.zeros((0, 3))
    k = int(col.list.len().max())
    return np.ascontiguousarray(col.list.to_array(k).to_numpy(), dtype=np.float64)


def daily_metrics(
    scores: pl.DataFrame,
    keys: Sequence[str] = ("event_date", "stream"),
    *,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
    corp: bool = True,
) -> pl.DataFrame:
    """Forecast quality of base vs protected per group (``keys``) of protected rows.

    Counts, mean natural log loss, Brier, ECE (:data:`calpipe.config.ECE_BINS` equal-width
    bins), smooth ECE and the CORP decomposition of log loss and Brier (miscalibration ``_mcb``,
    discrimination ``_dsc``, uncertainty ``_unc``: loss = mcb - dsc + unc) over the labelled events, mean base / protected score over all events, mean label over
    labelled ones, and the within-group maximum of the running log10 martingale. The base is
    ``base_score``, the score as the engine used it (clipped in log-loss mode), so that base
    minus protected cumulative log loss is the log test martingale.

    K classes (``base_scores``/``protected_scores`` vectors): log loss of the label's
    probability, the multiclass Brier score (sum over classes), ECE and smooth ECE of the top
    label (:func:`calpipe.metrics.top_label`), the classwise CORP decomposition of the Brier
    score (:func:`_corp_columns`); the log loss's CORP columns and the means are binary and
    null.

    The metrics are :mod:`calpipe.metrics`' grouped numpy forms (every group at once, as
    per-group sums in row order: the same rows in the same order give the same bits). Groups
    without labelled events get nulls. ``groups``: the caller's ``(ids, first)`` of the rows'
    groups, dense ids numbered in order of first appearance that split the rows as ``keys`` do
    (:func:`stream_groups` of ``scores`` by ``keys``, or by ``stream`` alone for rows of one
    date). ``corp=False`` leaves the CORP columns out (their
    isotonic fits are a third of the cost; the arrival monitoring does not report them).

    >>> s = pl.DataFrame({"stream": ["a", "a", "b"], "base_score": [0.2, 0.7, 0.5],
    ...                   "protected_score": [0.3, 0.6, 0.5], "label": [0, 1, None],
    ...                   "log10_martingale": [0.01, 0.05, 0.0]})
    >>> m = daily_metrics(s, keys=["stream"])
    >>> m.select("stream", "n_events", "n_labelled", pl.col("base_brier").round(3)).rows()
    [('a', 2, 2, 0.065), ('b', 1, 0, None)]
    """
    keys = list(keys)
    ids, first = stream_groups(scores, keys) if groups is None else groups
    n_groups = first.shape[0]
    multiclass = "base_scores" in scores.columns
    if multiclass:
        base, prot = class_vectors(scores["base_scores"]), class_vectors(scores["protected_scores"])
    else:
        base = scores["base_score"].cast(pl.Float64).to_numpy()
        prot = scores["protected_score"].cast(pl.Float64).to_numpy()
    y_all = scores["label"].cast(pl.Float64).to_numpy()  # null -> NaN
    labelled = ~np.isnan(y_all)
    # the labelled rows, once: every loss and the ECE are means over them (the grouped forms
    # take labelled rows as they are, without a copy); all of them (the arrival monitoring's
    # rows) without a copy either: four copies of 10M rows were 320 MB of a night's peak
    if labelled.all():
        ids_l, y, base_l, prot_l = ids, y_all, base, prot
    else:
        ids_l, y = ids[labelled], y_all[labelled]
        base_l, prot_l = base[labelled], prot[labelled]
    del y_all
    if multiclass:  # ECE of the top label (smooth ECE reduces to it itself)
        base_ece = metrics.grouped_ece(*metrics.top_label(base_l, y), ids_l, n_groups)
        prot_ece = metrics.grouped_ece(*metrics.top_label(prot_l, y), ids_l, n_groups)
        no_mean = np.full(n_groups, np.nan)
        means = {"mean_score": no_mean, "mean_protected": no_mean, "mean_label": no_mean}
    else:
        base_ece = metrics.grouped_ece(base_l, y, ids_l, n_groups)
        prot_ece = metrics.grouped_ece(prot_l, y, ids_l, n_groups)
        means = {
            "mean_score": metrics.grouped_mean(base, ids, n_groups),
            "mean_protected": metrics.grouped_mean(prot, ids, n_groups),
            "mean_label": metrics.grouped_mean(y, ids_l, n_groups),
        }
    peak = metrics.grouped_max(
        scores["log10_martingale"].cast(pl.Float64).to_numpy(), ids, n_groups
    )
    n_lab = np.bincount(ids_l, minlength=n_groups)
    losses = {
        "base_log_loss": metrics.grouped_log_loss(base_l, y, ids_l, n_groups),
        "protected_log_loss": metrics.grouped_log_loss(prot_l, y, ids_l, n_groups),
        "base_brier": metrics.grouped_brier(base_l, y, ids_l, n_groups),
        "protected_brier": metrics.grouped_brier(prot_l, y, ids_l, n_groups),
    }
    forecasts = {"base": base_l, "protected": prot_l}
    corp = _corp_columns(forecasts, y, ids_l, n_groups, losses) if corp else {}
    values = {
        "n_events": np.bincount(ids, minlength=n_groups).astype(np.int64),
        "n_labelled": n_lab.astype(np.int64),
        **losses,
        "base_ece": base_ece,
        "protected_ece": prot_ece,
        "base_smooth_ece": metrics.grouped_smooth_ece(base_l, y, ids_l, n_groups),
        "protected_smooth_ece": metrics.grouped_smooth_ece(prot_l, y, ids_l, n_groups),
        **corp,
        **means,
        "log10_martingale_max": peak,
    }
    # no labelled event: 0 / 0 -> null, as the polars means of an empty selection
    over_labelled = [
        c
        for c in values
        if c.endswith(("_log_loss", "_brier", "_ece", "_mcb", "_dsc", "_unc")) or c == "mean_label"
    ]
    out = pl.DataFrame(values).with_columns(
        pl.when(pl.col("n_labelled") > 0).then(pl.col(c)).alias(c) for c in over_labelled
    )
    if multiclass:  # the binary-only columns: null, not NaN
        out = out.with_columns(pl.col(c).fill_nan(None) for c in (*corp, *means))
    keyed = scores.select(keys)[first.tolist()]
    return pl.concat([keyed, out], how="horizontal").sort(keys)


def day_stats(
    scores: pl.DataFrame, day: dt.date | None, groups: tuple[np.ndarray, np.ndarray] | None = None
) -> pl.DataFrame:
    """:func:`daily_metrics` of a day's protected rows (``scores``) per stream, keyed by
    (``date``, ``stream``): what :func:`daily_rows` and, on a night whose labels all came in its
    rows, :func:`own_label_stats` report. ``groups``: ``stream_groups(scores, ["stream"])``.

    ``day=None``: several days at once, per (``event_date``, stream) of ``scores`` (a span of
    the nightly run, :func:`calpipe.engine.driver.protect_by_day`)."""
    if day is None:
        return daily_metrics(scores, keys=("event_date", "stream"), groups=groups).rename(
            {"event_date": "date"}
        )
    return daily_metrics(scores, keys=("stream",), groups=groups).select(
        pl.lit(day, pl.Date).alias("date"), pl.all()
    )


def daily_rows(
    scores: pl.DataFrame,
    state: pl.DataFrame,
    day: dt.date | None,
    groups: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    stats: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """``calibration_daily`` rows of ``day``: :func:`daily_metrics` of the day's protected rows
    (``scores``) per stream, with the end-of-day martingale and its maximum to date from the
    day's ``state`` rows, and the alarm flag. ``groups``: ``stream_groups(scores, ["stream"])``;
    ``stats``: :func:`day_stats` of the same arguments, when the caller has them already.

    ``day=None``: the rows of several days at once, per (``event_date``, stream) of ``scores``,
    with each day's ``state`` rows (their ``date``): the same rows as day by day (a span of the
    fused run, :func:`calpipe.engine.driver.protect_by_day`)."""
    thr = config.ALARM_LOG10_THRESHOLD
    end_of_day = state.select(
        *(["date"] if day is None else []),
        "stream",
        "log10_martingale",
        pl.col("log10_martingale_max").alias("log10_martingale_max_to_date"),
    )
    metrics_ = day_stats(scores, day, groups) if stats is None else stats
    on = ["date", "stream"] if day is None else ["stream"]
    return metrics_.join(end_of_day, on=on, how="left").with_columns(
        (pl.col("log10_martingale_max") >= thr).alias("alarm")
    )


def arrived_in_rows(protected: pl.DataFrame) -> pl.DataFrame:
    """The arrived forecasts (module docstring) of nights without a label feed, from their
    ``protected_scores`` rows in memory: each labelled event, learnt on its own night with
    delay 0 (a span of the nightly run: no query of the rows just written)."""
    s = "s" if "base_scores" in protected.columns else ""
    columns = ["stream", "event_id", f"base_score{s}", f"protected_score{s}", "label"]
    rows = protected.filter(pl.col("label").is_not_null())
    return rows.select(
        pl.col("event_date").alias("date"), *columns, pl.lit(0.0).alias("delay_s")
    ).sort("date", "stream", "event_id")


def labelled_rows(protected: pl.DataFrame) -> pl.DataFrame:
    """The labelled rows of a batch's ``protected_scores`` rows, in the columns
    :func:`_arrived_in_night` reads (the nightly run keeps them for the night's arrivals)."""
    s = "s" if "base_scores" in protected.columns else ""
    return protected.filter(pl.col("label").is_not_null()).select(
        "stream", "event_id", f"base_score{s}", f"protected_score{s}", "label"
    )


def _arrived_in_night(labelled: pl.DataFrame, arrivals: Arrivals) -> pl.DataFrame:
    """The arrived forecasts (module docstring) of one night, from memory: the night's
    labelled ``protected_scores`` rows (``labelled``, :func:`labelled_rows`: the labels of the
    scores rows, delay 0, and those the feed brought for the night's own events) and the feed's
    labels of earlier events with the forecasts looked up by their checks
    (:attr:`~calpipe.night.arrivals.Arrivals.forecasts`), with the delay in seconds as the
    difference of two doubles (as DuckDB's ``epoch_us(t) / 1e6`` gives it, which the stored
    rows of earlier versions were computed with: the golden tables hold them)."""
    day = arrivals.day
    s = "s" if "base_scores" in labelled.columns else ""
    fc = [f"base_score{s}", f"protected_score{s}"]
    rows = arrivals.rows
    # the delay as DuckDB's epoch_us(t) / 1e6 gives it, bit for bit: numpy divides as DuckDB
    # does (polars multiplies by 1e-6)
    t = [
        rows[c].cast(pl.Datetime("us")).to_physical().to_numpy()
        for c in ("label_time", "event_time")
    ]
    rows = rows.with_columns(pl.Series("delay_s", t[0] / 1e6 - t[1] / 1e6, pl.Float64))
    delay = pl.col("delay_s")
    same = rows.filter(pl.col("event_date") == day).select("stream", "event_id", delay)
    own = labelled.with_columns(pl.lit(None, pl.Float64).alias("delay_s"))
    if same.height:  # (an empty night's labels may not have the stored event id type)
        own = labelled.join(same, on=["stream", "event_id"], how="left", maintain_order="left")
    parts = [own.with_columns(pl.col("delay_s").fill_null(0.0))]
    if arrivals.forecasts is not None and rows.height:
        forecasts = [pl.col("__base").alias(fc[0]), pl.col("__prot").alias(fc[1])]
        earlier = pl.concat([rows, arrivals.forecasts], how="horizontal").select(
            "stream", "event_id", *forecasts, "label", delay, "event_date"
        )  # (the columns read, before a filter copies them)
        if not earlier["event_date"].lt(day).all():
            earlier = earlier.filter(pl.col("event_date") < day)
        parts.append(earlier.drop("event_date"))
    elif rows.filter(pl.col("event_date") < day).height:
        raise ValueError("arrivals of earlier events without their forecasts (Arrivals.forecasts)")
    columns = ["stream", "event_id", *fc, "label", "delay_s"]
    parts = [p.select(columns).cast({"label": pl.Int32, "delay_s": pl.Float64}) for p in parts]
    # (an empty part, of a day without events, may not have the stored event id type)
    arrived = sort_by_keys(
        pl.concat([p for p in parts if p.height] or parts[:1]), ["stream", "event_id"]
    )
    return arrived.select(pl.lit(day, pl.Date).alias("date"), *columns)


def arrival_stats(arrived: pl.DataFrame) -> pl.DataFrame:
    """Per night and stream of the arrived forecasts ``arrived`` (module docstring): how many
    labels, base vs protected log loss, Brier, ECE and smooth ECE (:func:`daily_metrics`), and
    the mean and largest label delay (the columns of ``calibration_arrivals`` that the labels
    decide; :func:`arrival_rows` adds the martingale)."""
    if arrived.height == 0:
        return pl.DataFrame(schema={"date": pl.Date, "stream": pl.String})
    keys = ("date", "stream")
    # one night (the nightly run's): its streams are its groups (polars' categorical codes, not a
    # hash of every row's two keys); the same groups in the same order
    one_night = arrived["date"].n_unique() == 1
    ids, first = stream_groups(arrived, ["stream"] if one_night else list(keys))
    stats = daily_metrics(
        arrived.with_columns(pl.lit(0.0).alias("log10_martingale")), keys, corp=False,
        groups=(ids, first),
    )  # fmt: skip
    # the delays by the same groups (a polars group_by of 10M rows by (date, stream) took 420 MB)
    delay, n = arrived["delay_s"].cast(pl.Float64).to_numpy(), first.shape[0]
    delays = arrived.select(keys)[first.tolist()].with_columns(
        pl.Series("mean_delay_s", metrics.grouped_mean(delay, ids, n)),
        pl.Series("max_delay_s", metrics.grouped_max(delay, ids, n)),
    )
    return stats.select(*keys, pl.col("n_labelled").alias("n_labels"), *_ARRIVAL_METRICS).join(
        delays, on=list(keys), how="left"
    )


def labels_in_id_order(protected: pl.DataFrame, groups: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether, within each stream (``groups``: :func:`stream_groups` of ``protected`` by
    ``stream``), the labelled rows of ``protected`` come in increasing event id order: the order
    :func:`arrival_stats` sorts the arrived forecasts into. Then, on nights whose labels all
    came in their rows, the arrived forecasts are the labelled rows in the order
    :func:`daily_metrics` reads them, and :func:`own_label_stats` holds their statistics to the
    bit (every grouped metric sums each group's rows in row order). Integer event ids only
    (others answer False: the caller sorts)."""
    if protected["event_id"].dtype != pl.Int64:
        return False
    ids, first = groups
    labelled = protected["label"].is_not_null().to_numpy()
    event_id = protected["event_id"].to_numpy()
    if not labelled.all():
        event_id, ids = event_id[labelled], ids[labelled]
    return increasing_in_groups(event_id, ids, first.shape[0])


def own_label_stats(stats: pl.DataFrame) -> pl.DataFrame:
    """:func:`arrival_stats` of a night (or nights) whose labels all came in the rows, from
    the :func:`day_stats` of the same rows (computed once for ``calibration_daily``), when
    :func:`labels_in_id_order` holds: the streams with labels, their label count and metrics,
    and delays of 0 (each label learnt with its event)."""
    zero = pl.lit(0.0, pl.Float64)
    return stats.filter(pl.col("n_labelled") > 0).select(
        "date", "stream", pl.col("n_labelled").alias("n_labels"), *_ARRIVAL_METRICS,
        zero.alias("mean_delay_s"), zero.alias("max_delay_s"),
    )  # fmt: skip


def rows_arrival_stats(
    protected: pl.DataFrame, stats: pl.DataFrame, groups: tuple[np.ndarray, np.ndarray]
) -> pl.DataFrame:
    """:func:`arrival_stats` of nights whose labels all came in their rows (no label feed, or
    none that night): of :func:`arrived_in_rows` of their ``protected_scores`` rows, taken from
    their :func:`day_stats` ``stats`` when :func:`labels_in_id_order` holds (``groups``: the
    rows' :func:`stream_groups` by ``stream``), which spares computing the metrics twice."""
    if labels_in_id_order(protected, groups):
        return own_label_stats(stats)
    return arrival_stats(arrived_in_rows(protected))


def arrival_rows(stats: pl.DataFrame, state: pl.DataFrame) -> pl.DataFrame:
    """``calibration_arrivals`` rows of :func:`arrival_stats` ``stats``: with the stream's
    martingale at the end of the night (``state``: the nights' ``calibrator_state`` rows; every
    stream that learnt a label on a night has one) and the alarm flag."""
    if stats.height == 0:
        return pl.DataFrame(schema={"date": pl.Date, "stream": pl.String})
    keys = ["date", "stream"]
    end_of_night = state.select(*keys, "log10_martingale", "log10_martingale_max")
    return (
        stats.join(end_of_night, on=keys, how="left")
        .with_columns(
            (pl.col("log10_martingale_max") >= config.ALARM_LOG10_THRESHOLD).alias("alarm")
        )
        .sort(keys)
    )


def arrival_metrics(arrived: pl.DataFrame, state: pl.DataFrame) -> pl.DataFrame:
    """``calibration_arrivals`` rows of the arrived forecasts ``arrived`` (module docstring):
    :func:`arrival_rows` of :func:`arrival_stats`."""
    return arrival_rows(arrival_stats(arrived), state)


def night_arrival_stats(labelled: pl.DataFrame, arrivals: Arrivals) -> pl.DataFrame:
    """The :func:`arrival_stats` of one night of the nightly run, or of one part of its
    streams (the rows are per stream): of the forecasts the night's labels judge
    (:func:`_arrived_in_night`)."""
    return arrival_stats(_arrived_in_night(labelled, arrivals))
