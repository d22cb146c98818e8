"""Forecast quality on real drifting streams and controls: every calpipe method and stack against
the anchors a practitioner would use. ``make quality`` writes ``QUALITY.md``; ``make test`` runs
``--size smoke`` (a few thousand events per stream, two river models, one seed).

``python -m benchmarks.quality [--size smoke|full] [--out QUALITY.md]``

Streams (each replayed in order, forecasts prequential; the base model is trained on data before
the replay or online, never on the events it scores)
-------------------------------------------------------------------------------------------------
* ``bank-time``: the shared bank-marketing calls in time order (May 2008 - Nov 2010: the base rate
  goes from ~5 % to ~15 %), scored by the random forest of ``data/bank_marketing_scored.parquet``
  (``score_rf1000``: trained on the first 1,000 calls). Drifting.
* ``bank-by-age``, ``bank-by-balance``: ``bank-full.csv`` sorted by one covariate (Gupta &
  Ramdas 2023 §4's covariate-drift protocol: the first 20 % of the sorted rows train a gradient
  boosting base model, the other 80 % are replayed in sorted order, so the population drifts
  along the covariate). The covariates are chosen for having the strongest monotone association
  with the outcome among the numeric ones; the authors' exact choices could not be checked
  offline. Drifting.
* ``bank-random``: the same protocol in a random order: the control without drift.
* ``phishing-arf``, ``segments-arf`` (K = 7): river's bundled Phishing and ImageSegments through
  river's adaptive random forest, test-then-train (paper 001 §5.3). Online base models, so any
  remaining drift is the model's own learning curve.
* ``segments-by-intensity`` (K = 7): ImageSegments sorted by ``intensity-mean``, the first 25 %
  training a multinomial logistic regression: the class priors drift (sky is bright, foliage
  dark). ``segments-random``: the control.
* ``digits-by-intensity`` (K = 10): scikit-learn's bundled ``load_digits`` (1,797 8x8 images)
  sorted by mean pixel intensity, the first 25 % training a multinomial logistic regression on
  the standardized pixels, the other 75 % replayed in sorted order (the protocol of
  ``segments-by-intensity``). Drifting: the covariates move along the sort (dark, thin strokes
  first, heavy ones last) and so do the class priors (ones are light, zeros and eights heavy).
  ``digits-random``: the same protocol in a random order, the control.
* ``bank-nb``: a naive Bayes base (scikit-learn ``GaussianNB``) on bank-full.csv's seven numeric
  columns, which are correlated (``pdays`` / ``previous``, ``duration`` / ``campaign``) and
  skewed, so its scores are extreme and badly calibrated; ``bank-random``'s protocol (random
  order, the first 20 % train, the rest replayed). Control: the order is random, the model is
  just miscalibrated in a stationary way.
* ``approval-daily``: river's bundled TrumpApproval (1,001 days of the approval rating and five
  pollsters' numbers, in calendar order) as 1,000 binary events "does the approval rate rise the
  next day" (base rate 0.44), forecast by river's online logistic regression (standardized
  inputs: today's change, the pollsters' gaps to the rating and their daily changes),
  test-then-train. Drifting: a calendar-ordered series whose level wanders (37 % to 44 %) and
  whose rise rate per 100 days ranges over 0.35 - 0.52, short enough that every window is a
  quarter of the stream.

Methods
-------
calpipe: the default (``composite-experts``), ``composite-jumper`` (paper 001's default grid),
the online calibrators (``ops``, ``tops``, ``hops``, ``obs``, ``online-histogram``), the windowed
batch calibrators (refitted on the trailing ``WINDOW`` labels every ``REFIT`` labels; on streams
shorter than 4 ``WINDOW`` a quarter of the stream, see :func:`window_of`) and
``composite-jumper`` over ``venn-abers`` / ``ops`` (the stacks). Anchors, fitted outside calpipe:
scikit-learn Platt and isotonic (frozen after the first window of replayed labels, and refitted
on the trailing window), the ``venn-abers`` 1.5.4 package (IVAP refitted on the trailing window),
and for K classes temperature, vector and matrix scaling (scipy / scikit-learn, frozen and
trailing). OPS/TOPS/HOPS (Gupta & Ramdas) count as anchors too: they are the published online
recalibrators, run here by calpipe's implementation; for K classes online vector scaling (``ops``)
and online matrix scaling (``oms``: the same Online Newton Step over W and b, issue 34), the
online forms of the vector and matrix scaling anchors.

Metrics (``calpipe.metrics``): mean natural log loss, Brier, ECE (10 bins; K classes: top
label), smooth ECE, the CORP miscalibration / discrimination (Dimitriadis, Gneiting & Jordan
2021) of the log loss (``mcb``/``dsc``, binary only) and of the Brier score (``mcb B``/``dsc B``),
the worst-window excess log loss over the base (windows of ``max(250, n / 20)`` events), and the
first alarm (log10 S >= 2) of the martingale methods: a detection on drifting streams, a false
alarm on controls. Two columns read a forecast's calibration over time, outside the verdict:
``conf - acc``, the mean top-label confidence minus the accuracy (binary: the mean forecast minus
the base rate; below 0: underconfident on average), and ``smECE/4``, the mean of the smooth ECEs
of the stream's four consecutive quarters (:data:`LOCAL_PERIODS`). The whole stream's smooth ECE
pools periods, so an overconfident start and an underconfident end cancel in it; the quarters'
mean does not let them (``docs/studies/multiclass-confidence.md``).

*CORP for K classes.* CORP recalibrates by PAV, which is unique for a binary forecast only; a
K-class forecast has no unique isotonic recalibration, so the K-class log loss -log p_y has no
CORP decomposition and its ``mcb``/``dsc`` cells stay blank. ``mcb B``/``dsc B`` are
:func:`calpipe.metrics.grouped_corp_classwise`: the binary decomposition of each class's
probability against "the label is that class" (one vs rest), summed over the classes. The sum
of the one-vs-rest Brier scores is the K-class Brier score itself, so these columns decompose
the table's ``Brier`` column exactly (score = MCB - DSC + UNC), for K classes as for binary
streams; MCB = 0 means every class's probability is its own PAV recalibration (classwise
calibration). The top-label reduction the ECE columns use would decompose the Brier score of the
confidence alone, a score the table does not show.

*The smooth ECE's interval* (the summary's ``95 %``, and a line above each stream's table): the
default's smooth ECE with a 95 % circular block bootstrap interval
(:func:`calpipe.metrics.smooth_ece_interval`), and the default's smooth ECE minus the best
anchor's (by log loss, the one the verdict compares with) with a paired interval on the same
resamples (:func:`calpipe.metrics.smooth_ece_difference_interval`). Why blocks: the streams are
time-ordered and drift, so an i.i.d. bootstrap of events breaks up runs of residuals of one sign
and understates the uncertainty; blocks of consecutive events (Künsch 1989) keep runs shorter
than a block. Circular (Politis & Romano 1992) so that the first and last events, where drift
shows most, are drawn as often as the others; block length ceil(n^(1/3)) (Hall, Horowitz &
Jing 1995's MSE-optimal rate for variances; 33-34 events on the bank streams, 10-14 on the
short ones; :func:`calpipe.metrics.bootstrap_block_length`). 1,000 resamples
(:data:`calpipe.config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES`: enough for 2.5 % quantiles; 200 at smoke
size, :data:`SMOKE_RESAMPLES`), seed
:data:`BOOTSTRAP_SEED`: the intervals are reproducible to the bit. The forecasts are resampled,
not the methods re-run: the interval is the evaluation's sampling noise given the forecasts. The
smooth ECE is biased upward near 0 and a resample adds noise on top, so the replicates sit above
the estimate and the plain percentile interval can miss it; the interval shown is the percentile
interval moved by the bootstrap's median bias (centred on the estimate; the metric's docstring
gives the measurement). It costs 3 x 1,000 smooth ECEs per stream (the default's resamples,
then both forecasters' for the difference): ~10 s on a 36,000-event stream, ~1-2 minutes in
all; at smoke size a few seconds.

Pass rule (issues 11 and 34): on every drifting stream the default's mean log loss is <= the
best anchor's (the anchor with the lowest log loss), on every control within
:data:`CONTROL_SLACK` = 0.002 nats of it; on every stream it is <= the base's + ln 2 / n;
its smooth ECE is <= that best anchor's + 0.005. (Comparing with the lowest smooth ECE of any
anchor would reward forecasts that buy calibration with log loss, as TOPS does: the table shows
every anchor's smooth ECE for that reading too.) The verdict keeps the point values, the issue's
rule: the slack 0.005 is the tolerance the issue set, and a rule "the paired interval reaches
below + 0.005" would be far looser on the short streams (on approval-daily's 1,000 events the
difference's interval is ~0.04 wide, eight times the slack) and would change the issue's target;
the intervals stand beside the verdict to say how much of a margin is noise.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from scipy.optimize import minimize
from scipy.special import log_softmax, logit, softmax

import calpipe
from calpipe import config, metrics
from calpipe.errors import ParameterError

ROOT = Path(__file__).resolve().parents[1]
BANK_SCORED = ROOT / "data" / "bank_marketing_scored.parquet"
#: bank-full.csv lives with the project's reference data beside the repository (as the tests
#: read it: ``CALPIPE_SHARED_DATA`` or ../shared/data); without it the bank-full streams are
#: skipped, and the report says so.
SHARED = Path(os.environ.get("CALPIPE_SHARED_DATA", ROOT.parent / "shared" / "data"))
BANK_CSV = SHARED / "bank-full.csv"
WINDOW = 2000
REFIT = 500
EPS = 1e-6  # anchors' forecasts are clipped to [EPS, 1 - EPS] before their logits
DEFAULT = "composite-experts"
SMOOTH_ECE_SLACK = 0.005
#: On a control (no drift) a frozen anchor fitted on the first window is the right model, and
#: the default may trail it by the cost of not knowing that: at most this many nats (issue 34).
CONTROL_SLACK = 0.002
#: The seed of the smooth ECE's bootstrap (the library's default; stated here because the
#: report's intervals are reproducible from it).
BOOTSTRAP_SEED = config.SMOOTH_ECE_BOOTSTRAP_SEED
#: ``smECE/4``: consecutive periods whose smooth ECEs are averaged. Four keeps >= 250 labels a
#: period on the shortest stream (approval-daily, 1,000 events), where the metric still resolves.
LOCAL_PERIODS = 4
#: Bootstrap resamples at smoke size (CI): the run checks that the report is made, its intervals
#: are informational, and 200 resamples cost a fifth of the 1,000 of the full size
#: (:data:`calpipe.config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES`), whose quantiles they would only
#: roughen.
SMOKE_RESAMPLES = 200

#: paper 001 Table 11 (mean log loss over five seeds): model -> (Phishing base, protected,
#: ImageSegments base, protected)
TABLE_11 = {
    "ADWIN": (0.2337, 0.1895, 0.4316, 0.4298),
    "ARF": (0.2336, 0.2038, 0.4598, 0.4315),
    "Bagging": (0.2286, 0.1837, 0.4371, 0.4310),
    "DriftARF": (0.2242, 0.2033, 0.4553, 0.4310),
    "DriftSRP": (0.1778, 0.1768, 0.4394, 0.4314),
    "EFTree": (0.3621, 0.3518, 2.6494, 2.2573),
    "Hoeffding": (0.4333, 0.4120, 0.4302, 0.4298),
    "SRP": (0.1871, 0.1858, 0.4392, 0.4312),
}


@dataclass
class Stream:
    name: str
    p: np.ndarray  # (n,) P(y = 1) or (n, K)
    y: np.ndarray  # (n,) labels 0..K-1
    drift: bool
    source: str

    @property
    def k(self) -> int:
        return 2 if self.p.ndim == 1 else self.p.shape[1]


# ----------------------------------------------------------------------------------------------
# Streams
# ----------------------------------------------------------------------------------------------
def bank_time(n_max: int | None) -> Stream:
    ev = pl.read_parquet(BANK_SCORED).sort("event_date", "event_id")
    if n_max:
        ev = ev.head(n_max)
    return Stream("bank-time", ev["score_rf1000"].to_numpy(), ev["label"].to_numpy(), True,
                  "bank calls in time order, RF trained on the first 1,000")  # fmt: skip


def _bank_table() -> tuple[pl.DataFrame, np.ndarray]:
    df = pl.read_csv(BANK_CSV, separator=";")
    y = (df["y"] == "yes").cast(pl.Int64).to_numpy()
    return df.drop("y"), y


def _features(df: pl.DataFrame) -> np.ndarray:
    cat = [c for c, t in df.schema.items() if t == pl.String]
    return df.to_dummies(cat).cast(pl.Float64).to_numpy()


def bank_sorted(by: str | None, n_max: int | None, seed: int = 0) -> Stream:
    """G&R §4's covariate-drift protocol on bank-full.csv: sort by ``by`` (None: a random order),
    train on the first 20 %, replay the rest."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    df, y = _bank_table()
    rng = np.random.default_rng(seed)
    if by is None:
        order = rng.permutation(len(y))
    else:
        order = np.lexsort((np.arange(len(y)), df[by].to_numpy()))
    if n_max:  # smoke: an evenly spaced subsample keeps the drift's full range
        order = order[np.linspace(0, len(order) - 1, n_max).astype(int)]
    x = _features(df)[order]
    y = y[order]
    n_train = len(y) // 5
    model = HistGradientBoostingClassifier(random_state=0).fit(x[:n_train], y[:n_train])
    p = model.predict_proba(x[n_train:])[:, 1]
    name = f"bank-by-{by}" if by else "bank-random"
    what = f"sorted by {by}" if by else "random order (control)"
    return Stream(name, p, y[n_train:], by is not None,
                  f"bank-full.csv {what}, gradient boosting on the first 20 %")  # fmt: skip


def _river_model(name: str, seed: int):
    from river import compose, drift, ensemble, forest, preprocessing, tree

    make = {
        "ADWIN": lambda: ensemble.ADWINBaggingClassifier(
            forest.ARFClassifier(seed=seed), seed=seed
        ),
        "ARF": lambda: forest.ARFClassifier(seed=seed),
        "Bagging": lambda: ensemble.BaggingClassifier(forest.ARFClassifier(seed=seed), seed=seed),
        "DriftARF": lambda: drift.DriftRetrainingClassifier(
            model=forest.ARFClassifier(seed=seed), drift_detector=drift.binary.DDM()
        ),
        "DriftSRP": lambda: drift.DriftRetrainingClassifier(
            model=ensemble.SRPClassifier(seed=seed), drift_detector=drift.binary.DDM()
        ),
        "EFTree": lambda: tree.ExtremelyFastDecisionTreeClassifier(),
        "Hoeffding": lambda: tree.HoeffdingAdaptiveTreeClassifier(seed=seed),
        "SRP": lambda: ensemble.SRPClassifier(seed=seed),
    }[name]
    return compose.Pipeline(preprocessing.StandardScaler(), make())


def river_stream(dataset: str, model: str, seed: int, n_max: int | None) -> Stream:
    """Test-then-train through a river classifier (paper 001 §5.3): the forecast of event t is
    the model's ``predict_proba_one`` before it learns (x_t, y_t); classes it has not seen get
    probability 0, an empty forecast (the first event) is uniform."""
    from river import datasets

    ds = {"phishing": datasets.Phishing, "segments": datasets.ImageSegments}[dataset]()
    rows = list(ds)[:n_max] if n_max else list(ds)
    classes = sorted({y for _, y in rows}, key=str)
    index = {c: i for i, c in enumerate(classes)}
    m = _river_model(model, seed)
    p = np.zeros((len(rows), len(classes)))
    for t, (x, y) in enumerate(rows):
        proba = m.predict_proba_one(x)
        tot = sum(proba.values())
        if tot > 0:
            for c, v in proba.items():
                p[t, index[c]] = v / tot
        else:
            p[t] = 1.0 / len(classes)
        m.learn_one(x, y)
    y = np.array([index[y] for _, y in rows])
    if len(classes) == 2:
        return Stream(f"{dataset}-{model.lower()}", p[:, 1], y, False,
                      f"river {dataset}, {model} test-then-train (seed {seed})")  # fmt: skip
    return Stream(f"{dataset}-{model.lower()}", p, y, False,
                  f"river {dataset}, {model} test-then-train (seed {seed})")  # fmt: skip


def segments_sorted(by: str | None, seed: int = 0) -> Stream:
    from river import datasets
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rows = list(datasets.ImageSegments())
    names = sorted(rows[0][0])
    x = np.array([[r[0][k] for k in names] for r in rows])
    classes = sorted({r[1] for r in rows})
    y = np.array([classes.index(r[1]) for r in rows])
    if by is None:
        order = np.random.default_rng(seed).permutation(len(y))
    else:
        order = np.lexsort((np.arange(len(y)), x[:, names.index(by)]))
    x, y = x[order], y[order]
    n_train = len(y) // 4
    sc = StandardScaler().fit(x[:n_train])
    model = LogisticRegression(max_iter=2000).fit(sc.transform(x[:n_train]), y[:n_train])
    p = np.zeros((len(y) - n_train, len(classes)))
    p[:, model.classes_] = model.predict_proba(sc.transform(x[n_train:]))
    name = f"segments-by-{by.split('-')[0]}" if by else "segments-random"
    what = f"sorted by {by}" if by else "random order (control)"
    return Stream(name, p, y[n_train:], by is not None,
                  f"ImageSegments {what}, logistic regression on the first 25 %")  # fmt: skip


def digits_sorted(by_intensity: bool, seed: int = 0) -> Stream:
    """scikit-learn's bundled digits (K = 10) sorted by mean pixel intensity (False: a random
    order), a multinomial logistic regression trained on the first 25 %, the rest replayed."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    if by_intensity:
        order = np.lexsort((np.arange(len(y)), x.mean(axis=1)))
    else:
        order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_train = len(y) // 4
    sc = StandardScaler().fit(x[:n_train])
    model = LogisticRegression(max_iter=2000).fit(sc.transform(x[:n_train]), y[:n_train])
    p = np.zeros((len(y) - n_train, 10))
    p[:, model.classes_] = model.predict_proba(sc.transform(x[n_train:]))
    name = "digits-by-intensity" if by_intensity else "digits-random"
    what = "sorted by mean pixel intensity" if by_intensity else "random order (control)"
    return Stream(name, p, y[n_train:], by_intensity,
                  f"scikit-learn digits {what}, logistic regression on the first 25 %")  # fmt: skip


def bank_naive_bayes(n_max: int | None, seed: int = 0) -> Stream:
    """GaussianNB on bank-full.csv's numeric columns in ``bank-random``'s order (the same
    permutation): trained on the first 20 %, the rest replayed."""
    from sklearn.naive_bayes import GaussianNB

    df, y = _bank_table()
    order = np.random.default_rng(seed).permutation(len(y))
    if n_max:
        order = order[np.linspace(0, len(order) - 1, n_max).astype(int)]
    num = [c for c, t in df.schema.items() if t.is_numeric()]
    x = df.select(num).cast(pl.Float64).to_numpy()[order]
    y = y[order]
    n_train = len(y) // 5
    p = GaussianNB().fit(x[:n_train], y[:n_train]).predict_proba(x[n_train:])[:, 1]
    return Stream("bank-nb", p, y[n_train:], False,
                  f"bank-full.csv random order (control), Gaussian naive Bayes on the "
                  f"{len(num)} numeric columns, trained on the first 20 %")  # fmt: skip


def approval_daily() -> Stream:
    """river's TrumpApproval, day t's event: does the approval rate rise from day t to t + 1,
    forecast from what is known on day t by river's online logistic regression, test-then-train
    (the first forecast, before any learning, is 0.5)."""
    from river import compose, datasets, linear_model, preprocessing

    rows = list(datasets.TrumpApproval())
    polls = sorted(k for k in rows[0][0] if k != "ordinal_date")
    m = compose.Pipeline(preprocessing.StandardScaler(), linear_model.LogisticRegression())
    p = np.zeros(len(rows) - 1)
    y = np.zeros(len(rows) - 1, np.int64)
    for t in range(len(rows) - 1):
        (x, a), prev = rows[t], rows[max(t - 1, 0)]
        feats = {"change": a - prev[1]}
        for k in polls:
            feats[f"{k}_gap"] = x[k] - a
            feats[f"{k}_change"] = x[k] - prev[0][k]
        p[t] = m.predict_proba_one(feats).get(True, 0.5)
        y[t] = int(rows[t + 1][1] > a)
        m.learn_one(feats, bool(y[t]))
    return Stream("approval-daily", p, y, True,
                  "river TrumpApproval in calendar order, 'does the approval rise the next "
                  "day', river logistic regression test-then-train")  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Anchors outside calpipe (refits per block of REFIT events: a Python loop per refit, not per event)
# ----------------------------------------------------------------------------------------------
def window_of(n: int) -> tuple[int, int]:
    """(window, refit every) for a stream of n events: WINDOW and REFIT, shrunk on short streams
    to a quarter of the stream (refit every quarter window) so that every windowed method and
    anchor is fitted on three quarters of it (a window longer than the stream never fits)."""
    w = min(WINDOW, n // 4)
    return w, max(25, min(REFIT, w // 4))


def _blocks(n: int, frozen: bool):
    """(fit rows, predict rows) per block: before the first window the base passes through."""
    window, refit = window_of(n)
    for start in range(window, n, refit):
        fit = slice(0, window) if frozen else slice(max(0, start - window), start)
        yield fit, slice(start, min(n, start + refit))


def _z(p):
    return logit(np.clip(p, EPS, 1 - EPS))


def sk_platt(s: Stream, frozen: bool) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    out = s.p.copy()
    for fit, pred in _blocks(len(s.y), frozen):
        if len(np.unique(s.y[fit])) < 2:
            continue
        lr = LogisticRegression(C=1e6).fit(_z(s.p[fit])[:, None], s.y[fit])
        out[pred] = lr.predict_proba(_z(s.p[pred])[:, None])[:, 1]
    return out


def sk_isotonic(s: Stream, frozen: bool) -> np.ndarray:
    from sklearn.isotonic import IsotonicRegression

    out = s.p.copy()
    for fit, pred in _blocks(len(s.y), frozen):
        ir = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
        out[pred] = ir.fit(s.p[fit], s.y[fit]).predict(s.p[pred])
    return out


def pkg_venn_abers(s: Stream) -> np.ndarray:
    from venn_abers import VennAbers

    out = s.p.copy()
    for fit, pred in _blocks(len(s.y), False):
        va = VennAbers()
        va.fit(np.c_[1 - s.p[fit], s.p[fit]], s.y[fit])
        out[pred] = va.predict_proba(np.c_[1 - s.p[pred], s.p[pred]])[0][:, 1]
    return out


def _scaling_fit(z: np.ndarray, y: np.ndarray, kind: str) -> np.ndarray:
    """Temperature (1 parameter), vector (diagonal W, b) or matrix (full W, b) scaling of the
    log-probabilities ``z`` by maximum likelihood (L-BFGS), as Guo et al. 2017."""
    n, k = z.shape
    onehot = np.eye(k)[y]

    def unpack(th):
        if kind == "temperature":
            return np.eye(k) * th[0], np.zeros(k)
        if kind == "vector":
            return np.diag(th[:k]), th[k:]
        return th[: k * k].reshape(k, k), th[k * k :]

    def nll(th):
        w, b = unpack(th)
        lp = log_softmax(z @ w.T + b, axis=1)
        g = softmax(z @ w.T + b, axis=1) - onehot  # d/dlogits
        gw, gb = g.T @ z / n, g.mean(axis=0)
        if kind == "temperature":
            grad = np.array([np.sum(gw * np.eye(k))])
        elif kind == "vector":
            grad = np.r_[np.diag(gw), gb]
        else:
            grad = np.r_[gw.ravel(), gb]
        return -np.sum(lp * onehot) / n, grad

    th0 = {"temperature": np.ones(1), "vector": np.r_[np.ones(k), np.zeros(k)],
           "matrix": np.r_[np.eye(k).ravel(), np.zeros(k)]}[kind]  # fmt: skip
    return minimize(nll, th0, jac=True, method="L-BFGS-B").x, unpack


def k_scaling(s: Stream, kind: str, frozen: bool) -> np.ndarray:
    z = np.log(np.clip(s.p, EPS, 1.0))
    out = s.p.copy()
    for fit, pred in _blocks(len(s.y), frozen):
        th, unpack = _scaling_fit(z[fit], s.y[fit], kind)
        w, b = unpack(th)
        out[pred] = softmax(z[pred] @ w.T + b, axis=1)
    return out


# ----------------------------------------------------------------------------------------------
# calpipe methods
# ----------------------------------------------------------------------------------------------
WINDOWED = {"platt", "beta", "temperature", "histogram", "isotonic", "roc-isotonic", "venn-abers",
            "venn"}  # fmt: skip
ONLINE = ["composite-experts", "composite-jumper", "ops", "tops", "hops", "obs", "tobs", "hobs",
          "online-histogram", "venn-predictor"]  # fmt: skip
STACKS = {"protected venn-abers": "venn-abers", "protected ops": "ops"}


def run_calpipe(s: Stream, method: str, base_method: str | None = None):
    """(forecasts, log10 martingale or None) of ``method`` on the stream, one stream, in order."""
    n = len(s.y)
    cols = {"event_id": np.arange(n), "label": s.y}
    if s.k == 2:
        cols["score"] = s.p
        kw = {"score": "score"}
    else:
        cols["scores"] = s.p
        kw = {"scores": "scores"}
    frame = pl.DataFrame(cols)
    params = {}
    window, refit = window_of(n)
    if base_method is not None:
        params = {"base_method": base_method}
        if base_method in WINDOWED:
            params["base_params"] = {"window": window, "refit_every": refit}
        method = "composite-jumper"
    elif method in WINDOWED:
        params = {"window": window, "refit_every": refit}
    r = calpipe.protect(frame, order_by="event_id", method=method, **kw, **params)
    out = r["protected_score" if s.k == 2 else "protected_scores"].to_numpy()
    mart = r["log10_martingale"].to_numpy() if "log10_martingale" in r.columns else None
    if mart is not None and np.all(mart == 0):
        mart = None
    return out, mart


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------
def event_losses(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each event's natural log loss -ln p_y (binary p = P(y = 1)), floored as metrics.log_loss."""
    q = p[np.arange(len(y)), y] if p.ndim == 2 else np.where(y == 1, p, 1 - p)
    return -np.log(np.clip(q, metrics.LOG_LOSS_FLOOR, 1.0))


def evaluate(s: Stream, p: np.ndarray, mart: np.ndarray | None) -> dict:
    y = s.y.astype(np.float64)
    one = np.zeros(len(y), np.int64)
    ll = event_losses(p, s.y)
    base_ll = event_losses(s.p, s.y)
    w = max(250, len(y) // 20)
    excess = [ll[i : i + w].mean() - base_ll[i : i + w].mean() for i in range(0, len(y) - w + 1, w)]
    if p.ndim == 2:
        conf, hit = metrics.top_label(p, y)
        ece = float(metrics.grouped_ece(conf, hit, one, 1)[0])
    else:
        conf, hit = p, y  # binary: calibration in the large
        ece = float(metrics.grouped_ece(p, y, one, 1)[0])
    period = np.arange(len(y)) * LOCAL_PERIODS // len(y)
    row = {
        "log_loss": float(ll.mean()),
        "brier": float(metrics.grouped_brier(p, y, one, 1)[0]),
        "ece": ece,
        "smooth_ece": float(metrics.grouped_smooth_ece(p, y, one, 1)[0]),
        "conf_gap": float(conf.mean() - hit.mean()),
        "smooth_ece_local": float(metrics.grouped_smooth_ece(p, y, period, LOCAL_PERIODS).mean()),
        "mcb": math.nan,
        "dsc": math.nan,
        "mcb_brier": math.nan,
        "dsc_brier": math.nan,
        "worst_window": float(max(excess)) if excess else math.nan,
        "alarm": None,
    }
    if p.ndim == 1:
        d = metrics.grouped_corp(np.clip(p, 0.0, 1.0), y, one, 1)
        row["mcb"], row["dsc"] = (
            float(d["log_miscalibration"][0]),
            float(d["log_discrimination"][0]),
        )
    else:  # K classes: the classwise decomposition, of the K-class Brier score (no log loss one)
        d = metrics.grouped_corp_classwise(p, y, one, 1)
    row["mcb_brier"], row["dsc_brier"] = (
        float(d["brier_miscalibration"][0]),
        float(d["brier_discrimination"][0]),
    )
    if mart is not None:
        hits = np.flatnonzero(mart >= 2.0)
        row["alarm"] = int(hits[0]) if hits.size else -1
    return row


def evaluate_stream(
    s: Stream, n_resamples: int = config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES
) -> list[dict]:
    runs: list[tuple[str, str, np.ndarray, np.ndarray | None]] = [("base", "base", s.p, None)]
    names = ONLINE + sorted(WINDOWED)
    for m in names:
        try:
            p, mart = run_calpipe(s, m)
        except ParameterError:
            continue  # a binary-only method on a K-class stream
        runs.append(("default" if m == DEFAULT else "calpipe", m, p, mart))
    for label, bm in STACKS.items():
        p, mart = run_calpipe(s, "composite-jumper", base_method=bm)
        runs.append(("calpipe", label, p, mart))
    if s.k == 2:
        for frozen in (True, False):
            tag = "frozen" if frozen else "trailing"
            runs.append(("anchor", f"sklearn Platt ({tag})", sk_platt(s, frozen), None))
            runs.append(("anchor", f"sklearn isotonic ({tag})", sk_isotonic(s, frozen), None))
        runs.append(("anchor", "venn-abers 1.5.4 (trailing)", pkg_venn_abers(s), None))
        for m in ("ops", "tops", "hops"):
            p = next(r[2] for r in runs if r[1] == m)
            runs.append(("anchor", f"{m.upper()} (Gupta & Ramdas)", p, None))
    else:
        for kind in ("temperature", "vector", "matrix"):
            for frozen in (True, False):
                tag = "frozen" if frozen else "trailing"
                runs.append(("anchor", f"{kind} scaling ({tag})", k_scaling(s, kind, frozen), None))
        runs.append(("anchor", "OPS (online vector scaling)",
                     next(r[2] for r in runs if r[1] == "ops"), None))  # fmt: skip
        p, mart = run_calpipe(s, "oms")  # K classes only: binary oms is obs
        runs.append(("calpipe", "oms", p, mart))
        runs.append(("anchor", "OMS (online matrix scaling)", p, None))
    rows = [{"stream": s.name, "kind": k, "method": m, **evaluate(s, p, mart)}
            for k, m, p, mart in runs]  # fmt: skip
    intervals(s, runs, rows, n_resamples)
    return rows


def intervals(
    s: Stream,
    runs: list,
    rows: list[dict],
    n_resamples: int = config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES,
) -> None:
    """The default's smooth ECE with its block-bootstrap interval
    (:func:`calpipe.metrics.smooth_ece_interval`) and its difference to the best anchor's (by
    log loss, as :func:`verdict` picks it) with the paired interval
    (:func:`calpipe.metrics.smooth_ece_difference_interval`), both on the same seeded
    resamples, added to the default's row (``smece_lo``/``smece_hi``, ``dsmece``,
    ``dsmece_lo``/``dsmece_hi``)."""
    i_d = next(i for i, r in enumerate(rows) if r["kind"] == "default")
    i_a = min((i for i, r in enumerate(rows) if r["kind"] == "anchor"),
              key=lambda i: rows[i]["log_loss"])  # fmt: skip
    p_d, p_a = runs[i_d][2], runs[i_a][2]
    y = s.y.astype(np.float64)
    kw = {"n_resamples": n_resamples, "seed": BOOTSTRAP_SEED}
    _, lo, hi = metrics.smooth_ece_interval(p_d, y, **kw)
    diff, dlo, dhi = metrics.smooth_ece_difference_interval(p_d, p_a, y, **kw)
    rows[i_d].update(smece_lo=lo, smece_hi=hi, dsmece=diff, dsmece_lo=dlo, dsmece_hi=dhi)


def verdict(s: Stream, rows: list[dict]) -> dict:
    d = next(r for r in rows if r["kind"] == "default")
    base = next(r for r in rows if r["kind"] == "base")
    anchors = [r for r in rows if r["kind"] == "anchor"]
    best = min(anchors, key=lambda r: r["log_loss"])
    best_sm = best["smooth_ece"]
    n = len(s.y)
    checks = {
        "insurance": d["log_loss"] <= base["log_loss"] + math.log(2) / n + 1e-12,
        "smooth_ece": d["smooth_ece"] <= best_sm + SMOOTH_ECE_SLACK,
    }
    if s.drift:
        checks["beats_best_anchor"] = d["log_loss"] <= best["log_loss"]
    else:
        checks["near_best_anchor"] = d["log_loss"] <= best["log_loss"] + CONTROL_SLACK
    return {"stream": s.name, "n": n, "K": s.k, "drift": s.drift, "default": d["log_loss"],
            "base": base["log_loss"], "best_anchor": best["method"],
            "best_anchor_ll": best["log_loss"], "default_smece": d["smooth_ece"],
            "best_anchor_smece": best_sm, "smece_ci": (d["smece_lo"], d["smece_hi"]),
            "dsmece": (d["dsmece"], d["dsmece_lo"], d["dsmece_hi"]), "checks": checks,
            "ok": all(checks.values())}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Paper 001 Table 11
# ----------------------------------------------------------------------------------------------
def table_11(models: list[str], seeds: list[int], n_max: int | None) -> list[dict]:
    out = []
    for model in models:
        row = {"model": model}
        for ds in ("phishing", "segments"):
            base, cj, ce = [], [], []
            for seed in seeds:
                s = river_stream(ds, model, seed, n_max)
                base.append(event_losses(s.p, s.y).mean())
                cj.append(event_losses(run_calpipe(s, "composite-jumper")[0], s.y).mean())
                ce.append(event_losses(run_calpipe(s, DEFAULT)[0], s.y).mean())
            row[ds] = (float(np.mean(base)), float(np.mean(cj)), float(np.mean(ce)))
        out.append(row)
    return out


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def _f(v, digits=4) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and math.isnan(v):
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _ci(lo: float, hi: float) -> str:
    return f"[{_f(lo)}, {_f(hi)}]"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def markdown(streams, results, verdicts, t11, size, seconds, resamples=None) -> str:
    resamples = resamples or config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES
    lines = ["# Forecast quality", "",
             f"`python -m benchmarks.quality --size {size}` on {cpu_model()}, "
             f"{seconds:.0f} s. Generated; do not edit by hand.", "",
             "Protocol, streams, anchors and metrics: `benchmarks/quality.py`'s docstring. Log "
             "loss natural, mean per event; `mcb`/`dsc`: CORP miscalibration and discrimination "
             "of the log loss (binary only: the K-class log loss has no CORP decomposition); "
             "`mcb B`/`dsc B`: of the Brier score, for K classes summed over the K one-vs-rest "
             "problems, which decomposes the K-class Brier score of the `Brier` column; "
             "`smECE/4`: the mean smooth ECE of the stream's four consecutive quarters (errors of "
             "opposite sign in different periods do not cancel in it); `conf - acc`: mean "
             "top-label confidence minus accuracy (binary: mean forecast minus base rate; < 0 "
             "underconfident); neither is in the verdict. "
             "`worst window`: the largest excess log loss over the "
             "base in a window of max(250, n/20) events; `alarm`: first event with log10 S >= 2 "
             "(-1: none).", "", "## Summary", "",
             "| stream | n | K | drift | base | default | best anchor | its log loss | "
             "default smECE | 95 % | its smECE | difference, 95 % | verdict |",
             "|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for v in verdicts:
        failed = [k for k, ok in v["checks"].items() if not ok]
        lines.append(
            f"| {v['stream']} | {v['n']:,} | {v['K']} | {'yes' if v['drift'] else 'control'} | "
            f"{_f(v['base'])} | {_f(v['default'])} | {v['best_anchor']} | "
            f"{_f(v['best_anchor_ll'])} | {_f(v['default_smece'])} | {_ci(*v['smece_ci'])} | "
            f"{_f(v['best_anchor_smece'])} | {_f(v['dsmece'][0])} {_ci(*v['dsmece'][1:])} | "
            f"{'pass' if not failed else 'FAIL: ' + ', '.join(failed)} |"
        )
    lines += ["", "Checks: `insurance` default <= base + ln 2 / n; `beats_best_anchor` (drifting "
              "streams) default <= the best anchor's log loss; `near_best_anchor` (controls) "
              f"default <= the best anchor's log loss + {CONTROL_SLACK}; `smooth_ece` default's smooth ECE "
              f"<= the best anchor's (by log loss) + {SMOOTH_ECE_SLACK}. `95 %`: the default's "
              "smooth ECE's circular block bootstrap interval (blocks of ceil(n^(1/3)) events, "
              f"{resamples:,} resamples, seed "
              f"{BOOTSTRAP_SEED}; the percentile interval moved by the bootstrap's median bias, "
              "`calpipe.metrics.smooth_ece_interval`); `difference, 95 %`: default's smooth ECE "
              "minus the best anchor's, with the paired interval on the same resamples (one "
              "that contains 0: the stream does not tell the two apart). The verdict uses the "
              "point values, as the issue's rule states.", ""]  # fmt: skip
    for s in streams:
        rows = sorted(results[s.name], key=lambda r: r["log_loss"])
        d = next(r for r in rows if r["kind"] == "default")
        lines += [f"## {s.name}", "", f"{s.source}; {len(s.y):,} events, K = {s.k}, "
                  f"{'drifting' if s.drift else 'control / online base'}.", "",
                  f"Default's smooth ECE {_f(d['smooth_ece'])}, 95 % "
                  f"{_ci(d['smece_lo'], d['smece_hi'])}; minus the best anchor's "
                  f"{_f(d['dsmece'])}, 95 % {_ci(d['dsmece_lo'], d['dsmece_hi'])}.", "",
                  "| method | kind | log loss | Brier | ECE | smooth ECE | smECE/4 | conf - acc | "
                  "mcb | dsc | mcb B | dsc B | worst window | alarm |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in rows:
            name = f"**{r['method']}**" if r["kind"] == "default" else r["method"]
            lines.append(
                f"| {name} | {r['kind']} | {_f(r['log_loss'])} | {_f(r['brier'])} | "
                f"{_f(r['ece'])} | {_f(r['smooth_ece'])} | {_f(r['smooth_ece_local'])} | "
                f"{r['conf_gap']:+.4f} | {_f(r['mcb'])} | {_f(r['dsc'])} | "
                f"{_f(r['mcb_brier'])} | {_f(r['dsc_brier'])} | {_f(r['worst_window'])} | "
                f"{_f(r['alarm'])} |"
            )
        lines.append("")
    if t11:
        lines += ["## Paper 001 Table 11 (river, test-then-train)", "",
                  "Mean log loss over the seeds; paper = the published value. Protected = "
                  "`composite-jumper` (paper 001's method and grid); default = "
                  f"`{DEFAULT}`. The reference script (protected-classification 0.1.5 "
                  "`experiments.py`) reads the models' empty first forecasts and unseen classes "
                  "differently and calls `pc.learn_one(p_pred, y_pred)` with the model's "
                  "*predicted* label, so the numbers are comparable, not equal.", "",
                  "| model | Phishing base | paper | protected | paper | default | "
                  "ImageSegments base | paper | protected | paper | default |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in t11:
            pb, pp, sb, sp = TABLE_11[r["model"]]
            (b1, c1, e1), (b2, c2, e2) = r["phishing"], r["segments"]
            lines.append(f"| {r['model']} | {b1:.4f} | {pb:.4f} | {c1:.4f} | {pp:.4f} | "
                         f"{e1:.4f} | {b2:.4f} | {sb:.4f} | {c2:.4f} | {sp:.4f} | {e2:.4f} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def build_streams(size: str) -> list[Stream]:
    smoke = size == "smoke"
    n = 6000 if smoke else None
    out = [bank_time(n)]
    if BANK_CSV.exists():
        out += [bank_sorted(c, n and 7500) for c in ("age", "balance", None)]
    else:
        print(f"quality: {BANK_CSV} is absent: the bank-full streams are skipped", file=sys.stderr)
    out += [river_stream("phishing", "ARF", 1, None)]
    if not smoke:
        out += [river_stream("segments", "ARF", 1, None), segments_sorted("intensity-mean"),
                segments_sorted(None)]  # fmt: skip
    else:
        out += [segments_sorted("intensity-mean")]
    # issue 34: the kinds of stream the default was reported to lose on
    out += [digits_sorted(True)] + ([] if smoke else [digits_sorted(False)])
    if BANK_CSV.exists():
        out += [bank_naive_bayes(n and 7500)]
    out += [approval_daily()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=("smoke", "full"), default="full")
    ap.add_argument("--out", default=None, help="write the report here (default: print it)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    streams = build_streams(args.size)
    resamples = SMOKE_RESAMPLES if args.size == "smoke" else config.SMOOTH_ECE_BOOTSTRAP_RESAMPLES
    results = {s.name: evaluate_stream(s, resamples) for s in streams}
    verdicts = [verdict(s, results[s.name]) for s in streams]
    if args.size == "full":
        t11 = table_11(list(TABLE_11), [1, 2, 3, 4, 5], None)
    else:
        t11 = table_11(["Hoeffding", "ARF"], [1], 600)
    text = markdown(streams, results, verdicts, t11, args.size, time.perf_counter() - t0,
                    resamples)  # fmt: skip
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    failed = [v["stream"] for v in verdicts if not v["ok"]]
    # (smoke cuts a stream to a few thousand events: too few for some verdicts, e.g. bank-time's
    # 6,000 of 35,211 calls; the claims are the full suite's, QUALITY.md)
    scope = (
        " (smoke size: informational; QUALITY.md holds the full verdicts)"
        if args.size == "smoke"
        else ""
    )
    print(f"quality: {len(verdicts) - len(failed)}/{len(verdicts)} streams pass"
          + (f"; failing: {', '.join(failed)}" if failed else "") + scope, file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
