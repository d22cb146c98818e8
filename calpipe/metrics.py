"""Forecast quality: log loss, Brier, accuracy, ECE, smooth ECE, the CORP decomposition,
reliability bins, each defined once here in two forms that agree to rounding (tested):

* polars expressions (:func:`log_loss`, :func:`brier`, :func:`accuracy`, :func:`ece`,
  :func:`smooth_ece`, :func:`corp`, :func:`reliability_table`): a ``pl.Expr`` usable in
  ``select`` and ``group_by().agg`` alike, the definition a reader checks;
* grouped numpy forms (:func:`grouped_log_loss`, :func:`grouped_brier`, :func:`grouped_accuracy`,
  :func:`grouped_ece`, :func:`grouped_smooth_ece`, :func:`grouped_corp`,
  :func:`grouped_reliability`, :func:`grouped_mean`): every group of a frame
  at once as per-group sums (``np.bincount`` over a dense group id, e.g. from
  :func:`calpipe.engine.contract.stream_ids`). A monitoring day is millions of rows in a thousand streams,
  where polars' per-group expressions cost several times more time and memory. The sums run in
  row order, so the same rows in the same order give the same bits.

Binary forecasts are the probability of label 1 (a Float64 column, a 1-d array); multiclass
forecasts are list/array columns of class probabilities (an (n, K) array). Rows with a null label
(NaN in the numpy forms) are ignored: their outcome is unknown. ECE and reliability bins are
:data:`calpipe.config.ECE_BINS` equal-width bins on [0, 1] unless told otherwise.

The smooth ECE (Błasiok & Nakkiran 2024) replaces the ECE's bins by a reflected Gaussian kernel
whose width is chosen by the data (the fixed point sigma* = smECE_sigma*), so it has no binning
parameter, is continuous in the forecasts and is within constant factors of the distance to the
nearest calibrated predictor; the CORP decomposition (Dimitriadis, Gneiting & Jordan 2021) splits
a mean score into miscalibration - discrimination + uncertainty with the PAV recalibration. Both
are defined for binary forecasts; for K classes :func:`smooth_ece` takes the usual top-label
reduction (confidence max_c p_c against "the argmax was right", as relplot's
``multiclass_logits_to_confidences``); :func:`grouped_corp_classwise` sums the binary CORP
decomposition over the K one-vs-rest problems, which decomposes the K-class Brier score. The
loops are in :mod:`calpipe.kernels.diagnostics`.

The smooth ECE of one time-ordered stream comes with a circular block bootstrap interval
(:func:`smooth_ece_interval`, :func:`smooth_ece_difference_interval` for two forecasters of the
same outcomes; Politis & Romano 1992, block length :func:`bootstrap_block_length`).

Example
-------
>>> import polars as pl
>>> df = pl.DataFrame({"p": [0.9, 0.2, 0.6], "y": [1, 0, 0]})
>>> df.select(
...     log_loss("p", "y").alias("log_loss"),
...     brier("p", "y").alias("brier"),
...     accuracy("p", "y").alias("accuracy"),
... ).select(pl.all().round(4)).row(0)
(0.4149, 0.1367, 0.6667)
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from calpipe import config
from calpipe.kernels.diagnostics import bin_cells, corp_groups, smooth_ece_groups
from calpipe.kernels.grouping import chunked_group_sums

#: Probabilities are clipped to [LOG_LOSS_FLOOR, 1] inside log loss so that a 0 forecast of the
#: outcome costs -ln(1e-15) = 34.5 nats instead of infinity (scikit-learn's convention).
LOG_LOSS_FLOOR = 1e-15


def _vector(p: str) -> pl.Expr:
    """A multiclass forecast column as List[Float64], whether it is stored as List or Array."""
    return pl.col(p).cast(pl.List(pl.Float64))


def _p_of_label(p: str, y: str, multiclass: bool) -> pl.Expr:
    """The probability the forecast gave to the label that occurred."""
    if multiclass:
        return _vector(p).list.get(pl.col(y).cast(pl.Int64), null_on_oob=True)
    return pl.when(pl.col(y) == 1).then(pl.col(p)).otherwise(1.0 - pl.col(p))


def _labelled(expr: pl.Expr, y: str) -> pl.Expr:
    return expr.filter(pl.col(y).is_not_null())


def log_loss(p: str, y: str, *, multiclass: bool = False, base: float = math.e) -> pl.Expr:
    """Mean log loss -log p(y) (natural log by default; ``base=10`` for decimal)."""
    q = _p_of_label(p, y, multiclass).clip(LOG_LOSS_FLOOR, 1.0)
    return _labelled(-(q.log(base)), y).mean()


def cumulative_log10_loss(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Cumulative decimal log loss -sum log10 p(y) (paper 000 §5's measure)."""
    q = _p_of_label(p, y, multiclass).clip(LOG_LOSS_FLOOR, 1.0)
    return _labelled(-(q.log(10)), y).sum()


def brier(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Mean Brier loss: (p - y)^2 binary; sum_c (p_c - 1{y = c})^2 for K classes."""
    if multiclass:
        sq = _vector(p).list.eval(pl.element() ** 2).list.sum()
        expr = sq - 2.0 * _p_of_label(p, y, True) + 1.0
    else:
        expr = (pl.col(p) - pl.col(y).cast(pl.Float64)) ** 2
    return _labelled(expr, y).mean()


def accuracy(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Share of labelled events whose most probable class is the label (p >= 0.5 -> 1 binary)."""
    if multiclass:
        hit = _vector(p).list.arg_max() == pl.col(y).cast(pl.UInt32)
    else:
        hit = (pl.col(p) >= 0.5).cast(pl.Int64) == pl.col(y).cast(pl.Int64)
    return _labelled(hit.cast(pl.Float64), y).mean()


def ece(p: str, y: str, *, n_bins: int = config.ECE_BINS) -> pl.Expr:
    """Binary expected calibration error with ``n_bins`` equal-width bins on [0, 1]:
    sum_b (n_b / n) |mean p in b - mean y in b|."""
    b = (pl.col(p) * n_bins).floor().clip(0, n_bins - 1)
    yy = pl.col(y).cast(pl.Float64)
    labelled = pl.col(y).is_not_null()
    n = labelled.sum()
    # Per-bin gaps via over(): each row carries its bin's |mean p - mean y| / n_b share.
    pm = pl.col(p).filter(labelled).mean().over(b)
    ym = yy.filter(labelled).mean().over(b)
    share = pl.when(labelled).then((pm - ym).abs()).otherwise(0.0)
    return (share.sum() / n).fill_nan(None)


def _pair(values: pl.Series, p: str, y: str, multiclass: bool) -> tuple[np.ndarray, np.ndarray]:
    """(forecasts, labels) of the labelled rows of a struct series of ``p`` and ``y``, binary or
    reduced to the top label (confidence, correct) for K classes."""
    df = values.struct.unnest().filter(pl.col(y).is_not_null())
    yy = df[y].cast(pl.Float64).to_numpy()
    if multiclass:
        return top_label(np.asarray(df[p].cast(pl.List(pl.Float64)).to_list(), float), yy)
    return df[p].cast(pl.Float64).to_numpy(), yy


def top_label(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top-label binary problem of (n, K) forecasts: (max_c p_c, 1.0 where the argmax is the
    label else 0.0), ties to the lowest class as ``argmax``.

    >>> top_label(np.array([[0.7, 0.3], [0.4, 0.6]]), np.array([0.0, 0.0]))
    (array([0.7, 0.6]), array([1., 0.]))
    """
    return p.max(axis=1), (p.argmax(axis=1) == y).astype(np.float64)


def smooth_ece(p: str, y: str, *, multiclass: bool = False) -> pl.Expr:
    """Smooth ECE (Błasiok & Nakkiran, ICLR 2024, Definitions 5-6) of the labelled rows.

    smECE_sigma = int_0^1 |(1/n) sum_i K_sigma(t, p_i) (y_i - p_i)| dt with the reflected
    Gaussian kernel K_sigma on [0, 1], at the bandwidth sigma* where smECE_sigma* = sigma*
    (:mod:`calpipe.kernels.diagnostics` states the numerics). K classes: of the top label
    (:func:`top_label`). Null for no labelled row.

    Residuals of one sign cannot cancel, so there it is the mean |y - p| whatever sigma:

    >>> df = pl.DataFrame({"p": [0.2, 0.2, 0.8, 0.8], "y": [0, 1, 1, 1]})
    >>> round(df.select(smooth_ece("p", "y")).item(), 4)
    0.25
    """

    def fn(s: pl.Series) -> float | None:
        f, yy = _pair(s, p, y, multiclass)
        if f.size == 0:
            return None
        return float(grouped_smooth_ece(f, yy, np.zeros(f.size, np.int64), 1)[0])

    return pl.struct(p, y).map_batches(
        lambda s: pl.Series([fn(s)], dtype=pl.Float64), return_dtype=pl.Float64,
        returns_scalar=True,
    )  # fmt: skip


#: Field names of :func:`corp`'s struct, in order.
CORP_FIELDS = ("miscalibration", "discrimination", "uncertainty", "score")


def corp(p: str, y: str, *, score: str = "log", multiclass: bool = False) -> pl.Expr:
    """CORP decomposition (Dimitriadis, Gneiting & Jordan, PNAS 2021, eqs. (2)-(4)) of the mean
    ``score`` ("log": natural log loss as :func:`log_loss`; "brier") of binary forecasts: a struct
    {miscalibration, discrimination, uncertainty, score} with score = MCB - DSC + UNC, from the
    PAV recalibration of the forecasts (ties pooled) and the climatology mean y. K classes
    (``multiclass``): the classwise decomposition (:func:`grouped_corp_classwise`: "brier" is
    the K-class Brier score's, "log" the one-vs-rest log score's, not the log loss's).

    >>> df = pl.DataFrame({"p": [0.1, 0.4, 0.35, 0.8], "y": [0, 0, 1, 1]})
    >>> d = df.select(corp("p", "y", score="brier")).item()
    >>> {k: round(v, 4) for k, v in d.items()}
    {'miscalibration': 0.0331, 'discrimination': 0.125, 'uncertainty': 0.25, 'score': 0.1581}
    """
    if score not in ("log", "brier"):
        raise ValueError(f"corp: score must be 'log' or 'brier', got {score!r}")
    dtype = pl.Struct({f: pl.Float64 for f in CORP_FIELDS})

    def fn(s: pl.Series) -> pl.Series:
        if multiclass:
            df = s.struct.unnest().filter(pl.col(y).is_not_null())
            f = np.asarray(df[p].cast(pl.List(pl.Float64)).to_list(), float)
            yy = df[y].cast(pl.Float64).to_numpy()
            # (no labelled row: an empty 1-d array, which the binary form turns into nulls)
            grouped = grouped_corp_classwise if f.size else grouped_corp
        else:
            f, yy = _pair(s, p, y, False)
            grouped = grouped_corp
        d = grouped(f, yy, np.zeros(len(yy), np.int64), 1)
        row = {k: float(d[f"{score}_{k}"][0]) if len(yy) else None for k in CORP_FIELDS}
        return pl.Series([row], dtype=dtype)

    return pl.struct(p, y).map_batches(fn, return_dtype=dtype, returns_scalar=True)


def reliability_table(
    df: pl.DataFrame, p: str, y: str, *, n_bins: int = config.ECE_BINS
) -> pl.DataFrame:
    """Reliability-diagram bins: bin, count, mean forecast, observed frequency."""
    return (
        df.filter(pl.col(y).is_not_null())
        .with_columns((pl.col(p) * n_bins).floor().clip(0, n_bins - 1).cast(pl.Int32).alias("bin"))
        .group_by("bin")
        .agg(
            pl.len().alias("count"),
            pl.col(p).mean().alias("mean_forecast"),
            pl.col(y).cast(pl.Float64).mean().alias("observed"),
        )
        .sort("bin")
    )


def base_vs_protected(
    base: str, protected: str, y: str, *, multiclass: bool = False
) -> list[pl.Expr]:
    """Mean log loss and Brier of the base and of the protected forecasts, named
    ``base_log_loss``, ``protected_log_loss``, ``base_brier``, ``protected_brier``."""
    return [
        log_loss(base, y, multiclass=multiclass).alias("base_log_loss"),
        log_loss(protected, y, multiclass=multiclass).alias("protected_log_loss"),
        brier(base, y, multiclass=multiclass).alias("base_brier"),
        brier(protected, y, multiclass=multiclass).alias("protected_brier"),
    ]


def alarm(log10_martingale: str) -> pl.Expr:
    """True where the test martingale has reached the alarm level (S >= 100, Ville)."""
    return pl.col(log10_martingale) >= config.ALARM_LOG10_THRESHOLD


# ----------------------------------------------------------------------------------------------
# Grouped numpy forms: every group at once
# ----------------------------------------------------------------------------------------------
def _labelled_rows(
    p: np.ndarray, y: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(p, y, ids)`` of the rows whose label is known (``y`` not NaN); the arrays themselves,
    not copies, when every row is labelled (a caller that subsets once passes them on free)."""
    y = np.asarray(y, dtype=np.float64)
    labelled = ~np.isnan(y)
    if labelled.all():
        return p, y, ids
    return p[labelled], y[labelled], ids[labelled]


def _per_group(sums: np.ndarray, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """``sums`` divided by each group's row count: NaN for a group without rows."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / np.bincount(ids, minlength=n_groups)


def _sums(term_of, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """``np.bincount(ids, weights=term, minlength=n_groups)`` of one per-row term, to the bit,
    formed a chunk of rows at a time (:func:`calpipe.kernels.grouping.chunked_group_sums`: a
    night's whole-length temporaries were first-touch page faults)."""
    return chunked_group_sums(term_of, ids.shape[0], ids, n_groups, 1)[0]


def _p_of_label_np(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The probability the forecast gave to the label that occurred (a new array)."""
    if p.ndim == 2:
        return np.take_along_axis(p, y.astype(np.int64)[:, None], axis=1)[:, 0]
    return np.where(y == 1.0, p, 1.0 - p)


def grouped_max(v: np.ndarray, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """Largest ``v`` per group (``ids``: dense group ids in [0, n_groups)); -inf for an empty
    group.

    >>> grouped_max(np.array([1.0, 2.0, 4.0]), np.array([0, 1, 1]), 3).tolist()
    [1.0, 4.0, -inf]
    """
    out = np.full(n_groups, -np.inf)
    np.maximum.at(out, ids, v)
    return out


def grouped_mean(v: np.ndarray, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """Mean of ``v`` per group (``ids``: dense group ids in [0, n_groups)); NaN for an empty group.

    >>> grouped_mean(np.array([1.0, 2.0, 4.0]), np.array([0, 1, 1]), 3).tolist()
    [1.0, 3.0, nan]
    """
    return _per_group(np.bincount(ids, weights=v, minlength=n_groups), ids, n_groups)


def grouped_log_loss(p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """:func:`log_loss` (natural) of every group: p(y) clipped below at :data:`LOG_LOSS_FLOOR`.

    ``p``: (n,) probabilities of label 1, or (n, K) class probabilities; ``y``: labels as floats,
    NaN = unknown (ignored); ``ids``: dense group ids. NaN for a group without labelled rows.

    >>> p, y = np.array([0.9, 0.2, 0.6, 0.5]), np.array([1.0, 0.0, 0.0, np.nan])
    >>> grouped_log_loss(p, y, np.array([0, 0, 1, 1]), 2).round(4).tolist()
    [0.1643, 0.9163]
    """
    p, y, ids = _labelled_rows(p, y, ids)

    def losses(rows: slice) -> list[np.ndarray]:
        q = _p_of_label_np(p[rows], y[rows])
        return [-np.log(np.clip(q, LOG_LOSS_FLOOR, 1.0, out=q))]

    return _per_group(_sums(losses, ids, n_groups), ids, n_groups)


def grouped_brier(p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """:func:`brier` of every group: (p - y)^2 binary, sum_c (p_c - 1{y = c})^2 for (n, K) ``p``
    (arguments as :func:`grouped_log_loss`)."""
    p, y, ids = _labelled_rows(p, y, ids)

    def squares(rows: slice) -> list[np.ndarray]:
        pr, yr = p[rows], y[rows]
        if pr.ndim == 2:
            return [(pr * pr).sum(axis=1) - 2.0 * _p_of_label_np(pr, yr) + 1.0]
        return [(pr - yr) ** 2]

    return _per_group(_sums(squares, ids, n_groups), ids, n_groups)


def grouped_accuracy(p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int) -> np.ndarray:
    """:func:`accuracy` of every group: the share of labelled rows whose most probable class is
    the label (p >= 0.5 -> 1 binary; arguments as :func:`grouped_log_loss`)."""
    p, y, ids = _labelled_rows(p, y, ids)

    def hits(rows: slice) -> list[np.ndarray]:
        pr = p[rows]
        guess = pr.argmax(axis=1) if pr.ndim == 2 else (pr >= 0.5)
        return [(guess == y[rows]).astype(np.float64)]

    return _per_group(_sums(hits, ids, n_groups), ids, n_groups)


def _bin_cells(
    p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, sum p, sum y) of every (group, bin) cell, each (n_groups, n_bins)
    (:func:`calpipe.kernels.diagnostics.bin_cells`)."""
    count, sum_p, sum_y = bin_cells(
        np.ascontiguousarray(p, dtype=np.float64),
        np.ascontiguousarray(y, dtype=np.float64),
        np.ascontiguousarray(ids, dtype=np.int64),
        int(n_groups),
        int(n_bins),
    )
    shape = (n_groups, n_bins)
    return count.reshape(shape), sum_p.reshape(shape), sum_y.reshape(shape)


def grouped_ece(
    p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int, *, n_bins: int = config.ECE_BINS
) -> np.ndarray:
    """:func:`ece` of every group (binary ``p``; arguments as :func:`grouped_log_loss`).

    ECE = sum_b (n_b / n) |mean p in b - mean y in b| = sum_b |sum p in b - sum y in b| / n: two
    sums per (group, bin) cell, no per-bin means.

    >>> p, y = np.array([0.05, 0.15, 0.9, 0.8]), np.array([0.0, 1.0, 1.0, np.nan])
    >>> grouped_ece(p, y, np.array([0, 0, 1, 1]), 2).round(4).tolist()
    [0.45, 0.1]
    """
    p, y, ids = _labelled_rows(p, y, ids)
    count, sum_p, sum_y = _bin_cells(p, y, ids, n_groups, n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(sum_p - sum_y).sum(axis=1) / count.sum(axis=1)


def grouped_reliability(
    p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int, *, n_bins: int = config.ECE_BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`reliability_table` of every group: ``(count, mean_forecast, observed)``, each
    (n_groups, n_bins), bin b of group g in row g; an empty bin has count 0 and NaN means
    (binary ``p``; arguments as :func:`grouped_log_loss`)."""
    p, y, ids = _labelled_rows(p, y, ids)
    count, sum_p, sum_y = _bin_cells(p, y, ids, n_groups, n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return count, sum_p / count, sum_y / count


def grouped_smooth_ece(
    p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int, *, return_sigma: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """:func:`smooth_ece` of every group (binary ``p``, or (n, K) reduced to the top label;
    arguments as :func:`grouped_log_loss`), and with ``return_sigma`` the bandwidths sigma*.

    >>> p, y = np.array([0.2, 0.2, 0.8, 0.8, 0.5]), np.array([0.0, 1.0, 1.0, 1.0, np.nan])
    >>> grouped_smooth_ece(p, y, np.array([0, 0, 0, 0, 1]), 2).round(4).tolist()
    [0.25, nan]
    """
    p, y, ids = _labelled_rows(p, y, ids)
    if p.ndim == 2:
        p, y = top_label(p, y)
    value, sigma = smooth_ece_groups(
        np.ascontiguousarray(p, dtype=np.float64),
        np.ascontiguousarray(y, dtype=np.float64),
        np.ascontiguousarray(ids, dtype=np.int64),
        int(n_groups),
        config.SMOOTH_ECE_MIN_SIGMA,
        config.SMOOTH_ECE_POINTS_PER_SIGMA,
        config.SMOOTH_ECE_RTOL,
    )
    return (value, sigma) if return_sigma else value


def grouped_corp(
    p: np.ndarray,
    y: np.ndarray,
    ids: np.ndarray,
    n_groups: int,
    *,
    log_score: np.ndarray | None = None,
    brier_score: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """:func:`corp` of every group for both scores (binary ``p``; arguments as
    :func:`grouped_log_loss`): arrays ``{log,brier}_{miscalibration,discrimination,uncertainty,
    score}``, NaN for a group without labelled rows. ``log_score`` is :func:`grouped_log_loss`
    and ``brier_score`` :func:`grouped_brier`, so score = MCB - DSC + UNC to rounding; a caller
    that has computed them passes them in.

    Examples
    --------
    >>> p, y = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0.0, 0.0, 1.0, 1.0])
    >>> d = grouped_corp(p, y, np.zeros(4, np.int64), 1)
    >>> round(float(d["brier_miscalibration"][0]), 4), round(float(d["log_uncertainty"][0]), 4)
    (0.0331, 0.6931)
    """
    if np.ndim(p) != 1:
        raise ValueError("grouped_corp: binary forecasts only (a 1-d array of P(y = 1))")
    p, y, ids = _labelled_rows(p, y, ids)
    out = corp_groups(
        np.ascontiguousarray(p, dtype=np.float64),
        np.ascontiguousarray(y, dtype=np.float64),
        np.ascontiguousarray(ids, dtype=np.int64),
        int(n_groups),
    )
    scores = {
        "log": grouped_log_loss(p, y, ids, n_groups) if log_score is None else log_score,
        "brier": grouped_brier(p, y, ids, n_groups) if brier_score is None else brier_score,
    }
    res: dict[str, np.ndarray] = {}
    for k, (name, s) in enumerate(scores.items()):
        fit, clim = out[:, k], out[:, 2 + k]
        res[f"{name}_miscalibration"] = s - fit
        res[f"{name}_discrimination"] = clim - fit
        res[f"{name}_uncertainty"] = clim
        res[f"{name}_score"] = s
    return res


def grouped_corp_classwise(
    p: np.ndarray, y: np.ndarray, ids: np.ndarray, n_groups: int
) -> dict[str, np.ndarray]:
    """The classwise (one-vs-rest) CORP decomposition of (n, K) forecasts, every group (arguments
    as :func:`grouped_log_loss`; keys as :func:`grouped_corp`): the binary decomposition of
    class c's forecast ``p[:, c]`` against 1{y = c} (:func:`grouped_corp`, PAV per class), each
    of its four terms summed over the K classes.

    CORP (Dimitriadis, Gneiting & Jordan, PNAS 2021) rests on the isotonic (PAV) recalibration,
    which is unique for a binary forecast only: for K classes there is no unique isotonic
    recalibration of a probability vector, so a K-class decomposition must pick a binary
    reduction, and the reduction fixes which score is decomposed (each term is a difference of
    mean scores, so summing over classes keeps score = MCB - DSC + UNC term by term):

    * ``brier_*``: the sum over classes of (p_c - 1{y = c})^2, which *is* the K-class Brier
      score (:func:`grouped_brier`). This is the reason for the classwise choice: it decomposes
      the score a report shows. The top-label reduction (confidence against "the arg max was
      right", as :func:`smooth_ece`) decomposes the Brier score of the confidence alone, which
      no report shows and which ignores the other classes.
    * ``log_*``: the one-vs-rest log score sum_c -log |1 - 1{y = c} - p_c| (each term clipped as
      :func:`log_loss`), a proper score of the K-vector but *not* the K-class log loss
      -log p_y: the K-class log loss has no CORP decomposition.

    MCB = 0 exactly when every class's probability is its own PAV recalibration, i.e. the
    forecasts are classwise calibrated (Kull et al. 2019) in CORP's empirical sense; a calibrated forecaster's MCB shrinks to 0 as n grows. MCB >= 0 and DSC >= 0
    term by term (PAV's optimality). For K = 2, ``brier_*`` is twice the binary decomposition
    of P(y = 1) (both classes contribute (p - y)^2, as :func:`grouped_brier` of (1 - p, p)).

    Parameters
    ----------
    p : numpy.ndarray
        (n, K) class probabilities.
    y : numpy.ndarray
        (n,) labels 0..K-1 as floats; NaN = unknown (ignored).
    ids : numpy.ndarray
        (n,) dense group ids in [0, n_groups).
    n_groups : int
        Number of groups.

    Returns
    -------
    dict of str to numpy.ndarray
        ``{log,brier}_{miscalibration,discrimination,uncertainty,score}``, each (n_groups,),
        NaN for a group without labelled rows.

    References
    ----------
    Dimitriadis, T., Gneiting, T. & Jordan, A. I. (2021). Stable reliability diagrams for
    probabilistic classifiers. PNAS 118(8), e2016191118. Kull, M. & Flach, P. (2015). Novel
    decompositions of proper scoring rules for classification: score adjustment as precursor
    to calibration. ECML PKDD. Kull, M., Perello-Nieto, M., Kängsepp, M., Silva Filho, T.,
    Song, H. & Flach, P. (2019). Beyond temperature scaling: obtaining well-calibrated
    multi-class probabilities with Dirichlet calibration. NeurIPS.

    Examples
    --------
    >>> p = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    >>> y = np.array([0.0, 1.0, 2.0, 1.0])
    >>> d = grouped_corp_classwise(p, y, np.zeros(4, np.int64), 1)
    >>> round(float(d["brier_score"][0]), 4) == round(float(grouped_brier(p, y, np.zeros(4,
    ...     np.int64), 1)[0]), 4)
    True
    >>> bool(d["brier_miscalibration"][0] >= 0.0), bool(d["brier_discrimination"][0] >= 0.0)
    (True, True)
    """
    if np.ndim(p) != 2:
        raise ValueError("grouped_corp_classwise: (n, K) class probabilities only")
    p, y, ids = _labelled_rows(p, y, ids)
    res: dict[str, np.ndarray] = {}
    for c in range(p.shape[1]):
        d = grouped_corp(np.clip(p[:, c], 0.0, 1.0), (y == c).astype(np.float64), ids, n_groups)
        for k, v in d.items():
            res[k] = res[k] + v if k in res else v.copy()
    return res


# ----------------------------------------------------------------------------------------------
# The smooth ECE's block bootstrap
# ----------------------------------------------------------------------------------------------
#: Rows evaluated per call of the smooth ECE's grouped kernel while bootstrapping: the
#: resamples run in chunks of about this many rows (~100 MB of arrays), whatever their number.
_BOOTSTRAP_CHUNK_ROWS = 2_000_000


def bootstrap_block_length(n: int) -> int:
    """The circular block bootstrap's block length for a stream of ``n`` events: ceil(n^(1/3)),
    at least 1.

    Hall, Horowitz & Jing (Biometrika 1995) show that the block length minimising the mean
    squared error of a block-bootstrap variance or bias estimate grows as n^(1/3) (n^(1/4) for a
    distribution function, n^(1/5) for a two-sided coverage); n^(1/3) is the usual default
    (Lahiri 2003) and gives the longer blocks of the three, the cautious side for drifting
    streams whose dependence is not short-range. The constant 1 is not tuned: 34 events at
    36,169, 12 at 1,348.

    >>> tuple(bootstrap_block_length(n) for n in (1, 8, 9, 1000, 36169))
    (1, 2, 3, 10, 34)
    """
    if n < 1:
        return 1
    b = round(n ** (1.0 / 3.0))
    return int(b if b**3 >= n else b + 1)


def circular_block_starts(
    n: int, n_resamples: int, *, block_length: int | None = None, seed: int = 0
) -> tuple[np.ndarray, int]:
    """(starts, block length) of a circular block bootstrap (Politis & Romano 1992) of ``n``
    events: ``starts`` (n_resamples, ceil(n / block length)) are uniform on [0, n), resample r
    is the events ``(starts[r, j] + i) % n`` for i < block length, blocks in row order,
    truncated to n events. Seeded by ``seed`` (numpy's ``default_rng``): reproducible."""
    if n < 1:
        raise ValueError(f"circular_block_starts: n must be >= 1, got {n}")
    if n_resamples < 1:
        raise ValueError(f"circular_block_starts: n_resamples must be >= 1, got {n_resamples}")
    length = bootstrap_block_length(n) if block_length is None else int(block_length)
    if not 1 <= length <= n:
        raise ValueError(f"circular_block_starts: block_length must be in [1, {n}], got {length}")
    n_blocks = -(-n // length)
    starts = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n_blocks))
    return starts, length


def _block_rows(starts: np.ndarray, length: int, n: int) -> np.ndarray:
    """The event indices of the resamples of ``starts`` (rows of :func:`circular_block_starts`),
    one (len(starts), n) array."""
    rows = (starts[:, :, None] + np.arange(length)) % n
    return rows.reshape(starts.shape[0], -1)[:, :n]


def smooth_ece_bootstrap(
    p: np.ndarray,
    y: np.ndarray,
    *,
    n_resamples: int = config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES,
    block_length: int | None = None,
    seed: int = config.SMOOTH_ECE_BOOTSTRAP_SEED,
) -> np.ndarray:
    """The smooth ECE (:func:`grouped_smooth_ece`) of ``n_resamples`` circular block bootstrap
    resamples (:func:`circular_block_starts`) of the labelled events of one stream, in their
    order (binary ``p`` or (n, K) reduced to the top label; NaN labels dropped first).

    The resamples depend on the number of labelled events, the block length and the seed only,
    so two forecasters of the same outcomes bootstrapped with one seed are *paired*: resample r
    draws the same events for both (:func:`smooth_ece_difference_interval`).
    """
    p, y, _ = _labelled_rows(np.asarray(p, np.float64), y, np.zeros(len(y), np.int64))
    if p.ndim == 2:
        p, y = top_label(p, y)
    n = y.size
    if n == 0:
        return np.full(n_resamples, np.nan)
    starts, length = circular_block_starts(n, n_resamples, block_length=block_length, seed=seed)
    out = np.empty(n_resamples)
    chunk = max(1, _BOOTSTRAP_CHUNK_ROWS // n)
    for r0 in range(0, n_resamples, chunk):
        rows = _block_rows(starts[r0 : r0 + chunk], length, n)
        m = rows.shape[0]
        ids = np.repeat(np.arange(m, dtype=np.int64), n)
        out[r0 : r0 + m] = grouped_smooth_ece(p[rows.ravel()], y[rows.ravel()], ids, m)
    return out


def _recentred_interval(
    estimate: float, replicates: np.ndarray, level: float
) -> tuple[float, float, float]:
    """(estimate, lo, hi): the percentile interval of ``replicates`` moved by the bootstrap's
    median bias, median(replicates) - estimate, so that it is centred where the estimate is."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not np.isfinite(estimate):
        return estimate, math.nan, math.nan
    a = (1.0 - level) / 2.0
    lo, med, hi = np.quantile(replicates, [a, 0.5, 1.0 - a])
    shift = med - estimate
    return float(estimate), float(lo - shift), float(hi - shift)


def smooth_ece_interval(
    p: np.ndarray,
    y: np.ndarray,
    *,
    level: float = config.SMOOTH_ECE_BOOTSTRAP_LEVEL,
    n_resamples: int = config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES,
    block_length: int | None = None,
    seed: int = config.SMOOTH_ECE_BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """The smooth ECE of one stream's forecasts with a ``level`` block-bootstrap interval:
    (estimate, lo, hi), lo floored at 0 (binary ``p`` or (n, K) reduced to the top label, as
    :func:`smooth_ece`; rows in time order, NaN labels dropped). NaNs without a labelled row.

    Which bootstrap. The events of a stream are ordered in time and drift, so they are neither
    independent nor identically distributed: an i.i.d. bootstrap of events breaks up runs of
    residuals of one sign (a stretch where the base under-forecasts) and understates the
    variability (Künsch, Ann. Stat. 1989). The resamples are circular block bootstrap ones
    (Politis & Romano 1992): blocks of consecutive (forecast, outcome) pairs, start uniform,
    wrapping around the end so every event is equally likely to be drawn (the moving block
    bootstrap under-draws both ends, where drift is most visible), block length
    :func:`bootstrap_block_length` (ceil(n^(1/3)), Hall, Horowitz & Jing 1995). The forecasts
    are those the method made; the method is not re-run, so the interval is the evaluation's
    sampling uncertainty given the forecasts, not the method's run-to-run variability.

    Which interval. The smooth ECE (Błasiok & Nakkiran, ICLR 2024) is, like every ECE, a norm
    of a noisy residual curve: biased upward, most so near 0 (a calibrated forecaster scores
    ~n^(-1/3), not 0), and a bootstrap resample adds its own noise on top, so the replicates
    sit above the estimate and the plain percentile interval can exclude it (measured: a
    calibrated forecaster on 35,000 events, estimate 0.0060, percentile interval [0.0066,
    0.0092]); the bias-corrected (BC) percentile interval then degenerates (no replicate
    below the estimate). The interval reported is the percentile interval moved by the
    bootstrap's median bias, median(replicates) - estimate: the spread of the replicates,
    centred on the estimate. It contains the estimate by construction and reads as "how far
    this number moves if the stream were drawn again", which is what a comparison of two
    forecasters' smooth ECEs needs; it is not a confidence interval for the population
    smooth ECE near 0, for which the estimate itself is biased. Replicates:
    :func:`smooth_ece_bootstrap`; resamples :data:`calpipe.config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES`.

    Parameters
    ----------
    p : numpy.ndarray
        (n,) probabilities of label 1, or (n, K) class probabilities, in time order.
    y : numpy.ndarray
        (n,) labels as floats (0/1, or 0..K-1); NaN = unknown, dropped before resampling.
    level : float
        Two-sided level of the interval (:data:`calpipe.config.SMOOTH_ECE_BOOTSTRAP_LEVEL`).
    n_resamples : int
        Bootstrap resamples.
    block_length : int, optional
        Events per block; default :func:`bootstrap_block_length` of the labelled events.
    seed : int
        Seed of the resampling (:data:`calpipe.config.SMOOTH_ECE_BOOTSTRAP_SEED`).

    Returns
    -------
    tuple of float
        (smooth ECE, lower bound, upper bound); the smooth ECE is :func:`grouped_smooth_ece`'s
        to the bit.

    References
    ----------
    Błasiok, J. & Nakkiran, P. (2024). Smooth ECE: principled reliability diagrams via kernel
    smoothing. ICLR. Künsch, H. R. (1989). The jackknife and the bootstrap for general
    stationary observations. Ann. Statist. 17, 1217-1241. Politis, D. N. & Romano, J. P.
    (1992). A circular block-resampling procedure for stationary data. In *Exploring the Limits
    of Bootstrap*, 263-270. Hall, P., Horowitz, J. L. & Jing, B.-Y. (1995). On blocking rules
    for the bootstrap with dependent data. Biometrika 82, 561-574.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p = rng.uniform(0.1, 0.9, 2000)
    >>> y = (rng.uniform(size=2000) < p**1.2).astype(float)
    >>> est, lo, hi = smooth_ece_interval(p, y, n_resamples=200)
    >>> bool(lo <= est <= hi), est == float(grouped_smooth_ece(p, y, np.zeros(2000, int), 1)[0])
    (True, True)
    """
    y = np.asarray(y, np.float64)
    reps = smooth_ece_bootstrap(p, y, n_resamples=n_resamples, block_length=block_length,
                                seed=seed)  # fmt: skip
    est = float(grouped_smooth_ece(np.asarray(p, np.float64), y, np.zeros(len(y), np.int64), 1)[0])
    e, lo, hi = _recentred_interval(est, reps, level)
    return e, max(lo, 0.0), hi


def smooth_ece_difference_interval(
    p: np.ndarray,
    q: np.ndarray,
    y: np.ndarray,
    *,
    level: float = config.SMOOTH_ECE_BOOTSTRAP_LEVEL,
    n_resamples: int = config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES,
    block_length: int | None = None,
    seed: int = config.SMOOTH_ECE_BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """smECE(p) - smECE(q) of two forecasters of the same outcomes ``y``, with a paired
    ``level`` block-bootstrap interval: (difference, lo, hi). Both are resampled with the same
    blocks (:func:`smooth_ece_bootstrap` with one seed), so the noise the outcomes put into both
    smooth ECEs largely cancels in the difference; the interval is recentred on the difference
    as :func:`smooth_ece_interval`'s (no floor: a difference may be negative). An interval
    that contains 0 says the two smooth ECEs are not told apart by this stream.

    Parameters
    ----------
    p, q : numpy.ndarray
        The two forecasters' (n,) or (n, K) forecasts of the same events, in time order.
    y, level, n_resamples, block_length, seed
        As :func:`smooth_ece_interval`.

    Returns
    -------
    tuple of float
        (smECE(p) - smECE(q), lower bound, upper bound).
    """
    y = np.asarray(y, np.float64)
    kw = {"n_resamples": n_resamples, "block_length": block_length, "seed": seed}
    reps = smooth_ece_bootstrap(p, y, **kw) - smooth_ece_bootstrap(q, y, **kw)
    one = np.zeros(len(y), np.int64)
    diff = float(
        grouped_smooth_ece(np.asarray(p, np.float64), y, one, 1)[0]
        - grouped_smooth_ece(np.asarray(q, np.float64), y, one, 1)[0]
    )
    return _recentred_interval(diff, reps, level)
