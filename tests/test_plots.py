"""calpipe.plots: real PNGs of martingale trajectories and reliability diagrams."""

from __future__ import annotations

import datetime as dt
import io

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest

from calpipe import config, errors, plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def trajectory() -> pl.DataFrame:
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(10)]
    return pl.DataFrame(
        {
            "date": days * 2,
            "stream": ["a"] * 10 + ["b"] * 10,
            "log10_martingale": list(np.linspace(0, 3, 10)) + list(np.linspace(0, -0.5, 10)),
        }
    )


def scored(n_streams: int = 2, n: int = 400, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    p = rng.random(n * n_streams)
    return pl.DataFrame(
        {
            "stream": np.repeat([f"s{i}" for i in range(n_streams)], n),
            "base_score": p,
            "protected_score": np.clip(p * 0.8 + 0.1, 0, 1),
            "label": (rng.random(n * n_streams) < p).astype(np.int32),
        }
    )


def decode(png: bytes) -> np.ndarray:
    return mpimg.imread(io.BytesIO(png), format="png")


def test_trajectory_has_a_panel_per_stream_with_the_alarm_level():
    fig = plots.martingale_trajectory(trajectory())
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert [ax.get_title() for ax in panels] == ["a", "b"]
    for ax in panels:
        alarm = [line for line in ax.get_lines() if line.get_label().startswith("alarm")]
        assert len(alarm) == 1 and set(alarm[0].get_ydata()) == {config.ALARM_LOG10_THRESHOLD}
        assert len(ax.get_lines()) == 2  # the stream and the alarm level


def test_trajectory_axis_is_linear_as_the_values_are_already_log10():
    """Regression: a symlog axis over log10 S was a log of a log."""
    big = trajectory().with_columns(pl.col("log10_martingale") * 1000)
    assert {ax.get_yscale() for ax in plots.martingale_trajectory(big).axes} == {"linear"}


def test_one_axis_flattened_every_stream_but_the_bank_s():
    """#37 item 6: on one axis the demo's bank stream (log10 S ~ 4,000) flattened every other
    stream onto zero. Each stream now has its own panel and y range: a small stream's line
    spans most of its panel's height."""
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(30)]
    traj = pl.DataFrame({
        "date": days * 2, "stream": ["bank"] * 30 + ["calm"] * 30,
        "log10_martingale": list(np.linspace(0, 4086, 30)) + list(np.sin(np.arange(30)) * 1.5),
    })  # fmt: skip
    fig = plots.martingale_trajectory(traj)
    calm = next(ax for ax in fig.axes if ax.get_title() == "calm")
    lo, hi = calm.get_ylim()
    line = calm.get_lines()[0].get_ydata()
    assert (max(line) - min(line)) / (hi - lo) > 0.5


def test_trajectory_panels_are_capped_at_the_highest_streams():
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(5)]
    many = pl.DataFrame({
        "date": days * 50, "stream": np.repeat([f"s{i:02d}" for i in range(50)], 5),
        "log10_martingale": np.linspace(0, 3, 250),  # s49 ends highest
    })  # fmt: skip
    fig = plots.martingale_trajectory(many)
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    cap = config.MAX_TRAJECTORY_PANELS
    assert titles == [f"s{i:02d}" for i in range(50 - cap, 50)]
    assert f"{cap} of 50 streams" in fig.get_suptitle()
    assert plots.to_png(fig).startswith(PNG_MAGIC)


def test_a_legend_of_fifty_streams_drawn_into_one_axis_sits_beside_it_and_is_capped():
    from matplotlib.figure import Figure

    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(5)]
    many = pl.DataFrame({
        "date": days * 50, "stream": np.repeat([f"s{i:02d}" for i in range(50)], 5),
        "log10_martingale": np.linspace(0, 3, 250),
    })  # fmt: skip
    ax = Figure().subplots()
    plots.martingale_trajectory(many, ax=ax)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(texts) == config.MAX_LEGEND_ENTRIES
    assert texts[-2] == f"... and {50 - (config.MAX_LEGEND_ENTRIES - 2)} more"
    assert texts[-1].startswith("alarm")
    assert ax.get_legend().get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1  # outside


def test_plots_take_an_ax_and_protect_s_output_and_leave_the_backend_alone():
    """Regression: importing calpipe.plots switched matplotlib's backend to Agg, the plots drew
    only new figures and wanted the pipeline's columns (date, base_score)."""
    import subprocess
    import sys

    code = ("import matplotlib; matplotlib.use('svg'); import calpipe.plots; "
            "print(matplotlib.get_backend())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"

    from matplotlib.figure import Figure

    import calpipe

    base = scored(1)
    events = pl.DataFrame({
        "stream": base["stream"], "score": base["base_score"], "label": base["label"],
        "event_id": np.arange(base.height),
        "event_time": np.datetime64("2024-01-01T00:00", "us")
        + np.arange(base.height).astype("timedelta64[m]"),
    })  # fmt: skip
    out = calpipe.protect(events, method="jumper")
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert plots.martingale_trajectory(out, ax=left) is fig
    assert plots.reliability_diagram(out, ax=right) is fig
    assert len(left.get_lines()) == 2  # the stream and the alarm level
    assert plots.to_png(fig).startswith(PNG_MAGIC)
    with pytest.raises(calpipe.ParameterError, match="draws one stream"):
        plots.reliability_diagram(scored(2), ax=right)


def test_reliability_has_a_panel_per_stream_with_base_and_protected():
    fig = plots.reliability_diagram(scored(3))
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 3
    for ax in panels:
        names = [line.get_label() for line in ax.get_lines()]
        assert any(n.startswith("base (ECE") for n in names)
        assert any(n.startswith("protected (ECE") for n in names)
    assert plots.to_png(fig).startswith(PNG_MAGIC)


def test_reliability_points_are_the_bin_means():
    df = scored(1)
    fig = plots.reliability_diagram(df, n_bins=10)
    base_line = next(
        line for line in fig.axes[0].get_lines() if line.get_label().startswith("base")
    )
    b = np.clip(np.floor(df["base_score"].to_numpy() * 10), 0, 9)
    want = [df["base_score"].to_numpy()[b == k].mean() for k in range(10) if (b == k).any()]
    np.testing.assert_allclose(base_line.get_xdata(), want)


def test_reliability_caps_the_panels_and_handles_no_labels():
    many = scored(plots.MAX_RELIABILITY_PANELS + 3, n=50)
    fig = plots.reliability_diagram(many)
    assert len([ax for ax in fig.axes if ax.axison]) == plots.MAX_RELIABILITY_PANELS
    empty = scored(1).with_columns(pl.lit(None, pl.Int32).alias("label"))
    assert plots.to_png(plots.reliability_diagram(empty)).startswith(PNG_MAGIC)


def test_save_png_writes_a_file(tmp_path):
    path = plots.save_png(plots.martingale_trajectory(trajectory()), tmp_path / "a" / "t.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("n_streams", [0])
def test_trajectory_of_nothing_is_still_a_png(n_streams):
    empty = trajectory().head(n_streams)
    assert plots.to_png(plots.martingale_trajectory(empty)).startswith(PNG_MAGIC)


def test_a_bin_at_0_or_1_was_drawn_half_outside_the_reliability_panel():
    """#37 item 6: the base curve's markers at a mean forecast or frequency of 0 or 1 sat on
    the frame (limits exactly [0, 1]) and were cut by it. Every point is now inside the axes
    with room for its marker."""
    frame = pl.DataFrame({
        "stream": ["s"] * 6, "base_score": [0.0, 0.01, 0.5, 0.55, 0.99, 1.0],
        "protected_score": [0.1, 0.1, 0.5, 0.5, 0.9, 0.9], "label": [0, 0, 1, 0, 1, 1],
    })  # fmt: skip
    ax = plots.reliability_diagram(frame).axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    for line in ax.get_lines():
        xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        assert (xs > x0).all() and (xs < x1).all() and (ys > y0).all() and (ys < y1).all()


def _estimates(stream: str = "a", n: int = 6) -> pl.DataFrame:
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)]
    e = np.linspace(0.5, 0.6, n)
    return pl.DataFrame({
        "date": days, "stream": [stream] * n, "expected_log_loss": e,
        "expected_log_loss_low": [None, *(e[1:] - 0.05)],  # NULL below 20 events
        "expected_log_loss_high": [None, *(e[1:] + 0.05)],
        "realized_log_loss": [0.52, None, 0.58, 0.55, 0.61, 0.6],  # a night without labels
        "base_expected_log_loss": e - 0.1, "base_realized_log_loss": e + 0.05,
    })  # fmt: skip


def test_performance_estimates_draws_the_interval_expected_and_realized_of_one_stream():
    """#35: the expected loss (line), its interval (band), the realized values (dots), and the
    base's beside them; nights without an interval or without labels are gaps, not errors."""
    fig = plots.performance_estimates(_estimates(), title="a")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) >= {"protected, expected", "protected, realized", "base, expected",
                          "base, realized"}  # fmt: skip
    np.testing.assert_allclose(lines["protected, expected"].get_ydata(), np.linspace(0.5, 0.6, 6))
    assert len(ax.collections) == 1  # the interval's band
    assert plots.to_png(fig)[:4] == b"\x89PNG"
    with pytest.raises(errors.ParameterError, match="draws one stream"):
        plots.performance_estimates(pl.concat([_estimates("a"), _estimates("b")]))


def test_change_points_draws_the_statistic_the_threshold_and_each_change_point():
    """#35: the detector's statistic per night (line), the threshold, a dot per change point at
    the statistic it reached and a dotted line at its estimated start."""
    d = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(6)]
    detector = pl.DataFrame({"date": d, "change_log10_cusum": [0.0, 1.5, 3.0, 0.0, 0.5, 0.0]})
    changes = pl.DataFrame({"detected_date": [d[3], d[5]], "estimated_change_date": [d[1], d[4]],
                            "log10_statistic": [4.2, 4.05], "change_number": [1, 2]})  # fmt: skip
    fig = plots.change_points(detector, changes, title="a")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    np.testing.assert_allclose(lines["log10 M (end of night)"].get_ydata(), [0, 1.5, 3, 0, 0.5, 0])
    assert "change point" in lines and "estimated start" in lines
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert [float(ln.get_ydata()[0]) for ln in dots] == [4.2, 4.05]
    assert plots.to_png(fig)[:4] == b"\x89PNG"
    with pytest.raises(errors.ParameterError, match="draws one stream"):
        plots.change_points(detector.with_columns(stream=pl.Series(["a", "b"] * 3)), changes)
