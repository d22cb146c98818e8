"""Shared test fixtures: small random scored-event frames (docs/ARCHITECTURE.md §3).

``make_events(seed, ...)`` builds a frame of scored events for several streams, in a shuffled
physical row order (so the replay order (event_time, event_id) is never the row order), with
miscalibrated base probabilities (so the protected forecasts move away from the base), some null
labels, ties in ``event_time`` and, optionally, delayed labels (``label_time``).

Tests get it through the ``make_events`` fixture (session-scoped, so hypothesis can use it) or
import it: ``from tests.conftest import make_events``.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

T0 = dt.datetime(2024, 1, 1)


def make_events(
    seed: int,
    *,
    n_events: int = 40,
    n_streams: int | None = 3,
    n_classes: int = 2,
    null_frac: float = 0.3,
    label_time: bool | str = False,
    time_dtype: str = "datetime",
    id_dtype: str = "int",
    extreme_frac: float = 0.05,
    scores_dtype: str = "list",
) -> pl.DataFrame:
    """A random frame of scored events.

    Columns: ``stream`` (String "s0", "s1", ...; omitted if ``n_streams`` is None = one stream),
    ``event_time`` (Datetime hours from 2024-01-01, or Date days, or Int64 ticks, with ties),
    ``event_id`` (Int64 or String, unique within a stream, not in time order), ``score`` (binary)
    or ``scores`` (List or Array of ``n_classes`` Float64 summing to 1), ``label`` (Int64,
    ``null_frac`` of them null) and, with ``label_time=True``, ``label_time`` (Datetime; event
    time plus 0 to 12 hours, 0 about a third of the time; null where the label is null; with
    ``label_time="mixed"`` also null for a third of the labels: known at their event).
    ``extreme_frac`` of the base forecasts are exactly 0 or 1 in some class.
    """
    rng = np.random.default_rng(seed)
    n = n_events
    k_streams = 1 if n_streams is None else n_streams
    stream_idx = rng.integers(0, k_streams, size=n)
    # event ids unique within a stream, not increasing with time
    event_id = np.empty(n, dtype=np.int64)
    for s in range(k_streams):
        rows = np.flatnonzero(stream_idx == s)
        event_id[rows] = rng.permutation(rows.size) * 7 + 3
    ticks = rng.integers(0, max(2, n // 3), size=n)  # ties in event_time within a stream

    if n_classes == 2:
        p = rng.beta(2.0, 2.0, size=n)
        extreme = rng.random(n) < extreme_frac
        p[extreme] = rng.integers(0, 2, size=int(extreme.sum())).astype(float)
        logit = np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1 - 1e-6))
        truth = 1.0 / (1.0 + np.exp(-(2.5 * logit + 0.8)))  # over-/under-confident, shifted
        y = (rng.random(n) < truth).astype(np.int64)
        base = pl.Series("score", p, dtype=pl.Float64)
    else:
        p = rng.dirichlet(np.ones(n_classes), size=n)
        extreme = rng.random(n) < extreme_frac
        for i in np.flatnonzero(extreme):
            p[i] = 0.0
            p[i, rng.integers(0, n_classes)] = 1.0
        shifted = p**2.0 * np.exp(np.linspace(0.0, 1.0, n_classes))
        truth = shifted / shifted.sum(axis=1, keepdims=True)
        y = np.array([rng.choice(n_classes, p=t) for t in truth], dtype=np.int64)
        dtype = pl.Array(pl.Float64, n_classes) if scores_dtype == "array" else pl.List(pl.Float64)
        base = pl.Series("scores", p.tolist(), dtype=dtype)

    labelled = rng.random(n) >= null_frac
    label = pl.Series(
        "label", [int(v) if ok else None for v, ok in zip(y, labelled, strict=True)], pl.Int64
    )

    if time_dtype == "datetime":
        times = pl.Series("event_time", [T0 + dt.timedelta(hours=int(t)) for t in ticks])
    elif time_dtype == "date":
        times = pl.Series("event_time", [T0.date() + dt.timedelta(days=int(t)) for t in ticks])
    else:
        times = pl.Series("event_time", ticks, dtype=pl.Int64)
    ids = pl.Series("event_id", event_id, dtype=pl.Int64)
    if id_dtype == "str":
        ids = ids.cast(pl.String).str.zfill(5)

    cols: list[pl.Series] = []
    if n_streams is not None:
        cols.append(pl.Series("stream", [f"s{s}" for s in stream_idx], dtype=pl.String))
    cols += [times, ids, base, label]
    if label_time:
        if time_dtype == "int":
            raise ValueError("label_time needs a temporal event_time")
        delay = np.where(rng.random(n) < 0.35, 0, rng.integers(1, 13, size=n))
        unit = dt.timedelta(hours=1) if time_dtype == "datetime" else dt.timedelta(days=1)
        t_event = [T0 + unit * int(t) for t in ticks]
        # "mixed": a third of the labels known at their event (null label_time)
        known = rng.random(n) < (0.3 if label_time == "mixed" else 0.0)
        lt = [
            t_event[i] + unit * int(delay[i]) if labelled[i] and not known[i] else None
            for i in range(n)
        ]
        cols.append(pl.Series("label_time", lt, dtype=pl.Datetime("us")))
    return pl.DataFrame(cols)


@pytest.fixture(scope="session", name="make_events")
def make_events_fixture():
    """The :func:`make_events` factory (session-scoped: safe inside hypothesis tests)."""
    return make_events
