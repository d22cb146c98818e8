"""The log-loss mixture of the protected predictors: Jumper, Mean Jumper and Composite Jumper,
binary and K classes (paper 000 Algorithm 2 and its test martingale, Algorithm 1; paper 001
Algorithm 1).

Public entry points: :func:`mixture_binary`, :func:`mixture_multiclass` (all streams of a batch
over an operation list, :mod:`calpipe.kernels.ops`), :func:`binary_event` (one event of one
stream, in place: the online form), :func:`jump_mix` (the jump-mixing step,
the one copy every kernel and the serving map use; :func:`jump_mix_restart` its form with a
non-uniform jump distribution, the default method's) and :func:`serving_weights` (the weights of
the serving map p -> p' of a state).

Mixture recursion (log loss)
----------------------------
One kernel covers the three log-loss predictors; they differ only in the initial state
(see :mod:`calpipe.calibrators.protected`). With passive weight P, active weights A[J, theta]
(normalised: P + sum A = 1), jumping rates J and calibrating functions f_theta, each update is
paper 001, Algorithm 1, lines 4-15:

    A[J, theta] <- (1 - J) A[J, theta] + J / |Theta| * sum_theta' A[J, theta']       (jump-mixing)
    p'          <- P p + sum_{J, theta} A[J, theta] f_theta(p)                         (forecast)
    P           <- P B_p({y}),  A[J, theta] <- A[J, theta] B_{f_theta(p)}({y})        (Bayes)
    C           <- P + sum A  ( = p'(y), because the weights summed to 1 )
    P, A        <- P / C, A / C                                                        (renormalise)
    log10 S     <- log10 S + log10 C - log10 B_p({y})                                  (gale ratio)

With P = 0 and one rate this is the Jumper predictor (paper 000, Algorithm 2) and log10 S is its
test martingale (Algorithm 1, by Lemma 1 of paper 000 §4: the gale of the mixture over the base
gale); with P = 0 and several rates of equal prior it is the Mean Jumper. B_q({y}) is q if y = 1
and 1 - q if y = 0 (binary), q_y (multiclass).

Speed and reproducibility
-------------------------
Every sum is taken in one fixed order (the order of the loops above), so a run is deterministic
and k chunks with the state carried equal one pass bit for bit. The binary kernel runs each
stream through one of two engines that execute the same floating-point operations (see its
section): a stream's outputs do not depend on the other streams of its batch. Its log10 S uses
:func:`_log10_at` (fdlibm's log, within 2 ulp of libm's log10) instead of a libm call; the
multiclass and K-class Brier kernels use ``math.log10``. The binary Brier kernel has the same
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from calpipe.kernels.calfun import distinct_betas, eval_binary, eval_binary_lanes, eval_multiclass_t
from calpipe.kernels.numeric import (
    LANE_CAP,
    LANE_FUN_CAP,
    LANE_RATE_CAP,
    LANES,
    is_normal,
    log10_core,
    stack_empty,
    steps_to_first_end,
    take_stream,
)
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE


@njit(cache=True, inline="always")
def jump_mix(active, rates, mixed, col_sum):
    """The jump-mixing step (paper 001 Algorithm 1 line 5; paper 000 Algorithm 2 line 3).

    mixed[j, t] = (1 - J_j) A[j, t] + J_j / |Theta| sum_t' A[j, t'] and col_sum[t] =
    sum_j mixed[j, t], for active weights ``active`` (R, T) and jumping rates ``rates`` (R,):
    with probability J_j the Jumper of rate J_j leaves its calibrating function for one drawn
    uniformly from the family. ``mixed`` (R, T) and ``col_sum`` (T,) are written; the sums run
    in t order, then j order, the order every engine of this module uses (the lane engine fuses
    the same operations with the Bayes step).
    """
    n_rates, n_fun = active.shape
    for t in range(n_fun):
        col_sum[t] = 0.0
    for j in range(n_rates):
        tot = 0.0
        for t in range(n_fun):
            tot += active[j, t]
        jr = rates[j]
        add = tot * jr / n_fun
        keep = 1.0 - jr
        for t in range(n_fun):
            v = keep * active[j, t] + add
            mixed[j, t] = v
            col_sum[t] += v


@njit(cache=True, inline="always")
def jump_mix_restart(active, rates, uniform, restart_to, mixed, col_sum):
    """:func:`jump_mix` with a jump distribution that is not uniform: a jump of the Jumper of
    rate J goes to a uniform expert with probability ``uniform`` = 1 - w and to expert t with
    probability ``restart_to[t]`` (summing to w; :func:`restart_terms`), i.e.

        mixed[j, t] = (1 - J_j) A[j, t] + (g_j (1 - w) / |Theta| + g_j restart_to[t]),
        g_j = J_j sum_t' A[j, t'],

    in this order (every engine of the default method uses it). With w = 0 (``uniform`` 1,
    ``restart_to`` 0) every operation gives :func:`jump_mix`'s bits: g (1 - w) = g and
    x + 0 = x. Paper 000 §3 derandomises the Markov chain "stay with probability 1 - J, else
    draw from mu"; its guarantee (the Bayes mixture over expert sequences) holds for any jump
    distribution mu, a switch to expert t costing ln(1 / (J mu(t))) instead of ln(|Theta| / J).
    """
    n_rates, n_fun = active.shape
    for t in range(n_fun):
        col_sum[t] = 0.0
    for j in range(n_rates):
        tot = 0.0
        for t in range(n_fun):
            tot += active[j, t]
        g = tot * rates[j]
        add = g * uniform / n_fun
        keep = 1.0 - rates[j]
        for t in range(n_fun):
            v = keep * active[j, t] + (add + g * restart_to[t])
            mixed[j, t] = v
            col_sum[t] += v


def restart_terms(restart: float, restart_to, n_exp: int) -> tuple[float, np.ndarray]:
    """``(uniform, restart_to)`` for :func:`jump_mix_restart` from the probability ``restart``
    w in [0, 1) that a jump goes to the distribution ``restart_to`` (n_exp,) (None: no
    restart) rather than to a uniform expert: (1 - w, w restart_to), computed once here so that
    every engine reads the same numbers."""
    if restart_to is None or restart == 0.0:
        return 1.0, np.zeros(n_exp)
    to = np.ascontiguousarray(restart_to, dtype=np.float64)
    if to.shape != (n_exp,) or np.any(to < 0) or not 0.0 <= restart < 1.0:
        raise ValueError(
            f"restart must be in [0, 1) and restart_to (E = {n_exp},) nonnegative; got "
            f"{restart} and shape {to.shape}"
        )
    return 1.0 - float(restart), float(restart) * to


@njit(cache=True)
def _serving_weights(active, rates):
    n_streams, n_rates, n_fun = active.shape
    weights = np.empty((n_streams, n_fun))
    mixed = np.empty((n_rates, n_fun))
    for s in range(n_streams):
        jump_mix(active[s], rates, mixed, weights[s])
    return weights


@njit(cache=True)
def _serving_weights_restart(active, rates, uniform, restart_to):
    n_streams, n_rates, n_fun = active.shape
    weights = np.empty((n_streams, n_fun))
    mixed = np.empty((n_rates, n_fun))
    for s in range(n_streams):
        jump_mix_restart(active[s], rates, uniform, restart_to, mixed, weights[s])
    return weights


def serving_weights(
    active: np.ndarray, rates: np.ndarray, restart: float = 0.0, restart_to=None
) -> np.ndarray:
    """Weights W (S, T) of the serving map of S states: W[s, t] = sum_J mixed^J_t.

    The serving map of a state is its next forecast (the mixture after the next jump-mixing
    step): p' = P p + sum_t W[t] f_t(p) on the clipped p, where P is the passive weight (which
    jump mixing leaves alone) and mixed = :func:`jump_mix` of the active weights (with a
    ``restart`` w > 0 towards ``restart_to``: :func:`jump_mix_restart`, as the default method's
    kernels). ``active`` (S, R, T) and ``rates`` (R,) as in :func:`mixture_binary`.

    >>> import numpy as np
    >>> a = np.array([[[0.5, 0.0, 0.0]]])  # P = 0.5, all active weight on the identity
    >>> serving_weights(a, np.array([0.3])).round(3).tolist()  # 0.7 * 0.5 + 0.3 * 0.5 / 3
    [[0.4, 0.05, 0.05]]
    >>> serving_weights(a, np.array([0.3]), 0.5, np.array([1.0, 0, 0])).round(3).tolist()
    [[0.45, 0.025, 0.025]]
    """
    active = np.ascontiguousarray(active, dtype=np.float64)
    rates = np.ascontiguousarray(rates, dtype=np.float64)
    if active.ndim != 3 or rates.shape != (active.shape[1],):
        raise ValueError(
            f"active must be (S, R, T) and rates (R,); got {active.shape} and {rates.shape}"
        )
    if restart_to is None or restart == 0.0:
        return _serving_weights(active, rates)
    uniform, to = restart_terms(restart, restart_to, active.shape[2])
    return _serving_weights_restart(active, rates, uniform, to)


# --------------------------------------------------------------------------------------------
# Log-loss mixture: binary.
#
# Two engines run the same floating-point operations in the same order, so a stream's outputs
# are bit-identical whichever runs it (and whatever other streams share the batch):
#
# * one stream at a time (`_binary_stream`): the recursion is a chain of dependent sums (jump
#   mixing, then the Bayes numerator C, then 1 / C), so one stream is bound by the latency of
#   that chain. The default Composite Jumper shape is compiled with literal sizes and stack
#   scratch, which puts its 27 weights in registers (`_binary_streams_3x9`);
# * 64 streams at a time (`_binary_lanes`): lane l of every scratch array holds one stream, each
#   step advances every lane by one operation, and the loops over lanes vectorise (8 doubles per
#   AVX-512 instruction) while the 64 independent chains hide each other's latency. Used when a
#   batch has at least 128 streams; about 3x the one-stream engine's events/s.
#
# Each engine is its own compiled function, dispatched from Python by `mixture_binary`: numba
# compiles only the engines a batch needs, and LLVM optimises each alone (inlining the lanes
# engine into a common caller measured 30 % slower). `error_model="numpy"` lets a division by
# zero give inf instead of raising, so divisions vectorise; with p clipped into (0, 1) and
# positive weights no divisor here is zero.
# --------------------------------------------------------------------------------------------


@njit(cache=True, inline="always", error_model="numpy")
def _binary_stream(
    p, y, op_event, op_kind, lo, hi, code, params, exp_alpha, rates, n_rates, n_fun,
    a, pw, m, out_p, out_m, f, mixed, col, rat, rat_bits,
):  # fmt: skip
    """Operations lo..hi-1 of one stream, in order (the recursion of the module docstring).

    ``a`` holds the stream's active weights A[j, t] at a[j * n_fun + t] and is updated in place;
    ``f``, ``mixed`` (R*T) and ``col`` (T) are scratch, ``rat`` one-element scratch with its
    int64 view (for :func:`is_normal`). Returns the new (P, log10 S).
    """
    a2 = a.reshape((n_rates, n_fun))  # (R, T) views of the flat weights, for jump_mix
    mixed2 = mixed.reshape((n_rates, n_fun))
    for o in range(lo, hi):
        e = op_event[o]
        kind = op_kind[o]
        pe = p[e]
        eval_binary(code, params, exp_alpha, pe, f, n_fun)
        jump_mix(a2, rates, mixed2, col)  # paper 001 Alg. 1 line 5
        if kind != OP_UPDATE:
            pred = pw * pe
            for t in range(n_fun):
                pred += col[t] * f[t]
            out_p[e] = pred
        if kind != OP_FORECAST:
            # B_q({y}): q for y = 1, 1 - q for y = 0 (f becomes B_f({y}) in place).
            base = pe
            if y[e] == 0:
                base = 1.0 - pe
                for t in range(n_fun):
                    f[t] = 1.0 - f[t]
            pw = pw * base
            c = pw
            for j in range(n_rates):
                for t in range(n_fun):
                    v = mixed[j * n_fun + t] * f[t]
                    a[j * n_fun + t] = v
                    c += v
            # c = p'(y): the weights summed to 1 before the Bayes step.
            rat[0] = c / base
            if is_normal(rat_bits[0]):
                m += log10_core(rat[0])
            else:
                m += math.log10(rat[0])
            inv = 1.0 / c
            pw = pw * inv
            for i in range(n_rates * n_fun):
                a[i] *= inv
        if kind != OP_UPDATE:
            out_m[e] = m
    return pw, m


@njit(cache=True, inline="always", error_model="numpy")
def _binary_streams_body(
    p, y, op_event, op_kind, op_offsets, start, code, params, rates, passive, active, log10m,
    out_p, out_m, n_rates, n_fun, a, f, mixed, col, prm, ea, rr,
):  # fmt: skip
    """Every stream s with operations left (start[s] < op_offsets[s + 1]) through
    :func:`_binary_stream`. The family parameters, e^alpha and the rates are copied into the
    scratch ``prm`` (T, 2), ``ea`` (T), ``rr`` (R) first: with literal sizes they become
    registers instead of loads the compiler must repeat after every output store."""
    for t in range(n_fun):
        prm[t, 0] = params[t, 0]
        prm[t, 1] = params[t, 1]
        ea[t] = math.exp(params[t, 0])
    for j in range(n_rates):
        rr[j] = rates[j]
    rat = carray(stack_empty(1), 1)
    rat_bits = rat.view(np.int64)
    for s in range(op_offsets.shape[0] - 1):
        lo, hi = start[s], op_offsets[s + 1]
        if lo >= hi:
            continue
        for j in range(n_rates):
            for t in range(n_fun):
                a[j * n_fun + t] = active[s, j, t]
        pw, m = _binary_stream(
            p, y, op_event, op_kind, lo, hi, code, prm, ea, rr, n_rates, n_fun,
            a, passive[s], log10m[s], out_p, out_m, f, mixed, col, rat, rat_bits,
        )  # fmt: skip
        for j in range(n_rates):
            for t in range(n_fun):
                active[s, j, t] = a[j * n_fun + t]
        passive[s] = pw
        log10m[s] = m


@njit(cache=True, error_model="numpy")
def _binary_streams(
    p, y, op_event, op_kind, op_offsets, start, code, params, rates, passive, active, log10m,
    out_p, out_m,
):  # fmt: skip
    """:func:`_binary_streams_body` for any shape (R, T), with heap scratch."""
    n_rates, n_fun = active.shape[1], active.shape[2]
    _binary_streams_body(
        p, y, op_event, op_kind, op_offsets, start, code, params, rates, passive, active, log10m,
        out_p, out_m, n_rates, n_fun, np.empty(n_rates * n_fun), np.empty(n_fun),
        np.empty(n_rates * n_fun), np.empty(n_fun), np.empty((n_fun, 2)), np.empty(n_fun),
        np.empty(n_rates),
    )  # fmt: skip


@njit(cache=True, error_model="numpy")
def _binary_streams_3x9(
    p, y, op_event, op_kind, op_offsets, start, code, params, rates, passive, active, log10m,
    out_p, out_m,
):  # fmt: skip
    """:func:`_binary_streams_body` for the default Composite Jumper (3 rates x 9 cox2
    functions): literal sizes and stack scratch, so the 27 weights live in registers (about 1.4x
    faster per stream than :func:`_binary_streams`, same results)."""
    _binary_streams_body(
        p, y, op_event, op_kind, op_offsets, start, code, params, rates, passive, active, log10m,
        out_p, out_m, 3, 9, carray(stack_empty(27), 27), carray(stack_empty(9), 9),
        carray(stack_empty(27), 27), carray(stack_empty(9), 9),
        carray(stack_empty(18), (9, 2)), carray(stack_empty(9), 9), carray(stack_empty(3), 3),
    )  # fmt: skip


@njit(cache=True, inline="always")
def _lane_sums(A, sum_a, lane):
    """sum_a[j, lane] = sum_t A[j, t, lane], in t order (the one-stream engine's order)."""
    for j in range(A.shape[0]):
        tot = 0.0
        for t in range(A.shape[1]):
            tot += A[j, t, lane]
        sum_a[j, lane] = tot


@njit(cache=True, inline="always")
def _binary_lane_out(lane, s, A, PW, M, active, passive, log10m):
    """Write lane ``lane``'s state back to stream ``s`` (on retiring it or handing it back)."""
    for j in range(A.shape[0]):
        for t in range(A.shape[1]):
            active[s, j, t] = A[j, t, lane]
    passive[s] = PW[lane]
    log10m[s] = M[lane]


@njit(cache=True, error_model="numpy")
def _binary_lanes(
    p, y, op_event, op_kind, op_offsets, order, start, code, params, rates,
    passive, active, log10m, out_p, out_m,
):  # fmt: skip
    """Streams ``order[0], order[1], ...`` through ``LANES`` lanes, one operation per lane per
    step, with exactly the operations of :func:`_binary_stream` (see the section comment).

    Lanes are refilled from ``order`` as their streams end. Once ``order`` is exhausted and fewer
    than half the lanes are busy, the busy streams are handed back: their state is written to
    ``passive``/``active``/``log10m`` and ``start[s]`` is set to their next operation, so the
    one-stream engine finishes them (one long stream never runs in a nearly empty lane set).
    """
    n_streams = order.shape[0]
    n_rates, n_fun = active.shape[1], active.shape[2]
    exp_alpha = np.exp(params[:, 0])
    nl = LANES
    # Scratch, lane index last: A, V (R, T, lanes); F, COL (T, lanes); vectors (lanes,).
    A = carray(stack_empty(4096), LANE_CAP)[: n_rates * n_fun * nl].reshape((n_rates, n_fun, nl))
    V = carray(stack_empty(4096), LANE_CAP)[: n_rates * n_fun * nl].reshape((n_rates, n_fun, nl))
    F = carray(stack_empty(1024), LANE_FUN_CAP)[: n_fun * nl].reshape((n_fun, nl))
    COL = carray(stack_empty(1024), LANE_FUN_CAP)[: n_fun * nl].reshape((n_fun, nl))
    PW = carray(stack_empty(64), LANES)  # P
    M = carray(stack_empty(64), LANES)  # log10 S
    X = carray(stack_empty(64), LANES)  # base forecast p of the lane's event
    BASE = carray(stack_empty(64), LANES)  # B_p({y})
    PWB = carray(stack_empty(64), LANES)  # P B_p({y})
    C = carray(stack_empty(64), LANES)  # Bayes numerator = p'(y)
    TOT = carray(stack_empty(64), LANES)  # jump-mixing shift of one rate; a running sum
    # SUM_A[j, l] = sum_t A[j, t, l], summed in t order as the one-stream engine sums it; kept up
    # to date when A changes, instead of re-summing A at every step.
    SUM_A = carray(stack_empty(512), LANE_RATE_CAP)[: n_rates * nl].reshape((n_rates, nl))
    PRED = carray(stack_empty(64), LANES)  # protected forecast p'
    INV = carray(stack_empty(64), LANES)  # 1 / C
    RAT = carray(stack_empty(64), LANES)  # C / B_p({y}): the martingale's factor
    LOGR = carray(stack_empty(64), LANES)  # log10 RAT
    RAT_BITS = RAT.view(np.int64)
    Q = carray(stack_empty(64), LANES)
    SP = carray(stack_empty(64), LANES)
    SQ = carray(stack_empty(64), LANES)
    # Per-lane integers and flags (0/1), on the stack too: LLVM then sees that storing them
    # cannot change the input arrays, and the gather loop below vectorises.
    y0 = carray(stack_empty(64), LANES).view(np.int64)  # label is 0 (else 1)
    upd = carray(stack_empty(64), LANES).view(np.int64)  # this step updates the state
    fc = carray(stack_empty(64), LANES).view(np.int64)  # this step forecasts
    busy = carray(stack_empty(64), LANES).view(np.int64)
    lane_stream = carray(stack_empty(64), LANES).view(np.int64)
    lane_op = carray(stack_empty(64), LANES).view(np.int64)  # next op (idle lanes: op 0)
    lane_end = carray(stack_empty(64), LANES).view(np.int64)
    lane_event = carray(stack_empty(64), LANES).view(np.int64)
    for lane in range(LANES):
        busy[lane] = 0
        lane_op[lane] = 0
        lane_end[lane] = 0
    for j in range(n_rates):  # idle lanes compute on a valid state (no NaN/inf traffic)
        for t in range(n_fun):
            for lane in range(nl):
                A[j, t, lane] = 1.0 / (n_rates * n_fun + 1.0)
    for lane in range(nl):
        PW[lane] = 1.0 / (n_rates * n_fun + 1.0)
        M[lane] = 0.0
        _lane_sums(A, SUM_A, lane)
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
            _lane_sums(A, SUM_A, lane)
            PW[lane] = passive[s]
            M[lane] = log10m[s]
        if n_busy == 0 or (k == n_streams and 2 * n_busy < nl):
            break
        steps = steps_to_first_end(busy, lane_op, lane_end, nl)
        for _ in range(steps):
            for lane in range(nl):
                o = lane_op[lane]
                e = op_event[o]
                kind = op_kind[o]
                lane_event[lane] = e
                x = p[e]
                X[lane] = x
                is0 = y[e] == 0
                y0[lane] = is0
                upd[lane] = busy[lane] & (kind != OP_FORECAST)
                fc[lane] = busy[lane] & (kind != OP_UPDATE)
                b = 1.0 - x if is0 else x
                BASE[lane] = b
                PWB[lane] = PW[lane] * b
                C[lane] = PWB[lane]
            eval_binary_lanes(code, params, exp_alpha, X, F, n_fun, nl, Q, SP, SQ)
            # Jump mixing and the Bayes numerator, fused: COL = sum_J mixed, V = mixed B_f({y}).
            for t in range(n_fun):
                for lane in range(nl):
                    COL[t, lane] = 0.0
            for j in range(n_rates):
                jr = rates[j]
                keep = 1.0 - jr
                for lane in range(nl):
                    TOT[lane] = SUM_A[j, lane] * jr / n_fun
                for t in range(n_fun):
                    for lane in range(nl):
                        v = keep * A[j, t, lane] + TOT[lane]
                        COL[t, lane] += v
                        ft = F[t, lane]
                        w = v * (1.0 - ft if y0[lane] != 0 else ft)
                        V[j, t, lane] = w
                        C[lane] += w
            for lane in range(nl):
                PRED[lane] = PW[lane] * X[lane]
            for t in range(n_fun):
                for lane in range(nl):
                    PRED[lane] += COL[t, lane] * F[t, lane]
            for lane in range(nl):
                INV[lane] = 1.0 / C[lane]
                RAT[lane] = C[lane] / BASE[lane]
                if upd[lane] != 0:
                    PW[lane] = PWB[lane] * INV[lane]
            for lane in range(nl):
                LOGR[lane] = log10_core(RAT[lane])
            for j in range(n_rates):
                for lane in range(nl):
                    TOT[lane] = 0.0
                for t in range(n_fun):
                    for lane in range(nl):
                        if upd[lane] != 0:
                            v = V[j, t, lane] * INV[lane]
                            A[j, t, lane] = v
                            TOT[lane] += v
                for lane in range(nl):
                    if upd[lane] != 0:
                        SUM_A[j, lane] = TOT[lane]
            for lane in range(nl):  # log10_core covers normal numbers only
                if upd[lane] != 0 and not is_normal(RAT_BITS[lane]):
                    LOGR[lane] = math.log10(RAT[lane])
            for lane in range(nl):
                if upd[lane] != 0:
                    M[lane] += LOGR[lane]
                lane_op[lane] += 1
            for lane in range(nl):  # outputs: scattered to the lanes' events
                if fc[lane] != 0:
                    out_p[lane_event[lane]] = PRED[lane]
                    out_m[lane_event[lane]] = M[lane]
        for lane in range(nl):  # retire finished lanes
            if busy[lane] != 0 and lane_op[lane] == lane_end[lane]:
                _binary_lane_out(lane, lane_stream[lane], A, PW, M, active, passive, log10m)
                start[lane_stream[lane]] = lane_end[lane]
                busy[lane] = 0
                n_busy -= 1
    for lane in range(nl):  # hand the busy streams back to the one-stream engine
        if busy[lane] != 0:
            _binary_lane_out(lane, lane_stream[lane], A, PW, M, active, passive, log10m)
            start[lane_stream[lane]] = lane_op[lane]


@njit(cache=True, error_model="numpy")
def binary_event(pe, ye, kind, code, params, rates, a, pm):
    """One operation of one binary stream, in place: the online form of :func:`mixture_binary`
    for callers that see one event at a time (``calpipe.river.Protected``).

    ``pe`` the clipped base P(y=1); ``ye`` the label (read by updates); ``kind`` an operation of
    :mod:`calpipe.kernels.ops` (a forecast then an update of the same event = one step);
    ``a`` (R*T) the active weights A[j, t] at a[j * T + t] and ``pm`` = [P, log10 S]: the
    caller's own state buffers, **updated in place** (unlike the batch kernels, which return a
    new state: per-event allocation would cost more than the recursion). Runs
    :func:`_binary_stream` itself, so the outputs are bit-identical to a batch.
    Returns the forecast p' (NaN for an update).
    """
    n_rates, n_fun = rates.shape[0], params.shape[0]
    ea = np.empty(n_fun)
    for t in range(n_fun):
        ea[t] = math.exp(params[t, 0])
    p1 = np.full(1, pe)
    y1 = np.full(1, ye, dtype=np.int8)
    ev = np.zeros(1, dtype=np.int64)
    kd = np.full(1, kind, dtype=np.int8)
    out_p = np.full(1, np.nan)
    out_m = np.full(1, np.nan)
    rat = np.empty(1)
    pw, m = _binary_stream(
        p1, y1, ev, kd, 0, 1, code, params, ea, rates, n_rates, n_fun, a, pm[0], pm[1],
        out_p, out_m, np.empty(n_fun), np.empty(n_rates * n_fun), np.empty(n_fun),
        rat, rat.view(np.int64),
    )  # fmt: skip
    pm[0] = pw
    pm[1] = m
    return out_p[0]


def mixture_binary(
    p, y, op_event, op_kind, op_offsets, code, params, rates, passive0, active0, log10m0
):
    """Binary log-loss mixture over all streams (see the module docstring).

    Parameters: p (n,) clipped base P(y=1); y (n,) int8 in {0, 1}, read only by updates;
    op_event (m,) int64; op_kind (m,) int8; op_offsets (S+1,) int64; code int; params (T, 2);
    rates (R,); passive0 (S,); active0 (S, R, T); log10m0 (S,).

    Returns (protected (n,), log10m (n,), passive (S,), active (S, R, T), log10m_end (S,)).
    Events without a forecast operation keep NaN. Each event is forecast by at most one stream.

    A thin dispatcher (no loop over events): it allocates the outputs and hands the streams to
    the compiled engines (see the section comment), so that each engine is compiled only when
    a batch first needs it.

    Example
    -------
    >>> import numpy as np
    >>> from calpipe import families
    >>> fam = families.binary_family("cox2")
    >>> a0 = np.zeros((1, 1, fam.size)); a0[0, 0, 0] = 0.5  # paper 001 Alg. 1: pi = 0.5, one J
    >>> out = mixture_binary(
    ...     np.array([0.2, 0.7]), np.array([0, 1], np.int8), np.arange(2), np.zeros(2, np.int8),
    ...     np.array([0, 2]), fam.code, fam.params, np.array([0.01]), np.array([0.5]), a0,
    ...     np.zeros(1))
    >>> np.round(out[0], 3).tolist()  # p' ~ p: almost all weight sits on the identity
    [0.2, 0.7]
    >>> out[3].shape, bool(abs(out[3].sum() + out[2][0] - 1.0) < 1e-12)  # P + sum A = 1
    ((1, 1, 9), True)
    """
    n_streams = op_offsets.shape[0] - 1
    n_rates, n_fun = active0.shape[1], active0.shape[2]
    out_p = np.full(p.shape[0], np.nan)
    out_m = np.full(p.shape[0], np.nan)
    passive = passive0.copy()
    active = active0.copy()
    log10m = log10m0.copy()
    start = op_offsets[:-1].copy()  # next operation of each stream
    args = (p, y, op_event, op_kind, op_offsets)
    fits = n_rates * n_fun * LANES <= LANE_CAP and n_fun * LANES <= LANE_FUN_CAP
    fits = fits and n_rates * LANES <= LANE_RATE_CAP
    if fits and n_streams >= 2 * LANES:  # enough streams to fill the lanes twice over
        # Longest streams first, so lanes drain together and the one-stream tail is short.
        order = np.argsort(op_offsets[:-1] - op_offsets[1:], kind="stable")
        _binary_lanes(
            *args, order, start, code, params, rates, passive, active, log10m, out_p, out_m
        )
    engine = _binary_streams_3x9 if (n_rates, n_fun) == (3, 9) else _binary_streams
    engine(*args, start, code, params, rates, passive, active, log10m, out_p, out_m)
    return out_p, out_m, passive, active, log10m


# --------------------------------------------------------------------------------------------
# Log-loss mixture: K classes.
# --------------------------------------------------------------------------------------------


@njit(cache=True, error_model="numpy")
def mixture_multiclass(
    p, y, op_event, op_kind, op_offsets, betas, alphas, rates, passive0, active0, log10m0
):
    """K-class log-loss mixture (paper 001 Alg. 1 with the Cox functions of eq. (1)).

    p (n, K) clipped base probabilities; y (n,) int64 in 0..K-1; betas (T,); alphas (T, K);
    other arguments as in :func:`mixture_binary`. Returns (protected (n, K), log10m (n,),
    passive, active, log10m_end).
    """
    n, k = p.shape
    n_streams = op_offsets.shape[0] - 1
    n_rates, n_fun = active0.shape[1], active0.shape[2]
    out_p = np.full((n, k), np.nan)
    out_m = np.full(n, np.nan)
    passive = passive0.copy()
    active = active0.copy()
    log10m = log10m0.copy()
    exp_alpha_t = np.ascontiguousarray(np.exp(alphas).T)  # (K, T)
    distinct, beta_of = distinct_betas(betas)
    powers = np.empty((k, distinct.shape[0]))
    ssum = np.empty(n_fun)
    f = np.empty((k, n_fun))  # f[c, t] = f_t(p)_c
    mixed = np.empty((n_rates, n_fun))
    col = np.empty(n_fun)
    for s in range(n_streams):
        a = active[s]
        pw = passive[s]
        m = log10m[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            pe = p[e]
            eval_multiclass_t(pe, distinct, beta_of, exp_alpha_t, powers, ssum, f)
            jump_mix(a, rates, mixed, col)
            if kind != OP_UPDATE:
                # p'_c = P p_c + sum_t col[t] f[c, t], summed in t order for each c; four
                # classes at a time, so that four independent add chains overlap.
                c = 0
                while c + 4 <= k:
                    acc0, acc1 = pw * pe[c], pw * pe[c + 1]
                    acc2, acc3 = pw * pe[c + 2], pw * pe[c + 3]
                    for t in range(n_fun):
                        ct = col[t]
                        acc0 += ct * f[c, t]
                        acc1 += ct * f[c + 1, t]
                        acc2 += ct * f[c + 2, t]
                        acc3 += ct * f[c + 3, t]
                    out_p[e, c], out_p[e, c + 1] = acc0, acc1
                    out_p[e, c + 2], out_p[e, c + 3] = acc2, acc3
                    c += 4
                for cc in range(c, k):
                    acc = pw * pe[cc]
                    for t in range(n_fun):
                        acc += col[t] * f[cc, t]
                    out_p[e, cc] = acc
            if kind != OP_FORECAST:
                yy = y[e]
                base = pe[yy]
                pw = pw * base
                tot = pw
                for j in range(n_rates):
                    for t in range(n_fun):
                        v = mixed[j, t] * f[yy, t]
                        a[j, t] = v
                        tot += v
                m += math.log10(tot / base)
                inv = 1.0 / tot
                pw = pw * inv
                for j in range(n_rates):
                    for t in range(n_fun):
                        a[j, t] *= inv
            if kind != OP_UPDATE:
                out_m[e] = m
        passive[s] = pw
        log10m[s] = m
    return out_p, out_m, passive, active, log10m
