"""The Composite Jumper over experts: paper 001's Algorithm 1 with calibrating functions applied
to several prequential forecasts (the base and online calibrators), all streams in one call.

Public entry points: :func:`expert_mixture_binary`, :func:`expert_mixture_multiclass`; the
calibrator is :class:`calpipe.calibrators.experts.CompositeExperts`.

Recursion
---------
Event e comes with I input forecasts q_{e,0..I-1}: q_{e,0} is the (clipped) base forecast p_e,
the others are forecasts of online calibrators made before y_e is known. The active experts are
the pairs (i, theta) of an input and a calibrating function, E = I |Theta| of them, with
f_{i,theta}(e) = f_theta(q_{e,i}). Per update, exactly paper 001 Algorithm 1 (lines 4-15) with
that set of functions:

    A[J, k] <- (1 - J) A[J, k] + J ((1 - w) / E + w r_k) sum_k' A[J, k']    (jump-mixing)
    p'      <- P p + sum_{J, k} A[J, k] f_k(e)                              (forecast)
    P <- P B_p({y}),  A[J, k] <- A[J, k] B_{f_k(e)}({y}),  C = P + sum A   (Bayes)
    P, A <- P / C, A / C;  log10 S <- log10 S + log10 C - log10 B_p({y})

A jump goes to a uniform expert (paper 001's line 5: w = 0) or, with probability w (the
``restart``), to the restart distribution r (the default method's: its start, each input's
identity equally): :func:`calpipe.kernels.mixture.jump_mix_restart`. The proofs of paper 001 (and of Lemma 1 of paper 000 for the gale) use only that each f_k(e)
is a probability forecast fixed before y_e: they hold for this set as for the Cox grid on p.
Hence log10 S is a test martingale of the base forecasts, and the cumulative log loss obeys the
bounds derived in :class:`calpipe.calibrators.experts.CompositeExperts`.

Speed: batches of many binary streams run in SIMD lanes through
:mod:`calpipe.kernels.expert_lanes` (which also learns the default's inputs in the same pass),
bit-identical per stream to :func:`_binary`, the one-stream engine here; K classes run one
stream at a time here (:func:`_multiclass`), and the default's K-class inputs (online vector
scaling) and mixture run in lanes in :mod:`calpipe.kernels.expert_lanes_multiclass`,
bit-identical per stream to the inputs' kernels followed by :func:`_multiclass`. Every sum is in a fixed order, so k chunks with the state carried equal one
pass bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from calpipe.kernels import expert_lanes as EL
from calpipe.kernels.calfun import distinct_betas, eval_binary, eval_multiclass_t
from calpipe.kernels.mixture import jump_mix_restart, restart_terms
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE

_COX = 2  # calpipe.families.COX: the kernel code of the Cox family


@njit(cache=True, error_model="numpy")
def _binary(q, y, op_event, op_kind, op_offsets, params, rates, passive, active, log10m, uniform,
            restart_to):  # fmt: skip
    n_streams = op_offsets.shape[0] - 1
    n_in = q.shape[1]
    n_fun = params.shape[0]
    n_rates = rates.shape[0]
    n_exp = n_in * n_fun
    exp_alpha = np.exp(params[:, 0])
    pw_all = passive.copy()
    a_all = active.copy()
    m_all = log10m.copy()
    out_p = np.full(q.shape[0], np.nan)
    out_m = np.full(q.shape[0], np.nan)
    f = np.empty(n_exp)
    mixed = np.empty((n_rates, n_exp))
    col = np.empty(n_exp)
    for s in range(n_streams):
        a = a_all[s]
        pw = pw_all[s]
        m = m_all[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            for i in range(n_in):
                eval_binary(_COX, params, exp_alpha, q[e, i], f[i * n_fun :], n_fun)
            jump_mix_restart(a, rates, uniform, restart_to, mixed, col)  # paper 001 Alg. 1 line 5
            pe = q[e, 0]
            if kind != OP_UPDATE:
                pred = pw * pe
                for k in range(n_exp):
                    pred += col[k] * f[k]
                out_p[e] = pred
            if kind != OP_FORECAST:
                base = pe
                if y[e] == 0:
                    base = 1.0 - pe
                    for k in range(n_exp):
                        f[k] = 1.0 - f[k]
                pw = pw * base
                c = pw
                for j in range(n_rates):
                    for k in range(n_exp):
                        v = mixed[j, k] * f[k]
                        a[j, k] = v
                        c += v
                m += math.log10(c / base)
                inv = 1.0 / c
                pw = pw * inv
                for j in range(n_rates):
                    for k in range(n_exp):
                        a[j, k] *= inv
            if kind != OP_UPDATE:
                out_m[e] = m
        pw_all[s] = pw
        m_all[s] = m
    return out_p, out_m, pw_all, a_all, m_all


@njit(cache=True, error_model="numpy")
def _multiclass(q, y, op_event, op_kind, op_offsets, betas, alphas, rates, passive, active, log10m,
                uniform, restart_to):  # fmt: skip
    n_streams = op_offsets.shape[0] - 1
    n_in, k = q.shape[1], q.shape[2]
    n_fun = betas.shape[0]
    n_rates = rates.shape[0]
    n_exp = n_in * n_fun
    distinct, beta_of = distinct_betas(betas)
    exp_alpha_t = np.ascontiguousarray(np.exp(alphas).T)  # (K, T)
    pw_all = passive.copy()
    a_all = active.copy()
    m_all = log10m.copy()
    out_p = np.full((q.shape[0], k), np.nan)
    out_m = np.full(q.shape[0], np.nan)
    f = np.empty((n_in, k, n_fun))
    powers = np.empty((k, distinct.shape[0]))
    ssum = np.empty(n_fun)
    mixed = np.empty((n_rates, n_exp))
    col = np.empty(n_exp)
    for s in range(n_streams):
        a = a_all[s]
        pw = pw_all[s]
        m = m_all[s]
        for o in range(op_offsets[s], op_offsets[s + 1]):
            e = op_event[o]
            kind = op_kind[o]
            for i in range(n_in):
                eval_multiclass_t(q[e, i], distinct, beta_of, exp_alpha_t, powers, ssum, f[i])
            jump_mix_restart(a, rates, uniform, restart_to, mixed, col)
            if kind != OP_UPDATE:
                for c in range(k):
                    pred = pw * q[e, 0, c]
                    for i in range(n_in):
                        for t in range(n_fun):
                            pred += col[i * n_fun + t] * f[i, c, t]
                    out_p[e, c] = pred
            if kind != OP_FORECAST:
                lab = y[e]
                base = q[e, 0, lab]
                pw = pw * base
                tot = pw
                for j in range(n_rates):
                    for i in range(n_in):
                        for t in range(n_fun):
                            v = mixed[j, i * n_fun + t] * f[i, lab, t]
                            a[j, i * n_fun + t] = v
                            tot += v
                m += math.log10(tot / base)
                inv = 1.0 / tot
                pw = pw * inv
                for j in range(n_rates):
                    for kk in range(n_exp):
                        a[j, kk] *= inv
            if kind != OP_UPDATE:
                out_m[e] = m
        pw_all[s] = pw
        m_all[s] = m
    return out_p, out_m, pw_all, a_all, m_all


def _check(q, op_event, op_kind, op_offsets, rates, passive, active, log10m, n_fun, ndim):
    if q.ndim != ndim:
        raise ValueError(f"q must have {ndim} dimensions; got shape {q.shape}")
    s = op_offsets.shape[0] - 1
    n_exp = q.shape[1] * n_fun
    if active.shape != (s, rates.shape[0], n_exp) or passive.shape != (s,) or log10m.shape != (s,):
        raise ValueError(
            f"state shapes {passive.shape}, {active.shape}, {log10m.shape} do not fit "
            f"S = {s} streams, R = {rates.shape[0]} rates and E = {n_exp} experts"
        )
    if op_event.shape != op_kind.shape:
        raise ValueError("op_event and op_kind must have the same length")


def expert_mixture_binary(q, y, op_event, op_kind, op_offsets, params, rates, passive, active,
                          log10m, *, lanes=None, restart=0.0, restart_to=None):  # fmt: skip
    """Binary Composite Jumper over inputs: ``(p', log10 S, P, A, log10 S_end)``.

    Parameters
    ----------
    q : (n, I) input forecasts of P(y = 1) in (0, 1), column 0 the clipped base.
    y : (n,) labels in {0, 1}, read at update ops.
    op_event, op_kind, op_offsets : the operation list (:mod:`calpipe.kernels.ops`).
    params : (T, 2) Cox (alpha, beta) of the calibrating functions.
    rates : (R,) jumping rates. passive (S,), active (S, R, I * T), log10m (S,): the state
        (expert k = i * T + t is function t of input i). Inputs are not modified.
    restart, restart_to : a jump goes to the distribution ``restart_to`` (E,) with probability
        ``restart`` and to a uniform expert otherwise (:func:`calpipe.kernels.mixture.
        jump_mix_restart`); 0 / None: paper 001's uniform jumps.
    lanes : None: batches of many streams run in SIMD lanes
        (:func:`calpipe.kernels.expert_lanes.composite_experts_binary` with every input given),
        others one stream at a time; False: one stream at a time. Same bits either way.

    >>> import numpy as np
    >>> from calpipe.kernels.ops import OP_STEP
    >>> q = np.array([[0.2, 0.3], [0.7, 0.6]])
    >>> act = np.zeros((1, 1, 2)); act[0, 0, 1] = 0.5  # half on input 1's identity
    >>> p, m, *_ = expert_mixture_binary(q, np.array([0, 1]), np.arange(2),
    ...     np.full(2, OP_STEP, np.int8), np.array([0, 2]), np.array([[0.0, 1.0]]),
    ...     np.array([0.0]), np.array([0.5]), act, np.zeros(1))
    >>> p.round(4).tolist()  # 0.5 * 0.2 + 0.5 * 0.3; then weights 0.8 : 0.7
    [0.25, 0.6533]
    """
    q = np.ascontiguousarray(q, dtype=np.float64)
    params = np.ascontiguousarray(params, dtype=np.float64)
    args = [np.ascontiguousarray(v, dtype=np.float64) for v in (rates, passive, active, log10m)]
    op_offsets = np.ascontiguousarray(op_offsets, dtype=np.int64)
    op_event = np.ascontiguousarray(op_event, dtype=np.int64)
    op_kind = np.ascontiguousarray(op_kind, dtype=np.int8)
    _check(q, op_event, op_kind, op_offsets, *args, params.shape[0], 2)
    y = np.ascontiguousarray(y, dtype=np.int64)
    uniform, to = restart_terms(restart, restart_to, q.shape[1] * params.shape[0])
    if lanes is None and EL.lanes_fit(op_offsets.shape[0] - 1):
        n_in = q.shape[1] - 1
        out = EL.composite_experts_binary(
            q, y, op_event, op_kind, op_offsets, np.full(n_in, EL.IN_GIVEN),
            np.arange(1, n_in + 1), np.zeros((n_in, EL.N_PAR)), np.zeros((n_in, 1)), params,
            args[0], 0.0, *args[1:], np.zeros((op_offsets.shape[0] - 1, 0)),
            input_forecasts=False, lanes=True, restart=restart, restart_to=restart_to,
        )  # fmt: skip
        return out[:5]
    return _binary(q, y, op_event, op_kind, op_offsets, params, *args, uniform, to)


def expert_mixture_multiclass(q, y, op_event, op_kind, op_offsets, betas, alphas, rates, passive,
                              active, log10m, *, restart=0.0, restart_to=None):  # fmt: skip
    """K-class Composite Jumper over inputs: ``(p' (n, K), log10 S, P, A, log10 S_end)``.

    ``q`` (n, I, K): input forecasts (rows on the open simplex), input 0 the clipped base;
    ``betas`` (T,) and ``alphas`` (T, K): the Cox functions of paper 001 eq. (1); the rest as in
    :func:`expert_mixture_binary` (``restart``, ``restart_to`` too).
    """
    q = np.ascontiguousarray(q, dtype=np.float64)
    args = [np.ascontiguousarray(v, dtype=np.float64) for v in (rates, passive, active, log10m)]
    op_offsets = np.ascontiguousarray(op_offsets, dtype=np.int64)
    op_event = np.ascontiguousarray(op_event, dtype=np.int64)
    op_kind = np.ascontiguousarray(op_kind, dtype=np.int8)
    _check(q, op_event, op_kind, op_offsets, *args, np.asarray(betas).shape[0], 3)
    uniform, to = restart_terms(restart, restart_to, q.shape[1] * np.asarray(betas).shape[0])
    return _multiclass(
        q, np.ascontiguousarray(y, dtype=np.int64), op_event, op_kind, op_offsets,
        np.ascontiguousarray(betas, dtype=np.float64),
        np.ascontiguousarray(alphas, dtype=np.float64), *args, uniform, to,
    )  # fmt: skip
