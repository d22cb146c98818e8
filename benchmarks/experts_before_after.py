"""Measurement 16 before / after (BENCHMARKS.md, issue #33): the default method
(``composite-experts``) through ``calpipe.protect`` with two versions of the code, side by side.

``python -m benchmarks.experts_before_after --before PATH [--size full] [--repeat 3]``

``PATH`` is a checkout of the code before (e.g. ``git worktree add /tmp/before <commit>``); the
current tree is the after. Each run is a child process (``PYTHONPATH`` set to its tree, a numba
cache of its own outside both trees) that builds measurement 16's frame (time-ordered events,
sort included), warms the kernels up on its head, then times one ``protect`` of the whole frame:
wall clock and the process's CPU time (less disturbed by other load on a shared machine). The
runs alternate (floor, before, after, floor, ...) and each row is its best; the children print
a digest of the frame they return, and the table says whether before and after agreed.
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

from benchmarks.experts_floor import SIZES
from benchmarks.run import SEED, Table, best_of, cox_floor, event_frame, fmt_rate, machine

_CHILD = """
import hashlib, json, sys, time
import calpipe
from benchmarks.run import event_frame
n, s = int(sys.argv[1]), int(sys.argv[2])
df = event_frame(n, s, "time")
calpipe.protect(df.head(5_000))  # compile / load the numba cache
w, c = time.perf_counter(), time.process_time()
out = calpipe.protect(df)
w, c = time.perf_counter() - w, time.process_time() - c
h = hashlib.sha256()
for name in out.columns:
    col = out[name]
    h.update(name.encode())
    h.update(col.hash(seed=0).to_numpy().tobytes())
print(json.dumps({"wall": w, "cpu": c, "digest": h.hexdigest()[:16]}))
"""


def _run(tree: Path, n: int, n_streams: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.setdefault("TZ", "UTC")
    key = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"calpipe_numba_{key}"
    env["NUMBA_CACHE_DIR"] = str(cache)  # never inside either tree
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n), str(n_streams)],
        env=env, capture_output=True, text=True, check=True, cwd=str(tree),
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(before: Path, size_name: str, repeat: int) -> Table:
    from calpipe import config

    after = Path(__file__).resolve().parents[1]
    n, n_streams = SIZES[size_name]
    rng = np.random.default_rng(SEED + 16)
    base = np.clip(event_frame(n, n_streams, "time")["score"].to_numpy(), 1e-3, 1 - 1e-3)
    near = [np.clip(base + rng.normal(0, 0.05, n), 1e-3, 1 - 1e-3)
            for _ in config.EXPERT_INPUTS_BINARY]  # fmt: skip
    q = np.ascontiguousarray(np.vstack([base, *near]))
    alphas, betas = config.EXPERT_COX_ALPHAS, config.EXPERT_COX_BETAS
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    floor = []
    _run(before, 5_000, 50), _run(after, 5_000, 50)  # fill both numba caches
    for _ in range(repeat):  # alternating, so that every row sees the same machine load
        floor.append(best_of(lambda: cox_floor(q, alphas, betas), 1))
        runs["before"].append(_run(before, n, n_streams))
        runs["after"].append(_run(after, n, n_streams))
    fl = min(floor)
    tab = Table(
        f"16c. The default before and after #33's kernel work (`calpipe.protect`, {n:,} events, "
        f"{n_streams:,} streams, time-ordered), side by side",
        ["run", f"wall s (best of {repeat})", "CPU s (best)", "events/s", "vs floor",
         "vs before (wall)", "vs before (CPU)"],
    )  # fmt: skip
    tab.rows.append([f"numpy: evaluate the {q.shape[0] * len(alphas) * len(betas)} Cox terms "
                     "only", f"{fl:.3f}", "", fmt_rate(n / fl), "1x", "", ""])  # fmt: skip
    bw = min(r["wall"] for r in runs["before"])
    bc = min(r["cpu"] for r in runs["before"])
    for name, label in (("before", f"before ({before})"), ("after", "after (this tree)")):
        w = min(r["wall"] for r in runs[name])
        c = min(r["cpu"] for r in runs[name])
        tab.rows.append([label, f"{w:.3f}", f"{c:.3f}", fmt_rate(n / w), f"{w / fl:.2f}x",
                         f"{bw / w:.2f}x faster" if name == "after" else "",
                         f"{bc / c:.2f}x faster" if name == "after" else ""])  # fmt: skip
    digests = {r["digest"] for rs in runs.values() for r in rs}
    tab.notes.append(machine())
    tab.notes.append(
        "Child processes alternate (floor in this process, before, after, ...); each row is its "
        "best. The frames returned are "
        + ("identical (one digest)." if len(digests) == 1 else f"**different** ({digests}).")
    )
    return tab


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="checkout of the code before")
    ap.add_argument("--size", choices=sorted(SIZES), default="smoke")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    t = time.perf_counter()
    print(measure(args.before, args.size, args.repeat).markdown())
    print(f"({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
