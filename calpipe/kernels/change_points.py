"""The change-point detector: a CUSUM e-detector over likelihood-ratio factors, per stream.

Shin, Ramdas & Rinaldo (2023), *E-detectors: a nonparametric framework for sequential change
detection* (§3): for factors L_1, L_2, ... with E[L_n | past] <= 1 under the null (no change),
the CUSUM e-detector is

.. math::

    M_0 = 0, \\qquad M_n = L_n \\max(M_{n-1}, 1),

i.e. M_n = max over starts j <= n of the product L_j ... L_n. Each product is an e-process
started at j, so M_n <= R_n, the Shiryaev-Roberts e-detector R_n = L_n (R_{n-1} + 1), whose
R_n - n is a supermartingale under the null; by optional stopping the first n with M_n >= A
has mean >= A under the null (the average run length to a false alarm, their Theorem 3.1).
The start j of the product that attains the maximum is the change's estimate (the CUSUM's
maximum-likelihood change point under the alternative).

calpipe runs it in log10, c_n = log10 M_n = log10 L_n + max(c_{n-1}, 0), over each stream's
labelled events in the order their labels are learnt (:mod:`calpipe.night.changes` makes the
factors: the protected forecast's probability of the label over the reference forecast's).
A crossing c_n >= log10 A is a change point; the stream's detector then learns a number of
labels without counting them (the protected forecaster learning the new calibration), its
reference is frozen at the end of the call (the night) in which the last of them came, and it
restarts from c = 0 with the next call.

The kernel is pure: arrays and state in, outputs and state out; :func:`cusum_detect` validates
and calls it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: ``run_start`` of a stream whose CUSUM is at or below 0 (no run open).
NO_RUN = np.iinfo(np.int64).min


@njit(cache=True)
def _cusum_detect(offsets, log10_factor, when, c0, start0, count0, settle0, log10_threshold,
                  settle_labels):  # fmt: skip
    """Per stream s (factors ``offsets[s]:offsets[s + 1]`` in learning order): the recursion of
    the module docstring from state (``c0[s]``, ``start0[s]``: the ``when`` of the open run's
    first factor or NO_RUN, ``count0[s]``: its factors, ``settle0[s]``: labels still to learn
    before the reference is frozen, 0 while detecting).

    After a crossing the stream learns ``settle_labels`` labels (not counted) and its reference
    is frozen at the end of the call in which the last of them came (``freeze[s]``); the rest
    of that call's factors are not counted either (the new reference starts with the next
    call). Returns the end state (c, start, count, settle), ``freeze``, and per stream the
    crossing's factor index (-1: none), its log10 statistic, the run's start and its number of
    factors."""
    s_n = offsets.shape[0] - 1
    c_out = np.empty(s_n)
    start_out = np.empty(s_n, np.int64)
    count_out = np.empty(s_n, np.int64)
    settle_out = np.empty(s_n, np.int64)
    freeze = np.zeros(s_n, np.bool_)
    hit = np.full(s_n, -1, np.int64)
    hit_c = np.zeros(s_n)
    hit_start = np.zeros(s_n, np.int64)
    hit_count = np.zeros(s_n, np.int64)
    for s in range(s_n):
        c, start, count, settle = c0[s], start0[s], count0[s], settle0[s]
        for i in range(offsets[s], offsets[s + 1]):
            if freeze[s]:  # the reference changes at the call's end: nothing more counts
                break
            if settle > 0:  # learning the new calibration before its map is frozen
                settle -= 1
                freeze[s] = settle == 0
                continue
            if hit[s] >= 0:  # (settle_labels = 0 froze at the crossing)
                break
            if c <= 0.0:  # max(M, 1) = 1: the run starts again at this factor
                c, start, count = 0.0, when[i], 0
            c += log10_factor[i]
            count += 1
            if c >= log10_threshold:
                hit[s], hit_c[s], hit_start[s], hit_count[s] = i, c, start, count
                c, start, count, settle = 0.0, NO_RUN, 0, settle_labels
                freeze[s] = settle == 0
        if c <= 0.0:
            c, start, count = 0.0, NO_RUN, 0
        c_out[s], start_out[s], count_out[s], settle_out[s] = c, start, count, settle
    return c_out, start_out, count_out, settle_out, freeze, hit, hit_c, hit_start, hit_count


def cusum_detect(
    offsets: np.ndarray,
    log10_factor: np.ndarray,
    when: np.ndarray,
    c0: np.ndarray,
    start0: np.ndarray,
    count0: np.ndarray,
    log10_threshold: float,
    settle0: np.ndarray | None = None,
    settle_labels: int = 0,
):
    """The CUSUM e-detector of the module docstring over S streams' factors.

    Parameters
    ----------
    offsets : int64 (S + 1,)
        Stream s's factors are ``offsets[s]:offsets[s + 1]``, in the order their labels are
        learnt.
    log10_factor : float64 (n,)
        log10 L of each factor (finite).
    when : int64 (n,)
        What a run started at the factor records as its start (the event time of the factor's
        event, in microseconds): the change's estimate.
    c0, start0, count0 : (S,)
        Each stream's state: log10 statistic (>= 0), the open run's start (:data:`NO_RUN` if
        none) and its number of factors.
    log10_threshold : float
        log10 A (> 0).
    settle0 : (S,) int, optional
        Labels each stream still learns before its reference is frozen (0, the default:
        detecting).
    settle_labels : int
        Labels learnt after a crossing before the reference is frozen (0: at the crossing).

    Returns
    -------
    (c, start, count, settle, freeze, hit, hit_log10, hit_start, hit_count)
        The end state; ``freeze``: the streams whose reference is to be frozen now (their
        settling ended in this call; the rest of their factors were not counted); per stream
        the index of the factor at which the statistic crossed log10 A (-1: none; at most one
        a call), the statistic there, the run's start and its number of factors.

    Examples
    --------
    >>> import numpy as np
    >>> out = cusum_detect(np.array([0, 4]), np.array([-0.5, 1.0, 1.5, 2.0]),
    ...                    np.array([10, 20, 30, 40]), np.zeros(1), np.array([NO_RUN]),
    ...                    np.zeros(1, np.int64), 2.0)
    >>> int(out[5][0]), float(out[6][0]), int(out[7][0]), int(out[8][0]), bool(out[4][0])
    (2, 2.5, 20, 2, True)
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    f = np.ascontiguousarray(log10_factor, dtype=np.float64)
    when = np.ascontiguousarray(when, dtype=np.int64)
    c0 = np.ascontiguousarray(c0, dtype=np.float64)
    start0 = np.ascontiguousarray(start0, dtype=np.int64)
    count0 = np.ascontiguousarray(count0, dtype=np.int64)
    s_n = offsets.shape[0] - 1
    settle0 = np.zeros(max(s_n, 0), np.int64) if settle0 is None else np.ascontiguousarray(
        settle0, dtype=np.int64)  # fmt: skip
    if s_n < 0 or offsets[0] != 0 or offsets[-1] != f.shape[0] or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must rise from 0 to the number of factors")
    if (
        when.shape != f.shape
        or c0.shape != (s_n,)
        or start0.shape != (s_n,)
        or count0.shape != (s_n,)
    ):
        raise ValueError("one `when` per factor and one state value per stream")
    if not np.isfinite(f).all():
        raise ValueError("every log10 factor must be finite")
    if not (np.isfinite(c0).all() and (c0 >= 0).all() and (count0 >= 0).all()):
        raise ValueError("the state's statistic must be finite and >= 0, its count >= 0")
    if settle0.shape != (s_n,) or (settle0 < 0).any() or settle_labels < 0:
        raise ValueError("settle0 (one per stream) and settle_labels must be >= 0")
    if not (np.isfinite(log10_threshold) and log10_threshold > 0):
        raise ValueError(f"log10_threshold must be finite and > 0, not {log10_threshold}")
    return _cusum_detect(offsets, f, when, c0, start0, count0, settle0,
                         float(log10_threshold), int(settle_labels))  # fmt: skip
