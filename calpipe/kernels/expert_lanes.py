"""The default method's recursion with its online inputs, all streams of a batch in SIMD lanes:
paper 001's Composite Jumper (Algorithm 1) over the experts (input i, Cox function theta), the
inputs -- Online Platt / beta scaling (Gupta & Ramdas 2023, Alg. 1), beta calibration on
exponentially forgotten bins (``decay-beta``) and Venn-ABERS on such bins (``decay-venn-abers``,
Vovk & Petej 2014 Alg. 1) -- learnt in the same pass.

Public entry point: :func:`composite_experts_binary`; the calibrator is
:class:`calpipe.calibrators.experts.CompositeExperts` (which dispatches here when every input is
one of those kinds), and :func:`calpipe.kernels.expert_mixture.expert_mixture_binary` runs its
mixture through these engines when its inputs are given.

Recursion
---------
At each operation of a stream (:mod:`calpipe.kernels.ops`) on event e with base forecast p_e:

1. every input i forecasts q_{e,i} from its state *now* (OPS: sigmoid(a logit c(p) + b); OBS:
   sigmoid(a ln c(p) - b ln(1 - c(p)) + c); decay-beta: sigmoid(a ln c(p) - b ln(1 - c(p)) + c)
   on its last refit, the base before its warm-up; decay-venn-abers: its last refit's table at
   the bin of ln c(p) - log1p(-c(p)), the base before its warm-up; a given column: read), clipped to
   [clip, 1 - clip] for the mixture; q_{e,0} = p_e;
2. the mixture, exactly :mod:`calpipe.kernels.expert_mixture` (paper 001 Alg. 1, lines 4-15,
   expert k = i T + t with f_k(e) = f_t(q_{e,i})):

       A[J, k] <- (1 - J) A[J, k] + J ((1 - w) / E + w r_k) sum_k' A[J, k']    (jump-mixing)
       p'      <- P p + sum_{J, k} A[J, k] f_k(e)                              (forecast)
       P <- P B_p({y}),  A[J, k] <- A[J, k] B_{f_k(e)}({y}),  C = P + sum A   (Bayes)
       P, A <- P / C, A / C;  log10 S <- log10 S + log10 C - log10 B_p({y})

3. at an update, every input learns y_e: the Online Newton Step of
   :mod:`calpipe.kernels.online_scaling` (``_ons_binary``), or decay-beta's (decay-venn-abers')
   decayed count and its refit when due (:mod:`calpipe.kernels.decay_beta`,
   :mod:`calpipe.kernels.decay_venn_abers`: the per-input kernels' own fit functions).

An update-only op (a delayed label) is handled in place: step 1 is each input's forecast at the
label's time, which the per-input path obtained from a forecast op on a copy of the event.

Engines, and why every stream's outputs are bit-identical to running it alone
-----------------------------------------------------------------------------
Two compiled instances of one body (:func:`_engine`): ``EXPERT_LANES`` streams at a time
(lane l of every scratch array holds one stream; each step advances every lane by one operation;
the loops over lanes vectorise and the lanes' independent chains of sums hide each other's
latency) and one stream at a time (the same body with one lane), which also finishes streams
the lanes hand back once fewer than half of them are busy (the scheduler of
:mod:`calpipe.kernels.numeric`). Both run, per stream, the floating-point operations of the
per-input kernels and of ``expert_mixture._binary`` in their order:

* every sum keeps its order (sum_k' A in k order, C in (J, k) order, p' in k order);
* an input's transcendental calls are libm's (``math.log``, ``math.log1p``, ``math.exp`` and the
  mixture's ``math.log10``), as in the per-input kernels: a libm-free exp would vectorise but
  round differently. Each is evaluated once per event: OBS and decay-beta share ln c(p) when
  their clipped scores are equal, and decay-beta inputs with the same clip share
  ln(1 - c(p)) and the bin of the log-odds (same arguments, same results);
* each Cox term f_k(e) is evaluated once per event and read by the three rates (the Cox form
  p^beta e^alpha / (p^beta e^alpha + (1 - p)^beta) with e^alpha, sqrt and squares hoisted:
  there is no exp per term; the logistic form sigmoid(alpha + beta logit p) would cost one exp
  per term and round differently);
* the normalisation A <- A / C is deferred: the lanes keep V = A B_f({y}) and 1 / C, and
  multiply when they next read A (v * (1 / C), the same product), so the (R, E) weights are
  read once and written once per event instead of three times.

The refit of a decay-beta input (a Newton fit on its bins) runs for one lane at a time when its
label count is due: it is the per-input kernel's own function.

Speed (issue #33; BENCHMARKS.md §16), with the operations above unchanged:

* the per-lane code (inputs' forecasts and updates) references no array through an inlined
  helper: numba counts such references atomically (``NRT_incref`` / ``NRT_decref``, a
  ``lock``-prefixed instruction each), which took a third of the kernel's time; the rare
  projection and refit are calls of their own, inside their branches;
* each step first gathers every lane's event, base and label in one short loop: the lanes'
  events lie far apart in the batch, and their cache misses then overlap;
* the weights S, the Cox terms F and the column sums COL are stack buffers (``on_stack``):
  LLVM then knows they overlap nothing and keeps the chains of sums (C, p', the rates' totals)
  in vector registers, without run-time overlap checks;
* the Cox terms loop over an opaque lane count (:func:`calpipe.kernels.numeric.opaque`): a
  literal one let LLVM unroll the lanes into scalar divisions before vectorising.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from calpipe import config
from calpipe.kernels.calfun import eval_binary_lanes
from calpipe.kernels.decay_beta import fit_kernel
from calpipe.kernels.decay_venn_abers import IVAP_IROWS, IVAP_ROWS, ivap_table
from calpipe.kernels.mixture import restart_terms
from calpipe.kernels.numeric import (
    LANES,
    idle_lanes,
    opaque,
    sigmoid,
    stack_empty,
    steps_to_first_end,
    take_stream,
)
from calpipe.kernels.online_scaling import ons_step, project_scalars
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

#: Input kinds: a column of given forecasts, Online Platt Scaling, online beta scaling,
#: decay-beta, decay-venn-abers (the kernel's codes; :func:`ons_row`, :func:`decay_row` and
#: :func:`decay_va_row` build a row of ``par``).
IN_GIVEN, IN_OPS, IN_OBS, IN_DECAY, IN_DECAY_VA = 0, 1, 2, 3, 4
#: Columns of an input's row of ``par``.
N_PAR = 8
_COX = 2  # calpipe.families.COX
_NL = config.EXPERT_LANES
_CAP_W = config.EXPERT_LANE_WEIGHTS
_CAP_E = config.EXPERT_LANE_EXPERTS
_CAP_R = config.EXPERT_LANE_RATES
_STACK_W = _NL * _CAP_W  # literals: the sizes of the lanes' scratch on the stack
_STACK_E = _NL * _CAP_E
_STACK_R = _NL * config.EXPERT_LANE_RATES
_WHOLE = 2.0**53  # below it every whole-number double converts to int64 exactly
_RESCALE = config.DECAY_BETA_RESCALE  # decay-beta's, a literal in the compiled kernel
if not 1 <= _NL <= LANES:
    raise ValueError(f"config.EXPERT_LANES must be in [1, {LANES}]")


def ons_row(gamma: float, radius: float, score_clip: float) -> np.ndarray:
    """``par`` row of an OPS / OBS input: ONS step 1/gamma, radius B, feature clip."""
    return np.array([gamma, radius, score_clip, 0, 0, 0, 0, 0], dtype=np.float64)


def decay_row(memory, eps, warmup, refit_every, rho, max_iter, tol, n_bins) -> np.ndarray:
    """``par`` row of a decay-beta input (the arguments of
    :func:`calpipe.kernels.decay_beta.decay_beta`)."""
    lam = 1.0 - 2.0 / memory  # as decay_beta computes it
    return np.array(
        [lam, eps, warmup, refit_every, rho, max_iter, tol, n_bins], dtype=np.float64
    )  # fmt: skip


def decay_va_row(memory, eps, warmup, refit_every, n_bins) -> np.ndarray:
    """``par`` row of a decay-venn-abers input (the arguments of
    :func:`calpipe.kernels.decay_venn_abers.decay_venn_abers`; columns 0-3 and 7 as
    :func:`decay_row`'s)."""
    lam = 1.0 - 2.0 / memory  # as decay_venn_abers computes it
    return np.array([lam, eps, warmup, refit_every, 0, 0, 0, n_bins], dtype=np.float64)


@njit(cache=True, inline="always", error_model="numpy")
def _bin_of(edges, i, nb, z):
    """``np.searchsorted(edges[i, 1:nb], z, side="right")`` (decay_beta's bin of the log-odds
    z), numba's binary search written out on the row in place: the same comparisons
    (``edge <= z``, a NaN z after every edge), hence the same bin, without the slice (a view
    of ``edges`` whose reference count the hot loop would touch, an atomic operation)."""
    lo, hi = 0, nb - 1
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        if z != z or edges[i, 1 + mid] <= z:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always", error_model="numpy")
def _ons_forecast(qq, beta, t0, t1, t2, lq, l1):
    """Step 1 for an OPS / OBS input (``online_scaling._ons_binary``'s forecast) on the clipped
    score ``qq``: ``(f, u0, u1)``, the forecast and the features its update reads. ``lq``,
    ``l1``: ln qq and ln(1 - qq) (OBS; the caller's memo); OPS takes ln(qq / (1 - qq))."""
    if beta:
        u0 = lq
        u1 = -l1
        z = t0 * u0 + t1 * u1 + t2
    else:
        u0 = math.log(qq / (1.0 - qq))
        u1 = 1.0
        z = t0 * u0 + t1
    return sigmoid(z), u0, u1


@njit(cache=True, inline="always", error_model="numpy")
def _ons_learn(st, s, c0, beta, f, lab, u0, u1, gamma, radius):
    """Step 3 for an OPS / OBS input: ``_ons_binary``'s update on the stream's state row
    (theta, then A row-major), operation for operation. Returns True when theta left the ball
    of radius B: the caller then projects it (:func:`_ons_project`; rare), so that no scratch
    array is referenced here (in the hot loop every array reference is an atomic count)."""
    d = 3 if beta else 2
    t0, t1 = st[s, c0], st[s, c0 + 1]
    t2 = st[s, c0 + 2] if beta else 0.0
    a00, a01, a11 = st[s, c0 + d], st[s, c0 + d + 1], st[s, c0 + d + d + 1]
    a02 = st[s, c0 + d + 2] if beta else 0.0
    a12 = st[s, c0 + d + d + 2] if beta else 0.0
    a22 = st[s, c0 + d + 2 * d + 2] if beta else 0.0
    t0, t1, t2, a00, a01, a11, a02, a12, a22, norm2 = ons_step(
        t0, t1, t2, a00, a01, a11, a02, a12, a22, f - lab, u0, u1, beta, gamma
    )
    st[s, c0], st[s, c0 + 1] = t0, t1
    st[s, c0 + d], st[s, c0 + d + 1], st[s, c0 + d + d], st[s, c0 + d + d + 1] = a00, a01, a01, a11
    if beta:
        st[s, c0 + 2] = t2
        st[s, c0 + d + 2], st[s, c0 + d + 2 * d] = a02, a02
        st[s, c0 + d + d + 2], st[s, c0 + d + 2 * d + 1] = a12, a12
        st[s, c0 + d + 2 * d + 2] = a22
    return norm2 > radius * radius


@njit(cache=True, error_model="numpy")
def _ons_project(st, s, c0, beta, radius, tv, av, shifted, rhs, lower, zz, out):
    """The generalised projection of the stream's theta on the ball (``_ons_binary``'s, after
    the step :func:`_ons_learn` wrote): ``project_kernel`` through the scratch of size d.
    Not inlined: it runs rarely, and its array references stay out of the hot loop."""
    d = 3 if beta else 2
    t0, t1 = st[s, c0], st[s, c0 + 1]
    t2 = st[s, c0 + 2] if beta else 0.0
    a00, a01, a11 = st[s, c0 + d], st[s, c0 + d + 1], st[s, c0 + d + d + 1]
    a02 = st[s, c0 + d + 2] if beta else 0.0
    a12 = st[s, c0 + d + d + 2] if beta else 0.0
    a22 = st[s, c0 + d + 2 * d + 2] if beta else 0.0
    t0, t1, t2 = project_scalars(
        t0, t1, t2, a00, a01, a11, a02, a12, a22, beta, radius,
        tv, av, shifted, rhs, lower, zz, out,
    )  # fmt: skip
    st[s, c0], st[s, c0 + 1] = t0, t1
    if beta:
        st[s, c0 + 2] = t2


@njit(cache=True, inline="always", error_model="numpy")
def _bin_count(st, s, u_at, g_at, pos, lab, k, lam, nb):
    """Step 3 for an input on exponentially forgotten bin counts (decay-beta, decay-venn-abers:
    ``decay_beta._decay_beta``'s operations, in order): the common factor g (``st[s, g_at]``)
    divided by lambda, the label counted in bin ``k`` of the positives (from ``pos``) or the
    negatives (``pos + nb``), all divided by g once it passes the rescale bound; then the label
    count u (``st[s, u_at]``) + 1, returned (the caller refits when it is due)."""
    neg = pos + nb
    st[s, g_at] /= lam
    if lab == 1:
        st[s, pos + k] += st[s, g_at]
    else:
        st[s, neg + k] += st[s, g_at]
    if st[s, g_at] > _RESCALE:
        for j in range(nb):
            st[s, pos + j] /= st[s, g_at]
            st[s, neg + j] /= st[s, g_at]
        st[s, g_at] = 1.0
    st[s, u_at] += 1.0
    return st[s, u_at]


@njit(cache=True, inline="always", error_model="numpy")
def _decay_count(st, s, c0, lab, k, lam, nb):
    """:func:`_bin_count` of a decay-beta input (state ``[u, a, b, c, g, g n^1, g n^0]``)."""
    return _bin_count(st, s, c0, c0 + 4, c0 + 5, lab, k, lam, nb)


@njit(cache=True, inline="always", error_model="numpy")
def _decay_va_count(st, s, c0, lab, k, lam, nb):
    """:func:`_bin_count` of a decay-venn-abers input (state ``[u, g, g n^1, g n^0, table]``)."""
    return _bin_count(st, s, c0, c0 + 1, c0 + 2, lab, k, lam, nb)


@njit(cache=True, error_model="numpy")
def _decay_va_refit(st, s, c0, nb, cur_pos, cur_neg, work, iwork):
    """A decay-venn-abers input's refit (``_decay_venn_abers``'s): the per-input kernel's own
    ``ivap_table`` on the bins' current counts, written to the stream's table. Not inlined:
    it runs once every ``refit_every`` labels."""
    pos = c0 + 2
    neg = c0 + 2 + nb
    for j in range(nb):
        cur_pos[j] = st[s, pos + j] / st[s, c0 + 1]
        cur_neg[j] = st[s, neg + j] / st[s, c0 + 1]
    ivap_table(cur_pos[:nb], cur_neg[:nb], st[s, c0 + 2 + 2 * nb : c0 + 2 + 3 * nb], work,
               iwork)  # fmt: skip


@njit(cache=True, inline="always", error_model="numpy")
def _refit_due(u, warmup, every):
    """``u >= warmup and (u - warmup) % every == 0``, decay_beta's test for a refit, without
    the float modulo's call (numba's ``fmod``, ~2% of the kernel, twice per label) when both
    operands are whole numbers below 2^53 and ``every`` >= 1 (label counts: always), where the
    integer modulo gives the same answer; others take the float modulo as before."""
    if u < warmup:
        return False
    d = u - warmup
    if d == math.floor(d) and every == math.floor(every) and d < _WHOLE and 1.0 <= every < _WHOLE:
        return int(d) % int(every) == 0
    return d % every == 0


@njit(cache=True, error_model="numpy")
def _decay_refit(st, s, c0, i, u, par, x1, x2, w, cur_pos, cur_neg):
    """A decay-beta input's refit when its label count u is due (``_decay_beta``'s): the
    per-input kernel's own ``fit_kernel`` on the bins' current counts. Not inlined: it runs
    once every ``refit_every`` labels, and its array references stay out of the hot loop."""
    nb = int(par[i, 7])
    pos = c0 + 5
    neg = c0 + 5 + nb
    if u == par[i, 2]:  # the first fit starts from the identity map
        w[0], w[1], w[2] = 1.0, 1.0, 0.0
    else:
        w[0], w[1], w[2] = st[s, c0 + 1], st[s, c0 + 2], st[s, c0 + 3]
    for j in range(nb):
        cur_pos[j] = st[s, pos + j] / st[s, c0 + 4]
        cur_neg[j] = st[s, neg + j] / st[s, c0 + 4]
    fit_kernel(w, x1[i, :nb], x2[i, :nb], cur_pos[:nb], cur_neg[:nb], par[i, 4],
               int(par[i, 5]), par[i, 6])  # fmt: skip
    st[s, c0 + 1], st[s, c0 + 2], st[s, c0 + 3] = w[0], w[1], w[2]


@njit(cache=True, inline="always")
def lane_mixture(S, nl):
    """The expert lanes engines' per-lane mixture scalars on the stack (``LANES`` slots each,
    the first ``nl`` used): ``(PW, M, INVP, BASE, PWB, C, T0, T1, T2, INV)`` -- P, log10 S,
    1 / C of S's pending normalisation, the base's B_p({y}), P B_p({y}), the Bayes numerator,
    three rates' sums in flight (:func:`sum_rates3`) and 1 / C -- with every lane, and the
    weights ``S`` (R, E, lanes), on the valid idle state P = A = 1 / (R E + 1), log10 S = 0,
    INVP = 1 (idle lanes compute on it). Inlined (the buffers are the caller's stack); shared
    by this module's and :mod:`calpipe.kernels.expert_lanes_multiclass`'s engines."""
    PW = carray(stack_empty(64), LANES)[:nl]
    M = carray(stack_empty(64), LANES)[:nl]
    INVP = carray(stack_empty(64), LANES)[:nl]
    BASE = carray(stack_empty(64), LANES)[:nl]
    PWB = carray(stack_empty(64), LANES)[:nl]
    C = carray(stack_empty(64), LANES)[:nl]
    T0 = carray(stack_empty(64), LANES)[:nl]
    T1 = carray(stack_empty(64), LANES)[:nl]
    T2 = carray(stack_empty(64), LANES)[:nl]
    INV = carray(stack_empty(64), LANES)[:nl]
    n_rates, n_exp = S.shape[0], S.shape[1]
    init = 1.0 / (n_rates * n_exp + 1.0)
    for lane in range(nl):
        PW[lane] = init
        M[lane] = 0.0
        INVP[lane] = 1.0
    for j in range(n_rates):
        for k in range(n_exp):
            for lane in range(nl):
                S[j, k, lane] = init
    return PW, M, INVP, BASE, PWB, C, T0, T1, T2, INV


@njit(cache=True, inline="always", error_model="numpy")
def sum_rates3(S, INVP, TOT, j, n_exp, nl, T0, T1, T2):
    """TOT[J, l] = sum_k S[J, k, l] INVP[l] (in k order) for rates J = j, j + 1, j + 2 in one
    pass over k: three independent chains of adds, each lane's sums in the stack buffers
    T0, T1, T2 (indexed by literals, so LLVM keeps them in vector registers; one rate at a
    time, or a run-time rate index, left them in memory or in scalar registers)."""
    for lane in range(nl):
        T0[lane] = 0.0
        T1[lane] = 0.0
        T2[lane] = 0.0
    for k in range(n_exp):
        for lane in range(nl):
            T0[lane] += S[j, k, lane] * INVP[lane]
            T1[lane] += S[j + 1, k, lane] * INVP[lane]
            T2[lane] += S[j + 2, k, lane] * INVP[lane]
    for lane in range(nl):
        TOT[j, lane] = T0[lane]
        TOT[j + 1, lane] = T1[lane]
        TOT[j + 2, lane] = T2[lane]


@njit(cache=True, inline="always", error_model="numpy")
def _engine(
    q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params, rates,
    uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin, nl, on_stack,
):  # fmt: skip
    """Streams ``order[0], order[1], ...`` (from op ``start[s]``) through ``nl`` lanes, one
    operation per lane per step (see the module docstring). Lanes are refilled from ``order`` as
    their streams end; once ``order`` is exhausted and fewer than half the lanes are busy, the
    busy streams are handed back (state written, ``start[s]`` set to their next op) for the
    one-lane engine. The state arrays and ``st`` are updated in place."""
    n_streams = order.shape[0]
    n_in = kinds.shape[0]
    n_fun = params.shape[0]
    n_rates = rates.shape[0]
    n_exp = (1 + n_in) * n_fun
    exp_alpha = np.exp(params[:, 0])
    # decay-beta bin centres, as _decay_beta computes them
    nbm = edges.shape[1] - 1
    x1 = np.zeros((n_in, max(nbm, 1)))
    x2 = np.zeros((n_in, max(nbm, 1)))
    for i in range(n_in):
        if kinds[i] == IN_DECAY:
            for k in range(int(par[i, 7])):
                pc = sigmoid(0.5 * (edges[i, k] + edges[i, k + 1]))
                x1[i, k] = math.log(pc)
                x2[i, k] = -math.log1p(-pc)
    w3 = np.empty(3)
    cur_pos = np.empty(max(nbm, 1))
    cur_neg = np.empty(max(nbm, 1))
    ivap_w = np.empty((IVAP_ROWS, max(nbm, 1)))  # decay-venn-abers' PAV stacks and window
    ivap_i = np.empty((IVAP_IROWS, max(nbm, 1)), dtype=np.int64)
    # project_kernel's scratch (theta, A, shifted, rhs, lower, z, out) of size d = 2 and 3
    tv2, rh2, zz2, ou2 = np.empty(2), np.empty(2), np.empty(2), np.empty(2)
    av2, sh2, lo2 = np.empty((2, 2)), np.empty((2, 2)), np.empty((2, 2))
    tv3, rh3, zz3, ou3 = np.empty(3), np.empty(3), np.empty(3), np.empty(3)
    av3, sh3, lo3 = np.empty((3, 3)), np.empty((3, 3)), np.empty((3, 3))
    # decay-beta and decay-venn-abers inputs with equal bins share the bin of a log-odds: the
    # first such input
    same_bins = np.arange(n_in)
    for i in range(n_in):
        for i2 in range(i):
            binned = kinds[i] == IN_DECAY or kinds[i] == IN_DECAY_VA
            binned2 = kinds[i2] == IN_DECAY or kinds[i2] == IN_DECAY_VA
            if binned and binned2 and same_bins[i2] == i2:
                if par[i, 7] == par[i2, 7] and np.all(edges[i] == edges[i2]):
                    same_bins[i] = i2
                    break
    # Scratch, lane index last: S (R, E, lanes) holds V = A B_f({y}) (its normalisation 1 / C
    # deferred in INVP; INVP = 1 when S holds A itself), F and COL (E, lanes), inputs (I, lanes).
    # On the stack (``on_stack``, a literal; the caller checks the sizes fit): LLVM then knows
    # that S, F and COL overlap no other array, and vectorises their loops without run-time
    # overlap checks, whose scalar fallback kept the sums C, TOT and PRED in memory (a
    # store-to-load round trip per weight on their chains of adds).
    if on_stack:
        S = carray(stack_empty(_STACK_W), (n_rates, n_exp, nl))
        F = carray(stack_empty(_STACK_E), (n_exp, nl))
        COL = carray(stack_empty(_STACK_E), (n_exp, nl))
    else:
        S = np.empty((n_rates, n_exp, nl))
        F = np.empty((n_exp, nl))
        COL = np.empty((n_exp, nl))
    QIN = np.empty((1 + n_in, nl))  # clipped input forecasts, row 0 the base
    FIN = np.empty((max(n_in, 1), nl))  # raw input forecasts
    U0 = np.empty((max(n_in, 1), nl))  # what each input's update reads: ONS features u0, u1;
    U1 = np.empty((max(n_in, 1), nl))  # decay-beta ln c(p), log1p(-c(p))
    # P, log10 S, INVP = 1 / C of S's pending normalisation (or 1), B_p({y}), P B_p({y}), the
    # Bayes numerator C = p'(y), three rates' sums in flight (sum_rates3) and 1 / C; every lane
    # idle on a valid state
    PW, M, INVP, BASE, PWB, C, T0, T1, T2, INV = lane_mixture(S, nl)
    # (then g = J sum_k A[J, k]; ADD its uniform share g (1 - w) / E, restart: + g w r_k)
    if on_stack:  # sum_k A[J, k] of each rate; then its jump-mixing share J / E sum_k A[J, k]
        TOT = carray(stack_empty(_STACK_R), (n_rates, nl))
        ADD = carray(stack_empty(_STACK_R), (n_rates, nl))
    else:
        TOT = np.empty((n_rates, nl))
        ADD = np.empty((n_rates, nl))
    PRED = carray(stack_empty(64), LANES)[:nl]  # p'
    TQ = carray(stack_empty(64), LANES)[:nl]  # eval_binary_lanes scratch
    SP = carray(stack_empty(64), LANES)[:nl]
    SQ = carray(stack_empty(64), LANES)[:nl]
    y0 = carray(stack_empty(64), LANES).view(np.int64)[:nl]  # label is 0 (else 1)
    LAB = carray(stack_empty(64), LANES).view(np.int64)[:nl]  # the label y_e
    busy, lane_stream, lane_op, lane_end, lane_event, upd, fc = idle_lanes(nl)
    denom = float(n_exp)
    nl_vec = opaque(nl)  # nl, as a run-time trip count (numeric.opaque)
    pos_k = 0  # next position in order
    n_busy = 0
    while True:
        for lane in range(nl):  # refill idle lanes
            if busy[lane] != 0:
                continue
            pos_k, s = take_stream(
                lane, order, pos_k, start, op_offsets, busy, lane_stream, lane_op, lane_end
            )
            if s < 0:
                continue
            n_busy += 1
            for j in range(n_rates):
                for k in range(n_exp):
                    S[j, k, lane] = active[s, j, k]
            PW[lane] = passive[s]
            M[lane] = log10m[s]
            INVP[lane] = 1.0
        if n_busy == 0 or (pos_k == n_streams and 2 * n_busy < nl):
            break
        steps = steps_to_first_end(busy, lane_op, lane_end, nl)
        for _ in range(steps):
            # 0. each lane's operation, event, base and label, gathered in one short loop: the
            #    lanes' events lie far apart in the batch (streams interleaved in time), and the
            #    cache misses of q[e] and y[e] overlap here instead of one after another
            for lane in range(nl):
                o = lane_op[lane]
                e = op_event[o]
                kind = op_kind[o]
                b = busy[lane]
                lane_event[lane] = e
                QIN[0, lane] = q[e, 0]
                LAB[lane] = y[e]
                upd[lane] = b & (kind != OP_FORECAST)
                fc[lane] = b & (kind != OP_UPDATE)
            # 1. its inputs' forecasts (scalar: libm calls), each libm value computed once per
            #    event (a memo keyed by its argument); the features their updates read in U0, U1
            for lane in range(nl):
                x = QIN[0, lane]
                is0 = LAB[lane] == 0
                y0[lane] = is0
                bb = 1.0 - x if is0 else x
                BASE[lane] = bb
                PWB[lane] = PW[lane] * bb
                C[lane] = PWB[lane]
                if busy[lane] == 0:
                    for i in range(n_in):
                        QIN[1 + i, lane] = x
                    continue
                e = lane_event[lane]
                o = lane_op[lane]
                s = lane_stream[lane]
                mq, mlq = -1.0, 0.0  # ln q
                m1, ml1 = -1.0, 0.0  # ln(1 - q)
                mp, mlp = -1.0, 0.0  # log1p(-q)
                for i in range(n_in):
                    kind = kinds[i]
                    c0 = cols[i]
                    if kind == IN_GIVEN:
                        f = q[e, c0]
                    elif kind == IN_DECAY:  # decay_beta._decay_beta, forecast
                        eps = par[i, 1]
                        qq = min(max(x, eps), 1.0 - eps)
                        if qq != mq:
                            mq, mlq = qq, math.log(qq)
                        if qq != mp:
                            mp, mlp = qq, math.log1p(-qq)
                        U0[i, lane] = mlq
                        U1[i, lane] = mlp
                        if st[s, c0] >= par[i, 2]:
                            f = sigmoid(st[s, c0 + 1] * mlq - st[s, c0 + 2] * mlp + st[s, c0 + 3])
                        else:
                            f = x
                    elif kind == IN_DECAY_VA:  # decay_venn_abers._decay_venn_abers, forecast
                        eps = par[i, 1]
                        qq = min(max(x, eps), 1.0 - eps)
                        if qq != mq:
                            mq, mlq = qq, math.log(qq)
                        if qq != mp:
                            mp, mlp = qq, math.log1p(-qq)
                        U0[i, lane] = mlq
                        U1[i, lane] = mlp
                        if st[s, c0] >= par[i, 2]:  # the table's value of the bin of z
                            nb = int(par[i, 7])
                            f = st[s, c0 + 2 + 2 * nb + _bin_of(edges, i, nb, mlq - mlp)]
                        else:
                            f = x
                    else:  # online_scaling._ons_binary, forecast
                        sc = par[i, 2]
                        qq = min(max(x, sc), 1.0 - sc)
                        if kind == IN_OBS:
                            if qq != mq:
                                mq, mlq = qq, math.log(qq)
                            if qq != m1:
                                m1, ml1 = qq, math.log(1.0 - qq)
                            u0 = mlq
                            u1 = -ml1
                            z = st[s, c0] * u0 + st[s, c0 + 1] * u1 + st[s, c0 + 2]
                        else:
                            u0 = math.log(qq / (1.0 - qq))
                            u1 = 1.0
                            z = st[s, c0] * u0 + st[s, c0 + 1]
                        f = sigmoid(z)
                        U0[i, lane] = u0
                        U1[i, lane] = u1
                    FIN[i, lane] = f
                    QIN[1 + i, lane] = min(max(f, clip), 1.0 - clip)
                    if fin.shape[1] > 0:
                        fin[i, o] = f
            # 2. the Cox terms, once per event: F[i T + t] = f_t(q_i)
            #    (over an opaque lane count: with the literal one LLVM unrolled the lanes into
            #    scalar divisions; so it vectorises them, the same divisions lane by lane)
            for i in range(1 + n_in):
                eval_binary_lanes(_COX, params, exp_alpha, QIN[i], F[i * n_fun : (i + 1) * n_fun],
                                  n_fun, nl_vec, TQ, SP, SQ)  # fmt: skip
            # 3. jump mixing, forecast and Bayes numerator (paper 001 Alg. 1 lines 5-13)
            for k in range(n_exp):
                for lane in range(nl):
                    COL[k, lane] = 0.0
            # sum_k A[J, k] of the rates three at a time, in one pass over S (each sum in k
            # order): three chains of adds in flight, kept in vector registers (the rest of R
            # one at a time)
            j = 0
            while j < n_rates:
                if j + 3 <= n_rates:
                    sum_rates3(S, INVP, TOT, j, n_exp, nl, T0, T1, T2)
                    j += 3
                else:
                    for lane in range(nl):
                        T0[lane] = 0.0
                    for k in range(n_exp):
                        for lane in range(nl):
                            T0[lane] += S[j, k, lane] * INVP[lane]
                    for lane in range(nl):
                        TOT[j, lane] = T0[lane]
                    j += 1
            for lane in range(nl):
                PRED[lane] = PW[lane] * QIN[0, lane]
            for j in range(n_rates):
                jr = rates[j]
                keep = 1.0 - jr
                for lane in range(nl):  # jump_mix_restart's operations, in its order
                    gj = TOT[j, lane] * jr
                    TOT[j, lane] = gj
                    ADD[j, lane] = gj * uniform / denom
                if j < n_rates - 1:
                    for k in range(n_exp):
                        rk = rto[k]
                        for lane in range(nl):
                            a = S[j, k, lane] * INVP[lane]
                            v = keep * a + (ADD[j, lane] + TOT[j, lane] * rk)
                            COL[k, lane] += v
                            ft = F[k, lane]
                            wv = v * (1.0 - ft if y0[lane] != 0 else ft)
                            C[lane] += wv
                            S[j, k, lane] = wv if upd[lane] != 0 else a
                else:  # the last rate completes COL[k]: p' adds COL[k] f_k at once, in k order
                    for k in range(n_exp):
                        rk = rto[k]
                        for lane in range(nl):
                            a = S[j, k, lane] * INVP[lane]
                            v = keep * a + (ADD[j, lane] + TOT[j, lane] * rk)
                            col = COL[k, lane] + v
                            ft = F[k, lane]
                            PRED[lane] += col * ft
                            wv = v * (1.0 - ft if y0[lane] != 0 else ft)
                            C[lane] += wv
                            S[j, k, lane] = wv if upd[lane] != 0 else a
            for lane in range(nl):
                INV[lane] = 1.0 / C[lane]
            # 4. commit: P, log10 S (libm log10, as expert_mixture), outputs, inputs learn
            for lane in range(nl):
                e = lane_event[lane]
                if upd[lane] != 0:
                    PW[lane] = PWB[lane] * INV[lane]
                    M[lane] += math.log10(C[lane] / BASE[lane])
                    INVP[lane] = INV[lane]
                else:
                    INVP[lane] = 1.0
                if fc[lane] != 0:
                    out_p[e] = PRED[lane]
                    out_m[e] = M[lane]
                if upd[lane] != 0 and n_in > 0:
                    s = lane_stream[lane]
                    lab = LAB[lane]
                    mz, mb, mk = np.nan, -1, 0
                    for i in range(n_in):
                        kind = kinds[i]
                        c0 = cols[i]
                        if kind == IN_OPS:
                            if _ons_learn(st, s, c0, False, FIN[i, lane], lab, U0[i, lane],
                                          U1[i, lane], par[i, 0], par[i, 1]):  # fmt: skip
                                _ons_project(st, s, c0, False, par[i, 1], tv2, av2, sh2, rh2,
                                             lo2, zz2, ou2)  # fmt: skip
                        elif kind == IN_OBS:
                            if _ons_learn(st, s, c0, True, FIN[i, lane], lab, U0[i, lane],
                                          U1[i, lane], par[i, 0], par[i, 1]):  # fmt: skip
                                _ons_project(st, s, c0, True, par[i, 1], tv3, av3, sh3, rh3,
                                             lo3, zz3, ou3)  # fmt: skip
                        elif kind == IN_DECAY:
                            z = U0[i, lane] - U1[i, lane]
                            nb = int(par[i, 7])
                            if z != mz or same_bins[i] != mb:  # the bin of z, once per edges
                                mz, mb = z, same_bins[i]
                                mk = _bin_of(edges, i, nb, z)
                            u = _decay_count(st, s, c0, lab, mk, par[i, 0], nb)
                            if _refit_due(u, par[i, 2], par[i, 3]):
                                _decay_refit(st, s, c0, i, u, par, x1, x2, w3, cur_pos, cur_neg)
                        elif kind == IN_DECAY_VA:
                            z = U0[i, lane] - U1[i, lane]
                            nb = int(par[i, 7])
                            if z != mz or same_bins[i] != mb:  # the bin of z, once per edges
                                mz, mb = z, same_bins[i]
                                mk = _bin_of(edges, i, nb, z)
                            u = _decay_va_count(st, s, c0, lab, mk, par[i, 0], nb)
                            if _refit_due(u, par[i, 2], par[i, 3]):
                                _decay_va_refit(st, s, c0, nb, cur_pos, cur_neg, ivap_w,
                                                ivap_i)  # fmt: skip
                lane_op[lane] += 1
        for lane in range(nl):  # retire finished lanes
            if busy[lane] != 0 and lane_op[lane] == lane_end[lane]:
                _lane_out(lane, lane_stream[lane], S, INVP, PW, M, active, passive, log10m)
                start[lane_stream[lane]] = lane_end[lane]
                busy[lane] = 0
                n_busy -= 1
    for lane in range(nl):  # hand the busy streams back to the one-lane engine
        if busy[lane] != 0:
            _lane_out(lane, lane_stream[lane], S, INVP, PW, M, active, passive, log10m)
            start[lane_stream[lane]] = lane_op[lane]


@njit(cache=True, inline="always")
def _lane_out(lane, s, S, INVP, PW, M, active, passive, log10m):
    """Write lane ``lane``'s state (its weights normalised) back to stream ``s``."""
    for j in range(S.shape[0]):
        for k in range(S.shape[1]):
            active[s, j, k] = S[j, k, lane] * INVP[lane]
    passive[s] = PW[lane]
    log10m[s] = M[lane]


@njit(cache=True, error_model="numpy")
def _lanes(
    q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params, rates,
    uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin,
):  # fmt: skip
    """:func:`_engine` with ``config.EXPERT_LANES`` lanes (a literal: fixed trip counts), its
    weights' scratch on the stack (R E <= ``config.EXPERT_LANE_WEIGHTS``, E <=
    ``config.EXPERT_LANE_EXPERTS``, R <= ``config.EXPERT_LANE_RATES``: :func:`stack_fits`)."""
    _engine(q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params,
            rates, uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin, _NL, True)  # fmt: skip


@njit(cache=True, error_model="numpy")
def _lanes_heap(
    q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params, rates,
    uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin,
):  # fmt: skip
    """:func:`_lanes` with its scratch on the heap: mixtures too large for the stack's."""
    _engine(q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params,
            rates, uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin, _NL, False)  # fmt: skip


@njit(cache=True, error_model="numpy")
def _one_lane(
    q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params, rates,
    uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin,
):  # fmt: skip
    """:func:`_engine` with one lane: one stream at a time."""
    _engine(q, y, op_event, op_kind, op_offsets, order, start, kinds, cols, par, edges, params,
            rates, uniform, rto, clip, passive, active, log10m, st, out_p, out_m, fin, 1, False)  # fmt: skip


def stack_fits(n_rates: int, n_exp: int) -> bool:
    """The lanes' scratch of R rates x E experts fits the stack's (:func:`_lanes`)."""
    return n_rates * n_exp <= _CAP_W and n_exp <= _CAP_E and n_rates <= _CAP_R


def lanes_fit(n_streams: int) -> bool:
    """A batch runs in lanes when it has streams to fill them twice over (else one at a time)."""
    return n_streams >= 2 * _NL


def composite_experts_binary(
    q, y, op_event, op_kind, op_offsets, kinds, cols, par, edges, params, rates, clip,
    passive, active, log10m, in_state, *, input_forecasts: bool = True, lanes: bool | None = None,
    packed: bool = False, restart: float = 0.0, restart_to=None,
):  # fmt: skip
    """Binary Composite Jumper over experts with its inputs learnt in the same pass.

    Returns ``(p', log10 S, P, A, log10 S_end, in_state_end, fin)``.

    Parameters
    ----------
    q : (n, G) given columns: column 0 the clipped base p (each input reads it), the others the
        forecasts of ``IN_GIVEN`` inputs.
    y : (n,) labels in {0, 1}, read at update ops.
    op_event, op_kind, op_offsets : the operation list (:mod:`calpipe.kernels.ops`).
    kinds, cols : (I,) each input's kind (``IN_*``) and its given column of ``q``
        (``IN_GIVEN``) or the first column of its state in ``in_state`` (else).
    par : (I, N_PAR) each input's parameters (:func:`ons_row`, :func:`decay_row`).
    edges : (I, B + 1) a decay-beta input's bin edges (``decay_beta.bin_edges``; padded).
    params : (T, 2) Cox (alpha, beta) of the functions; rates (R,); clip: an input's forecast
        joins the mixture clipped to [clip, 1 - clip] (0: as it is).
    passive (S,), active (S, R, (1 + I) T), log10m (S,): the mixture state (expert
        k = i T + t is function t of input i, input 0 the base); in_state (S, W): each
        input's state from its column ``cols[i]`` on (OPS/OBS: theta then A row-major;
        decay-beta: its vector); other columns are carried unchanged into ``in_state_end``.
        Inputs are not modified.
    input_forecasts : return ``fin`` (I, m), every input's raw forecast at every op (what its
        own test martingale reads); else an empty (I, 0) array.
    lanes : force the lanes (True) or one stream at a time (False); None: by the batch size.
    restart, restart_to : a jump goes to the distribution ``restart_to`` (E,) with probability
        ``restart``, else to a uniform expert (:func:`calpipe.kernels.mixture.jump_mix_restart`,
        whose operations the lanes run); 0 / None: paper 001's uniform jumps.
    packed : ``in_state`` (S, L) holds the mixture state too: P in column 0 and A (R x E,
        row-major) in columns 1 to R E (``passive`` and ``active`` are then None). Its one
        copy is the new state: the returned P and A are views into the returned
        ``in_state_end``, which holds the whole new state (a calibrator's state vectors as
        they are stored, read and written without splitting them).
    """
    q = np.ascontiguousarray(q, dtype=np.float64)
    op_offsets = np.ascontiguousarray(op_offsets, dtype=np.int64)
    op_event = np.ascontiguousarray(op_event, dtype=np.int64)
    op_kind = np.ascontiguousarray(op_kind, dtype=np.int8)
    y = np.ascontiguousarray(y, dtype=np.int64)
    kinds = np.ascontiguousarray(kinds, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    par = np.ascontiguousarray(par, dtype=np.float64).reshape(kinds.shape[0], N_PAR)
    edges = np.ascontiguousarray(edges, dtype=np.float64)
    if edges.ndim != 2 or edges.shape[0] != kinds.shape[0]:
        edges = np.zeros((kinds.shape[0], 1))
    params = np.ascontiguousarray(params, dtype=np.float64)
    rates = np.ascontiguousarray(rates, dtype=np.float64)
    n_streams = op_offsets.shape[0] - 1
    n_exp = (1 + kinds.shape[0]) * params.shape[0]
    if packed:
        if passive is not None or active is not None:
            raise ValueError(
                "packed: the mixture state is in in_state; passive and active are None"
            )
        st = np.array(in_state, dtype=np.float64)  # the one copy: the new state
        head = 1 + rates.shape[0] * n_exp
        if st.ndim != 2 or st.shape[0] != n_streams or st.shape[1] < head:
            raise ValueError(
                f"packed in_state must be (S = {n_streams}, >= {head}); got {st.shape}"
            )
        passive = st[:, 0]
        active = st[:, 1:head].reshape(n_streams, rates.shape[0], n_exp)
        if not np.may_share_memory(active, st):  # the kernel must write the new state's A
            raise AssertionError("packed: A is not a view of the state")
    if q.ndim != 2 or y.shape[0] != q.shape[0]:
        raise ValueError(f"q must be (n, G) and y (n,); got {q.shape} and {y.shape}")
    if (
        np.shape(active) != (n_streams, rates.shape[0], n_exp)
        or np.shape(passive) != (n_streams,)
        or np.shape(log10m) != (n_streams,)
    ):
        raise ValueError(
            f"state shapes {np.shape(passive)}, {np.shape(active)}, {np.shape(log10m)} do not "
            f"fit S = {n_streams} streams, R = {rates.shape[0]} rates, E = {n_exp} experts"
        )
    if op_event.shape != op_kind.shape:
        raise ValueError("op_event and op_kind must have the same length")
    given = kinds == IN_GIVEN
    if np.any(given & ((cols < 1) | (cols >= q.shape[1]))) or np.any(
        ~given & ((cols < 0) | (cols >= max(np.shape(in_state)[-1], 1)))
    ):  # fmt: skip
        raise ValueError("an input's column is outside q or in_state")
    if packed and np.any(~given & (cols < 1 + rates.shape[0] * n_exp)):
        raise ValueError("packed: an input's column is inside the mixture state (P, A)")
    if not packed:
        passive = np.array(passive, dtype=np.float64)
        active = np.array(active, dtype=np.float64)
        st = np.array(in_state, dtype=np.float64).reshape(n_streams, -1)
    log10m = np.array(log10m, dtype=np.float64)
    for i in np.flatnonzero((kinds == IN_OPS) | (kinds == IN_OBS)):
        # _ons_binary reads A's upper triangle and writes A back symmetric for every stream
        d = 2 if kinds[i] == IN_OPS else 3
        for r, c in zip(*np.tril_indices(d, -1), strict=True):
            st[:, cols[i] + d + r * d + c] = st[:, cols[i] + d + c * d + r]
    out_p = np.full(q.shape[0], np.nan)
    out_m = np.full(q.shape[0], np.nan)
    fin = np.full((kinds.shape[0], op_event.shape[0] if input_forecasts else 0), np.nan)
    start = op_offsets[:-1].copy()  # next operation of each stream
    args = (q, y, op_event, op_kind, op_offsets)
    uniform, rto = restart_terms(restart, restart_to, n_exp)
    rest = (kinds, cols, par, edges, params, rates, uniform, rto, float(clip), passive, active,
            log10m, st, out_p, out_m, fin)  # fmt: skip
    if lanes_fit(n_streams) if lanes is None else lanes:
        # Longest streams first, so lanes drain together and the one-stream tail is short.
        order = np.argsort(op_offsets[:-1] - op_offsets[1:], kind="stable")
        (_lanes if stack_fits(rates.shape[0], n_exp) else _lanes_heap)(*args, order, start, *rest)
    _one_lane(*args, np.arange(n_streams, dtype=np.int64), start, *rest)
    return out_p, out_m, passive, active, log10m, st, fin
