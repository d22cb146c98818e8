"""How often the default's forgotten-bin inputs refit (docs/studies/refit-cadence.md).

``python -m benchmarks.studies.refit_cadence`` prints the page's two tables: the default's CPU
seconds on 3M events of ``benchmarks.pipeline``'s day (1,000 streams, best of two) and its mean
log loss / smooth ECE on the quality suite's seven binary streams, for each cadence. The streams
come from the nonparametric-input study's cache (``python -m
benchmarks.studies.nonparametric_input.np_streams`` writes it once).
"""

from __future__ import annotations

import time

import numpy as np

import calpipe
from benchmarks import pipeline
from benchmarks import quality as Q
from benchmarks.studies.nonparametric_input import np_measure_lib as L
from calpipe import metrics


def inputs(every_1000: int, every_4000: int) -> list[str]:
    """The default's binary inputs with the forgotten-bin ones refitting every so many labels."""
    return ["ops", "obs", f"decay-beta:memory=1000:refit_every={every_1000}",
            f"decay-beta:memory=4000:refit_every={every_4000}",
            f"decay-venn-abers:memory=4000:refit_every={every_4000}"]  # fmt: skip


CADENCES = {"W/10": inputs(100, 400), "W/5": inputs(200, 800), "W/4": inputs(250, 1000)}


def speed() -> None:
    day = pipeline.day_events(3_000_000, 1_000, pipeline.DAY0, pipeline.SEED)
    print(f"\n{Q.cpu_model()}\n\n| refit every | CPU s |\n|---|---:|")
    runs = {k: ("composite-experts", {"inputs": v}) for k, v in CADENCES.items()}
    runs["composite-jumper, for scale"] = ("composite-jumper", {})
    for name, (method, params) in runs.items():
        calpipe.protect(day.head(50_000), method=method, **params)  # compiled and warm
        best = np.inf
        for _ in range(2):
            t = time.process_time()
            calpipe.protect(day, method=method, **params)
            best = min(best, time.process_time() - t)
        print(f"| {name} | {best:.2f} |", flush=True)


def quality() -> None:
    data = L.load()
    print("\n| refit every | " + " | ".join(L.STREAMS) + " |\n|---|" + "---:|" * len(L.STREAMS))
    for name, inp in CADENCES.items():
        cells = []
        for s in L.STREAMS:
            p, y = data[s + "|p"], data[s + "|y"]
            f = L.run(p, y, inp)
            ll = Q.event_losses(f, y).mean()
            one = np.zeros(len(y), np.int64)
            cells.append(
                f"{ll:.4f} / {metrics.grouped_smooth_ece(f, y.astype(float), one, 1)[0]:.4f}"
            )
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    speed()
    quality()
