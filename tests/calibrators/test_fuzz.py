"""Fuzz (hypothesis) of the calibrator objects: over arbitrary arrays, ``run`` either returns
valid probabilities and a finite martingale, or raises one of calpipe's own errors (never a
crash, a NaN or an out-of-range probability). Regression of the hardening issue: 3 labels for
n scores read out of bounds, NaN scores poisoned every later output."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calpipe.calibrators import METHODS, make_calibrator
from calpipe.errors import CalpipeError

#: Small windows so that batch methods fit within the fuzzed streams.
_SMALL = {"window": 5, "refit_every": 3}


def _calibrator(name: str):
    params = _SMALL if "window" in METHODS[name].parameters else {}
    return make_calibrator(name, **params)


_edge = st.sampled_from([0.0, 1.0, 1e-300, 1 - 1e-16, 0.5])
_bad = st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.5, 1.5])


@st.composite
def _arrays(draw):
    """Two valid streams (extreme but legal values) for one corrupt one (NaN/inf/out-of-range
    scores, labels outside the classes, label arrays of another length)."""
    n = draw(st.integers(0, 40))
    k = draw(st.sampled_from([2, 2, 3]))
    corrupt = draw(st.integers(0, 2)) == 0
    value = st.one_of(st.floats(0, 1), _edge, *([_bad] if corrupt else []))
    if k == 2:
        scores = np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=float)
    else:
        raw = np.array(draw(st.lists(st.one_of(st.floats(0, 1), _edge), min_size=n * k,
                                     max_size=n * k)), dtype=float).reshape(n, k)  # fmt: skip
        raw[raw.sum(axis=1) == 0] = 1.0
        scores = raw / raw.sum(axis=1, keepdims=True)
        if corrupt and n:
            scores[draw(st.integers(0, n - 1)), 0] = draw(_bad)
    m = draw(st.integers(0, 45)) if corrupt and draw(st.booleans()) else n
    classes = [-1, *range(k)] + ([k, 5, -3] if corrupt else [])
    labels = np.array(draw(st.lists(st.sampled_from(classes), min_size=m, max_size=m)),
                      dtype=np.int64)  # fmt: skip
    return scores, labels


@pytest.mark.parametrize("name", sorted(METHODS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_arrays())
def test_run_returns_valid_probabilities_or_a_calpipe_error(name, data):
    scores, labels = data
    cal = _calibrator(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            out, state = cal.run(scores, labels)
        except CalpipeError:
            valid = labels.shape[0] == scores.shape[0] and bool(np.all(np.isfinite(scores)))
            valid = valid and scores.min(initial=0) >= 0 and scores.max(initial=1) <= 1
            k = 2 if scores.ndim == 1 else scores.shape[1]
            valid = valid and bool(np.all((labels >= -1) & (labels < k)))
            if valid and (k == 2 or cal.classes != "binary"):
                raise  # a valid stream the method takes must run
            return
    p = out.protected
    assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
    if p.ndim == 2 and p.shape[0]:
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    assert np.all(np.isfinite(out.log10_martingale))
    assert np.all(np.isfinite(state.weights))


@st.composite
def _frames(draw):
    """Event frames with occasional nulls, duplicates, NaN/out-of-range scores, bad labels."""
    import polars as pl

    n = draw(st.integers(0, 30))
    corrupt = draw(st.integers(0, 2)) == 0
    score = st.one_of(st.floats(0, 1), _edge, *([_bad, st.none()] if corrupt else []))
    label = st.sampled_from([None, 0, 1, *([2, -1] if corrupt else [])])
    ids = st.integers(0, 10 if corrupt else 10**6)  # a small range makes duplicates
    return corrupt, pl.DataFrame(
        {
            "stream": draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n)),
            "event_id": draw(st.lists(ids, min_size=n, max_size=n, unique=not corrupt)),
            "score": draw(st.lists(score, min_size=n, max_size=n)),
            "label": draw(st.lists(label, min_size=n, max_size=n)),
        },
        schema={"stream": pl.String, "event_id": pl.Int64, "score": pl.Float64,
                "label": pl.Int64},
    )  # fmt: skip


@pytest.mark.parametrize("name", ["composite-experts", "composite-jumper", "ops", "venn-abers"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=_frames())
def test_protect_returns_valid_rows_or_a_calpipe_error(name, frame):
    import calpipe

    corrupt, frame = frame
    params = _SMALL if "window" in METHODS[name].parameters else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            out = calpipe.protect(frame, by="stream", order_by="event_id", method=name, **params)
        except CalpipeError:
            if not corrupt:
                raise  # a valid frame must run
            return
    assert out.height == frame.height
    p = out["protected_score"].to_numpy()
    assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
    assert np.all(np.isfinite(out["log10_martingale"].to_numpy()))
