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
every ``refit_every`` labels after it, each one O(B): :func:`ivap_table` sweeps the bins with
the prefix's and the suffix's PAV stacks (Vovk, Petej & Fedorova 2015), where one PAV pass
per bin and label (:func:`pav_value_at`, 2B passes) would take O(B^2).

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


#: Rows of :func:`ivap_table`'s scratch: ``np.empty((IVAP_ROWS, B))`` and
#: ``np.empty((IVAP_IROWS, B), np.int64)`` (any B' >= B columns will do).
IVAP_ROWS = 9
IVAP_IROWS = 4
_LS, _LW, _LM, _RS, _RW, _RM, _QS, _QW, _P0 = 0, 1, 2, 3, 4, 5, 6, 7, 8  # float rows (M: means)
_LST, _REND, _NXT, _STK = 0, 1, 2, 3  # integer rows
_NEAR = 1e-12  # means within this (relative) are compared on the rest of C (_drop_low)


@njit(cache=True)
def pav_value_at(pos, neg, b, add_pos, add_neg, s_sum, s_w, s_last):
    """The weighted PAV fit of the label frequency (non-decreasing over the bins in order) on
    the counts ``pos``/``neg`` with ``add_pos``/``add_neg`` added to bin ``b``, read at bin
    ``b``: one full O(B) pass, the definition :func:`ivap_table` computes for every bin at
    once. Bins of zero weight are skipped; ``s_*`` are scratch stacks of length B (block label
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
def ivap_table(pos, neg, out, work, iwork):
    r"""``out[b]`` = the log-loss merge p1 / (1 - p0 + p1) of the IVAP of a test score in bin b
    (module docstring) for every bin b, on the decayed counts ``pos``/``neg``, in O(B).

    The two isotonic values of every test position from stacks of the cumulative sum
    diagram's corners, as Vovk, Petej & Fedorova 2015 (NeurIPS, "Large-scale probabilistic
    predictors with and without guarantees of validity", Algorithms 1-4) compute
    F0 and F1 of all test scores in linear time after sorting; here with the corners kept as
    PAV blocks (label sum, weight) rather than as points of the diagram, so that no block's
    sum is a difference of cumulative sums (decayed counts span hundreds of orders of
    magnitude: the difference would cancel). With the test event (b, y) added, the fit's block
    C of bin b is the bridge of the two hulls: the prefix's PAV blocks (bins < b) of mean
    > sigma, bin b with the test event, the suffix's PAV blocks (bins > b) of mean < sigma,
    sigma = mean(C) the root of a decreasing function (:func:`_ivap_side`). sigma is
    non-decreasing in b, so a sweep over b moves C's two ends only rightwards: O(B) in all.
    ``work``/``iwork``: scratch of ``IVAP_ROWS``/``IVAP_IROWS`` rows of >= B columns.

    Agrees with the 2B passes of :func:`pav_value_at` to rounding (the blocks' sums are
    added in another order), and with exact arithmetic where pav_value_at's cross-multiplied
    comparisons underflow (two weights whose product is below ~1e-308: compared here by
    division). Returns how many bins needed the direct merge (:func:`_ivap_side`), for the
    tests."""
    _suffix_blocks(pos, neg, work, iwork)
    n_direct = _ivap_side(pos, neg, 0.0, work[_P0], work, iwork)
    n_direct += _ivap_side(pos, neg, 1.0, out, work, iwork)
    for b in range(pos.shape[0]):
        p0 = work[_P0, b]
        p1 = out[b]
        out[b] = p1 / (1.0 - p0 + p1)
    return n_direct


@njit(cache=True)
def _suffix_blocks(pos, neg, work, iwork):
    """For every non-empty bin k, the first PAV block of the bins >= k (right-to-left PAV,
    the suffix stacks of Vovk, Petej & Fedorova 2015's Algorithm 3): its label sum, weight and
    mean (``work[_RS, k]``, ``work[_RW, k]``, ``work[_RM, k]``) and last bin (``iwork[_REND, k]``); and
    ``iwork[_NXT, k]`` the first non-empty bin >= k (B if none). The stack below the top never
    changes as bins are pushed on its left, so the blocks of the bins > b are the chain
    k = NXT[b + 1], NXT[REND[k] + 1], ... for every b (block ends persist: a push only pools
    the new bin with the blocks next to it)."""
    n = pos.shape[0]
    top = -1  # the stack in rows _QS/_QW/_P0 (free until the sweeps), last bins in _STK
    nxt = n
    for k in range(n - 1, -1, -1):
        sw = pos[k] + neg[k]
        if sw > 0.0:  # bins of zero weight are skipped, as in pav_value_at
            nxt = k
            top += 1
            work[_QS, top] = pos[k]
            work[_QW, top] = sw
            work[_P0, top] = pos[k] / sw
            iwork[_STK, top] = k
            # pool while this (left) block's mean exceeds the next one's
            while top > 0 and work[_P0, top] > work[_P0, top - 1]:
                work[_QS, top - 1] += work[_QS, top]
                work[_QW, top - 1] += work[_QW, top]
                work[_P0, top - 1] = work[_QS, top - 1] / work[_QW, top - 1]
                top -= 1
            work[_RS, k] = work[_QS, top]
            work[_RW, k] = work[_QW, top]
            work[_RM, k] = work[_P0, top]
            iwork[_REND, k] = iwork[_STK, top]
        iwork[_NXT, k] = nxt


@njit(cache=True)
def _ivap_side(pos, neg, t, dest, work, iwork):
    r"""``dest[b]`` = the PAV fit at bin b with one test event of label ``t`` and weight 1 in
    bin b, for every b (:func:`_suffix_blocks` first). Returns the number of direct merges.

    Sweep over b (Vovk, Petej & Fedorova 2015, Algorithms 2 and 4, on blocks). With L the
    prefix's PAV blocks (a stack, pushed bin by bin, means non-decreasing upwards) and R the
    suffix's (the chain of :func:`_suffix_blocks`), the fit at b is sigma, the root of

    .. math:: F(\sigma) = (s_b + t - \sigma (w_b + 1)) + \sum_{X \in L} (s_X - \sigma w_X)_+
              - \sum_{X \in R} (\sigma w_X - s_X)_+,

    decreasing in sigma; C(sigma) = {X in L: mean > sigma} + bin b + {X in R: mean < sigma} is
    the fit's block of b. C is the window of bins qi..qj; a step crosses the next breakpoint
    (the lowest mean of C's L blocks, or the next R block's mean) while mean(C) reaches it:
    drop that L block (:func:`_drop_low`) or take that R block; otherwise sigma = mean(C).
    Invariant between the steps: C = C(lo) for a lower bound lo of the root (F(lo) >= 0, i.e.
    mean(C) >= lo). The root is non-decreasing in b (p0 and p1 are monotone in the score), so
    C at b - 1, with bin b - 1 moved from R to L, starts the walk at b, and the window moves
    right only: a queue of bins kept as two stacks (front: suffix sums, back: running sums),
    whose sum is always formed by additions (no cancellation), O(1) amortised; each block's
    mean is kept beside its sums (one division per pooling). Where the result breaks the
    invariant by more than rounding (the root below the last one by a relative 1e-12, or the
    L block below C pooling with it) bin b is done by the direct merge (:func:`_direct_merge`)
    and the window rebuilt: O(B) more at worst, counted in the return value (none on the
    decayed profiles of the tests and the benchmark)."""
    n = pos.shape[0]
    top = -1  # L: blocks of the non-empty bins < b (sums _LS, _LW; first bin _LST)
    il = 0  # C's lowest L block (il > top: none)
    qi, mid, qj = 0, 0, -1  # window qi..qj; front qi..mid-1 (suffix sums in _QS/_QW)
    bs, bw = 0.0, 0.0  # back mid..qj
    last = -math.inf  # the last root
    n_direct = 0
    for b in range(n):
        if b > 0 and pos[b - 1] + neg[b - 1] > 0.0:  # bin b - 1 joins L (pav_value_at's PAV)
            top += 1
            work[_LS, top] = pos[b - 1]
            work[_LW, top] = pos[b - 1] + neg[b - 1]
            work[_LM, top] = work[_LS, top] / work[_LW, top]
            iwork[_LST, top] = b - 1
            # pool while the block below's mean exceeds the top's (means by division: the
            # products of two decayed weights can underflow to 0 and stop a due pooling)
            while top > 0 and work[_LM, top - 1] > work[_LM, top]:
                work[_LS, top - 1] += work[_LS, top]
                work[_LW, top - 1] += work[_LW, top]
                work[_LM, top - 1] = work[_LS, top - 1] / work[_LW, top - 1]
                top -= 1
        while qj < b:  # bin b (the junction) joins the window's back
            qj += 1
            bs += pos[qj]
            bw += pos[qj] + neg[qj]
        il = min(il, top + 1)
        start = iwork[_LST, il] if il <= top else b
        ok = qi <= start  # else C would reach left of the window: direct merge
        while ok and qi < start:
            qi, mid, bs, bw = _pop_front(pos, neg, work, qi, mid, qj, bs, bw)
        cs, cw = 0.0, 0.0
        while ok:
            cs = (work[_QS, qi] if qi < mid else 0.0) + bs + t  # mean(C) = cs / cw
            cw = (work[_QW, qi] if qi < mid else 0.0) + bw + 1.0
            k = iwork[_NXT, qj + 1] if qj + 1 < n else n  # the next R block, first bin k
            take = k < n and work[_RM, k] * cw < cs  # mean(R) < mean(C), cw >= 1
            if take and il <= top:  # the lower breakpoint first
                take = work[_RM, k] <= work[_LM, il]
            if take:
                while qj < iwork[_REND, k]:
                    qj += 1
                    bs += pos[qj]
                    bw += pos[qj] + neg[qj]
            elif il <= top and _drop_low(pos, neg, t, b, il, top, qj, cs, cw, work):
                il += 1
                start = iwork[_LST, il] if il <= top else b
                while qi < start:
                    qi, mid, bs, bw = _pop_front(pos, neg, work, qi, mid, qj, bs, bw)
            else:
                break
        if ok and cs < last * (1.0 - _NEAR) * cw:  # the root fell below the last one
            ok = False
        if ok and il > 0 and work[_LM, il - 1] * cw > cs:  # the L block below C would pool
            ok = _drop_low(pos, neg, t, b, il - 1, top, qj, cs, cw, work)  # but for rounding
        if not ok:
            n_direct += 1
            cs, cw, il, qj = _direct_merge(pos, neg, t, b, top, work, iwork)
            qi = iwork[_LST, il] if il <= top else b
            mid = qi  # the whole window to the back, summed again
            bs, bw = 0.0, 0.0
            for j in range(qi, qj + 1):
                bs += pos[j]
                bw += pos[j] + neg[j]
        dest[b] = cs / cw
        last = cs / cw
    return n_direct


@njit(cache=True, inline="always")
def _drop_low(pos, neg, t, b, il, top, qj, cs, cw, work):
    """Whether C's lowest L block X (``il``) leaves C: mean(X) <= mean(C minus X), as
    pav_value_at would not pool X into the rest (pools on >). The same as mean(X) <= mean(C)
    unless the two means are within rounding, where X's weight may dwarf the rest's (the
    difference of means is then the rest's, scaled down by the weights): then the rest is
    summed, blocks ``il + 1``..``top`` and bins ``b``..``qj`` (the test event's too).
    ``cs``/``cw``: C's label sum and weight (>= 1); blocks' means are kept beside their sums
    (one division per pooling), and compared with C's as mean(X) cw against cs."""
    xw = work[_LM, il] * cw  # mean(X) <= mean(C) as mean(X) cw <= cs: cw >= 1, no underflow
    if abs(cs - xw) > _NEAR * max(cs, xw):
        return xw <= cs
    rs, rw = t, 1.0
    for j in range(il + 1, top + 1):
        rs += work[_LS, j]
        rw += work[_LW, j]
    for j in range(b, qj + 1):
        rs += pos[j]
        rw += pos[j] + neg[j]
    return work[_LM, il] <= rs / rw


@njit(cache=True, inline="always")
def _pop_front(pos, neg, work, qi, mid, qj, bs, bw):
    """Drop bin ``qi`` from the window's front; an empty front takes the whole back, summed
    from the right (each bin moves to the front once). Returns ``(qi, mid, bs, bw)``."""
    if qi == mid:
        acc_s, acc_w = 0.0, 0.0
        for j in range(qj, qi - 1, -1):
            acc_s += pos[j]
            acc_w += pos[j] + neg[j]
            work[_QS, j] = acc_s
            work[_QW, j] = acc_w
        mid = qj + 1
        bs, bw = 0.0, 0.0
    return qi + 1, mid, bs, bw


@njit(cache=True)
def _direct_merge(pos, neg, t, b, top, work, iwork):
    """The fit's block of bin b with the test event (label ``t``) by pooling adjacent
    violators from bin b outwards (any order of pooling gives the PAV fit): L blocks
    ``top``, ``top - 1``, ... while their mean exceeds C's, R blocks while C's exceeds theirs.
    Returns ``(label sum, weight, C's lowest L block, C's last bin)``."""
    n = pos.shape[0]
    cs = pos[b] + t
    cw = pos[b] + neg[b] + 1.0
    a = top + 1
    e = b
    while True:
        if a > 0 and work[_LM, a - 1] > cs / cw:
            a -= 1
            cs += work[_LS, a]
            cw += work[_LW, a]
            continue
        k = iwork[_NXT, e + 1] if e + 1 < n else n
        if k < n and cs / cw > work[_RM, k]:
            cs += work[_RS, k]
            cw += work[_RW, k]
            e = iwork[_REND, k]
            continue
        return cs, cw, a, e


@njit(cache=True, error_model="numpy")
def _decay_venn_abers(x, y, op_event, op_kind, op_offsets, state, lam, edges, eps, warmup,
                      refit_every):  # fmt: skip
    n_bins = edges.shape[0] - 1
    out = np.full(x.shape[0], np.nan)
    st = state.copy()
    cur_pos = np.empty(n_bins)
    cur_neg = np.empty(n_bins)
    work = np.empty((IVAP_ROWS, n_bins))
    iwork = np.empty((IVAP_IROWS, n_bins), dtype=np.int64)
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
                    ivap_table(cur_pos, cur_neg, table, work, iwork)
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
