"""Reports: the materialization metadata's tables and plot frames, and the demo's summary.

Read-only queries over the stored tables: per-stream quality of a range (:func:`day_report`,
metrics from :func:`calpipe.night.monitoring.daily_metrics`), the frames the plots of
:mod:`calpipe.plots` draw, the whole-history :func:`stream_summary`, and :func:`markdown_table`.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from calpipe import config, storage
from calpipe.night.monitoring import daily_metrics
from calpipe.pipeline.classes import stored_n_classes


def markdown_table(df: pl.DataFrame, *, float_digits: int = 4) -> str:
    """A frame as a GitHub-markdown table (floats rounded), for dagster metadata and the README."""
    if df.width == 0:
        return "(empty)"

    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.{float_digits}f}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * df.width]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join(lines)


def _forecasts(con) -> list[str]:
    """The base and protected forecast columns of ``protected_scores`` in this database: binary
    ``base_score``/``protected_score``, or the K-class vectors (:mod:`calpipe.pipeline.classes`)."""
    s = "" if (stored_n_classes(con) or 2) == 2 else "s"
    return [f"base_score{s}", f"protected_score{s}"]


def day_report(con, start: dt.date, end: dt.date) -> pl.DataFrame:
    """Per stream over [start, end]: events, base vs protected log loss / Brier / ECE, end and
    max log10 martingale, alarm (the markdown table of a materialization)."""
    scores = storage.read_partitions(
        con, "protected_scores", start, end,
        columns=["stream", *_forecasts(con), "label", "log10_martingale"],
    )  # fmt: skip
    stats = daily_metrics(scores, keys=("stream",))
    last = storage.query(  # the state at the end of `end`: each stream's latest row on or before it
        con,
        """SELECT stream, log10_martingale AS log10_S_end FROM calibrator_state WHERE date <= ?
           QUALIFY row_number() OVER (PARTITION BY stream ORDER BY date DESC) = 1""",
        [end],
    )
    return stats.join(last, on="stream", how="left").select(
        "stream",
        "n_events",
        "base_log_loss",
        "protected_log_loss",
        "base_brier",
        "protected_brier",
        "base_ece",
        "protected_ece",
        "log10_S_end",
        pl.col("log10_martingale_max").alias("log10_S_max"),
        (pl.col("log10_martingale_max") >= config.ALARM_LOG10_THRESHOLD).alias("alarm"),
    )


def trajectory_frame(con, end: dt.date) -> pl.DataFrame:
    """End-of-day log10 martingale per stream up to ``end`` (the trajectory plot): a point per
    day on which the stream's state changed (it holds between them)."""
    return storage.query(
        con,
        "SELECT date, stream, log10_martingale FROM calibrator_state WHERE date <= ? ORDER BY stream, date",
        [end],
    )


def reliability_frame(
    con, end: dt.date, days: int = config.RELIABILITY_WINDOW_DAYS
) -> pl.DataFrame:
    """Protected rows of the ``days`` days ending on ``end`` (the reliability diagram of binary
    forecasts: none for K classes, whose base and protected top labels differ)."""
    if (stored_n_classes(con) or 2) != 2:
        return pl.DataFrame(
            schema={"stream": pl.String, "base_score": pl.Float64, "protected_score": pl.Float64,
                    "label": pl.Int32}
        )  # fmt: skip
    return storage.read_partitions(
        con, "protected_scores", end - dt.timedelta(days=days - 1), end,
        columns=["stream", "base_score", "protected_score", "label"],
    )  # fmt: skip


def stream_summary(con) -> pl.DataFrame:
    """Whole-history summary per stream (what ``calpipe demo`` prints): events, base vs protected
    log loss / Brier / ECE, final and maximum log10 martingale, first alarm date."""
    scores = storage.query(
        con,
        f"SELECT stream, {', '.join(_forecasts(con))}, label, log10_martingale "
        "FROM protected_scores",
    )
    stats = daily_metrics(scores, keys=("stream",))
    latest = storage.query(
        con,
        """SELECT stream, log10_martingale AS final_log10_S, log10_martingale_max AS max_log10_S
           FROM calibrator_state QUALIFY row_number() OVER (PARTITION BY stream ORDER BY date DESC) = 1""",
    )
    alarms = storage.query(
        con, "SELECT stream, min(date) AS first_alarm FROM martingale_alarms GROUP BY stream"
    )
    return (
        stats.join(latest, on="stream", how="left")
        .join(alarms, on="stream", how="left")
        .select(
            "stream",
            pl.col("n_events").alias("events"),
            pl.col("base_log_loss").alias("base_LL"),
            pl.col("protected_log_loss").alias("prot_LL"),
            pl.col("base_brier").alias("base_Brier"),
            pl.col("protected_brier").alias("prot_Brier"),
            pl.col("base_ece").alias("base_ECE"),
            pl.col("protected_ece").alias("prot_ECE"),
            "final_log10_S",
            "max_log10_S",
            "first_alarm",
        )
        .sort("stream")
    )


#: The dagster assets, each with its table (``calpipe.dagster_project`` materializes them), in
#: lineage order, upstream first (the order their days are reported to dagster in: a downstream
#: asset reported before its upstream one shows as "Unsynced").
ASSET_TABLES = ("scored_events", "event_labels", "protected_scores", "calibrator_state",
                "calibration_daily", "calibration_arrivals", "performance_estimates",
                "martingale_alarms", "change_points", "calibration_map")  # fmt: skip


def stored_days(con, start=None, end=None) -> pl.DataFrame:
    """Every day the database has computed (``pipeline_days``; those in [start, end] if given),
    with its state hash (which changes when the day is recomputed to another state) and the rows
    each asset's table holds for it: what ``calpipe ui`` reports to dagster for days computed
    outside it, and the code location for each day of a range run."""
    counts = "\n".join(
        f"LEFT JOIN (SELECT {storage.PARTITION_COLUMN[t]} AS date, count(*) AS {t} FROM {t} "
        f"GROUP BY ALL) USING (date)"
        for t in ASSET_TABLES
    )
    cols = ", ".join(f"coalesce({t}, 0) AS {t}" for t in ASSET_TABLES)
    where = "" if start is None else "WHERE date BETWEEN $1 AND $2"
    return storage.query(
        con,
        f"SELECT date, coalesce(state_hash, '') AS state_hash, method, {cols} "
        f"FROM pipeline_days {counts} {where} ORDER BY date",
        [] if start is None else [start, end],
    )
