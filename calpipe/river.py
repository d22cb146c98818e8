"""River's online protocol over calpipe's calibrators (``pip install 'calpipe[river]'``).

:class:`Protected` wraps a river classifier and protects its probabilities event by event, as
paper 001 §5.3 protects online models: ``predict_proba_one(x)`` is the calibrator's forecast of
the model's current P(y | x); ``learn_one(x, y)`` teaches the calibrator the label at that
base probability, then the model. :class:`CalibrationMonitor` is the drift-detector view:
``update(p, y)`` with a forecast and its label, ``drift_detected`` when the test martingale of
the forecasts first reaches ``threshold`` (Ville's inequality: a calibrated forecaster does that
with probability at most 1 / threshold).

Both run any calpipe method on one stream; they equal :func:`calpipe.protect` of the same base
probabilities with each label known at its own event, bit for bit (tests/test_river.py). For
the binary log-loss mixtures (``composite-jumper``, ``jumper``, ``mean-jumper``) each event is
one call of :func:`calpipe.kernels.mixture.binary_event` on the object's own state buffers
(BENCHMARKS.md: the wrapper's rate in events/s); every other method and K >= 3 classes run
each event through the method's batch kernel (``run_batch`` on one event), which costs tens of
microseconds an event.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from river import base

from calpipe.calibrators import make_calibrator
from calpipe.calibrators.protected import ProtectedCalibrator
from calpipe.errors import ParameterError
from calpipe.kernels.mixture import binary_event
from calpipe.kernels.ops import OP_FORECAST, OP_STEP, OP_UPDATE

__all__ = ["CalibrationMonitor", "Protected"]

#: The method paper 001 §5.3 protects online models with (and the one with the per-event kernel).
ONLINE_DEFAULT_METHOD = "composite-jumper"

_ONE = np.array([0, 1], dtype=np.int64)
_EVENT0 = np.zeros(1, dtype=np.int64)
_KINDS = {k: np.full(1, k, dtype=np.int8) for k in (OP_FORECAST, OP_STEP)}


class _OnlineStream:
    """One stream of a calibrator fed one event at a time: ``forecast(p)`` (learns nothing) and
    ``learn(p, y)`` (the label of an event forecast with base ``p``)."""

    def __init__(self, method: str, params: dict | None, n_classes: int):
        self.cal = make_calibrator(method, **(params or {}))
        self.cal.check_classes(n_classes)
        self.n_classes = n_classes
        self.clip = self.cal.params.get("clip")
        self.fast = (
            n_classes == 2
            and isinstance(self.cal, ProtectedCalibrator)
            and self.cal.loss == "log"
            and not self.cal.input_columns()
        )
        self.reset()

    def reset(self) -> None:
        self.state = self.cal.initial_state(1, self.n_classes)
        if self.fast:
            fam = self.cal.family(2)
            self._code, self._params = fam.code, np.ascontiguousarray(fam.params)
            self._rates = np.ascontiguousarray(self.cal.rates, dtype=np.float64)
            # the object's own buffers, which binary_event updates in place event by event
            self._a = self.state.active[0].ravel().copy()
            self._pm = np.array([self.state.passive[0], self.state.log10m[0]])
            self._lo, self._hi = self.clip, 1.0 - self.clip

    @property
    def log10_martingale(self) -> float:
        return float(self._pm[1]) if self.fast else float(self.state.log10m[0])

    def _run(self, p, y: int, kind: int):
        scores = self.cal.prepare_scores(np.asarray([p], dtype=np.float64))
        return self.cal.run_unchecked(
            scores, np.full(1, y, dtype=np.int64), _EVENT0, _KINDS[kind], _ONE, self.state
        )

    def forecast(self, p):
        """The calibrated forecast of an event with base ``p`` (P(y=1), or K probabilities)."""
        if self.fast:
            pe = min(max(p, self._lo), self._hi)  # prepare_scores' clip, on a float
            return binary_event(
                pe, 0, OP_FORECAST, self._code, self._params, self._rates, self._a, self._pm
            )
        out, _ = self._run(p, 0, OP_FORECAST)  # a forecast leaves the state as it was
        return out.protected[0]

    def learn(self, p, y: int) -> None:
        """Learn label ``y`` (class index) of an event whose base forecast was ``p``."""
        if self.fast:
            pe = min(max(p, self._lo), self._hi)
            binary_event(pe, y, OP_UPDATE, self._code, self._params, self._rates, self._a, self._pm)
            return
        _, self.state = self._run(p, y, OP_STEP)  # a step = its forecast + its update


def _base_vector(proba: dict, classes: tuple) -> np.ndarray:
    """A river ``predict_proba_one`` dict as K probabilities in the order of ``classes``: missing
    classes get 0, and a model that knows nothing yet (all zero) gives the uniform vector."""
    v = np.array([float(proba.get(c, 0.0)) for c in classes])
    total = v.sum()
    return v / total if total > 0 else np.full(len(classes), 1.0 / len(classes))


class Protected(base.Wrapper, base.Classifier):
    """A river classifier whose probabilities are protected online by a calpipe calibrator.

    Parameters
    ----------
    model : river.base.Classifier
        Any classifier with ``predict_proba_one``.
    method : str
        A calpipe method (default ``composite-jumper``: paper 001's Composite Jumper).
    params : dict, optional
        The method's parameters (validated by its table).
    classes : tuple
        The labels, negative first for a binary model (default ``(False, True)``, river's
        binary labels; ``(0, 1)`` for integer labels); K >= 3 labels for a multiclass model.

    Examples
    --------
    >>> from river import datasets, linear_model
    >>> from calpipe.river import Protected
    >>> model = Protected(linear_model.LogisticRegression())
    >>> for x, y in datasets.Phishing():
    ...     p = model.predict_proba_one(x)[True]
    ...     model.learn_one(x, y)
    >>> round(model.log10_martingale, 2) > 0  # the protection beat the raw model's log loss
    True
    """

    def __init__(
        self,
        model: base.Classifier,
        method: str = ONLINE_DEFAULT_METHOD,
        params: dict | None = None,
        classes: tuple = (False, True),
    ):
        self.model = model
        self.method = method
        self.params = params
        self.classes = tuple(classes)
        if len(self.classes) < 2 or len(set(self.classes)) != len(self.classes):
            raise ParameterError(f"classes must be >= 2 distinct labels; got {classes!r}")
        self._index = {c: i for i, c in enumerate(self.classes)}
        self._stream = _OnlineStream(method, params, len(self.classes))
        self._last_x: Any = None
        self._last_p: Any = None

    @property
    def _wrapped_model(self):
        return self.model

    @property
    def _multiclass(self) -> bool:
        return len(self.classes) > 2

    @classmethod
    def _unit_test_params(cls):
        from river import linear_model

        yield {"model": linear_model.LogisticRegression()}

    @property
    def log10_martingale(self) -> float:
        """log10 of the test martingale of the model's probabilities over the labels learnt."""
        return self._stream.log10_martingale

    def _base(self, x):
        # learn_one(x, y) right after predict_proba_one(x) reuses the model's probability (the
        # model has not learnt since): one model call per event instead of two.
        if x is self._last_x:
            return self._last_p
        proba = self.model.predict_proba_one(x)
        if len(self.classes) == 2:
            neg, pos = self.classes
            p1, p0 = proba.get(pos, 0.0), proba.get(neg, 0.0)
            total = p0 + p1
            p = p1 / total if total > 0 else 0.5
        else:
            p = _base_vector(proba, self.classes)
        self._last_x, self._last_p = x, p
        return p

    def predict_proba_one(self, x, **kwargs) -> dict:
        q = self._stream.forecast(self._base(x))
        if len(self.classes) == 2:
            return {self.classes[0]: 1.0 - q, self.classes[1]: q}
        return dict(zip(self.classes, q.tolist(), strict=True))

    def learn_one(self, x, y, **kwargs) -> None:
        try:
            label = self._index[y]
        except KeyError:
            raise ValueError(f"label {y!r} is not one of classes={self.classes!r}") from None
        self._stream.learn(self._base(x), label)
        self._last_x = self._last_p = None
        self.model.learn_one(x, y, **kwargs)


class CalibrationMonitor(base.Base):
    """An anytime-valid calibration drift detector: the test martingale of a stream of forecasts.

    ``update(p, y)`` takes a forecast P(y = 1) (or a dict of class probabilities) and its label;
    ``drift_detected`` is True on the update where the martingale of ``method`` (default the
    Composite Jumper, paper 001 Algorithm 1, over the forecasts as its base) first reaches
    ``threshold``. With ``reset=True`` (river's detector habit) the test then restarts from
    nothing, so each detection is a new test at level 1 / threshold.

    >>> import random
    >>> from calpipe.river import CalibrationMonitor
    >>> rng = random.Random(0)
    >>> monitor = CalibrationMonitor()
    >>> for i in range(4000):
    ...     p = rng.uniform(0.1, 0.9)
    ...     y = rng.random() < (p if i < 2000 else p**3)  # miscalibrated from event 2000
    ...     _ = monitor.update(p, y)
    ...     if monitor.drift_detected:
    ...         print("drift at", i)
    ...         break
    drift at 2080
    """

    def __init__(
        self,
        method: str = ONLINE_DEFAULT_METHOD,
        params: dict | None = None,
        threshold: float = 100.0,
        reset: bool = True,
        classes: tuple = (False, True),
    ):
        if not threshold > 1.0:
            raise ParameterError(
                f"threshold must be > 1 (a martingale starts at 1); got {threshold}"
            )
        self.method = method
        self.params = params
        self.threshold = threshold
        self.reset = reset
        self.classes = tuple(classes)
        self._index = {c: i for i, c in enumerate(self.classes)}
        self._level = math.log10(threshold)
        self._stream = _OnlineStream(method, params, len(self.classes))
        self.drift_detected = False
        self.n_detections = 0
        self._max = 0.0  # the current test's running maximum of log10 S

    @property
    def log10_martingale(self) -> float:
        """log10 of the current test's martingale (since the start or the last detection)."""
        return self._stream.log10_martingale

    def update(self, p, y) -> CalibrationMonitor:
        if isinstance(p, dict):
            v = _base_vector(p, self.classes)
            p = v[1] if len(self.classes) == 2 else v
        try:
            label = self._index[y]  # (0 and 1 find False and True: equal keys in a dict)
        except KeyError:
            raise ValueError(f"label {y!r} is not one of classes={self.classes!r}") from None
        if self.drift_detected and self.reset:
            self._stream.reset()
            self._max = 0.0
        self._stream.learn(p, label)
        now = self._stream.log10_martingale
        self.drift_detected = self._max < self._level <= now  # the first crossing of this test
        self._max = max(self._max, now)
        self.n_detections += self.drift_detected
        return self
