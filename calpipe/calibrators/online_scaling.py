"""Online scaling with calibeating (Gupta & Ramdas, "Online Platt Scaling with Calibeating",
ICML 2023): every label updates the map at once, no calibration window.

==================  ==================================================================  =========
method              forecast                                                           K classes
==================  ==================================================================  =========
``ops``             Online Platt Scaling: sigmoid(a logit p + b), (a, b) by the Online   vector
                    Newton Step (G&R §2, Algorithm 1)                                    scaling
``tops``            OPS + tracking calibeating (G&R §3.1)                               binary
``hops``            OPS + hedging calibeating (G&R §3.2)                                binary
``obs``             online beta scaling: sigmoid(a ln p - b ln(1 - p) + c) by the same  binary
                    ONS (G&R §5)
``tobs``, ``hobs``  online beta scaling + tracking / hedging calibeating (G&R §5)       binary
``online-histogram`` online histogram binning: the mean label of earlier events in the    binary
                    base forecast's equal-width bin (tracking calibeating of the base)
``oms``             online matrix scaling: softmax(W ln q + b), (W, b) in R^{K^2 + K} by    matrix
                    the same ONS from the identity (W = I, b = 0); binary: online beta    scaling
                    scaling, the same model family (``obs``)
==================  ==================================================================  =========

K classes (``ops`` only): the multinomial analogue is **online vector scaling**, softmax of
a_k ln p_k + b_k with (a, b) in R^2K learnt by the same ONS from the identity (a = 1, b = 0).
It is the per-class form of Platt scaling of Guo et al. (2017); unlike one-vs-rest scaling with
renormalisation it is a proper K-class likelihood, so the ONS regret bound holds as is, and b
follows shifts of the class priors directly. Calibeating is defined for binary forecasts only.

Regret (Hazan 2016, Thm. 4.5; G&R Thm. 2.1): the cumulative log loss of OPS/OBS exceeds that of
the best fixed map with ||theta|| <= B in hindsight by O(d log T); tracking/hedging calibeating
add calibration on top (G&R Thms. 3.1-3.2: the Brier score of TOPS beats OPS's by its sharpness
term; HOPS is also calibrated for adversarial sequences, up to the grid width).

K classes (``oms``): **online matrix scaling**, the full-matrix form of Guo et al. (2017):
softmax(W ln q + b), W K x K, learnt by the same ONS (G&R Algorithm 1) over the K^2 + K
parameters. It contains vector scaling (W diagonal) and can move probability between classes
(a class confused with another), at K^2 - K more parameters: the regret term grows from 2K to
K^2 + K times O(log T), the state to d + d^2 = O(K^4) doubles and a label costs O(K^6) flops
(:data:`calpipe.config.OMS_MAX_CLASSES` bounds K; see the kernel's docstring). Binary scores:
matrix scaling of (1 - p, p) is sigmoid((W_11 - W_01) ln p + (W_10 - W_00) ln(1 - p) + b_1 -
b_0), beta scaling's family, so ``oms`` runs online beta scaling (``obs``'s identifiable
parametrisation) there.

Every method keeps a fixed-length state per stream ([theta, A, calibeating statistics]), so a
stream run in chunks with the state carried equals one pass bit for bit. Kernel:
:func:`calpipe.kernels.online_scaling.online_scaling`.

>>> import numpy as np
>>> from calpipe.calibrators import make_calibrator
>>> out, st = make_calibrator("ops").run(np.array([0.9, 0.9, 0.9]), np.array([0, 0, -1]))
>>> out.protected.round(3).tolist()  # the identity first, then it learns the zeros
[0.9, 0.845, 0.776]
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import Param, int_at_least, number_in
from calpipe.calibrators.base import CLIP_PARAM, FlatState
from calpipe.calibrators.online import OnlineCalibrator
from calpipe.errors import ParameterError, StateError
from calpipe.kernels import online_scaling as OS

_ONS_PARAMS: dict[str, Param] = {
    "gamma": Param(
        config.OPS_GAMMA,
        number_in(0.0, np.inf),
        "a number > 0",
        "Online Newton Step: the step is A^-1 g / gamma (config.OPS_GAMMA)",
    ),
    "radius": Param(
        config.OPS_RADIUS,
        number_in(0.0, np.inf),
        "a number > 0",
        "the parameters are projected on the ball ||theta|| <= radius (config.OPS_RADIUS)",
    ),
    "rho": Param(
        config.OPS_RHO,
        number_in(0.0, np.inf),
        "a number > 0",
        "initial curvature A_0 = rho I of the Online Newton Step (config.OPS_RHO)",
    ),
    "score_clip": Param(
        config.OPS_SCORE_CLIP,
        number_in(0.0, 0.5),
        "a number in (0, 0.5)",
        "the base forecast is clipped to [score_clip, 1 - score_clip] in the features",
    ),
}
_BINS = Param(
    config.CALIBEATING_N_BINS,
    int_at_least(1),
    "an integer >= 1",
    "equal-width bins of the expert's forecast (config.CALIBEATING_N_BINS)",
)


class OnlineScaling(OnlineCalibrator):
    """A scaling model learnt online by the Online Newton Step, optionally calibeaten.

    Subclasses set ``model`` (:mod:`calpipe.kernels.online_scaling` ``MODEL_*``) and
    ``calibeat`` (``CALIBEAT_*``); K-class scores run the vector model (``ops`` only).
    """

    model: ClassVar[int] = OS.MODEL_PLATT
    calibeat: ClassVar[int] = OS.CALIBEAT_NONE
    classes = "binary"
    parameters: ClassVar[dict[str, Param]] = {
        **_ONS_PARAMS,
        "n_bins": _BINS,
        "clip": CLIP_PARAM,
    }
    check_params = ({}, {"radius": 1.5, "rho": 1.0, "n_bins": 4})

    def _get(self, key: str):
        """A parameter, or its default where the method has no such parameter (``ops`` has no
        bins, ``online-histogram`` no ONS): the kernel takes them all."""
        if key in self.params:
            return self.params[key]
        return (_ONS_PARAMS | {"n_bins": _BINS})[key].default

    def _model(self, n_classes: int) -> int:
        return OS.MODEL_VECTOR if n_classes > 2 else self.model

    def _shapes(self, n_classes: int) -> tuple[int, int, int]:
        d = OS.n_params(self._model(n_classes), n_classes)
        nb = self._get("n_bins")
        w = OS.beat_width(self.calibeat, nb)
        return d, (nb if w else 0), w

    def _state_size(self, n_classes: int) -> int:
        d, nb, w = self._shapes(n_classes)
        return d + d * d + nb * w

    def _initial_vector(self, n_classes: int) -> np.ndarray:
        theta, a, beat = OS.initial_state(
            1, self._model(n_classes), n_classes, self.calibeat, self._get("n_bins"),
            self._get("rho"),
        )  # fmt: skip
        return np.concatenate([theta.ravel(), a.ravel(), beat.ravel()])

    def check_state_vectors(self, vectors: np.ndarray, n_classes: int) -> None:
        """The invariants of ``[theta, A, calibeating statistics]`` the kernel keeps (a state
        breaking one overflowed to NaN forecasts, divided by zero or forecast outside [0, 1]):

        * ``||theta|| <= max(radius, ||theta_1||)``: the ONS projects every step on the ball
          (theta_1, the identity, may lie outside a small one until the first label);
        * ``A`` symmetric, every entry at most :data:`calpipe.config.OPS_CURVATURE_MAX` in
          magnitude and its smallest eigenvalue at least rho / 2 (A = rho I + sum g g^T);
        * tracking: per bin, whole numbers 0 <= (sum of labels) <= (count).
        """
        d, nb, w = self._shapes(n_classes)
        n = vectors.shape[0]
        checks: list[tuple[np.ndarray, str]] = [
            (~np.isfinite(vectors).all(axis=1), "it holds NaN or inf")
        ]
        if d:
            theta = vectors[:, :d]
            a = vectors[:, d : d + d * d].reshape(n, d, d)
            radius = max(float(self._get("radius")), float(np.linalg.norm(self._initial_vector(
                n_classes)[:d])))  # fmt: skip
            with np.errstate(over="ignore"):
                norm = np.sqrt(np.sum(theta * theta, axis=1))
            checks.append((norm > radius * (1.0 + 1e-9),
                           f"theta's norm exceeds the projection radius {radius:g}"))  # fmt: skip
            big = np.abs(a).max(axis=(1, 2)) > config.OPS_CURVATURE_MAX
            checks.append((big, f"A has an entry beyond {config.OPS_CURVATURE_MAX:g} in magnitude"))
            checks.append(((a != a.transpose(0, 2, 1)).any(axis=(1, 2)), "A is not symmetric"))
            weak = np.zeros(n, dtype=bool)
            fine = np.flatnonzero(~big & ~checks[0][0])
            rho = float(self._get("rho"))
            if fine.size:
                weak[fine] = ~(np.linalg.eigvalsh(a[fine])[:, 0] >= 0.5 * rho)
            checks.append((weak, f"A's smallest eigenvalue is below rho / 2 = {0.5 * rho:g} "
                                 "(A = rho I + sum g g^T is positive-definite)"))  # fmt: skip
        if self.calibeat == OS.CALIBEAT_TRACKING:
            beat = vectors[:, d + d * d :].reshape(n, nb, w)
            sums, counts = beat[:, :, 0], beat[:, :, 1]
            off = (sums < 0) | (sums > counts) | (sums != np.floor(sums))
            off |= counts != np.floor(counts)
            checks.append((off.any(axis=1), "a bin's (sum of labels, count) are not whole "
                                            "numbers with 0 <= sum <= count"))  # fmt: skip
        for mask, rule in checks:
            bad = np.flatnonzero(mask)
            if bad.size:
                s = int(bad[0])
                raise StateError(
                    f"method {self.name!r}: state vector {s} is no state of this method: {rule} "
                    f"(layout: theta ({d}), A ({d}x{d}), calibeating statistics ({nb}x{w}))",
                    stream=s,
                )

    def has_logistic_map(self) -> bool:
        return self.calibeat == OS.CALIBEAT_NONE and self.model != OS.MODEL_NONE

    def sql_form(self, n_classes: int = 2) -> str | None:
        """The logistic map (K classes: the vector map), or a calibeating method's two layers."""
        if n_classes > 2:
            return "vector" if self.has_logistic_map() else None
        if self.has_logistic_map():
            return "logistic"
        return "calibeat" if self.calibeat else super().sql_form(2)

    def logistic_map(self, state: FlatState) -> np.ndarray:
        """Each stream's current binary map as ``[w1, w2, w0, eps]``: sigmoid(w1 ln c(p) - w2
        ln(1 - c(p)) + w0), c the feature clip to [eps, 1 - eps] (the SQL form of an input of
        ``composite-experts``). Platt's theta = (a, b) gives (a, a, b); beta's (a, b, c) gives
        (a, b, c). Only without calibeating: a bin table has no such form."""
        if not self.has_logistic_map():
            raise ParameterError(f"method {self.name!r} has no logistic serving map")
        return self._expert_logistic(state)

    def _expert_logistic(self, state: FlatState) -> np.ndarray:
        d = OS.n_params(self.model, 2)
        theta = state.values.reshape(state.n_streams, -1)[:, :d]
        w = theta[:, [0, 0, 1]] if self.model == OS.MODEL_PLATT else theta
        eps = np.full((state.n_streams, 1), float(self._get("score_clip")))
        return np.ascontiguousarray(np.hstack([w, eps]))

    def k_input_map(self, state: FlatState, n_classes: int) -> np.ndarray:
        """The K-class map as the input of a map term (``in_ka``, ``in_kb``, ``in_eps``):
        :meth:`vector_map` (``ops``; :meth:`OMS.matrix_map` for ``oms``)."""
        return self.vector_map(state, n_classes)

    def vector_map(self, state: FlatState, n_classes: int) -> np.ndarray:
        """Each stream's current K-class map (online vector scaling) as ``[a_1..a_K, b_1..b_K,
        eps]``: softmax(a_c ln c_c + b_c), c the row floored at eps and renormalised (the
        kernel's ``_vector_forecast``; the SQL form of ``ops`` and of a K-class input of
        ``composite-experts``)."""
        if n_classes <= 2 or self.calibeat != OS.CALIBEAT_NONE or self.model == OS.MODEL_NONE:
            raise ParameterError(f"method {self.name!r} has no K-class vector map")
        d = OS.n_params(OS.MODEL_VECTOR, n_classes)
        theta = state.values.reshape(state.n_streams, -1)[:, :d]
        eps = np.full((state.n_streams, 1), float(self._get("score_clip")))
        return np.ascontiguousarray(np.hstack([theta, eps]))

    def calibeat_map(self, state: FlatState) -> tuple[np.ndarray | None, np.ndarray]:
        """A calibeating method's binary map in two steps: the expert's logistic map ``[w1, w2,
        w0, eps]`` per stream (None for ``online-histogram``: the expert is the base score), then
        per stream and equal-width bin of the expert's forecast the value forecast
        (:func:`calpipe.kernels.online_scaling.calibeat_table`; NaN: the expert's forecast)."""
        if self.calibeat == OS.CALIBEAT_NONE:
            raise ParameterError(f"method {self.name!r} does not calibeat")
        d, nb, w = self._shapes(2)
        beat = state.values.reshape(state.n_streams, -1)[:, d + d * d :].reshape(-1, nb, w)
        table = OS.calibeat_table(beat, self.calibeat, nb)
        expert = None if self.model == OS.MODEL_NONE else self._expert_logistic(state)
        return expert, table

    def _kernel(self, x, y, ev, kind, off, vectors, n_classes, inputs):
        d, nb, w = self._shapes(n_classes)
        s = vectors.shape[0]
        theta = vectors[:, :d]
        a = vectors[:, d : d + d * d].reshape(s, d, d)
        beat = vectors[:, d + d * d :].reshape(s, nb, w)
        p, theta, a, beat = OS.online_scaling(
            x, y, ev, kind, off, theta, a, beat, self._model(n_classes), self.calibeat,
            self._get("gamma"), self._get("radius"), self._get("score_clip"),
            self._get("n_bins"),
        )  # fmt: skip
        new = np.concatenate([theta, a.reshape(s, -1), beat.reshape(s, -1)], axis=1)
        return p, p, p, new


class OPS(OnlineScaling):
    """Online Platt Scaling (G&R §2, Algorithm 1): sigmoid(a logit p + b), (a, b) by the Online
    Newton Step from (1, 0); K classes: online vector scaling (module docstring)."""

    name = "ops"
    summary = "Online Platt Scaling (Gupta & Ramdas 2023, Alg. 1); K classes: online vector scaling"
    classes = "both"
    parameters: ClassVar[dict[str, Param]] = {**_ONS_PARAMS, "clip": CLIP_PARAM}
    check_params = ({}, {"radius": 1.5, "rho": 1.0})


class TOPS(OnlineScaling):
    """OPS + tracking calibeating (G&R §3.1): the mean label of earlier events whose OPS forecast
    fell in the same bin (the OPS forecast while the bin is empty)."""

    name = "tops"
    summary = "OPS + tracking calibeating (Gupta & Ramdas 2023, §3.1)"
    calibeat = OS.CALIBEAT_TRACKING


class HOPS(OnlineScaling):
    """OPS + hedging calibeating (G&R §3.2): Foster's (1999) calibrated forecaster within each bin
    of the OPS forecast, forecasting its expected value (module docstring of the kernel)."""

    name = "hops"
    summary = "OPS + hedging calibeating (Gupta & Ramdas 2023, §3.2)"
    calibeat = OS.CALIBEAT_HEDGING


class OBS(OnlineScaling):
    """Online beta scaling (G&R §5): sigmoid(a ln p - b ln(1 - p) + c), (a, b, c) by the Online
    Newton Step from (1, 1, 0) (beta calibration of Kull, Silva Filho & Flach 2017, online)."""

    name = "obs"
    summary = "online beta scaling (Gupta & Ramdas 2023, §5)"
    model = OS.MODEL_BETA
    parameters: ClassVar[dict[str, Param]] = {**_ONS_PARAMS, "clip": CLIP_PARAM}
    check_params = ({}, {"radius": 1.5, "rho": 1.0})


class TOBS(OBS):
    """Online beta scaling + tracking calibeating (G&R §5)."""

    name = "tobs"
    summary = "online beta scaling + tracking calibeating (Gupta & Ramdas 2023, §5)"
    calibeat = OS.CALIBEAT_TRACKING
    parameters = OnlineScaling.parameters
    check_params = OnlineScaling.check_params


class HOBS(OBS):
    """Online beta scaling + hedging calibeating (G&R §5)."""

    name = "hobs"
    summary = "online beta scaling + hedging calibeating (Gupta & Ramdas 2023, §5)"
    calibeat = OS.CALIBEAT_HEDGING
    parameters = OnlineScaling.parameters
    check_params = OnlineScaling.check_params


class OnlineHistogram(OnlineScaling):
    """Online histogram binning: the mean label of earlier events whose base forecast fell in the
    same equal-width bin, the base forecast while the bin is empty (tracking calibeating of the
    base itself, G&R §3.1 with the identity as expert)."""

    name = "online-histogram"
    summary = "online histogram binning: running mean label per equal-width base-score bin"
    model = OS.MODEL_NONE
    calibeat = OS.CALIBEAT_TRACKING
    parameters: ClassVar[dict[str, Param]] = {"n_bins": _BINS, "clip": CLIP_PARAM}
    check_params = ({}, {"n_bins": 3})


class OMS(OnlineScaling):
    """Online matrix scaling (module docstring): softmax(W ln q + b), theta = (W row-major, b)
    by the Online Newton Step of G&R Algorithm 1 (Hazan 2016, Algorithm 12) from the identity
    (W = I, b = 0: the base); binary scores: online beta scaling (``obs``), the same family.

    State of a stream (K classes): ``[theta (K^2 + K), A ((K^2 + K) x (K^2 + K))]``; binary:
    ``obs``'s ``[theta (3), A (3 x 3)]``. K is at most :data:`calpipe.config.OMS_MAX_CLASSES`.
    """

    name = "oms"
    summary = (
        "online matrix scaling: softmax(W ln p + b) by the Online Newton Step (Gupta & Ramdas "
        "2023, Alg. 1, full K x K + K); binary: online beta scaling"
    )
    classes = "both"
    model = OS.MODEL_BETA
    parameters: ClassVar[dict[str, Param]] = {**_ONS_PARAMS, "clip": CLIP_PARAM}
    check_params = ({}, {"radius": 1.5, "rho": 1.0})

    def _model(self, n_classes: int) -> int:
        return OS.MODEL_MATRIX if n_classes > 2 else self.model

    def check_classes(self, n_classes: int) -> None:
        super().check_classes(n_classes)
        if n_classes > config.OMS_MAX_CLASSES:
            raise ParameterError(
                f"method {self.name!r} learns K^2 + K parameters with a (K^2 + K)^2 Newton matrix "
                f"per stream: at most K = {config.OMS_MAX_CLASSES} classes "
                f"(config.OMS_MAX_CLASSES); the frame has K = {n_classes} (use 'ops', online "
                "vector scaling, 2K parameters)"
            )

    def sql_form(self, n_classes: int = 2) -> str | None:
        """K classes: the matrix map; binary: the logistic (beta) map."""
        return "matrix" if n_classes > 2 else "logistic"

    def vector_map(self, state: FlatState, n_classes: int) -> np.ndarray:
        raise ParameterError(f"method {self.name!r} has a K-class matrix map, not a vector map")

    def k_input_map(self, state: FlatState, n_classes: int) -> np.ndarray:
        return self.matrix_map(state, n_classes)

    def matrix_map(self, state: FlatState, n_classes: int) -> np.ndarray:
        """Each stream's current K-class map as ``[W_11..W_1K, ..., W_K1..W_KK, b_1..b_K,
        eps]``: softmax(W ln c + b), c the row floored at eps and renormalised (the kernel's
        ``_matrix_forecast``; the SQL form of ``oms`` and of an ``oms`` input of
        ``composite-experts``)."""
        if n_classes <= 2:
            raise ParameterError(f"method {self.name!r}: the matrix map is K-class (K >= 3)")
        d = OS.n_params(OS.MODEL_MATRIX, n_classes)
        theta = state.values.reshape(state.n_streams, -1)[:, :d]
        eps = np.full((state.n_streams, 1), float(self._get("score_clip")))
        return np.ascontiguousarray(np.hstack([theta, eps]))


def vector_as_matrix(v: np.ndarray, n_classes: int) -> np.ndarray:
    """Vector maps ``[a (K), b (K), eps]`` (rows) as matrix maps ``[diag(a) row-major, b, eps]``:
    the same map (the off-diagonal zeros add exact zeros to each logit)."""
    k = n_classes
    v = np.asarray(v, dtype=np.float64)
    out = np.zeros((*v.shape[:-1], k * k + k + 1))
    out[..., : k * k : k + 1] = v[..., :k]
    out[..., k * k :] = v[..., k:]
    return out


ONLINE_SCALING_METHODS = (OPS, TOPS, HOPS, OBS, TOBS, HOBS, OnlineHistogram, OMS)

__all__ = [
    "HOBS",
    "HOPS",
    "OBS",
    "OMS",
    "ONLINE_SCALING_METHODS",
    "OPS",
    "TOBS",
    "TOPS",
    "OnlineHistogram",
    "OnlineScaling",
    "vector_as_matrix",
]
