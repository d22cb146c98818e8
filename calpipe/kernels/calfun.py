"""The calibrating functions f_theta evaluated one event at a time, inside the kernels.

The numba twin of :func:`calpipe.families.evaluate` (which evaluates a family on arrays in
numpy, and defines the families): the binary families of paper 000 -- quadratic (eq. 1), cubic
(eq. 3), Cox one- and two-parameter (eqs. 4-5) -- for one score (:func:`eval_binary`) or for the
lanes of a multi-stream engine (:func:`eval_binary_lanes`, the same operations), and the K-class
Cox functions of paper 001 eq. (1) (:func:`eval_multiclass_t`). The tests check them against
``families.evaluate`` to 1e-15.

>>> import numpy as np
>>> from calpipe import families
>>> fam = families.binary_family("cox2")
>>> out = np.empty(fam.size)
>>> eval_binary(fam.code, fam.params, np.exp(fam.params[:, 0]), 0.3, out, fam.size)
>>> bool(np.allclose(out, families.evaluate(fam, np.array([0.3]))[0]))
True
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


# --------------------------------------------------------------------------------------------
# Calibrating functions, one event at a time (the numpy twin is calpipe.families.evaluate).
# --------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def pow_beta(x, beta):
    # The default Cox exponents 1, 0.5, 2 are hit without a general pow (docs/ARCHITECTURE.md §6).
    if beta == 1.0:
        return x
    if beta == 0.5:
        return math.sqrt(x)
    if beta == 2.0:
        return x * x
    return x**beta


@njit(cache=True, inline="always", error_model="numpy")
def eval_binary(code, params, exp_alpha, p, out, n):
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
def eval_binary_lanes(code, params, exp_alpha, x, f, n_fun, n_lanes, q, sp, sq):
    """f[t, l] = f_t(x[l]) for every lane l: :func:`eval_binary` with the same operations, the
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
def distinct_betas(betas):
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
def eval_multiclass_t(pe, betas, beta_of, exp_alpha_t, powers, ssum, out):
    """out[c, t] = p_c^beta_t e^{alpha_t(c)} / sum_c' (...) (paper 001 eq. (1)): the values of
    the Cox functions, transposed (class-major, so every inner loop runs over the T functions and
    vectorises). p_c^beta is computed once per distinct beta (``betas`` distinct,
    ``beta_of[t]`` the index of function t's beta): 3K powers instead of 3(2K + 1)K; the sums
    over classes keep their class order, so the values are bit-identical."""
    k, n_fun = exp_alpha_t.shape
    for b in range(betas.shape[0]):
        for c in range(k):
            powers[c, b] = pow_beta(pe[c], betas[b])
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
