"""scikit-learn estimators over calpipe's calibrators (``pip install 'calpipe[sklearn]'``).

:class:`ScoreCalibrator` maps a classifier's probabilities to calibrated ones with any calpipe
method (``fit(scores, y)``, ``predict_proba(scores)``); :class:`CalibratedClassifier` wraps a
classifier and calibrates its ``predict_proba`` in the spirit of scikit-learn's
``CalibratedClassifierCV(ensemble=False)``: out-of-fold probabilities calibrate, the estimator is
refitted on all rows.

Every calpipe method is *prequential*: it reads the calibration rows in the order given (time
order, oldest first, for a deployed model) and its fitted map is the state after the last row,
the forecast it would make for the next event (:meth:`calpipe.calibrators.base.Calibrator.run`
then :meth:`~calpipe.calibrators.base.Calibrator.serving_map`). So ``fit`` on rows in time order
gives the map a nightly ``calpipe run`` would serve after the same events, and
:meth:`ScoreCalibrator.partial_fit` continues from where ``fit`` stopped (chunks = one pass).

Scores: a binary classifier's P(y = 1) as (n,) or (n, 1), or its ``predict_proba`` output
(n, 2) (column 1 is used); K >= 3 classes as (n, K) rows summing to 1. Labels: any values; the
sorted distinct labels are ``classes_`` (binary: the second is the positive class), or the
integers 0..K-1 when ``y`` holds integers in that range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.sparse import issparse
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.model_selection import check_cv, cross_val_predict
from sklearn.utils import get_tags
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_is_fitted, column_or_1d

from calpipe import config
from calpipe.calibrators import make_calibrator
from calpipe.errors import InputError

__all__ = ["CalibratedClassifier", "ScoreCalibrator"]


def _scores(X) -> np.ndarray:
    """(n,) binary scores or (n, K >= 3) class probabilities, float64, from what sklearn users
    pass: (n,), (n, 1), (n, 2) predict_proba output or (n, K); ValueError otherwise."""
    if issparse(X):
        raise TypeError("sparse input is not supported: scores are a dense array of probabilities")
    a = full = np.asarray(X, dtype=np.float64)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    elif a.ndim == 2 and a.shape[1] == 2:
        a = a[:, 1]
    if a.ndim not in (1, 2) or a.shape[0] == 0:
        raise ValueError(
            f"scores must be a non-empty (n,), (n, 1), (n, 2) or (n, K) array; got shape {a.shape}"
        )
    if a.ndim == 2 and a.shape[1] == 0:
        raise ValueError(f"0 feature(s) (shape={a.shape}) while a minimum of 1 is required.")
    rows = full.reshape(full.shape[0], -1)
    for bad, what in (
        (~np.isfinite(rows), "Input contains NaN or infinity"),
        (rows < 0.0, "Negative values in data"),
        (rows > 1.0, "Values above 1 in data"),
    ):
        if bad.any():
            row = int(np.flatnonzero(bad.any(axis=1))[0])
            raise ValueError(f"{what}: scores row {row} is {full[row]}; scores are probabilities")
    if full.ndim == 2 and full.shape[1] >= 2:
        off = np.abs(full.sum(axis=1) - 1.0) > config.SCORES_SUM_TOL
        if off.any():
            row = int(np.flatnonzero(off)[0])
            raise ValueError(f"scores row {row}: class probabilities {full[row]} do not sum to 1")
    return np.ascontiguousarray(a)


def _labels(y) -> np.ndarray:
    """``y`` as a 1-D array of class labels; ValueError for a missing, 2-D or continuous y."""
    if y is None:
        raise ValueError("ScoreCalibrator requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D; got shape {y.shape}")
    kind = type_of_target(y)
    if kind not in ("binary", "multiclass"):
        raise ValueError(f"Unknown label type: {kind}; y must hold class labels")
    return y


class ScoreCalibrator(ClassifierMixin, BaseEstimator):
    """A calpipe calibrator as a scikit-learn estimator: probabilities in, calibrated ones out.

    Parameters
    ----------
    method : str
        Any of :func:`calpipe.methods` (default ``composite-experts``, the protected default).
    base_method, base_params : optional
        A stack: ``method`` applied to the forecasts of ``base_method`` (as in
        :func:`calpipe.protect`).
    **params
        The method's parameters (validated by its table at ``fit``); ``get_params`` /
        ``set_params`` / ``clone`` treat them like named arguments.

    Attributes
    ----------
    classes_ : ndarray
        The labels, in the order of ``predict_proba``'s columns.
    state_ : calpipe.StreamState
        The fitted state (JSON-serialisable; ``state_.log10_martingale`` is the test martingale
        of the base scores over the rows fitted).

    Examples
    --------
    >>> import numpy as np
    >>> from calpipe.sklearn import ScoreCalibrator
    >>> rng = np.random.default_rng(0)
    >>> p = rng.uniform(0.05, 0.95, 2000)
    >>> y = (rng.uniform(size=2000) < p**2).astype(int)  # the scores are too high
    >>> cal = ScoreCalibrator(method="platt").fit(p, y)
    >>> cal.predict_proba([[0.5]]).round(2)  # P(y = 1 | 0.5) = 0.25; Platt's logistic map is close
    array([[0.77, 0.23]])
    """

    def __init__(
        self,
        method: str = config.DEFAULT_METHOD,
        *,
        base_method: str | None = None,
        base_params: dict | None = None,
        **params: Any,
    ):
        self.method = method
        self.base_method = base_method
        self.base_params = base_params
        self._params = params

    # -- parameters: named arguments plus the method's own ----------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {
            "method": self.method,
            "base_method": self.base_method,
            "base_params": self.base_params,
            **self._params,
        }

    def set_params(self, **params: Any) -> ScoreCalibrator:
        for key in ("method", "base_method", "base_params"):
            if key in params:
                setattr(self, key, params.pop(key))
        self._params = {**self._params, **params}
        return self

    def _calibrator(self):
        return make_calibrator(
            self.method, base_method=self.base_method, base_params=self.base_params, **self._params
        )

    # -- fitting ----------------------------------------------------------------------------
    def _encode(self, y, n_scores_cols: int | None) -> np.ndarray:
        y = _labels(y)
        k = 2 if n_scores_cols is None else n_scores_cols
        if np.issubdtype(y.dtype, np.integer) and k > 2 and y.size and y.min() >= 0 and y.max() < k:
            classes = np.arange(k)
        else:
            classes = np.unique(y)
        if classes.shape[0] != k:
            raise ValueError(
                f"y has {classes.shape[0]} distinct label(s) {classes.tolist()[:10]}; the scores "
                f"have K = {k} classes (a binary calibrator needs samples of both classes)"
            )
        return classes

    def fit(self, X, y) -> ScoreCalibrator:
        """Run the calibrator over the rows in order; the fitted map is its state after them."""
        _labels(y)  # a missing or continuous y is named before the scores are read
        scores = _scores(X)
        self.classes_ = self._encode(y, None if scores.ndim == 1 else scores.shape[1])
        self.cal_ = self._calibrator()
        self.state_ = None
        return self._learn(scores, y)

    def partial_fit(self, X, y, classes=None) -> ScoreCalibrator:
        """Continue from the fitted state with more rows (fit(a); partial_fit(b) = fit(a + b)).
        The first call fits; ``classes`` (all labels, as scikit-learn's ``partial_fit`` takes
        them) fixes ``classes_`` when the first rows do not show every class."""
        if not hasattr(self, "state_"):
            if classes is None:
                return self.fit(X, y)
            _labels(y)
            scores = _scores(X)
            self.classes_ = self._encode(
                np.asarray(classes), None if scores.ndim == 1 else scores.shape[1]
            )
            self.cal_, self.state_ = self._calibrator(), None
        return self._learn(_scores(X), y)

    def _learn(self, scores: np.ndarray, y) -> ScoreCalibrator:
        y = _labels(y)
        if y.shape[0] != scores.shape[0]:
            raise ValueError(f"scores have {scores.shape[0]} rows, y has {y.shape[0]}")
        labels = np.searchsorted(self.classes_, y)
        unknown = (labels >= self.classes_.shape[0]) | (
            self.classes_[np.minimum(labels, self.classes_.shape[0] - 1)] != y
        )
        if unknown.any():
            i = int(np.flatnonzero(unknown)[0])
            raise ValueError(
                f"y[{i}] = {y[i].item()!r} is not one of the fitted classes {self.classes_.tolist()}"
            )
        try:
            _, self.state_ = self.cal_.run(scores, labels.astype(np.int64), state=self.state_)
        except InputError as exc:
            raise ValueError(str(exc)) from exc
        self.n_features_in_ = 1 if scores.ndim == 1 else scores.shape[1]
        return self

    # -- predicting -------------------------------------------------------------------------
    def predict_proba(self, X) -> np.ndarray:
        """Calibrated probabilities, one column per class of ``classes_``."""
        check_is_fitted(self, "state_")
        scores = _scores(X)
        k = self.classes_.shape[0]
        if (scores.ndim == 1) != (k == 2) or (scores.ndim == 2 and scores.shape[1] != k):
            raise ValueError(f"scores of shape {np.shape(X)} do not match the {k} fitted classes")
        if scores.ndim == 1 and (scores.min() < 0.0 or scores.max() > 1.0):
            raise ValueError("binary scores must be probabilities in [0, 1]")
        st = self.state_
        w = np.asarray(st.weights, dtype=np.float64)
        state = self.cal_.load_state(
            w, np.array([0, w.shape[0]]), np.array([st.log10_martingale]), k
        )
        out = self.cal_.serving_map(state, scores[None, ...])[0]
        return np.column_stack([1.0 - out, out]) if scores.ndim == 1 else out

    def predict(self, X) -> np.ndarray:
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True  # probabilities
        tags.classifier_tags.multi_class = True
        tags.non_deterministic = False
        return tags


class CalibratedClassifier(ClassifierMixin, BaseEstimator):
    """A classifier whose ``predict_proba`` is calibrated by a calpipe method.

    ``cv`` (int, splitter or iterable, as scikit-learn's): the calibrator is fitted on the
    out-of-fold ``predict_proba`` of clones of ``estimator`` (in row order: give the rows in time
    order for the protected methods), then ``estimator`` is refitted on every row, like
    ``CalibratedClassifierCV(ensemble=False)``. ``cv="prefit"``: ``estimator`` is already
    fitted; ``fit(X, y)`` fits the calibrator on its probabilities of (X, y).

    >>> import numpy as np
    >>> from sklearn.naive_bayes import GaussianNB
    >>> from calpipe.sklearn import CalibratedClassifier
    >>> rng = np.random.default_rng(1)
    >>> X = rng.normal(size=(3000, 4)); y = (X[:, 0] + rng.normal(size=3000) > 0).astype(int)
    >>> clf = CalibratedClassifier(GaussianNB(), method="isotonic", cv=3).fit(X, y)
    >>> clf.predict_proba(X[:2]).shape
    (2, 2)
    """

    def __init__(
        self,
        estimator=None,
        *,
        method: str = config.DEFAULT_METHOD,
        cv: Any = 5,
        calibrator_params: dict | None = None,
    ):
        self.estimator = estimator
        self.method = method
        self.cv = cv
        self.calibrator_params = calibrator_params

    def fit(self, X, y) -> CalibratedClassifier:
        if self.estimator is None:
            raise ValueError("CalibratedClassifier needs an estimator with predict_proba")
        if y is None:
            raise ValueError(
                "CalibratedClassifier requires y to be passed, but the target y is None"
            )
        y = column_or_1d(y, warn=True)
        if self.cv == "prefit":
            self.estimator_ = self.estimator
            check_is_fitted(self.estimator_)
            proba = self.estimator_.predict_proba(X)
        else:
            cv = check_cv(self.cv, y, classifier=True)
            proba = cross_val_predict(clone(self.estimator), X, y, cv=cv, method="predict_proba")
            self.estimator_ = clone(self.estimator).fit(X, y)
        self.classes_ = self.estimator_.classes_
        labels = np.searchsorted(self.classes_, y)
        self.calibrator_ = ScoreCalibrator(self.method, **(self.calibrator_params or {}))
        self.calibrator_.fit(proba, labels)
        self.n_features_in_ = getattr(self.estimator_, "n_features_in_", None)
        return self

    def predict_proba(self, X) -> np.ndarray:
        check_is_fitted(self, "calibrator_")
        return self.calibrator_.predict_proba(self.estimator_.predict_proba(X))

    def predict(self, X) -> np.ndarray:
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        if self.estimator is not None:  # the features go to the estimator: its input tags hold
            tags.input_tags = get_tags(self.estimator).input_tags
        return tags
