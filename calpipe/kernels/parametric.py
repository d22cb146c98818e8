"""Parametric batch calibrators: Platt scaling, beta calibration and temperature scaling.

Each method is a pair of pure functions following the calibrator kernel contract
(``*_fit(scores, labels, **params) -> fitted``, ``*_predict(fitted, scores) -> Prediction``):

=============  ==========================================  ======================================
method         map p -> p'                                 fitted vector (float64)
=============  ==========================================  ======================================
Platt          sigmoid(a logit(p) + b)                     ``[a, b, eps]``
beta           sigmoid(a ln p - b ln(1 - p) + c)           ``[a, b, c, eps]``
temperature    softmax(ln p / T) (multiclass)              ``[1/T, eps]``
=============  ==========================================  ======================================

``eps`` is the clip of the base probabilities used at fit time, stored so that ``predict``
applies the very same features.

Platt and beta are maximum-likelihood logistic regressions on one or two features of p. Both
are fitted by one numba kernel, :func:`_logreg_newton`: Newton's method with step halving on
the objective

    F(theta) = sum_i [softplus(eta_i) - t_i eta_i] + n lambda / 2 ||theta||^2,  eta = X theta,

(the summed log loss; the mean log loss plus lambda / 2 ||theta||^2), where t_i is the label (or
Platt's smoothed target), the feature columns are centred when there is an intercept, and
``lambda = config.LOGREG_RIDGE_MEAN`` (1e-10) is a tiny ridge on every coefficient, the
(centred) intercept included. The ridge is how the degenerate calibration sets are handled
without raising: with a single class or perfectly separable scores the unpenalised
maximum-likelihood estimate does not exist, with all scores tied it is not unique; the ridge
makes F strictly convex, so the fit is the unique, finite, penalised optimum: on separable or
single-class data, forecasts within ~lambda ln(1/lambda) ~ 2e-9 of 0 or 1 on the calibration
scores; on all-tied scores, slope 0 (centring makes the tied feature exactly 0) and the (nearly)
mean label. On ordinary data it moves the coefficients by ~1e-8 relative, below the oracle
tolerances.

Temperature scaling is a one-dimensional convex problem in beta = 1/T, solved by a safeguarded
Newton-bisection on its derivative (:func:`_temperature_newton`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from calpipe import config
from calpipe.kernels.numeric import cholesky_solve
from calpipe.kernels.prediction import Prediction

#: Parameterisations of beta calibration, as in the betacal package.
BETA_PARAMETERS = ("abm", "ab", "am", "a")

_LN2 = math.log(2.0)


# --------------------------------------------------------------------------------------------
# Logistic regression by safeguarded Newton (Platt, beta)
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _logreg_eval(x, t, theta, ridge, grad, hess):
    """F(theta) (module docstring); fills grad F and the Hessian (lower triangle and mirror).

    One pass, one exp and one log1p per event: with e = exp(-|eta|), softplus(eta) =
    max(eta, 0) + log1p(e), sigmoid(eta) = 1 / (1 + e) or e / (1 + e), and
    sigmoid (1 - sigmoid) = e / (1 + e)^2.
    """
    n, m = x.shape
    f = 0.0
    for j in range(m):
        f += 0.5 * ridge * theta[j] * theta[j]
        grad[j] = ridge * theta[j]
        for k in range(m):
            hess[j, k] = ridge if j == k else 0.0
    for i in range(n):
        eta = 0.0
        for j in range(m):
            eta += x[i, j] * theta[j]
        e = math.exp(-abs(eta))
        f += max(eta, 0.0) + math.log1p(e) - t[i] * eta
        inv = 1.0 / (1.0 + e)
        s = inv if eta >= 0.0 else e * inv
        r = s - t[i]
        w = e * inv * inv
        for j in range(m):
            grad[j] += r * x[i, j]
            for k in range(j + 1):
                hess[j, k] += w * x[i, j] * x[i, k]
    for j in range(m):
        for k in range(j):
            hess[k, j] = hess[j, k]
    return f


@njit(cache=True)
def _logreg_newton(x, t, ridge, tol, dec_tol, max_iter, max_halvings, chol_shift):
    """Minimise F(theta) (module docstring) by Newton's method with step halving.

    ``x`` (n, m) is the design matrix (the intercept, if any, is a column of ones), ``t`` (n,)
    the targets in [0, 1]. Starts at theta = 0. Each iteration solves (X'WX + ridge I) d =
    grad F (W = diag s(1 - s), s = sigmoid(X theta)) and halves the step until F does not
    increase. Stops when the full step is below ``tol * (1 + max |theta|)`` or half the Newton
    decrement grad' d is below ``dec_tol * (1 + |F|)`` (the full step is then taken), when no
    halving decreases F (a numerical optimum), or after ``max_iter`` iterations. Returns
    (theta, iterations, converged).
    """
    m = x.shape[1]
    theta = np.zeros(m)
    trial = np.empty(m)
    grad = np.empty(m)
    hess = np.empty((m, m))
    grad_t = np.empty(m)
    hess_t = np.empty((m, m))
    step = np.empty(m)
    lower = np.zeros((m, m))  # scratch of cholesky_solve
    z = np.empty(m)
    f = _logreg_eval(x, t, theta, ridge, grad, hess)
    it = 0
    converged = False
    while it < max_iter:
        it += 1
        # The ridge makes hess SPD in exact arithmetic; a rounding failure of Cholesky on
        # nearly collinear columns is met by a growing diagonal shift (Levenberg).
        shift = 0.0
        scale = 0.0
        for j in range(m):
            scale = max(scale, hess[j, j])
        while not cholesky_solve(hess, grad, lower, z, step):
            shift = max(2.0 * shift, chol_shift * scale)
            for j in range(m):
                hess[j, j] += shift
        big_step = 0.0
        big_theta = 0.0
        decrement = 0.0  # Newton decrement^2 = grad' H^-1 grad, twice the predicted decrease of F
        for j in range(m):
            big_step = max(big_step, abs(step[j]))
            big_theta = max(big_theta, abs(theta[j]))
            decrement += grad[j] * step[j]
        # Converged when the step is small, or when the predicted decrease of F is below
        # dec_tol (1 + |F|): along a direction of curvature ~ridge (tied scores, one class) the
        # step is rounding noise of the gradient divided by ridge and never gets small. The
        # last full step is still taken: it squares the error (quadratic convergence).
        if big_step <= tol * (1.0 + big_theta) or 0.5 * decrement <= dec_tol * (1.0 + abs(f)):
            for j in range(m):
                theta[j] -= step[j]
            converged = True
            break
        alpha = 1.0
        accepted = False
        for _ in range(max_halvings):
            for j in range(m):
                trial[j] = theta[j] - alpha * step[j]
            f_trial = _logreg_eval(x, t, trial, ridge, grad_t, hess_t)
            if f_trial <= f:
                accepted = True
                break
            alpha *= 0.5
        if not accepted:  # F cannot be decreased along the Newton direction: numerical optimum
            converged = True
            break
        f = f_trial
        for j in range(m):
            theta[j] = trial[j]
            grad[j] = grad_t[j]
            for k in range(m):
                hess[j, k] = hess_t[j, k]
    return theta, it, converged


def _newton(x: np.ndarray, t: np.ndarray, intercept: bool) -> np.ndarray:
    """Fit theta of eta = x theta (last column of ones if ``intercept``) by :func:`_logreg_newton`.

    With an intercept the other columns are centred first (and the intercept shifted back
    after): a column that is constant (all scores tied) is then exactly zero, so its
    coefficient stays exactly 0 instead of drifting along a direction of curvature ~ridge by
    gradient rounding / ridge; it also conditions the Hessian. The ridge is
    ``config.LOGREG_RIDGE_MEAN * n`` on the summed loss, i.e. LOGREG_RIDGE_MEAN on the mean.
    """
    x = np.array(x, dtype=np.float64, order="C")  # a copy: centred in place
    n = x.shape[0]
    mu = None
    if intercept:
        mu = x[:, :-1].mean(axis=0)
        x[:, :-1] -= mu
    theta, _, _ = _logreg_newton(
        x,
        np.ascontiguousarray(t, dtype=np.float64),
        config.LOGREG_RIDGE_MEAN * n,
        config.LOGREG_NEWTON_TOL,
        config.LOGREG_DECREMENT_TOL,
        config.LOGREG_MAX_ITER,
        config.LOGREG_MAX_HALVINGS,
        config.LOGREG_CHOLESKY_SHIFT,
    )
    if mu is not None:
        theta[-1] -= float(theta[:-1] @ mu)
    return theta


# --------------------------------------------------------------------------------------------
# Input checks (shapes only; the calibrator layer validates user input)
# --------------------------------------------------------------------------------------------
def _binary_scores(scores) -> np.ndarray:
    s = np.ascontiguousarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"binary scores must be 1-D, got shape {s.shape}")
    return s


def _binary_xy(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    s = _binary_scores(scores)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if y.shape != s.shape:
        raise ValueError(f"labels shape {y.shape} != scores shape {s.shape}")
    if s.size == 0:
        raise ValueError("need at least one labelled score")
    if np.any((y != 0) & (y != 1)):
        raise ValueError("binary labels must be 0 or 1")
    return s, y


def _fitted(v, size: int) -> np.ndarray:
    f = np.ascontiguousarray(v, dtype=np.float64)
    if f.shape != (size,):
        raise ValueError(f"fitted vector must have shape ({size},), got {f.shape}")
    return f


def _clip(s: np.ndarray, eps: float) -> np.ndarray:
    return np.clip(s, eps, 1.0 - eps)


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


# --------------------------------------------------------------------------------------------
# Platt scaling
# --------------------------------------------------------------------------------------------
def platt_fit(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    eps: float = config.PLATT_CLIP_EPS,
    platt_targets: bool = False,
) -> np.ndarray:
    r"""Fit Platt scaling: a logistic regression of the label on the base log-odds.

    With :math:`z_i = \operatorname{logit}(\operatorname{clip}(p_i, \epsilon, 1 - \epsilon))`
    the map is :math:`p' = \sigma(a z + b)`, :math:`\sigma(x) = 1 / (1 + e^{-x})`, and
    :math:`(a, b)` maximise the log-likelihood
    :math:`\sum_i t_i \ln \sigma(a z_i + b) + (1 - t_i) \ln(1 - \sigma(a z_i + b))`
    (Platt 1999, eqs. (1)-(2), with the SVM output f replaced by z). The targets are the labels,
    :math:`t_i = y_i`, or with ``platt_targets=True`` Platt's out-of-sample smoothing (Platt 1999
    eq. (3)): :math:`t_+ = (N_+ + 1) / (N_+ + 2)` for the :math:`N_+` positives and
    :math:`t_- = 1 / (N_- + 2)` for the :math:`N_-` negatives, which keeps the fit away from 0
    and 1 on small or separable calibration sets.

    The fit is Newton's method with step halving (:func:`_logreg_newton`) on the mean log loss
    plus the ridge ``config.LOGREG_RIDGE_MEAN / 2 (a^2 + b'^2)`` (b' the intercept at the mean
    z), so degenerate sets do not raise:

    * one class (labels all 0 or all 1): a ~ 0 and forecasts within ~2e-9 of that class
      (``platt_targets=True``: p' ~ t, i.e. (N + 1) / (N + 2) or 1 / (N + 2));
    * perfectly separable scores: a steep, finite sigmoid (the MLE is infinite);
    * all scores tied (n = 1 included): a = 0 and :math:`\sigma(b)` = the mean (smoothed)
      label (to ~1e-8; a constant map).

    Parameters
    ----------
    scores : ndarray of float64, shape (n,)
        Base probabilities of label 1 (not pre-clipped; 0 and 1 allowed).
    labels : ndarray of int, shape (n,)
        Labels in {0, 1}; n >= 1.
    eps : float
        Clip of p before the logit (``config.PLATT_CLIP_EPS``); stored in the fitted vector.
    platt_targets : bool
        Use Platt's smoothed targets instead of the 0/1 labels.

    Returns
    -------
    ndarray of float64, shape (3,)
        ``[a, b, eps]``.

    References
    ----------
    J. Platt, "Probabilistic outputs for support vector machines and comparisons to regularized
    likelihood methods", Advances in Large Margin Classifiers, 1999.

    Examples
    --------
    >>> import numpy as np
    >>> s = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.9])
    >>> y = np.array([0, 0, 1, 0, 1, 1])
    >>> fitted = platt_fit(s, y)
    >>> fitted.shape, bool(fitted[0] > 0)
    ((3,), True)
    >>> p = platt_predict(fitted, s).p
    >>> bool(np.all(np.diff(p) > 0)), bool(np.all((p > 0) & (p < 1)))
    (True, True)
    >>> one_class = platt_fit(s, np.ones(6, dtype=np.int64), platt_targets=True)
    >>> np.round(platt_predict(one_class, s).p, 4)  # (6 + 1) / (6 + 2) everywhere
    array([0.875, 0.875, 0.875, 0.875, 0.875, 0.875])
    """
    s, y = _binary_xy(scores, labels)
    eps = float(eps)
    z = _logit(_clip(s, eps))
    t = y.astype(np.float64)
    if platt_targets:
        n_pos = float(y.sum())
        n_neg = float(y.size) - n_pos
        t = np.where(y == 1, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    x = np.empty((s.size, 2))
    x[:, 0] = z
    x[:, 1] = 1.0
    a, b = _newton(x, t, True)
    return np.array([a, b, eps])


def platt_predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Apply a Platt map ``[a, b, eps]``: p' = sigmoid(a logit(clip(p, eps)) + b).

    Non-decreasing in p when a >= 0 (strictly increasing on [eps, 1 - eps] when a > 0).

    Parameters
    ----------
    fitted : ndarray of float64, shape (3,)
        From :func:`platt_fit`.
    scores : ndarray of float64, shape (n,)
        Base probabilities of label 1.

    Returns
    -------
    Prediction
        ``p`` of shape (n,).

    Examples
    --------
    >>> import numpy as np
    >>> platt_predict(np.array([1.0, 0.0, 1e-12]), np.array([0.25, 0.5])).p  # identity map
    array([0.25, 0.5 ])
    """
    f = _fitted(fitted, 3)
    a, b, eps = f
    z = _logit(_clip(_binary_scores(scores), eps))
    return Prediction(_sigmoid_np(a * z + b))


def _sigmoid_np(eta: np.ndarray) -> np.ndarray:
    # 1 / (1 + e^{-eta}) in the overflow-free form e^{-|eta|} on the small side
    e = np.exp(-np.abs(eta))
    return np.where(eta >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# --------------------------------------------------------------------------------------------
# Beta calibration
# --------------------------------------------------------------------------------------------
def beta_fit(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    parameters: str = "abm",
    eps: float = config.BETA_CLIP_EPS,
) -> np.ndarray:
    r"""Fit beta calibration (Kull, Silva Filho & Flach 2017).

    The beta calibration map (Kull et al. 2017, eq. (3) and §3.2) is

    .. math:: p' = \frac{1}{1 + 1 / \left(e^c \, p^a / (1 - p)^b\right)}
              = \sigma\left(a \ln p - b \ln(1 - p) + c\right),

    with p clipped to :math:`[\epsilon, 1 - \epsilon]`. It is a logistic regression on the
    features :math:`(\ln p, -\ln(1 - p))` with coefficients (a, b) and intercept c (§3.2). The
    parameterisations are those of the betacal package (version 1.1.0), reproduced exactly:

    * ``"abm"``: all three. If the fitted a < 0, refit with the feature
      :math:`-\ln(1 - p)` only and set a = 0; else if b < 0, refit with :math:`\ln p` only and
      set b = 0 (the package's rule, which keeps the map monotone; the refitted coefficient is
      not constrained in turn);
    * ``"am"``: a = b, i.e. a logistic regression on logit(p) with an intercept (Platt scaling
      on the clipped log-odds);
    * ``"ab"``: m = 1/2, i.e. no intercept on the features :math:`(\ln 2p, \ln 2(1 - p))`,
      giving :math:`c = (a - b) \ln 2`;
    * ``"a"``: a = b and m = 1/2: logit(p) without intercept, c = 0.

    betacal fits with scikit-learn's ``LogisticRegression(C=99999999999)`` (lbfgs, default
    tolerance 1e-4: a penalty ||w||^2 / (2C) = 5e-12 ||w||^2 on the coefficients only, and a
    loosely converged optimiser); here the same problem is solved to Newton precision with the
    ridge ``config.LOGREG_RIDGE_MEAN`` on the mean loss for every parameter (module docstring),
    which also handles the degenerate sets on which betacal raises (one class) or is not
    identified (all tied: a = b = 0 and a constant map, except ``"ab"``/``"a"`` which have no
    intercept and fit the minimum-norm coefficients instead).

    Parameters
    ----------
    scores : ndarray of float64, shape (n,)
        Base probabilities of label 1 (not pre-clipped; 0 and 1 allowed).
    labels : ndarray of int, shape (n,)
        Labels in {0, 1}; n >= 1.
    parameters : {"abm", "ab", "am", "a"}
        Which parameters are fitted (betacal's ``BetaCalibration(parameters=...)``).
    eps : float
        Clip of p (``config.BETA_CLIP_EPS``, betacal's machine epsilon); stored in the fitted
        vector.

    Returns
    -------
    ndarray of float64, shape (4,)
        ``[a, b, c, eps]``; the map is non-decreasing in p when a, b >= 0 and is the identity
        (on the clipped p) at a = b = 1, c = 0.

    References
    ----------
    M. Kull, T. Silva Filho and P. Flach, "Beyond sigmoids: How to obtain well-calibrated
    probabilities from binary classifiers with beta calibration", Electronic Journal of
    Statistics 11 (2017); AISTATS 2017 ("Beta calibration: a well-founded and easily implemented
    improvement on logistic calibration for binary classifiers").

    Examples
    --------
    >>> import numpy as np
    >>> s = np.array([0.05, 0.2, 0.3, 0.45, 0.6, 0.7, 0.8, 0.95])
    >>> y = np.array([0, 0, 1, 0, 0, 1, 1, 1])
    >>> fitted = beta_fit(s, y)
    >>> fitted.shape, bool(fitted[0] >= 0 and fitted[1] >= 0)
    ((4,), True)
    >>> p = beta_predict(fitted, s).p
    >>> bool(np.all(np.diff(p) >= 0))
    True
    >>> beta_predict(np.array([1.0, 1.0, 0.0, 1e-12]), np.array([0.25, 0.5])).p  # identity
    array([0.25, 0.5 ])
    """
    s, y = _binary_xy(scores, labels)
    eps = float(eps)
    p = _clip(s, eps)
    t = y.astype(np.float64)
    n = s.size
    if parameters == "abm":
        x = np.empty((n, 3))
        x[:, 0] = np.log(p)
        x[:, 1] = -np.log1p(-p)
        x[:, 2] = 1.0
        a, b, c = _newton(x, t, True)
        if a < 0.0:  # betacal: refit without ln p, a = 0
            b, c = _newton(x[:, 1:], t, True)
            a = 0.0
        elif b < 0.0:  # betacal: refit without -ln(1 - p), b = 0
            a, c = _newton(x[:, 0::2], t, True)
            b = 0.0
    elif parameters == "am":
        x = np.empty((n, 2))
        x[:, 0] = _logit(p)
        x[:, 1] = 1.0
        a, c = _newton(x, t, True)
        b = a
    elif parameters == "ab":
        x = np.empty((n, 2))
        x[:, 0] = np.log(2.0 * p)
        x[:, 1] = np.log(2.0 * (1.0 - p))  # betacal's feature, computed as it does
        a, w1 = _newton(x, t, False)
        b = -w1
        c = (a - b) * _LN2
    elif parameters == "a":
        x = np.ascontiguousarray(_logit(p)[:, None])
        (a,) = _newton(x, t, False)
        b = a
        c = 0.0
    else:
        raise ValueError(f"parameters must be one of {BETA_PARAMETERS}, got {parameters!r}")
    return np.array([a, b, c, eps], dtype=np.float64)


def beta_predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Apply a beta map ``[a, b, c, eps]``: p' = sigmoid(a ln p - b ln(1 - p) + c), p clipped.

    Parameters
    ----------
    fitted : ndarray of float64, shape (4,)
        From :func:`beta_fit`.
    scores : ndarray of float64, shape (n,)
        Base probabilities of label 1.

    Returns
    -------
    Prediction
        ``p`` of shape (n,).

    Examples
    --------
    >>> import numpy as np
    >>> p = beta_predict(np.array([2.0, 0.5, 0.0, 1e-12]), np.array([0.0, 0.5, 1.0])).p
    >>> bool(np.all(np.diff(p) > 0)), bool(p[0] < 1e-20)
    (True, True)
    """
    a, b, c, eps = _fitted(fitted, 4)
    p = _clip(_binary_scores(scores), eps)
    # a = b (the "am" and "a" maps): one logit, the same rounding as the fit's feature
    eta = a * _logit(p) + c if a == b else a * np.log(p) - b * np.log1p(-p) + c
    return Prediction(_sigmoid_np(eta))


# --------------------------------------------------------------------------------------------
# Temperature scaling
# --------------------------------------------------------------------------------------------
@njit(cache=True)
def _temperature_derivatives(logp, labels, beta):
    """(L'(beta), L''(beta), scale) of L(beta) = sum_i lse_c(beta l_ic) - beta l_{i,y_i}.

    L'(beta) = sum_i E_q[l_i] - l_{i,y_i} and L''(beta) = sum_i Var_q[l_i], q = softmax(beta l_i);
    scale = sum_i |E_q[l_i]| + |l_{i,y_i}| bounds the rounding error of L' (~1e-16 scale).
    """
    n, k = logp.shape
    w = np.empty(k)
    d1 = 0.0
    d2 = 0.0
    scale = 0.0
    for i in range(n):
        mx = logp[i, 0]
        for c in range(1, k):
            mx = max(mx, logp[i, c])
        tot = 0.0
        for c in range(k):
            w[c] = math.exp(beta * (logp[i, c] - mx))
            tot += w[c]
        mean = 0.0
        for c in range(k):
            mean += w[c] * logp[i, c]
        mean /= tot
        var = 0.0
        for c in range(k):
            dv = logp[i, c] - mean
            var += w[c] * dv * dv
        d1 += mean - logp[i, labels[i]]
        d2 += var / tot
        scale += abs(mean) + abs(logp[i, labels[i]])
    return d1, d2, scale


@njit(cache=True)
def _temperature_newton(logp, labels, beta_min, beta_max, tol, rounding, max_iter):
    """Minimise the convex L(beta) over [beta_min, beta_max]; returns (beta, iterations).

    The minimiser is beta_min if L'(beta_min) >= 0, beta_max if L'(beta_max) <= 0, else the
    root of the increasing L' in (beta_min, beta_max), found by Newton from beta = 1 kept
    inside a shrinking
    bracket [lo, hi] (L'(lo) < 0 < L'(hi)), bisecting whenever the Newton point leaves it
    (the rtsafe scheme of Numerical Recipes §9.4). Stops when the step or the bracket is below
    ``tol`` relative, or when |L'| is at its rounding level (``rounding * sum_i |terms|``). If
    every row has one value of l (uniform rows after clipping), L is constant and beta = 1 (the
    identity) is returned.
    """
    n, k = logp.shape
    flat = True
    for i in range(n):
        for c in range(1, k):
            if logp[i, c] != logp[i, 0]:
                flat = False
    if flat:
        return 1.0, 0
    d0, _, _ = _temperature_derivatives(logp, labels, beta_min)
    if d0 >= 0.0:
        return beta_min, 1
    dm, _, _ = _temperature_derivatives(logp, labels, beta_max)
    if dm <= 0.0:
        return beta_max, 2
    lo = beta_min
    hi = beta_max
    beta = min(max(1.0, beta_min), beta_max)
    it = 2
    while it < max_iter:
        it += 1
        d1, d2, scale = _temperature_derivatives(logp, labels, beta)
        if abs(d1) <= rounding * scale:  # L'(beta) = 0 up to its rounding: Newton would jitter
            return beta, it
        if d1 < 0.0:
            lo = beta
        else:
            hi = beta
        nxt = beta - d1 / d2 if d2 > 0.0 else -1.0
        if not (lo < nxt < hi):
            nxt = 0.5 * (lo + hi)
        if abs(nxt - beta) <= tol * max(1.0, beta) or hi - lo <= tol * max(1.0, lo):
            return nxt, it
        beta = nxt
    return beta, it


def _multiclass_scores(scores) -> tuple[np.ndarray, bool]:
    """(n, K) scores and whether the input was binary (n,) (then stacked as [1 - p, p])."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 1:
        return np.ascontiguousarray(np.stack([1.0 - s, s], axis=1)), True
    if s.ndim != 2 or s.shape[1] < 2:
        raise ValueError(f"scores must be (n,) or (n, K >= 2), got shape {s.shape}")
    return np.ascontiguousarray(s), False


def _clipped_log(s: np.ndarray, eps: float) -> np.ndarray:
    return np.log(np.maximum(s, eps))


def temperature_fit(
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    eps: float = config.TEMPERATURE_CLIP_EPS,
) -> np.ndarray:
    r"""Fit temperature scaling (Guo, Pleiss, Sun & Weinberger 2017, §4.2).

    The map is :math:`p'_c \propto p_c^{1/T}`, i.e. :math:`p' = \operatorname{softmax}(\ln p / T)`
    (Guo et al. 2017 apply softmax(z / T) to the logits z; ln p equals the logits up to a
    per-row constant, which softmax ignores). With :math:`\beta = 1/T` and
    :math:`\ell_{ic} = \ln \max(p_{ic}, \epsilon)`, :math:`\beta` minimises the log loss

    .. math:: L(\beta) = \sum_i \Big[\ln \sum_c e^{\beta \ell_{ic}} - \beta \ell_{i y_i}\Big],

    convex in :math:`\beta` with :math:`L' = \sum_i E_q[\ell_i] - \ell_{iy_i}` and
    :math:`L'' = \sum_i \operatorname{Var}_q[\ell_i]` (q = p'), over
    :math:`[\beta_{min}, \beta_{max}]` (``config.TEMPERATURE_MIN_INV_T``,
    ``config.TEMPERATURE_MAX_INV_T``), by safeguarded Newton to the relative tolerance
    ``config.TEMPERATURE_TOL``. The bounds cover the degenerate sets: :math:`\beta_{min} > 0`
    when the scores are uninformative or anti-informative (L'(beta_min) >= 0; the unconstrained
    minimiser 1/T = 0 would make every forecast uniform and lose the argmax, which temperature
    scaling keeps by construction), :math:`\beta_{max}` when the argmax is always right (the
    minimiser is at infinity), :math:`\beta = 1` when every clipped row is uniform.

    Binary scores of shape (n,) are the rows :math:`[1 - p, p]`: the map is then
    :math:`\sigma(\beta (\ln \max(p, \epsilon) - \ln \max(1 - p, \epsilon)))`, i.e.
    :math:`\sigma(\beta \operatorname{logit} p)` on the clipped p, non-decreasing in p.

    Parameters
    ----------
    scores : ndarray of float64, shape (n, K) or (n,)
        Base probabilities (rows summing to 1), or binary P(label 1).
    labels : ndarray of int, shape (n,)
        Labels in 0..K-1 (binary: 0, 1); n >= 1.
    eps : float
        Floor of p_c before the log (``config.TEMPERATURE_CLIP_EPS``); stored.

    Returns
    -------
    ndarray of float64, shape (2,)
        ``[1/T, eps]`` (the inverse temperature, finite even when T is infinite).

    References
    ----------
    C. Guo, G. Pleiss, Y. Sun and K. Q. Weinberger, "On calibration of modern neural networks",
    ICML 2017.

    Examples
    --------
    >>> import numpy as np
    >>> s = np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6], [0.7, 0.2, 0.1]])
    >>> y = np.array([0, 1, 0, 1])
    >>> fitted = temperature_fit(s, y)
    >>> bool(0.0 < fitted[0] < 1.0)  # overconfident base: T > 1
    True
    >>> p = temperature_predict(fitted, s).p
    >>> p.shape, bool(np.allclose(p.sum(axis=1), 1.0))
    ((4, 3), True)
    """
    s, _ = _multiclass_scores(scores)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if y.shape != (s.shape[0],):
        raise ValueError(f"labels shape {y.shape} != ({s.shape[0]},)")
    if y.size == 0:
        raise ValueError("need at least one labelled score")
    if y.min() < 0 or y.max() >= s.shape[1]:
        raise ValueError(f"labels must be in 0..{s.shape[1] - 1}")
    eps = float(eps)
    beta, _ = _temperature_newton(
        _clipped_log(s, eps),
        y,
        config.TEMPERATURE_MIN_INV_T,
        config.TEMPERATURE_MAX_INV_T,
        config.TEMPERATURE_TOL,
        config.TEMPERATURE_DERIV_ROUNDING,
        config.TEMPERATURE_MAX_ITER,
    )
    return np.array([beta, eps])


def temperature_predict(fitted: np.ndarray, scores: np.ndarray) -> Prediction:
    """Apply a temperature map ``[1/T, eps]``: p' = softmax(ln max(p, eps) / T).

    Parameters
    ----------
    fitted : ndarray of float64, shape (2,)
        From :func:`temperature_fit`.
    scores : ndarray of float64, shape (n, K) or (n,)
        Base probabilities; binary (n,) gives binary (n,) output.

    Returns
    -------
    Prediction
        ``p`` of the shape of ``scores``; multiclass rows sum to 1.

    Examples
    --------
    >>> import numpy as np
    >>> temperature_predict(np.array([0.0, 1e-12]), np.array([[0.9, 0.1], [0.3, 0.7]])).p
    array([[0.5, 0.5],
           [0.5, 0.5]])
    >>> temperature_predict(np.array([2.0, 1e-12]), np.array([0.25, 0.5])).p  # p^2 / (...)
    array([0.1, 0.5])
    """
    beta, eps = _fitted(fitted, 2)
    s, binary = _multiclass_scores(scores)
    z = beta * _clipped_log(s, eps)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    return Prediction(p[:, 1].copy() if binary else p)
