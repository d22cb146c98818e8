"""Every non-protected method, and a stack, through the nightly pipeline (``calpipe run``).

One chain over a small landing folder per method: the day-by-day chain equals one
:func:`calpipe.protect` pass, the checks pass, ``base_score`` is what the martingale bets against
(base loss - protected loss = ln 10 * log10 S per stream), and the serving map of the last state
is the next forecast.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe import config, generate, pipeline, storage
from calpipe.calibrators import METHODS, PROTECTED_METHODS
from calpipe.generate import StreamSpec
from calpipe.pipeline import Settings

STREAMS = (
    StreamSpec("a", events_per_day=40),
    StreamSpec("b", "overconfident", 2, 30, strength=0.3),
)

#: method -> params for a short chain (binary methods only: the pipeline stores binary scores).
CASES = {
    "platt": {"window": 30, "refit_every": 20},
    "beta": {"window": 30},
    "temperature": {"window": 30, "refit_every": 25},
    "venn-predictor": {"n_bins": 4},
    "histogram": {"window": 40, "n_bins": 5, "prior_strength": 1.0},
    "isotonic": {"window": 40, "interpolation": "step"},
    "roc-isotonic": {"window": 40, "min_region_size": 5},
    "venn-abers": {"window": 40, "refit_every": 20},
    "venn": {"window": 40, "n_bins": 4},
    "calibrated-regression": {"powers": 2},
    "ops": {},
    "tops": {"n_bins": 5},
    "hops": {},
    "obs": {"rho": 10.0},
    "tobs": {},
    "hobs": {"n_bins": 4},
    "online-histogram": {"n_bins": 5},
    "oms": {},
    "composite-experts": {},
    "decay-beta": {"memory": 40},
    "decay-venn-abers": {"memory": 40},
}
STACK = ("composite-jumper", {"base_method": "platt", "base_params": {"window": 30}})
BRIER = ("composite-jumper", {"loss": "brier", "clip": None})


def test_every_binary_method_is_run_here():
    binary = set(METHODS) - set(PROTECTED_METHODS)  # every method takes a binary score
    assert binary <= set(CASES)


@pytest.fixture(scope="module")
def landing(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("methods")
    events = generate.generate(n_days=6, streams=STREAMS, seed=12)
    storage.write_landing(events, tmp / "landing")
    return tmp, events


@pytest.mark.parametrize(("method", "params"), [*CASES.items(), STACK], ids=[*CASES, "stack"])
def test_chain_equals_one_pass_and_keeps_the_martingale_identity(landing, method, params):
    tmp, events = landing
    settings = Settings.make(method, **params)
    con = storage.connect(tmp / f"{method}-{len(params)}.duckdb")
    try:
        pipeline.run_range(con, storage.EventSource.parse(str(tmp / "landing")), settings=settings)
        chain = con.sql("SELECT * FROM v_protected_scores").pl()
        state = con.sql("SELECT * FROM calibrator_state").pl()
    finally:
        con.close()
    assert chain.height == events.height
    one = calpipe.protect(events, method=method, **params)
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() == 0.0
    assert (chain["method"] == settings.calibrator().name).all()
    lab = chain.filter(pl.col("label").is_not_null()).sort("stream", "event_time", "event_id")
    for (s,), g in lab.group_by("stream"):
        y = g["label"].to_numpy()
        b, p = g["base_score"].to_numpy(), g["protected_score"].to_numpy()
        eps = 1e-3
        p = np.clip(p, eps, 1 - eps)
        gain = np.sum(np.log(np.where(y == 1, p, 1 - p)) - np.log(np.where(y == 1, b, 1 - b)))
        assert math.isclose(gain, math.log(10) * g["log10_martingale"][-1], abs_tol=1e-8), s
    if method in ("venn-predictor", "venn", "venn-abers"):
        assert (chain["p_lower"] <= chain["protected_score"]).all()
        assert (chain["protected_score"] <= chain["p_upper"]).all()
    else:
        assert chain["p_lower"].is_null().all()
    last = state.filter(pl.col("date") == state["date"].max())
    fresh = pl.DataFrame({"stream": ["a", "b"], "score": [0.3, 0.8]})
    mapped = pipeline.serving_map(last, fresh, settings)
    assert mapped["protected_score"].is_not_null().all()
    assert mapped["protected_score"].is_between(0, 1).all()


def test_cli_run_stacks_a_batch_method_and_resumes(landing, capsys):
    from calpipe import cli

    tmp, events = landing
    db = tmp / "cli-stack.duckdb"
    argv = ["run", "--events", str(tmp / "landing"), "--db", str(db), "--base-method",
            "venn-abers", "--base-param", "window=40", "--base-param", "refit_every=20"]  # fmt: skip
    last = events["event_time"].max().date()
    assert cli.main([*argv, "--end", (last - dt.timedelta(days=2)).isoformat()]) == 0
    assert cli.main(argv) == 0  # the nightly increment resumes the stacked state
    con = storage.connect(db)
    try:
        chain = con.sql("SELECT * FROM v_protected_scores").pl()
    finally:
        con.close()
    one = calpipe.protect(events, method=config.PIPELINE_DEFAULT_METHOD, base_method="venn-abers",
                          base_params={"window": 40, "refit_every": 20})  # fmt: skip
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height
    assert (j["protected_score"] - j["protected_score_c"]).abs().max() == 0.0
    assert (j["base_method_score"].clip(1e-3, 1 - 1e-3) == j["base_score"]).all()
    # another base configuration on the same chain is refused
    other = [*argv[:-2], "--base-param", "refit_every=30", "--start", last.isoformat()]
    assert cli.main(other) == 2
    assert "fingerprint" in capsys.readouterr().err


def test_the_brier_compatibility_mode_runs_in_the_pipeline(landing):
    """loss="brier" (protected-classification 0.1.5's mode) used to be refused by the pipeline:
    the chain equals one pass bit for bit; its map is stored for SQL too (equal to
    serving_map: tests/pipeline/test_mapping.py)."""
    tmp, events = landing
    method, params = BRIER
    settings = Settings.make(method, **params)
    con = storage.connect(tmp / "brier.duckdb")
    try:
        summary = pipeline.run_range(
            con, storage.EventSource.parse(str(tmp / "landing")), settings=settings
        )
        assert all(c.passed or c.warning for c in summary.checks)
        chain = con.sql("SELECT * FROM protected_scores").pl()
        assert con.sql("SELECT count(*) FROM calibration_map").fetchall()[0][0] > 0
        last = pipeline.state_as_of(con, summary.end)
    finally:
        con.close()
    one = calpipe.protect_with_state(events, method=method, **params)
    j = one.scores.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == events.height
    for c in ("protected_score", "log10_martingale"):
        assert (j[c] - j[f"{c}_c"]).abs().max() == 0.0, c
    # no clip in Brier mode: the stored base is the raw score
    assert (j["base_score"] - j["score"]).abs().max() == 0.0
    fresh = pl.DataFrame({"stream": ["a", "b"], "score": [0.3, 0.8]})
    mapped = pipeline.serving_map(last, fresh, settings)
    want = pipeline.serving_map(one.state, fresh, settings)
    assert mapped["protected_score"].to_list() == want["protected_score"].to_list()
