r"""Each method's test martingale: the likelihood ratio of its forecasts to the base's.

A calibrated forecaster p' run on the base p has the test martingale (paper 000, Lemma 1)

.. math::

    S_n = \prod_{t \le n,\ y_t \text{ known}} \frac{p'_t(y_t)}{p_t(y_t)},

both forecasts clipped (binary: to [clip, 1 - clip]; K classes: each entry floored at clip and
the row renormalised, :func:`clip_probabilities`) so that one extreme forecast cannot end it.
:func:`likelihood_gale` gives log10 S after every op of each stream; :func:`likelihood_gale_ends`
the end values of several forecasters at once (the default method's inputs), chunk by chunk,
the same bits.

>>> import numpy as np
>>> _, end = likelihood_gale(np.array([0.8, 0.6]), np.array([0.5, 0.5]), np.array([1, 0]),
...                          np.array([True, True]), np.array([0, 2]), np.zeros(1), 1e-3)
>>> round(float(end[0]), 4)  # log10(0.8 / 0.5) + log10(0.4 / 0.5)
0.1072
"""

from __future__ import annotations

import numpy as np
from numba import njit

from calpipe import config


@njit(cache=True)
def _segment_gale(contrib, op_offsets, log10m0):
    """Running sum of ``contrib`` within each op segment, starting at ``log10m0[s]``.

    Sequential adds in op order, so a stream split into chunks (state carried) gives bit-identical
    sums: the invariant "k chunks = one pass" of docs/ARCHITECTURE.md §4.
    """
    out = np.empty(contrib.shape[0])
    end = log10m0.copy()
    for s in range(op_offsets.shape[0] - 1):
        m = log10m0[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            m += contrib[o]
            out[o] = m
        end[s] = m
    return out, end


def likelihood_gale(
    forecast: np.ndarray,
    base: np.ndarray,
    labels: np.ndarray,
    is_update: np.ndarray,
    op_offsets: np.ndarray,
    log10m0: np.ndarray,
    clip: float,
) -> tuple[np.ndarray, np.ndarray]:
    """log10 S after each op: S multiplies by clip(p')(y) / clip(p)(y) at each update op.

    ``forecast`` and ``base`` are per op (the calibrated forecast made at that op, and the base);
    binary forecasts are clipped to [clip, 1 - clip]; K-class vectors have each entry floored at
    ``clip`` and are renormalised (the rule of :meth:`ProtectedCalibrator.prepare_scores`).
    """
    contrib = _gale_terms(forecast[None], base, labels, is_update, clip)[0]
    return _segment_gale(np.ascontiguousarray(contrib), op_offsets, log10m0)


@njit(cache=True)
def _segment_add(contrib, o0, op_offsets, acc):
    """Add ``contrib`` (I, c), the terms of ops o0 .. o0 + c - 1, to their streams' running
    sums ``acc`` (I, S) in place, each stream's in op order: over consecutive chunks of the ops
    these are ``_segment_gale``'s sequential adds, so the ends are its ends to the bit."""
    hi_op = o0 + contrib.shape[1]
    first = np.searchsorted(op_offsets, o0, side="right") - 1
    for i in range(contrib.shape[0]):
        s, o = first, o0
        while o < hi_op:
            while op_offsets[s + 1] <= o:  # streams without ops in the chunk
                s += 1
            hi = min(op_offsets[s + 1], hi_op)
            m = acc[i, s]
            for k in range(o - o0, hi - o0):
                m += contrib[i, k]
            acc[i, s] = m
            o = hi


def _gale_terms(f, base, labels, is_update, clip):
    """The log10 ratio terms log10 clip(p')(y) - log10 clip(p)(y) of I forecasters ``f`` on some
    ops, (I, c); 0 at an op without an update. The one form of both :func:`likelihood_gale`
    and :func:`likelihood_gale_ends` (K classes: only the label's entry of each clipped row)."""
    if base.ndim == 2:
        y = np.where(is_update, np.maximum(labels, 0), 0)
        at = np.arange(base.shape[0])
        q = [np.maximum(p, clip) for p in (base, *f)]
        lp = [np.log10(v[at, y] / v.sum(axis=1)) for v in q]
        return np.array([np.where(is_update, v - lp[0], 0.0) for v in lp[1:]])
    f = np.clip(f, clip, 1.0 - clip)
    b = clip_probabilities(base, clip)
    one = np.maximum(labels, 0) == 1
    return np.where(is_update, np.log10(np.where(one, f, 1.0 - f))
                    - np.log10(np.where(one, b, 1.0 - b)), 0.0)  # fmt: skip


def likelihood_gale_ends(
    forecasts: np.ndarray,
    base: np.ndarray,
    labels: np.ndarray,
    is_update: np.ndarray,
    op_offsets: np.ndarray,
    log10m0: np.ndarray,
    clip: float,
) -> np.ndarray:
    """:func:`likelihood_gale`'s end values (I, S) for I binary forecasters at once:
    ``forecasts`` (I, m) per op (or (m,): one), ``log10m0`` (I, S), one ``clip``. The same
    elementwise operations (the base's term computed once), so every value equals
    ``likelihood_gale``'s for that row to the bit. K classes: ``forecasts`` (I, m, K), ``base``
    (m, K); only the label's entry of a clipped row is formed, max(p_y, clip) / (the row of
    max(p, clip) summed in numpy's order), the same division of the same values as the whole
    row's.

    The ops go through in chunks of ``config.CHUNK_ROWS``: the terms of a whole night (the
    default's five inputs over 10M ops) were six fresh (I, m) temporaries, 2.4 GB whose first
    touch cost more than the logarithms (BENCHMARKS.md §28); per chunk they stay in cache.
    """
    k_class = base.ndim == 2
    f = forecasts if forecasts.ndim > (2 if k_class else 1) else forecasts[None]
    acc = np.array(log10m0, dtype=np.float64).reshape(f.shape[0], op_offsets.shape[0] - 1)
    step = config.CHUNK_ROWS
    for a in range(0, f.shape[1], step):
        z = slice(a, a + step)
        terms = _gale_terms(f[:, z], base[z], labels[z], is_update[z], clip)
        _segment_add(np.ascontiguousarray(terms), a, op_offsets, acc)
    return acc


def clip_probabilities(p: np.ndarray, eps: float) -> np.ndarray:
    """Binary: min(max(p, eps), 1 - eps). K classes: max(p_c, eps) renormalised."""
    if p.ndim == 1:
        return np.clip(p, eps, 1.0 - eps)
    q = np.maximum(p, eps)
    return q / q.sum(axis=1, keepdims=True)
