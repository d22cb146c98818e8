r"""Venn-ABERS on exponentially forgotten score-bin counts (``decay-venn-abers``).

The windowed batch method ``venn-abers`` (:mod:`calpipe.kernels.venn_abers`) refits the
inductive Venn-ABERS predictor (IVAP; Vovk & Petej 2014, Algorithm 1; paper 003's isotonic
calibration, made a Venn predictor) on the trailing W labels: its state holds the window (2W
floats) and it cannot run in the default's SIMD lanes. This kernel keeps, per stream, only the
labels' counts in decay-beta's B fixed bins of the base log-odds
(:func:`calpipe.kernels.decay_beta.bin_edges`), each count multiplied by lambda = 1 - 2/W at
every label (:mod:`calpipe.kernels.decay_beta`'s exponential window: effective sample size
~ W), and refits the IVAP on the bins:

.. math::

    n^{y}_b \leftarrow \lambda\, n^{y}_b + [b = b(p_t)][y = y_t],\qquad
    p^{(y)}_b = \mathrm{PAV}\bigl(n^1 + [y = 1] e_b,\ n^0 + [y = 0] e_b\bigr)_b,\qquad
    \hat p_b = \frac{p^{(1)}_b}{1 - p^{(0)}_b + p^{(1)}_b},

PAV the weighted pool-adjacent-violators fit of the label frequency, non-decreasing in the bin
(bins of zero weight are skipped), e_b one test event of weight 1 in bin b (the newest label's
weight), and \hat p_b the log-loss merge of [p^(0)_b, p^(1)_b] (Vovk & Petej 2014 §4; the
windowed method's default merge, ``config.VENN_ABERS_MERGE``). The scores of a bin are tied for
the fit, so the map is a step function of the bin: forecast \hat p_{b(p)} from the last refit,
the base itself before ``warmup`` labels. Refits as decay-beta's: after label ``warmup`` and
every ``refit_every`` labels after it, each one 2B PAV passes over B bins (O(B^2)).

State of a stream, O(B): ``[u, g, g n^1 (B), g n^0 (B), \hat p (B)]`` -- labels learnt, the
counts kept multiplied by g = lambda^-(labels since the last rescale) (one division per label
decays every bin, :mod:`calpipe.kernels.decay_beta`), the table of the last refit.

Public entry point: :func:`decay_venn_abers`; the calibrator is
:class:`calpipe.calibrators.decay.DecayVennAbers`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from calpipe.kernels.decay_beta import bin_edges, forget_and_count
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

_HEAD = 2  # u, g


@njit(cache=True)
def pav_value_at(pos, neg, b, add_pos, add_neg, s_sum, s_w, s_last):
    """The weighted PAV fit of the label frequency (non-decreasing over the bins in order) on
    the counts ``pos``/``neg`` with ``add_pos``/``add_neg`` added to bin ``b``, read at bin
    ``b``. Bins of zero weight are skipped; ``s_*`` are scratch stacks of length B (block label
    sums, weights, last bin)."""
    top = -1
    for k in range(pos.shape[0]):
        sp = pos[k]
        sw = pos[k] + neg[k]
        if k == b:
            sp += add_pos
            sw += add_pos + add_neg
        if sw <= 0.0:
            continue
        top += 1
        s_sum[top] = sp
        s_w[top] = sw
        s_last[top] = k
        # merge while the previous block's mean exceeds this one's
        while top > 0 and s_sum[top - 1] * s_w[top] > s_sum[top] * s_w[top - 1]:
            s_sum[top - 1] += s_sum[top]
            s_w[top - 1] += s_w[top]
            s_last[top - 1] = s_last[top]
            top -= 1
    for j in range(top + 1):
        if s_last[j] >= b:
            return s_sum[j] / s_w[j]
    return math.nan  # unreachable: bin b has weight >= 1


@njit(cache=True)
def ivap_table(pos, neg, out, s_sum, s_w, s_last):
    """``out[b]`` = the log-loss merge p1 / (1 - p0 + p1) of the IVAP of a test score in bin b
    (module docstring) for every bin b, on the decayed counts ``pos``/``neg``."""
    for b in range(pos.shape[0]):
        p0 = pav_value_at(pos, neg, b, 0.0, 1.0, s_sum, s_w, s_last)
        p1 = pav_value_at(pos, neg, b, 1.0, 0.0, s_sum, s_w, s_last)
        out[b] = p1 / (1.0 - p0 + p1)


@njit(cache=True, error_model="numpy")
def _decay_venn_abers(x, y, op_event, op_kind, op_offsets, state, lam, edges, eps, warmup,
                      refit_every):  # fmt: skip
    n_bins = edges.shape[0] - 1
    out = np.full(x.shape[0], np.nan)
    st = state.copy()
    cur_pos = np.empty(n_bins)
    cur_neg = np.empty(n_bins)
    s_sum = np.empty(n_bins)
    s_w = np.empty(n_bins)
    s_last = np.empty(n_bins, dtype=np.int64)
    for s in range(op_offsets.shape[0] - 1):
        v = st[s]
        pos = v[_HEAD : _HEAD + n_bins]
        neg = v[_HEAD + n_bins : _HEAD + 2 * n_bins]
        table = v[_HEAD + 2 * n_bins : _HEAD + 3 * n_bins]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            z = _log_odds(x[e], eps)  # decay-beta's clipped log-odds and bin
            k = np.searchsorted(edges[1:-1], z, side="right")
            if op_kind[o] != OP_UPDATE:
                out[e] = table[k] if v[0] >= warmup else x[e]
            if op_kind[o] != OP_FORECAST:
                u = forget_and_count(v, 1, pos, neg, y[e], k, lam)
                if u >= warmup and (u - warmup) % refit_every == 0:
                    for j in range(n_bins):
                        cur_pos[j] = pos[j] / v[1]
                        cur_neg[j] = neg[j] / v[1]
                    ivap_table(cur_pos, cur_neg, table, s_sum, s_w, s_last)
    return out, st


@njit(cache=True)
def _log_odds(p, eps):
    """The kernel's clipped score and log-odds of a base forecast (same operations)."""
    q = min(max(p, eps), 1.0 - eps)
    return math.log(q) - math.log1p(-q)


@njit(cache=True)
def _thresholds(interior, eps):
    """For each interior edge, the smallest double p in (0, 1) whose log-odds (as the kernel
    computes them) is >= the edge: bisection on the doubles' bit patterns (ordered like the
    positive doubles), valid because ln q - ln(1 - q) is non-decreasing in q."""
    out = np.empty(interior.shape[0])
    one = np.array([1.0]).view(np.int64)[0]
    buf = np.empty(1)
    for k in range(interior.shape[0]):
        lo, hi = 0, one  # z(lo) < edge <= z(hi)
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            buf.view(np.int64)[0] = mid
            if _log_odds(buf[0], eps) >= interior[k]:
                hi = mid
            else:
                lo = mid
        buf.view(np.int64)[0] = hi
        out[k] = buf[0]
    return out


def bin_thresholds(n_bins: int, eps: float) -> np.ndarray:
    """The B - 1 scores where the bin changes: score p is in bin #{thresholds <= p} exactly as
    the kernel bins it (the breakpoints of the step map, its SQL form)."""
    return _thresholds(np.ascontiguousarray(bin_edges(n_bins, eps)[1:-1]), float(eps))


def state_size(n_bins: int) -> int:
    """Length of a stream's state vector: [u, g, g n^1 (B), g n^0 (B), table (B)]."""
    return _HEAD + 3 * n_bins


def initial_state(n_streams: int, n_bins: int) -> np.ndarray:
    """(S, 2 + 3B): no label yet, g = 1, empty bins, the table 0 (unread before warm-up)."""
    st = np.zeros((n_streams, state_size(n_bins)))
    st[:, 1] = 1.0
    return st


def decay_venn_abers(
    x, y, op_event, op_kind, op_offsets, state, *, memory, n_bins, eps, warmup, refit_every
):
    """Run the op list over all streams; returns ``(forecasts (n,), new state (S, 2 + 3B))``.

    ``state`` is not modified. ``memory`` W sets lambda = 1 - 2/W.

    >>> import numpy as np
    >>> from calpipe.kernels.ops import OP_STEP
    >>> x = np.array([0.2, 0.6, 0.4, 0.7]); y = np.array([0, 1, 1, 1])
    >>> p, st = decay_venn_abers(x, y, np.arange(4), np.full(4, OP_STEP, np.int8),
    ...                          np.array([0, 4]), initial_state(1, 10), memory=8, n_bins=10,
    ...                          eps=1e-4, warmup=2, refit_every=1)
    >>> p[:2].tolist(), int(st[0, 0]), bool(p[2] != x[2])  # the base, then the IVAP table
    ([0.2, 0.6], 4, True)
    """
    if not (memory >= 4 and n_bins >= 1 and 0.0 < eps < 0.5 and warmup >= 1 and refit_every >= 1):
        raise ValueError("need memory >= 4, n_bins >= 1, 0 < eps < 0.5, warmup, refit_every >= 1")

    st = np.ascontiguousarray(state, dtype=np.float64)
    if st.ndim != 2 or st.shape != (op_offsets.shape[0] - 1, state_size(n_bins)):
        raise ValueError(f"state must be (S, {state_size(n_bins)})")
    return _decay_venn_abers(
        np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(y, dtype=np.int64),
        np.ascontiguousarray(op_event, dtype=np.int64), np.ascontiguousarray(op_kind),
        np.ascontiguousarray(op_offsets, dtype=np.int64), st, 1.0 - 2.0 / memory,
        bin_edges(n_bins, eps), float(eps), float(warmup), float(refit_every),
    )  # fmt: skip
