"""The default's confidence on the K-class streams (docs/studies/multiclass-confidence.md).

``python -m benchmarks.studies.multiclass_confidence`` prints three tables on the five K-class
streams of ``benchmarks.quality`` (about a minute):

1. the base, the default and its two inputs run alone (``ops``, ``oms``): mean log loss, smooth
   ECE of the whole stream, the mean smooth ECE of its quarters (``smECE/4``) and mean top-label
   confidence minus accuracy (``conf - acc``), as ``benchmarks.quality.evaluate`` computes them;
2. ``conf - acc`` in each fifth of the stream;
3. variants of the default: the Cox grid's slopes, jumps, a second stage on its output.
"""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl

import calpipe
from benchmarks import quality as Q


def streams() -> list[Q.Stream]:
    return [Q.river_stream("segments", "ARF", 1, None), Q.segments_sorted("intensity-mean"),
            Q.segments_sorted(None), Q.digits_sorted(True), Q.digits_sorted(False)]  # fmt: skip


def run(p: np.ndarray, y: np.ndarray, method: str, **params) -> np.ndarray:
    frame = pl.DataFrame({"event_id": np.arange(len(y)), "label": y, "scores": p})
    r = calpipe.protect(frame, order_by="event_id", method=method, scores="scores", **params)
    return r["protected_scores"].to_numpy()


def grid(betas, shifts=(1.0, 2.0)) -> list[tuple[float, float]]:
    """The K-class Cox grid's (alpha, beta) pairs as ``family_params`` takes them: slopes
    ``betas`` x shifts 0, +-a of one class."""
    return [(sign * a, b) for b in betas for a in (0.0, *shifts)
            for sign in ((1.0,) if a == 0.0 else (1.0, -1.0))]  # fmt: skip


R2 = 2.0**0.5
VARIANTS = {
    "default": {},
    "restart 0 (paper 001's jumps)": {"restart": 0.0},
    "slopes (1, 2) only": {"family_params": grid((1.0, 2.0))},
    "slopes 2^(k/2), k = -2..2": {"family_params": grid((1.0, 1 / R2, R2, 0.5, 2.0))},
    "slopes 2^(k/4), k = -4..4": {
        "family_params": grid((1.0, *(2.0 ** (k / 4) for k in (-4, -3, -2, -1, 1, 2, 3, 4))))
    },
    "rates (1e-3, 1e-4)": {"jumping_rates": [1e-3, 1e-4]},
}
SECOND_STAGE = ("ops", "oms", "composite-experts")


def row(name: str, s: Q.Stream, p: np.ndarray) -> str:
    r = Q.evaluate(s, p, None)
    return (f"| {name} | {r['log_loss']:.4f} | {r['smooth_ece']:.4f} | "
            f"{r['smooth_ece_local']:.4f} | {r['conf_gap']:+.4f} |")  # fmt: skip


def main() -> None:
    head = "| {} | log loss | smooth ECE | smECE/4 | conf - acc |\n|---|---:|---:|---:|---:|"
    data = streams()
    for s in data:
        runs = {"base": s.p, "default": run(s.p, s.y, Q.DEFAULT), "ops alone": run(s.p, s.y, "ops"),
                "oms alone": run(s.p, s.y, "oms")}  # fmt: skip
        print(f"\n### {s.name} (n = {len(s.y):,}, K = {s.k})\n\n" + head.format("forecast"))
        for k, p in runs.items():
            print(row(k, s, p))
        edges = np.linspace(0, len(s.y), 6).astype(int)
        print("\n| conf - acc by fifth | 1 | 2 | 3 | 4 | 5 |\n|---|---:|---:|---:|---:|---:|")
        for k, p in runs.items():
            gaps = [p[a:b].max(1).mean() - (p[a:b].argmax(1) == s.y[a:b]).mean()
                    for a, b in itertools.pairwise(edges)]  # fmt: skip
            print(f"| {k} | " + " | ".join(f"{g:+.3f}" for g in gaps) + " |")
        print("\n" + head.format("variant"))
        for k, params in VARIANTS.items():
            print(row(k, s, run(s.p, s.y, Q.DEFAULT, **params)), flush=True)
        d = np.clip(runs["default"], 1e-12, 1.0)
        d /= d.sum(axis=1, keepdims=True)
        for m in SECOND_STAGE:
            print(row(f"default, then {m} on its output", s, run(d, s.y, m)), flush=True)


if __name__ == "__main__":
    main()
