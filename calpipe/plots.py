"""Matplotlib figures of the pipeline: martingale trajectories, reliability diagrams and
performance estimated before labels beside its realized values.

Figures are :class:`matplotlib.figure.Figure` objects made without pyplot, so importing this
module neither switches matplotlib's backend nor registers figures with pyplot (a notebook's
inline backend stays as it was); each function draws into a given ``ax=`` instead when asked.
:func:`to_png` turns a figure into PNG bytes (what the dagster metadata embeds) and
:func:`save_png` writes it to a file. Both take :func:`calpipe.protect`'s output as it comes
(``event_time`` and ``score`` are used when there is no ``date`` / ``base_score`` column).

Example
-------
>>> import datetime as dt, polars as pl
>>> traj = pl.DataFrame({"date": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)] * 2,
...                      "stream": ["a", "a", "b", "b"], "log10_martingale": [0.1, 2.5, 0.0, -0.2]})
>>> png = to_png(martingale_trajectory(traj))
>>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
True
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
from matplotlib.figure import Figure

from calpipe import config, metrics

# the plot limits live in calpipe.config with their reasons; this one stays importable here
from calpipe.config import MAX_RELIABILITY_PANELS
from calpipe.errors import ParameterError

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=config.PLOT_DPI, bbox_inches="tight")
    return buf.getvalue()


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write the figure as a PNG file (folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(to_png(fig))
    return path


def _first_present(frame: pl.DataFrame, name: str, fallback: str) -> str:
    """``name`` if ``frame`` has it, else ``fallback`` (protect's own column) if it has that."""
    return fallback if name not in frame.columns and fallback in frame.columns else name


def _legend(ax: Axes) -> None:
    """Beside the axes (it covers no curve), in columns of at most
    :data:`calpipe.config.LEGEND_ROWS` rows (never taller than the plot), and at most
    :data:`calpipe.config.MAX_LEGEND_ENTRIES` entries: the last (the alarm level) is kept, the
    streams beyond the cap are counted in one entry."""
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    cap = config.MAX_LEGEND_ENTRIES
    if len(handles) > cap:
        kept = cap - 2
        more = Line2D([], [], linestyle="none")
        handles = [*handles[:kept], more, handles[-1]]
        labels = [*labels[:kept], f"... and {len(labels) - 1 - kept} more", labels[-1]]
    ncol = max(1, math.ceil(len(handles) / config.LEGEND_ROWS))
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              ncol=ncol, frameon=False)  # fmt: skip


def martingale_trajectory(
    trajectory: pl.DataFrame,
    *,
    date: str = "date",
    stream: str = "stream",
    value: str = "log10_martingale",
    title: str = "Test martingale per stream (end of day)",
    ax: Axes | None = None,
) -> Figure:
    """log10 S over time, with the alarm level log10 S = 2 (S = 100) drawn: one panel per
    stream, each with its own linear y range and a shared time axis.

    ``trajectory`` has one row per (stream, date), or is :func:`calpipe.protect`'s output (one
    row per event: ``event_time`` is the x axis when there is no ``date`` column). The values
    are already log10 S, so each axis is linear (a log axis over them is a log of a log).
    Panels, not one axis: on one axis a stream at log10 S = 4,000 (the demo's bank stream)
    flattened every other stream onto zero. At most
    :data:`calpipe.config.MAX_TRAJECTORY_PANELS` panels, for the streams with the highest
    log10 S (the alarmed ones first; the title counts the others). ``ax``: draw every stream
    into these axes (their figure is returned, a legend beside them) instead.
    """
    date = _first_present(trajectory, date, "event_time")
    alarm = config.ALARM_LOG10_THRESHOLD
    if ax is not None:
        streams = trajectory[stream].unique().sort().to_list()
        for s in streams:
            part = trajectory.filter(pl.col(stream) == s).sort(date)
            ax.plot(part[date].to_list(), part[value].to_list(), label=str(s), linewidth=1.4)
        ax.axhline(alarm, color="red", linestyle="--", linewidth=1, label="alarm: S = 100")
        ax.set_xlabel(date)
        ax.set_ylabel("log10 test martingale")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if streams:
            _legend(ax)
        ax.figure.autofmt_xdate()
        return ax.figure
    peaks = trajectory.group_by(stream).agg(pl.col(value).max().alias("peak"))
    peaks = peaks.sort(["peak", stream], descending=[True, False], nulls_last=True)
    shown = peaks[stream].head(config.MAX_TRAJECTORY_PANELS).sort().to_list()
    n = max(1, len(shown))
    cols = min(config.TRAJECTORY_PANELS_PER_ROW, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(3.6 * cols + 0.4, 2.4 * rows + 0.8))
    axes = list(fig.subplots(rows, cols, squeeze=False, sharex=True).ravel())
    more = peaks.height - len(shown)
    fig.suptitle(title + (f" ({len(shown)} of {peaks.height} streams, highest log10 S shown)"
                          if more > 0 else ""))  # fmt: skip
    for i, panel in enumerate(axes):
        if i >= len(shown):
            panel.axis("off")
            continue
        part = trajectory.filter(pl.col(stream) == shown[i]).sort(date)
        panel.plot(part[date].to_list(), part[value].to_list(), linewidth=1.4)
        panel.axhline(alarm, color="red", linestyle="--", linewidth=1, label="alarm: S = 100")
        if len(shown) > 1:  # one stream: the figure's title says it all
            panel.set_title(str(shown[i]), fontsize=9)
        panel.grid(True, alpha=0.3)
        panel.tick_params(labelsize=7)
        if i % cols == 0:
            panel.set_ylabel("log10 S", fontsize=8)
    if not shown:
        axes[0].axis("on")
        axes[0].text(0.5, 0.5, "no streams", ha="center", transform=axes[0].transAxes)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def reliability_diagram(
    scores: pl.DataFrame,
    *,
    stream: str = "stream",
    base: str = "base_score",
    protected: str = "protected_score",
    label: str = "label",
    n_bins: int = config.ECE_BINS,
    title: str = "Reliability: base vs protected",
    ax: Axes | None = None,
) -> Figure:
    """One panel per stream: observed frequency vs mean forecast in ``n_bins`` equal-width bins,
    base (dashed) and protected (solid), with the diagonal of perfect calibration.

    ``scores``: the pipeline's protected rows, or :func:`calpipe.protect`'s output (``score``
    is the base when there is no ``base_score`` column). ``ax``: draw the one stream of
    ``scores`` into these axes (their figure is returned); more streams need a figure of panels.
    """
    base = _first_present(scores, base, "score")
    labelled = scores.filter(pl.col(label).is_not_null())
    sizes = labelled.group_by(stream).len().sort(["len", stream], descending=[True, False])
    streams = sizes[stream].head(MAX_RELIABILITY_PANELS).sort().to_list()
    if ax is not None:
        if len(streams) > 1:
            raise ParameterError(
                f"reliability_diagram(ax=...) draws one stream; these scores have {len(streams)}"
                " (filter them to one, or leave ax out for a panel per stream)"
            )
        axes = [ax]
        fig = ax.figure
    else:
        n = max(1, len(streams))
        cols = min(config.RELIABILITY_PANELS_PER_ROW, n)
        rows = math.ceil(n / cols)
        fig = Figure(figsize=(3.2 * cols, 3.2 * rows))
        axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
        fig.suptitle(title)
    for i, panel in enumerate(axes):
        if i >= len(streams):
            panel.axis("off")
            continue
        part = labelled.filter(pl.col(stream) == streams[i])
        panel.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
        for col, style, name in ((base, "--", "base"), (protected, "-", "protected")):
            tab = metrics.reliability_table(part, col, label, n_bins=n_bins)
            ece = part.select(metrics.ece(col, label, n_bins=n_bins)).item()
            panel.plot(tab["mean_forecast"].to_list(), tab["observed"].to_list(), style,
                       marker="o", markersize=3, label=f"{name} (ECE {ece:.3f})")  # fmt: skip
        panel.set_title(f"{streams[i]} ({part.height} labelled)", fontsize=9)
        m = config.RELIABILITY_MARGIN
        panel.set_xlim(-m, 1 + m)
        panel.set_ylim(-m, 1 + m)
        panel.set_xlabel("mean forecast", fontsize=8)
        panel.set_ylabel("observed frequency", fontsize=8)
        # "best": a fixed corner hid the base curve of a badly miscalibrated stream (the
        # demo's bank stream, whose base runs up the upper left)
        panel.legend(fontsize=7, loc="best")
    if not streams:
        axes[0].axis("on")
        axes[0].text(0.5, 0.5, "no labelled events", ha="center")
    if ax is None:
        fig.tight_layout()
    return fig


def performance_estimates(
    rows: pl.DataFrame,
    *,
    loss: str = "log_loss",
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """One stream's nights: the ``loss`` its protected forecasts were expected to have if
    calibrated (line, with its interval shaded) and the one realized on the labels known now
    (dots), beside the base's expectation (dashed) and realization (crosses): a base estimate
    far from its realized values is a miscalibrated base (issue #35).

    ``rows``: ``v_performance_estimates`` rows of one stream (``date``, ``expected_<loss>``,
    its ``_low`` / ``_high``, ``realized_<loss>`` and the ``base_`` columns). ``ax``: draw into
    these axes (their figure is returned).
    """
    fig, ax = _one_stream_axes("performance_estimates", [rows], ax)
    rows = rows.sort("date")
    d = rows["date"].to_list()
    e = f"expected_{loss}"
    ax.fill_between(d, rows[f"{e}_low"].fill_null(float("nan")).to_list(),
                    rows[f"{e}_high"].fill_null(float("nan")).to_list(), color="tab:blue",
                    alpha=0.18, linewidth=0, label="90 % interval")  # fmt: skip
    ax.plot(d, rows[e].to_list(), color="tab:blue", linewidth=1.2, label="protected, expected")
    ax.plot(d, rows[f"realized_{loss}"].to_list(), "o", color="tab:blue", markersize=2.5,
            label="protected, realized")  # fmt: skip
    ax.plot(d, rows[f"base_{e}"].to_list(), "--", color="tab:orange", linewidth=1.0,
            label="base, expected")  # fmt: skip
    ax.plot(d, rows[f"base_realized_{loss}"].to_list(), "x", color="tab:orange", markersize=3,
            label="base, realized")  # fmt: skip
    return _finish_one_stream(fig, ax, loss.replace("_", " "), title)


def change_points(
    detector: pl.DataFrame,
    changes: pl.DataFrame,
    *,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """One stream's change detector (issue #35): its CUSUM statistic log10 M at the end of
    each night it moved (line), the threshold (red, dashed), each change point at its crossing
    (a dot at the statistic it reached, on the night found) and its estimated start (a dotted
    vertical line); the statistic starts again from 0 after each.

    ``detector``: ``calibrator_state`` rows of one stream (``date``, ``change_log10_cusum``);
    ``changes``: its ``change_points`` rows (``detected_date``, ``estimated_change_date``,
    ``log10_statistic``, ``change_number``). ``ax``: draw into these axes (their figure is
    returned).
    """
    fig, ax = _one_stream_axes("change_points", [detector, changes], ax)
    detector = detector.sort("date")
    ax.plot(detector["date"].to_list(), detector["change_log10_cusum"].fill_null(0.0).to_list(),
            color="tab:purple", linewidth=1.2, label="log10 M (end of night)")  # fmt: skip
    ax.axhline(config.CHANGE_LOG10_THRESHOLD, color="red", linestyle="--", linewidth=1,
               label=f"threshold: log10 A = {config.CHANGE_LOG10_THRESHOLD:g}")  # fmt: skip
    for i, r in enumerate(changes.sort("detected_date").iter_rows(named=True)):
        ax.axvline(r["estimated_change_date"], color="tab:gray", linestyle=":", linewidth=1,
                   label="estimated start" if i == 0 else None)  # fmt: skip
        ax.plot([r["detected_date"]], [r["log10_statistic"]], "o", color="tab:red",
                markersize=4, label="change point" if i == 0 else None)  # fmt: skip
        ax.annotate(str(r["change_number"]), (r["detected_date"], r["log10_statistic"]),
                    textcoords="offset points", xytext=(3, 3), fontsize=7)  # fmt: skip
    return _finish_one_stream(fig, ax, "log10 CUSUM", title)


def _one_stream_axes(plot: str, frames: list[pl.DataFrame], ax: Axes | None) -> tuple[Figure, Axes]:
    """The figure and axes a one-stream plot draws into (``ax``'s, or a new figure's);
    ParameterError if a frame holds several streams."""
    for frame in frames:
        if "stream" in frame.columns and frame["stream"].n_unique() > 1:
            raise ParameterError(
                f"{plot} draws one stream; these rows have {frame['stream'].n_unique()} "
                "(filter them to one)"
            )
    if ax is None:
        fig = Figure(figsize=(6.0, 3.4))
        return fig, fig.subplots()
    return ax.figure, ax


def _finish_one_stream(fig: Figure, ax: Axes, ylabel: str, title: str | None) -> Figure:
    """A one-stream plot's labels, title, legend and date axis; its figure."""
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    _legend(ax)
    fig.autofmt_xdate()
    return fig
