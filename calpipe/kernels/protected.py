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
multiclass and Brier kernels use ``math.log10``. No ``fastmath``: the compiler may not reorder.
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
            while k < n_streams and start[order[k]] >= op_offsets[order[k] + 1]:
                k += 1
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
        steps = -1  # run until the first busy lane finishes: no bookkeeping inside the steps
        for lane in range(nl):
            if busy[lane] != 0 and (steps < 0 or lane_end[lane] - lane_op[lane] < steps):
                steps = lane_end[lane] - lane_op[lane]
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
                s = lane_stream[lane]
                for j in range(n_rates):
                    for t in range(n_fun):
                        active[s, j, t] = A[j, t, lane]
                passive[s] = PW[lane]
                log10m[s] = M[lane]
                start[s] = lane_end[lane]
                busy[lane] = 0
                n_busy -= 1
    for lane in range(nl):  # hand the busy streams back to the one-stream engine
        if busy[lane] != 0:
            s = lane_stream[lane]
            for j in range(n_rates):
                for t in range(n_fun):
                    active[s, j, t] = A[j, t, lane]
            passive[s] = PW[lane]
            log10m[s] = M[lane]
            start[s] = lane_op[lane]


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
