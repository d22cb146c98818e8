"""Mean log loss and smooth ECE of composite-experts with candidate inputs on the quality
suite's binary streams (cached by np_streams.py). Usage: np_measure.py NAME=SPEC1,SPEC2,... ..."""

import json
import sys
import time

from benchmarks import quality as Q
from benchmarks.studies.nonparametric_input.np_measure_lib import STREAMS, load, run
from calpipe import config

DEF = list(config.EXPERT_INPUTS_BINARY)
D = load()

out = sys.argv[1]
only = None
args = sys.argv[2:]
if args and args[0].startswith("streams="):
    only = args[0][8:].split(",")
    args = args[1:]
for arg in args:
    name, _, spec = arg.partition("=")
    inputs = [x for x in spec.split(",") if x]
    inputs = [DEF[int(x[1:])] if x.startswith("@") else x for x in inputs]
    for st in STREAMS:
        if only and st not in only:
            continue
        p, y = D[st + "|p"], D[st + "|y"]
        s = Q.Stream(st, p, y, bool(D[st + "|drift"]), "")
        t = time.perf_counter()
        q = run(p, y, inputs)
        ev = Q.evaluate(s, q, None)
        row = {
            "config": name,
            "inputs": inputs,
            "stream": st,
            "n": len(y),
            "log_loss": ev["log_loss"],
            "smooth_ece": ev["smooth_ece"],
            "seconds": time.perf_counter() - t,
        }
        print(json.dumps(row), flush=True)
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
