"""Performance estimated from the forecasts alone: the log loss, Brier score and accuracy a set
of forecasts would have if they were calibrated, with an interval, before any label arrives
(issue #35, part 1: the pure computation; its table and runners are the next step).

If a forecast p of a binary event is calibrated, its label is Y ~ Bernoulli(p) (K classes:
Y ~ Categorical(p)), so each per-event loss is a random variable whose mean and variance are
functions of p alone. NannyML's CBPE uses the same idea for classification metrics ("confidence
based performance estimation", which assumes calibrated probabilities); calpipe's protected
forecasts are the ones it is meant for, and the base's estimate is shown beside them because a
miscalibrated base gives a misleading one.

Per event, with q = 1 - p (binary) and the conventions of :mod:`calpipe.metrics` (log loss
clips the probability of the outcome below at ``LOG_LOSS_FLOOR``; Brier is (p - y)^2 binary and
sum_c (p_c - 1{y = c})^2 for K classes; accuracy guesses 1 when p >= 0.5, the argmax for K):

==============  =================================  =========================================
loss            mean                               variance
==============  =================================  =========================================
log loss        H = -p ln p - q ln q               p q (ln p - ln q)^2
                (K: -sum p_c ln p_c)               (K: sum p_c (ln p_c)^2 - H^2)
Brier           p q                                p q (1 - 2p)^2
                (K: 1 - sum p_c^2)                 (K: 4 (sum p_c^3 - (sum p_c^2)^2))
accuracy        m = max(p, q) (K: max_c p_c)       m (1 - m)
==============  =================================  =========================================

(Brier binary: the loss is q^2 with probability p and p^2 with probability q, so its mean is
p q^2 + q p^2 = p q and its second moment p q^4 + q p^4 = p q (1 - 3 p q), whence the variance
p q (1 - 3 p q) - p^2 q^2 = p q (1 - 4 p q) = p q (1 - 2p)^2. K classes: the loss is
sum_c p_c^2 - 2 p_Y + 1, random only through p_Y, whose variance is sum p_c^3 - (sum p_c^2)^2.)

Over the n events of a group (a stream's night), the labels being independent given the
forecasts, the mean loss has mean (1/n) sum_i mean_i and variance (1/n^2) sum_i variance_i; the
interval is the normal one, mean +- z sd with z the standard normal's (1 + level) / 2 quantile
(:data:`calpipe.config.ESTIMATE_LEVEL`). It is given only for groups of at least
:data:`calpipe.config.ESTIMATE_MIN_EVENTS` events, where the normal approximation of a mean of
bounded terms holds closely enough (the coverage test, ``tests/test_estimates.py``); below that
the bounds are NaN and the expected values are still given.

Example
-------
>>> import numpy as np
>>> est = grouped_estimates(np.array([0.9, 0.5, 0.2, 0.7]), np.array([0, 0, 1, 1]), 2)
>>> est["expected_log_loss"].round(4).tolist(), est["events"].tolist()
([0.5091, 0.5556], [2, 2])
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from calpipe import config
from calpipe.kernels.grouping import chunked_group_sums
from calpipe.metrics import LOG_LOSS_FLOOR

#: The estimates :func:`grouped_estimates` returns besides ``events``: (name, which loss).
ESTIMATES = ("log_loss", "brier", "accuracy")


def expected_terms(p: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each event's (mean, variance) of its log loss, Brier loss and accuracy if its label is
    drawn from its forecast (the module's table): ``{"log_loss": (mean, var), ...}``.

    ``p``: (n,) probabilities of label 1, or (n, K) class probabilities (rows summing to 1).

    >>> m, v = expected_terms(np.array([0.5]))["log_loss"]
    >>> round(float(m[0]), 6), float(v[0])
    (0.693147, 0.0)
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 1:
        q = 1.0 - p
        lp = np.log(np.maximum(p, LOG_LOSS_FLOOR))
        lq = np.log(np.maximum(q, LOG_LOSS_FLOOR))
        pq = p * q
        m = np.maximum(p, q)
        return {
            "log_loss": (-(p * lp + q * lq), pq * (lp - lq) ** 2),
            "brier": (pq, pq * (1.0 - 2.0 * p) ** 2),
            "accuracy": (m, m * (1.0 - m)),
        }
    if p.ndim != 2:
        raise ValueError(f"forecasts must be (n,) or (n, K); got shape {p.shape}")
    lp = np.log(np.maximum(p, LOG_LOSS_FLOOR))
    h = -(p * lp).sum(axis=1)
    s2 = (p * p).sum(axis=1)
    s3 = (p * p * p).sum(axis=1)
    m = p.max(axis=1)
    return {
        # sum p ln^2 p - H^2 >= 0 in exact arithmetic; rounding can leave -1e-17
        "log_loss": (h, np.maximum((p * lp * lp).sum(axis=1) - h * h, 0.0)),
        "brier": (1.0 - s2, np.maximum(4.0 * (s3 - s2 * s2), 0.0)),
        "accuracy": (m, m * (1.0 - m)),
    }


def normal_quantile(level: float) -> float:
    """z with P(|Z| <= z) = ``level`` for a standard normal Z (the two-sided interval's
    half-width in standard deviations): 1.6449 for 0.90.

    >>> round(normal_quantile(0.9), 4)
    1.6449
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf((1.0 + level) / 2.0)


def grouped_estimates(
    p: np.ndarray,
    ids: np.ndarray,
    n_groups: int,
    *,
    level: float = config.ESTIMATE_LEVEL,
    min_events: int = config.ESTIMATE_MIN_EVENTS,
) -> dict[str, np.ndarray]:
    """The estimates of every group at once: ``events`` (int64) and, for each loss of
    :data:`ESTIMATES`, ``expected_<loss>`` (NaN for a group without events) with its interval
    ``expected_<loss>_low`` / ``_high`` (NaN below ``min_events`` events).

    ``p`` as :func:`expected_terms`; ``ids``: dense group ids in [0, ``n_groups``) (e.g.
    :func:`calpipe.engine.contract.stream_ids`). Sums by ``np.bincount`` in row order, as
    :mod:`calpipe.metrics`' grouped forms: the same rows in the same order give the same bits.
    """
    ids = np.asarray(ids, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    if ids.shape[0] != np.shape(p)[0]:
        raise ValueError(f"ids has {ids.shape[0]} rows, the forecasts {np.shape(p)[0]}")
    n = np.bincount(ids, minlength=n_groups).astype(np.int64)
    z = normal_quantile(level)
    out: dict[str, np.ndarray] = {"events": n}
    # every loss's (mean, variance) terms summed per group in row order, chunk by chunk: the
    # whole night's terms were a dozen 10M-row temporaries (kernels.grouping.chunked_group_sums)
    sums = chunked_group_sums(
        lambda rows: [t for pair in expected_terms(p[rows]).values() for t in pair],
        ids.shape[0], ids, n_groups, 2 * len(ESTIMATES),
    )  # fmt: skip
    with np.errstate(invalid="ignore", divide="ignore"):
        for k, name in enumerate(ESTIMATES):
            mu = sums[2 * k] / n
            sd = np.sqrt(sums[2 * k + 1]) / n
            half = np.where(n >= min_events, z * sd, np.nan)
            out[f"expected_{name}"] = mu
            out[f"expected_{name}_low"] = mu - half
            out[f"expected_{name}_high"] = mu + half
    return out


__all__ = ["ESTIMATES", "expected_terms", "grouped_estimates", "normal_quantile"]
