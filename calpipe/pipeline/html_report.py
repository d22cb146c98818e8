"""``calpipe report``: one self-contained HTML page over a calpipe database.

What a person would rather look at than query: the run (database, days, method), the summary
per stream (:func:`calpipe.pipeline.reports.stream_summary`), every alarm, every change point
(``v_change_points``, and per stream its detector's statistic over the history), the performance
estimated before labels beside its realized values (``v_performance_estimates``: coverage per
stream, and a plot of the last days per stream), and per stream its test martingale
trajectory, a reliability diagram of the last :data:`~calpipe.config.RELIABILITY_WINDOW_DAYS` days (binary forecasts), and its daily metrics of
the last :data:`~calpipe.REPORT_DAILY_DAYS` days (``calibration_daily``). Plots are inline
SVG, styles inline: the page loads nothing from anywhere, so it can be mailed or archived.

Streams are shown alarmed first (by first alarm), then by maximum log10 S, at most
:data:`~calpipe.REPORT_MAX_STREAMS` of them (the page says how many it left out).
"""

from __future__ import annotations

import datetime as dt
import html
import io
import json
from pathlib import Path

import polars as pl
from matplotlib.figure import Figure

from calpipe import __version__, config, plots, storage
from calpipe.errors import StoreError
from calpipe.pipeline.chain import chain_first_day
from calpipe.pipeline.classes import stored_n_classes
from calpipe.pipeline.reports import reliability_frame, stream_summary

#: ``calpipe report``: streams with a section of their own (alarmed first; the summary lists all):
#: each section holds two SVG plots, so 10k streams would make a page no browser opens.
REPORT_MAX_STREAMS: int = 50

#: ``calpipe report``: days of daily metrics per stream (the reliability window's month).
REPORT_DAILY_DAYS: int = 30

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1280px;
color:#1d2330;padding:0 1em}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #d0d5dd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1em}
th,td{border:1px solid #d0d5dd;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f2f4f7}td.s,th.s{text-align:left}
tr.alarm td{background:#fdecea}.meta{color:#555}.plots{display:flex;flex-wrap:wrap;gap:1em}
.plots svg{max-width:100%;height:auto}.note{color:#8a5300}.tw{overflow-x:auto}
"""

#: The daily metrics columns the per-stream tables show (calibration_daily), in order.
_DAILY = ["date", "n_events AS events", "n_labelled AS labelled", "base_log_loss AS base_LL",
          "protected_log_loss AS prot_LL", "base_brier AS base_Brier", "protected_brier AS prot_Brier",
          "base_ece AS base_ECE", "protected_ece AS prot_ECE", "log10_martingale AS log10_S",
          "alarm"]  # fmt: skip


def _svg(fig: Figure) -> str:
    """A figure as inline SVG (no XML prologue: it sits inside the page's HTML)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _table(df: pl.DataFrame, *, alarm_col: str | None = None, digits: int = 4) -> str:
    """A frame as an HTML table (text left, numbers right; rows with ``alarm_col`` set shaded)."""
    if df.height == 0:
        return "<p class='meta'>(none)</p>"
    text_cols = {
        c for c, t in df.schema.items() if t in (pl.String, pl.Date, pl.Datetime, pl.Boolean)
    }

    def cell(c, v):
        if v is None:
            s = ""
        elif isinstance(v, float):
            s = f"{v:.{digits}f}"
        else:
            s = str(v)
        return f"<td{' class=s' if c in text_cols else ''}>{html.escape(s)}</td>"

    head = "".join(
        f"<th{' class=s' if c in text_cols else ''}>{html.escape(c)}</th>" for c in df.columns
    )
    rows = []
    for row in df.iter_rows(named=True):
        cls = " class=alarm" if alarm_col and row.get(alarm_col) else ""
        rows.append(f"<tr{cls}>" + "".join(cell(c, v) for c, v in row.items()) + "</tr>")
    # a wide table (the change points' nine columns) scrolls in its own box instead of running
    # off the page's 1100 px column, where the browser cut its last columns
    return f"<div class=tw><table><tr>{head}</tr>{''.join(rows)}</table></div>"


def _performance(con, since: dt.date) -> dict[str, pl.DataFrame] | None:
    """The report's performance estimates: a summary per stream (nights judged, coverage of the
    protected and base intervals, the latest night's estimate) and the rows of the nights after
    ``since``; None for a database without them (before schema version 12, opened read-only)."""
    if not storage.fetch_one(con, "SELECT count(*) FROM duckdb_views() WHERE view_name = "
                                  "'v_performance_estimates'")[0]:  # fmt: skip
        return None
    # the view joins every protected score with the label feed: read it once, for both the
    # whole history's coverage and the recent nights' rows
    rows = storage.query(con, "SELECT * FROM v_performance_estimates ORDER BY stream, date")
    judged = (
        rows.filter(pl.col("labelled") >= config.ESTIMATE_MIN_EVENTS)
        .group_by("stream")
        .agg(
            pl.len().alias("nights_judged"),
            pl.col("log_loss_within").cast(pl.Int32).mean().alias("coverage"),
            pl.col("base_log_loss_within").cast(pl.Int32).mean().alias("base_coverage"),
        )
    )
    latest = storage.query(
        con,
        "SELECT stream, date AS latest, events, expected_log_loss AS expected_LL, "
        "expected_log_loss_low AS low, expected_log_loss_high AS high, base_expected_log_loss "
        "AS base_expected_LL FROM performance_estimates QUALIFY row_number() OVER (PARTITION BY "
        "stream ORDER BY date DESC) = 1",
    )
    summary = (
        latest.join(judged, on="stream", how="left")
        .with_columns(pl.col("nights_judged").fill_null(0).cast(pl.Int64))
        .select(
            "stream",
            "nights_judged",
            "coverage",
            "base_coverage",
            "latest",
            "events",
            "expected_LL",
            "low",
            "high",
            "base_expected_LL",
        )
        .sort("stream")
    )
    recent = rows.filter(pl.col("date") > since)
    return {"summary": summary, "recent": recent}


def _changes(con) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The report's change points (``v_change_points``, in order) and each stream's detector
    statistic at the end of the nights it moved (None, None: a database without them)."""
    if not storage.fetch_one(con, "SELECT count(*) FROM duckdb_views() WHERE view_name = "
                                  "'v_change_points'")[0]:  # fmt: skip
        return None, None
    changes = storage.query(
        con,
        "SELECT stream, change_number, estimated_change_date, detected_date, days_to_detect, "
        "tested_against, round(log10_statistic, 3) AS log10_statistic, labels_in_run "
        "FROM v_change_points ORDER BY stream, change_number",
    )
    detector = storage.query(
        con,
        "SELECT stream, date, change_log10_cusum FROM calibrator_state "
        "WHERE change_log10_cusum IS NOT NULL ORDER BY stream, date",
    )
    return changes, detector


def html_report(
    con,
    *,
    title: str,
    max_streams: int = REPORT_MAX_STREAMS,
    daily_days: int = REPORT_DAILY_DAYS,
) -> str:
    """The report page of the database behind ``con`` (read only), as one HTML string."""
    last = storage.query(con, "SELECT max(date) AS d FROM pipeline_days").item()
    if last is None:
        raise StoreError(f"{title}: no day has been run yet; run `calpipe run` first")
    first = chain_first_day(con)
    settings = storage.get_meta(con, "settings")
    method = json.loads(settings).get("method") if settings else None
    summary = stream_summary(con).with_columns(
        (pl.col("max_log10_S") >= config.ALARM_LOG10_THRESHOLD).alias("alarm")
    )
    order = summary.sort(
        [pl.col("first_alarm").is_null(), "first_alarm", pl.col("max_log10_S")],
        descending=[False, False, True],
    )["stream"].to_list()
    shown, left_out = order[:max_streams], len(order) - min(len(order), max_streams)
    alarms = storage.query(
        con,
        "SELECT stream, date, event_time, event_id, round(log10_martingale, 4) AS log10_S "
        "FROM martingale_alarms ORDER BY date, stream",
    )
    daily = storage.query(
        con,
        f"SELECT stream, {', '.join(_DAILY)} FROM calibration_daily WHERE date > ? ORDER BY stream, date",
        [last - dt.timedelta(days=daily_days)],
    )
    trajectory = storage.query(
        con, "SELECT date, stream, log10_martingale FROM calibrator_state ORDER BY stream, date"
    )
    performance = _performance(con, last - dt.timedelta(days=daily_days))
    changes, detector = _changes(con)
    binary = (stored_n_classes(con) or 2) == 2
    recent = reliability_frame(con, last) if binary else None
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>calpipe report: {html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>calpipe report</h1><p class=meta>{html.escape(title)} · days {first} .. {last} · "
        f"method {html.escape(str(method or 'unknown'))} · {len(order)} stream(s) · generated {now} "
        f"by calpipe {__version__}</p>",
        "<h2 id=summary>Summary per stream</h2><p class=meta>Whole history: base = the model's "
        "scores as the engine uses them, prot = protected; LL = mean ln loss; ECE 10 bins; log10 S "
        "= the test martingale, alarm when it reaches 2 (S = 100).</p>",
        _table(summary, alarm_col="alarm"),
        "<h2 id=alarms>Alarms</h2>",
        _table(alarms),
        "<h2 id=change-points>Change points</h2><p class=meta>A CUSUM e-detector per stream "
        "over its labels in the order they are learnt (change_points): the protected forecast "
        "against the base until the first change point, then against the map served after the "
        f"last one; it starts again after each. Threshold log10 A = "
        f"{config.CHANGE_LOG10_THRESHOLD:g}: under its null the mean number of labels to a false "
        "change point is at least A. Estimated = the first label of the run that crossed.</p>",
        _table(changes) if changes is not None else
        "<p class=meta>(this database has no change points table: made before schema version "
        "13)</p>",
        "<h2 id=performance>Performance before labels</h2><p class=meta>Each night's log loss "
        "expected from its forecasts if they are calibrated (performance_estimates), with its "
        f"{config.ESTIMATE_LEVEL:.0%} interval, against the log loss realized on the labels known "
        f"now, over the nights with at least {config.ESTIMATE_MIN_EVENTS} labelled events: "
        "coverage = the share of those nights whose realized value fell inside the interval "
        f"(about {config.ESTIMATE_LEVEL:.0%} for calibrated forecasts; a base far below it "
        "misleads any monitor that trusts its scores). Latest = the last night's estimate.</p>",
        _table(performance["summary"]) if performance else
        "<p class=meta>(this database has no performance estimates: made before schema version "
        "12; re-run its nights to fill them)</p>",
    ]  # fmt: skip
    if left_out:
        parts.append(
            f"<p class=note>{left_out} more stream(s) are in the summary but have no section "
            f"(at most {max_streams}; `calpipe report --max-streams N`).</p>"
        )
    for s in shown:
        row = summary.filter(pl.col("stream") == s).row(0, named=True)
        status = f"alarm since {row['first_alarm']}" if row["first_alarm"] else "no alarm"
        parts.append(
            f"<section class=stream><h2 id='s-{html.escape(s)}'>{html.escape(s)}</h2>"
            f"<p class=meta>{row['events']:,} events · final log10 S {row['final_log10_S']:.2f} · "
            f"{status}</p><div class=plots>"
        )
        fig = plots.martingale_trajectory(
            trajectory.filter(pl.col("stream") == s), title=f"{s}: test martingale"
        )
        fig.set_size_inches(5.4, 3.2)
        parts.append(_svg(fig))
        if recent is not None:
            fig = Figure(figsize=(3.9, 3.6))
            ax = fig.subplots()
            part = recent.filter(pl.col("stream") == s)
            plots.reliability_diagram(part, ax=ax)
            n = part["label"].count()
            ax.set_title(
                f"Reliability, {config.RELIABILITY_WINDOW_DAYS} days to {last} ({n} labelled)",
                fontsize=9,
            )
            parts.append(_svg(fig))
        if performance and (mine := performance["recent"].filter(pl.col("stream") == s)).height:
            fig = Figure(figsize=(5.4, 3.2))
            plots.performance_estimates(
                mine,
                ax=fig.subplots(),
                title=f"Log loss expected vs realized, last {daily_days} days",
            )
            parts.append(_svg(fig))
        if detector is not None and (mine := detector.filter(pl.col("stream") == s)).height:
            fig = Figure(figsize=(5.4, 3.2))
            plots.change_points(
                mine.drop("stream"),
                changes.filter(pl.col("stream") == s).drop("stream"),
                ax=fig.subplots(), title="Change detector (CUSUM), whole history",
            )  # fmt: skip
            parts.append(_svg(fig))
        parts.append(f"</div><h3>Daily metrics, last {daily_days} days</h3>")
        parts.append(_table(daily.filter(pl.col("stream") == s).drop("stream"), alarm_col="alarm"))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    db: str | Path, out: str | Path | None = None, *, lock_wait: float | None = None, **kw
) -> Path:
    """``calpipe report``: the page of database ``db`` written to ``out`` (default: beside the
    database, ``<name>.report.html``), atomically (a temporary file, then a rename)."""
    db = Path(db).expanduser().resolve()
    if not db.exists():
        raise StoreError(f"database {db} does not exist")
    out = Path(out) if out else db.with_name(f"{db.stem}.report.html")
    con = storage.connect(db, read_only=True, lock_wait=lock_wait)
    try:
        storage.require_calpipe(con)
        page = html_report(con, title=str(db), **kw)
    finally:
        con.close()
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(out)  # the page is complete or not there
    except BaseException:  # Ctrl-C or a full disk while writing: no partial file left
        tmp.unlink(missing_ok=True)
        raise
    return out
