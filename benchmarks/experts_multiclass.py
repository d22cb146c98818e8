"""Measurement 25 (BENCHMARKS.md §25, issue #33): the default method (``composite-experts``) on
K = 3 class scores, its per-input engine against the K-class lanes kernel, side by side.

``calpipe.protect`` with the default, time-ordered K-class events over many streams (sort
included), run two ways in one process, alternating (per-input, fused, per-input, ...), best of
each (wall clock, and the process's CPU time, less disturbed by other load on a shared machine):

* **per-input**: online vector scaling's own kernel over the operations with forecast copies,
  its forecasts renormalised, then the K-class mixture one stream at a time
  (``CompositeExperts.engine = "per-input"``; "per-stream" is the same path for K classes);
* **fused**: online vector scaling and the mixture in one pass, streams in SIMD lanes
  (:mod:`calpipe.kernels.expert_lanes_multiclass`; the default engine).

Both give the same bits (tests/calibrators/test_experts_engines.py); the table checks it on the
run itself. ``--inputs ops,oms`` (the §25 addendum): the default with the K-class inputs
("ops", "oms") -- online vector and matrix scaling -- the fused run learning both in the lanes.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.run import SEED, Table, fmt_rate, machine, multiclass_scores

#: (events, streams) of the measurement.
SIZES = {"smoke": (50_000, 100), "full": (1_000_000, 1_000)}
ENGINES = (
    ("per-input: online vector scaling's kernel, then the mixture one stream at a time",
     "per-input"),
    ("fused: both in one lanes kernel (the default)", "fused"),
)  # fmt: skip


def event_frame_k(n: int, n_streams: int, k: int, seed: int = SEED):
    """A K-class scored-events frame in the data contract's shape (``scores`` arrays), rows in
    global time order, streams interleaved."""
    import polars as pl

    rng = np.random.default_rng(seed)
    p, y = multiclass_scores(n, k, seed)
    stream = rng.integers(0, n_streams, n)
    t0 = np.datetime64("2024-06-01T00:00:00", "us").astype(np.int64)
    t = t0 + np.sort(rng.integers(0, 86_400_000_000, n))
    names = np.array([f"s{i:06d}" for i in range(n_streams)])
    return pl.DataFrame(
        {
            "stream": pl.Series(names[stream], dtype=pl.String),
            "event_id": np.arange(n, dtype=np.int64),
            "event_time": pl.Series(t).cast(pl.Datetime("us")),
            "scores": pl.Series(p),
            "label": pl.Series(y, dtype=pl.Int32),
        }
    )


def measure(
    size_name: str, repeat: int, k: int = 3, inputs: tuple[str, ...] | None = None
) -> Table:
    """The table of measurement 25; ``inputs``: the default's K-class inputs (None: config's)."""
    import calpipe
    from calpipe.calibrators.experts import CompositeExperts

    n, n_streams = SIZES[size_name]
    df = event_frame_k(n, n_streams, k)
    kw = {} if inputs is None else {"inputs": inputs}
    default = CompositeExperts.engine
    wall: dict[str, list[float]] = {e: [] for _, e in ENGINES}
    cpu: dict[str, list[float]] = {e: [] for _, e in ENGINES}
    outputs = {}
    try:
        for _, engine in ENGINES:  # compile / load the numba cache
            CompositeExperts.engine = engine
            calpipe.protect(df.head(5_000), scores="scores", **kw)
        for _ in range(repeat):  # alternating, so that every row sees the same machine load
            for _, engine in ENGINES:
                CompositeExperts.engine = engine
                w, c = time.perf_counter(), time.process_time()
                outputs[engine] = calpipe.protect(df, scores="scores", **kw)
                wall[engine].append(time.perf_counter() - w)
                cpu[engine].append(time.process_time() - c)
    finally:
        CompositeExperts.engine = default
    same = outputs["fused"].equals(outputs["per-input"])
    named = "" if inputs is None else f" with inputs {inputs}"
    tab = Table(
        f"25. The K = {k} default{named}, per-input engine vs the K-class lanes kernel "
        f"(`calpipe.protect`, {n:,} events, {n_streams:,} streams, time-ordered)",
        ["run", f"wall s (best of {repeat})", "CPU s (best)", "events/s (wall)",
         "vs per-input (wall)", "vs per-input (CPU)"],
    )  # fmt: skip
    w0, c0 = min(wall["per-input"]), min(cpu["per-input"])
    for label, engine in ENGINES:
        if inputs is not None:
            label = label.replace("online vector scaling's kernel", "each input's own kernel")
        w, c = min(wall[engine]), min(cpu[engine])
        tab.rows.append([label, f"{w:.3f}", f"{c:.3f}", fmt_rate(n / w),
                         f"{w0 / w:.2f}x faster" if engine == "fused" else "1x",
                         f"{c0 / c:.2f}x faster" if engine == "fused" else "1x"])  # fmt: skip
    tab.notes.append(machine())
    tab.notes.append(
        "One process; the runs alternate (per-input, fused, per-input, ...) and each row is its "
        "best. `calpipe.protect` includes the sort of the time-ordered frame, the operation list "
        "and the state rows. The two runs' frames are "
        + ("identical (`DataFrame.equals`)." if same else "**not identical** (a bug).")
    )
    return tab


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="smoke")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--inputs", default=None,
                    help="the K-class inputs, comma-separated (e.g. ops,oms); default: config's")  # fmt: skip
    args = ap.parse_args(argv)
    inputs = None if args.inputs is None else tuple(args.inputs.split(","))
    print(measure(args.size, args.repeat, args.classes, inputs).markdown())


if __name__ == "__main__":
    main()
