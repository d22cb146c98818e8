"""Measurement 13 (BENCHMARKS.md): the ecosystem APIs' speed, one event at a time and in batch.

* ``calpipe.river.Protected`` around a model that costs nothing (it returns a column of the
  event), so the rate is the wrapper's: ``predict_proba_one`` then ``learn_one`` per event, for
  the binary mixtures' per-event kernel and for methods that go through their batch kernel;
* the baseline the issue measured: ``Calibrator.run`` called once per event (269 events/s);
* ``calpipe.sklearn.ScoreCalibrator``: ``fit`` over n scores, then ``predict_proba`` of n.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.run import Table, best_of, fmt_rate

#: Events per measurement: the fast path, the slow paths (batch kernel per event), sklearn.
EVENTS = {
    "smoke": {"fast": 20_000, "slow": 300, "batch": 200_000},
    "full": {"fast": 1_000_000, "slow": 5_000, "batch": 5_000_000},
}


class _Column:
    """A river classifier whose probability is the event's own ``p`` (costs a dict lookup)."""

    def predict_proba_one(self, x):
        return {False: 1.0 - x["p"], True: x["p"]}

    def learn_one(self, x, y):
        pass


def _protected_rate(method: str, xs: list, ys: list) -> float:
    from calpipe.river import Protected

    model = Protected(_Column(), method=method)
    model.predict_proba_one(xs[0])  # compile / load the kernel
    model = Protected(_Column(), method=method)
    t = time.perf_counter()
    for x, y in zip(xs, ys, strict=True):
        model.predict_proba_one(x)
        model.learn_one(x, y)
    return len(xs) / (time.perf_counter() - t)


def _run_per_event_rate(method: str, p: np.ndarray, y: np.ndarray) -> float:
    from calpipe import make_calibrator

    cal = make_calibrator(method)
    _, st = cal.run(p[:1], y[:1])
    t = time.perf_counter()
    for i in range(1, p.size):
        _, st = cal.run(p[i : i + 1], y[i : i + 1], state=st)
    return (p.size - 1) / (time.perf_counter() - t)


def measure(size_name: str, repeat: int) -> Table:
    from calpipe.sklearn import ScoreCalibrator

    n = EVENTS[size_name]
    rng = np.random.default_rng(20240601)
    p = rng.uniform(0.02, 0.98, n["batch"])
    y = (rng.uniform(size=p.size) < p**1.3).astype(np.int64)
    xs = [{"p": float(v)} for v in p[: n["fast"]]]
    ys = [bool(v) for v in y[: n["fast"]]]
    tab = Table(
        "13. Ecosystem APIs: river's one event at a time, scikit-learn's batch",
        ["API", "method", "events", "events/s"],
    )
    for method in ("composite-jumper", "jumper"):
        rate = max(_protected_rate(method, xs, ys) for _ in range(repeat))
        tab.rows.append(
            ["river `Protected` (per-event kernel)", method, f"{len(xs):,}", fmt_rate(rate)]
        )
        if method == "composite-jumper":
            fast = rate
    k = n["slow"]
    for method in ("platt", "composite-experts"):
        rate = _protected_rate(method, xs[:k], ys[:k])
        tab.rows.append(
            ["river `Protected` (batch kernel, one event)", method, f"{k:,}", fmt_rate(rate)]
        )
    loop = _run_per_event_rate("composite-jumper", p[:k], y[:k])
    tab.rows.append(
        ["`Calibrator.run` once per event (baseline)", "composite-jumper", f"{k:,}", fmt_rate(loop)]
    )
    for method in ("composite-jumper", "isotonic"):
        est = ScoreCalibrator(method)
        est.fit(p[:1000], y[:1000])
        fit = best_of(lambda m=method: ScoreCalibrator(m).fit(p, y), repeat)
        fitted = ScoreCalibrator(method).fit(p, y)
        pred = best_of(lambda f=fitted: f.predict_proba(p), repeat)
        tab.rows.append(["sklearn `ScoreCalibrator.fit` / `predict_proba`", method, f"{p.size:,}",
                         f"{fmt_rate(p.size / fit)} / {fmt_rate(p.size / pred)}"])  # fmt: skip
    tab.notes.append(
        f"Target: `Protected` >= 100k events/s: {'met' if fast >= 1e5 else '**missed**'} "
        f"({fast / 1e3:,.0f}k, {fast / loop:,.0f}x the per-event `Calibrator.run` loop). The model "
        "costs a dict lookup, so the rate is the wrapper's; a real river model adds its own time."
    )
    return tab
