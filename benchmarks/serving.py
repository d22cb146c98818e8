"""Measurement 15 (BENCHMARKS.md): serving maps in SQL, a table of scores at once vs per score.

The demo's events (its first 120 days in smoke) run through the pipeline with the default
method (``composite-experts``: ~106 terms per stream) and with windowed isotonic regression (a
step table per stream) into a new database each; then fresh scores of every stream, uniform
on [0, 1], are calibrated in DuckDB by ``calibrate_table`` (the set form: one join of the
scores with the maps' rows) and by ``calibrate_score`` called per row (each score's map
evaluated on its own), the latter on a slice (it is 35x to 190x slower). Both answers are compared
(equal to 1e-12 on the slice), and one ``calibrate_score`` query of a single score gives the
fixed cost of a query (binding the macros).

K classes the same way: the demo's events with K = 3 score vectors in place of their scores
(:func:`benchmarks.run.multiclass_scores`), the default method (Cox terms over online vector
scaling) and ROC-isotonic (a partition tree per stream, walked by a recursive query), fresh
Dirichlet vectors through ``calibrate_scores_table`` and ``calibrate_scores`` per row.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np

from benchmarks.run import SEED, Table, best_of, multiclass_scores
from benchmarks.small_days import demo_days

#: (scores for calibrate_table, scores for calibrate_score per row, days of the demo's events)
SIZES = {"smoke": (20_000, 200, 120), "full": (1_000_000, 2_000, None)}
#: (K, method, its parameters); K-class rows take a tenth of the scores (a vector's map is K
#: binary-sized maps and more)
METHODS = (
    (2, "composite-experts", {}),
    (2, "isotonic", {"window": 2_000, "refit_every": 200}),
    (3, "composite-experts", {}),
    (3, "roc-isotonic", {"window": 2_000, "refit_every": 200}),
)
K = 3


def _timed(con, query: str, params: list, repeat: int) -> tuple[float, list]:
    """The best wall time of ``query`` (all its rows fetched) over ``repeat`` runs, and the
    rows of the last run (compared below, not fetched again)."""
    rows: list = []
    t = best_of(lambda: rows.__setitem__(slice(None), con.execute(query, params).fetchall()),
                max(repeat, 1))  # fmt: skip
    return t, rows


def _with_vectors(events, seed: int):
    """The demo's events with K-class score vectors in place of their scores (labels drawn from
    a tilted truth where the event has one)."""
    import polars as pl

    p, y = multiclass_scores(events.height, K, seed)
    return events.drop("score").with_columns(
        pl.Series("scores", p).cast(pl.List(pl.Float64)),
        pl.when(pl.col("label").is_not_null()).then(pl.Series(y)).alias("label"),
    )


def measure(size_name: str, repeat: int) -> Table:
    import polars as pl

    from calpipe import storage
    from calpipe.pipeline import Settings, run_range

    n_set, n_row, n_days = SIZES[size_name]
    tab = Table(
        "15. Serving in SQL: `calibrate_table` (a table of scores) vs `calibrate_score` per row",
        ["K", "method", "map rows / stream", "scores", "set form s", "scores/s",
         "per row s", "scores/s", "speed-up", "one-score query s"],
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = demo_days(tmp, n_days)
        storage.write_landing(events, tmp / "landing")
        storage.write_landing(_with_vectors(events, SEED), tmp / "landing_k")
        streams = sorted(events["stream"].unique().to_list())
        rng = np.random.default_rng(SEED)
        fresh = {
            2: pl.DataFrame({
                "stream": [streams[i % len(streams)] for i in range(n_set)],
                "score": rng.uniform(0.0, 1.0, n_set),
            }),
            K: pl.DataFrame({
                "stream": [streams[i % len(streams)] for i in range(n_set // 10)],
                "scores": rng.dirichlet(np.ones(K), n_set // 10).tolist(),
            }),
        }  # fmt: skip
        for k, method, params in METHODS:
            binary = k == 2
            con = storage.connect(tmp / f"{method}-{k}.duckdb")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    landing = tmp / ("landing" if binary else "landing_k")
                    run_range(con, storage.EventSource.parse(str(landing)),
                              settings=Settings.make(method, **params))  # fmt: skip
                con.register("fresh_frame", fresh[k].to_arrow())
                con.execute("CREATE TEMP TABLE fresh AS SELECT * FROM fresh_frame")
                # (K classes per row: one stream's rows, the stream a constant: calibrate_scores
                # with a stream column fails inside DuckDB 2.0, README "A table of scores")
                con.execute("CREATE TEMP TABLE fresh_slice AS SELECT * FROM fresh "
                            "WHERE ? OR stream = ? LIMIT ?", [binary, streams[0], n_row])  # fmt: skip
                per_stream = storage.query(
                    con,
                    "SELECT count(*) / count(DISTINCT stream) AS n FROM v_latest_calibration_map",
                )["n"][0]
                if binary:
                    table_q = "SELECT * FROM calibrate_table('fresh')"
                    row_q = "SELECT calibrate_score(stream, score) FROM fresh_slice"
                    one_q, one = "SELECT calibrate_score(?, 0.3)", [streams[0]]
                else:
                    table_q = "SELECT * FROM calibrate_scores_table('fresh')"
                    row_q = f"SELECT calibrate_scores('{streams[0]}', scores) FROM fresh_slice"
                    one_q, one = "SELECT calibrate_scores(?, [0.2, 0.3, 0.5])", [streams[0]]
                t_set, table_rows = _timed(con, table_q, [], repeat)
                t_row, row_rows = _timed(con, row_q, [], 1)
                t_one, _ = _timed(con, one_q, one, repeat)
                if not binary:  # the slice's rows: the first stream's
                    table_rows = [r for r in table_rows if r[0] == streams[0]]
                got = np.array([r[-1] for r in table_rows[:n_row]], dtype=float)
                want = np.array([r[0] for r in row_rows], dtype=float)
                del table_rows, row_rows
                gap = float(np.nanmax(np.abs(got - want)))
                if not gap <= 1e-12:
                    raise AssertionError(f"{method} (K = {k}): the set form != per row ({gap})")
            finally:
                con.close()
            n = fresh[k].height
            rate_set, rate_row = n / t_set, n_row / t_row
            tab.rows.append([
                str(k), f"`{method}`", f"{per_stream:,.0f}", f"{n:,}", f"{t_set:.2f}",
                f"{rate_set:,.0f}", f"{t_row:.2f} ({n_row:,} scores)", f"{rate_row:,.0f}",
                f"{rate_set / rate_row:,.0f}x", f"{t_one:.2f}",
            ])  # fmt: skip
    tab.notes.append(
        f"Streams: the demo's {len(streams)} ({'all 892 days' if n_days is None else f'first {n_days} days'}); "
        "fresh scores uniform on [0, 1] (K = 3: Dirichlet(1, 1, 1) vectors), spread over the "
        "streams. The set form is `calibrate_table` (K classes: `calibrate_scores_table`), best "
        "of the repeats; per row is `calibrate_score` (`calibrate_scores`), once; both include "
        "the query's fixed cost (last column: binding the macros, the whole time of a one-score "
        "query). The two answers agree to 1e-12 on the per-row slice (checked in the run)."
    )
    return tab
