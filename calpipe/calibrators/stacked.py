"""Stacking: protect the output of another calibrator (``--base-method``).

``Stacked(base, top)`` runs ``base`` on the events and feeds its forecasts to ``top`` as the base
probabilities, in one pass over the same operation list: both see exactly the labels a
prequential run allows, so the stack is prequential too. With a protected ``top`` (the Composite
Jumper), paper 001's insurance applies to the base calibrator's forecasts: the stack's cumulative
log loss is at most that of ``base`` (clipped as ``top`` clips its base) plus ln(1/pi).

The state of a stream is ``[L, log10 S_base, base vector (L), top vector]``; ``log10_martingale``
is the top's (its test martingale of the base calibrator's forecasts), and the extra column
``base_method_score`` (K classes: ``base_method_scores``) holds the base calibrator's forecast as
it made it; the martingale bets against it as the top reads it (clipped:
``martingale_base(base_method_score)``), as a method alone bets against its clipped input.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from calpipe.calibrators._params import Param
from calpipe.calibrators.base import Calibrator, FlatState, RunOutput
from calpipe.calibrators.batch import Platt, Temperature
from calpipe.calibrators.protected import CompositeJumper, Jumper


def _is_calibrator(v) -> bool:
    return isinstance(v, Calibrator)


class Stacked(Calibrator[FlatState]):
    """``top`` applied to the forecasts of ``base`` (both already-validated calibrators)."""

    name = "stacked"  # of the class; an instance is named "top+base"
    summary = "a calibrator protecting (or recalibrating) the output of another one"
    supports_label_time = False  # a pending label's base forecast is not kept across batches
    parameters: ClassVar[dict[str, Param]] = {
        "base": Param(None, _is_calibrator, "a calibrator", "the method whose forecasts go on"),
        "top": Param(None, _is_calibrator, "a calibrator", "the method run on those forecasts"),
    }
    check_params = (
        {"base": Platt(window=5, refit_every=3), "top": CompositeJumper()},
        {"base": Temperature(window=5, refit_every=4), "top": Jumper()},
    )

    def __init__(self, base: Calibrator, top: Calibrator):
        super().__init__(base=base, top=top)  # each part has validated its own table
        self.base, self.top = base, top
        self.name = f"{top.name}+{base.name}"
        self.classes = "binary" if "binary" in (base.classes, top.classes) else "both"
        self.extra_outputs = (*top.extra_outputs, "base_method_score")

    def check_classes(self, n_classes: int) -> None:
        self.base.check_classes(n_classes)
        self.top.check_classes(n_classes)

    def config(self, n_classes: int) -> dict:
        return {"stack": [self.base.config(n_classes), self.top.config(n_classes)]}

    # -- state: [L, log10 S_base, base (L), top] -----------------------------------------------
    def initial_state(self, n_streams: int, n_classes: int) -> FlatState:
        return self._join(
            self.base.initial_state(n_streams, n_classes),
            self.top.initial_state(n_streams, n_classes),
        )

    @staticmethod
    def _join(bst, tst) -> FlatState:
        bv, bo = bst.flat()
        tv, to = tst.flat()
        vectors = [
            np.concatenate(
                [[bo[s + 1] - bo[s], bst.log10m[s]], bv[bo[s] : bo[s + 1]], tv[to[s] : to[s + 1]]]
            )
            for s in range(bst.n_streams)
        ]
        return FlatState.from_vectors(vectors, np.asarray(tst.log10m, dtype=np.float64))

    def split_state(self, st: FlatState, n_classes: int):
        """The base's and the top's parts of a stack's state (validated by each)."""
        bvec, tvec, blm = [], [], np.empty(st.n_streams)
        for s in range(st.n_streams):
            v = st.vector(s)
            n_base = int(v[0])
            blm[s] = v[1]
            bvec.append(v[2 : 2 + n_base])
            tvec.append(v[2 + n_base :])
        b = FlatState.from_vectors(bvec, blm)
        t = FlatState.from_vectors(tvec, st.log10m)
        return (
            self.base.state_from_flat(b.values, b.offsets, b.log10m, n_classes),
            self.top.state_from_flat(t.values, t.offsets, t.log10m, n_classes),
        )

    def sql_form(self, n_classes: int = 2) -> str | None:
        """The base's layers then the top's, when both have a form (a ``composite-experts``'
        input tables included: the macros evaluate each layer's at the value that layer
        receives, the top's at the base's value clipped as the top clips it)."""
        ok = all(c.sql_form(n_classes) is not None for c in (self.base, self.top))
        return "stack" if ok else None

    def state_from_flat(self, values, offsets, log10m, n_classes: int) -> FlatState:
        st = super().state_from_flat(values, offsets, log10m, n_classes)
        self.split_state(st, n_classes)  # validates both parts
        return st

    # -- running -------------------------------------------------------------------------------
    def prepare_scores(self, scores: np.ndarray) -> np.ndarray:
        return self.base.prepare_scores(scores)

    def martingale_base(self, scores: np.ndarray) -> np.ndarray:
        """The forecasts the martingale bets against, from the base method's forecasts (the
        ``base_method_score`` output, not the raw scores): as the top reads them."""
        return self.top.martingale_base(scores)

    def input_columns(self) -> dict[str, str]:
        return {**self.base.input_columns(), **self.top.input_columns()}

    def n_categories_input(self) -> int | None:
        return self.base.n_categories_input() or self.top.n_categories_input()

    def run_unchecked(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        bst, tst = self.split_state(state, n_classes)
        args = (labels, op_event, op_kind, op_offsets)
        bout, bnew = self.base.run_unchecked(scores, *args, bst, inputs)
        top_in = self.top.prepare_scores(bout.protected)
        tout, tnew = self.top.run_unchecked(top_in, *args, tst, inputs)
        extra = {**tout.extra, "base_method_score": bout.protected}
        return RunOutput(tout.protected, tout.log10_martingale, extra), self._join(bnew, tnew)

    def end_warnings(self, state: FlatState, n_classes: int) -> None:
        """The base's end warnings, then the top's (as a call of the stack gives them)."""
        bst, tst = self.split_state(state, n_classes)
        self.base.end_warnings(bst, n_classes)
        self.top.end_warnings(tst, n_classes)

    def serving_map_unchecked(self, state: FlatState, scores: np.ndarray) -> np.ndarray:
        """The base method's current map, then the top's, applied to ``scores``."""
        n_classes = 2 if scores.ndim == 2 else scores.shape[2]
        bst, tst = self.split_state(state, n_classes)
        # The top's serving map prepares the base's forecasts itself, as run_batch does once:
        # preparing twice is not the identity for K classes (floor and renormalise).
        return self.top.serving_map_unchecked(tst, self.base.serving_map_unchecked(bst, scores))
