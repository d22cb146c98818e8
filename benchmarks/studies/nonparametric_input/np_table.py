"""Markdown tables from the np_measure.py results (jsonl files given)."""

import json
import sys

from benchmarks.studies.nonparametric_input.np_measure_lib import STREAMS

rows = {}
only = None
args = sys.argv[1:]
if args and args[0].startswith("--only="):
    only = args[0][7:].split(",")
    args = args[1:]
for f in args:
    for line in open(f):
        r = json.loads(line)
        rows[(r["config"], r["stream"])] = r
ANCHOR = {  # QUALITY.md (full suite, commit 9f20710): best anchor by log loss, its smooth ECE
    "bank-time": ("OPS", 0.2683, 0.0154),
    "bank-by-age": ("Platt (trailing)", 0.2054, 0.0148),
    "bank-by-balance": ("Platt (trailing)", 0.2439, 0.0119),
    "bank-random": ("Platt (trailing)", 0.2141, 0.0125),
    "phishing-arf": ("OPS", 0.2881, 0.0272),
    "bank-nb": ("HOPS", 0.3132, 0.0142),
    "approval-daily": ("Platt (frozen)", 0.6900, 0.0331),
}
configs = []
for c, _ in rows:
    if c not in configs:
        configs.append(c)
if only:
    configs = only


def table(metric, digits=4):
    out = [
        "| stream | n | " + " | ".join(configs) + " | best anchor |",
        "|---|---:|" + "---:|" * len(configs) + "---|",
    ]
    for s in STREAMS:
        n = next(r["n"] for (c, st), r in rows.items() if st == s)
        cells = []
        for c in configs:
            r = rows.get((c, s))
            cells.append("" if r is None else f"{r[metric]:.{digits}f}")
        a = ANCHOR[s]
        av = a[1] if metric == "log_loss" else a[2]
        out.append(f"| {s} | {n:,} | " + " | ".join(cells) + f" | {a[0]} {av:.4f} |")
    return "\n".join(out)


print("Mean log loss\n\n" + table("log_loss") + "\n\nSmooth ECE\n\n" + table("smooth_ece"))
