"""Build the quality suite's seven binary streams once and cache them (npz)."""

import numpy as np

from benchmarks import quality as Q
from benchmarks.studies.nonparametric_input.np_measure_lib import CACHE

out = CACHE
out.parent.mkdir(parents=True, exist_ok=True)
makers = {
    "bank-time": lambda: Q.bank_time(None),
    "bank-by-age": lambda: Q.bank_sorted("age", None),
    "bank-by-balance": lambda: Q.bank_sorted("balance", None),
    "bank-random": lambda: Q.bank_sorted(None, None),
    "phishing-arf": lambda: Q.river_stream("phishing", "ARF", 1, None),
    "bank-nb": lambda: Q.bank_naive_bayes(None),
    "approval-daily": lambda: Q.approval_daily(),
}
d = {}
for k, f in makers.items():
    s = f()
    d[k + "|p"] = s.p
    d[k + "|y"] = s.y
    d[k + "|drift"] = np.array(s.drift)
    print(k, len(s.y), flush=True)
np.savez(out, **d)
