"""The batch calibrators of the literature, each a kernel pair run by :class:`WindowedCalibrator`.

Every method here is fitted on a stream's calibration window (the last ``window`` labels learnt;
refitted every ``refit_every`` labels, or frozen after the first fit) and applied prequentially to
the events after it (see :mod:`calpipe.calibrators.windowed`). The maths and citations are in the
kernels' docstrings (:mod:`calpipe.kernels`).

>>> import numpy as np
>>> from calpipe.calibrators import make_calibrator
>>> rng = np.random.default_rng(0)
>>> p = rng.uniform(0.05, 0.95, 400)
>>> y = (rng.uniform(size=400) < p**2).astype(np.int64)  # the base is overconfident
>>> out, state = make_calibrator("platt", window=200).run(p, y)
>>> bool(np.all(out.protected[:200] == p[:200]))  # passes the base through until fitted
True
>>> bool(out.log10_martingale[-1] > 2)  # Platt's forecasts beat the base by a factor > 100
True
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import Param, int_at_least, number_in, one_of
from calpipe.calibrators.windowed import WINDOW_PARAMS, WindowedCalibrator
from calpipe.kernels import histogram, isotonic, parametric, venn_abers
from calpipe.kernels import venn as venn_kernel


class Platt(WindowedCalibrator):
    """Platt scaling: p' = sigmoid(a logit(p) + b), maximum likelihood (Platt 1999)."""

    name = "platt"
    summary = "Platt scaling: logistic regression on the base log-odds (Platt 1999), batch"
    classes = "binary"
    fit = staticmethod(parametric.platt_fit)
    predict = staticmethod(parametric.platt_predict)
    #: [a, b, eps] -> sigmoid(a ln p - a ln(1 - p) + b)
    logistic_of = staticmethod(lambda f: f[:, [0, 0, 1, 2]])
    fit_params = ("platt_targets",)
    check_params = ({"window": 5, "refit_every": 3}, {"window": 6, "platt_targets": True})
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "platt_targets": Param(
            False,
            one_of(True, False),
            "True or False",
            "Platt's smoothed targets (N+ + 1)/(N+ + 2), 1/(N- + 2) instead of the labels",
        ),
    }


class Beta(WindowedCalibrator):
    """Beta calibration: p' = sigmoid(a ln p - b ln(1 - p) + c) (Kull et al. 2017)."""

    name = "beta"
    summary = "beta calibration (Kull, Silva Filho & Flach 2017), batch"
    classes = "binary"
    fit = staticmethod(parametric.beta_fit)
    predict = staticmethod(parametric.beta_predict)
    #: [a, b, c, eps] -> sigmoid(a ln p - b ln(1 - p) + c)
    logistic_of = staticmethod(lambda f: f)
    fit_params = ("parameters",)
    check_params = ({"window": 6}, {"window": 5, "refit_every": 4, "parameters": "am"})
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "parameters": Param(
            "abm",
            one_of(*parametric.BETA_PARAMETERS),
            f"one of {', '.join(parametric.BETA_PARAMETERS)}",
            "betacal's parameterisation: abm = a, b, m free; ab = m fixed at 1/2; am = a = b "
            "(Platt on the log-odds); a = one shape",
        ),
    }


class Temperature(WindowedCalibrator):
    """Temperature scaling: p'_c proportional to p_c^(1/T) (Guo et al. 2017)."""

    name = "temperature"
    summary = "temperature scaling p' = softmax(ln p / T) (Guo et al. 2017), batch"
    fit = staticmethod(parametric.temperature_fit)
    predict = staticmethod(parametric.temperature_predict)
    check_params = ({"window": 5, "refit_every": 4},)
    parameters: ClassVar[dict[str, Param]] = {**WINDOW_PARAMS}

    def temperature_map(self, state, n_classes: int = 2) -> np.ndarray:
        """Each stream's map as ``[1/T, eps]``: p'_c = softmax_c(ln max(p_c, eps) / T) (K = 2:
        :meth:`binary_temperature`); NaN rows for streams not fitted yet (the base passes)."""
        out = np.full((state.n_streams, 2), np.nan)
        done, fits = self.fixed_size_fits(state, n_classes)
        if done.size:
            out[done] = fits[:, :2]
        return out

    def sql_form(self, n_classes: int = 2) -> str | None:
        """``[1/T, eps]`` per stream, binary and K classes (family ``temperature``)."""
        return "temperature"

    def binary_temperature(self, state) -> np.ndarray:
        """Each stream's binary map as ``[1/T, eps]``: p' = sigmoid(ln max(p, eps) / T -
        ln max(1 - p, eps) / T), the two-class softmax of the kernel (its SQL form, family
        ``temperature``); NaN rows for streams not fitted yet (the base passes through). Not a
        logistic map of the clipped score: the kernel floors p and 1 - p separately."""
        return self.temperature_map(state, 2)


class Venn(WindowedCalibrator):
    """Inductive Venn predictor (paper 002): equal-mass bins of the window's base scores as the
    taxonomy, the window's label counts per bin; [p_lower, p_upper] and the minimax merge."""

    name = "venn"
    summary = "inductive Venn predictor (paper 002): equal-mass score bins fitted on the window"
    extra_outputs = ("p_lower", "p_upper")
    fit = staticmethod(venn_kernel.fit)
    predict = staticmethod(venn_kernel.predict)
    #: the bin of a score changes at the taxonomy's edges only
    steps_of = staticmethod(lambda f, w: (venn_kernel.bin_edges(f), False))
    fit_params = ("n_bins",)

    def sql_form(self, n_classes: int = 2) -> str | None:
        """K classes: the taxonomy's table of categories."""
        return "categories" if n_classes > 2 else super().sql_form(2)

    def k_categories(self, state, n_classes: int) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """K classes: each stream's taxonomy (predicted class x confidence bin) as ``(edges,
        forecasts)``: the bins' edges and each category's forecast (C, K), the kernel's own
        merge of its counts (:func:`venn_kernel.category_forecasts`); None for a stream not
        fitted yet (the base passes through)."""
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        for s in range(state.n_streams):
            _, _, _, fitted = self._unpack(state, s, n_classes)
            out.append(None if fitted.size == 0 else venn_kernel.category_forecasts(fitted))
        return out

    check_params = ({"window": 8, "refit_every": 5, "n_bins": 2},)
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "n_bins": Param(
            config.VENN_DEFAULT_N_BINS,
            int_at_least(1),
            "an integer >= 1",
            "equal-mass bins of the window's scores (fewer if ties force it)",
        ),
    }


class Histogram(WindowedCalibrator):
    """Histogram binning (Zadrozny & Elkan 2001): equal-mass bins of the window's scores, each
    mapped to its (m-estimate smoothed) label frequency; K classes one-vs-rest, renormalised."""

    name = "histogram"
    summary = "histogram binning: equal-mass bins, mean label per bin (Zadrozny & Elkan 2001)"
    fit = staticmethod(histogram.fit)
    predict = staticmethod(histogram.predict)
    #: the bin of a score changes at the cuts only
    steps_of = staticmethod(lambda f, w: (histogram.binary_cuts(f), False))
    #: K classes: class c's bins of p_c (value values[#{cuts <= p_c}]), renormalised
    k_tables_of = staticmethod(
        lambda f: ("ovr_base", [
            (-1, c, np.concatenate([[-np.inf], cuts]), values, values)
            for c, (cuts, values) in enumerate(histogram.class_tables(f))
        ])
    )  # fmt: skip
    fit_params = ("n_bins", "prior_strength")
    check_params = ({"window": 8, "refit_every": 4, "n_bins": 3},)
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "n_bins": Param(
            config.HISTOGRAM_N_BINS,
            int_at_least(1),
            "an integer >= 1",
            "equal-mass bins of the window's scores (tied scores never split, so maybe fewer)",
        ),
        "prior_strength": Param(
            config.HISTOGRAM_PRIOR_STRENGTH,
            number_in(0.0, float("inf"), lo_open=False),
            "a number >= 0",
            "m of the m-estimate (k + m r) / (n + m), r = the window's label frequency",
        ),
    }


class Isotonic(WindowedCalibrator):
    """Isotonic regression (PAV): the non-decreasing map of the score closest to the labels in
    squared error; ``linear`` interpolation between thresholds is scikit-learn's
    ``IsotonicRegression(out_of_bounds="clip")``, ``step`` the piecewise-constant map."""

    name = "isotonic"
    summary = "isotonic regression (PAV), equal to scikit-learn's IsotonicRegression, batch"
    classes = "binary"
    fit = staticmethod(isotonic.isotonic_fit)
    predict = staticmethod(isotonic.isotonic_predict)
    #: the thresholds: steps between them, or linear interpolation
    steps_of = staticmethod(lambda f, w: isotonic.binary_thresholds(f))
    fit_params = ("interpolation",)
    check_params = ({"window": 8, "refit_every": 4}, {"window": 6, "interpolation": "step"})
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "interpolation": Param(
            config.DEFAULT_ISOTONIC_INTERPOLATION,
            one_of("linear", "step"),
            "'linear' or 'step'",
            "between thresholds: linear (scikit-learn) or step (piecewise constant)",
        ),
    }


class RocIsotonic(WindowedCalibrator):
    """ROC-regularized isotonic regression (paper 003, Algorithm 2): recursive partitioning of
    the score space into ROC-monotone regions, each mapped to its label frequency. Binary and
    unregularised it is step isotonic regression, whose ROC curve is the convex hull of the
    base's; ``max_regions``/``min_region_size`` regularise; K classes split the simplex."""

    name = "roc-isotonic"
    summary = "ROC-regularized isotonic regression (paper 003, Alg. 2), binary and K classes"
    fit = staticmethod(isotonic.rrir_fit)
    predict = staticmethod(isotonic.rrir_predict)
    steps_of = staticmethod(lambda f, w: isotonic.binary_thresholds(f))
    fit_params = ("max_regions", "min_region_size", "max_candidates")

    def sql_form(self, n_classes: int = 2) -> str | None:
        """K classes: the partition tree of the simplex (paper 003 Algorithm 2)."""
        return "tree" if n_classes > 2 else super().sql_form(2)

    def k_tree(self, state, n_classes: int) -> list[np.ndarray | None]:
        """K classes: each stream's partition tree (:func:`isotonic.tree_records`: a split's
        gamma and children, a leaf's value); None for a stream not fitted yet (the base passes
        through)."""
        out: list[np.ndarray | None] = []
        for s in range(state.n_streams):
            _, _, _, fitted = self._unpack(state, s, n_classes)
            out.append(None if fitted.size == 0 else isotonic.tree_records(fitted))
        return out

    check_params = ({"window": 9, "refit_every": 5, "max_regions": 3},)
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "max_regions": Param(
            config.DEFAULT_RRIR_MAX_REGIONS,
            lambda v: v is None or int_at_least(1)(v),
            "None or an integer >= 1",
            "regularisation: at most this many (non-empty) regions",
        ),
        "min_region_size": Param(
            config.DEFAULT_RRIR_MIN_REGION_SIZE,
            int_at_least(1),
            "an integer >= 1",
            "regularisation: no region with fewer calibration points",
        ),
        "max_candidates": Param(
            config.DEFAULT_RRIR_MAX_CANDIDATES,
            int_at_least(1),
            "an integer >= 1",
            "split candidates tried per region (exact below it; a speed cap for big windows)",
        ),
    }


def _venn_abers_k_tables(fitted: np.ndarray) -> tuple[str, list]:
    """:attr:`WindowedCalibrator.k_tables_of` of a multiclass Venn-ABERS fit: each sub-problem's
    values at ``[below, x_1..x_m, mid-points, above]`` (:func:`venn_abers.sub_tables`) as the
    pieces of a step table."""
    coupling, subs = venn_abers.sub_tables(fitted)
    out = []
    for i, j, x, y in subs:
        m = x.size
        y_at, y_mid, y_end = y[1 : 1 + m], y[1 + m : 2 * m], y[2 * m]
        xs = np.concatenate([[-np.inf], x])
        y_right = np.concatenate([[y[0]], y_mid, [y_end]]) if m else y[:1]  # between the points
        out.append((i, j, xs, np.concatenate([[y[0]], y_at]), y_right))
    return coupling, out


class VennAbers(WindowedCalibrator):
    """Venn-ABERS predictors (Vovk & Petej 2014; fast algorithm of Vovk, Petej & Fedorova 2015):
    the two isotonic fits with the test score added with label 0 and 1 give [p0, p1]; the point
    forecast is the log-loss merge p1 / (1 - p0 + p1) (or the Brier merge). ``cross=True`` is the
    cross version on fixed scores: an IVAP per fold of the window (fold i mod ``n_folds``),
    merged. K classes: one-vs-one pairwise coupling or one-vs-rest (no bounds then)."""

    name = "venn-abers"
    summary = "Venn-ABERS (IVAP / CVAP): [p0, p1] and merged p; equal to venn-abers 1.5.4, batch"
    extra_outputs = ("p_lower", "p_upper")
    fit = staticmethod(venn_abers.fit)
    predict = staticmethod(venn_abers.predict)
    #: p0 and p1 depend on #{s'_j < s} and #{s'_j <= s}: they change at the fit's scores s'
    steps_of = staticmethod(lambda f, w: (venn_abers.binary_breakpoints(f), False))
    #: K classes: each sub-problem's merged p as a step table, coupled one-vs-rest or one-vs-one
    k_tables_of = staticmethod(lambda f: _venn_abers_k_tables(f))
    fit_params = ("cross", "n_folds", "merge", "multiclass")
    check_params = (
        {"window": 8, "refit_every": 4},
        {"window": 10, "cross": True, "n_folds": 3, "merge": "brier"},
    )
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "cross": Param(
            False,
            one_of(True, False),
            "True or False",
            "False: inductive (IVAP) on the whole window; True: cross (CVAP) over n_folds folds",
        ),
        "n_folds": Param(
            config.VENN_ABERS_N_FOLDS,
            int_at_least(2),
            "an integer >= 2",
            "folds of the CVAP (label i of the window goes to fold i mod n_folds)",
        ),
        "merge": Param(
            config.VENN_ABERS_MERGE,
            one_of("log", "brier"),
            "'log' or 'brier'",
            "point forecast from [p0, p1]: log-loss merge (geometric means) or Brier merge",
        ),
        "multiclass": Param(
            config.VENN_ABERS_MULTICLASS,
            one_of("ovo", "ovr"),
            "'ovo' or 'ovr'",
            "K >= 3 classes: one-vs-one pairwise coupling or one-vs-rest, renormalised",
        ),
    }

    def predict_window(self, fitted, scores, n_classes):
        pred = super().predict_window(fitted, scores, n_classes)
        if pred.p_lower is None:  # multiclass: coupling gives no class bounds (NaN, not a lie)
            nan = np.full(pred.p.shape, np.nan)
            return pred._replace(p_lower=nan, p_upper=nan)
        return pred


BATCH_METHODS = (Platt, Beta, Temperature, Venn, Histogram, Isotonic, RocIsotonic, VennAbers)

__all__ = [
    "BATCH_METHODS",
    "Beta",
    "Histogram",
    "Isotonic",
    "Platt",
    "RocIsotonic",
    "Temperature",
    "Venn",
]
