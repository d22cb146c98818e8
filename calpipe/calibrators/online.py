"""Online calibrators: they learn from every label as it arrives (no calibration window).

* :class:`VennPredictor` — the Venn predictor of paper 002 (Vovk, Shafer & Nouretdinov 2003) with
  a taxonomy on the base score (bins) or on a user column of integer categories: each event's
  multiprobability [p_lower, p_upper] comes from the labels of all earlier events of its category
  (kernel :func:`calpipe.kernels.venn.venn_online`).
* :class:`CalibratedRegression` — paper 004's Algorithm 2 (Foster & Kakade): online ridge
  regression of the label on test functions of the forecast itself (and of the base score, and
  indicators of a user column: calibration on subsequences, §IV), forecasting the fixed point
  y^ = clip(theta . f(y^)) (kernel :func:`calpipe.kernels.calibrated_regression.calibrated_regression_online`).

Both keep a fixed-length state per stream (counts; A and b of the ridge regression), so a stream
run in chunks with the state carried equals one pass bit for bit.

>>> import numpy as np
>>> from calpipe.calibrators import make_calibrator
>>> out, st = make_calibrator("venn-predictor", n_bins=2).run(
...     np.array([0.2, 0.3, 0.8, 0.25]), np.array([0, 1, 1, -1]))
>>> out.extra["p_lower"].round(3).tolist(), out.extra["p_upper"].round(3).tolist()
([0.0, 0.0, 0.0, 0.333], [1.0, 0.5, 1.0, 0.667])
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import Param, int_at_least, one_of
from calpipe.calibrators.base import (
    CLIP_PARAM,
    Calibrator,
    FlatState,
    RunOutput,
    check_state_length,
    tiled_state,
)
from calpipe.calibrators.gale import likelihood_gale
from calpipe.errors import ParameterError, StateError
from calpipe.kernels import calibrated_regression as CR
from calpipe.kernels import venn as V
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE, with_forecast_copies


def _edges_ok(v) -> bool:
    if v is None:
        return True
    try:
        a = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        return False
    return a.ndim == 1 and np.all(np.isfinite(a)) and np.all(np.diff(a) > 0)


_CATEGORY_COLUMN = Param(
    None,
    lambda v: v is None or (isinstance(v, str) and v != ""),
    "None or the name of an integer column",
    "user column of integer categories in [0, n_categories) (a taxonomy / subsequences)",
)


class OnlineCalibrator(Calibrator[FlatState]):
    """A method with a fixed-length state vector per stream and a sequential op-list kernel.

    Subclasses implement ``_state_size``, ``_initial_vector`` and ``_kernel`` (forecasts of every
    forecast op from the state arrays). The martingale of an update op uses the forecast the
    method would make at that op: for an update without its own forecast (a delayed label), a
    forecast-only op on a copy of the event is inserted just before it.
    """

    def __init__(self, **params):
        super().__init__(**params)
        #: The user column of integer categories the method reads, if any.
        self.category_column: str | None = self.params.get("category_column")
        # Pending labels carry their score, not their category: a category column needs them all.
        self.supports_label_time = self.category_column is None

    def input_columns(self) -> dict[str, str]:
        c = self.category_column
        return {} if c is None else {"categories": c}

    def n_categories_input(self) -> int | None:
        return self.params.get("n_categories") if self.category_column else None

    def state_size(self, n_classes: int) -> int:
        return self._state_size(n_classes)

    def initial_state(self, n_streams: int, n_classes: int) -> FlatState:
        return tiled_state(self._initial_vector(n_classes), n_streams)

    def state_from_flat(self, values, offsets, log10m, n_classes: int) -> FlatState:
        st = super().state_from_flat(values, offsets, log10m, n_classes)
        size = self._state_size(n_classes)
        check_state_length(st, size, self.name, n_classes)
        if size and st.n_streams:
            vectors = st.values[st.offsets[0] : st.offsets[-1]].reshape(st.n_streams, size)
            bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
            if bad.size:
                s = int(bad[0])
                raise StateError(f"method {self.name!r}: state vector {s} holds NaN or inf; "
                                 "state values must be finite", stream=s)  # fmt: skip
            self.check_state_vectors(vectors, n_classes)
        return st

    def run_unchecked(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        inputs = inputs or {}
        n = scores.shape[0]
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        size = self._state_size(n_classes)
        # A forecast op on a copy (event n + i) before each update-only op.
        ext_event, ext_kind, ext_offsets, src, _, upd_only = with_forecast_copies(
            op_event, op_kind, op_offsets, n
        )
        pseudo = n + np.arange(int(upd_only.sum()), dtype=np.int64)
        x = np.ascontiguousarray(scores[src])
        y = np.ascontiguousarray(labels[src])
        ext_inputs = {k: np.ascontiguousarray(v[src]) for k, v in inputs.items()}
        vectors = state.values.reshape(-1, size)
        p, lower, upper, new_vectors = self._kernel(
            x, y, ext_event, ext_kind, ext_offsets, vectors, n_classes, ext_inputs
        )
        # The forecast in force at each original op (update-only ops: their inserted copy).
        at_op = np.where(upd_only, 0, op_event)
        at_op[upd_only] = pseudo
        self.check_forecasts(p[at_op], op_event, op_offsets)
        log10m_op, log10m_end = likelihood_gale(
            p[at_op], self.martingale_base(scores[op_event]), labels[op_event],
            op_kind != OP_FORECAST, op_offsets, state.log10m, self.params["clip"],
        )  # fmt: skip
        shown = op_kind != OP_UPDATE
        out_m = np.full(n, np.nan)
        out_m[op_event[shown]] = log10m_op[shown]
        extra = {}
        if "p_lower" in self.extra_outputs:
            extra = {"p_lower": lower[:n], "p_upper": upper[:n]}
        new = FlatState(np.ascontiguousarray(new_vectors.ravel()), state.offsets.copy(), log10m_end)
        return RunOutput(p[:n], out_m, extra), new

    def check_forecasts(self, forecast, op_event, op_offsets) -> None:
        """StateError unless every forecast (one per op) is a probability: a state the load
        checks let through must not become silent NaN or out-of-[0, 1] forecasts."""
        ok = np.isfinite(forecast) & (forecast >= 0.0) & (forecast <= 1.0)
        if ok.ndim == 2:
            ok = ok.all(axis=1)
        if not ok.all():
            o = int(np.flatnonzero(~ok)[0])
            s = int(np.searchsorted(op_offsets, o, side="right") - 1)
            raise StateError(
                f"method {self.name!r}: stream {s}'s forecast of event {int(op_event[o])} is "
                f"{forecast[o].tolist()}, not a probability: its state is no state this method "
                "can have written",
                stream=s,
            )


class VennPredictor(OnlineCalibrator):
    """Venn predictor (paper 002, §3), online: each event's multiprobability from the labels of all
    earlier events in its category.

    With n_k earlier labelled events in the event's category and n_{k,c} of them in class c, the
    Venn multiprobability is {(n_{k,c} + [c = y]) / (n_k + 1) : y}: p_lower_c = n_{k,c}/(n_k + 1),
    p_upper_c = (n_{k,c} + 1)/(n_k + 1). The point forecast is the minimax log-loss merge (binary:
    p1 / (1 - p0 + p1) = (n_{k,1} + 1)/(n_k + 2); see :mod:`calpipe.kernels.venn`).

    Taxonomy: the base score's bin (``n_bins`` equal-width bins on [0, 1], or explicit ``edges``;
    K classes: predicted class x confidence bin), or ``category_column``. The bins are fixed in
    advance, as Venn validity needs (a taxonomy must not depend on the labels); equal-mass bins
    fitted on a calibration window are the batch method ``venn``.
    """

    name = "venn-predictor"
    summary = "Venn predictor (paper 002), online, taxonomy on score bins or a user column"
    extra_outputs = ("p_lower", "p_upper")
    parameters: ClassVar[dict[str, Param]] = {
        "n_bins": Param(
            config.VENN_DEFAULT_N_BINS,
            int_at_least(1),
            "an integer >= 1",
            "equal-width bins of the base score (of the top class probability for K classes)",
        ),
        "edges": Param(
            None,
            _edges_ok,
            "None or increasing interior bin edges",
            "explicit interior bin edges (instead of n_bins), e.g. equal-mass edges of past data",
            lambda v: v if v is None or not isinstance(v, list | tuple) else tuple(map(float, v)),
        ),
        "category_column": _CATEGORY_COLUMN,
        "n_categories": Param(
            None,
            lambda v: v is None or int_at_least(1)(v),
            "None or an integer >= 1 (required with category_column)",
            "number of categories of category_column",
        ),
        "clip": CLIP_PARAM,
    }

    check_params = (
        {"n_bins": 3},
        {"edges": (0.3, 0.6)},
        {"category_column": "segment", "n_categories": 3},
    )

    def _cross_checked(self, params: dict[str, Any]) -> dict[str, Any]:
        if (params["category_column"] is None) != (params["n_categories"] is None):
            raise ParameterError(
                "method 'venn-predictor': category_column and n_categories go together"
            )
        return params

    def edges(self) -> np.ndarray:
        e = self.params["edges"]
        if e is not None:
            return np.asarray(e, dtype=np.float64)
        b = self.params["n_bins"]
        return np.arange(1, b, dtype=np.float64) / b

    def map_breakpoints(self, state: FlatState) -> list[tuple[np.ndarray, bool] | None] | None:
        # score bins fixed in advance: every stream's map changes at the same edges
        if self.category_column is not None:
            return None
        return [(self.edges(), False)] * state.n_streams

    def _n_cat(self, n_classes: int) -> int:
        if self.category_column is not None:
            return int(self.params["n_categories"])
        return V.n_categories_of(self.edges(), n_classes, multiclass=n_classes > 2)

    def _state_size(self, n_classes: int) -> int:
        return self._n_cat(n_classes) * n_classes

    def sql_form(self, n_classes: int = 2) -> str | None:
        """K classes: the taxonomy's table of categories (a user taxonomy column: none)."""
        if n_classes > 2:
            return "categories" if self.category_column is None else None
        return super().sql_form(2)

    def k_categories(self, state: FlatState, n_classes: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """K classes, score taxonomy: each stream's ``(edges, forecasts)`` (each category's
        forecast from its counts, :func:`calpipe.kernels.venn.category_forecasts`)."""
        counts = state.values.reshape(state.n_streams, self._n_cat(n_classes), n_classes)
        return [V.category_forecasts(self.edges(), c) for c in counts]

    def _initial_vector(self, n_classes: int) -> np.ndarray:
        return np.zeros(self._state_size(n_classes))

    def check_state_vectors(self, vectors: np.ndarray, n_classes: int) -> None:
        """Each count n_{k,c} a whole number >= 0: the forecasts divide by n_k + 1 (a count
        of -1 divided by zero) and a fractional or negative count is no Venn predictor."""
        bad = np.flatnonzero(((vectors < 0) | (vectors != np.floor(vectors))).any(axis=1))
        if bad.size:
            s = int(bad[0])
            j = int(np.flatnonzero((vectors[s] < 0) | (vectors[s] != np.floor(vectors[s])))[0])
            raise StateError(
                f"method {self.name!r}: state vector {s} holds count {vectors[s, j]} at "
                f"position {j} (category {j // n_classes}, class {j % n_classes}); Venn counts "
                "must be whole numbers >= 0",
                stream=s,
            )

    def _kernel(self, x, y, ev, kind, off, vectors, n_classes, inputs):
        counts = vectors.reshape(-1, self._n_cat(n_classes), n_classes)
        cats = inputs.get("categories")
        edges = None if cats is not None else self.edges()
        p, lo, hi, new = V.venn_online(x, cats, y, ev, kind, off, counts, edges=edges)
        return p, lo, hi, new.reshape(vectors.shape[0], -1)


class CalibratedRegression(OnlineCalibrator):
    """Calibrated regression (paper 004, Algorithm 2): online ridge regression on test functions
    of the forecast y^, the base score and indicator columns, forecasting the fixed point
    y^ = clip_[0,1](theta . f(y^)), theta = A^{-1} b, A = I + sum f f^T, b = sum y f.

    Guarantee (paper 004, Thm. 3.3 / Cor. 4.1): on each subsequence i (indicator test function),
    |sum_t x_i(t) (y^_t - y_t)| <= 2 sqrt((T_i + 1)(d + 1) ln(T + 1)).
    """

    name = "calibrated-regression"
    summary = "calibrated regression with test functions (paper 004, Alg. 2), online"
    classes = "binary"
    parameters: ClassVar[dict[str, Param]] = {
        "powers": Param(
            config.CALREG_DEFAULT_POWERS,
            int_at_least(1),
            "an integer >= 1",
            "test functions y^, y^2, ..., y^powers of the forecast",
        ),
        "tents": Param(
            0,
            lambda v: int_at_least(0)(v) and v != 1,
            "0 or an integer >= 2",
            "tent functions on y^ at that many equally spaced knots of [0, 1]",
        ),
        "intercept": Param(
            True, one_of(True, False), "True or False", "the constant test function 1"
        ),
        "base_score": Param(
            True,
            one_of(True, False),
            "True or False",
            "the base score s as a test function (context)",
        ),
        "score_tents": Param(
            0,
            lambda v: int_at_least(0)(v) and v != 1,
            "0 or an integer >= 2",
            "tent functions on the base score at that many knots",
        ),
        "category_column": _CATEGORY_COLUMN,
        "n_categories": Param(
            0,
            int_at_least(0),
            "an integer >= 0 (>= 1 with category_column)",
            "indicator test functions of category_column: calibration on subsequences (§IV)",
        ),
        "clip": CLIP_PARAM,
    }

    check_params = (
        {"powers": 2, "score_tents": 3},
        {"tents": 3, "intercept": False, "category_column": "segment", "n_categories": 2},
    )

    def _cross_checked(self, params: dict[str, Any]) -> dict[str, Any]:
        if (params["category_column"] is None) != (params["n_categories"] == 0):
            raise ParameterError(
                "method 'calibrated-regression': category_column and n_categories >= 1 go together"
            )
        return params

    def _kw(self) -> dict:
        return {k: self.params[k] for k in ("powers", "tents", "intercept", "base_score",
                                             "score_tents", "n_categories")}  # fmt: skip

    def _state_size(self, n_classes: int) -> int:
        d = CR.feature_dim(**self._kw())
        return 1 + d * d + d

    def sql_form(self, n_classes: int = 2) -> str | None:
        """Paper 004 §IV's closed form (family ``calreg``), or the kernel's scan and bisection
        (``calreg_fp``); no K-class form."""
        if n_classes > 2:
            return None
        if self.linear_map(self.initial_state(1, 2)) is not None:
            return "calreg"
        if self.fixed_point_map(self.initial_state(1, 2)):
            return "calreg_fp"
        return super().sql_form(2)

    def linear_map(self, state: FlatState) -> np.ndarray | None:
        """Each stream's next forecast in §IV's closed form, when it has one (``powers`` = 1, no
        tents on y^, no category column: f_0 = y^ is the only test function of the forecast):
        rows ``[theta_0, theta_intercept, theta_score, theta of each score tent]`` (0 for an
        absent function), the forecast being y^ = clip(c / (1 - theta_0)) with c the static
        part when g(u) = c + (theta_0 - 1) u changes sign on [0, 1], else 0 if c <= 0 and 1
        (paper 004 §IV; :func:`calpipe.kernels.calibrated_regression._fixed_point`). None
        otherwise (the fixed point is then found by a scan and bisection)."""
        kw = self._kw()
        if kw["powers"] != 1 or kw["tents"] or kw["n_categories"]:
            return None
        th = CR.thetas(state.values.reshape(state.n_streams, -1), CR.feature_dim(**kw))
        return np.column_stack([th[:, :1], self._static_thetas(th, kw)])

    def fixed_point_map(self, state: FlatState) -> tuple[int, int, np.ndarray] | None:
        """Each stream's next forecast with powers of or tents on y^ (no closed form): the
        fixed point of g(u) = theta . f(u) - u found by a scan of
        :data:`~calpipe.config.CALREG_ROOT_GRID` cells and a bisection
        (:func:`calpipe.kernels.calibrated_regression._fixed_point`), from ``(powers, tents,
        rows)``, each row ``[theta of u, u^2, ..., u^powers, of each tent on u, then
        theta_intercept, theta_score, theta of each score tent]`` (0 for an absent static
        function). None with a category column (the map then needs that column, not only the
        score) and in the closed form (:meth:`linear_map`)."""
        kw = self._kw()
        if kw["n_categories"] or (kw["powers"] == 1 and not kw["tents"]):
            return None
        th = CR.thetas(state.values.reshape(state.n_streams, -1), CR.feature_dim(**kw))
        n_dyn = kw["powers"] + kw["tents"]
        rows = np.column_stack([th[:, :n_dyn], self._static_thetas(th, kw)])
        return kw["powers"], kw["tents"], rows

    @staticmethod
    def _static_thetas(th: np.ndarray, kw: dict) -> np.ndarray:
        """The columns ``[theta_intercept, theta_score, theta of each score tent]`` of the
        thetas ``th`` (S, D) in the kernel's layout (the test functions of y^ first), 0 for an
        absent intercept or score: the static part c of g(u), as the SQL macro
        ``calpipe_calreg_c`` reads it."""
        j = kw["powers"] + kw["tents"]
        zero = np.zeros((th.shape[0], 1))
        intercept = th[:, j : j + 1] if kw["intercept"] else zero
        j += int(kw["intercept"])
        score = th[:, j : j + 1] if kw["base_score"] else zero
        j += int(kw["base_score"])
        return np.column_stack([intercept, score, th[:, j : j + kw["score_tents"]]])

    def _initial_vector(self, n_classes: int) -> np.ndarray:
        return CR.initial_state(1, CR.feature_dim(**self._kw()))[0]

    def _kernel(self, x, y, ev, kind, off, vectors, n_classes, inputs):
        p, new = CR.calibrated_regression_online(
            x, y, ev, kind, off, np.ascontiguousarray(vectors),
            categories=inputs.get("categories"), **self._kw(),
        )  # fmt: skip
        return p, p, p, new


ONLINE_METHODS = (VennPredictor, CalibratedRegression)

__all__ = [
    "ONLINE_METHODS",
    "CalibratedRegression",
    "OnlineCalibrator",
    "VennPredictor",
]
