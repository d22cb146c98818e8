r"""The default method: the Composite Jumper over experts (``composite-experts``).

Paper 001's Composite Jumper mixes calibrating functions of the base forecast p. Its guarantees
use only that every active expert's forecast is fixed before the label, so the same algorithm can
mix calibrating functions applied to several prequential forecasts ("inputs"): the base itself
and online calibrators that follow drift without a window (by default ``ops`` and ``obs`` of
:mod:`calpipe.calibrators.online_scaling`, Gupta & Ramdas 2023; K classes: ``ops``, online vector
scaling). The experts are the pairs (input i, Cox function theta) on a grid wider than paper
001's (shifts of the log-odds up to |alpha| = 4, slopes beta in [1/4, 4]; K classes also shifts of
2 on each class), started on the inputs' identities. Kernel:
:mod:`calpipe.kernels.expert_mixture`.

Guarantees (log loss, natural logs, n labelled events, E = I |Theta| experts, R rates)
--------------------------------------------------------------------------------------
Let L(.) be cumulative log loss and w_0 the prior. The Bayes mixture of the passive expert and
the R Jumpers (paper 001 §2) loses at most ln(1 / prior) to each of its components, and the
Jumper of rate J is the Bayes mixture over expert *sequences* under the Markov prior "jump with
probability J to a uniform expert" (paper 000 §3), so:

1. **Insurance** (paper 001, Prop. 1): L(composite-experts) <= L(base) + ln(1 / pi). With the
   default pi = 1/2: at most ln 2 above the base over the whole stream, whatever happens.
2. **Each input, calibrated**: for any input i and function theta held throughout,
   L <= L(f_theta o q_i) + ln(R I / (1 - pi)) + ln(|Theta|) [theta != identity]
   + (n - 1) ln(1 / (1 - J)) for each rate J (the Jumper of rate J with one switch at the start);
   with J = 1e-4 the last term is n * 1e-4 nats, e.g. with OPS as input i and theta = identity:
   L <= L(OPS) + ln(6) + 1e-4 n.
3. **Switching**: for any sequence of experts with k switches,
   L <= L(sequence) + ln(R I / (1 - pi)) + k ln(E / J) + (n - 1 - k) ln(1 / (1 - J)).

Together with OPS's own O(d log n) regret against the best fixed Platt map (Hazan 2016,
Thm. 4.5), (2) gives L <= min_{a, b} L(Platt_{a, b}) + O(log n) + 1e-4 n + ln 6. The bounds are
tested in ``tests/calibrators/test_experts.py`` on adversarial and real sequences.

``log10_martingale`` is the log10 test martingale of the base forecasts (the ratio of the
mixture's likelihood to the base's, paper 000 Lemma 1): it has the alarm of every method.

Example
-------
>>> import numpy as np
>>> from calpipe.calibrators import make_calibrator
>>> out, st = make_calibrator("composite-experts").run(np.array([0.2, 0.7, 0.4]),
...                                                     np.array([0, 1, -1]))
>>> np.round(out.protected, 3).tolist()
[0.2, 0.698, 0.4]
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import Param, number_in
from calpipe.calibrators.base import (
    Calibrator,
    FlatState,
    RunOutput,
    check_state_length,
    clip_probabilities,
    tiled_state,
)
from calpipe.calibrators.online_scaling import OBS, OPS
from calpipe.calibrators.protected import JUMPING_RATES, PASSIVE_WEIGHT
from calpipe.errors import ParameterError
from calpipe.families import Family, binary_family, multiclass_family
from calpipe.kernels import expert_mixture as EM
from calpipe.kernels.ops import with_forecast_copies

#: The online calibrators that may serve as inputs (fixed-size state, no window: an input's
#: forecast at an update-only op is recomputed from its current state).
INPUT_METHODS: dict[str, type[Calibrator]] = {"ops": OPS, "obs": OBS}

_rate_ok = number_in(0.0, 1.0, lo_open=True, hi_open=False)


def _inputs_ok(v) -> bool:
    return v is None or (
        isinstance(v, tuple) and len(set(v)) == len(v) and all(m in INPUT_METHODS for m in v)
    )


def _grid_ok(v) -> bool:
    if v is None:
        return True
    try:
        arr = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        return False
    return (
        arr.ndim == 2 and arr.shape[0] > 0 and arr.shape[1] == 2 and bool(np.all(np.isfinite(arr)))
        and bool(np.all(arr[:, 1] > 0)) and bool(np.any((arr[:, 0] == 0) & (arr[:, 1] == 1)))
    )  # fmt: skip


def _as_tuple(v):
    if isinstance(v, list):
        return tuple(v)
    return v


class CompositeExperts(Calibrator[FlatState]):
    """Composite Jumper over calibrating functions of the base and of online calibrators.

    State of a stream: ``[P, A (R x E), then per input its log10 martingale and state vector]``
    (fixed length for a given K). See the module docstring for the recursion's guarantees.
    """

    name = "composite-experts"
    summary = (
        "default: Composite Jumper (paper 001) over Cox functions of the base and of online "
        "Platt/beta scaling; loss <= base + ln(1/pi)"
    )
    parameters: ClassVar[dict[str, Param]] = {
        "inputs": Param(
            None,
            _inputs_ok,
            f"None or distinct names among {', '.join(INPUT_METHODS)}",
            "online calibrators whose forecasts join the base as inputs; None = "
            "config.EXPERT_INPUTS_BINARY / _MULTICLASS",
            _as_tuple,
        ),
        "family_params": Param(
            None,
            _grid_ok,
            "None or (alpha, beta) pairs with beta > 0, including the identity (0, 1)",
            "binary Cox grid applied to every input; None = config.EXPERT_COX_ALPHAS x "
            "EXPERT_COX_BETAS (K classes: shifts config.EXPERT_CLASS_SHIFTS on each class)",
            lambda v: v if v is None else tuple(tuple(map(float, r)) for r in v),
        ),
        "jumping_rates": JUMPING_RATES,
        "pi": PASSIVE_WEIGHT,
        "clip": Param(
            config.DEFAULT_CLIP_EPS,
            number_in(0.0, 0.5),
            "a number in (0, 0.5)",
            "every input is clipped to [clip, 1 - clip] (K classes: floored, renormalised)",
        ),
    }
    check_params = ({}, {"inputs": ("ops",), "family_params": ((0.0, 1.0), (2.0, 0.5))})

    # -- configuration -------------------------------------------------------------------------
    @property
    def rates(self) -> np.ndarray:
        return np.asarray(self.params["jumping_rates"], dtype=np.float64)

    def input_names(self, n_classes: int) -> tuple[str, ...]:
        v = self.params["inputs"]
        if v is not None:
            return v
        return config.EXPERT_INPUTS_BINARY if n_classes == 2 else config.EXPERT_INPUTS_MULTICLASS

    def _inputs(self, n_classes: int) -> list[Calibrator]:
        return [INPUT_METHODS[m](clip=self.params["clip"]) for m in self.input_names(n_classes)]

    def check_classes(self, n_classes: int) -> None:
        super().check_classes(n_classes)
        for cal in self._inputs(n_classes):
            cal.check_classes(n_classes)

    def family(self, n_classes: int) -> Family:
        grid = self.params["family_params"]
        if n_classes == 2:
            if grid is None:
                grid = [(a, b) for a in config.EXPERT_COX_ALPHAS for b in config.EXPERT_COX_BETAS]
            return binary_family("cox2", grid)
        if grid is None:
            return multiclass_family(
                n_classes, "cox2", betas=config.EXPERT_COX_BETAS,
                alpha_shifts=config.EXPERT_CLASS_SHIFTS,
            )  # fmt: skip
        arr = np.asarray(grid, float)
        shifts = sorted({abs(a) for a in arr[:, 0] if a != 0})
        return multiclass_family(n_classes, "cox2", betas=np.unique(arr[:, 1]), alpha_shifts=shifts)

    def config(self, n_classes: int) -> dict[str, Any]:
        return {
            "method": self.name,
            "n_classes": n_classes,
            "inputs": [c.config(n_classes) for c in self._inputs(n_classes)],
            "family": self.family(n_classes).to_dict(),
            "jumping_rates": self.rates.tolist(),
            "pi": float(self.params["pi"]),
            "clip": float(self.params["clip"]),
        }

    # -- state: [P, A (R*E), (log10 S_i, vector_i) per input] ------------------------------------
    def _sizes(self, n_classes: int) -> tuple[int, list[int]]:
        n_exp = (1 + len(self.input_names(n_classes))) * self.family(n_classes).size
        return n_exp, [c.state_size(n_classes) for c in self._inputs(n_classes)]

    def state_size(self, n_classes: int) -> int:
        n_exp, sizes = self._sizes(n_classes)
        return 1 + len(self.rates) * n_exp + sum(1 + z for z in sizes)

    def initial_state(self, n_streams: int, n_classes: int) -> FlatState:
        fam = self.family(n_classes)
        n_in = 1 + len(self.input_names(n_classes))
        n_rates, ident = len(self.rates), fam.identity_index
        active = np.zeros((n_rates, n_in * fam.size))
        # start on every input's identity: (1 - pi) / (R I) each (paper 001 Alg. 1 line 2)
        active[:, ident :: fam.size] = (1.0 - self.params["pi"]) / (n_rates * n_in)
        parts = [np.array([self.params["pi"]]), active.ravel()]
        for cal in self._inputs(n_classes):
            st = cal.initial_state(1, n_classes)
            parts += [st.log10m, st.values]
        return tiled_state(np.concatenate(parts), n_streams)

    def state_from_flat(self, values, offsets, log10m, n_classes: int) -> FlatState:
        st = super().state_from_flat(values, offsets, log10m, n_classes)
        return check_state_length(st, self.state_size(n_classes), self.name, n_classes)

    # -- running -------------------------------------------------------------------------------
    def prepare_scores(self, scores: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(
            clip_probabilities(np.asarray(scores, dtype=np.float64), self.params["clip"])
        )

    def martingale_base(self, scores: np.ndarray) -> np.ndarray:
        return self.prepare_scores(scores)

    def run_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        n = scores.shape[0]
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        fam = self.family(n_classes)
        n_exp, sizes = self._sizes(n_classes)
        n_rates = len(self.rates)
        vec = state.values.reshape(state.n_streams, -1)
        # Each update-only op (a label of an event forecast earlier) gets a forecast op on a copy
        # of the event just before it, and the update then reads the copy's inputs: every input's
        # forecast *at the time the label is learnt*, from its current state (as the inputs
        # themselves do for their martingale, calpipe.calibrators.online.OnlineCalibrator).
        ext_event, ext_kind, ext_offsets, src, pos, upd_only = with_forecast_copies(
            op_event, op_kind, op_offsets, n
        )
        ext_event[pos[upd_only]] = ext_event[pos[upd_only] - 1]  # the update reads its copy
        x = np.ascontiguousarray(scores[src])
        y = np.ascontiguousarray(labels[src])
        # Inputs: the base, then each online calibrator run over the same operations.
        cols = [x]
        new_parts = []
        at = 1 + n_rates * n_exp
        for cal, size in zip(self._inputs(n_classes), sizes, strict=True):
            sub = cal.state_from_flat(
                np.ascontiguousarray(vec[:, at + 1 : at + 1 + size]).ravel(),
                np.arange(0, state.n_streams * size + 1, size, dtype=np.int64),
                np.ascontiguousarray(vec[:, at]), n_classes,
            )  # fmt: skip
            out, new_sub = cal.run_batch(
                cal.prepare_scores(x), y, ext_event, ext_kind, ext_offsets, sub
            )
            cols.append(self.prepare_scores(out.protected))
            new_parts += [new_sub.log10m[:, None], new_sub.values.reshape(state.n_streams, -1)]
            at += 1 + size
        q = np.ascontiguousarray(np.stack(cols, axis=1))
        passive = np.ascontiguousarray(vec[:, 0])
        active = np.ascontiguousarray(vec[:, 1 : 1 + n_rates * n_exp]).reshape(-1, n_rates, n_exp)
        if n_classes == 2:
            p, lm, pw, a, lm_end = EM.expert_mixture_binary(
                q, y, ext_event, ext_kind, ext_offsets, fam.params, self.rates, passive, active,
                state.log10m,
            )  # fmt: skip
        else:
            p, lm, pw, a, lm_end = EM.expert_mixture_multiclass(
                q, y, ext_event, ext_kind, ext_offsets, fam.betas, fam.alphas, self.rates,
                passive, active, state.log10m,
            )  # fmt: skip
        new_vec = np.concatenate([pw[:, None], a.reshape(state.n_streams, -1), *new_parts], axis=1)
        new = FlatState(np.ascontiguousarray(new_vec.ravel()), state.offsets.copy(), lm_end)
        return RunOutput(p[:n], lm[:n]), new


EXPERT_METHODS = (CompositeExperts,)


def _check_defaults() -> None:
    """The configured default grid must contain the identity (the active weights start on it)."""
    grid = [(a, b) for a in config.EXPERT_COX_ALPHAS for b in config.EXPERT_COX_BETAS]
    if not _grid_ok(grid):
        raise ParameterError("config.EXPERT_COX_ALPHAS x EXPERT_COX_BETAS lacks the identity")


_check_defaults()

__all__ = ["EXPERT_METHODS", "INPUT_METHODS", "CompositeExperts"]
