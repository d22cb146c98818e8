"""Measurement 24 (BENCHMARKS.md): a big call in pieces against the same call in one kernel call
(issue #33).

``calpipe.protect_with_state`` runs a call of :data:`calpipe.config.PIECES_MIN_EVENTS` events or
more as pieces of about :data:`calpipe.config.PIECE_OPS` operations with the kernel state
carried (:mod:`calpipe.engine.pieces`; the same bits, tests/engine/test_pieces.py). Here the
same time-ordered events go through both paths in one process, alternating (one call, pieces,
one call, ...), best of each, for the two methods the nightly targets name and two stream
counts: the threshold is set to 0 for "pieces" and above the call's size for "one call". The
table checks that both gave the same protected scores on the run itself.
"""

from __future__ import annotations

import numpy as np

from benchmarks.run import Table, best_of, event_frame, fmt_rate

#: (events, stream counts) of the measurement; full: the nightly run's batch size.
SIZES = {"smoke": (200_000, (100,)), "full": (2_000_000, (1_000, 10_000))}
METHODS = ("composite-experts", "composite-jumper")


def measure(size_name: str, repeat: int) -> Table:
    import calpipe
    from calpipe import config

    n, stream_counts = SIZES[size_name]
    tab = Table(
        f"24. A big call in pieces vs one kernel call (`protect_with_state`, {n:,} events, "
        "time-ordered)",
        ["method", "streams", f"one call s (best of {repeat})", "in pieces s", "ratio",
         "events/s in pieces", "same scores"],
    )  # fmt: skip
    saved = config.PIECES_MIN_EVENTS
    try:
        for n_streams in stream_counts:
            df = event_frame(n, n_streams, "time")
            for method in METHODS:
                calpipe.protect_with_state(df.head(5_000), method=method)  # compile / load
                times: dict[str, list[float]] = {"one": [], "pieces": []}
                out = {}
                for _ in range(repeat):  # alternating: both see the same machine load
                    for key, threshold in (("one", n + 1), ("pieces", 0)):
                        config.PIECES_MIN_EVENTS = threshold

                        def go(k=key, m=method, d=df, o=out):
                            o[k] = calpipe.protect_with_state(d, method=m).scores

                        times[key].append(best_of(go, 1))
                one, pieces = min(times["one"]), min(times["pieces"])
                same = np.array_equal(
                    out["one"]["protected_score"].to_numpy(),
                    out["pieces"]["protected_score"].to_numpy(),
                    equal_nan=True,
                )
                tab.rows.append([method, f"{n_streams:,}", f"{one:.3f}", f"{pieces:.3f}",
                                 f"{pieces / one:.2f}x", fmt_rate(n / pieces),
                                 "yes" if same else "**NO**"])  # fmt: skip
    finally:
        config.PIECES_MIN_EVENTS = saved
    tab.notes.append(
        f"Pieces of ~{config.PIECE_OPS:,} operations (`config.PIECE_OPS`); the nightly run's "
        f"calls of >= {saved:,} events (`config.PIECES_MIN_EVENTS`) run in pieces."
    )
    return tab
