"""calpipe.protect of measurement 16's frame (benchmarks.run.event_frame: 1M events, 1,000
streams, time-ordered) with the default and with candidate input sets, alternated in one
process, 3 repeats: wall and process CPU seconds; ratios to the default of the same round."""

import json
import sys
import time

import calpipe
from benchmarks.run import event_frame
from calpipe import config

n, s = int(sys.argv[1]), int(sys.argv[2])
DEF = tuple(config.EXPERT_INPUTS_BINARY)
configs = {"default": DEF}
for arg in sys.argv[3:]:
    name, _, spec = arg.partition("=")
    configs[name] = tuple(x for x in spec.split(",") if x)
df = event_frame(n, s, "time")
for inp in configs.values():  # compile / load caches
    calpipe.protect(df.head(5_000), inputs=inp)
res = {k: [] for k in configs}
for r in range(3):
    for name, inp in configs.items():
        w, c = time.perf_counter(), time.process_time()
        calpipe.protect(df, inputs=inp)
        res[name].append((time.perf_counter() - w, time.process_time() - c))
        print(r, name, "wall {:.2f} cpu {:.2f}".format(*res[name][-1]), flush=True)
for name in configs:
    rw = [a[0] / b[0] for a, b in zip(res[name], res["default"], strict=False)]
    rc = [a[1] / b[1] for a, b in zip(res[name], res["default"], strict=False)]
    print(
        json.dumps(
            {
                "config": name,
                "wall": [round(a[0], 2) for a in res[name]],
                "cpu": [round(a[1], 2) for a in res[name]],
                "wall_ratio": [round(x, 2) for x in rw],
                "cpu_ratio": [round(x, 2) for x in rc],
                "best_wall_ratio": round(
                    min(a[0] for a in res[name]) / min(a[0] for a in res["default"]), 2
                ),
                "best_cpu_ratio": round(
                    min(a[1] for a in res[name]) / min(a[1] for a in res["default"]), 2
                ),
            }
        ),
        flush=True,
    )
