"""Numba kernels of the protected predictors: Jumper, Mean Jumper, Composite Jumper (log loss) and
the Brier-loss compatibility recursion of ``protected-classification`` 0.1.5.

Every kernel is a pure function over contiguous arrays: scores, labels, an *operation list* and
the per-stream state go in; forecasts, running log10 martingales and the new state come out. The
inputs are never written. All streams of a batch are handled in one call: the operations are
grouped by stream, ``op_offsets[s]:op_offsets[s + 1]`` being stream ``s``'s operations in replay
order.

Operations
----------
Each operation names an event ``e`` (an index into the event arrays) and a kind:

* ``OP_STEP`` (0): forecast event e, then learn its label right away (the usual online step);
* ``OP_FORECAST`` (1): forecast only (label unknown, or known later);
* ``OP_UPDATE`` (2): learn the label of event e (delayed feedback: at its ``label_time``).

A forecast is the mixture after the jump-mixing step of the next update, computed without
committing it: so an unlabelled event sees exactly the serving map of the current state, and a
run of ``OP_FORECAST`` then ``OP_UPDATE`` on one event equals one ``OP_STEP``.

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
two-engine design and uses fdlibm's exp and log (:func:`_exp_core`, :func:`_ln_fast`) instead of
libm's; see its section. No ``fastmath``: the compiler may not reorder.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

OP_STEP = 0
OP_FORECAST = 1
OP_UPDATE = 2


# --------------------------------------------------------------------------------------------
# Scratch on the stack.
# --------------------------------------------------------------------------------------------
@intrinsic
def _stack_empty(typingctx, size):
    """Pointer to uninitialised float64 scratch of literal length ``size`` on the stack (an LLVM
    ``alloca``); wrap it with ``numba.carray(ptr, size)``.

    Why: LLVM knows a stack buffer aliases no other memory. A buffer indexed only by constants
    (loops over literal sizes, unrolled) is promoted to registers, and loops over stack buffers
    vectorise without overlap checks. Heap scratch (``np.empty``) gets neither: every store to an
    output array would force the weights to be reloaded. The buffer lives until the kernel
    returns, so such arrays are never returned (every helper using them is inlined).
    """
    if not isinstance(size, types.IntegerLiteral):
        return None  # numba retries with the literal type
    n = size.literal_value

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_value_type(types.float64), size=n)

    return types.CPointer(types.float64)(size), codegen


# --------------------------------------------------------------------------------------------
# Calibrating functions, one event at a time (the numpy twin is calpipe.families.evaluate).
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _pow(x, beta):
    # The default Cox exponents 1, 0.5, 2 are hit without a general pow (DESIGN §6).
    if beta == 1.0:
        return x
    if beta == 0.5:
        return math.sqrt(x)
    if beta == 2.0:
        return x * x
    return x**beta


@njit(cache=True, inline="always", error_model="numpy")
def _eval_binary(code, params, exp_alpha, p, out, n):
    """out[t] = f_t(p), t < n, for the binary family ``code`` (families.QUADRATIC/CUBIC/COX)."""
    if code == 0:  # quadratic, paper 000 eq. (1)
        v = p * (1.0 - p)
        for t in range(n):
            out[t] = p + params[t, 0] * v
    elif code == 1:  # cubic, paper 000 eq. (3)
        for t in range(n):
            out[t] = p + params[t, 0] * p * (p - params[t, 1]) * (p - 1.0)
    else:  # Cox, paper 000 eqs. (4)-(5); exp_alpha[t] = e^{alpha_t}
        q = 1.0 - p
        sp = math.sqrt(p)
        sq = math.sqrt(q)
        for t in range(n):
            b = params[t, 1]
            if b == 1.0:
                a1, a0 = p, q
            elif b == 0.5:
                a1, a0 = sp, sq
            elif b == 2.0:
                a1, a0 = p * p, q * q
            else:
                a1, a0 = p**b, q**b
            a1 = a1 * exp_alpha[t]
            out[t] = a1 / (a1 + a0)


@njit(cache=True, inline="always", error_model="numpy")
def _eval_binary_lanes(code, params, exp_alpha, x, f, n_fun, n_lanes, q, sp, sq):
    """f[t, l] = f_t(x[l]) for every lane l: :func:`_eval_binary` with the same operations, the
    branch on the family parameters taken once per function instead of once per event."""
    if code == 0:
        for t in range(n_fun):
            eps = params[t, 0]
            for lane in range(n_lanes):
                v = x[lane] * (1.0 - x[lane])
                f[t, lane] = x[lane] + eps * v
    elif code == 1:
        for t in range(n_fun):
            a, b = params[t, 0], params[t, 1]
            for lane in range(n_lanes):
                xl = x[lane]
                f[t, lane] = xl + a * xl * (xl - b) * (xl - 1.0)
    else:
        for lane in range(n_lanes):
            q[lane] = 1.0 - x[lane]
            sp[lane] = math.sqrt(x[lane])
            sq[lane] = math.sqrt(q[lane])
        for t in range(n_fun):
            b = params[t, 1]
            ea = exp_alpha[t]
            if b == 1.0:
                for lane in range(n_lanes):
                    a1 = x[lane] * ea
                    f[t, lane] = a1 / (a1 + q[lane])
            elif b == 0.5:
                for lane in range(n_lanes):
                    a1 = sp[lane] * ea
                    f[t, lane] = a1 / (a1 + sq[lane])
            elif b == 2.0:
                for lane in range(n_lanes):
                    a1 = (x[lane] * x[lane]) * ea
                    f[t, lane] = a1 / (a1 + q[lane] * q[lane])
            else:
                for lane in range(n_lanes):
                    a1 = x[lane] ** b * ea
                    f[t, lane] = a1 / (a1 + q[lane] ** b)


@njit(cache=True, inline="always")
def _jump_mix(active, rates, mixed, col_sum):
    """mixed[j, t] = (1 - J_j) A[j, t] + J_j / |Theta| sum_t' A[j, t']; col_sum[t] = sum_j mixed[j, t]."""
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


# --------------------------------------------------------------------------------------------
# log10 without a libm call.
# --------------------------------------------------------------------------------------------
# fdlibm's e_log.c (Sun Microsystems, 1993): log(1 + f) = 2s + s R(s^2), s = f / (2 + f), R a
# degree-14 even minimax polynomial; x = 2^k (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)).
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_LN2_HI = 6.93147180369123816490e-01  # ln 2, high bits (k * _LN2_HI is exact)
_LN2_LO = 1.90821492927058770002e-10  # ln 2 - _LN2_HI
_INV_LN10 = 4.34294481903251816668e-01  # 1 / ln 10
_EXP_MASK = 0x7FF0000000000000
_MANT_MASK = 0x000FFFFFFFFFFFFF
_ONE_BITS = 0x3FF0000000000000  # bit pattern of 1.0


@njit(cache=True, inline="always", error_model="numpy")
def _log10_at(x, xbits, mbits, mant, i):
    """log10(x[i]) for a positive normal double x[i], within 2 ulp of libm's log10.

    ``xbits`` is ``x.view(np.int64)``; ``mant`` and ``mbits`` are one float64 scratch array and
    its int64 view (the mantissa is rebuilt through memory: numba has no scalar bit cast).
    Why not ``math.log10``: it is a libm call, about a fifth of the time of a binary event, and a
    call blocks vectorisation over lanes; this is straight-line arithmetic (fdlibm's log, then
    times 1 / ln 10). Callers route zero, subnormal, infinite and NaN inputs to ``math.log10``.
    """
    b = xbits[i]
    k = ((b & _EXP_MASK) >> 52) - 1023
    mbits[i] = (b & _MANT_MASK) | _ONE_BITS
    m = mant[i]  # in [1, 2)
    if m > 1.4142135623730951:
        m = m * 0.5
        k += 1
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = w * (_LG2 + w * (_LG4 + w * _LG6)) + z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    hfsq = 0.5 * f * f
    dk = float(k)
    return (dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)) * _INV_LN10


@njit(cache=True, inline="always")
def _is_normal(bits):
    """The float64 with these bits is a normal number (not 0, subnormal, inf or NaN)."""
    ex = bits & _EXP_MASK
    return ex != 0 and ex != _EXP_MASK


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
# Each engine is its own compiled function, dispatched from Python by `_mixture_binary`: numba
# compiles only the engines a batch needs, and LLVM optimises each alone (inlining the lanes
# engine into a common caller measured 30 % slower). `error_model="numpy"` lets a division by
# zero give inf instead of raising, so divisions vectorise; with p clipped into (0, 1) and
# positive weights no divisor here is zero.
# --------------------------------------------------------------------------------------------
# Lanes of the multi-stream engine. A compile-time constant: loops over a literal 64 lanes
# compile to straight AVX-512 code (8 doubles at a time) without trip-count checks, about 10 %
# faster than the same loops over a run-time lane count; 32 or 128 lanes measured slower.
_LANES = 64
_LANE_CAP = 4096  # stack capacity of one (R, T, lanes) scratch array, in doubles (32 KiB)
_LANE_FUN_CAP = 1024  # stack capacity of one (T, lanes) scratch array, in doubles
_LANE_RATE_CAP = 512  # stack capacity of one (R, lanes) scratch array, in doubles


@njit(cache=True, inline="always", error_model="numpy")
def _binary_stream(
    p, y, op_event, op_kind, lo, hi, code, params, exp_alpha, rates, n_rates, n_fun,
    a, pw, m, out_p, out_m, f, mixed, col, rat, rat_bits, mant, mant_bits,
):  # fmt: skip
    """Operations lo..hi-1 of one stream, in order (the recursion of the module docstring).

    ``a`` holds the stream's active weights A[j, t] at a[j * n_fun + t] and is updated in place;
    ``f``, ``mixed`` (R*T) and ``col`` (T) are scratch, ``rat`` and ``mant`` one-element scratch
    with their int64 views (for :func:`_log10_at`). Returns the new (P, log10 S).
    """
    for o in range(lo, hi):
        e = op_event[o]
        kind = op_kind[o]
        pe = p[e]
        _eval_binary(code, params, exp_alpha, pe, f, n_fun)
        # Jump mixing (paper 001 Alg. 1 line 5): mixed = (1 - J) A + J/|Theta| sum A; col = sum_J.
        for t in range(n_fun):
            col[t] = 0.0
        for j in range(n_rates):
            tot = 0.0
            for t in range(n_fun):
                tot += a[j * n_fun + t]
            jr = rates[j]
            add = tot * jr / n_fun
            keep = 1.0 - jr
            for t in range(n_fun):
                v = keep * a[j * n_fun + t] + add
                mixed[j * n_fun + t] = v
                col[t] += v
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
            if _is_normal(rat_bits[0]):
                m += _log10_at(rat, rat_bits, mant_bits, mant, 0)
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
    rat = carray(_stack_empty(1), 1)
    mant = carray(_stack_empty(1), 1)
    rat_bits, mant_bits = rat.view(np.int64), mant.view(np.int64)
    for s in range(op_offsets.shape[0] - 1):
        lo, hi = start[s], op_offsets[s + 1]
        if lo >= hi:
            continue
        for j in range(n_rates):
            for t in range(n_fun):
                a[j * n_fun + t] = active[s, j, t]
        pw, m = _binary_stream(
            p, y, op_event, op_kind, lo, hi, code, prm, ea, rr, n_rates, n_fun,
            a, passive[s], log10m[s], out_p, out_m, f, mixed, col, rat, rat_bits, mant, mant_bits,
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
        out_p, out_m, 3, 9, carray(_stack_empty(27), 27), carray(_stack_empty(9), 9),
        carray(_stack_empty(27), 27), carray(_stack_empty(9), 9),
        carray(_stack_empty(18), (9, 2)), carray(_stack_empty(9), 9), carray(_stack_empty(3), 3),
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
def _next_stream(order, k, start, op_offsets):
    """First position >= k in ``order`` whose stream has operations left (``len(order)`` if none):
    the lane engines' refill scan."""
    while k < order.shape[0] and start[order[k]] >= op_offsets[order[k] + 1]:
        k += 1
    return k


@njit(cache=True, inline="always")
def _steps_to_first_end(busy, lane_op, lane_end, n_lanes):
    """Steps all lanes can take together before the first busy lane runs out of operations: the
    lane engines step that many times without any bookkeeping inside the steps."""
    steps = -1
    for lane in range(n_lanes):
        if busy[lane] != 0 and (steps < 0 or lane_end[lane] - lane_op[lane] < steps):
            steps = lane_end[lane] - lane_op[lane]
    return steps


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
    """Streams ``order[0], order[1], ...`` through ``_LANES`` lanes, one operation per lane per
    step, with exactly the operations of :func:`_binary_stream` (see the section comment).

    Lanes are refilled from ``order`` as their streams end. Once ``order`` is exhausted and fewer
    than half the lanes are busy, the busy streams are handed back: their state is written to
    ``passive``/``active``/``log10m`` and ``start[s]`` is set to their next operation, so the
    one-stream engine finishes them (one long stream never runs in a nearly empty lane set).
    """
    n_streams = order.shape[0]
    n_rates, n_fun = active.shape[1], active.shape[2]
    exp_alpha = np.exp(params[:, 0])
    nl = _LANES
    # Scratch, lane index last: A, V (R, T, lanes); F, COL (T, lanes); vectors (lanes,).
    A = carray(_stack_empty(4096), _LANE_CAP)[: n_rates * n_fun * nl].reshape((n_rates, n_fun, nl))
    V = carray(_stack_empty(4096), _LANE_CAP)[: n_rates * n_fun * nl].reshape((n_rates, n_fun, nl))
    F = carray(_stack_empty(1024), _LANE_FUN_CAP)[: n_fun * nl].reshape((n_fun, nl))
    COL = carray(_stack_empty(1024), _LANE_FUN_CAP)[: n_fun * nl].reshape((n_fun, nl))
    PW = carray(_stack_empty(64), _LANES)  # P
    M = carray(_stack_empty(64), _LANES)  # log10 S
    X = carray(_stack_empty(64), _LANES)  # base forecast p of the lane's event
    BASE = carray(_stack_empty(64), _LANES)  # B_p({y})
    PWB = carray(_stack_empty(64), _LANES)  # P B_p({y})
    C = carray(_stack_empty(64), _LANES)  # Bayes numerator = p'(y)
    TOT = carray(_stack_empty(64), _LANES)  # jump-mixing shift of one rate; a running sum
    # SUM_A[j, l] = sum_t A[j, t, l], summed in t order as the one-stream engine sums it; kept up
    # to date when A changes, instead of re-summing A at every step.
    SUM_A = carray(_stack_empty(512), _LANE_RATE_CAP)[: n_rates * nl].reshape((n_rates, nl))
    PRED = carray(_stack_empty(64), _LANES)  # protected forecast p'
    INV = carray(_stack_empty(64), _LANES)  # 1 / C
    RAT = carray(_stack_empty(64), _LANES)  # C / B_p({y}): the martingale's factor
    LOGR = carray(_stack_empty(64), _LANES)  # log10 RAT
    MANT = carray(_stack_empty(64), _LANES)  # scratch of _log10_at
    RAT_BITS, MANT_BITS = RAT.view(np.int64), MANT.view(np.int64)
    Q = carray(_stack_empty(64), _LANES)
    SP = carray(_stack_empty(64), _LANES)
    SQ = carray(_stack_empty(64), _LANES)
    # Per-lane integers and flags (0/1), on the stack too: LLVM then sees that storing them
    # cannot change the input arrays, and the gather loop below vectorises.
    y0 = carray(_stack_empty(64), _LANES).view(np.int64)  # label is 0 (else 1)
    upd = carray(_stack_empty(64), _LANES).view(np.int64)  # this step updates the state
    fc = carray(_stack_empty(64), _LANES).view(np.int64)  # this step forecasts
    busy = carray(_stack_empty(64), _LANES).view(np.int64)
    lane_stream = carray(_stack_empty(64), _LANES).view(np.int64)
    lane_op = carray(_stack_empty(64), _LANES).view(np.int64)  # next op (idle lanes: op 0)
    lane_end = carray(_stack_empty(64), _LANES).view(np.int64)
    lane_event = carray(_stack_empty(64), _LANES).view(np.int64)
    for lane in range(_LANES):
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
            k = _next_stream(order, k, start, op_offsets)
            if k == n_streams:
                lane_op[lane] = 0
                lane_end[lane] = 0
                continue
            s = order[k]
            k += 1
            busy[lane] = 1
            n_busy += 1
            lane_stream[lane] = s
            lane_op[lane] = start[s]
            lane_end[lane] = op_offsets[s + 1]
            for j in range(n_rates):
                for t in range(n_fun):
                    A[j, t, lane] = active[s, j, t]
            _lane_sums(A, SUM_A, lane)
            PW[lane] = passive[s]
            M[lane] = log10m[s]
        if n_busy == 0 or (k == n_streams and 2 * n_busy < nl):
            break
        steps = _steps_to_first_end(busy, lane_op, lane_end, nl)
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
            _eval_binary_lanes(code, params, exp_alpha, X, F, n_fun, nl, Q, SP, SQ)
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
                LOGR[lane] = _log10_at(RAT, RAT_BITS, MANT_BITS, MANT, lane)
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
            for lane in range(nl):  # _log10_at covers normal numbers only
                if upd[lane] != 0 and not _is_normal(RAT_BITS[lane]):
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


def _mixture_binary(
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
    >>> out = _mixture_binary(
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
    fits = n_rates * n_fun * _LANES <= _LANE_CAP and n_fun * _LANES <= _LANE_FUN_CAP
    fits = fits and n_rates * _LANES <= _LANE_RATE_CAP
    if fits and n_streams >= 2 * _LANES:  # enough streams to fill the lanes twice over
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
@njit(cache=True, inline="always")
def _distinct_betas(betas):
    """(distinct values of ``betas`` in first-seen order, index of each beta among them)."""
    n_fun = betas.shape[0]
    distinct = np.empty(n_fun)
    beta_of = np.empty(n_fun, np.int64)
    n = 0
    for t in range(n_fun):
        i = 0
        while i < n and distinct[i] != betas[t]:
            i += 1
        if i == n:
            distinct[n] = betas[t]
            n += 1
        beta_of[t] = i
    return distinct[:n].copy(), beta_of


@njit(cache=True, inline="always", error_model="numpy")
def _eval_multiclass_t(pe, betas, beta_of, exp_alpha_t, powers, ssum, out):
    """out[c, t] = p_c^beta_t e^{alpha_t(c)} / sum_c' (...) (paper 001 eq. (1)): the values of
    the Cox functions, transposed (class-major, so every inner loop runs over the T functions and
    vectorises). p_c^beta is computed once per distinct beta (``betas`` distinct,
    ``beta_of[t]`` the index of function t's beta): 3K powers instead of 3(2K + 1)K; the sums
    over classes keep their class order, so the values are bit-identical."""
    k, n_fun = exp_alpha_t.shape
    for b in range(betas.shape[0]):
        for c in range(k):
            powers[c, b] = _pow(pe[c], betas[b])
    for t in range(n_fun):
        ssum[t] = 0.0
    for c in range(k):
        for t in range(n_fun):
            v = powers[c, beta_of[t]] * exp_alpha_t[c, t]
            out[c, t] = v
            ssum[t] += v
    for c in range(k):
        for t in range(n_fun):
            out[c, t] = out[c, t] / ssum[t]


@njit(cache=True, error_model="numpy")
def _mixture_multiclass(
    p, y, op_event, op_kind, op_offsets, betas, alphas, rates, passive0, active0, log10m0
):
    """K-class log-loss mixture (paper 001 Alg. 1 with the Cox functions of eq. (1)).

    p (n, K) clipped base probabilities; y (n,) int64 in 0..K-1; betas (T,); alphas (T, K);
    other arguments as in :func:`_mixture_binary`. Returns (protected (n, K), log10m (n,),
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
    distinct, beta_of = _distinct_betas(betas)
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
            _eval_multiclass_t(pe, distinct, beta_of, exp_alpha_t, powers, ssum, f)
            _jump_mix(a, rates, mixed, col)
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


# --------------------------------------------------------------------------------------------
# Brier compatibility: the recursion of protected-classification 0.1.5, K >= 2 classes.
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _brier_to_onehot(c, q):
    """Brier loss of the forecast q for the outcome c: sum_i (1{i = c} - q_i)^2."""
    s = 0.0
    for i in range(q.shape[0]):
        d = (1.0 if i == c else 0.0) - q[i]
        s += d * d
    return s


@njit(cache=True, inline="always")
def _brier_col(c, f, t):
    """:func:`_brier_to_onehot` of the forecast f[:, t] (class-major layout), same operations."""
    s = 0.0
    for i in range(f.shape[0]):
        d = (1.0 if i == c else 0.0) - f[i, t]
        s += d * d
    return s


@njit(cache=True, inline="always")
def _exp_ln10(x):
    """e^{ln(10) x} as the package evaluates 10^x. At x = 0 the answer is exactly 1 and the libm
    call is skipped: in a max-shifted log-sum-exp one term always has x = 0."""
    if x == 0.0:
        return 1.0
    return math.exp(math.log(10.0) * x)


@njit(cache=True, inline="always")
def _cj_from_sj(lsj):
    """log10((1 + mean_J 10^{lsj[J]}) / 2), evaluated as the package's ``log_mean([0, log_mean(.)])``."""
    n_rates = lsj.shape[0]
    mx = lsj[0]
    for j in range(1, n_rates):
        mx = max(mx, lsj[j])
    acc = 0.0
    for j in range(n_rates):
        acc += _exp_ln10(lsj[j] - mx)
    inner = mx + math.log10(acc / n_rates)
    m2 = max(0.0, inner)
    return m2 + math.log10((_exp_ln10(0.0 - m2) + _exp_ln10(inner - m2)) / 2.0)


@njit(cache=True, error_model="numpy")
def _brier_compat(
    p,
    y,
    op_event,
    op_kind,
    op_offsets,
    betas,
    alphas,
    rates,
    passive0,
    active0,
    capital0,
    log_sj0,
):
    """The Brier-loss aggregating algorithm of ``protected-classification`` 0.1.5 (K >= 2).

    Per update, for each class c the package's generalised prediction is
    g_c = -ln(P e^{-Brier(c, p)} + sum_{J,k} A[J,k] e^{-Brier(c, f_k(p))}) (learning rate eta = 1),
    and its "substitution shortcut" predicts p'_c = (s - g_c) / 2 with s = (2 + sum_c g_c) / K,
    clipped to [0, 1] and renormalised. Weights update by e^{-Brier(y, .)} and are renormalised.
    Its per-rate "martingale" capital[J, k] (normalised, jump-mixed towards uniform) is multiplied
    by e^{-Brier(y, f_k)} / e^{-Brier(y, p)}, log10 SJ_J accumulates log10 sum_k capital[J, k], and
    the composite value is log10 CJ = log10((1 + mean_J SJ_J) / 2), computed as the package does.

    The factors e^{-Brier(c, .)} of a step are computed once and shared by the forecast and the
    update (the update needs those of c = y), so an OP_STEP costs K(T + 1) exponentials, not
    (K + 1)(T + 1).

    Returns (protected (n, K), log10_cj (n,), log10_sj (n, R), passive, active, capital, log_sj).
    """
    n, k = p.shape
    n_streams = op_offsets.shape[0] - 1
    n_rates, n_fun = active0.shape[1], active0.shape[2]
    out_p = np.full((n, k), np.nan)
    out_cj = np.full(n, np.nan)
    out_sj = np.full((n, n_rates), np.nan)
    passive = passive0.copy()
    active = active0.copy()
    capital = capital0.copy()
    log_sj = log_sj0.copy()
    exp_alpha_t = np.ascontiguousarray(np.exp(alphas).T)  # (K, T)
    distinct, beta_of = _distinct_betas(betas)
    powers = np.empty((k, distinct.shape[0]))
    ssum = np.empty(n_fun)
    f = np.empty((k, n_fun))  # f[c, t] = f_t(p)_c
    e_base = np.empty(k)  # e^{-Brier(c, p)}
    e_fun = np.empty((k, n_fun))  # e^{-Brier(c, f_t(p))}
    mixed = np.empty((n_rates, n_fun))
    cap_mixed = np.empty((n_rates, n_fun))
    col = np.empty(n_fun)
    g = np.empty(k)
    for s in range(n_streams):
        a = active[s]
        cap = capital[s]
        lsj = log_sj[s]
        pw = passive[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            pe = p[e]
            _eval_multiclass_t(pe, distinct, beta_of, exp_alpha_t, powers, ssum, f)
            _jump_mix(a, rates, mixed, col)
            yy = y[e]
            for c in range(k):  # every class for a forecast, the label's for an update
                if kind != OP_UPDATE or c == yy:
                    e_base[c] = math.exp(-_brier_to_onehot(c, pe))
                    for t in range(n_fun):
                        e_fun[c, t] = math.exp(-_brier_col(c, f, t))
            if kind != OP_UPDATE:
                gsum = 0.0
                for c in range(k):
                    acc = pw * e_base[c]
                    for t in range(n_fun):
                        acc += col[t] * e_fun[c, t]
                    g[c] = -math.log(acc)
                    gsum += g[c]
                sc = (2.0 + gsum) / k
                tot = 0.0
                for c in range(k):
                    v = (sc - g[c]) / 2.0
                    v = min(max(v, 0.0), 1.0)
                    g[c] = v
                    tot += v
                for c in range(k):
                    out_p[e, c] = g[c] / tot
            if kind != OP_FORECAST:
                lb = e_base[yy]
                pw = pw * lb
                tot = pw
                for j in range(n_rates):
                    jr = rates[j]
                    keep = 1.0 - jr
                    share = jr / n_fun
                    for t in range(n_fun):
                        cap_mixed[j, t] = keep * cap[j, t] + share
                for t in range(n_fun):
                    lf = e_fun[yy, t]
                    ratio = lf / lb
                    for j in range(n_rates):
                        v = mixed[j, t] * lf
                        a[j, t] = v
                        tot += v
                        cap_mixed[j, t] *= ratio
                for j in range(n_rates):
                    cs = 0.0
                    for t in range(n_fun):
                        cs += cap_mixed[j, t]
                    lsj[j] += math.log10(cs)
                    for t in range(n_fun):
                        cap[j, t] = cap_mixed[j, t] / cs
                pw = pw / tot
                for j in range(n_rates):
                    for t in range(n_fun):
                        a[j, t] /= tot
            if kind != OP_UPDATE:
                out_cj[e] = _cj_from_sj(lsj)
                for j in range(n_rates):
                    out_sj[e, j] = lsj[j]
        passive[s] = pw
    return out_p, out_cj, out_sj, passive, active, capital, log_sj


@njit(cache=True)
def _log10_cj_rows(log_sj):
    """log10 CJ of each stream from its log10 SJ row (S, R) -> (S,)."""
    out = np.empty(log_sj.shape[0])
    for s in range(log_sj.shape[0]):
        out[s] = _cj_from_sj(log_sj[s])
    return out


# --------------------------------------------------------------------------------------------
# exp and log without libm calls (the binary Brier kernel).
# --------------------------------------------------------------------------------------------
@intrinsic
def _bits_f64(typingctx, bits):
    """The float64 whose IEEE-754 bit pattern is the int64 ``bits`` (a register bit cast, which
    vectorises; numba has no scalar bit cast of its own)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.int64), codegen


@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE-754 bit pattern of the float64 ``x`` as an int64 (inverse of :func:`_bits_f64`)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(types.float64), codegen


# fdlibm's e_exp.c (Sun Microsystems, 1993): x = k ln2 + r, |r| <= ln2 / 2 (ln2 split into hi
# and lo parts so that k * _LN2_HI is exact); e^r = 1 + r + r c / (2 - c) with
# c = r - r^2 (P1 + r^2 (P2 + ... + r^2 P5)), a degree-5 minimax polynomial in r^2; e^x = 2^k e^r.
_EXP_P1 = 1.66666666666666019037e-01
_EXP_P2 = -2.77777777770155933842e-03
_EXP_P3 = 6.61375632143793436117e-05
_EXP_P4 = -1.65339022054652515390e-06
_EXP_P5 = 4.13813679705723846039e-08
_INV_LN2 = 1.44269504088896338700e00  # 1 / ln 2
# |x| <= _EXP_ARG_MAX: k is in [-1022, 1022], so 2^k is a normal double built from its bits and
# e^x is finite and normal (e^708 = 3e307, e^-708 = 3e-308); wider arguments go to libm.
_EXP_ARG_MAX = 708.0
_LN10 = 2.302585092994046  # math.log(10.0): the package evaluates 10^x as e^{ln(10) x}


@njit(cache=True, inline="always", error_model="numpy")
def _exp_core(x):
    """e^x for |x| <= ``_EXP_ARG_MAX`` (fdlibm's exp, within 1 ulp of libm's): straight-line
    arithmetic and one division, so loops of it vectorise. Callers route the other arguments
    (|x| > 708, inf, NaN) to ``math.exp``; here they give garbage, never an exception.

    The reduction is round-to-nearest k = floor(x / ln2 + 1/2); fdlibm truncates x / ln2 +- 1/2,
    which differs only at exact ties, where both choices keep |r| <= ln2 / 2. e^0 = 1 exactly.
    """
    kf = math.floor(x * _INV_LN2 + 0.5)
    hi = x - kf * _LN2_HI
    lo = kf * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_EXP_P1 + t * (_EXP_P2 + t * (_EXP_P3 + t * (_EXP_P4 + t * _EXP_P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    return y * _bits_f64((np.int64(kf) + 1023) << 52)


@njit(cache=True, inline="always", error_model="numpy")
def _exp_fast(x):
    """e^x: :func:`_exp_core` where it applies, else ``math.exp`` (one scalar, one branch).

    Example
    -------
    >>> import math
    >>> _exp_fast(0.0), _exp_fast(-800.0), _exp_fast(float("inf"))
    (1.0, 0.0, inf)
    >>> abs(_exp_fast(-1.3) - math.exp(-1.3)) <= math.ulp(math.exp(-1.3))
    True
    """
    if -_EXP_ARG_MAX <= x <= _EXP_ARG_MAX:
        return _exp_core(x)
    return math.exp(x)


@njit(cache=True, inline="always", error_model="numpy")
def _ln_core(x):
    """ln(x) for a positive normal double x, within 1 ulp of libm's log: fdlibm's log with the
    operations of :func:`_log10_at` (so ``_ln_core(x) * _INV_LN10`` equals it bit for bit), but
    bit casts in registers and no branch, so loops of it vectorise. Other x give garbage."""
    b = _f64_bits(x)
    k = ((b & _EXP_MASK) >> 52) - 1023
    m = _bits_f64((b & _MANT_MASK) | _ONE_BITS)  # in [1, 2)
    if m > 1.4142135623730951:
        m = m * 0.5
        k += 1
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = w * (_LG2 + w * (_LG4 + w * _LG6)) + z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    hfsq = 0.5 * f * f
    dk = float(k)
    return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)


@njit(cache=True, inline="always", error_model="numpy")
def _ln_fast(x):
    """ln(x): :func:`_ln_core` for positive normal x; zero, subnormal, negative, infinite and
    NaN x go to ``math.log``.

    Example
    -------
    >>> import math
    >>> _ln_fast(1.0), _ln_fast(0.0), _ln_fast(float("inf"))
    (0.0, -inf, inf)
    >>> abs(_ln_fast(0.3) - math.log(0.3)) <= math.ulp(math.log(0.3))
    True
    """
    b = _f64_bits(x)
    ex = b & _EXP_MASK
    if b < 0 or ex == 0 or ex == _EXP_MASK:
        return math.log(x)
    return _ln_core(x)


@njit(cache=True, inline="always")
def _ln_ok(x):
    """x is a positive normal double (the domain of :func:`_ln_core`); bitwise, no branch."""
    b = _f64_bits(x)
    ex = b & _EXP_MASK
    return (b > 0) & (ex != 0) & (ex != _EXP_MASK)


@njit(cache=True, inline="always")
def _tree_sum(v, lo, n):
    """sum of v[lo:lo + n], n a power of two, by halving (v[lo + i] += v[lo + i + h] for
    h = n/2, ..., 1): a fixed order, so a run is deterministic, with log2(n) dependent adds
    instead of n. Overwrites v[lo:lo + n]."""
    h = n // 2
    while h >= 1:
        for i in range(h):
            v[lo + i] += v[lo + i + h]
        h //= 2
    return v[lo]


# --------------------------------------------------------------------------------------------
# Brier compatibility, binary (K = 2).
#
# The recursion of `_brier_compat` for two classes, with the same family and the same state,
# re-laid for speed:
#
# * the 2 (T + 1) factors e^{-Brier(c, .)} of an event (T = 15 functions and the base forecast,
#   c = 0, 1) depend on its score alone, not on the state: they are computed for a block of
#   events at a time (`_brier_factors`), in loops whose innermost index runs over the block's
#   events and vectorises, with `_exp_core` instead of 32 libm calls per event;
# * class c's factors sit in an array of L = T + 1 rounded up to a power of two, the base
#   forecast in slot T (pads: e^0 on zero weight), so each sum of the forecast
#   P e^{-Brier(c, p)} + sum_t col[t] e^{-Brier(c, f_t)} is one dot product of length L;
# * every sum over the functions is a `_tree_sum` (log2 L dependent adds, in a fixed order);
#   each normalisation is one division and L products;
# * logs are fdlibm's (`_ln_fast`); log10 CJ is computed after the recursion from the rows of
#   log10 SJ (`_cj_rows`), a pure function of the row.
#
# The arithmetic of each term is the package's (the Cox values f_c = v_c / (v_0 + v_1),
# Brier(0, f) = (1 - f_0)^2 + f_1^2, the substitution shortcut, its clip and renormalisation), so
# each step equals `_brier_compat`'s to a few ulp (only the summation order, exp/log and the
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
# * `_BRIER_LANES` streams at a time (`_brier_lanes_body`): lane l of every scratch array holds
#   one stream, each step advances every lane by one operation, and the loops over lanes
#   vectorise (~8M events/s). Used when a batch has at least 2 * _BRIER_LANES streams; streams
#   still running when fewer than half the lanes are busy are handed back to the first engine.
# --------------------------------------------------------------------------------------------
_BRIER_BLOCK = (
    64  # events per block of the one-stream engine's factors (scratch: ~64 KiB; 32: slower)
)
# Lanes of the multi-stream engine. With 32 lanes LLVM fully unrolls the loops over lanes and
# vectorises the tree sums across slots instead, with gathers and scatters: 3x slower.
_BRIER_LANES = 64


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
    for k in range(n_dist):  # p_c^beta once per distinct beta (the branches of _pow, hoisted)
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
        ext[i] = _exp_core(arg[i])
        n_bad += 0 if arg[i] >= -_EXP_ARG_MAX else 1
    if n_bad > 0:  # NaN scores only: -Brier is in [-2, 0]
        for i in range(2 * L * B):
            if not (arg[i] >= -_EXP_ARG_MAX):
                ext[i] = math.exp(arg[i])
    for t in range(L):  # class y's factors, selected bitwise (an exact select that vectorises)
        for b in range(B):
            m = -np.int64(yb[b])  # all ones for y = 1, zero for y = 0
            bits = (_f64_bits(ext[(L + t) * B + b]) & m) | (_f64_bits(ext[t * B + b]) & ~m)
            exy[t * B + b] = _bits_f64(bits)
    for t in range(L):  # class y's factor over its base factor (pads: 1 / base, weight 0)
        for b in range(B):
            ratt[t * B + b] = exy[t * B + b] / exy[n_fun * B + b]


@njit(cache=True, inline="always")
def _tree_rows(v, L, R):
    """v[j] = sum_t v[t R + j] for every j < R, by :func:`_tree_sum`'s halving over t (the same
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
                    g0 = -_ln_fast(_tree_sum(q0, 0, L))
                    g1 = -_ln_fast(_tree_sum(q1, 0, L))
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
                        lsj[j] += _ln_fast(w[j]) * _INV_LN10
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
    distinct, beta_of = _distinct_betas(betas)
    for k in range(distinct.shape[0]):
        dist[k] = distinct[k]
    ea = np.exp(alphas)  # as _brier_compat: the Cox values are bit-identical to its own
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
def _brier_streams(
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
def _brier_streams_3x15(
    p, y, op_event, op_kind, op_offsets, start, betas, alphas, rates, passive, active, capital,
    log_sj, out_p, out_sj,
):  # fmt: skip
    """:func:`_brier_one_stream` for the default (3 rates x the package's 15 functions, L = 16):
    literal sizes and stack scratch (see :func:`_stack_empty`): about 2x faster than
    :func:`_brier_streams`, same results."""
    bo, ea0, ea1 = (
        carray(_stack_empty(16), 16),
        carray(_stack_empty(16), 16),
        carray(_stack_empty(16), 16),
    )
    dist = _brier_consts(betas, alphas, 16, carray(_stack_empty(15), 15), bo, ea0, ea1)
    blk = (
        carray(_stack_empty(64), 64), carray(_stack_empty(64), 64), carray(_stack_empty(64), 64),
        carray(_stack_empty(960), 960), carray(_stack_empty(960), 960),
        carray(_stack_empty(2048), 2048), carray(_stack_empty(2048), 2048),
        carray(_stack_empty(1024), 1024), carray(_stack_empty(1024), 1024),
    )  # fmt: skip
    _brier_one_stream(
        p, y, op_event, op_kind, op_offsets, start, rates, passive, active, capital, log_sj,
        out_p, out_sj, 3, 15, 16, 64, (dist, bo, ea0, ea1), blk,
        carray(_stack_empty(64), 64).view(np.int64),
        (carray(_stack_empty(16), 16), carray(_stack_empty(16), 16),
         carray(_stack_empty(16), 16)),
        (carray(_stack_empty(48), 48), carray(_stack_empty(48), 48),
         carray(_stack_empty(48), 48), carray(_stack_empty(48), 48),
         carray(_stack_empty(48), 48), carray(_stack_empty(48), 48)),
        (carray(_stack_empty(3), 3), carray(_stack_empty(3), 3), carray(_stack_empty(3), 3),
         carray(_stack_empty(3), 3), carray(_stack_empty(3), 3), carray(_stack_empty(3), 3)),
    )  # fmt: skip


@njit(cache=True, inline="always")
def _lanes_tree(W, L, nl):
    """W[0, l] = sum_t W[t, l] for every lane l, by :func:`_tree_sum`'s halving (the same adds in
    the same order per lane). Overwrites W[:L]."""
    h = L // 2
    while h >= 1:
        for i in range(h):
            for lane in range(nl):
                W[i, lane] += W[i + h, lane]
        h //= 2


@njit(cache=True, inline="always", error_model="numpy")
def _lanes_ln(X, out, sign, nl):
    """out[l] = sign ln(X[0, l]) for every lane: :func:`_ln_fast`'s values, vectorised
    (:func:`_ln_core`, then ``math.log`` for the lanes outside its domain, if any)."""
    n_bad = 0
    for lane in range(nl):
        out[lane] = sign * _ln_core(X[0, lane])
        n_bad += 0 if _ln_ok(X[0, lane]) else 1
    if n_bad > 0:
        for lane in range(nl):
            if not _ln_ok(X[0, lane]):
                out[lane] = sign * math.log(X[0, lane])


@njit(cache=True, inline="always", error_model="numpy")
def _brier_lanes_body(
    p, y, op_event, op_kind, op_offsets, order, start, rates, passive, active, capital, log_sj,
    out_p, out_sj, n_rates, n_fun, L, consts, blk, state, mats, vecs, ints,
):  # fmt: skip
    """Streams ``order[0], order[1], ...`` through ``_BRIER_LANES`` lanes, one operation per lane
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
    nl = _BRIER_LANES
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
            k = _next_stream(order, k, start, op_offsets)
            if k == n_streams:
                lane_op[lane] = 0
                lane_end[lane] = 0
                continue
            s = order[k]
            k += 1
            busy[lane] = 1
            n_busy += 1
            lane_stream[lane] = s
            lane_op[lane] = start[s]
            lane_end[lane] = op_offsets[s + 1]
            for j in range(n_rates):
                for t in range(n_fun):
                    A[j, t, lane] = active[s, j, t]
                    CAP[j, t, lane] = capital[s, j, t]
                LSJ[j, lane] = log_sj[s, j]
            PW[lane] = passive[s]
        if n_busy == 0 or (k == n_streams and 2 * n_busy < nl):
            break
        steps = _steps_to_first_end(busy, lane_op, lane_end, nl)
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
                        LSJ[j, lane] += LG[lane] * _INV_LN10
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
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
        carray(_stack_empty(64), _BRIER_LANES).view(np.int64),
    )


@njit(cache=True, inline="always")
def _lanes_vecs():
    """The float64 per-lane scratch of :func:`_brier_lanes_body`, on the stack."""
    return (
        carray(_stack_empty(64), _BRIER_LANES), carray(_stack_empty(64), _BRIER_LANES),
        carray(_stack_empty(64), _BRIER_LANES), carray(_stack_empty(64), _BRIER_LANES),
        carray(_stack_empty(64), _BRIER_LANES),
    )  # fmt: skip


@njit(cache=True, error_model="numpy")
def _brier_lanes(
    p, y, op_event, op_kind, op_offsets, order, start, betas, alphas, rates, passive, active,
    capital, log_sj, out_p, out_sj,
):  # fmt: skip
    """:func:`_brier_lanes_body` for any shape (R, T), with heap scratch for the arrays whose
    size depends on it (literal sizes and stack scratch measured no faster here: the loops over
    the 64 lanes vectorise either way)."""
    n_rates, n_fun = active.shape[1], active.shape[2]
    L = _brier_width(n_fun)
    nl = _BRIER_LANES
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


_CJ_BLOCK = 64  # rows of log10 SJ per vectorised block of _cj_rows


@njit(cache=True, inline="always", error_model="numpy")
def _cj_lanes(log_sj, i0, nb, sjt, mx, acc, out):
    """out[i0 + b] = log10 CJ of row i0 + b of ``log_sj``, b < nb: :func:`_cj_from_sj`'s formula
    with :func:`_exp_core` and :func:`_ln_core`, in loops over the rows (which vectorise when nb
    is a literal; ``sjt`` (R, >= nb) holds the rows transposed, so that the loads are
    contiguous). Every row gets the same operations whatever nb, so blocks and tail agree.

    Arguments of e^{ln(10) x} below -``_EXP_ARG_MAX`` are raised to it: each sum also holds a
    term e^0 = 1, so a term below e^-708 cannot change it. Rows holding NaN or inf give garbage
    here and are redone by the caller: ``mx[b]`` is returned as sum_J 0 * SJ_J, which is 0 for a
    finite row and NaN otherwise.
    """
    n_rates = log_sj.shape[1]
    for b in range(nb):
        for j in range(n_rates):
            sjt[j, b] = log_sj[i0 + b, j]
    for b in range(nb):
        mx[b] = sjt[0, b]
    for j in range(1, n_rates):
        for b in range(nb):
            mx[b] = max(mx[b], sjt[j, b])
    for b in range(nb):
        acc[b] = 0.0
    for j in range(n_rates):
        for b in range(nb):
            acc[b] += _exp_core(max(_LN10 * (sjt[j, b] - mx[b]), -_EXP_ARG_MAX))
    for b in range(nb):
        inner = mx[b] + _ln_core(acc[b] / n_rates) * _INV_LN10
        m2 = max(0.0, inner)
        e0 = _exp_core(max(_LN10 * (0.0 - m2), -_EXP_ARG_MAX))
        e1 = _exp_core(max(_LN10 * (inner - m2), -_EXP_ARG_MAX))
        out[i0 + b] = m2 + _ln_core((e0 + e1) / 2.0) * _INV_LN10
    for b in range(nb):
        mx[b] = 0.0
    for j in range(n_rates):
        for b in range(nb):
            mx[b] += 0.0 * sjt[j, b]


@njit(cache=True, error_model="numpy")
def _cj_rows(log_sj):
    """log10 CJ = log10((1 + mean_J 10^{log10 SJ_J}) / 2) of each row of ``log_sj`` (n, R), as
    :func:`_cj_from_sj` evaluates it (the package's ``log_mean([0, log_mean(SJ)])``) but with
    libm-free exp and log (see :func:`_cj_lanes`), ``_CJ_BLOCK`` rows at a time. Rows of NaN
    give NaN (events never forecast); rows with another non-finite entry go to
    :func:`_cj_from_sj`.

    Example
    -------
    >>> import numpy as np
    >>> sj = np.array([[0.0, 0.0, 0.0], [3.0, -1.0, -2.0], [np.nan, np.nan, np.nan]])
    >>> np.round(_cj_rows(sj), 6).tolist()  # CJ = (1 + mean_J SJ_J) / 2
    [0.0, 2.223197, nan]
    >>> round(float(np.log10((1 + np.mean(10 ** sj[1])) / 2)), 6)
    2.223197
    """
    n, n_rates = log_sj.shape
    out = np.empty(n)
    mx = carray(_stack_empty(64), _CJ_BLOCK)
    acc = carray(_stack_empty(64), _CJ_BLOCK)
    sjt = np.empty((n_rates, _CJ_BLOCK))
    i0 = 0
    while i0 < n:
        nb = min(_CJ_BLOCK, n - i0)
        if nb == _CJ_BLOCK:
            _cj_lanes(log_sj, i0, _CJ_BLOCK, sjt, mx, acc, out)
        else:
            _cj_lanes(log_sj, i0, nb, sjt, mx, acc, out)
        for b in range(nb):
            if mx[b] != 0.0:  # a NaN or infinite entry
                row = log_sj[i0 + b]
                out[i0 + b] = np.nan if np.all(np.isnan(row)) else _cj_from_sj(row)
        i0 += nb
    return out


def _brier_binary(
    p, y, op_event, op_kind, op_offsets, betas, alphas, rates, passive0, active0, capital0, log_sj0
):
    """The Brier compatibility recursion of :func:`_brier_compat` for two classes, fast.

    Parameters: p (n,) base P(y = 1), unclipped; y (n,) int64 labels (0 or 1; only their values
    at updates matter); betas (T,), alphas (T, 2) the package's Cox grid
    (``families.package_grid(2)``); other arguments as in :func:`_brier_compat`. Returns
    (protected P(y = 1) (n,), log10 CJ (n,), log10 SJ (n, R), passive, active, capital,
    log10 SJ (S, R)).

    The same recursion as :func:`_brier_compat` (the package's Brier-loss aggregating algorithm:
    generalised predictions g_c = -ln(P e^{-Brier(c, p)} + sum A e^{-Brier(c, f)}), substitution
    shortcut, Bayes-like update of the weights by e^{-Brier(y, .)}, capital and log10 SJ), with
    libm-free exp and log and fixed-order tree sums (see the section comment): its outputs agree
    with :func:`_brier_compat`'s to a few ulp, not bit for bit. Deterministic: one stream's
    outputs do not depend on its batch, and chunks with carried state equal one pass exactly.

    Example
    -------
    >>> import numpy as np
    >>> from calpipe import families
    >>> fam = families.package_grid(2)
    >>> a0 = np.zeros((1, 3, fam.size)); a0[0, :, 0] = 0.5 / 3  # the package: pi = 0.5
    >>> c0 = np.zeros((1, 3, fam.size)); c0[0, :, 0] = 1.0
    >>> out = _brier_binary(
    ...     np.array([0.2, 0.7]), np.array([0, 1]), np.arange(2), np.zeros(2, np.int8),
    ...     np.array([0, 2]), fam.betas, fam.alphas, np.array([1e-2, 1e-3, 1e-4]),
    ...     np.array([0.5]), a0, c0, np.zeros((1, 3)))
    >>> np.round(out[0], 3).tolist()  # p' ~ p: the weight sits on the identity and the base
    [0.2, 0.7]
    >>> bool(abs(out[4].sum() + out[3][0] - 1.0) < 1e-12)  # P + sum A = 1
    True
    """
    n_streams = op_offsets.shape[0] - 1
    n_rates, n_fun = active0.shape[1], active0.shape[2]
    out_p = np.full(p.shape[0], np.nan)
    out_sj = np.full((p.shape[0], n_rates), np.nan)
    passive = passive0.copy()
    active = active0.copy()
    capital = capital0.copy()
    log_sj = log_sj0.copy()
    start = op_offsets[:-1].copy()  # next operation of each stream
    args = (p, y, op_event, op_kind, op_offsets)
    grid = (np.ascontiguousarray(betas), np.ascontiguousarray(alphas), rates)
    state = (passive, active, capital, log_sj, out_p, out_sj)
    if n_streams >= 2 * _BRIER_LANES:  # enough streams to fill the lanes twice over
        # Longest streams first, so lanes drain together and the one-stream tail is short.
        order = np.argsort(op_offsets[:-1] - op_offsets[1:], kind="stable")
        _brier_lanes(*args, order, start, *grid, *state)
    default = (n_rates, n_fun) == (3, 15)  # literal sizes, stack scratch
    engine = _brier_streams_3x15 if default else _brier_streams
    engine(*args, start, *grid, *state)
    return out_p, _cj_rows(out_sj), out_sj, passive, active, capital, log_sj
