"""The Brier-loss compatibility recursion of the reference package ``protected-classification``
0.1.5 (``loss="brier"``): K classes (:func:`brier_compat`, a transcription of the package's
algorithm) and two classes fast (:func:`brier_binary`, dispatching to the engines of
:mod:`calpipe.kernels.brier_binary`), plus the package's composite "martingale" log10 CJ.

The package does not run paper 001's log-loss Algorithm 1: it runs the Brier-loss aggregating
algorithm (exp(-Brier) weights, learning rate 1, the substitution shortcut) over a 15-slot Cox
grid with duplicates, and reports log10 CJ = log10((1 + mean_J SJ_J) / 2) of Brier-based
capitals SJ_J. calpipe reproduces it to 1e-12 at every event (``tests/test_published.py``,
docs/REFERENCE_DATA.md) for users who must match it; the default is the log-loss mixture
(:mod:`calpipe.kernels.mixture`). The operation list is that of :mod:`calpipe.kernels.ops`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from calpipe.kernels.brier_binary import BRIER_LANES, brier_lanes, brier_streams, brier_streams_3x15
from calpipe.kernels.calfun import distinct_betas, eval_multiclass_t
from calpipe.kernels.mixture import jump_mix
from calpipe.kernels.numeric import EXP_ARG_MAX, INV_LN10, LN10, exp_core, ln_core, stack_empty
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE


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
def cj_from_sj(lsj):
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
def brier_compat(
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
    distinct, beta_of = distinct_betas(betas)
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
            eval_multiclass_t(pe, distinct, beta_of, exp_alpha_t, powers, ssum, f)
            jump_mix(a, rates, mixed, col)
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
                out_cj[e] = cj_from_sj(lsj)
                for j in range(n_rates):
                    out_sj[e, j] = lsj[j]
        passive[s] = pw
    return out_p, out_cj, out_sj, passive, active, capital, log_sj


@njit(cache=True)
def log10_cj_rows(log_sj):
    """log10 CJ of each stream from its log10 SJ row (S, R) -> (S,)."""
    out = np.empty(log_sj.shape[0])
    for s in range(log_sj.shape[0]):
        out[s] = cj_from_sj(log_sj[s])
    return out


_CJ_BLOCK = 64  # rows of log10 SJ per vectorised block of cj_rows


@njit(cache=True, inline="always", error_model="numpy")
def _cj_lanes(log_sj, i0, nb, sjt, mx, acc, out):
    """out[i0 + b] = log10 CJ of row i0 + b of ``log_sj``, b < nb: :func:`cj_from_sj`'s formula
    with :func:`exp_core` and :func:`ln_core`, in loops over the rows (which vectorise when nb
    is a literal; ``sjt`` (R, >= nb) holds the rows transposed, so that the loads are
    contiguous). Every row gets the same operations whatever nb, so blocks and tail agree.

    Arguments of e^{ln(10) x} below -``EXP_ARG_MAX`` are raised to it: each sum also holds a
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
            acc[b] += exp_core(max(LN10 * (sjt[j, b] - mx[b]), -EXP_ARG_MAX))
    for b in range(nb):
        inner = mx[b] + ln_core(acc[b] / n_rates) * INV_LN10
        m2 = max(0.0, inner)
        e0 = exp_core(max(LN10 * (0.0 - m2), -EXP_ARG_MAX))
        e1 = exp_core(max(LN10 * (inner - m2), -EXP_ARG_MAX))
        out[i0 + b] = m2 + ln_core((e0 + e1) / 2.0) * INV_LN10
    for b in range(nb):
        mx[b] = 0.0
    for j in range(n_rates):
        for b in range(nb):
            mx[b] += 0.0 * sjt[j, b]


@njit(cache=True, error_model="numpy")
def cj_rows(log_sj):
    """log10 CJ = log10((1 + mean_J 10^{log10 SJ_J}) / 2) of each row of ``log_sj`` (n, R), as
    :func:`cj_from_sj` evaluates it (the package's ``log_mean([0, log_mean(SJ)])``) but with
    libm-free exp and log (see :func:`_cj_lanes`), ``_CJ_BLOCK`` rows at a time. Rows of NaN
    give NaN (events never forecast); rows with another non-finite entry go to
    :func:`cj_from_sj`.

    Example
    -------
    >>> import numpy as np
    >>> sj = np.array([[0.0, 0.0, 0.0], [3.0, -1.0, -2.0], [np.nan, np.nan, np.nan]])
    >>> np.round(cj_rows(sj), 6).tolist()  # CJ = (1 + mean_J SJ_J) / 2
    [0.0, 2.223197, nan]
    >>> round(float(np.log10((1 + np.mean(10 ** sj[1])) / 2)), 6)
    2.223197
    """
    n, n_rates = log_sj.shape
    out = np.empty(n)
    mx = carray(stack_empty(64), _CJ_BLOCK)
    acc = carray(stack_empty(64), _CJ_BLOCK)
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
                out[i0 + b] = np.nan if np.all(np.isnan(row)) else cj_from_sj(row)
        i0 += nb
    return out


def brier_binary(
    p, y, op_event, op_kind, op_offsets, betas, alphas, rates, passive0, active0, capital0, log_sj0
):
    """The Brier compatibility recursion of :func:`brier_compat` for two classes, fast.

    Parameters: p (n,) base P(y = 1), unclipped; y (n,) int64 labels (0 or 1; only their values
    at updates matter); betas (T,), alphas (T, 2) the package's Cox grid
    (``families.package_grid(2)``); other arguments as in :func:`brier_compat`. Returns
    (protected P(y = 1) (n,), log10 CJ (n,), log10 SJ (n, R), passive, active, capital,
    log10 SJ (S, R)).

    The same recursion as :func:`brier_compat` (the package's Brier-loss aggregating algorithm:
    generalised predictions g_c = -ln(P e^{-Brier(c, p)} + sum A e^{-Brier(c, f)}), substitution
    shortcut, Bayes-like update of the weights by e^{-Brier(y, .)}, capital and log10 SJ), with
    libm-free exp and log and fixed-order tree sums (see the section comment): its outputs agree
    with :func:`brier_compat`'s to a few ulp, not bit for bit. Deterministic: one stream's
    outputs do not depend on its batch, and chunks with carried state equal one pass exactly.

    Example
    -------
    >>> import numpy as np
    >>> from calpipe import families
    >>> fam = families.package_grid(2)
    >>> a0 = np.zeros((1, 3, fam.size)); a0[0, :, 0] = 0.5 / 3  # the package: pi = 0.5
    >>> c0 = np.zeros((1, 3, fam.size)); c0[0, :, 0] = 1.0
    >>> out = brier_binary(
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
    if n_streams >= 2 * BRIER_LANES:  # enough streams to fill the lanes twice over
        # Longest streams first, so lanes drain together and the one-stream tail is short.
        order = np.argsort(op_offsets[:-1] - op_offsets[1:], kind="stable")
        brier_lanes(*args, order, start, *grid, *state)
    default = (n_rates, n_fun) == (3, 15)  # literal sizes, stack scratch
    engine = brier_streams_3x15 if default else brier_streams
    engine(*args, start, *grid, *state)
    return out_p, cj_rows(out_sj), out_sj, passive, active, capital, log_sj
