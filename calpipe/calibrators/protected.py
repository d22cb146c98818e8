"""Protected calibrators: Jumper, Mean Jumper and Composite Jumper (log loss or Brier compatibility).

A calibrator is a validated configuration around one kernel of :mod:`calpipe.kernels.mixture` (log loss) or
:mod:`calpipe.kernels.brier_compat` (Brier compatibility).
It knows its parameter table, the calibrating family it uses for K classes, the initial state of a
stream, the layout of the state vector, and how to run a batch of streams through its kernel.

Notation (code -> paper): ``passive`` = P, ``active[j, t]`` = A^{J_j}_{theta_t} (paper 001 Alg. 1),
= C_epsilon (paper 000 Alg. 2, P = 0); ``rates`` = the set J; ``family`` = Theta (paper 001) or E
(paper 000); ``log10m`` = log10 S_n, the running test martingale.

Example
-------
>>> import numpy as np
>>> cal = CompositeJumper()
>>> out, state = cal.run(np.array([0.2, 0.7, 0.4]), np.array([0, 1, -1]))
>>> np.round(out.protected, 4).tolist(), state.n_labelled
([0.2, 0.7, 0.4001], 2)
>>> out2, _ = cal.run(np.array([0.4]), np.array([1]), state=state)  # resume
>>> round(float(out2.protected[0]), 4)  # the label-free forecast above, now learnt from
0.4001
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import (
    Param,
    as_float_tuple,
    number_in,
    one_of,
    tuple_of,
)
from calpipe.calibrators.base import (
    Calibrator,
    MapTerms,
    RunOutput,
    check_mixture_weights,
)
from calpipe.calibrators.gale import clip_probabilities
from calpipe.errors import ParameterError, StateError
from calpipe.families import (
    BINARY_FAMILIES,
    Family,
    binary_family,
    multiclass_family,
    package_grid,
)
from calpipe.kernels import brier_compat, mixture

LOSSES = ("log", "brier")

#: Term family names of the SQL form (the macro ``calpipe_term``) of each binary family.
_TERM_FAMILY = {"quadratic": "quadratic", "cubic": "cubic", "cox": "cox", "cox2": "cox"}


# ----------------------------------------------------------------------------------------------
# State
# ----------------------------------------------------------------------------------------------
@dataclass
class BatchState:
    """Kernel state of S streams as arrays (the unit the kernels take and return).

    ``vector(s)`` flattens stream s to one float64 vector in the layout of the calibrator:
    [P, A (R*T), capital (R*T, Brier only), log10 SJ (R, Brier only)].
    """

    passive: np.ndarray  # (S,)
    active: np.ndarray  # (S, R, T)
    log10m: np.ndarray  # (S,)
    capital: np.ndarray | None = None  # (S, R, T), Brier compatibility only
    log_sj: np.ndarray | None = None  # (S, R), Brier compatibility only

    @property
    def n_streams(self) -> int:
        return int(self.passive.shape[0])

    def vectors(self) -> np.ndarray:
        """(S, L) float64: one state vector per stream."""
        s = self.n_streams
        parts = [self.passive[:, None], self.active.reshape(s, -1)]
        if self.capital is not None:
            parts += [self.capital.reshape(s, -1), self.log_sj]
        return np.ascontiguousarray(np.concatenate(parts, axis=1))

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """The state vectors as (values, offsets): the protocol of :mod:`calpipe.calibrators.base`."""
        v = self.vectors()
        return v.ravel(), np.arange(0, v.size + 1, max(v.shape[1], 1), dtype=np.int64)

    def scatter(self, idx: np.ndarray, loaded: BatchState) -> BatchState:
        """This state with streams ``idx`` replaced by the streams of ``loaded`` (in order)."""
        self.passive[idx] = loaded.passive
        self.active[idx] = loaded.active
        self.log10m[idx] = loaded.log10m
        if self.capital is not None:
            self.capital[idx] = loaded.capital
            self.log_sj[idx] = loaded.log_sj
        return self


# ----------------------------------------------------------------------------------------------
# Parameter tables
# ----------------------------------------------------------------------------------------------
_rate_ok = number_in(0.0, 1.0, lo_open=True, hi_open=False)  # J in (0, 1]

_FAMILY = Param(
    "cox2",
    one_of(*BINARY_FAMILIES),
    f"one of {', '.join(BINARY_FAMILIES)} (cox, cox2 for K >= 3 classes)",
    "calibrating family: quadratic (paper 000 eq. 1), cubic (eq. 3), cox (eq. 4), cox2 (eq. 5; paper 001 eq. 1)",
)
_FAMILY_PARAMS = Param(
    None,
    lambda v: v is None or isinstance(v, tuple | list),
    "None (the default grid) or a sequence of parameters of the family",
    "grid of the family: eps values (quadratic), (a, b) pairs (cubic), betas (cox), (alpha, beta) pairs (cox2); None = docs/ARCHITECTURE.md §4 default",
)
_CLIP = Param(
    config.DEFAULT_CLIP_EPS,
    number_in(0.0, 0.5, lo_open=True, hi_open=True),
    "a number in (0, 0.5)",
    "log-loss mode clips the base probability to [clip, 1 - clip] (config.DEFAULT_CLIP_EPS)",
)


#: The Composite Jumper's jumping rates and passive weight (also those of composite-experts).
JUMPING_RATES = Param(
    config.DEFAULT_JUMPING_RATES,
    lambda v: tuple_of(_rate_ok)(v) and len(set(v)) == len(v),
    "distinct jumping rates in (0, 1]",
    "jumping rates J, prior (1 - pi) / |J| each",
    as_float_tuple,
)
PASSIVE_WEIGHT = Param(
    config.DEFAULT_PI,
    number_in(0.0, 1.0),
    "a number in (0, 1)",
    "passive weight on the base forecast; cost of protection <= ln(1/pi)",
)


def _family_rule_error(method: str, family: str, params, rule: str) -> ParameterError:
    return ParameterError(
        f"method {method!r}: family_params={params!r} is invalid for family {family!r}: {rule}"
    )


class ProtectedCalibrator(Calibrator[BatchState]):
    """Base of the log-loss mixture predictors (one kernel, three initial states)."""

    # -- configuration -------------------------------------------------------------------------
    @property
    def loss(self) -> str:
        return self.params.get("loss", "log")

    @property
    def rates(self) -> np.ndarray:
        return np.asarray(self.params["jumping_rates"], dtype=np.float64)

    @property
    def pi(self) -> float:
        return 0.0

    def _cross_checked(self, params: dict[str, Any]) -> dict[str, Any]:
        """Checks that involve several parameters (the family grid and its ranges)."""
        fam, grid = params["family"], params["family_params"]
        if grid is None:
            return params
        try:
            arr = np.asarray(grid, dtype=float)
        except (TypeError, ValueError):
            raise _family_rule_error(self.name, fam, grid, "not a list of numbers") from None
        if arr.size == 0 or not np.all(np.isfinite(arr)):
            raise _family_rule_error(self.name, fam, grid, "must be non-empty and finite")
        if fam == "quadratic":
            if arr.ndim != 1 or np.any(np.abs(arr) > 1):
                raise _family_rule_error(self.name, fam, grid, "eps values in [-1, 1]")
        elif fam == "cubic":
            if arr.ndim != 2 or arr.shape[1] != 2 or np.any((arr < 0) | (arr > 1)):
                raise _family_rule_error(self.name, fam, grid, "(a, b) pairs in [0, 1]^2")
        elif fam == "cox":
            if arr.ndim != 1 or np.any(arr <= 0):
                raise _family_rule_error(self.name, fam, grid, "betas > 0")
        elif fam == "cox2" and (arr.ndim != 2 or arr.shape[1] != 2 or np.any(arr[:, 1] <= 0)):
            raise _family_rule_error(self.name, fam, grid, "(alpha, beta) pairs with beta > 0")
        return params

    def family(self, n_classes: int) -> Family:
        """The calibrating functions used for K = ``n_classes`` (2 = binary score)."""
        fam, grid = self.params["family"], self.params["family_params"]
        if n_classes == 2:
            return binary_family(fam, grid)
        if fam not in ("cox", "cox2"):
            raise ParameterError(
                f"method {self.name!r}: family={fam!r} is binary-only (paper 000 eqs. 1, 3); "
                "use cox or cox2 for K >= 3 classes"
            )
        if grid is None:
            return multiclass_family(n_classes, fam)
        arr = np.asarray(grid, float)
        if fam == "cox":
            return multiclass_family(n_classes, "cox", betas=arr)
        betas = np.unique(arr[:, 1])
        shifts = sorted({abs(a) for a in arr[:, 0] if a != 0})
        return multiclass_family(n_classes, "cox2", betas=betas, alpha_shifts=shifts)

    def config(self, n_classes: int) -> dict:
        """Canonical configuration: everything that changes the outputs (and nothing else)."""
        return {
            "method": self.name,
            "loss": self.loss,
            "n_classes": n_classes,
            "family": self.family(n_classes).to_dict(),
            "jumping_rates": self.rates.tolist(),
            "pi": self.pi,
            "clip": self.params.get("clip") if self.loss == "log" else None,
        }

    # -- state ---------------------------------------------------------------------------------
    def _initial_active(self, fam: Family) -> np.ndarray:
        """A[J, theta] at the start of a stream (one stream, shape (R, T)); set by each method."""
        raise NotImplementedError

    def initial_state(self, n_streams: int, n_classes: int) -> BatchState:
        fam = self.family(n_classes)
        a = np.repeat(self._initial_active(fam)[None], n_streams, axis=0)
        return BatchState(
            passive=np.full(n_streams, self.pi),
            active=a,
            log10m=np.zeros(n_streams),
        )

    def state_layout(self, n_classes: int) -> dict[str, tuple[int, ...]]:
        """The parts of one stream's state vector, in order, with their shapes."""
        n_rates, n_fun = len(self.rates), self.family(n_classes).size
        return {"passive": (), "active": (n_rates, n_fun)}

    def state_size(self, n_classes: int) -> int:
        return sum(int(np.prod(shape)) for shape in self.state_layout(n_classes).values())

    def state_from_flat(self, values, offsets, log10m, n_classes: int) -> BatchState:
        size = self.state_size(n_classes)
        lengths = np.diff(np.asarray(offsets))
        bad = np.flatnonzero(lengths != size)
        if bad.size:
            raise StateError(
                f"method {self.name!r}: state vector {int(bad[0])} has length "
                f"{lengths[bad[0]]}, its state layout {self.state_layout(n_classes)} needs {size}",
                stream=int(bad[0]),
            )
        vectors = np.asarray(values, dtype=np.float64).reshape(lengths.size, size)
        return self.state_from_vectors(vectors, log10m, n_classes)

    def martingale_base(self, scores: np.ndarray) -> np.ndarray:
        return self.prepare_scores(np.asarray(scores, dtype=np.float64))

    def state_from_vectors(
        self, vectors: np.ndarray, log10m: np.ndarray, n_classes: int
    ) -> BatchState:
        """Inverse of :meth:`BatchState.vectors`: split (S, L) vectors by :meth:`state_layout`."""
        layout = self.state_layout(n_classes)
        sizes = [int(np.prod(shape)) for shape in layout.values()]
        vectors = np.asarray(vectors, dtype=np.float64)
        if vectors.ndim != 2 or vectors.shape[1] != sum(sizes):
            raise StateError(
                f"method {self.name!r} (loss {self.loss!r}): state vectors have length "
                f"{vectors.shape[-1] if vectors.ndim == 2 else '?'}, expected {sum(sizes)}"
            )
        s = vectors.shape[0]
        parts = np.split(vectors, np.cumsum(sizes)[:-1], axis=1)
        arrays = {
            name: np.ascontiguousarray(part.reshape((s, *shape)))
            for (name, shape), part in zip(layout.items(), parts, strict=True)
        }
        check_mixture_weights(self.name, arrays["passive"], arrays["active"])
        return BatchState(log10m=np.ascontiguousarray(log10m, dtype=np.float64), **arrays)

    # -- running -------------------------------------------------------------------------------
    def prepare_scores(self, scores: np.ndarray) -> np.ndarray:
        """Base probabilities as the kernel sees them: clipped in log-loss mode (docs/ARCHITECTURE.md §4).

        Binary: p -> min(max(p, eps), 1 - eps). K classes: q_c = max(p_c, eps), renormalised, so
        no class has probability 0 and the vector still sums to 1.
        """
        return np.ascontiguousarray(
            clip_probabilities(scores, self.params["clip"]), dtype=np.float64
        )

    def run_unchecked(
        self,
        scores: np.ndarray,
        labels: np.ndarray,
        op_event: np.ndarray,
        op_kind: np.ndarray,
        op_offsets: np.ndarray,
        state: BatchState,
        inputs: dict | None = None,
    ) -> tuple[RunOutput, BatchState]:
        """Run every stream of a batch through the kernel. Scores are taken as given (clip first
        with :meth:`prepare_scores`); labels are int64 class indices (ignored where not updated)."""
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        fam = self.family(n_classes)
        if scores.ndim == 1:
            p, m, pw, a, lm = mixture.mixture_binary(
                scores, labels.astype(np.int8), op_event, op_kind, op_offsets,
                fam.code, fam.params, self.rates, state.passive, state.active, state.log10m,
            )  # fmt: skip
        else:
            p, m, pw, a, lm = mixture.mixture_multiclass(
                scores, labels, op_event, op_kind, op_offsets,
                np.ascontiguousarray(fam.betas), fam.alphas, self.rates,
                state.passive, state.active, state.log10m,
            )  # fmt: skip
        return RunOutput(p, m), BatchState(pw, a, lm)

    def map_weights(self, state: BatchState) -> tuple[np.ndarray, np.ndarray]:
        """The log-loss serving map of each stream as weights: ``(P (S,), W (S, T))``.

        :meth:`serving_map` (the next forecast, docs/ARCHITECTURE.md §4) of the log-loss mixture
        is linear in the calibrating functions: p' = P p + sum_t W_t f_t(p) on the clipped p,
        with W_t = sum_J of the jump-mixed active weights
        (:func:`calpipe.kernels.mixture.serving_weights`). This is the form the SQL macros of
        ``sql/macros/`` evaluate. The Brier compatibility mode has no such form.
        """
        if self.loss != "log":
            raise ParameterError(
                f"method {self.name!r} with loss={self.loss!r} has no weighted-sum serving map "
                "(only the log-loss mixture is linear in its calibrating functions)"
            )
        return state.passive, mixture.serving_weights(state.active, self.rates)

    def sql_form(self, n_classes: int = 2) -> str | None:
        """The mixture's terms (log loss), or the Brier mode's weights, binary and K classes."""
        return "brier" if self.loss == "brier" else "terms" if self.loss == "log" else None

    def map_terms(self, state: BatchState, n_classes: int = 2) -> MapTerms:
        """:meth:`map_weights` as the terms of :class:`~calpipe.calibrators.base.MapTerms`: the
        identity (weight P), then one term per calibrating function of the family (K classes:
        the Cox functions of paper 001 eq. (1), beta in ``b`` and the class shifts in
        ``alphas``)."""
        fam = self.family(n_classes)
        passive, w = self.map_weights(state)
        name = "cox" if fam.multiclass else _TERM_FAMILY[fam.name]
        alphas = None
        if fam.multiclass:
            alphas = np.vstack([np.zeros((1, n_classes)), fam.alphas])
        return MapTerms(
            family=np.array(["identity"] + [name] * fam.size),
            a=np.concatenate([[0.0], fam.params[:, 0]]),
            b=np.concatenate([[0.0], fam.params[:, 1]]),
            weight=np.column_stack([passive, w]),
            alphas=alphas,
        )


class Jumper(ProtectedCalibrator):
    """Jumper predictor (paper 000, Algorithm 2) and its test martingale (Algorithm 1).

    C_eps starts uniform over the family E; per labelled event: normalise, jump-mix
    C_eps <- (1 - J) C_eps + J / |E|, forecast p' = sum_eps f_eps(p) C_eps, then
    C_eps <- C_eps B_{f_eps(p)}({y}). log10 S_n = sum_{i<=n} log10 p'_i(y_i) - log10 p_i(y_i).
    """

    name = "jumper"
    summary = "Jumper predictor and test martingale (paper 000, Algs. 1-2), one jumping rate"
    parameters: ClassVar[dict[str, Param]] = {
        "family": _FAMILY,
        "family_params": _FAMILY_PARAMS,
        "jumping_rates": Param(
            (config.DEFAULT_JUMPER_RATE,),
            lambda v: tuple_of(_rate_ok)(v) and len(v) == 1,
            "exactly one jumping rate J in (0, 1]",
            "jumping rate J (paper 000 Alg. 1, line 4)",
            as_float_tuple,
        ),
        "clip": _CLIP,
    }

    def _initial_active(self, fam: Family) -> np.ndarray:
        return np.full((1, fam.size), 1.0 / fam.size)  # uniform start (Alg. 1, line 1)


class MeanJumper(ProtectedCalibrator):
    """Mean Jumper: the Jumper mixed over jumping rates including J = 1, equal prior (paper 000 §5).

    Its gale is the mean of the Jumpers' gales, so its test martingale is the mean of theirs; J = 1
    (re-drawing the calibrator every step) keeps the insurance cheap when the base is ideal.
    """

    name = "mean-jumper"
    summary = "Jumper averaged over jumping rates including J = 1 (paper 000 §5)"
    parameters: ClassVar[dict[str, Param]] = {
        "family": _FAMILY,
        "family_params": _FAMILY_PARAMS,
        "jumping_rates": Param(
            config.DEFAULT_MEAN_JUMPER_RATES,
            lambda v: tuple_of(_rate_ok)(v) and 1.0 in v and len(set(v)) == len(v),
            "distinct jumping rates in (0, 1] that include J = 1",
            "jumping rates, equal prior weight each",
            as_float_tuple,
        ),
        "clip": _CLIP,
    }

    def _initial_active(self, fam: Family) -> np.ndarray:
        r = len(self.rates)
        return np.full((r, fam.size), 1.0 / (r * fam.size))


class CompositeJumper(ProtectedCalibrator):
    """Composite Jumper (paper 001, Algorithm 1): passive weight pi on the base forecast, active
    weights on (J, theta) starting on the identity, jump-mixing per J, Bayes update, renormalise.

    ``loss="log"`` (default) is Algorithm 1 itself; ``loss="brier"`` is the Brier-loss aggregating
    algorithm of the reference package ``protected-classification`` 0.1.5 (see
    :func:`calpipe.kernels.brier_compat.brier_compat`; binary scores run through its two-class
    form :func:`calpipe.kernels.brier_compat.brier_binary`), offered for compatibility.
    """

    name = "composite-jumper"
    summary = "Composite Jumper (paper 001, Alg. 1): passive weight pi + jumpers over rates J"
    parameters: ClassVar[dict[str, Param]] = {
        "family": _FAMILY,
        "family_params": _FAMILY_PARAMS,
        "jumping_rates": JUMPING_RATES,
        "pi": PASSIVE_WEIGHT,
        "loss": Param(
            "log",
            one_of(*LOSSES),
            "'log' (paper 001 Alg. 1) or 'brier' (protected-classification 0.1.5 compatibility)",
            "log: Bayes mixture; brier: the package's Brier-loss aggregating algorithm",
        ),
        "clip": Param(
            None,
            lambda v: v is None or number_in(0.0, 0.5)(v),
            "a number in (0, 0.5), or None for the loss's default",
            "clip of p to [clip, 1 - clip]; None = config.DEFAULT_CLIP_EPS (log), no clip (brier)",
        ),
    }

    check_params = ({}, {"loss": "brier"})

    def __init__(self, **params):
        super().__init__(**params)
        if self.loss == "brier":  # the package's per-rate martingales, output in that mode only
            self.extra_outputs = ("log10_martingale_by_rate",)

    @property
    def pi(self) -> float:
        return float(self.params["pi"])

    def _cross_checked(self, params: dict[str, Any]) -> dict[str, Any]:
        params = super()._cross_checked(params)
        if params["loss"] == "brier":
            if params["family"] != "cox2" or params["family_params"] is not None:
                raise ParameterError(
                    "method 'composite-jumper': loss='brier' reproduces protected-classification "
                    "0.1.5 and uses its Cox grid: family must be 'cox2' with family_params=None"
                )
            if params["clip"] is not None:
                raise ParameterError(
                    f"method 'composite-jumper': clip={params['clip']!r} is invalid with "
                    "loss='brier': the Brier compatibility mode clips nothing (leave clip=None)"
                )
            return params  # the package's grid (package_grid) starts on the identity
        if params["clip"] is None:  # the log loss's default clip, stored in the configuration
            params = {**params, "clip": config.DEFAULT_CLIP_EPS}
        fam = binary_family(params["family"], params["family_params"])
        if fam.identity_index is None:
            raise ParameterError(
                "method 'composite-jumper': the family must contain the identity, on which the "
                "active weights start (paper 001 Alg. 1, line 2)"
            )
        return params

    def family(self, n_classes: int) -> Family:
        if self.loss == "brier":
            return package_grid(n_classes)
        return super().family(n_classes)

    def _initial_active(self, fam: Family) -> np.ndarray:
        a = np.zeros((len(self.rates), fam.size))
        a[:, fam.identity_index] = (1.0 - self.pi) / len(self.rates)  # Alg. 1, line 2
        return a

    def initial_state(self, n_streams: int, n_classes: int) -> BatchState:
        st = super().initial_state(n_streams, n_classes)
        if self.loss == "brier":
            n_fun = self.family(n_classes).size
            cap = np.zeros((n_streams, len(self.rates), n_fun))
            cap[:, :, 0] = 1.0  # the package's mart_capital starts on the identity slot
            st.capital = cap
            st.log_sj = np.zeros((n_streams, len(self.rates)))
        return st

    def state_layout(self, n_classes: int) -> dict[str, tuple[int, ...]]:
        layout = super().state_layout(n_classes)
        if self.loss == "brier":  # the package's per-rate "martingale" capital and log10 SJ
            layout |= {"capital": layout["active"], "log_sj": (len(self.rates),)}
        return layout

    def prepare_scores(self, scores: np.ndarray) -> np.ndarray:
        if self.loss == "log":
            return super().prepare_scores(scores)
        return np.ascontiguousarray(scores, dtype=np.float64)  # Brier mode clips nothing

    def run_unchecked(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        if self.loss == "log":
            return super().run_unchecked(scores, labels, op_event, op_kind, op_offsets, state)
        binary = scores.ndim == 1
        fam = self.family(2 if binary else scores.shape[1])
        # Binary: the fast two-class kernel (same recursion, libm-free exp/log, SIMD lanes);
        # its log10 CJ comes from _cj_rows, so the end state's is computed the same way.
        kernel, cj_rows = (
            (brier_compat.brier_binary, brier_compat.cj_rows)
            if binary
            else (brier_compat.brier_compat, brier_compat.log10_cj_rows)
        )
        p, cj, sj, pw, a, cap, lsj = kernel(
            scores, labels.astype(np.int64, copy=False), op_event, op_kind, op_offsets,
            np.ascontiguousarray(fam.betas), fam.alphas, self.rates,
            state.passive, state.active, state.capital, state.log_sj,
        )  # fmt: skip
        out = RunOutput(p, cj, {"log10_martingale_by_rate": sj})
        return out, BatchState(pw, a, cj_rows(lsj), cap, lsj)


PROTECTED_METHODS: dict[str, type[ProtectedCalibrator]] = {
    cls.name: cls for cls in (Jumper, MeanJumper, CompositeJumper)
}
