"""Paired difference of mean log loss (candidate - default) per stream with a 95 % circular
block bootstrap interval (blocks of ceil(n^(1/3)) events, 1,000 resamples, seed 0), and each
one's smooth ECE. Usage: np_paired.py SPEC [SPEC...] (the inputs added to the default)."""

import math
import sys

import numpy as np

from benchmarks import quality as Q
from benchmarks.studies.nonparametric_input.np_measure_lib import STREAMS, load, run
from calpipe import config

D = load()

DEF = list(config.EXPERT_INPUTS_BINARY)
add = sys.argv[1:]
rng = np.random.default_rng(0)
print("| stream | n | default | + " + ", ".join(add) + " | difference [95 %] |")
for st in STREAMS:
    p, y = D[st + "|p"], D[st + "|y"]
    a = run(p, y, DEF)
    b = run(p, y, DEF + add)
    la, lb = Q.event_losses(a, y), Q.event_losses(b, y)
    d = lb - la
    n = len(d)
    L = math.ceil(n ** (1 / 3))
    nb = math.ceil(n / L)
    dd = np.r_[d, d[:L]]
    cs = np.r_[0, np.cumsum(dd)]
    means = []
    for _ in range(1000):
        starts = rng.integers(0, n, nb)
        tot = (cs[starts + L] - cs[starts]).sum()
        means.append(tot / (nb * L))
    lo, hi = np.quantile(means, [0.025, 0.975])
    print(
        f"| {st} | {n:,} | {la.mean():.4f} | {lb.mean():.4f} | {d.mean():+.5f} [{lo:+.5f}, {hi:+.5f}] |",
        flush=True,
    )
