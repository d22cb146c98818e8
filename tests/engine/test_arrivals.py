"""calpipe.engine.arrive_labels: a nightly chain fed labels days after their events equals one
pass over the events carrying their labels and label times (the label feed's engine step)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe.engine import arrive_labels
from calpipe.errors import InputError

D0 = dt.datetime(2024, 5, 1)
N_DAYS = 6


def _events(k: int, seed: int) -> pl.DataFrame:
    """Events of 3 streams over N_DAYS days; labels with random delays: none, within the day,
    days later, after the last day (never arrive), and some never labelled."""
    rng = np.random.default_rng(seed)
    n = 900
    t = np.datetime64(D0, "us") + np.sort(rng.integers(0, N_DAYS * 86_400, n)).astype(
        "timedelta64[s]"
    )
    kind = rng.choice(4, n, p=[0.3, 0.3, 0.3, 0.1])
    delay = np.select(
        [kind == 0, kind == 1, kind == 2],
        [np.zeros(n), rng.uniform(0, 20_000, n), rng.uniform(86_400, 5 * 86_400, n)],
        np.nan,
    )
    if k == 2:
        p = rng.uniform(0.05, 0.95, n)
        y = (rng.uniform(size=n) < np.clip(p**0.6, 0, 1)).astype(np.int64)
        scores = {"score": p}
    else:
        raw = rng.dirichlet(np.ones(k), n)
        y = np.array([rng.choice(k, p=np.roll(r, 1)) for r in raw])  # miscalibrated
        scores = {"scores": pl.Series(raw.tolist(), dtype=pl.List(pl.Float64))}
    ev = pl.DataFrame(
        {"stream": rng.choice(["a", "b", "c"], n), "event_id": np.arange(n), "event_time": t}
        | scores
        | {"label": y, "delay_us": (np.nan_to_num(delay) * 1e6).astype(np.int64),
           "unlabelled": np.isnan(delay)}
    )  # fmt: skip
    return ev.with_columns(
        pl.when(~pl.col("unlabelled")).then(pl.col("label")).alias("label"),
        pl.when(~pl.col("unlabelled"))
        .then(pl.col("event_time") + pl.duration(microseconds=pl.col("delay_us")))
        .alias("label_time"),
    ).drop("delay_us", "unlabelled")


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("method", ["composite-jumper", "composite-experts"])
def test_a_chain_fed_labels_later_equals_one_pass(k, method):
    ev = _events(k, seed=k)
    score = {"score": "score"} if k == 2 else {"scores": "scores"}
    one = calpipe.protect(ev, label_time="label_time", method=method, **score)
    day = pl.col("event_time").dt.date()
    arrival = pl.col("label_time").dt.date()
    state, parts = None, []
    for i in range(N_DAYS):
        d = (D0 + dt.timedelta(days=i)).date()
        late = ev.filter((day < d) & (arrival == d))
        if late.height:
            state = arrive_labels(state, late.rename({"scores": "score"}) if k > 2 else late)
        tonight = ev.filter(day == d).with_columns(
            pl.when(arrival == d).then(pl.col(c)).alias(c) for c in ("label", "label_time")
        )
        r = calpipe.protect_with_state(
            tonight, label_time="label_time", method=method, state=state, **score
        )
        state = r.state
        parts.append(r.scores)
    chain = pl.concat(parts)
    out = "protected_score" if k == 2 else "protected_scores"
    j = one.join(chain, on=["stream", "event_id"], suffix="_c")
    assert j.height == ev.height
    if k == 2:
        diff = (j[out] - j[out + "_c"]).abs().max()
    else:
        a, b = (np.vstack(j[c].to_list()) for c in (out, out + "_c"))
        diff = float(np.abs(a - b).max())
    assert diff <= 1e-12
    # the late labels moved the forecasts: without them the chain differs
    assert (ev["label_time"].dt.date() > ev["event_time"].dt.date()).sum() > 100
    assert (j["log10_martingale"] - j["log10_martingale_c"]).abs().max() <= 1e-9


def test_a_label_for_a_stream_without_state_or_arriving_too_late_is_refused():
    ev = _events(2, seed=9)
    first = ev.filter(pl.col("event_time").dt.date() == D0.date()).with_columns(
        pl.lit(None, pl.Int64).alias("label"), pl.lit(None, pl.Datetime("us")).alias("label_time")
    )
    state = calpipe.protect_with_state(first, label_time="label_time").state
    row = first.head(1).with_columns(pl.lit(1).alias("label"))
    with pytest.raises(InputError, match="stream without state"):
        arrive_labels(
            state,
            row.with_columns(
                pl.lit("zz").alias("stream"), pl.col("event_time").alias("label_time")
            ),
        )
    with pytest.raises(InputError, match="before the stream's last processed event"):
        arrive_labels(state, row.with_columns(pl.col("event_time").alias("label_time")))
