"""Batch calibrators applied prequentially: fit on a window of labelled events, apply to later ones.

A batch method (Venn-ABERS, isotonic, Platt, ...) is a pair of kernel functions
``fit(scores, labels, **kw) -> fitted vector`` and ``predict(fitted, scores, **kw) -> Prediction``
(the contract of :mod:`calpipe.kernels.prediction`). :class:`WindowedCalibrator` turns such a pair
into a calibrator of the streaming protocol (:mod:`calpipe.calibrators.base`):

* labelled events enter a stream's calibration window in the order their labels are learnt
  (the op list's updates), which keeps the last ``window`` of them;
* the first fit happens right after the ``window``-th label; with ``refit_every = M`` the map is
  refitted on the trailing window after every further M labels, otherwise it stays frozen (the
  inductive setting: "calibrate on the first N events");
* each event is forecast with the map in force when it is forecast (so, prequentially, only on
  labels learnt strictly before it); before the first fit the base score passes through.

With u = the number of labels a stream has learnt before an operation, W = ``window`` and
M = ``refit_every``, the map in force is the one fitted after label

    j*(u) = -1 (no fit yet) if u < W;   W if M is None;   W + M * floor((u - W) / M) otherwise,

on labels j* - W + 1 .. j*. The state of a stream is one float vector
``[u, b, f, window scores (b * C), window labels (b), fitted (f)]`` (b = min(u, W) kept labels,
C = 1 for binary scores, K otherwise; f = length of the fitted vector, 0 before the first fit),
so running a stream in chunks with the state carried gives exactly the one-pass outputs.

Fits run once per (stream, refit); forecasts are one vectorised ``predict`` call per
(stream, refit) run of operations, never a Python loop per event.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from calpipe.calibrators._params import Param, int_at_least
from calpipe.calibrators.base import (
    CLIP_PARAM,
    Calibrator,
    EndOfCallWarning,
    FlatState,
    RunOutput,
    ragged_concat,
    ragged_take,
)
from calpipe.calibrators.gale import likelihood_gale
from calpipe.errors import ParameterError, StateError
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE
from calpipe.kernels.prediction import Prediction

_HEADER = 3  # u, b, f


class UnfilledWindowWarning(EndOfCallWarning):
    """Streams ended a call of a windowed method with fewer labels than its window: never
    fitted, their forecasts were the base scores (one warning per call)."""


WINDOW_PARAMS: dict[str, Param] = {
    "window": Param(
        1000,
        int_at_least(1),
        "an integer >= 1",
        "labelled events in the calibration window (the last `window` labels learnt)",
    ),
    "refit_every": Param(
        None,
        lambda v: v is None or int_at_least(1)(v),
        "None (fit once, on the first `window` labels) or an integer >= 1",
        "refit on the trailing window after every `refit_every` further labels",
    ),
    "clip": CLIP_PARAM,
}


def fit_point(u: np.ndarray, window: int, refit_every: int | None) -> np.ndarray:
    """j*(u): the label count after which the map in force was fitted (-1 = none yet)."""
    u = np.asarray(u, dtype=np.int64)
    if refit_every is None:
        return np.where(u >= window, window, -1)
    return np.where(u >= window, window + refit_every * ((u - window) // refit_every), -1)


class WindowedCalibrator(Calibrator[FlatState]):
    """A batch method (``fit``/``predict`` kernel pair) run over a stream's calibration window.

    Subclasses set ``fit``, ``predict``, ``fit_params``/``predict_params`` (the parameters passed
    on to the kernels), and their table: :data:`WINDOW_PARAMS` plus the method's own parameters.
    """

    fit: ClassVar[Callable[..., np.ndarray]]
    predict: ClassVar[Callable[..., Prediction]]
    #: Parameters passed on to ``fit`` and to ``predict`` (by name).
    fit_params: ClassVar[tuple[str, ...]] = ()
    predict_params: ClassVar[tuple[str, ...]] = ()
    #: Warn when streams end a call with an unfilled window (off for a composite-experts input).
    warn_unfilled: bool = True

    # -- configuration -------------------------------------------------------------------------
    @property
    def window(self) -> int:
        return int(self.params["window"])

    @property
    def refit_every(self) -> int | None:
        r = self.params["refit_every"]
        return None if r is None else int(r)

    def fit_kwargs(self, n_classes: int) -> dict[str, Any]:
        return {k: self.params[k] for k in self.fit_params}

    def predict_kwargs(self, n_classes: int) -> dict[str, Any]:
        return {k: self.params[k] for k in self.predict_params}

    def fit_window(self, scores: np.ndarray, labels: np.ndarray, n_classes: int) -> np.ndarray:
        """The map fitted on one calibration window (its scores and labels), as the flat
        array the state stores (what the per-event oracle of the tests refits too)."""
        fitted = type(self).fit(scores, labels, **self.fit_kwargs(n_classes))
        return np.ascontiguousarray(fitted, dtype=np.float64)

    def predict_window(self, fitted: np.ndarray, scores: np.ndarray, n_classes: int) -> Prediction:
        """A map fitted by :meth:`fit_window` applied to ``scores``."""
        return type(self).predict(fitted, scores, **self.predict_kwargs(n_classes))

    # -- state ---------------------------------------------------------------------------------
    def initial_state(self, n_streams: int, n_classes: int) -> FlatState:
        values = np.zeros(n_streams * _HEADER)
        offsets = np.arange(0, n_streams * _HEADER + 1, _HEADER, dtype=np.int64)
        return FlatState(values, offsets, np.zeros(n_streams))

    def state_from_flat(self, values, offsets, log10m, n_classes: int) -> FlatState:
        st = super().state_from_flat(values, offsets, log10m, n_classes)
        self._check_headers(st, n_classes)
        return st

    def check_state_layout(self, state: FlatState, n_classes: int) -> None:
        super().check_state_layout(state, n_classes)
        if type(state) is FlatState:
            self._check_headers(state, n_classes)

    def _check_headers(self, st: FlatState, n_classes: int) -> None:
        """StateError unless each stream's vector is [u, b, f, scores, labels, fitted] with
        lengths that add up (vectorized over the streams)."""
        c = 1 if n_classes == 2 else n_classes
        start, length = st.offsets[:-1], np.diff(st.offsets)
        bad = np.flatnonzero(length < _HEADER)  # header check, all streams at once
        if not bad.size:
            u, b, f = (st.values[start + i] for i in range(_HEADER))
            with np.errstate(invalid="ignore"):
                ok = (
                    (u >= 0) & (b == np.minimum(u, self.window)) & (f >= 0)
                    & (length == _HEADER + b * (c + 1) + f)
                )  # fmt: skip
            bad = np.flatnonzero(~ok)
        if bad.size:
            raise StateError(
                f"method {self.name!r}: state vector {int(bad[0])} does not have the layout "
                f"[u, b, f, scores (b*{c}), labels (b), fitted (f)] with b = min(u, "
                f"window={self.window})",
                stream=int(bad[0]),
            )

    def _unpack(self, st: FlatState, s: int, c: int):
        v = st.vector(s)
        u, b, f = (int(x) for x in v[:_HEADER])
        sc = v[_HEADER : _HEADER + b * c]
        lab = v[_HEADER + b * c : _HEADER + b * (c + 1)].astype(np.int64)
        fitted = v[_HEADER + b * (c + 1) : _HEADER + b * (c + 1) + f]
        return u, sc.reshape(b, c) if c > 1 else sc, lab, fitted

    # -- running -------------------------------------------------------------------------------
    def end_warnings(self, state: FlatState, n_classes: int) -> None:
        """The unfilled-window warning of a call that ended in ``state`` (labels learnt: the
        first value of each stream's vector)."""
        u_end = state.values[state.offsets[:-1]].astype(np.int64)
        self._warn_unfilled(u_end, np.ones(u_end.shape[0], dtype=np.int64))

    def _warn_unfilled(self, u_end: np.ndarray, counts: np.ndarray) -> None:
        """One warning per call (not per stream: a thousand short streams would flood the log)
        when streams with events end it with fewer than ``window`` labels: they were never
        fitted, so their forecasts were the base scores, which is easy to mistake for a
        calibrator that changes nothing."""
        short = np.flatnonzero((u_end < self.window) & (counts > 0))
        if short.size and self.warn_unfilled:
            warnings.warn(
                f"{self.name}: {short.size} of {counts.size} streams have fewer than "
                f"window={self.window} labels (the fewest: {int(u_end[short].min())}); until "
                "their window fills, their forecasts are the base scores",
                UnfilledWindowWarning,
                stacklevel=2,
            )

    def run_unchecked(
        self, scores, labels, op_event, op_kind, op_offsets, state: FlatState, inputs=None
    ):
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        c = 1 if n_classes == 2 else n_classes
        n_streams = op_offsets.shape[0] - 1
        n_ops = op_event.shape[0]
        counts = np.diff(op_offsets)
        sid = np.repeat(np.arange(n_streams), counts)
        is_upd = op_kind != OP_FORECAST
        cum = np.concatenate([[0], np.cumsum(is_upd)])  # cum[o] = updates before op o
        u0 = state.values[state.offsets[:-1]].astype(np.int64)  # labels learnt before the batch
        u_before = u0[sid] + cum[:-1] - cum[op_offsets[:-1]][sid]  # ... and before each op
        epoch = fit_point(u_before, self.window, self.refit_every)
        u_end = u0 + cum[op_offsets[1:]] - cum[op_offsets[:-1]]
        self._warn_unfilled(u_end, counts)

        forecast = np.empty((n_ops,) if c == 1 else (n_ops, n_classes))
        interval = "p_lower" in self.extra_outputs
        lower = np.empty_like(forecast) if interval else forecast  # point methods: no bounds
        upper = np.empty_like(forecast) if interval else forecast
        upd_ops = np.flatnonzero(is_upd)
        upd_bounds = np.searchsorted(upd_ops, op_offsets)
        # Streams whose window is still filling at the end of the batch were never fitted: the
        # base passes through and their window grows, for all of them at once (many short
        # streams must not cost a Python step each). The others are fitted stream by stream.
        idle = fit_point(u_end, self.window, self.refit_every) < 0
        at_idle = idle[sid]
        forecast[at_idle] = scores[op_event[at_idle]]
        if interval:
            lower[at_idle] = upper[at_idle] = forecast[at_idle]
        grown = self._grown_windows(state, scores, labels, op_event, upd_ops, sid, u_end, c)
        new_vectors = []
        busy = np.flatnonzero(~idle)
        for s in busy:
            u, win_s, win_y, fitted = self._unpack(state, s, c)
            lo, hi = op_offsets[s], op_offsets[s + 1]
            ops_u = upd_ops[upd_bounds[s] : upd_bounds[s + 1]]
            new_s = scores[op_event[ops_u]]
            new_y = labels[op_event[ops_u]]
            all_s = np.concatenate([win_s, new_s]) if new_s.size else win_s
            all_y = np.concatenate([win_y, new_y]) if new_y.size else win_y
            first = u - win_y.shape[0] + 1  # label number of all_s[0] (1-based)
            fits = {int(fit_point(u, self.window, self.refit_every)): fitted}

            def fitted_at(j: int, all_s=all_s, all_y=all_y, first=first, fits=fits):
                if j not in fits:
                    stop = j - first + 1
                    fits[j] = self.fit_window(
                        all_s[stop - self.window : stop],
                        all_y[stop - self.window : stop],
                        n_classes,
                    )
                return fits[j]

            # Runs of consecutive ops that share a map: one predict call each.
            ep = epoch[lo:hi]
            cuts = np.flatnonzero(np.diff(ep)) + 1
            # (a stream with no operation in this batch -- a piece of a big call may hold none
            # of a fitted stream's -- has no run: it keeps its window and fit)
            runs = zip(np.r_[0, cuts], np.r_[cuts, hi - lo], strict=True) if hi > lo else ()
            for a, b in runs:
                j = int(ep[a])
                ev = op_event[lo + a : lo + b]
                sl = slice(lo + a, lo + b)
                if j < 0:  # no fit yet: the base passes through (bounds = the base too)
                    forecast[sl] = scores[ev]
                    if interval:
                        lower[sl] = upper[sl] = scores[ev]
                    continue
                pred = self.predict_window(
                    fitted_at(j), np.ascontiguousarray(scores[ev]), n_classes
                )
                forecast[sl] = pred.p
                if interval:
                    lower[sl], upper[sl] = pred.p_lower, pred.p_upper
            j_end = int(fit_point(u_end[s], self.window, self.refit_every))
            fit_end = fitted_at(j_end) if j_end >= 0 else np.zeros(0)
            keep = min(int(u_end[s]), self.window)
            tail_s = all_s[all_s.shape[0] - keep :]
            tail_y = all_y[all_y.shape[0] - keep :]
            head = np.array([u_end[s], keep, fit_end.shape[0]], dtype=np.float64)
            new_vectors.append(
                np.concatenate([head, tail_s.ravel(), tail_y.astype(np.float64), fit_end])
            )

        new_state = grown.scatter(busy, FlatState.from_vectors(new_vectors, np.zeros(busy.size)))
        log10m_op, log10m_end = likelihood_gale(
            forecast, self.martingale_base(scores[op_event]), labels[op_event], is_upd,
            op_offsets, state.log10m, self.params["clip"],
        )  # fmt: skip
        new_state.log10m = log10m_end
        out = self._outputs(scores, op_event, op_kind, forecast, lower, upper, log10m_op)
        return out, new_state

    @staticmethod
    def _grown_windows(state, scores, labels, op_event, upd_ops, sid, u_end, c) -> FlatState:
        """Every stream's state if no fit happened: ``[u_end, u_end, 0, old window scores, the
        batch's scores, old window labels, the batch's labels]`` (valid for the streams whose
        window is still filling; the others are replaced)."""
        n_streams = u_end.shape[0]
        start = state.offsets[:-1]
        b0 = state.values[start + 1].astype(np.int64)
        n_new = np.bincount(sid[upd_ops], minlength=n_streams).astype(np.int64)
        new_off = np.concatenate([[0], np.cumsum(n_new)]).astype(np.int64)
        ev = op_event[upd_ops]  # grouped by stream, in learning order
        head = np.column_stack([u_end, u_end, np.zeros(n_streams)]).astype(np.float64).ravel()
        parts = [
            (head, np.arange(0, 3 * n_streams + 1, 3, dtype=np.int64)),
            ragged_take(state.values, start + _HEADER, b0 * c),
            (np.asarray(scores[ev], dtype=np.float64).ravel(), new_off * c),
            ragged_take(state.values, start + _HEADER + b0 * c, b0),
            (labels[ev].astype(np.float64), new_off),
        ]
        values, offsets = ragged_concat(parts)
        return FlatState(values, offsets, np.zeros(n_streams))

    def _outputs(self, scores, op_event, op_kind, forecast, lower, upper, log10m_op) -> RunOutput:
        """Per-event outputs from per-op values: an event's forecast is made at its forecast op."""
        shown = op_kind != OP_UPDATE
        ev = op_event[shown]
        out_p = np.full(scores.shape, np.nan)
        out_m = np.full(scores.shape[0], np.nan)
        out_p[ev] = forecast[shown]
        out_m[ev] = log10m_op[shown]
        extra = {}
        if "p_lower" in self.extra_outputs:
            lo = np.full(scores.shape, np.nan)
            hi = np.full(scores.shape, np.nan)
            lo[ev], hi[ev] = lower[shown], upper[shown]
            extra = {"p_lower": lo, "p_upper": hi}
        return RunOutput(out_p, out_m, extra)

    #: The fitted vector as a logistic map ``[w1, w2, w0, eps]`` (rows of fitted vectors), for
    #: the methods whose map is one (Platt, beta): the SQL form of a composite-experts input.
    logistic_of: ClassVar[Callable[[np.ndarray], np.ndarray] | None] = None

    def has_logistic_map(self) -> bool:
        return type(self).logistic_of is not None

    def sql_form(self, n_classes: int = 2) -> str | None:
        """K classes: the sub-problems' step tables (:attr:`k_tables_of`); binary: the logistic
        map or the step table."""
        if n_classes > 2:
            return "tables" if type(self).k_tables_of is not None else None
        return super().sql_form(2)

    def logistic_map(self, state: FlatState) -> np.ndarray:
        """Each stream's current binary map as ``[w1, w2, w0, eps]`` (see
        :class:`calpipe.calibrators.base.MapTerms`); NaN rows for streams not fitted yet (the
        base passes through)."""
        if not self.has_logistic_map():
            raise ParameterError(f"method {self.name!r} has no logistic serving map")
        out = np.full((state.n_streams, 4), np.nan)
        done, fits = self.fixed_size_fits(state)
        if done.size:
            out[done] = type(self).logistic_of(fits)
        return out

    def fixed_size_fits(
        self, state: FlatState, n_classes: int = 2
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(streams fitted, their fitted vectors as rows)`` of a state of K = ``n_classes``,
        for the methods whose fitted vector has one size (the parametric ones), read in one
        vectorised take (the window holds b events of C score columns and a label each)."""
        c = 1 if n_classes == 2 else n_classes
        start = state.offsets[:-1]
        b = state.values[start + 1].astype(np.int64)
        f = state.values[start + 2].astype(np.int64)
        done = np.flatnonzero(f > 0)
        if not done.size:
            return done, np.zeros((0, 0))
        vals, _ = ragged_take(state.values, start[done] + _HEADER + (c + 1) * b[done], f[done])
        return done, vals.reshape(done.size, int(f[done[0]]))

    #: ``(fitted, window scores) -> (x, linear)``: where the fitted binary map may change value
    #: (see :meth:`map_breakpoints`), for the methods whose map is a step or linear table.
    steps_of: ClassVar[Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, bool]] | None] = None

    def map_breakpoints(self, state: FlatState) -> list[tuple[np.ndarray, bool] | None] | None:
        if type(self).steps_of is None:
            return None
        out: list[tuple[np.ndarray, bool] | None] = []
        for s in range(state.n_streams):
            _, window, _, fitted = self._unpack(state, s, 1)
            out.append(None if fitted.size == 0 else type(self).steps_of(fitted, window))
        return out

    #: ``fitted -> (coupling, [(i, j, x, y_at, y_right)])``: a K-class fitted map as step
    #: tables of its binary sub-problems (test score: column j when i = -1, else the pair score
    #: of classes i < j; pieces as in ``calibration_map``, the first at x = -inf) and how they
    #: are coupled: ``"ovr"`` (renormalised), ``"ovr_base"`` (renormalised; a row of zeros keeps
    #: the base) or ``"ovo"`` (pairwise coupling). None: no K-class SQL form.
    k_tables_of: ClassVar[Callable[[np.ndarray], tuple[str, list]] | None] = None

    def k_tables(self, state: FlatState, n_classes: int) -> list[tuple[str, list] | None]:
        """Each stream's K-class map as sub-problem tables (:attr:`k_tables_of`), None for a
        stream not fitted yet (the base passes through)."""
        out: list[tuple[str, list] | None] = []
        for s in range(state.n_streams):
            _, _, _, fitted = self._unpack(state, s, n_classes)
            out.append(None if fitted.size == 0 else type(self).k_tables_of(fitted))
        return out

    def serving_map_unchecked(self, state: FlatState, scores: np.ndarray) -> np.ndarray:
        """Each stream's current map applied to ``scores`` (S, n) or (S, n, K)."""
        n_classes = 2 if scores.ndim == 2 else scores.shape[2]
        c = 1 if n_classes == 2 else n_classes
        out = np.empty(scores.shape)
        for s in range(state.n_streams):
            _, _, _, fitted = self._unpack(state, s, c)
            out[s] = (
                scores[s]
                if fitted.size == 0
                else self.predict_window(fitted, scores[s], n_classes).p
            )
        return out
