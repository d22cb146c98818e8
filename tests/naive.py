"""Naive oracles: slow, obvious per-step loops written straight from the papers.

Nothing here uses calpipe's kernels or ``calpipe.families.evaluate``: calibrating functions are
plain Python closures over their parameters, weights are Python lists, and every loop runs one event
at a time in the order of the printed algorithm. The tests compare the numba kernels against these.

Papers (``shared/papers`` beside the repository):

* 000 — Vovk, Petej, Gammerman, "Adaptive calibration for binary classification" (2021):
  eqs. (1), (3), (4), (5), Algorithm 1 (Jumper betting martingale), Algorithm 2 (Jumper predictor),
  Lemma 1 (§4: the gale of the AA is the average of the elementary predictors' gales).
* 001 — Petej, "Protected Probabilistic Classification Library": eq. (1) (multiclass Cox),
  Algorithm 1 (Composite Jumper predictor).
* The reference package ``protected-classification`` 0.1.5, ``ProtectedClassification.calibrate_probs``
  (online branch, ``y is not None``): the Brier-loss compatibility recursion.

Null labels (calpipe's convention, docs/ARCHITECTURE.md §4 "Serving map"): a label ``None`` or ``< 0`` means the
label is not known. Such an event gets a forecast but changes no state: the forecast is the mixture
after the jump-mixing step of the next step, computed on copies of the weights and *not committed*,
so the next event starts from exactly the state before the unlabelled one. The test martingale is
unchanged by an unlabelled event (its value at that event is the running value before it).

Binary forecasts are floats (the probability of label 1); K-class forecasts are numpy vectors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Fn = Callable[[object], object]


# ----------------------------------------------------------------------------------------------
# Calibrating functions
# ----------------------------------------------------------------------------------------------
def quadratic(eps: float) -> Callable[[float], float]:
    """f_eps(p) = p + eps p (1 - p): paper 000, eq. (1)."""

    def f(p: float) -> float:
        return p + eps * p * (1.0 - p)

    return f


def cubic(a: float, b: float) -> Callable[[float], float]:
    """f_{a,b}(p) = p + a p (p - b)(p - 1): paper 000, eq. (3)."""

    def f(p: float) -> float:
        return p + a * p * (p - b) * (p - 1.0)

    return f


def cox(beta: float) -> Callable[[float], float]:
    """f_beta(p) = p^beta / (p^beta + (1 - p)^beta): paper 000, eq. (4)."""

    def f(p: float) -> float:
        return p**beta / (p**beta + (1.0 - p) ** beta)

    return f


def cox2(alpha: float, beta: float) -> Callable[[float], float]:
    """f_{alpha,beta}(p) = p^beta e^alpha / (p^beta e^alpha + (1 - p)^beta): paper 000, eq. (5)."""

    def f(p: float) -> float:
        num = p**beta * math.exp(alpha)
        return num / (num + (1.0 - p) ** beta)

    return f


def cox_multiclass(alpha: Sequence[float], beta: float) -> Callable[[Sequence[float]], np.ndarray]:
    """f_{alpha,beta}(p)_y = p_y^beta e^{alpha(y)} / sum_y' p_y'^beta e^{alpha(y')}: paper 001, eq. (1)."""
    alpha = [float(a) for a in alpha]

    def f(p: Sequence[float]) -> np.ndarray:
        num = [float(p[y]) ** beta * math.exp(alpha[y]) for y in range(len(alpha))]
        tot = sum(num)
        return np.array([v / tot for v in num])

    return f


def binary_functions(name: str, params) -> list[Callable[[float], float]]:
    """The calibrating functions of a binary grid, one closure per parameter row.

    ``params`` rows: (eps, _) quadratic, (a, b) cubic, (_, beta) cox, (alpha, beta) cox2 — the
    layout of ``calpipe.families.Family.params`` (only the numbers are taken from it).
    """
    rows = [tuple(float(v) for v in row) for row in np.asarray(params, float).reshape(-1, 2)]
    if name == "quadratic":
        return [quadratic(e) for e, _ in rows]
    if name == "cubic":
        return [cubic(a, b) for a, b in rows]
    if name == "cox":
        return [cox(b) for _, b in rows]
    if name == "cox2":
        return [cox2(a, b) for a, b in rows]
    raise ValueError(name)


def multiclass_functions(alphas, betas) -> list[Callable[[Sequence[float]], np.ndarray]]:
    """Paper 001 eq. (1) functions, one per (alpha row, beta) pair given row by row."""
    return [
        cox_multiclass(list(a), float(b))
        for a, b in zip(np.asarray(alphas), np.asarray(betas), strict=True)
    ]


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------
def is_labelled(y) -> bool:
    """calpipe's null label: ``None`` or a negative integer means "not known yet"."""
    return y is not None and int(y) >= 0


def bernoulli(q, y: int) -> float:
    """B_q({y}): paper 000 §2 (B_q({1}) = q) for a float q; q_y for a probability vector q."""
    if isinstance(q, float | np.floating):
        return float(q) if y == 1 else 1.0 - float(q)
    return float(q[y])


def _weighted_sum(values: list, weights: list[float]):
    """sum_i weights[i] * values[i], left to right (values are floats or numpy vectors)."""
    acc = 0.0 * values[0]
    for v, w in zip(values, weights, strict=True):
        acc = acc + w * v
    return acc


def _log10_mean_exp10(logs: list[float]) -> float:
    """log10 of the mean of 10**logs (max shifted, so long runs neither overflow nor underflow)."""
    m = max(logs)
    return m + math.log10(sum(10.0 ** (v - m) for v in logs) / len(logs))


# ----------------------------------------------------------------------------------------------
# Paper 000: Jumper predictor (Algorithm 2) and Jumper test martingale (Algorithm 1)
# ----------------------------------------------------------------------------------------------
def jumper_predictor(p: Sequence, y: Sequence, fs: list[Fn], jump: float) -> list:
    """Jumper predictor, paper 000 Algorithm 2, exactly as printed.

    line 1: C_eps := 1 for all eps in E
    line 2: for n = 1, 2, ...:
    line 3:   C := sum_eps C_eps
    line 4:   C_eps := C_eps / C
    line 5:   C_eps := (1 - J) C_eps + J / |E|
    line 6:   p'_n := sum_eps f_eps(p_n) C_eps
    line 7:   C_eps := C_eps B_{f_eps(p_n)}({y_n})

    An unlabelled event (calpipe's convention) runs lines 3-6 and does not commit: C_eps keeps its
    value from before the event. Returns p'_n for every event (float binary, vector K classes).
    """
    size = len(fs)
    c_eps = [1.0] * size  # line 1
    out = []
    for pn, yn in zip(p, y, strict=True):  # line 2
        total = sum(c_eps)  # line 3
        normed = [c / total for c in c_eps]  # line 4
        mixed = [(1.0 - jump) * c + jump / size for c in normed]  # line 5
        f_pn = [f(pn) for f in fs]
        out.append(_weighted_sum(f_pn, mixed))  # line 6
        if is_labelled(yn):
            c_eps = [
                c * bernoulli(fv, int(yn)) for c, fv in zip(mixed, f_pn, strict=True)
            ]  # line 7
    return out


def jumper_martingale(p: Sequence, y: Sequence, fs: list[Fn], jump: float) -> list[float]:
    """Jumper betting martingale, paper 000 Algorithm 1, exactly as printed; returns log10 S_n.

    line 1: C_eps := 1 / |E| for all eps in E
    line 2: C := 1
    line 3: for n = 1, 2, ...:
    line 4:   C_eps := (1 - J) C_eps + (J / |E|) C
    line 5:   C_eps := C_eps B_{f_eps(p_n)}({y_n}) / B_{p_n}({y_n})
    line 6:   S_n := C := sum_eps C_eps

    The capitals are kept unnormalised as printed (so the streams given to it must be short enough
    for S_n to stay within floating point range; it raises otherwise). An unlabelled event does not
    bet: S_n is the previous value. This loop shares nothing with :func:`jumper_predictor`, so
    comparing the two checks Lemma 1 of paper 000 §4: log10 S_n = sum_i log10 p'_i(y_i) / p_i(y_i).
    """
    size = len(fs)
    c_eps = [1.0 / size] * size  # line 1
    cap = 1.0  # line 2
    out = []
    for pn, yn in zip(p, y, strict=True):  # line 3
        if is_labelled(yn):
            yy = int(yn)
            c_eps = [(1.0 - jump) * c + (jump / size) * cap for c in c_eps]  # line 4
            base = bernoulli(pn, yy)
            c_eps = [
                c * bernoulli(f(pn), yy) / base for c, f in zip(c_eps, fs, strict=True)
            ]  # line 5
            cap = sum(c_eps)  # line 6
            if not (math.isfinite(cap) and cap > 0.0):
                raise OverflowError(
                    "Algorithm 1 capital left the float range; use a shorter stream"
                )
        out.append(math.log10(cap))
    return out


def mean_jumper(
    p: Sequence, y: Sequence, fs: list[Fn], rates: Sequence[float]
) -> tuple[list, list[float]]:
    """Mean Jumper (paper 000 §5, [16, §3]): the Jumpers of ``rates`` averaged with equal prior.

    Its gale is the mean of the Jumpers' gales G_J (Lemma 1 applied to the mixture over J), so
    its forecast is the gale-weighted mixture of the Jumpers' forecasts,
    p'_n = sum_J G_J(n-1) p'_{J,n} / sum_J G_J(n-1) (G_J(n-1) = the product of p'_{J,i}(y_i) over
    the labelled events before n), and its test martingale is the mean of the Jumper martingales
    (Algorithm 1 run separately for each J). Returns (forecasts, log10 S_n).
    """
    forecasts = [jumper_predictor(p, y, fs, j) for j in rates]
    marts = [jumper_martingale(p, y, fs, j) for j in rates]
    log_gale = [0.0] * len(rates)
    out_p, out_m = [], []
    for n, yn in enumerate(y):
        top = max(log_gale)
        w = [10.0 ** (g - top) for g in log_gale]
        tot = sum(w)
        out_p.append(_weighted_sum([fc[n] for fc in forecasts], [v / tot for v in w]))
        out_m.append(_log10_mean_exp10([m[n] for m in marts]))
        if is_labelled(yn):
            log_gale = [
                g + math.log10(bernoulli(fc[n], int(yn)))
                for g, fc in zip(log_gale, forecasts, strict=True)
            ]
    return out_p, out_m


# ----------------------------------------------------------------------------------------------
# Paper 001: Composite Jumper predictor (Algorithm 1)
# ----------------------------------------------------------------------------------------------
def composite_jumper(
    p: Sequence,
    y: Sequence,
    fs: list[Fn],
    rates: Sequence[float],
    pi: float,
    identity: int = 0,
) -> tuple[list, list[float]]:
    """Composite Jumper predictor, paper 001 Algorithm 1, line by line (binary and K classes).

    line 1:  P := pi
    line 2:  A^J_theta := (1 - pi) / |J| 1{theta = 0}     (theta = 0: the identity, index ``identity``)
    line 3:  for n = 1, 2, ...:
    line 4:    for all J:
    line 5:      A := sum_theta A^J_theta
    line 6:      for all theta:
    line 7:        A^J_theta := (1 - J) A^J_theta + A J / |Theta|
    line 8:    p'_n := p_n P + sum_{J,theta} f_theta(p_n) A^J_theta
    line 9:    P := P B_{p_n}({y_n})
    line 10-11: A^J_theta := A^J_theta B_{f_theta(p_n)}({y_n})
    line 12:   C := P + sum_{J,theta} A^J_theta
    line 13:   P := P / C
    line 14-15: A^J_theta := A^J_theta / C

    ``p`` holds floats (binary: P(y = 1), B as in paper 000) or probability vectors (K classes,
    B_q({y}) = q_y). Unlabelled events run lines 4-8 on copies and commit nothing.
    The test martingale is the gale ratio of docs/ARCHITECTURE.md §4, computed from the forecast of line 8:
    log10 S_n = sum_{labelled i <= n} log10 p'_i(y_i) - log10 p_i(y_i). Returns (p'_n, log10 S_n).
    """
    n_fun = len(fs)
    passive = pi  # line 1
    active = [
        [(1.0 - pi) / len(rates) if t == identity else 0.0 for t in range(n_fun)] for _ in rates
    ]
    log10_s = 0.0
    out_p, out_m = [], []
    for pn, yn in zip(p, y, strict=True):  # line 3
        mixed = []
        for jump, row in zip(rates, active, strict=True):  # line 4
            a_tot = sum(row)  # line 5
            mixed.append([(1.0 - jump) * a + a_tot * jump / n_fun for a in row])  # lines 6-7
        f_pn = [f(pn) for f in fs]
        forecast = pn * passive  # line 8
        for row in mixed:
            forecast = forecast + _weighted_sum(f_pn, row)
        out_p.append(forecast)
        if is_labelled(yn):
            yy = int(yn)
            base = bernoulli(pn, yy)
            new_passive = passive * base  # line 9
            active = [
                [a * bernoulli(fv, yy) for a, fv in zip(row, f_pn, strict=True)] for row in mixed
            ]  # 10-11
            cap = new_passive + sum(sum(row) for row in active)  # line 12
            passive = new_passive / cap  # line 13
            active = [[a / cap for a in row] for row in active]  # lines 14-15
            log10_s += math.log10(bernoulli(forecast, yy)) - math.log10(base)
        out_m.append(log10_s)
    return out_p, out_m


# ----------------------------------------------------------------------------------------------
# protected-classification 0.1.5: Brier-loss compatibility recursion
# ----------------------------------------------------------------------------------------------
def package_grid(n_classes: int) -> tuple[list[list[float]], list[float]]:
    """(alphas, betas) of the package's ``generate_protected_params`` with default betas [1, 0.5, 2]:
    alphas = [0] + [+e_0, -e_0, +e_1, -e_1, ...] (sorted by the first non-zero index), crossed
    alpha-outer with the betas: 3 (2K + 1) slots, 15 for K = 2 (with the duplicates)."""
    betas = [1.0, 0.5, 2.0]
    alphas = [[0.0] * n_classes]
    for k in range(n_classes):
        for sign in (1.0, -1.0):
            row = [0.0] * n_classes
            row[k] = sign
            alphas.append(row)
    return [a for a in alphas for _ in betas], [b for _ in alphas for b in betas]


def _brier(onehot: Sequence[float], q: Sequence[float]) -> float:
    """The package's ``brier_loss`` for one row: sum_i (onehot_i - q_i)^2."""
    return float(sum((float(o) - float(v)) ** 2 for o, v in zip(onehot, q, strict=True)))


def log_mean(x: Sequence[float]) -> float:
    """The package's ``log_mean``: m + log10(mean(exp(ln 10 (x - m)))), m = max(x)."""
    m = max(x)
    return m + math.log10(sum(math.exp(math.log(10.0) * (v - m)) for v in x) / len(x))


def brier_compat(
    p: np.ndarray,
    y: Sequence,
    rates: Sequence[float] = (1e-2, 1e-3, 1e-4),
    pi: float = 0.5,
    alphas=None,
    betas=None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The online branch of ``ProtectedClassification.calibrate_probs`` (protected-classification
    0.1.5) for one stream, transcribed statement by statement; ``p`` is (n, K).

    Per event n (package order): jump-mix ``active_weight`` (towards capital * J / n_calibrators)
    and ``mart_capital`` (towards J / n_calibrators); pseudo-prediction
    g_c = -ln(P e^{-Brier(e_c, p_n)} + sum_k sum_J A[J,k] e^{-Brier(e_c, f_k(p_n))}); shortcut
    s = (2 + sum_c g_c) / K, p'_c = (s - g_c) / 2; then P *= e^{-Brier(e_y, p_n)},
    A[J,k] *= e^{-Brier(e_y, f_k)}, capital[J,k] *= e^{-Brier(e_y, f_k)} / e^{-Brier(e_y, p_n)},
    log10 SJ_J += log10 sum_k capital[J,k], capital[J] /= its sum; renormalise P and A.
    After the loop: p' clipped to [0, 1] and renormalised; log10 CJ = log_mean([0, log_mean(SJ)]).

    The package one-hot encodes the labels it sees; here class c is e_c directly. An unlabelled
    event (calpipe's convention) computes p' from jump-mixed copies and changes nothing.
    Returns (p' (n, K), log10 CJ (n,), log10 SJ (n, R)) after each event.
    """
    p = np.asarray(p, dtype=np.float64)
    n_test, k = p.shape
    if alphas is None:
        alphas, betas = package_grid(k)
    cal_list = list(zip(alphas, betas, strict=True))
    n_cal, n_j = len(cal_list), len(rates)
    prob_list = [[1.0 if i == c else 0.0 for i in range(k)] for c in range(k)]

    def cox_mc(pv, alpha, beta):  # the package's cox_multiclass
        cox_v = np.array([float(q) ** beta for q in pv]) * np.exp(np.asarray(alpha, float))
        return cox_v / np.sum(cox_v)

    passive = pi
    active = np.zeros((n_j, n_cal))
    active[:, 0] = (1.0 - pi) / n_j
    capital_m = np.zeros((n_j, n_cal))
    capital_m[:, 0] = 1.0
    log_sj = np.zeros(n_j)
    p_prime = np.zeros((n_test, k))
    out_cj = np.zeros(n_test)
    out_sj = np.zeros((n_test, n_j))
    for n in range(n_test):
        pn = p[n]
        act = active.copy()
        cap_m = capital_m.copy()
        for j in range(n_j):  # jump-mixing
            capital = np.sum(act[j, :])
            act[j, :] = (1 - rates[j]) * act[j, :] + capital * rates[j] / n_cal
            cap_m[j, :] = (1 - rates[j]) * cap_m[j, :] + rates[j] / n_cal
        cal_pp = [cox_mc(pn, a, b) for a, b in cal_list]
        g = np.empty(k)
        for c, prob_c in enumerate(prob_list):
            g[c] = passive * math.exp(-_brier(prob_c, pn))
            for kk in range(n_cal):
                for j in range(n_j):
                    g[c] += act[j, kk] * math.exp(-_brier(prob_c, cal_pp[kk]))
            g[c] = -math.log(g[c])
        s = (2 + np.sum(g)) / k
        for c in range(k):
            p_prime[n, c] = (s - g[c]) / 2
        if is_labelled(y[n]):
            onehot = prob_list[int(y[n])]
            base_gain = math.exp(-_brier(onehot, pn))
            passive *= base_gain
            for kk in range(n_cal):
                gain = math.exp(-_brier(onehot, cal_pp[kk]))
                for j in range(n_j):
                    act[j, kk] *= gain
                    cap_m[j, kk] *= gain / base_gain
            for j in range(n_j):
                log_sj[j] += math.log10(np.sum(cap_m[j, :]))
                cap_m[j, :] /= np.sum(cap_m[j, :])
            capital = passive + np.sum(act)
            passive /= capital
            active = act / capital
            capital_m = cap_m
        out_sj[n] = log_sj
        out_cj[n] = log_mean([0.0, log_mean(list(log_sj))])
    p_prime = np.clip(p_prime, 0.0, 1.0)
    p_prime = p_prime / p_prime.sum(axis=1, keepdims=True)
    return p_prime, out_cj, out_sj
