"""Measurement 16 (BENCHMARKS.md): the default method (``composite-experts``) against its compute
floor, before and after its lanes kernel (issue #33).

``calpipe.protect`` with the default, time-ordered events over many streams (sort included), run
three ways in one process, alternating (floor, before, ..., after, floor, ...), best of each:

* **before**: each input's own kernel, then the mixture one stream at a time
  (``CompositeExperts.engine = "per-stream"``: the kernels before lanes);
* **per-input**: each input's own kernel, then the mixture in SIMD lanes;
* **after**: the inputs (OPS, OBS, two decay-beta, decay-venn-abers) learnt inside the mixture's lanes kernel
  (:mod:`calpipe.kernels.expert_lanes`; the default engine).

The floor is issue #33's: a numpy pass that only evaluates the default's Cox terms (the base
and each input x 21 functions: 105 with issue #33's four inputs, 126 with the five of
``config.EXPERT_INPUTS_BINARY`` since session 30) on the same number of events, the cheapest
honest numpy form (:func:`benchmarks.run.cox_floor` over the input columns). All three give the same bits
(tests/calibrators/test_experts_engines.py); the table checks it on the run itself.
"""

from __future__ import annotations

import numpy as np

from benchmarks.run import SEED, Table, best_of, cox_floor, event_frame, fmt_rate

#: (events, streams) of the measurement.
SIZES = {"smoke": (100_000, 100), "full": (1_000_000, 1_000)}
ENGINES = (
    ("before: inputs' own kernels, mixture one stream at a time", "per-stream"),
    ("inputs' own kernels, mixture in lanes", "per-input"),
    ("after: inputs and mixture in one lanes kernel (the default)", "fused"),
)


def measure(size_name: str, repeat: int) -> Table:
    import calpipe
    from calpipe import config
    from calpipe.calibrators.experts import CompositeExperts

    n, n_streams = SIZES[size_name]
    df = event_frame(n, n_streams, "time")
    rng = np.random.default_rng(SEED + 16)
    base = np.clip(df["score"].to_numpy(), 1e-3, 1 - 1e-3)
    # the input columns (the base and a forecast near it per input): the floor's cost does not
    # depend on the values
    near = [np.clip(base + rng.normal(0, 0.05, n), 1e-3, 1 - 1e-3)
            for _ in config.EXPERT_INPUTS_BINARY]  # fmt: skip
    q = np.ascontiguousarray(np.vstack([base, *near]))
    alphas, betas = config.EXPERT_COX_ALPHAS, config.EXPERT_COX_BETAS
    n_terms = q.shape[0] * len(alphas) * len(betas)
    default = CompositeExperts.engine
    times: dict[str, list[float]] = {"floor": [], **{e: [] for _, e in ENGINES}}
    outputs = {}
    try:
        for _, engine in ENGINES:  # compile / load the numba cache
            CompositeExperts.engine = engine
            calpipe.protect(df.head(5_000))
        for _ in range(repeat):  # alternating, so that every row sees the same machine load
            times["floor"].append(best_of(lambda: cox_floor(q, alphas, betas), 1))
            for _, engine in ENGINES:
                CompositeExperts.engine = engine
                res = {}
                times[engine].append(best_of(lambda r=res: r.setdefault("o", calpipe.protect(df)),
                                             1))  # fmt: skip
                outputs[engine] = res["o"]
    finally:
        CompositeExperts.engine = default
    same = all(outputs[e].equals(outputs["per-stream"]) for _, e in ENGINES)
    floor = min(times["floor"])
    tab = Table(
        f"16. The default at its compute floor (`calpipe.protect`, {n:,} events, {n_streams:,} "
        "streams, time-ordered)",
        ["run", f"wall s (best of {repeat})", "events/s", "vs floor", "vs before", "target",
         "verdict"],
    )  # fmt: skip
    tab.rows.append([f"numpy: evaluate the {n_terms} Cox terms only ({q.shape[0]} inputs x "
                     f"{len(alphas) * len(betas)} functions)", f"{floor:.3f}",
                     fmt_rate(n / floor), "1x", "", "", ""])  # fmt: skip
    before = min(times["per-stream"])
    for label, engine in ENGINES:
        t = min(times[engine])
        target = verdict = ""
        if engine == "fused":
            target = "<= 1x (goal 0.5x)"
            verdict = "met" if t <= floor else "**missed**"
        tab.rows.append([label, f"{t:.3f}", fmt_rate(n / t), f"{t / floor:.2f}x",
                         f"{before / t:.2f}x faster" if engine != "per-stream" else "",
                         target, verdict])  # fmt: skip
    tab.notes.append(
        "One process; the runs alternate (floor, before, per-input, after, floor, ...) and each "
        "row is its best. `calpipe.protect` includes the sort of the time-ordered frame, the "
        "operation list and the state rows."
    )
    tab.notes.append(
        "The three runs' frames are "
        + ("identical (`DataFrame.equals`)." if same else "**not identical** (a bug).")
    )
    return tab


#: (events, streams of the tiny-stream run) of the many-tiny-streams measurement: 10 events a
#: stream, issue #33's case.
TINY = {"smoke": (100_000, 10_000), "full": (1_000_000, 100_000)}


def measure_tiny(size_name: str, repeat: int) -> Table:
    """Issue #33's "many tiny streams": the default through ``calpipe.protect`` on the same
    number of time-ordered events as one stream and as streams of 10 events, alternating in
    one process (the per-stream state, ~760 values, is what the second run adds)."""
    import calpipe

    n, n_tiny = TINY[size_name]
    one = event_frame(n, 1, "time")
    tiny = event_frame(n, n_tiny, "time")
    calpipe.protect(one.head(5_000))  # compile / load the numba cache
    calpipe.protect(tiny.head(5_000))
    times: dict[str, list[float]] = {"one": [], "tiny": []}
    for _ in range(repeat):
        times["one"].append(best_of(lambda: calpipe.protect(one), 1))
        times["tiny"].append(best_of(lambda: calpipe.protect(tiny), 1))
    t1, tt = min(times["one"]), min(times["tiny"])
    tab = Table(
        f"16b. Many tiny streams: the default on {n:,} events as one stream and as "
        f"{n_tiny:,} streams of {n // n_tiny} (`calpipe.protect`, time-ordered)",
        ["run", f"wall s (best of {repeat})", "events/s", "vs one stream", "target", "verdict"],
    )  # fmt: skip
    tab.rows.append(["one stream", f"{t1:.3f}", fmt_rate(n / t1), "1x", "", ""])
    tab.rows.append([f"{n_tiny:,} streams of {n // n_tiny} events", f"{tt:.3f}",
                     fmt_rate(n / tt), f"{tt / t1:.2f}x", "<= 1.5x",
                     "met" if tt <= 1.5 * t1 else "**missed**"])  # fmt: skip
    tab.notes.append(
        "One process; the two runs alternate and each row is its best. One stream runs one "
        "lane at a time (no SIMD across streams); the tiny streams run in lanes and each carries "
        "its own state (~760 values), read and written once per call."
    )
    return tab
