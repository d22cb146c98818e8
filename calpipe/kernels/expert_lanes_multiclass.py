"""The default method's K-class recursion with its online scaling inputs, all streams of a
batch in SIMD lanes: paper 001's Composite Jumper (Algorithm 1) over the experts (input i,
K-class Cox function theta, paper 001 eq. (1)), the inputs -- online vector scaling, the K-class
``ops``, and online matrix scaling, ``oms`` (Gupta & Ramdas 2023, Alg. 1 with the vector and
matrix models of Guo et al. 2017), in any sequence -- learnt in the same pass. The binary
counterpart is :mod:`calpipe.kernels.expert_lanes`.

Public entry point: :func:`composite_experts_multiclass`; the calibrator is
:class:`calpipe.calibrators.experts.CompositeExperts` (which dispatches here for K >= 3 classes
when every input is ``ops``, or ``oms`` with K <= ``config.OMS_MAX_CLASSES``).

Recursion
---------
At each operation of a stream (:mod:`calpipe.kernels.ops`) on event e with base forecast p_e
(a row on the simplex, already floored at ``clip`` and renormalised):

1. every input i forecasts q_{e,i} from its state *now*: with c_k = max(p_k, eps) / sum_k'
   max(p_k', eps) (eps its score clip), q_{e,i} = softmax_k(a_k ln c_k + b_k) (vector,
   ``online_scaling._vector_forecast``, theta = (a, b), d = 2K) or softmax_k(sum_j W_kj ln c_j
   + b_k) (matrix, ``_matrix_forecast``, theta = (W row-major, b), d = K^2 + K, the sum over j
   in order from 0.0), then floored at ``clip`` and renormalised for the mixture
   (``clip_probabilities``, numpy's sum order: :func:`np_row_sum`); q_{e,0} = p_e;
2. the mixture, exactly ``expert_mixture._multiclass`` (paper 001 Alg. 1, lines 4-15, expert
   k = i T + t with f_k(e) = f_t(q_{e,i}) the K-class Cox function of paper 001 eq. (1)):

       A[J, k] <- (1 - J) A[J, k] + J ((1 - w) / E + w r_k) sum_k' A[J, k']    (jump-mixing)
       p'_c    <- P p_c + sum_k (sum_J A[J, k]) f_k(e)_c                       (forecast)
       P <- P p_y,  A[J, k] <- A[J, k] f_k(e)_y,  C = P + sum A                (Bayes)
       P, A <- P / C, A / C;  log10 S <- log10 S + log10 C - log10 p_y

3. at an update, every input learns y_e by the Online Newton Step of
   :mod:`calpipe.kernels.online_scaling` (Hazan 2016, Alg. 12): g = (q - e_y) (x) (ln c, 1)
   (vector: g = ((q_k - [k = y]) ln c_k, q_k - [k = y]); matrix: dl/dW_kj = (q_k - [k = y])
   ln c_j, dl/db_k = q_k - [k = y]), A <- A + g g^T, theta <- Pi^A_{|theta| <= B}(theta -
   A^{-1} g / gamma).

An update-only op (a delayed label) is handled in place: step 1 is each input's forecast at the
label's time, which the per-input path obtained from a forecast op on a copy of the event.

Engines, and why every stream's outputs are bit-identical to running it alone
-----------------------------------------------------------------------------
As in :mod:`calpipe.kernels.expert_lanes`: one body (:func:`_engine`) compiled with
``config.EXPERT_LANES`` lanes (lane l of every scratch array holds one stream, each step
advances every lane by one operation, the loops over lanes vectorise and the lanes' chains of
sums hide each other's latency) and with one lane, which finishes the streams the lanes hand
back (the scheduler of :mod:`calpipe.kernels.numeric`). Per stream, both run the floating-point
operations of ``online_scaling._online_scaling`` (vector or matrix model, each input its own),
of ``clip_probabilities`` and of ``expert_mixture._multiclass`` in their order:

* every sum keeps its order: sum_k' A in k order (:func:`calpipe.kernels.expert_lanes.sum_rates3`),
  the column sums in J order, each class's p'_c in k order, C in (J, k) order; the Cox terms'
  normaliser sum_c in class order (``calfun.eval_multiclass_t``), p_c^beta once per distinct
  beta; the inputs' sums in class order; the mixture's renormalisation of an input's row in
  numpy's pairwise order;
* the inputs' transcendental calls are libm's (``math.log``, ``math.exp``) and the mixture's
  ``math.log10``, as in the per-input kernels (numpy's SIMD log10 of the inputs' own test
  martingales stays in numpy: ``calibrators.gale.likelihood_gale_ends``);
* the ONS step (A <- A + g g^T, then ``numeric.cholesky_solve``'s factorisation and two
  substitutions, theta <- theta - step / gamma) runs for every lane at once with the lanes
  innermost: each lane's operations are the scalar kernel's in its order (sqrt and division
  are correctly rounded in vector registers as in scalar ones, and nothing is fused into an
  FMA), over input i's own d_i (the scratch is sized for the largest; the order of operations
  depends only on d_i, so the matrix model's d = K^2 + K keeps the scalar kernel's bits as the
  vector model's 2K does); the rare projection on the ball is ``project_kernel`` itself on a
  copy of the lane's (theta, A) of size d_i; a non-positive pivot (A not positive-definite to
  rounding, which the state checks refuse) sends the lane to the scalar ``cholesky_solve``,
  whose step is then its scratch's, as the per-input kernel's is;
* the normalisation A <- A / C is deferred as in the binary lanes: S holds V = A f_y and INVP
  = 1 / C, and A is read as v * (1 / C), the same product.

Speed (issue #33; BENCHMARKS.md §25): the per-input path ran the inputs' kernel over the
operation list with forecast copies, renormalised its forecasts in numpy and ran the mixture one
stream at a time, whose chains of sums (C over R E weights, p'_c over E experts per class) are
latency-bound. Here those chains run in lanes, and:

* each lane keeps its inputs' theta and A resident (``IS``, like its weights ``S``): read
  when it takes a stream, written back when it gives it up;
* the ONS step's lane loops and the Cox terms' divisions run over an opaque lane count
  (:func:`calpipe.kernels.numeric.opaque`) so that LLVM vectorises them instead of unrolling
  them into scalars; the label's Cox terms are selected class by class (a select vectorises,
  the gather ``F[y_l, k, l]`` did not);
* no heap array is passed to a helper in the per-lane code (each such reference is an atomic
  reference count): the per-lane scratch is on the stack.

With online matrix scaling (``oms``, §25 addendum) the gain is the mixture's and the per-input
path's numpy work: the O(d^3 / 3) Cholesky of its d = K^2 + K costs about as much in lanes as
alone (K = 3, ad hoc: (ops, oms) over (ops, ops) +0.13 CPU us/op in lanes, +0.16 per-input), and
its scratch (d = 12 at K = 3) on the stack measured no faster than on the heap, where it stays.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from calpipe import config
from calpipe.kernels.calfun import distinct_betas
from calpipe.kernels.expert_lanes import lane_mixture, sum_rates3
from calpipe.kernels.mixture import restart_terms
from calpipe.kernels.numeric import (
    LANES,
    cholesky_solve,
    idle_lanes,
    opaque,
    stack_empty,
    steps_to_first_end,
    take_stream,
)
from calpipe.kernels.online_scaling import project_kernel
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

#: Columns of an input's row of ``par``: ONS step 1/gamma, radius B, score clip eps, model
#: (0 online vector scaling ``ops``, 1 online matrix scaling ``oms``).
N_PAR = 4
_NL = config.EXPERT_LANES
_CAP_W = config.EXPERT_LANE_WEIGHTS
_CAP_E = config.EXPERT_LANE_EXPERTS
_CAP_R = config.EXPERT_LANE_RATES
_CAP_KE = config.EXPERT_LANE_CLASS_TERMS
_CAP_K = config.EXPERT_LANE_CLASSES
_STACK_W = _NL * _CAP_W  # literals: the sizes of the lanes' scratch on the stack
_STACK_E = _NL * _CAP_E
_STACK_R = _NL * _CAP_R
_STACK_KE = _NL * _CAP_KE
_STACK_K = _NL * _CAP_K
_ONS_D = config.EXPERT_LANE_ONS_DIM
_ONS_BUF = _NL * (4 * _ONS_D + 2 * _ONS_D * _ONS_D)
_IN_CAP = config.EXPERT_LANE_INPUT_STATE
_STACK_IN = _NL * _IN_CAP
_LEARN_D = 2 * _CAP_K  # the ONS step's scratch on the stack up to this d = 2K
_LEARN_BUF = 6 * _LEARN_D + 3 * _LEARN_D * _LEARN_D
#: numpy's pairwise summation sums a contiguous run of at most this many values in one block
#: (``PW_BLOCKSIZE``): :func:`np_row_sum` reproduces that block, so K <= this.
NP_BLOCK = 128
_ROWS = 3 * NP_BLOCK  # a literal: three rows of K <= NP_BLOCK on the stack


@njit(cache=True, inline="always", error_model="numpy")
def np_row_sum(w, k):
    """``w[:k].sum()`` in numpy's order for a contiguous row of k <= ``NP_BLOCK`` doubles (its
    pairwise summation's block: k < 8 in order; else eight running sums over strides of 8,
    combined ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the tail in order). The
    renormalisation of ``clip_probabilities`` divides by this sum."""
    if k < 8:
        s = 0.0
        for c in range(k):
            s += w[c]
        return s
    r0, r1, r2, r3 = w[0], w[1], w[2], w[3]
    r4, r5, r6, r7 = w[4], w[5], w[6], w[7]
    i = 8
    top = k - k % 8
    while i < top:
        r0 += w[i]
        r1 += w[i + 1]
        r2 += w[i + 2]
        r3 += w[i + 3]
        r4 += w[i + 4]
        r5 += w[i + 5]
        r6 += w[i + 6]
        r7 += w[i + 7]
        i += 8
    s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < k:
        s += w[i]
        i += 1
    return s


@njit(cache=True)
def _input_dims(par, k):
    """Each input's parameter count d_i (``par[i, 3]`` = 1: matrix scaling, K^2 + K; else
    vector scaling, 2K) and the offsets of the inputs' (theta, A) stacked, d_i + d_i^2 values
    each: ``(dims (I,), ioff (I + 1,))``."""
    n_in = par.shape[0]
    dims = np.empty(n_in, np.int64)
    ioff = np.empty(n_in + 1, np.int64)
    ioff[0] = 0
    for i in range(n_in):
        di = k * k + k if par[i, 3] != 0.0 else 2 * k
        dims[i] = di
        ioff[i + 1] = ioff[i] + di + di * di
    return dims, ioff


@njit(cache=True, inline="always")
def _scalar_views(buf, d):
    """The scalar ONS step's scratch of exact size d over ``buf`` (6 d + 3 d^2 values, from its
    start): theta, g, step, z, rhs, out (d,) and A, L, A + lambda I (d, d). Inlined: ``buf`` may
    be on the stack."""
    aa = buf[6 * d : 6 * d + d * d].reshape(d, d)
    lower = buf[6 * d + d * d : 6 * d + 2 * d * d].reshape(d, d)
    shifted = buf[6 * d + 2 * d * d : 6 * d + 3 * d * d].reshape(d, d)
    return (buf[:d], buf[d : 2 * d], buf[2 * d : 3 * d], buf[3 * d : 4 * d],
            buf[4 * d : 5 * d], buf[5 * d : 6 * d], aa, lower, shifted)  # fmt: skip


@njit(cache=True, inline="always", error_model="numpy")
def _engine(
    q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas, rates, uniform,
    rto, clip, st, log10m, out_p, out_m, fin, nl, on_stack,
):  # fmt: skip
    """Streams ``order[0], order[1], ...`` (from op ``start[s]``) through ``nl`` lanes, one
    operation per lane per step (see the module docstring and ``expert_lanes._engine``, whose
    scheduling this repeats). ``st`` (S, L) is the packed state (P in column 0, A (R x E)
    row-major from column 1, input i's theta (d_i) and A (d_i x d_i) from column ``cols[i]``, d_i
    by its model ``par[i, 3]``), updated in place with ``log10m``."""
    n_streams = order.shape[0]
    k_cls = q.shape[1]
    n_in = cols.shape[0]
    n_fun = betas.shape[0]
    n_rates = rates.shape[0]
    n_exp = (1 + n_in) * n_fun
    # input i's parameter count d_i (2K vector, K^2 + K matrix) and the rows of its (theta, A)
    # in IS, ioff[i] to ioff[i + 1]; d the largest, which sizes the ONS step's scratch
    dims, ioff = _input_dims(par, k_cls)
    d = 2 * k_cls
    for i in range(n_in):
        d = max(d, dims[i])
    d_vec = 2 * k_cls
    d_mat = k_cls * k_cls + k_cls
    distinct, beta_of = distinct_betas(betas)
    n_dist = distinct.shape[0]
    exp_alpha_t = np.ascontiguousarray(np.exp(alphas).T)  # (K, T), as _multiclass
    # Per-lane scratch (one lane at a time) on the stack, where its references cost no atomic
    # reference counts (a heap array passed to a helper in the hot loop does): the ONS step's
    # theta, A, gradient, step and project_kernel's scratch (heap beyond _LEARN_D); a row
    # floored at clip (before numpy's sum) and the softmax's exponents. cholesky_solve and
    # project_kernel read d from their arguments' shapes: one set of exact-size views per model
    # (vector d = 2K, matrix d = K^2 + K), both over the same buffer (used one at a time).
    if d <= _LEARN_D:
        buf = carray(stack_empty(_LEARN_BUF), _LEARN_BUF)
    else:
        buf = np.empty(6 * d + 3 * d * d)
    th_v, g_v, step_v, zz_v, rhs_v, out_v, aa_v, lower_v, shifted_v = _scalar_views(buf, d_vec)
    th_m, g_m, step_m, zz_m, rhs_m, out_m_, aa_m, lower_m, shifted_m = _scalar_views(
        buf, d_mat if d >= d_mat else d_vec
    )
    rows = carray(stack_empty(_ROWS), _ROWS)
    # the ONS step of every lane at once (lanes last): theta, g, Cholesky's z and the step
    # (d, lanes), A and its factor L (d, d, lanes) with d the largest input's (a smaller input
    # uses the leading rows); on the stack up to d = _ONS_D
    if d <= _ONS_D and on_stack:
        ons = carray(stack_empty(_ONS_BUF), _ONS_BUF)
    else:
        ons = np.empty((4 * d + 2 * d * d) * nl)
    TH = ons[: d * nl].reshape(d, nl)
    G = ons[d * nl : 2 * d * nl].reshape(d, nl)
    ZV = ons[2 * d * nl : 3 * d * nl].reshape(d, nl)
    STEP = ons[3 * d * nl : 4 * d * nl].reshape(d, nl)
    AA = ons[4 * d * nl : (4 * d + d * d) * nl].reshape(d, d, nl)
    LOW = ons[(4 * d + d * d) * nl : (4 * d + 2 * d * d) * nl].reshape(d, d, nl)
    SV = carray(stack_empty(64), LANES)[:nl]
    OK = carray(stack_empty(64), LANES).view(np.int64)[:nl]
    # each lane's inputs' (theta, A), resident like its weights S: read from the state when
    # the lane takes a stream, written back when it gives it up (IS[ioff[i] + a, lane]: input
    # i's theta_a for a < d_i, then its A row-major); on the stack when they fit
    n_is = ioff[n_in]
    if on_stack and n_is <= _IN_CAP:
        IS = carray(stack_empty(_STACK_IN), (n_is, nl))
    else:
        IS = np.empty((max(n_is, 1), nl))
    for i in range(n_in):
        o_i = ioff[i]
        d_i = dims[i]
        for a_ in range(d_i + d_i * d_i):
            for lane in range(nl):
                IS[o_i + a_, lane] = 0.0
        for a_ in range(d_i):
            for lane in range(nl):
                IS[o_i + d_i + a_ * d_i + a_, lane] = 1.0  # idle lanes compute on a valid state
    wrow = rows[:k_cls]
    zrow = rows[NP_BLOCK : NP_BLOCK + k_cls]
    lrow = rows[2 * NP_BLOCK : 2 * NP_BLOCK + k_cls]  # ln c of the matrix model's row
    # Scratch, lane index last: S (R, E, lanes) holds V = A f_y (normalisation deferred in
    # INVP), F (K, E, lanes) the Cox terms of every class, FL (E, lanes) those of the label's
    # class, COL (E, lanes) the column sums, PRED (K, lanes) p'. On the stack when they fit
    # (``on_stack``: LLVM then vectorises their loops without run-time overlap checks).
    if on_stack:
        S = carray(stack_empty(_STACK_W), (n_rates, n_exp, nl))
        F = carray(stack_empty(_STACK_KE), (k_cls, n_exp, nl))
        FL = carray(stack_empty(_STACK_E), (n_exp, nl))
        COL = carray(stack_empty(_STACK_E), (n_exp, nl))
        TOT = carray(stack_empty(_STACK_R), (n_rates, nl))
        ADD = carray(stack_empty(_STACK_R), (n_rates, nl))  # jump_mix_restart's uniform share
        PRED = carray(stack_empty(_STACK_K), (k_cls, nl))
    else:
        S = np.empty((n_rates, n_exp, nl))
        F = np.empty((k_cls, n_exp, nl))
        FL = np.empty((n_exp, nl))
        COL = np.empty((n_exp, nl))
        TOT = np.empty((n_rates, nl))
        ADD = np.empty((n_rates, nl))
        PRED = np.empty((k_cls, nl))
    QIN = np.empty((1 + n_in, k_cls, nl))  # the mixture's input rows, row 0 the base
    FIN = np.empty((max(n_in, 1), k_cls, nl))  # raw input forecasts
    U = np.empty((max(n_in, 1), k_cls, nl))  # ln c of each input's floored score row
    POW = np.empty((k_cls, max(n_dist, 1), nl))  # p_c^beta per distinct beta
    SSUM = np.empty((n_fun, nl))  # the Cox terms' normalisers
    # P, log10 S, INVP = 1 / C of S's pending normalisation (or 1), p_y, P p_y, the Bayes
    # numerator C = p'(y), three rates' sums in flight (sum_rates3) and 1 / C; every lane idle
    # on a valid state (expert_lanes.lane_mixture, as the binary engine)
    PW, M, INVP, BASE, PWB, C, T0, T1, T2, INV = lane_mixture(S, nl)
    LAB = carray(stack_empty(64), LANES).view(np.int64)[:nl]  # the label (0 if none)
    busy, lane_stream, lane_op, lane_end, lane_event, upd, fc = idle_lanes(nl)
    denom = float(n_exp)
    nl_vec = opaque(nl)  # nl, as a run-time trip count (numeric.opaque)
    pos_k = 0
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
                for kk in range(n_exp):
                    S[j, kk, lane] = st[s, 1 + j * n_exp + kk]
            PW[lane] = st[s, 0]
            M[lane] = log10m[s]
            INVP[lane] = 1.0
            for i in range(n_in):
                for a_ in range(ioff[i + 1] - ioff[i]):
                    IS[ioff[i] + a_, lane] = st[s, cols[i] + a_]
        if n_busy == 0 or (pos_k == n_streams and 2 * n_busy < nl):
            break
        steps = steps_to_first_end(busy, lane_op, lane_end, nl)
        for _ in range(steps):
            # 0. each lane's operation, event and label, gathered in one short loop
            for lane in range(nl):
                o = lane_op[lane]
                e = op_event[o]
                kind = op_kind[o]
                b = busy[lane]
                lane_event[lane] = e
                u_ = b & (kind != OP_FORECAST)
                upd[lane] = u_
                fc[lane] = b & (kind != OP_UPDATE)
                LAB[lane] = y[e] if u_ != 0 else 0
            # 1. the base row and the inputs' forecasts (scalar: libm calls)
            for lane in range(nl):
                e = lane_event[lane]
                for c in range(k_cls):
                    QIN[0, c, lane] = q[e, c]
                bb = q[e, LAB[lane]]
                BASE[lane] = bb
                PWB[lane] = PW[lane] * bb
                C[lane] = PWB[lane]
                if busy[lane] == 0:
                    for i in range(n_in):
                        for c in range(k_cls):
                            QIN[1 + i, c, lane] = q[e, c]
                    continue
                o = lane_op[lane]
                for i in range(n_in):  # online_scaling._vector_forecast / _matrix_forecast
                    sc = par[i, 2]
                    o_i = ioff[i]
                    tot = 0.0
                    for c in range(k_cls):
                        tot += max(q[e, c], sc)
                    zmax = -np.inf
                    if par[i, 3] != 0.0:  # matrix: z_c = sum_j W_cj ln c_j + b_c, j in order
                        for c in range(k_cls):
                            lq = math.log(max(q[e, c], sc) / tot)
                            U[i, c, lane] = lq
                            lrow[c] = lq
                        for c in range(k_cls):
                            z = 0.0
                            for j2 in range(k_cls):
                                z += IS[o_i + c * k_cls + j2, lane] * lrow[j2]
                            z += IS[o_i + k_cls * k_cls + c, lane]
                            zrow[c] = z
                            zmax = max(zmax, z)
                    else:  # vector: z_c = a_c ln c_c + b_c
                        for c in range(k_cls):
                            lq = math.log(max(q[e, c], sc) / tot)
                            U[i, c, lane] = lq
                            z = IS[o_i + c, lane] * lq + IS[o_i + k_cls + c, lane]
                            zrow[c] = z
                            zmax = max(zmax, z)
                    ssum = 0.0
                    for c in range(k_cls):
                        ez = math.exp(zrow[c] - zmax)
                        zrow[c] = ez
                        ssum += ez
                    for c in range(k_cls):  # the forecast, then clip_probabilities for the mixture
                        f = zrow[c] / ssum
                        FIN[i, c, lane] = f
                        if fin.shape[1] > 0:
                            fin[i, o, c] = f
                        wrow[c] = f if (f >= clip or f != f) else clip  # np.maximum(f, clip)
                    wsum = np_row_sum(wrow, k_cls)
                    for c in range(k_cls):
                        QIN[1 + i, c, lane] = wrow[c] / wsum
            # 2. the Cox terms of every input (calfun.eval_multiclass_t), lanes innermost
            for i in range(1 + n_in):
                for bi in range(n_dist):
                    beta = distinct[bi]
                    for c in range(k_cls):
                        if beta == 1.0:
                            for lane in range(nl_vec):
                                POW[c, bi, lane] = QIN[i, c, lane]
                        elif beta == 0.5:
                            for lane in range(nl_vec):
                                POW[c, bi, lane] = math.sqrt(QIN[i, c, lane])
                        elif beta == 2.0:
                            for lane in range(nl_vec):
                                POW[c, bi, lane] = QIN[i, c, lane] * QIN[i, c, lane]
                        else:
                            for lane in range(nl_vec):
                                POW[c, bi, lane] = QIN[i, c, lane] ** beta
                for t in range(n_fun):
                    for lane in range(nl_vec):
                        SSUM[t, lane] = 0.0
                for c in range(k_cls):
                    for t in range(n_fun):
                        bt = beta_of[t]
                        ea = exp_alpha_t[c, t]
                        for lane in range(nl_vec):
                            v = POW[c, bt, lane] * ea
                            F[c, i * n_fun + t, lane] = v
                            SSUM[t, lane] += v
                for c in range(k_cls):
                    for t in range(n_fun):
                        for lane in range(nl_vec):
                            F[c, i * n_fun + t, lane] = F[c, i * n_fun + t, lane] / SSUM[t, lane]
            # the label's class's terms, for Bayes (a select per class: it vectorises, where
            # the gather F[LAB[lane], k, lane] did not)
            for c in range(k_cls):
                for kk in range(n_exp):
                    for lane in range(nl_vec):
                        if LAB[lane] == c:
                            FL[kk, lane] = F[c, kk, lane]
            # 3. jump mixing, forecast and Bayes numerator (paper 001 Alg. 1 lines 5-13)
            for kk in range(n_exp):
                for lane in range(nl):
                    COL[kk, lane] = 0.0
            j = 0
            while j < n_rates:
                if j + 3 <= n_rates:
                    sum_rates3(S, INVP, TOT, j, n_exp, nl, T0, T1, T2)
                    j += 3
                else:
                    for lane in range(nl):
                        T0[lane] = 0.0
                    for kk in range(n_exp):
                        for lane in range(nl):
                            T0[lane] += S[j, kk, lane] * INVP[lane]
                    for lane in range(nl):
                        TOT[j, lane] = T0[lane]
                    j += 1
            for c in range(k_cls):
                for lane in range(nl):
                    PRED[c, lane] = PW[lane] * QIN[0, c, lane]
            for j in range(n_rates):
                jr = rates[j]
                keep = 1.0 - jr
                for lane in range(nl):  # jump_mix_restart's operations, in its order
                    gj = TOT[j, lane] * jr
                    TOT[j, lane] = gj
                    ADD[j, lane] = gj * uniform / denom
                last = j == n_rates - 1
                for kk in range(n_exp):
                    rk = rto[kk]
                    for lane in range(nl):
                        a = S[j, kk, lane] * INVP[lane]
                        v = keep * a + (ADD[j, lane] + TOT[j, lane] * rk)
                        col = COL[kk, lane] + v
                        COL[kk, lane] = col
                        wv = v * FL[kk, lane]
                        C[lane] += wv
                        S[j, kk, lane] = wv if upd[lane] != 0 else a
                    if last:  # COL[k] complete: p'_c adds COL[k] f_k(e)_c, in k order
                        for c in range(k_cls):
                            for lane in range(nl):
                                PRED[c, lane] += COL[kk, lane] * F[c, kk, lane]
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
                    for c in range(k_cls):
                        out_p[e, c] = PRED[c, lane]
                    out_m[e] = M[lane]
                lane_op[lane] += 1
            # 5. the inputs learn the label: _online_scaling's ONS step (its vector or matrix
            #    gradient), every lane at once (lanes innermost: each lane's chain of operations
            #    is the scalar kernel's, the lanes' chains overlap); written back for the lanes
            #    that update. Input i's d_i rows of the (d, d) scratch are used.
            n_upd = 0
            for lane in range(nl):
                n_upd += upd[lane]
            for i in range(n_in if n_upd > 0 else 0):
                o_i = ioff[i]
                di = dims[i]
                mat = par[i, 3] != 0.0
                if mat:  # g = (f - e_y) (x) (ln c, 1): W's row c is r_c ln c, then b's r_c
                    for c in range(k_cls):
                        for lane in range(nl_vec):
                            SV[lane] = FIN[i, c, lane] - (1.0 if c == LAB[lane] else 0.0)
                        for j2 in range(k_cls):
                            for lane in range(nl_vec):
                                G[c * k_cls + j2, lane] = SV[lane] * U[i, j2, lane]
                        for lane in range(nl_vec):
                            G[k_cls * k_cls + c, lane] = SV[lane]
                else:  # g = ((f - e_y) ln c, f - e_y)
                    for c in range(k_cls):
                        for lane in range(nl_vec):
                            r = FIN[i, c, lane] - (1.0 if c == LAB[lane] else 0.0)
                            G[c, lane] = r * U[i, c, lane]
                            G[k_cls + c, lane] = r
                for a_ in range(di):
                    for b_ in range(di):
                        for lane in range(nl_vec):
                            AA[a_, b_, lane] = (
                                IS[o_i + di + a_ * di + b_, lane] + G[a_, lane] * G[b_, lane]
                            )
                # numeric.cholesky_solve(A, g) -> STEP, its operations lane by lane
                for lane in range(nl_vec):
                    OK[lane] = 1
                for jj in range(di):
                    for lane in range(nl_vec):
                        SV[lane] = AA[jj, jj, lane]
                    for kk in range(jj):
                        for lane in range(nl_vec):
                            SV[lane] -= LOW[jj, kk, lane] * LOW[jj, kk, lane]
                    for lane in range(nl_vec):
                        if not SV[lane] > 0.0:
                            OK[lane] = 0
                        LOW[jj, jj, lane] = math.sqrt(SV[lane]) if SV[lane] > 0.0 else 1.0
                    for i2 in range(jj + 1, di):
                        for lane in range(nl_vec):
                            SV[lane] = AA[i2, jj, lane]
                        for kk in range(jj):
                            for lane in range(nl_vec):
                                SV[lane] -= LOW[i2, kk, lane] * LOW[jj, kk, lane]
                        for lane in range(nl_vec):
                            LOW[i2, jj, lane] = SV[lane] / LOW[jj, jj, lane]
                for i2 in range(di):  # L z = g
                    for lane in range(nl_vec):
                        SV[lane] = G[i2, lane]
                    for kk in range(i2):
                        for lane in range(nl_vec):
                            SV[lane] -= LOW[i2, kk, lane] * ZV[kk, lane]
                    for lane in range(nl_vec):
                        ZV[i2, lane] = SV[lane] / LOW[i2, i2, lane]
                for i2 in range(di - 1, -1, -1):  # L^T step = z
                    for lane in range(nl_vec):
                        SV[lane] = ZV[i2, lane]
                    for kk in range(i2 + 1, di):
                        for lane in range(nl_vec):
                            SV[lane] -= LOW[kk, i2, lane] * STEP[kk, lane]
                    for lane in range(nl_vec):
                        STEP[i2, lane] = SV[lane] / LOW[i2, i2, lane]
                gamma = par[i, 0]
                radius = par[i, 1]
                for lane in range(nl):
                    if upd[lane] == 0:
                        continue
                    if OK[lane] == 0:  # a pivot <= 0 (A not positive-definite to rounding)
                        aa = aa_m if mat else aa_v  # the scalar kernel on d_i x d_i views
                        g = g_m if mat else g_v
                        step = step_m if mat else step_v
                        for a_ in range(di):  # the scalar kernel, step as its scratch holds it
                            for b_ in range(di):
                                aa[a_, b_] = AA[a_, b_, lane]
                            g[a_] = G[a_, lane]
                        cholesky_solve(aa, g, lower_m if mat else lower_v,
                                       zz_m if mat else zz_v, step)  # fmt: skip
                        for a_ in range(di):
                            STEP[a_, lane] = step[a_]
                    norm2 = 0.0  # theta <- theta - step / gamma; project_kernel's own test
                    for a_ in range(di):
                        t_ = IS[o_i + a_, lane] - STEP[a_, lane] / gamma
                        TH[a_, lane] = t_
                        norm2 += t_ * t_
                    if norm2 > radius * radius:  # the projection on the ball (rare)
                        th = th_m if mat else th_v
                        aa = aa_m if mat else aa_v
                        for a_ in range(di):
                            th[a_] = TH[a_, lane]
                            for b_ in range(di):
                                aa[a_, b_] = AA[a_, b_, lane]
                        if mat:
                            project_kernel(th, aa, radius, shifted_m, rhs_m, lower_m, zz_m, out_m_)
                        else:
                            project_kernel(th, aa, radius, shifted_v, rhs_v, lower_v, zz_v, out_v)
                        for a_ in range(di):
                            TH[a_, lane] = th[a_]
                # the lanes that update keep the new (theta, A)
                for a_ in range(di):
                    for lane in range(nl_vec):
                        if upd[lane] != 0:
                            IS[o_i + a_, lane] = TH[a_, lane]
                for a_ in range(di):
                    for b_ in range(di):
                        for lane in range(nl_vec):
                            if upd[lane] != 0:
                                IS[o_i + di + a_ * di + b_, lane] = AA[a_, b_, lane]
        for lane in range(nl):  # retire finished lanes
            if busy[lane] != 0 and lane_op[lane] == lane_end[lane]:
                _lane_out(lane, lane_stream[lane], S, INVP, PW, M, IS, cols, ioff, st, log10m)
                start[lane_stream[lane]] = lane_end[lane]
                busy[lane] = 0
                n_busy -= 1
    for lane in range(nl):  # hand the busy streams back to the one-lane engine
        if busy[lane] != 0:
            _lane_out(lane, lane_stream[lane], S, INVP, PW, M, IS, cols, ioff, st, log10m)
            start[lane_stream[lane]] = lane_op[lane]


@njit(cache=True, inline="always")
def _lane_out(lane, s, S, INVP, PW, M, IS, cols, ioff, st, log10m):
    """Write lane ``lane``'s state (its weights normalised, its inputs' theta and A) back to
    stream ``s``."""
    for i in range(cols.shape[0]):
        for a in range(ioff[i + 1] - ioff[i]):
            st[s, cols[i] + a] = IS[ioff[i] + a, lane]
    n_exp = S.shape[1]
    for j in range(S.shape[0]):
        for k in range(n_exp):
            st[s, 1 + j * n_exp + k] = S[j, k, lane] * INVP[lane]
    st[s, 0] = PW[lane]
    log10m[s] = M[lane]


@njit(cache=True, error_model="numpy")
def _lanes(q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas, rates,
           uniform, rto, clip, st, log10m, out_p, out_m, fin):  # fmt: skip
    """:func:`_engine` with ``config.EXPERT_LANES`` lanes, its scratch on the stack
    (:func:`stack_fits`)."""
    _engine(q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas, rates,
            uniform, rto, clip, st, log10m, out_p, out_m, fin, _NL, True)  # fmt: skip


@njit(cache=True, error_model="numpy")
def _lanes_heap(q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas,
                rates, uniform, rto, clip, st, log10m, out_p, out_m, fin):  # fmt: skip
    """:func:`_lanes` with its scratch on the heap: mixtures too large for the stack's."""
    _engine(q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas, rates,
            uniform, rto, clip, st, log10m, out_p, out_m, fin, _NL, False)  # fmt: skip


@njit(cache=True, error_model="numpy")
def _one_lane(q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas,
              rates, uniform, rto, clip, st, log10m, out_p, out_m, fin):  # fmt: skip
    """:func:`_engine` with one lane: one stream at a time."""
    _engine(q, y, op_event, op_kind, op_offsets, order, start, cols, par, betas, alphas, rates,
            uniform, rto, clip, st, log10m, out_p, out_m, fin, 1, False)  # fmt: skip


def stack_fits(n_rates: int, n_exp: int, n_classes: int) -> bool:
    """The lanes' scratch of R rates x E experts x K classes fits the stack's (:func:`_lanes`)."""
    return (
        n_rates * n_exp <= _CAP_W and n_exp <= _CAP_E and n_rates <= _CAP_R
        and n_classes * n_exp <= _CAP_KE and n_classes <= _CAP_K
    )  # fmt: skip


def lanes_fit(n_streams: int) -> bool:
    """A batch runs in lanes when it has streams to fill them twice over (else one at a time)."""
    return n_streams >= 2 * _NL


def ops_row(gamma: float, radius: float, score_clip: float) -> np.ndarray:
    """``par`` row of an online vector scaling input: ONS step 1/gamma, radius B, score clip."""
    return np.array([gamma, radius, score_clip, 0.0], dtype=np.float64)


def oms_row(gamma: float, radius: float, score_clip: float) -> np.ndarray:
    """``par`` row of an online matrix scaling input: ONS step 1/gamma, radius B, score clip."""
    return np.array([gamma, radius, score_clip, 1.0], dtype=np.float64)


def composite_experts_multiclass(
    q, y, op_event, op_kind, op_offsets, cols, par, betas, alphas, rates, clip, state, log10m,
    *, input_forecasts: bool = True, lanes: bool | None = None, restart: float = 0.0,
    restart_to=None,
):  # fmt: skip
    """K-class Composite Jumper over experts with its online vector and matrix scaling inputs
    learnt in the same pass.

    Returns ``(p' (n, K), log10 S (n,), state_end (S, L), log10 S_end (S,), fin (I, m, K))``.

    Parameters
    ----------
    q : (n, K) base forecasts, each row floored at ``clip`` and renormalised (the mixture's
        input 0; every input reads it).
    y : (n,) labels in [0, K), read at update ops.
    op_event, op_kind, op_offsets : the operation list (:mod:`calpipe.kernels.ops`).
    cols : (I,) the first column of each input's state (theta (d), then A (d x d) row-major;
        d = 2K for vector scaling, K^2 + K for matrix scaling) in ``state``.
    par : (I, N_PAR) each input's parameters and model (:func:`ops_row`, :func:`oms_row`).
    betas (T,), alphas (T, K) : the K-class Cox functions (paper 001 eq. (1)); rates (R,);
        clip: an input's forecast joins the mixture floored at ``clip`` and renormalised.
    state : (S, L) each stream's state: P in column 0, A (R x E, row-major, expert k = i T + t
        is function t of input i, input 0 the base) in columns 1 to R E, the inputs at
        ``cols``; other columns are carried unchanged. log10m (S,). Inputs are not modified.
    input_forecasts : return ``fin`` (I, m, K), every input's raw forecast at every op (what
        its own test martingale reads); else an empty (I, 0, K) array.
    lanes : force the lanes (True) or one stream at a time (False); None: by the batch size.
    restart, restart_to : the jump distribution, as in
        :func:`calpipe.kernels.expert_lanes.composite_experts_binary`.

    The outputs of every stream are bit-identical to the per-input path (each input's
    ``online_scaling`` over the operations with a forecast copy before each delayed label,
    ``clip_probabilities`` of its forecasts, then ``expert_mixture.expert_mixture_multiclass``).
    """
    q = np.ascontiguousarray(q, dtype=np.float64)
    op_offsets = np.ascontiguousarray(op_offsets, dtype=np.int64)
    op_event = np.ascontiguousarray(op_event, dtype=np.int64)
    op_kind = np.ascontiguousarray(op_kind, dtype=np.int8)
    y = np.ascontiguousarray(y, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64).reshape(-1)
    par = np.ascontiguousarray(par, dtype=np.float64).reshape(cols.shape[0], N_PAR)
    betas = np.ascontiguousarray(betas, dtype=np.float64)
    alphas = np.ascontiguousarray(alphas, dtype=np.float64)
    rates = np.ascontiguousarray(rates, dtype=np.float64)
    n_streams = op_offsets.shape[0] - 1
    if q.ndim != 2 or not 2 <= q.shape[1] <= NP_BLOCK or y.shape[0] != q.shape[0]:
        raise ValueError(
            f"q must be (n, K) with 2 <= K <= {NP_BLOCK} and y (n,); got {q.shape}, {y.shape}"
        )
    k = q.shape[1]
    if alphas.shape != (betas.shape[0], k):
        raise ValueError(f"alphas must be (T = {betas.shape[0]}, K = {k}); got {alphas.shape}")
    n_exp = (1 + cols.shape[0]) * betas.shape[0]
    head = 1 + rates.shape[0] * n_exp
    st = np.array(state, dtype=np.float64)  # the one copy: the new state
    if st.ndim != 2 or st.shape[0] != n_streams or st.shape[1] < head:
        raise ValueError(f"state must be (S = {n_streams}, >= {head}); got {st.shape}")
    if not np.all((par[:, 3] == 0.0) | (par[:, 3] == 1.0)):
        raise ValueError("par's model column must be 0 (vector scaling) or 1 (matrix scaling)")
    d = np.where(par[:, 3] != 0.0, k * k + k, 2 * k)
    if np.any((cols < head) | (cols + d + d * d > st.shape[1])):
        raise ValueError("an input's columns are outside the state or inside the mixture's")
    log10m = np.array(log10m, dtype=np.float64)
    if log10m.shape != (n_streams,):
        raise ValueError(f"log10m must be (S = {n_streams},); got {log10m.shape}")
    if op_event.shape != op_kind.shape:
        raise ValueError("op_event and op_kind must have the same length")
    lab = y[op_event[op_kind != OP_FORECAST]]
    if lab.size and (lab.min() < 0 or lab.max() >= k):  # the kernel indexes rows with it
        raise ValueError(f"labels read at update ops must be in [0, {k})")
    out_p = np.full((q.shape[0], k), np.nan)
    out_m = np.full(q.shape[0], np.nan)
    fin = np.full((cols.shape[0], op_event.shape[0] if input_forecasts else 0, k), np.nan)
    start = op_offsets[:-1].copy()  # next operation of each stream
    args = (q, y, op_event, op_kind, op_offsets)
    uniform, rto = restart_terms(restart, restart_to, n_exp)
    rest = (cols, par, betas, alphas, rates, uniform, rto, float(clip), st, log10m, out_p, out_m,
            fin)  # fmt: skip
    if lanes_fit(n_streams) if lanes is None else lanes:
        # Longest streams first, so lanes drain together and the one-stream tail is short.
        order = np.argsort(op_offsets[:-1] - op_offsets[1:], kind="stable")
        fits = stack_fits(rates.shape[0], n_exp, k)
        (_lanes if fits else _lanes_heap)(*args, order, start, *rest)
    _one_lane(*args, np.arange(n_streams, dtype=np.int64), start, *rest)
    return out_p, out_m, st, log10m, fin
