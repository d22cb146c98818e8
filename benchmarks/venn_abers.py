"""Venn-ABERS speed: ``calpipe.kernels.venn_abers`` vs the reference package ``venn-abers`` 1.5.4.

``python -m benchmarks.venn_abers [--size smoke|full] [--repeat 3]`` prints a markdown table;
:func:`run` returns its rows (for ``benchmarks/run.py``). Sizes: smoke = 2k calibration / 20k test
scores, full = 100k / 1M. Both sides run in the same process on the same inputs, each timing the
best of ``repeat`` runs of fit + predict (calpipe after one warm-up call that loads the numba
cache); ``max |diff|`` compares their calibrated probabilities.

Cases (the package's own entry points; inputs prepared outside the timings):

* IVAP: ``VennAbers().fit(p_cal).predict_proba(p_test)`` (Vovk-Petej-Fedorova 2015, Alg. 1-6);
  once on continuous scores (k ~ n distinct) and once on scores rounded to 1e-3 (k <= 1001);
* CVAP, 5 folds, log merge: ``VennAbersCV(inductive=False, n_splits=5)`` around a fixed-score
  estimator (its folds are passed to calpipe, so both compute the same predictor);
* multiclass K = 4, IVAP, one-vs-one and one-vs-rest: the package's prefitted path
  ``VennAbersCalibrator().predict_proba(p_cal=, y_cal=, p_test=, va_type=...)``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

SEED = 20240601
SIZES = {"smoke": (2_000, 20_000), "full": (100_000, 1_000_000)}
N_FOLDS = 5
N_CLASSES = 4


def _binary(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Scores p ~ Beta(2, 3) with labels from the miscalibrated truth p^0.7 (as benchmarks.run)."""
    p = rng.beta(2.0, 3.0, n)
    return p, (rng.random(n) < p**0.7).astype(np.int64)


def _multiclass(n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Dirichlet(0.8) score rows; labels from a tilted truth (inverse-CDF draw)."""
    p = rng.dirichlet(np.full(k, 0.8), size=n)
    tilt = p**0.7
    tilt /= tilt.sum(axis=1, keepdims=True)
    u = rng.random(n)
    return p, (tilt.cumsum(axis=1) < u[:, None]).sum(axis=1).clip(0, k - 1).astype(np.int64)


def _best(fn, repeat: int) -> tuple[float, object]:
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _fixed_score_estimator():
    """A scikit-learn classifier whose predict_proba(X) returns precomputed score rows X[:, 0]."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class FixedScores(ClassifierMixin, BaseEstimator):
        def __init__(self, table=None):
            self.table = table

        def fit(self, X, y):
            self.classes_ = np.unique(y)
            return self

        def predict_proba(self, X):
            s = self.table[np.asarray(X)[:, 0].astype(np.int64)]
            return np.column_stack([1.0 - s, s])

    return FixedScores


def run(size: str = "smoke", repeat: int = 3) -> list[dict]:
    """Time every case; one dict per case with the sizes, both wall times and the speed-up."""
    from sklearn.model_selection import StratifiedKFold
    from venn_abers.venn_abers import VennAbers, VennAbersCalibrator, VennAbersCV

    from calpipe.kernels import venn_abers as va

    n_cal, n_test = SIZES[size]
    rng = np.random.default_rng(SEED)
    rows: list[dict] = []
    warnings.filterwarnings("ignore")
    # warm-up: load (or compile) every numba kernel once
    va.predict(va.fit(np.array([0.2, 0.7]), np.array([0, 1]), cross=True, n_folds=2), np.ones(2))

    def record(case, pkg, ours, p_pkg, p_ours):
        (t_pkg, _), (t_ours, _) = pkg, ours
        rows.append(
            {
                "case": case,
                "n_cal": n_cal,
                "n_test": n_test,
                "package_s": t_pkg,
                "calpipe_s": t_ours,
                "speedup": t_pkg / t_ours,
                "max_abs_diff": float(np.max(np.abs(p_pkg - p_ours))),
            }
        )

    # --- IVAP, continuous and rounded scores ------------------------------------------------
    s, y = _binary(n_cal, rng)
    t, _ = _binary(n_test, rng)
    for case, sc, tc in (
        ("IVAP binary", s, t),
        ("IVAP binary, scores rounded to 1e-3", np.round(s, 3), np.round(t, 3)),
    ):
        cal2 = np.column_stack([1.0 - sc, sc])
        test2 = np.column_stack([1.0 - tc, tc])

        def pkg(cal2=cal2, test2=test2, y=y):
            return VennAbers().fit(cal2, y).predict_proba(test2)[0][:, 1]

        def ours(sc=sc, tc=tc, y=y):
            return va.predict(va.fit(sc, y), tc).p

        a, b = _best(pkg, repeat), _best(ours, repeat)
        record(case, a, b, a[1], b[1])

    # --- CVAP through the package's estimator API ----------------------------------------------
    est = _fixed_score_estimator()(table=np.concatenate([s, t]))
    x_cal = np.arange(n_cal).reshape(-1, 1)
    x_test = np.arange(n_cal, n_cal + n_test).reshape(-1, 1)
    folds = np.empty(n_cal, dtype=np.int64)
    for f, (_, idx) in enumerate(StratifiedKFold(n_splits=N_FOLDS).split(x_cal, y)):
        folds[idx] = f

    def pkg_cv():
        cv = VennAbersCV(est, inductive=False, n_splits=N_FOLDS)
        cv.fit(x_cal, y)
        return cv.predict_proba(x_test, loss="log")[:, 1]

    def ours_cv():
        return va.predict(va.fit(s, y, folds=folds, merge="log"), t).p

    a, b = _best(pkg_cv, repeat), _best(ours_cv, repeat)
    record(f"CVAP binary, {N_FOLDS} folds, log merge", a, b, a[1], b[1])

    # --- multiclass, IVAP, the package's prefitted path ------------------------------------------
    pc, yc = _multiclass(n_cal, N_CLASSES, rng)
    pt, _ = _multiclass(n_test, N_CLASSES, rng)
    for mode, va_type in (("ovo", "one_vs_one"), ("ovr", "one_vs_rest")):

        def pkg_mc(va_type=va_type):
            return VennAbersCalibrator().predict_proba(
                p_cal=pc, y_cal=yc, p_test=pt, va_type=va_type
            )

        def ours_mc(mode=mode):
            return va.predict(va.fit(pc, yc, multiclass=mode), pt).p

        a, b = _best(pkg_mc, repeat), _best(ours_mc, repeat)
        record(f"IVAP multiclass K={N_CLASSES}, {mode}", a, b, a[1], b[1])
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| case | n_cal | n_test | venn-abers 1.5.4 (s) | calpipe (s) | speed-up | max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['n_cal']:,} | {r['n_test']:,} | {r['package_s']:.4f} "
            f"| {r['calpipe_s']:.4f} | {r['speedup']:.1f}x | {r['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="smoke")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print(markdown(run(args.size, args.repeat)))


if __name__ == "__main__":
    main()
