"""Seeded synthetic scored events: several streams, drift starting on known dates in some of them.

Each stream draws, for every event, a latent log-odds ``z ~ Normal(mu, sd)``; the base model's
score is ``sigmoid(z)`` throughout, which is *calibrated* as long as the label is drawn with
probability ``sigmoid(z)``. From a stream's drift date on, the world changes while the model does
not: the label is drawn with probability ``sigmoid(g(z))``, where

* ``overconfident``: g(z) = k z with k < 1 (the signal weakened: scores are too extreme);
* ``underconfident``: g(z) = k z with k > 1 (scores are too timid);
* ``shift``: g(z) = z + delta (the base rate moved: scores are biased).

Streams with ``drift="none"`` stay calibrated: by Ville's inequality their test martingale
reaches 100 with probability at most 1 %, so a protected pipeline should raise no alarm on them,
and should raise one, after the drift date, on the others.

Example
-------
>>> events = generate(n_days=3, seed=1)
>>> events.columns
['stream', 'event_id', 'event_time', 'score', 'label']
>>> sorted(events["stream"].unique().to_list())[:2]
['drift-overconfident', 'drift-shift']
>>> generate(n_days=3, seed=1).equals(events)  # same seed, same events
True
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import polars as pl

#: Seed of the shipped demo set (any fixed value; this one is recorded in the README).
DEFAULT_SEED = 20240601

#: Days of the demo set: about four months, enough for drift after a calibrated stretch.
DEFAULT_DAYS = 120

#: First day of the demo set: chosen so that it ends with the bank stream (2010-11-17), and the
#: demo's daily partitions end with every stream active.
DEFAULT_START = dt.date(2010, 7, 21)

DRIFTS = ("none", "overconfident", "underconfident", "shift")


@dataclass(frozen=True)
class StreamSpec:
    """One synthetic stream.

    ``events_per_day`` is the Poisson mean of a day's volume; ``mu, sd`` the latent log-odds;
    ``drift_day`` the 0-based day index the drift starts on (None without drift); ``strength``
    is k (overconfident / underconfident) or delta (shift).
    """

    name: str
    drift: str = "none"
    drift_day: int | None = None
    events_per_day: float = 150.0
    mu: float = -1.5
    sd: float = 1.5
    strength: float = 0.0

    def __post_init__(self):
        if self.drift not in DRIFTS:
            raise ValueError(f"stream {self.name!r}: drift must be one of {DRIFTS}")
        if (self.drift == "none") != (self.drift_day is None):
            raise ValueError(f"stream {self.name!r}: drift_day is given iff there is a drift")


#: The demo streams: three calibrated ones, three drifting ones (drift days 40, 60, 80, so each
#: has at least 40 days of drift in a 120-day set). The strengths are moderate on purpose: at
#: these volumes the alarm comes days to weeks after the drift (not on its first day), which is
#: what a monitoring demo should show; every drift is still found well within 40 days.
DEFAULT_STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("stable-a", events_per_day=150, mu=-1.5, sd=1.5),
    StreamSpec("stable-b", events_per_day=80, mu=-0.5, sd=1.0),
    StreamSpec("stable-c", events_per_day=250, mu=-2.5, sd=2.0),
    StreamSpec("drift-overconfident", "overconfident", 60, 150, -1.0, 1.5, strength=0.6),
    StreamSpec("drift-underconfident", "underconfident", 40, 100, -1.0, 1.0, strength=1.5),
    StreamSpec("drift-shift", "shift", 80, 200, -1.5, 1.5, strength=-0.55),
)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def generate(
    *,
    seed: int = DEFAULT_SEED,
    n_days: int = DEFAULT_DAYS,
    start: dt.date = DEFAULT_START,
    streams: tuple[StreamSpec, ...] = DEFAULT_STREAMS,
) -> pl.DataFrame:
    """Scored events of ``streams`` over ``n_days`` days from ``start`` (data contract, docs/ARCHITECTURE.md §3).

    Columns ``stream`` (String), ``event_id`` (Int64, unique per stream, increasing in time),
    ``event_time`` (Datetime, uniform within the day), ``score`` (Float64 in (0, 1)), ``label``
    (Int32). Deterministic in ``seed``; each stream has its own child generator, so adding a
    stream does not change the others.
    """
    children = np.random.SeedSequence(seed).spawn(len(streams))
    start_us = np.datetime64(start, "us").astype(np.int64)
    day_us = 86_400 * 1_000_000
    frames = []
    for spec, child in zip(streams, children, strict=True):
        rng = np.random.default_rng(child)
        counts = rng.poisson(spec.events_per_day, n_days)
        n = int(counts.sum())
        day = np.repeat(np.arange(n_days), counts)
        offset = rng.integers(0, day_us, n)
        t = start_us + day * day_us + offset
        order = np.lexsort((offset, day))  # time order, so ids increase with time
        day, t = day[order], t[order]
        z = rng.normal(spec.mu, spec.sd, n)
        g = z.copy()
        if spec.drift_day is not None:
            after = day >= spec.drift_day
            if spec.drift == "shift":
                g[after] = z[after] + spec.strength
            else:
                g[after] = z[after] * spec.strength
        label = (rng.random(n) < _sigmoid(g)).astype(np.int32)
        frames.append(
            pl.DataFrame(
                {
                    "stream": pl.Series([spec.name] * n, dtype=pl.String),
                    "event_id": np.arange(1, n + 1, dtype=np.int64),
                    "event_time": pl.Series(t).cast(pl.Datetime("us")),
                    "score": _sigmoid(z),
                    "label": label,
                }
            )
        )
    return pl.concat(frames)


def drift_table(
    *, start: dt.date = DEFAULT_START, streams: tuple[StreamSpec, ...] = DEFAULT_STREAMS
) -> pl.DataFrame:
    """The ground truth: ``stream``, ``drift`` kind and ``drift_date`` (null without drift)."""
    return pl.DataFrame(
        {
            "stream": [s.name for s in streams],
            "drift": [s.drift for s in streams],
            "drift_date": [
                None if s.drift_day is None else start + dt.timedelta(days=s.drift_day)
                for s in streams
            ],
        },
        schema={"stream": pl.String, "drift": pl.String, "drift_date": pl.Date},
    )
