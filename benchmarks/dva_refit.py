"""decay-venn-abers' refit in O(B) (issue #33, BENCHMARKS.md §27 addendum), before / after.

``python -m benchmarks.dva_refit --before PATH [--events 1000000] [--streams 1000] [--repeat 3]``

1. One refit at B = 100 bins, in this process: :func:`calpipe.kernels.decay_venn_abers.
   ivap_table` (the sweep over the prefix and suffix PAV stacks, O(B)) against the refit it
   replaced, 2B full PAV passes (:func:`~calpipe.kernels.decay_venn_abers.pav_value_at`,
   O(B^2)), on decayed count profiles; CPU microseconds per refit, best of ``--repeat``.
2. ``calpipe.protect`` of measurement 16's frame with ``decay-venn-abers`` (its default memory
   4000, and memory 200: a refit every 20 labels) and with the default method, in child
   processes with ``PYTHONPATH`` set to ``PATH`` (a checkout before the change, e.g. ``git
   worktree add /tmp/before bd605a2``) and to this tree, alternated; process CPU seconds (the
   machine may be shared), best of ``--repeat``, and whether the two outputs' digests agree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import njit

from benchmarks.run import machine
from calpipe.kernels import decay_venn_abers as DVA
from tests.kernels.test_decay_venn_abers import ivap_table_quadratic  # the O(B^2) oracle

_CHILD = """
import hashlib, json, sys, time
import calpipe
from benchmarks.run import event_frame
n, s, method, params = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
df = event_frame(n, s, "time")
calpipe.protect(df.head(5_000), method=method, **params)  # compile / load the numba cache
c = time.process_time()
out = calpipe.protect(df, method=method, **params)
c = time.process_time() - c
h = hashlib.sha256()
for name in out.columns:
    h.update(out[name].hash(seed=0).to_numpy().tobytes())
print(json.dumps({"cpu": c, "digest": h.hexdigest()[:16]}))
"""


@njit(cache=True)
def _loop_quadratic(P, N, out, s_sum, s_w, s_last):
    for r in range(P.shape[0]):
        ivap_table_quadratic(P[r], N[r], out, s_sum, s_w, s_last)


@njit(cache=True)
def _loop_linear(P, N, out, work, iwork):
    n_direct = 0
    for r in range(P.shape[0]):
        n_direct += DVA.ivap_table(P[r], N[r], out, work, iwork)
    return n_direct


def profiles(n: int, n_bins: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` decayed count vectors: a bulk of ~W/2 = 2000 labels over the central bins, tails
    forgotten down to 1e-80, a non-logistic label rate."""
    rng = np.random.default_rng(seed)
    z = np.linspace(-4, 4, n_bins)
    w = 2000 / n_bins * 4 * np.exp(-(z**2) / 2) * rng.exponential(1, (n, n_bins))
    w *= np.where(np.abs(z) > 2.5, 10.0 ** rng.uniform(-80, 0, (n, n_bins)), 1.0)
    p = 1 / (1 + np.exp(-np.sign(z) * np.abs(z) ** 0.5 + rng.normal(0, 0.5, (n, n_bins))))
    return w * p, w * (1 - p)


def micro(n_bins: int, n: int, repeat: int) -> list[tuple[str, float, str]]:
    P, N = profiles(n, n_bins)
    out = np.empty(n_bins)
    quad = (np.empty(n_bins), np.empty(n_bins), np.empty(n_bins, np.int64))
    lin = (np.empty((DVA.IVAP_ROWS, n_bins)), np.empty((DVA.IVAP_IROWS, n_bins), np.int64))
    _loop_quadratic(P[:2], N[:2], out, *quad)  # compile
    n_direct = _loop_linear(P, N, out, *lin)
    best = {"quadratic": np.inf, "linear": np.inf}
    for _ in range(repeat):
        for name in best:
            c = time.process_time()
            if name == "quadratic":
                _loop_quadratic(P, N, out, *quad)
            else:
                _loop_linear(P, N, out, *lin)
            best[name] = min(best[name], (time.process_time() - c) / n * 1e6)
    diff = 0.0
    for r in range(min(n, 500)):
        a, b = np.empty(n_bins), np.empty(n_bins)
        ivap_table_quadratic(P[r], N[r], a, *quad)
        DVA.ivap_table(P[r], N[r], b, *lin)
        diff = max(diff, float(np.max(np.abs(a - b))))
    note = f"max |diff| {diff:.2g} over 500 refits; direct merges {n_direct} in {2 * n * n_bins}"
    return [("2B PAV passes, O(B^2) (before)", best["quadratic"], ""),
            ("prefix/suffix PAV stacks, O(B) (after)", best["linear"], note)]  # fmt: skip


def child(tree: Path, n: int, s: int, method: str, params: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    key = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]
    env["NUMBA_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / f"calpipe_numba_{key}")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n), str(s), method, json.dumps(params)],
        env=env, capture_output=True, text=True, check=True, cwd=str(tree),
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dva_refit")
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--streams", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--refits", type=int, default=2_000)
    a = ap.parse_args(argv)
    print(machine())
    print("\nOne refit, B = 100 (CPU us per refit, best of", a.repeat, "):\n")
    print("| refit | us | |\n|---|---:|---|")
    for name, us, note in micro(100, a.refits, a.repeat):
        print(f"| {name} | {us:.1f} | {note} |")
    after = Path(__file__).resolve().parents[1]
    cases = [("decay-venn-abers", {}), ("decay-venn-abers", {"memory": 200}),
             ("composite-experts", {})]  # fmt: skip
    print(f"\ncalpipe.protect, {a.events:,} events / {a.streams:,} streams (CPU s, best of "
          f"{a.repeat}):\n")  # fmt: skip
    print("| method | params | before | after | before / after | outputs |")
    print("|---|---|---:|---:|---:|---|")
    for method, params in cases:
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(a.repeat):
            for name, tree in (("before", a.before), ("after", after)):
                runs[name].append(child(tree, a.events, a.streams, method, params))
        b = min(r["cpu"] for r in runs["before"])
        c = min(r["cpu"] for r in runs["after"])
        same = runs["before"][0]["digest"] == runs["after"][0]["digest"]
        print(f"| {method} | {params or 'defaults'} | {b:.3f} | {c:.3f} | {b / c:.2f}x | "
              f"{'identical' if same else 'differ'} |")  # fmt: skip


if __name__ == "__main__":
    main()
