"""calpipe.river: river's online protocol over calpipe's calibrators (#14).

The oracle is :func:`calpipe.protect` over the base probabilities the wrapped model gave, each
label known at its own event: the online wrapper must equal it bit for bit, on the fast
per-event kernel (binary log-loss mixtures) and on the batch-kernel path (every other method,
K classes).
"""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from river import checks, datasets, linear_model

import calpipe
from calpipe.errors import ParameterError
from calpipe.river import CalibrationMonitor, Protected


class Recorder:
    """A river classifier (the protocol: predict_proba_one, learn_one) around a real one,
    recording the base probabilities Protected received."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def predict_proba_one(self, x):
        out = self.model.predict_proba_one(x)
        self.seen.append(dict(out))
        return out

    def learn_one(self, x, y):
        self.model.learn_one(x, y)


def _replay(method, params=None, n=600):
    rec = Recorder(linear_model.LogisticRegression())
    model = Protected(rec, method=method, params=params)
    forecasts, labels = [], []
    for x, y in itertools.islice(datasets.Phishing(), n):
        forecasts.append(model.predict_proba_one(x)[True])
        model.learn_one(x, y)
        labels.append(int(y))
    base = [d.get(True, 0.0) / (d.get(True, 0.0) + d.get(False, 0.0)) for d in rec.seen]
    return model, np.array(forecasts), np.array(base), np.array(labels)


@pytest.mark.parametrize(
    ("method", "params"),
    [("composite-jumper", None), ("jumper", {"family": "quadratic"}), ("platt", {"window": 50, "refit_every": 10}),
     ("composite-experts", None)],
)  # fmt: skip
def test_protected_equals_protect_over_the_models_probabilities(method, params):
    model, forecasts, base, labels = _replay(
        method, params, n=600 if method != "composite-experts" else 150
    )
    assert len(base) == len(forecasts)  # one model call per event: learn_one reused predict's
    events = pl.DataFrame({"event_time": np.arange(len(base)), "event_id": np.arange(len(base)),
                           "score": base, "label": labels.astype(np.int32)})  # fmt: skip
    ref = calpipe.protect(events, method=method, **(params or {}))
    np.testing.assert_array_equal(forecasts, ref["protected_score"].to_numpy())
    assert model.log10_martingale == ref["log10_martingale"][-1]


def test_protected_multiclass_equals_protect():
    class Fixed:  # a 3-class model whose probabilities are a column of the data
        def predict_proba_one(self, x):
            return {"a": x["pa"], "b": x["pb"], "c": 1 - x["pa"] - x["pb"]}

        def learn_one(self, x, y):
            pass

    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(3), size=300)
    ys = np.array([rng.choice(3, p=q[::-1]) for q in probs])  # miscalibrated on purpose
    model = Protected(Fixed(), classes=("a", "b", "c"))
    out = []
    for q, y in zip(probs, ys, strict=True):
        x = {"pa": q[0], "pb": q[1]}
        out.append(list(model.predict_proba_one(x).values()))
        model.learn_one(x, "abc"[y])
    events = pl.DataFrame({"event_time": np.arange(300), "event_id": np.arange(300),
                           "scores": [list(r) for r in probs], "label": ys.astype(np.int32)})  # fmt: skip
    ref = calpipe.protect(events, scores="scores", method="composite-jumper")
    np.testing.assert_allclose(
        np.array(out), np.array(ref["protected_scores"].to_list()), rtol=0, atol=1e-15
    )
    # (the model's third probability is 1 - pa - pb, an ulp from the data's: not bit for bit)
    assert model.log10_martingale == pytest.approx(ref["log10_martingale"][-1], rel=1e-14)
    assert model.log10_martingale > 0


def test_protected_passes_rivers_estimator_checks_and_refuses_bad_labels():
    checks.check_estimator(Protected(linear_model.LogisticRegression()))
    model = Protected(linear_model.LogisticRegression())
    with pytest.raises(ValueError, match=r"label 'yes' is not one of classes=\(False, True\)"):
        model.learn_one({"a": 1.0}, "yes")
    with pytest.raises(ParameterError, match="classes must be >= 2 distinct labels"):
        Protected(linear_model.LogisticRegression(), classes=(1, 1))
    with pytest.raises(ParameterError, match="unknown method"):
        Protected(linear_model.LogisticRegression(), method="nope")


def test_monitor_false_alarms_at_most_one_in_threshold_and_detects_drift():
    """Ville's inequality: calibrated forecasts reach S = 100 in at most 1 % of streams."""
    rng = np.random.default_rng(11)
    n_streams, n = 400, 400
    alarms = 0
    for _ in range(n_streams):
        mon = CalibrationMonitor()
        p = rng.uniform(0.05, 0.95, n)
        y = rng.uniform(size=n) < p
        for pi, yi in zip(p.tolist(), y.tolist(), strict=True):
            if mon.update(pi, yi).drift_detected:
                alarms += 1
                break
    assert alarms <= 0.01 * n_streams
    mon = CalibrationMonitor(threshold=20.0)
    p = rng.uniform(0.05, 0.95, 6000)
    y = rng.uniform(size=p.size) < np.where(np.arange(p.size) < 1000, p, p**3)
    hits = [
        i
        for i, (a, b) in enumerate(zip(p.tolist(), y.tolist(), strict=True))
        if mon.update(a, b).drift_detected
    ]
    assert (
        hits and hits[0] > 1000 and mon.n_detections == len(hits) >= 2
    )  # reset: a new test each time
    assert mon.update({False: 0.5, True: 0.5}, 1) is mon  # dicts of class probabilities work too
    once = CalibrationMonitor(threshold=20.0, reset=False)
    for a, b in zip(p.tolist(), y.tolist(), strict=True):
        once.update(a, b)
    assert once.n_detections == 1 and once.log10_martingale > 10
    with pytest.raises(ParameterError, match="threshold must be > 1"):
        CalibrationMonitor(threshold=1.0)
