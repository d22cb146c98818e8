"""Numeric machinery shared by the numba kernels: stack scratch, bit casts, a libm-free exp
and log, fixed-order tree sums and the lane scheduler of the multi-stream engines.

Nothing here knows a calibrator. Every function is ``@njit(inline="always")`` (or an
``@intrinsic``) so that it compiles into its caller and costs no call:

* :func:`stack_empty` -- float64 scratch on the stack (an LLVM ``alloca``), which LLVM can keep in
  registers and vectorise over without aliasing checks; sizes are literals, from the named
  capacities below (``LANES``, ``LANE_CAP``, ...);
* :func:`bits_f64`, :func:`f64_bits` -- IEEE-754 bit casts in registers;
* :func:`ln_core` / :func:`ln_fast` / :func:`log10_core` -- fdlibm's log (``e_log.c``), the one
  copy of its polynomial, within 1 ulp of libm's log (2 ulp for log10);
  :func:`exp_core` / :func:`exp_fast` -- fdlibm's exp (``e_exp.c``), within 1 ulp. Being
  straight-line arithmetic, loops of them vectorise, which a libm call prevents;
* :func:`sigmoid` -- the logistic function, evaluated without overflow on either side;
* :func:`tree_sum` -- a sum in a fixed halving order (deterministic, log2 n dependent adds);
* :func:`cholesky_solve` -- the small SPD solve of the Newton fits and of calibrated regression;
* :func:`take_stream`, :func:`next_stream`, :func:`steps_to_first_end` -- the refill and step count of the
  engines that run ``LANES`` streams at a time (:mod:`calpipe.kernels.mixture`,
  :mod:`calpipe.kernels.brier_binary`).

Why libm-free: in the binary kernels a libm log or exp is a fifth to a half of an event's time,
and a call in a loop over lanes blocks its vectorisation. The "fast" variants route the inputs
the cores do not cover (zero, subnormal, infinite, NaN, |x| > 708) to ``math``.

Example
-------
>>> import math
>>> exp_fast(0.0), ln_fast(1.0)
(1.0, 0.0)
>>> abs(log10_core(2.0) - math.log10(2.0)) <= 2 * math.ulp(math.log10(2.0))
True
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic


# --------------------------------------------------------------------------------------------
# Scratch on the stack.
# --------------------------------------------------------------------------------------------
@intrinsic
def stack_empty(typingctx, size):
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
# log without a libm call: fdlibm's polynomial, written once (ln_core; log10_core is ln_core / ln 10).
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
INV_LN10 = 4.34294481903251816668e-01  # 1 / ln 10
_EXP_MASK = 0x7FF0000000000000
_MANT_MASK = 0x000FFFFFFFFFFFFF
_ONE_BITS = 0x3FF0000000000000  # bit pattern of 1.0


@njit(cache=True, inline="always")
def is_normal(bits):
    """The float64 with these bits is a normal number (not 0, subnormal, inf or NaN)."""
    ex = bits & _EXP_MASK
    return ex != 0 and ex != _EXP_MASK


# --------------------------------------------------------------------------------------------
# Bit casts in registers, exp and log without libm calls.
# --------------------------------------------------------------------------------------------
@intrinsic
def bits_f64(typingctx, bits):
    """The float64 whose IEEE-754 bit pattern is the int64 ``bits`` (a register bit cast, which
    vectorises; numba has no scalar bit cast of its own)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.int64), codegen


@intrinsic
def f64_bits(typingctx, x):
    """The IEEE-754 bit pattern of the float64 ``x`` as an int64 (inverse of :func:`bits_f64`)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(types.float64), codegen


@intrinsic
def opaque(typingctx, n):
    """``n`` itself, which LLVM cannot see through (an empty inline-asm move): a loop over
    ``opaque(n)`` items, ``n`` a literal, keeps a run-time trip count.

    Why: LLVM fully unrolls a short loop of a literal count (16 lanes) before its loop
    vectoriser runs, and the unrolled scalar code is often not re-vectorised (the lanes of the
    Cox terms came out as 16 scalar divisions); with a run-time count the loop vectoriser
    vectorises it. The values computed are the same (the same IEEE operations per lane).
    """
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(signature.return_type)
        fnty = ir.FunctionType(ty, [ty])
        return builder.asm(fnty, "", "=r,0", [args[0]], side_effect=False)

    return types.int64(types.int64), codegen


# fdlibm's e_exp.c (Sun Microsystems, 1993): x = k ln2 + r, |r| <= ln2 / 2 (ln2 split into hi
# and lo parts so that k * _LN2_HI is exact); e^r = 1 + r + r c / (2 - c) with
# c = r - r^2 (P1 + r^2 (P2 + ... + r^2 P5)), a degree-5 minimax polynomial in r^2; e^x = 2^k e^r.
_EXP_P1 = 1.66666666666666019037e-01
_EXP_P2 = -2.77777777770155933842e-03
_EXP_P3 = 6.61375632143793436117e-05
_EXP_P4 = -1.65339022054652515390e-06
_EXP_P5 = 4.13813679705723846039e-08
_INV_LN2 = 1.44269504088896338700e00  # 1 / ln 2
# |x| <= EXP_ARG_MAX: k is in [-1022, 1022], so 2^k is a normal double built from its bits and
# e^x is finite and normal (e^708 = 3e307, e^-708 = 3e-308); wider arguments go to libm.
EXP_ARG_MAX = 708.0
LN10 = 2.302585092994046  # math.log(10.0): the package evaluates 10^x as e^{ln(10) x}


@njit(cache=True, inline="always", error_model="numpy")
def exp_core(x):
    """e^x for |x| <= ``EXP_ARG_MAX`` (fdlibm's exp, within 1 ulp of libm's): straight-line
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
    return y * bits_f64((np.int64(kf) + 1023) << 52)


@njit(cache=True, inline="always", error_model="numpy")
def exp_fast(x):
    """e^x: :func:`exp_core` where it applies, else ``math.exp`` (one scalar, one branch).

    Example
    -------
    >>> import math
    >>> exp_fast(0.0), exp_fast(-800.0), exp_fast(float("inf"))
    (1.0, 0.0, inf)
    >>> abs(exp_fast(-1.3) - math.exp(-1.3)) <= math.ulp(math.exp(-1.3))
    True
    """
    if -EXP_ARG_MAX <= x <= EXP_ARG_MAX:
        return exp_core(x)
    return math.exp(x)


@njit(cache=True, inline="always", error_model="numpy")
def ln_core(x):
    """ln(x) for a positive normal double x, within 1 ulp of libm's log: fdlibm's log with the
    operations of :func:`log10_core` (so ``ln_core(x) * INV_LN10`` equals it bit for bit), but
    bit casts in registers and no branch, so loops of it vectorise. Other x give garbage."""
    b = f64_bits(x)
    k = ((b & _EXP_MASK) >> 52) - 1023
    m = bits_f64((b & _MANT_MASK) | _ONE_BITS)  # in [1, 2)
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
def ln_fast(x):
    """ln(x): :func:`ln_core` for positive normal x; zero, subnormal, negative, infinite and
    NaN x go to ``math.log``.

    Example
    -------
    >>> import math
    >>> ln_fast(1.0), ln_fast(0.0), ln_fast(float("inf"))
    (0.0, -inf, inf)
    >>> abs(ln_fast(0.3) - math.log(0.3)) <= math.ulp(math.log(0.3))
    True
    """
    b = f64_bits(x)
    ex = b & _EXP_MASK
    if b < 0 or ex == 0 or ex == _EXP_MASK:
        return math.log(x)
    return ln_core(x)


@njit(cache=True, inline="always", error_model="numpy")
def log10_core(x):
    """log10(x) for a positive normal double x, within 2 ulp of libm's log10: :func:`ln_core`
    times 1 / ln 10.

    Why not ``math.log10``: it is a libm call, about a fifth of the time of a binary mixture
    event, and a call blocks vectorisation over lanes; this is straight-line arithmetic. Callers
    route zero, subnormal, infinite and NaN inputs (:func:`is_normal` of the bits is false) to
    ``math.log10``.
    """
    return ln_core(x) * INV_LN10


@njit(cache=True, inline="always")
def ln_ok(x):
    """x is a positive normal double (the domain of :func:`ln_core`); bitwise, no branch."""
    b = f64_bits(x)
    ex = b & _EXP_MASK
    return (b > 0) & (ex != 0) & (ex != _EXP_MASK)


@njit(cache=True, inline="always")
def sigmoid(z):
    """1 / (1 + e^-z), through e^z / (1 + e^z) for negative z so that no exp overflows: the
    link of Platt, beta and decay-beta scaling and of the lanes kernel's inputs."""
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@njit(cache=True, inline="always")
def tree_sum(v, lo, n):
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
# The lane scheduler shared by the multi-stream engines (mixture, brier_binary).
# --------------------------------------------------------------------------------------------
# Lanes of the multi-stream engines. A compile-time constant: loops over a literal 64 lanes
# compile to straight AVX-512 code (8 doubles at a time) without trip-count checks, about 10 %
# faster than the same loops over a run-time lane count; 32 or 128 lanes measured slower.
LANES = 64
LANE_CAP = 4096  # stack capacity of one (R, T, lanes) scratch array, in doubles (32 KiB)
LANE_FUN_CAP = 1024  # stack capacity of one (T, lanes) scratch array, in doubles
LANE_RATE_CAP = 512  # stack capacity of one (R, lanes) scratch array, in doubles


@njit(cache=True, inline="always")
def next_stream(order, k, start, op_offsets):
    """First position >= k in ``order`` whose stream has operations left (``len(order)`` if none):
    the lane engines' refill scan."""
    while k < order.shape[0] and start[order[k]] >= op_offsets[order[k] + 1]:
        k += 1
    return k


@njit(cache=True, inline="always")
def idle_lanes(nl):
    """The lane engines' bookkeeping on the stack (``LANES`` slots each, the first ``nl`` used),
    every lane idle: ``(busy, lane_stream, lane_op, lane_end, lane_event, upd, fc)`` -- the
    stream a lane runs, its next op (an idle lane sits on op 0) and its end, the event of its
    current op, and whether this step updates / forecasts (int64). Inlined, so the buffers are
    the caller's stack (:func:`stack_empty`); shared by the expert lanes engines, binary and K
    classes, which set up their lanes alike."""
    busy = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    lane_stream = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    lane_op = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    lane_end = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    lane_event = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    upd = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    fc = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    for lane in range(nl):
        busy[lane] = 0
        lane_op[lane] = 0
        lane_end[lane] = 0
        lane_stream[lane] = 0
    return busy, lane_stream, lane_op, lane_end, lane_event, upd, fc


@njit(cache=True, inline="always")
def take_stream(lane, order, k, start, op_offsets, busy, lane_stream, lane_op, lane_end):
    """Give idle lane ``lane`` the next stream of ``order`` (from position ``k``) that has
    operations left, and set its bookkeeping. Returns ``(next position, stream)``; the stream is
    -1 when ``order`` is exhausted (the lane then stays idle on op 0). The engine loads the
    stream's state into the lane itself (its layout is the engine's)."""
    k = next_stream(order, k, start, op_offsets)
    if k == order.shape[0]:
        lane_op[lane] = 0
        lane_end[lane] = 0
        return k, -1
    s = order[k]
    busy[lane] = 1
    lane_stream[lane] = s
    lane_op[lane] = start[s]
    lane_end[lane] = op_offsets[s + 1]
    return k + 1, s


@njit(cache=True, inline="always")
def steps_to_first_end(busy, lane_op, lane_end, n_lanes):
    """Steps all lanes can take together before the first busy lane runs out of operations: the
    lane engines step that many times without any bookkeeping inside the steps."""
    steps = -1
    for lane in range(n_lanes):
        if busy[lane] != 0 and (steps < 0 or lane_end[lane] - lane_op[lane] < steps):
            steps = lane_end[lane] - lane_op[lane]
    return steps


# --------------------------------------------------------------------------------------------
# Small dense linear algebra.
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def cholesky_solve(a, b, lower, z, out):
    """Solve a out = b for a small symmetric positive definite ``a`` by Cholesky a = L L^T.

    ``lower`` (m, m) and ``z`` (m,) are scratch (only the lower triangle of ``lower`` is written
    and read); ``out`` (m,) receives the solution. Returns False, leaving ``out`` unspecified, if
    a pivot is not positive (``a`` not SPD to rounding): the Newton fits then shift the diagonal
    and retry. Used by :mod:`calpipe.kernels.parametric` and
    :mod:`calpipe.kernels.calibrated_regression`.
    """
    m = b.shape[0]
    for j in range(m):
        s = a[j, j]
        for k in range(j):
            s -= lower[j, k] * lower[j, k]
        if not s > 0.0:
            return False
        d = math.sqrt(s)
        lower[j, j] = d
        for i in range(j + 1, m):
            s = a[i, j]
            for k in range(j):
                s -= lower[i, k] * lower[j, k]
            lower[i, j] = s / d
    for i in range(m):  # L z = b
        s = b[i]
        for k in range(i):
            s -= lower[i, k] * z[k]
        z[i] = s / lower[i, i]
    for i in range(m - 1, -1, -1):  # L^T out = z
        s = z[i]
        for k in range(i + 1, m):
            s -= lower[k, i] * out[k]
        out[i] = s / lower[i, i]
    return True
