"""``decay-beta``: beta calibration refitted on exponentially forgotten score-bin counts.

The fixed-size counterpart of the windowed ``beta`` refit (:mod:`calpipe.calibrators.batch`):
the same model (Kull, Silva Filho & Flach 2017) fitted on the labels' counts in B log-odds bins,
each count multiplied by lambda = 1 - 2/W at every label, so the memory W plays the role of the
window while the state stays 5 + 2B floats. Recursion and fit:
:mod:`calpipe.kernels.decay_beta`. It is an input of the default method
(:mod:`calpipe.calibrators.experts`) and runs alone like any method.

Example
-------
>>> import numpy as np
>>> from calpipe.calibrators import make_calibrator
>>> rng = np.random.default_rng(0)
>>> p = rng.uniform(0.05, 0.95, 400)
>>> y = (rng.uniform(size=400) < p ** 2).astype(np.int64)  # the base is overconfident
>>> out, st = make_calibrator("decay-beta", memory=100).run(p, y)
>>> bool(out.protected[-1] < p[-1]), len(st.weights)
(True, 205)
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import Param, int_at_least, number_in
from calpipe.calibrators.base import CLIP_PARAM, FlatState
from calpipe.calibrators.online import OnlineCalibrator
from calpipe.kernels import decay_beta as DB
from calpipe.kernels import decay_venn_abers as DVA


class DecayBeta(OnlineCalibrator):
    """Beta calibration on exponentially forgotten bins of the base log-odds (binary).

    State of a stream: ``[u, a, b, c, g, g n^1 (B), g n^0 (B)]`` (labels learnt, the current map,
    the decayed counts of labels 1 and 0 per bin, kept multiplied by a common factor g).
    """

    name = "decay-beta"
    summary = (
        "beta calibration refitted on exponentially forgotten score-bin counts (memory W, "
        "fixed-size state): the windowed beta refit without the window"
    )
    classes = "binary"
    parameters: ClassVar[dict[str, Param]] = {
        "memory": Param(
            1000,
            int_at_least(4),
            "an integer >= 4",
            "effective window W: every count is multiplied by 1 - 2/W at each label",
        ),
        "warmup": Param(
            None,
            lambda v: v is None or int_at_least(1)(v),
            "None (W // 2) or an integer >= 1",
            "labels before the first fit (the base passes through until then)",
        ),
        "refit_every": Param(
            None,
            lambda v: v is None or int_at_least(1)(v),
            "None (max(1, W // 10)) or an integer >= 1",
            "labels between refits",
        ),
        "n_bins": Param(
            config.DECAY_BETA_N_BINS,
            int_at_least(1),
            "an integer >= 1",
            "equal-width bins of the base log-odds",
        ),
        "score_clip": Param(
            config.DECAY_BETA_EPS,
            number_in(0.0, 0.5),
            "a number in (0, 0.5)",
            "scores are clipped to [score_clip, 1 - score_clip] for the bins and the map",
        ),
        "clip": CLIP_PARAM,
    }
    check_params = ({"memory": 8}, {"memory": 6, "warmup": 1, "refit_every": 2, "n_bins": 5})

    @property
    def warmup(self) -> int:
        w = self.params["warmup"]
        return int(self.params["memory"]) // 2 if w is None else int(w)

    @property
    def refit_every(self) -> int:
        r = self.params["refit_every"]
        return max(1, int(self.params["memory"]) // 10) if r is None else int(r)

    def _state_size(self, n_classes: int) -> int:
        return DB.state_size(int(self.params["n_bins"]))

    def _initial_vector(self, n_classes: int) -> np.ndarray:
        return DB.initial_state(1, int(self.params["n_bins"]))[0]

    def _kernel(self, x, y, ev, kind, off, vectors, n_classes, inputs):
        p, new = DB.decay_beta(
            x, y, ev, kind, off, vectors, memory=int(self.params["memory"]),
            n_bins=int(self.params["n_bins"]), eps=float(self.params["score_clip"]),
            warmup=self.warmup, refit_every=self.refit_every, rho=config.DECAY_BETA_RIDGE,
            max_iter=config.DECAY_BETA_MAX_ITER, tol=config.DECAY_BETA_TOL,
        )  # fmt: skip
        return p, p, p, new

    # -- the SQL form (an input of composite-experts) -------------------------------------------
    def has_logistic_map(self) -> bool:
        return True

    def logistic_map(self, state: FlatState) -> np.ndarray:
        """Each stream's current map as ``[a, b, c, score_clip]``; NaN rows before the first
        fit (the base passes through)."""
        v = state.values.reshape(state.n_streams, -1)
        out = np.column_stack([v[:, 1:4], np.full(state.n_streams, self.params["score_clip"])])
        out[v[:, 0] < self.warmup] = np.nan
        return np.ascontiguousarray(out)


class DecayVennAbers(OnlineCalibrator):
    """Venn-ABERS (IVAP, Vovk & Petej 2014 Alg. 1) refitted on exponentially forgotten bins of
    the base log-odds (binary): the windowed ``venn-abers`` refit without the window, a
    nonparametric (monotone step) map where decay-beta's is logistic (issue #34: extreme,
    non-logistic miscalibration). Recursion: :mod:`calpipe.kernels.decay_venn_abers`.

    State of a stream: ``[u, g, g n^1 (B), g n^0 (B), table (B)]`` (labels learnt, the decayed
    counts of labels 1 and 0 per bin kept multiplied by a common factor g, the merged IVAP
    forecast of each bin at the last refit).
    """

    name = "decay-venn-abers"
    summary = (
        "Venn-ABERS (IVAP) refitted on exponentially forgotten score-bin counts (memory W, "
        "fixed-size state): the windowed venn-abers refit without the window"
    )
    classes = "binary"
    parameters: ClassVar[dict[str, Param]] = {
        **DecayBeta.parameters,
        "memory": Param(
            config.DECAY_VENN_ABERS_MEMORY,
            int_at_least(4),
            "an integer >= 4",
            "effective window W: every count is multiplied by 1 - 2/W at each label "
            "(config.DECAY_VENN_ABERS_MEMORY)",
        ),
    }
    check_params = ({"memory": 8}, {"memory": 6, "warmup": 1, "refit_every": 2, "n_bins": 5})

    warmup = DecayBeta.warmup
    refit_every = DecayBeta.refit_every

    def _state_size(self, n_classes: int) -> int:
        return DVA.state_size(int(self.params["n_bins"]))

    def _initial_vector(self, n_classes: int) -> np.ndarray:
        return DVA.initial_state(1, int(self.params["n_bins"]))[0]

    def _kernel(self, x, y, ev, kind, off, vectors, n_classes, inputs):
        p, new = DVA.decay_venn_abers(
            x, y, ev, kind, off, vectors, memory=int(self.params["memory"]),
            n_bins=int(self.params["n_bins"]), eps=float(self.params["score_clip"]),
            warmup=self.warmup, refit_every=self.refit_every,
        )  # fmt: skip
        return p, p, p, new

    # -- the SQL form: a step table at the bins' edges (a table input of composite-experts) ----
    def map_breakpoints(self, state: FlatState) -> list[tuple[np.ndarray, bool] | None] | None:
        """The scores where the bin changes (:func:`~calpipe.kernels.decay_venn_abers.
        bin_thresholds`: the smallest double of each bin, as the kernel bins it; sigmoid(edge)
        rounded can fall on either side): the map is the table's value of the score's
        log-odds bin, constant from one to the next; None for a stream before its warm-up (the
        base passes through)."""
        x = DVA.bin_thresholds(int(self.params["n_bins"]), float(self.params["score_clip"]))
        u = state.values.reshape(state.n_streams, -1)[:, 0]
        return [(x, False) if ui >= self.warmup else None for ui in u]


DECAY_METHODS = (DecayBeta, DecayVennAbers)

__all__ = ["DECAY_METHODS", "DecayBeta", "DecayVennAbers"]
