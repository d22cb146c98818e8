"""The CUSUM e-detector kernel (calpipe.kernels.change_points) against the recursion of Shin,
Ramdas & Rinaldo written as an obvious loop over products, and its validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.kernels.change_points import NO_RUN, cusum_detect


def slow_cusum(factors: list[float], log10_a: float):
    """M_n = L_n * max(M_{n-1}, 1) with products (not logs), the start of the max's product,
    up to the first M_n >= A: (index of the crossing or -1, log10 M there, start, labels)."""
    m, start = 0.0, None
    for n, f in enumerate(factors):
        if m <= 1.0:
            m, start = 1.0, n
        m *= 10.0**f
        if np.log10(m) >= log10_a:
            return n, np.log10(m), start, n - start + 1
    return -1, None, None, None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        # (|log10 L| >= 1e-3: a product within an ulp of 1 ties max(M, 1), where the log and
        # the product forms may choose different starts of equal value)
        st.lists(st.floats(-1.5, 1.5).filter(lambda x: abs(x) >= 1e-3), max_size=40),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.2, 3.0),
)
def test_the_kernel_equals_the_slow_loop_of_the_paper(streams, log10_a):
    f = np.array([x for s in streams for x in s], dtype=np.float64)
    offsets = np.cumsum([0] + [len(s) for s in streams])
    when = np.arange(f.shape[0], dtype=np.int64) * 7
    s_n = len(streams)
    c, start, count, settle, freeze, hit, hit_c, hit_start, hit_n = cusum_detect(
        offsets, f, when, np.zeros(s_n), np.full(s_n, NO_RUN), np.zeros(s_n, np.int64), log10_a
    )
    for s, factors in enumerate(streams):
        n, log_m, first, labels = slow_cusum(factors, log10_a)
        assert hit[s] == (-1 if n < 0 else offsets[s] + n)
        if n >= 0:
            assert hit_c[s] == pytest.approx(log_m, abs=1e-9)
            assert hit_start[s] == when[offsets[s] + first]
            assert hit_n[s] == labels
            assert (c[s], start[s], count[s], settle[s]) == (0.0, NO_RUN, 0, 0)  # restarted
        assert freeze[s] == (n >= 0)  # (no settling: the reference is frozen at the crossing)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=60), st.data())
def test_chunks_with_the_state_carried_equal_one_pass(factors, data):
    """Two calls, the state of the first handed to the second, give the one pass's crossing
    (until the first crossing: a night's detector stops there)."""
    f = np.array(factors)
    when = np.arange(f.shape[0], dtype=np.int64)
    cut = data.draw(st.integers(1, f.shape[0] - 1))
    one = cusum_detect(np.array([0, f.shape[0]]), f, when, np.zeros(1), np.array([NO_RUN]),
                       np.zeros(1, np.int64), 2.0)  # fmt: skip
    a = cusum_detect(np.array([0, cut]), f[:cut], when[:cut], np.zeros(1), np.array([NO_RUN]),
                     np.zeros(1, np.int64), 2.0)  # fmt: skip
    if a[5][0] >= 0:
        assert one[5][0] == a[5][0] and one[6][0] == a[6][0]
        return
    b = cusum_detect(np.array([0, f.shape[0] - cut]), f[cut:], when[cut:], a[0], a[1], a[2], 2.0)
    assert one[5][0] == (-1 if b[5][0] < 0 else b[5][0] + cut)
    for x, y in zip(one[6:], b[6:], strict=True):
        assert x[0] == pytest.approx(y[0], rel=1e-12, abs=1e-12)
    for x, y in zip(one[:3], b[:3], strict=True):
        assert x[0] == pytest.approx(y[0], rel=1e-12, abs=1e-12)


def slow_settling(factors: list[float], log10_a: float, settle_labels: int, settle0: int):
    """The detector over one night's factors with settling, as the paper's CUSUM plus the
    rule of calpipe.night.changes: labels while settling are not counted; the night's rest
    is not counted once the settling ends (the reference changes at the night's end) or, with
    no settling, once it crossed. (crossing index or -1, freeze, settle left)."""
    settle, m, hit = settle0, 0.0, -1
    for n, f in enumerate(factors):
        if settle > 0:
            settle -= 1
            if settle == 0:
                return hit, True, 0
            continue
        if hit >= 0:
            break
        m = max(m, 1.0) * 10.0**f
        if np.log10(m) >= log10_a:
            hit, m, settle = n, 0.0, settle_labels
            if settle == 0:
                return hit, True, 0
    return hit, False, settle


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1.0, 1.5).filter(lambda x: abs(x) >= 1e-3), max_size=60),
    st.integers(0, 8),
    st.integers(0, 5),
)
def test_settling_after_a_crossing_equals_the_slow_loop(factors, settle_labels, settle0):
    """After a crossing the stream learns ``settle_labels`` labels uncounted, and the reference
    is frozen in the call its settling ends; one crossing a call at most."""
    f = np.array(factors, dtype=np.float64)
    out = cusum_detect(np.array([0, f.shape[0]]), f, np.arange(f.shape[0], dtype=np.int64),
                       np.zeros(1), np.array([NO_RUN]), np.zeros(1, np.int64), 1.0,
                       np.array([settle0]), settle_labels)  # fmt: skip
    hit, freeze, settle = slow_settling(factors, 1.0, settle_labels, settle0)
    assert (int(out[5][0]), bool(out[4][0]), int(out[3][0])) == (hit, freeze, settle)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"offsets": np.array([0, 3])}, "offsets must rise"),
        ({"log10_factor": np.array([0.1, np.inf])}, "finite"),
        ({"c0": np.array([-1.0])}, ">= 0"),
        ({"log10_threshold": 0.0}, "log10_threshold"),
        ({"when": np.array([1])}, "one `when` per factor"),
        ({"settle0": np.array([-1])}, "settle"),
    ],
)
def test_bad_inputs_are_refused_with_the_rule(change, message):
    args = {
        "offsets": np.array([0, 2]), "log10_factor": np.array([0.1, 0.2]),
        "when": np.array([1, 2]), "c0": np.zeros(1), "start0": np.array([NO_RUN]),
        "count0": np.zeros(1, np.int64), "log10_threshold": 2.0,
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        cusum_detect(**{**args, **change})
