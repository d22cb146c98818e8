"""Measurement 15 (BENCHMARKS.md): serving maps in SQL, a table of scores at once vs per score.

The demo's events (its first 120 days in smoke) run through the pipeline with the default
method (``composite-experts``: ~106 terms per stream) and with windowed isotonic regression (a
step table per stream) into a new database each; then fresh scores of every stream, uniform
on [0, 1], are calibrated in DuckDB by ``calibrate_table`` (the set form: one join of the
scores with the maps' rows) and by ``calibrate_score`` called per row (each score's map
evaluated on its own), the latter on a slice (it is 35x to 190x slower). Both answers are compared
(equal to 1e-12 on the slice), and one ``calibrate_score`` query of a single score gives the
fixed cost of a query (binding the macros).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np

from benchmarks.run import SEED, Table, best_of
from benchmarks.small_days import demo_days

#: (scores for calibrate_table, scores for calibrate_score per row, days of the demo's events)
SIZES = {"smoke": (20_000, 200, 120), "full": (1_000_000, 2_000, None)}
METHODS = (("composite-experts", {}), ("isotonic", {"window": 2_000, "refit_every": 200}))


def _timed(con, query: str, params: list, repeat: int) -> tuple[float, list]:
    """The best wall time of ``query`` (all its rows fetched) over ``repeat`` runs, and the
    rows of the last run (compared below, not fetched again)."""
    rows: list = []
    t = best_of(lambda: rows.__setitem__(slice(None), con.execute(query, params).fetchall()),
                max(repeat, 1))  # fmt: skip
    return t, rows


def measure(size_name: str, repeat: int) -> Table:
    import polars as pl

    from calpipe import store
    from calpipe.pipeline import Settings, run_range

    n_set, n_row, n_days = SIZES[size_name]
    tab = Table(
        "15. Serving in SQL: `calibrate_table` (a table of scores) vs `calibrate_score` per row",
        ["method", "map rows / stream", "scores", "calibrate_table s", "scores/s",
         "calibrate_score per row s", "scores/s", "speed-up", "one-score query s"],
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = demo_days(tmp, n_days)
        store.write_landing(events, tmp / "landing")
        streams = sorted(events["stream"].unique().to_list())
        rng = np.random.default_rng(SEED)
        fresh = pl.DataFrame({
            "stream": [streams[i % len(streams)] for i in range(n_set)],
            "score": rng.uniform(0.0, 1.0, n_set),
        })  # fmt: skip
        for method, params in METHODS:
            con = store.connect(tmp / f"{method}.duckdb")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run_range(con, store.EventSource.parse(str(tmp / "landing")),
                              settings=Settings.make(method, **params))  # fmt: skip
                con.register("fresh_frame", fresh.to_arrow())
                con.execute("CREATE TEMP TABLE fresh AS SELECT * FROM fresh_frame")
                con.execute("CREATE TEMP TABLE fresh_slice AS SELECT * FROM fresh LIMIT ?",
                            [n_row])  # fmt: skip
                per_stream = store.query(
                    con,
                    "SELECT count(*) / count(DISTINCT stream) AS n FROM v_latest_calibration_map",
                )["n"][0]
                table_q = "SELECT * FROM calibrate_table('fresh')"
                row_q = ("SELECT calibrate_score(stream, score) AS protected_score "
                         "FROM fresh_slice")  # fmt: skip
                t_set, table_rows = _timed(con, table_q, [], repeat)
                t_row, row_rows = _timed(con, row_q, [], 1)
                t_one, _ = _timed(con, "SELECT calibrate_score(?, 0.3)", [streams[0]], repeat)
                got = np.array([r[-1] for r in table_rows[:n_row]], dtype=float)
                want = np.array([r[0] for r in row_rows], dtype=float)
                del table_rows, row_rows
                gap = float(np.nanmax(np.abs(got - want)))
                if not gap <= 1e-12:
                    raise AssertionError(f"{method}: calibrate_table != calibrate_score ({gap})")
            finally:
                con.close()
            rate_set, rate_row = n_set / t_set, n_row / t_row
            tab.rows.append([
                f"`{method}`", f"{per_stream:,.0f}", f"{n_set:,}", f"{t_set:.2f}",
                f"{rate_set:,.0f}", f"{t_row:.2f} ({n_row:,} scores)", f"{rate_row:,.0f}",
                f"{rate_set / rate_row:,.0f}x", f"{t_one:.2f}",
            ])  # fmt: skip
    tab.notes.append(
        f"Streams: the demo's {len(streams)} ({'all 892 days' if n_days is None else f'first {n_days} days'}); "
        "fresh scores uniform on [0, 1], spread over the streams. `calibrate_table` best of the "
        "repeats, per row once; both include the query's fixed cost (last column: binding the "
        "macros, the whole time of a one-score query). The two answers agree to 1e-12 on the "
        "per-row slice (checked in the run)."
    )
    return tab
