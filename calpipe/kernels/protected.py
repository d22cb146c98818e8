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
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

OP_STEP = 0
OP_FORECAST = 1
OP_UPDATE = 2


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


@njit(cache=True, inline="always")
def _eval_binary(code, params, exp_alpha, p, out):
    """out[t] = f_t(p) for the binary family ``code`` (families.QUADRATIC/CUBIC/COX)."""
    n = params.shape[0]
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


@njit(cache=True, inline="always")
def _eval_multiclass(betas, exp_alpha, p, out):
    """out[t, c] = p_c^beta_t e^{alpha_t(c)} / sum_c' (...) (paper 001 eq. (1))."""
    n, k = exp_alpha.shape
    for t in range(n):
        b = betas[t]
        s = 0.0
        for c in range(k):
            v = _pow(p[c], b) * exp_alpha[t, c]
            out[t, c] = v
            s += v
        for c in range(k):
            out[t, c] /= s


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
# Log-loss mixture: binary.
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _mixture_binary(
    p, y, op_event, op_kind, op_offsets, code, params, rates, passive0, active0, log10m0
):
    """Binary log-loss mixture over all streams (see the module docstring).

    Parameters: p (n,) clipped base P(y=1); y (n,) int8 in {0, 1}, read only by updates;
    op_event (m,) int64; op_kind (m,) int8; op_offsets (S+1,) int64; code int; params (T, 2);
    rates (R,); passive0 (S,); active0 (S, R, T); log10m0 (S,).

    Returns (protected (n,), log10m (n,), passive (S,), active (S, R, T), log10m_end (S,)).
    Events without a forecast operation keep NaN.
    """
    n = p.shape[0]
    n_streams = op_offsets.shape[0] - 1
    n_rates, n_fun = active0.shape[1], active0.shape[2]
    out_p = np.full(n, np.nan)
    out_m = np.full(n, np.nan)
    passive = passive0.copy()
    active = active0.copy()
    log10m = log10m0.copy()
    exp_alpha = np.exp(params[:, 0])
    f = np.empty(n_fun)
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
            _eval_binary(code, params, exp_alpha, pe, f)
            _jump_mix(a, rates, mixed, col)
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
                        v = mixed[j, t] * f[t]
                        a[j, t] = v
                        c += v
                # c = p'(y): the weights summed to 1 before the Bayes step.
                m += math.log10(c / base)
                inv = 1.0 / c
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
# Log-loss mixture: K classes.
# --------------------------------------------------------------------------------------------
@njit(cache=True)
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
    exp_alpha = np.exp(alphas)
    f = np.empty((n_fun, k))
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
            _eval_multiclass(betas, exp_alpha, pe, f)
            _jump_mix(a, rates, mixed, col)
            if kind != OP_UPDATE:
                for c in range(k):
                    acc = pw * pe[c]
                    for t in range(n_fun):
                        acc += col[t] * f[t, c]
                    out_p[e, c] = acc
            if kind != OP_FORECAST:
                yy = y[e]
                base = pe[yy]
                pw = pw * base
                tot = pw
                for j in range(n_rates):
                    for t in range(n_fun):
                        v = mixed[j, t] * f[t, yy]
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
def _cj_from_sj(lsj):
    """log10((1 + mean_J 10^{lsj[J]}) / 2), evaluated as the package's ``log_mean([0, log_mean(.)])``."""
    ln10 = math.log(10.0)
    n_rates = lsj.shape[0]
    mx = lsj[0]
    for j in range(1, n_rates):
        mx = max(mx, lsj[j])
    acc = 0.0
    for j in range(n_rates):
        acc += math.exp(ln10 * (lsj[j] - mx))
    inner = mx + math.log10(acc / n_rates)
    m2 = max(0.0, inner)
    return m2 + math.log10((math.exp(ln10 * (0.0 - m2)) + math.exp(ln10 * (inner - m2))) / 2.0)


@njit(cache=True)
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
    exp_alpha = np.exp(alphas)
    f = np.empty((n_fun, k))
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
            _eval_multiclass(betas, exp_alpha, pe, f)
            _jump_mix(a, rates, mixed, col)
            if kind != OP_UPDATE:
                gsum = 0.0
                for c in range(k):
                    acc = pw * math.exp(-_brier_to_onehot(c, pe))
                    for t in range(n_fun):
                        acc += col[t] * math.exp(-_brier_to_onehot(c, f[t]))
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
                yy = y[e]
                lb = math.exp(-_brier_to_onehot(yy, pe))
                pw = pw * lb
                tot = pw
                for j in range(n_rates):
                    jr = rates[j]
                    for t in range(n_fun):
                        cap_mixed[j, t] = (1.0 - jr) * cap[j, t] + jr / n_fun
                for t in range(n_fun):
                    lf = math.exp(-_brier_to_onehot(yy, f[t]))
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
