"""The engines of the binary Brier compatibility recursion (:func:`calpipe.kernels.brier_compat.
brier_binary` dispatches to them): one stream at a time (:func:`brier_streams`,
:func:`brier_streams_3x15` for the package's default 3 rates x 15 slots) and 64 streams at a time
in SIMD lanes (:func:`brier_lanes`). Both run the same floating-point operations, so a stream's
outputs do not depend on its batch; the section comment below gives the layout.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from calpipe.kernels.calfun import distinct_betas
from calpipe.kernels.numeric import (
    EXP_ARG_MAX,
    INV_LN10,
    bits_f64,
    exp_core,
    f64_bits,
    ln_core,
    ln_fast,
    ln_ok,
    stack_empty,
    steps_to_first_end,
    take_stream,
    tree_sum,
)
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

# --------------------------------------------------------------------------------------------
# Brier compatibility, binary (K = 2).
#
# The recursion of `brier_compat` for two classes, with the same family and the same state,
# re-laid for speed:
#
# * the 2 (T + 1) factors e^{-Brier(c, .)} of an event (T = 15 functions and the base forecast,
#   c = 0, 1) depend on its score alone, not on the state: they are computed for a block of
#   events at a time (`_brier_factors`), in loops whose innermost index runs over the block's
#   events and vectorises, with `exp_core` instead of 32 libm calls per event;
# * class c's factors sit in an array of L = T + 1 rounded up to a power of two, the base
#   forecast in slot T (pads: e^0 on zero weight), so each sum of the forecast
#   P e^{-Brier(c, p)} + sum_t col[t] e^{-Brier(c, f_t)} is one dot product of length L;
# * every sum over the functions is a `tree_sum` (log2 L dependent adds, in a fixed order);
#   each normalisation is one division and L products;
# * logs are fdlibm's (`ln_fast`); log10 CJ is computed after the recursion from the rows of
#   log10 SJ (`cj_rows`), a pure function of the row.
#
# The arithmetic of each term is the package's (the Cox values f_c = v_c / (v_0 + v_1),
# Brier(0, f) = (1 - f_0)^2 + f_1^2, the substitution shortcut, its clip and renormalisation), so
# each step equals `brier_compat`'s to a few ulp (only the summation order, exp/log and the
# normalisations by a reciprocal differ); over a 20,000-event stream log10 SJ drifts from it by
# ~1e-13, forecasts by ~1e-16.
#
# Two engines run the same floating-point operations in the same order (as the log-loss binary
# kernel's do), so a stream's outputs are the same whatever its batch, engine or block
# boundaries (the factors of an event do not depend on its neighbours), and chunked runs with
# the state carried equal one pass bit for bit:
#
# * one stream at a time (`_brier_one_stream`): the factors of a block of its operations, then
#   the recursion through the block. With literal sizes LLVM unrolls the loops over the 16 slots
#   and keeps most of the recursion in scalar registers (its SLP vectoriser packs little of it),
#   so this engine runs ~5M events/s, about 2/3 of the time in that scalar recursion;
# * `BRIER_LANES` streams at a time (`_brier_lanes_body`): lane l of every scratch array holds
#   one stream, each step advances every lane by one operation, and the loops over lanes
#   vectorise (~8M events/s). Used when a batch has at least 2 * BRIER_LANES streams; streams
#   still running when fewer than half the lanes are busy are handed back to the first engine.
# --------------------------------------------------------------------------------------------
_BRIER_BLOCK = (
    64  # events per block of the one-stream engine's factors (scratch: ~64 KiB; 32: slower)
)
# Lanes of the multi-stream engine. With 32 lanes LLVM fully unrolls the loops over lanes and
# vectorises the tree sums across slots instead, with gathers and scatters: 3x slower.
BRIER_LANES = 64


@njit(cache=True, inline="always", error_model="numpy")
def _brier_factors(p, y, evb, nb, B, L, n_fun, consts, blk):
    """e^{-Brier(c, .)} of the events ``evb[:nb]`` (nb <= B), lane b for event evb[b].

    ``consts``: ``dist`` (the distinct betas), ``bo`` (index of beta_t in ``dist`` as float64,
    pads 0), ``ea0``, ``ea1`` (e^{alpha_t(c)}, pads 1). Fills the scratch ``blk``:
    ``ext[(c L + t) B + b]`` = e^{-Brier(c, f_t(p_b))}, slot t = T the base forecast p_b itself,
    pads e^0; ``exy[t B + b]`` = e^{-Brier(y_b, f_t)} (class y_b's half of ``ext``);
    ``ratt[t B + b]`` = e^{-Brier(y_b, f_t)} / e^{-Brier(y_b, p_b)} (the capital's factor);
    ``yb[b]`` = 1.0 if y_b = 1 else 0.0. Lanes b >= nb compute on p = 1/2.
    """
    dist, bo, ea0, ea1 = consts
    x0, x1, yb, pw0, pw1, arg, ext, ratt, exy = blk
    n_dist = dist.shape[0]
    for b in range(B):
        x1[b] = 0.5
        yb[b] = 0.0
    for b in range(nb):
        e = evb[b]
        x1[b] = p[e]
        yb[b] = 1.0 if y[e] != 0 else 0.0
    for b in range(B):
        x0[b] = 1.0 - x1[b]  # the package's column 0, 1 - p, as calpipe builds it
    for k in range(n_dist):  # p_c^beta once per distinct beta (the branches of pow_beta, hoisted)
        beta = dist[k]
        if beta == 1.0:
            for b in range(B):
                pw0[k * B + b] = x0[b]
                pw1[k * B + b] = x1[b]
        elif beta == 0.5:
            for b in range(B):
                pw0[k * B + b] = math.sqrt(x0[b])
                pw1[k * B + b] = math.sqrt(x1[b])
        elif beta == 2.0:
            for b in range(B):
                pw0[k * B + b] = x0[b] * x0[b]
                pw1[k * B + b] = x1[b] * x1[b]
        else:
            for b in range(B):
                pw0[k * B + b] = x0[b] ** beta
                pw1[k * B + b] = x1[b] ** beta
    # -Brier(c, f_t) at arg[(c L + t) B + b]: Brier(0, f) = (1 - f_0)^2 + (0 - f_1)^2, etc.
    for t in range(n_fun):
        k = int(bo[t])
        e0, e1 = ea0[t], ea1[t]
        for b in range(B):
            v0 = pw0[k * B + b] * e0
            v1 = pw1[k * B + b] * e1
            ssum = v0 + v1
            f0 = v0 / ssum
            f1 = v1 / ssum
            d0 = 1.0 - f0
            d1 = 1.0 - f1
            arg[t * B + b] = -(d0 * d0 + f1 * f1)
            arg[(L + t) * B + b] = -(f0 * f0 + d1 * d1)
    for b in range(B):  # slot T: the base forecast
        d0 = 1.0 - x0[b]
        d1 = 1.0 - x1[b]
        arg[n_fun * B + b] = -(d0 * d0 + x1[b] * x1[b])
        arg[(L + n_fun) * B + b] = -(x0[b] * x0[b] + d1 * d1)
    for t in range(n_fun + 1, L):
        for b in range(B):
            arg[t * B + b] = 0.0
            arg[(L + t) * B + b] = 0.0
    n_bad = 0
    for i in range(2 * L * B):
        ext[i] = exp_core(arg[i])
        n_bad += 0 if arg[i] >= -EXP_ARG_MAX else 1
    if n_bad > 0:  # NaN scores only: -Brier is in [-2, 0]
        for i in range(2 * L * B):
            if not (arg[i] >= -EXP_ARG_MAX):
                ext[i] = math.exp(arg[i])
    for t in range(L):  # class y's factors, selected bitwise (an exact select that vectorises)
        for b in range(B):
            m = -np.int64(yb[b])  # all ones for y = 1, zero for y = 0
            bits = (f64_bits(ext[(L + t) * B + b]) & m) | (f64_bits(ext[t * B + b]) & ~m)
            exy[t * B + b] = bits_f64(bits)
    for t in range(L):  # class y's factor over its base factor (pads: 1 / base, weight 0)
        for b in range(B):
            ratt[t * B + b] = exy[t * B + b] / exy[n_fun * B + b]


@njit(cache=True, inline="always")
def _tree_rows(v, L, R):
    """v[j] = sum_t v[t R + j] for every j < R, by :func:`tree_sum`'s halving over t (the same
    adds in the same order for each j). Overwrites v[:L R]."""
    h = L // 2
    while h >= 1:
        for i in range(h):
            for j in range(R):
                v[i * R + j] += v[(i + h) * R + j]
        h //= 2


@njit(cache=True, inline="always", error_model="numpy")
def _brier_one_stream(
    p, y, op_event, op_kind, op_offsets, start, rates, passive, active, capital, log_sj, out_p,
    out_sj, n_rates, n_fun, L, B, consts, blk, evb, vec_l, vec_rl, vec_r,
):  # fmt: skip
    """Every stream s with operations left (``start[s] < op_offsets[s + 1]``) through the binary
    Brier recursion, one stream at a time (see the section comment).

    Per-rate arrays are slot-major (x[t R + j] for slot t, rate j), so that the same operation
    on the R rates of a slot is on adjacent doubles (which LLVM's SLP vectoriser packs).
    Scratch, as tuples of separate arrays (a call with more than 30 arguments is compiled as
    ``f(*args)``, which numba cannot inline; separate arrays let LLVM see that they do not
    overlap): ``consts`` and ``blk`` those of :func:`_brier_factors`; ``evb`` (B, int64), the
    block's events; ``vec_l`` (L each): ``col``, ``q0``, ``q1``; ``vec_rl`` (R L each): ``a``,
    ``cap`` (weights and capital, pad slots t >= T kept at 0), ``mixed``, ``an``, ``cm`` (their
    mixed and updated copies), ``w`` (tree sums); ``vec_r`` (R each): ``lsj``, ``rr``, ``keep``
    (1 - J), ``share`` (J / T), ``add``, ``inv``.
    """
    ext, ratt, exy = blk[6], blk[7], blk[8]
    col, q0, q1 = vec_l
    a, cap, mixed, an, cm, w = vec_rl
    lsj, rr, keep, share, add, inv = vec_r
    R = n_rates
    for j in range(R):
        rr[j] = rates[j]
        keep[j] = 1.0 - rr[j]
        share[j] = rr[j] / n_fun
    for s in range(op_offsets.shape[0] - 1):
        if start[s] >= op_offsets[s + 1]:
            continue
        for t in range(L):
            for j in range(R):
                a[t * R + j] = active[s, j, t] if t < n_fun else 0.0
                cap[t * R + j] = capital[s, j, t] if t < n_fun else 0.0
        for j in range(R):
            lsj[j] = log_sj[s, j]
        pw = passive[s]
        for o0 in range(start[s], op_offsets[s + 1], B):
            nb = min(B, op_offsets[s + 1] - o0)
            for b in range(nb):
                evb[b] = op_event[o0 + b]
            _brier_factors(p, y, evb, nb, B, L, n_fun, consts, blk)
            for b in range(nb):
                e = evb[b]
                kind = op_kind[o0 + b]
                # This event's factors: ext[(c L + t) B + b], exy[t B + b], ratt[t B + b]
                # (strided reads: the loops over t below are unrolled).
                # Jump mixing (the package's order): mixed = (1 - J) A + J/|Theta| sum A;
                # col = sum_J mixed.
                for i in range(L * R):
                    w[i] = a[i]
                _tree_rows(w, L, R)
                for j in range(R):
                    add[j] = w[j] * rr[j] / n_fun
                for t in range(L):
                    for j in range(R):
                        mixed[t * R + j] = keep[j] * a[t * R + j] + add[j]
                for t in range(n_fun, L):
                    for j in range(R):
                        mixed[t * R + j] = 0.0
                for t in range(L):
                    col[t] = mixed[t * R]
                    for j in range(1, R):
                        col[t] += mixed[t * R + j]
                if kind != OP_UPDATE:
                    # g_c = -ln(P e^{-Brier(c, p)} + sum_t col[t] e^{-Brier(c, f_t)}), P in slot T.
                    col[n_fun] = pw
                    for t in range(L):
                        q0[t] = col[t] * ext[t * B + b]
                        q1[t] = col[t] * ext[(L + t) * B + b]
                    g0 = -ln_fast(tree_sum(q0, 0, L))
                    g1 = -ln_fast(tree_sum(q1, 0, L))
                    # Substitution shortcut, clip to [0, 1], renormalise (the package's order).
                    sc = (2.0 + (g0 + g1)) / 2.0
                    v0 = min(max((sc - g0) / 2.0, 0.0), 1.0)
                    v1 = min(max((sc - g1) / 2.0, 0.0), 1.0)
                    out_p[e] = v1 / (v0 + v1)
                if kind != OP_FORECAST:
                    pw = pw * exy[n_fun * B + b]  # e^{-Brier(y, .)}: class y's factors
                    for t in range(L):
                        ey = exy[t * B + b]
                        for j in range(R):
                            v = mixed[t * R + j] * ey
                            an[t * R + j] = v
                            w[t * R + j] = v
                    _tree_rows(w, L, R)
                    tot = pw
                    for j in range(R):
                        tot += w[j]
                    for t in range(L):
                        rt = ratt[t * B + b]
                        for j in range(R):
                            cm[t * R + j] = (keep[j] * cap[t * R + j] + share[j]) * rt
                    for t in range(n_fun, L):
                        for j in range(R):
                            cm[t * R + j] = 0.0
                    for i in range(L * R):
                        w[i] = cm[i]
                    _tree_rows(w, L, R)
                    for j in range(R):
                        lsj[j] += ln_fast(w[j]) * INV_LN10
                        inv[j] = 1.0 / w[j]
                    for t in range(L):
                        for j in range(R):
                            cap[t * R + j] = cm[t * R + j] * inv[j]
                    itot = 1.0 / tot
                    pw = pw * itot
                    for i in range(L * R):
                        a[i] = an[i] * itot
                if kind != OP_UPDATE:
                    for j in range(R):
                        out_sj[e, j] = lsj[j]
        for t in range(n_fun):
            for j in range(R):
                active[s, j, t] = a[t * R + j]
                capital[s, j, t] = cap[t * R + j]
        for j in range(R):
            log_sj[s, j] = lsj[j]
        passive[s] = pw
        start[s] = op_offsets[s + 1]


@njit(cache=True, inline="always")
def _brier_consts(betas, alphas, L, dist, bo, ea0, ea1):
    """Fill the ``consts`` of :func:`_brier_factors` (arrays of >= T, L, L, L) from the grid;
    returns ``dist`` cut to the number of distinct betas."""
    n_fun = betas.shape[0]
    distinct, beta_of = distinct_betas(betas)
    for k in range(distinct.shape[0]):
        dist[k] = distinct[k]
    ea = np.exp(alphas)  # as brier_compat: the Cox values are bit-identical to its own
    for t in range(L):
        if t < n_fun:
            ea0[t], ea1[t], bo[t] = ea[t, 0], ea[t, 1], float(beta_of[t])
        else:
            ea0[t], ea1[t], bo[t] = 1.0, 1.0, 0.0
    return dist[: distinct.shape[0]]


@njit(cache=True, inline="always")
def _brier_width(n_fun):
    """L: the smallest power of two above T (T functions and the base forecast's slot)."""
    L = 1
    while L < n_fun + 1:
        L *= 2
    return L


@njit(cache=True, error_model="numpy")
def brier_streams(
    p, y, op_event, op_kind, op_offsets, start, betas, alphas, rates, passive, active, capital,
    log_sj, out_p, out_sj,
):  # fmt: skip
    """:func:`_brier_one_stream` for any shape (R, T), with heap scratch."""
    n_rates, n_fun = active.shape[1], active.shape[2]
    L = _brier_width(n_fun)
    B = _BRIER_BLOCK
    bo, ea0, ea1 = np.empty(L), np.empty(L), np.empty(L)
    dist = _brier_consts(betas, alphas, L, np.empty(n_fun), bo, ea0, ea1)
    blk = (
        np.empty(B), np.empty(B), np.empty(B), np.empty(n_fun * B), np.empty(n_fun * B),
        np.empty(2 * L * B), np.empty(2 * L * B), np.empty(L * B), np.empty(L * B),
    )  # fmt: skip
    _brier_one_stream(
        p, y, op_event, op_kind, op_offsets, start, rates, passive, active, capital, log_sj,
        out_p, out_sj, n_rates, n_fun, L, B, (dist, bo, ea0, ea1), blk,
        np.empty(B, np.int64), (np.empty(L), np.empty(L), np.empty(L)),
        (np.empty(n_rates * L), np.empty(n_rates * L), np.empty(n_rates * L),
         np.empty(n_rates * L), np.empty(n_rates * L), np.empty(n_rates * L)),
        (np.empty(n_rates), np.empty(n_rates), np.empty(n_rates), np.empty(n_rates),
         np.empty(n_rates), np.empty(n_rates)),
    )  # fmt: skip


@njit(cache=True, error_model="numpy")
def brier_streams_3x15(
    p, y, op_event, op_kind, op_offsets, start, betas, alphas, rates, passive, active, capital,
    log_sj, out_p, out_sj,
):  # fmt: skip
    """:func:`_brier_one_stream` for the default (3 rates x the package's 15 functions, L = 16):
    literal sizes and stack scratch (see :func:`stack_empty`): about 2x faster than
    :func:`brier_streams`, same results."""
    bo, ea0, ea1 = (
        carray(stack_empty(16), 16),
        carray(stack_empty(16), 16),
        carray(stack_empty(16), 16),
    )
    dist = _brier_consts(betas, alphas, 16, carray(stack_empty(15), 15), bo, ea0, ea1)
    blk = (
        carray(stack_empty(64), 64), carray(stack_empty(64), 64), carray(stack_empty(64), 64),
        carray(stack_empty(960), 960), carray(stack_empty(960), 960),
        carray(stack_empty(2048), 2048), carray(stack_empty(2048), 2048),
        carray(stack_empty(1024), 1024), carray(stack_empty(1024), 1024),
    )  # fmt: skip
    _brier_one_stream(
        p, y, op_event, op_kind, op_offsets, start, rates, passive, active, capital, log_sj,
        out_p, out_sj, 3, 15, 16, 64, (dist, bo, ea0, ea1), blk,
        carray(stack_empty(64), 64).view(np.int64),
        (carray(stack_empty(16), 16), carray(stack_empty(16), 16),
         carray(stack_empty(16), 16)),
        (carray(stack_empty(48), 48), carray(stack_empty(48), 48),
         carray(stack_empty(48), 48), carray(stack_empty(48), 48),
         carray(stack_empty(48), 48), carray(stack_empty(48), 48)),
        (carray(stack_empty(3), 3), carray(stack_empty(3), 3), carray(stack_empty(3), 3),
         carray(stack_empty(3), 3), carray(stack_empty(3), 3), carray(stack_empty(3), 3)),
    )  # fmt: skip


@njit(cache=True, inline="always")
def _lanes_tree(W, L, nl):
    """W[0, l] = sum_t W[t, l] for every lane l, by :func:`tree_sum`'s halving (the same adds in
    the same order per lane). Overwrites W[:L]."""
    h = L // 2
    while h >= 1:
        for i in range(h):
            for lane in range(nl):
                W[i, lane] += W[i + h, lane]
        h //= 2


@njit(cache=True, inline="always", error_model="numpy")
def _lanes_ln(X, out, sign, nl):
    """out[l] = sign ln(X[0, l]) for every lane: :func:`ln_fast`'s values, vectorised
    (:func:`ln_core`, then ``math.log`` for the lanes outside its domain, if any)."""
    n_bad = 0
    for lane in range(nl):
        out[lane] = sign * ln_core(X[0, lane])
        n_bad += 0 if ln_ok(X[0, lane]) else 1
    if n_bad > 0:
        for lane in range(nl):
            if not ln_ok(X[0, lane]):
                out[lane] = sign * math.log(X[0, lane])


@njit(cache=True, inline="always", error_model="numpy")
def _brier_lanes_body(
    p, y, op_event, op_kind, op_offsets, order, start, rates, passive, active, capital, log_sj,
    out_p, out_sj, n_rates, n_fun, L, consts, blk, state, mats, vecs, ints,
):  # fmt: skip
    """Streams ``order[0], order[1], ...`` through ``BRIER_LANES`` lanes, one operation per lane
    per step, with exactly the operations of :func:`_brier_one_stream` (see the section comment).

    Lanes are refilled from ``order`` as their streams end. Once ``order`` is exhausted and fewer
    than half the lanes are busy, the busy streams are handed back: their state is written to
    ``passive``/``active``/``capital``/``log_sj`` and ``start[s]`` is set to their next
    operation, so the one-stream engine finishes them.

    Scratch (lane index last): ``consts``, ``blk`` those of :func:`_brier_factors` for a block
    of the lanes' events; ``state``: ``A``, ``CAP`` (R, L, lanes), pad slots t >= T at 0,
    ``LSJ`` (R, lanes), ``PW`` (lanes); ``mats`` (L, lanes each): ``MX`` (one rate's mixed A),
    ``CM`` (its mixed capital), ``W``, ``Q1`` (tree sums), ``COL``; ``vecs`` (lanes each):
    ``PWN``, ``TOT``, ``V``, ``LG``, ``G0``; ``ints`` (lanes each, int64): ``evb``, ``upd``,
    ``fc``, ``busy``, ``lane_stream``, ``lane_op``, ``lane_end``.
    """
    ext, ratt, exy = blk[6], blk[7], blk[8]
    A, CAP, LSJ, PW = state
    MX, CM, W, Q1, COL = mats
    PWN, TOT, V, LG, G0 = vecs
    evb, upd, fc, busy, lane_stream, lane_op, lane_end = ints
    nl = BRIER_LANES
    n_streams = order.shape[0]
    EXT = ext[: 2 * L * nl].reshape((2 * L, nl))
    RAT = ratt[: L * nl].reshape((L, nl))
    EXY = exy[: L * nl].reshape((L, nl))
    for lane in range(nl):
        busy[lane] = 0
        lane_op[lane] = 0
        lane_end[lane] = 0
        PW[lane] = 0.5
    for j in range(n_rates):  # idle lanes compute on a valid state (no NaN/inf traffic)
        for t in range(L):
            for lane in range(nl):
                A[j, t, lane] = 0.5 / (n_rates * n_fun) if t < n_fun else 0.0
                CAP[j, t, lane] = 1.0 / n_fun if t < n_fun else 0.0
        for lane in range(nl):
            LSJ[j, lane] = 0.0
    k = 0  # next position in order
    n_busy = 0
    while True:
        for lane in range(nl):  # refill idle lanes
            if busy[lane] != 0:
                continue
            k, s = take_stream(
                lane, order, k, start, op_offsets, busy, lane_stream, lane_op, lane_end
            )
            if s < 0:
                continue
            n_busy += 1
            for j in range(n_rates):
                for t in range(n_fun):
                    A[j, t, lane] = active[s, j, t]
                    CAP[j, t, lane] = capital[s, j, t]
                LSJ[j, lane] = log_sj[s, j]
            PW[lane] = passive[s]
        if n_busy == 0 or (k == n_streams and 2 * n_busy < nl):
            break
        steps = steps_to_first_end(busy, lane_op, lane_end, nl)
        for _ in range(steps):
            for lane in range(nl):
                o = lane_op[lane]
                kind = op_kind[o]
                evb[lane] = op_event[o]
                upd[lane] = busy[lane] & (kind != OP_FORECAST)
                fc[lane] = busy[lane] & (kind != OP_UPDATE)
            _brier_factors(p, y, evb, nl, nl, L, n_fun, consts, blk)
            # P e^{-Brier(y, p)} (kept where upd, after the normalisation below).
            for lane in range(nl):
                PWN[lane] = PW[lane] * EXY[n_fun, lane]
                TOT[lane] = PWN[lane]
            # For each rate: jump mixing, col += mixed, and the update A <- mixed e^{-Brier(y, f)}
            # (kept where upd); TOT = P e^{-Brier(y, p)} + sum_J sum_t of those.
            for j in range(n_rates):
                for t in range(L):
                    for lane in range(nl):
                        W[t, lane] = A[j, t, lane]
                _lanes_tree(W, L, nl)
                jr = rates[j]
                keep = 1.0 - jr
                for lane in range(nl):
                    V[lane] = W[0, lane] * jr / n_fun
                for t in range(n_fun):
                    for lane in range(nl):
                        MX[t, lane] = keep * A[j, t, lane] + V[lane]
                for t in range(n_fun, L):
                    for lane in range(nl):
                        MX[t, lane] = 0.0
                if j == 0:
                    for t in range(L):
                        for lane in range(nl):
                            COL[t, lane] = MX[t, lane]
                else:
                    for t in range(L):
                        for lane in range(nl):
                            COL[t, lane] += MX[t, lane]
                for t in range(L):
                    for lane in range(nl):
                        v = MX[t, lane] * EXY[t, lane]
                        W[t, lane] = v
                        A[j, t, lane] = v if upd[lane] != 0 else A[j, t, lane]
                _lanes_tree(W, L, nl)
                for lane in range(nl):
                    TOT[lane] += W[0, lane]
            # Forecast: g_c = -ln(P e^{-Brier(c, p)} + sum_t col[t] e^{-Brier(c, f_t)}).
            for lane in range(nl):
                COL[n_fun, lane] = PW[lane]
            for t in range(L):
                for lane in range(nl):
                    W[t, lane] = COL[t, lane] * EXT[t, lane]
                    Q1[t, lane] = COL[t, lane] * EXT[L + t, lane]
            _lanes_tree(W, L, nl)
            _lanes_tree(Q1, L, nl)
            _lanes_ln(W, G0, -1.0, nl)
            _lanes_ln(Q1, LG, -1.0, nl)
            for lane in range(nl):
                g0, g1 = G0[lane], LG[lane]
                sc = (2.0 + (g0 + g1)) / 2.0
                v0 = min(max((sc - g0) / 2.0, 0.0), 1.0)
                v1 = min(max((sc - g1) / 2.0, 0.0), 1.0)
                V[lane] = v1 / (v0 + v1)
            # Capital and log10 SJ (kept where upd).
            for j in range(n_rates):
                jr = rates[j]
                keep = 1.0 - jr
                share = jr / n_fun
                for t in range(n_fun):
                    for lane in range(nl):
                        CM[t, lane] = (keep * CAP[j, t, lane] + share) * RAT[t, lane]
                for t in range(n_fun, L):
                    for lane in range(nl):
                        CM[t, lane] = 0.0
                for t in range(L):
                    for lane in range(nl):
                        W[t, lane] = CM[t, lane]
                _lanes_tree(W, L, nl)
                _lanes_ln(W, LG, 1.0, nl)
                for lane in range(nl):
                    if upd[lane] != 0:
                        LSJ[j, lane] += LG[lane] * INV_LN10
                    G0[lane] = 1.0 / W[0, lane]
                for t in range(L):
                    for lane in range(nl):
                        v = CM[t, lane] * G0[lane]
                        CAP[j, t, lane] = v if upd[lane] != 0 else CAP[j, t, lane]
            # Normalise P and A.
            for lane in range(nl):
                G0[lane] = 1.0 / TOT[lane]
                if upd[lane] != 0:
                    PW[lane] = PWN[lane] * G0[lane]
            for j in range(n_rates):
                for t in range(L):
                    for lane in range(nl):
                        v = A[j, t, lane]
                        A[j, t, lane] = v * G0[lane] if upd[lane] != 0 else v
            for lane in range(nl):  # outputs: scattered to the lanes' events
                if fc[lane] != 0:
                    e = evb[lane]
                    out_p[e] = V[lane]
                    for j in range(n_rates):
                        out_sj[e, j] = LSJ[j, lane]
                lane_op[lane] += 1
        for lane in range(nl):  # retire finished lanes
            if busy[lane] != 0 and lane_op[lane] == lane_end[lane]:
                s = lane_stream[lane]
                _brier_lane_out(lane, s, n_fun, A, CAP, LSJ, PW, active, capital, log_sj, passive)
                start[s] = lane_end[lane]
                busy[lane] = 0
                n_busy -= 1
    for lane in range(nl):  # hand the busy streams back to the one-stream engine
        if busy[lane] != 0:
            s = lane_stream[lane]
            _brier_lane_out(lane, s, n_fun, A, CAP, LSJ, PW, active, capital, log_sj, passive)
            start[s] = lane_op[lane]


@njit(cache=True, inline="always")
def _brier_lane_out(lane, s, n_fun, A, CAP, LSJ, PW, active, capital, log_sj, passive):
    """Write lane ``lane``'s state back to stream ``s`` (on retiring it or handing it back); the
    lane arrays are padded past ``n_fun`` functions, the stream's are not."""
    for j in range(A.shape[0]):
        for t in range(n_fun):
            active[s, j, t] = A[j, t, lane]
            capital[s, j, t] = CAP[j, t, lane]
        log_sj[s, j] = LSJ[j, lane]
    passive[s] = PW[lane]


@njit(cache=True, inline="always")
def _lanes_ints():
    """The int64 per-lane scratch of :func:`_brier_lanes_body`, on the stack."""
    return (
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
        carray(stack_empty(64), BRIER_LANES).view(np.int64),
    )


@njit(cache=True, inline="always")
def _lanes_vecs():
    """The float64 per-lane scratch of :func:`_brier_lanes_body`, on the stack."""
    return (
        carray(stack_empty(64), BRIER_LANES), carray(stack_empty(64), BRIER_LANES),
        carray(stack_empty(64), BRIER_LANES), carray(stack_empty(64), BRIER_LANES),
        carray(stack_empty(64), BRIER_LANES),
    )  # fmt: skip


@njit(cache=True, error_model="numpy")
def brier_lanes(
    p, y, op_event, op_kind, op_offsets, order, start, betas, alphas, rates, passive, active,
    capital, log_sj, out_p, out_sj,
):  # fmt: skip
    """:func:`_brier_lanes_body` for any shape (R, T), with heap scratch for the arrays whose
    size depends on it (literal sizes and stack scratch measured no faster here: the loops over
    the 64 lanes vectorise either way)."""
    n_rates, n_fun = active.shape[1], active.shape[2]
    L = _brier_width(n_fun)
    nl = BRIER_LANES
    bo, ea0, ea1 = np.empty(L), np.empty(L), np.empty(L)
    dist = _brier_consts(betas, alphas, L, np.empty(n_fun), bo, ea0, ea1)
    blk = (
        np.empty(nl), np.empty(nl), np.empty(nl), np.empty(n_fun * nl), np.empty(n_fun * nl),
        np.empty(2 * L * nl), np.empty(2 * L * nl), np.empty(L * nl), np.empty(L * nl),
    )  # fmt: skip
    state = (
        np.empty((n_rates, L, nl)), np.empty((n_rates, L, nl)), np.empty((n_rates, nl)),
        np.empty(nl),
    )  # fmt: skip
    mats = (
        np.empty((L, nl)), np.empty((L, nl)), np.empty((L, nl)), np.empty((L, nl)),
        np.empty((L, nl)),
    )  # fmt: skip
    _brier_lanes_body(
        p, y, op_event, op_kind, op_offsets, order, start, rates, passive, active, capital,
        log_sj, out_p, out_sj, n_rates, n_fun, L, (dist, bo, ea0, ea1), blk, state, mats,
        _lanes_vecs(), _lanes_ints(),
    )  # fmt: skip
