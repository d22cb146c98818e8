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

from calpipe import config
from calpipe.calibrators._params import Param, number_in, one_of
from calpipe.calibrators.windowed import WINDOW_PARAMS, WindowedCalibrator
from calpipe.kernels import histogram, parametric
from calpipe.kernels import venn as venn_kernel


class Platt(WindowedCalibrator):
    """Platt scaling: p' = sigmoid(a logit(p) + b), maximum likelihood (Platt 1999)."""

    name = "platt"
    summary = "Platt scaling: logistic regression on the base log-odds (Platt 1999), batch"
    classes = "binary"
    fit = staticmethod(parametric.platt_fit)
    predict = staticmethod(parametric.platt_predict)
    fit_params = ("platt_targets",)
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
    fit_params = ("parameters",)
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
    parameters: ClassVar[dict[str, Param]] = {**WINDOW_PARAMS}


class Venn(WindowedCalibrator):
    """Inductive Venn predictor (paper 002): equal-mass bins of the window's base scores as the
    taxonomy, the window's label counts per bin; [p_lower, p_upper] and the minimax merge."""

    name = "venn"
    summary = "inductive Venn predictor (paper 002): equal-mass score bins fitted on the window"
    extra_outputs = ("p_lower", "p_upper")
    fit = staticmethod(venn_kernel.fit)
    predict = staticmethod(venn_kernel.predict)
    fit_params = ("n_bins",)
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "n_bins": Param(
            config.VENN_DEFAULT_N_BINS,
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
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
    fit_params = ("n_bins", "prior_strength")
    parameters: ClassVar[dict[str, Param]] = {
        **WINDOW_PARAMS,
        "n_bins": Param(
            config.HISTOGRAM_N_BINS,
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
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


BATCH_METHODS = (Platt, Beta, Temperature, Venn, Histogram)

__all__ = ["BATCH_METHODS", "Beta", "Histogram", "Platt", "Temperature", "Venn"]
