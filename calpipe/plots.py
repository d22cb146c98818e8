"""Matplotlib figures of the pipeline: martingale trajectories and reliability diagrams.

Figures are drawn with the non-interactive Agg backend (no display needed) and returned as
:class:`matplotlib.figure.Figure` objects; :func:`to_png` turns one into PNG bytes (what the
dagster metadata embeds) and :func:`save_png` writes it to a file.

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

import matplotlib

matplotlib.use("Agg")  # headless: metadata, CI, servers

import matplotlib.pyplot as plt
import polars as pl
from matplotlib.figure import Figure

from calpipe import config, metrics

# the plot limits live in calpipe.config with their reasons; this one stays importable here
from calpipe.config import MAX_RELIABILITY_PANELS


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes (and close it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=config.PLOT_DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write the figure as a PNG file (folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(to_png(fig))
    return path


def martingale_trajectory(
    trajectory: pl.DataFrame,
    *,
    date: str = "date",
    stream: str = "stream",
    value: str = "log10_martingale",
    title: str = "Test martingale per stream (end of day)",
) -> Figure:
    """log10 S per stream over time, with the alarm level log10 S = 2 (S = 100) drawn.

    ``trajectory`` has one row per (stream, date). Streams whose martingale spans several orders
    of magnitude (the bank stream reaches log10 S ~ 3600) would flatten the others, so the y axis
    is symmetric-log above :data:`calpipe.config.TRAJECTORY_SYMLOG_ABOVE`.
    """
    fig, ax = plt.subplots(figsize=(9, 4.5))
    streams = trajectory[stream].unique().sort().to_list()
    for s in streams:
        part = trajectory.filter(pl.col(stream) == s).sort(date)
        ax.plot(part[date].to_list(), part[value].to_list(), label=str(s), linewidth=1.4)
    ax.axhline(config.ALARM_LOG10_THRESHOLD, color="red", linestyle="--", linewidth=1,
               label="alarm: S = 100")  # fmt: skip
    top = trajectory[value].max() if trajectory.height else 0.0
    if top is not None and top > config.TRAJECTORY_SYMLOG_ABOVE:
        ax.set_yscale("symlog", linthresh=config.TRAJECTORY_SYMLOG_ABOVE)
        bottom = min(float(trajectory[value].min()), 0.0)
        ax.set_ylim(bottom=bottom - 1.0)  # a calibrated stream's martingale stays near 0
    ax.set_xlabel(date)
    ax.set_ylabel("log10 test martingale")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if streams:
        ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
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
) -> Figure:
    """One panel per stream: observed frequency vs mean forecast in ``n_bins`` equal-width bins,
    base (dashed) and protected (solid), with the diagonal of perfect calibration."""
    labelled = scores.filter(pl.col(label).is_not_null())
    sizes = labelled.group_by(stream).len().sort(["len", stream], descending=[True, False])
    streams = sizes[stream].head(MAX_RELIABILITY_PANELS).sort().to_list()
    n = max(1, len(streams))
    cols = min(config.RELIABILITY_PANELS_PER_ROW, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for i, ax in enumerate(axes.ravel()):
        if i >= len(streams):
            ax.axis("off")
            continue
        part = labelled.filter(pl.col(stream) == streams[i])
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
        for col, style, name in ((base, "--", "base"), (protected, "-", "protected")):
            tab = metrics.reliability_table(part, col, label, n_bins=n_bins)
            ece = part.select(metrics.ece(col, label, n_bins=n_bins)).item()
            ax.plot(tab["mean_forecast"].to_list(), tab["observed"].to_list(), style, marker="o",
                    markersize=3, label=f"{name} (ECE {ece:.3f})")  # fmt: skip
        ax.set_title(f"{streams[i]} ({part.height} labelled)", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("mean forecast", fontsize=8)
        ax.set_ylabel("observed frequency", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    if not streams:
        axes[0, 0].text(0.5, 0.5, "no labelled events", ha="center")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
