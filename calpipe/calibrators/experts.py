r"""The default method: the Composite Jumper over experts (``composite-experts``).

Paper 001's Composite Jumper mixes calibrating functions of the base forecast p. Its guarantees
use only that every active expert's forecast is fixed before the label, so the same algorithm can
mix calibrating functions applied to several prequential forecasts ("inputs"): the base itself
and calibrators run prequentially on it. By default (``config.EXPERT_INPUTS_BINARY``) those are
two online calibrators that follow drift without a window, ``ops`` and ``obs`` of
:mod:`calpipe.calibrators.online_scaling` (Gupta & Ramdas 2023), and beta calibration (Kull et
al. 2017) refitted on exponentially forgotten counts with memories of 1,000 and 4,000 labels
(``decay-beta``, :mod:`calpipe.calibrators.decay`: the practitioner's trailing-window refit with
a fixed-size state), which forgets what online scaling keeps; K classes: ``ops`` (online vector
scaling). The experts are the pairs (input i, Cox function theta) on a grid wider
than paper 001's (shifts of the log-odds up to |alpha| = 4, slopes beta in [1/2, 2]; K classes
shifts of 1 and 2 on each class), started on the inputs' identities. A jump of the mixture goes
back to that start (an input's identity, each with probability 1 / I) with probability
``restart`` = 1/2 (``config.EXPERT_JUMP_RESTART``), else to a uniform expert as in paper 001:
switching to another input then costs ln(2 I / J) nats instead of ln(I |Theta| / J)
(``docs/studies/short-streams.md``). Kernels:
:mod:`calpipe.kernels.expert_lanes` (binary) and :mod:`calpipe.kernels.expert_lanes_multiclass`
(K classes; also ``oms`` inputs) learn the default inputs and the mixture in one pass, streams
in SIMD lanes; :mod:`calpipe.kernels.expert_mixture` runs the mixture of any inputs.

Guarantees (log loss, natural logs, n labelled events, E = I |Theta| experts, R rates)
--------------------------------------------------------------------------------------
Let L(.) be cumulative log loss and w_0 the prior. The Bayes mixture of the passive expert and
the R Jumpers (paper 001 §2) loses at most ln(1 / prior) to each of its components, and the
Jumper of rate J is the Bayes mixture over expert *sequences* under the Markov prior "jump with
probability J to an expert drawn from mu" (paper 000 §3 with mu uniform; its derandomisation
holds for any jump distribution mu). Here mu = (1 - w) uniform + w r, r the start (each input's
identity 1 / I) and w = ``restart``: a jump lands on expert k with probability at least
J (1 - w) / E, on input i's identity with probability at least J w / I. So:

1. **Insurance** (paper 001, Prop. 1): L(composite-experts) <= L(base) + ln(1 / pi). With the
   default pi = 1/2: at most ln 2 above the base over the whole stream, whatever happens.
2. **Each input, calibrated**: for any input i and function theta held throughout,
   L <= L(f_theta o q_i) + ln(R I / (1 - pi)) + ln(|Theta|) [theta != identity]
   + (n - 1) ln(1 / (1 - J)) for each rate J (the Jumper of rate J with one switch at the start);
   with J = 1e-4 the last term is n * 1e-4 nats; with the default R = 3 rates, pi = 1/2 and
   I = 6 inputs (base, OPS, OBS, two decay-beta fits, decay-venn-abers), for theta = identity:
   L <= L(input i) + ln(36) + 1e-4 n, e.g. within ln 36 + 1e-4 n of each beta refit and of OPS
   (K classes, I = 3: base, online vector and matrix scaling: ln 18).
3. **Switching**: for any sequence of experts with k switches,
   L <= L(sequence) + ln(R I / (1 - pi)) + sum over the switches of ln(1 / (J mu(target)))
   + (n - 1 - k) ln(1 / (1 - J)): a switch to any expert costs at most ln(E / ((1 - w) J))
   (w = 1/2: ln(2E / J), ln 2 more than paper 001's uniform jumps), a switch to an input's
   identity at most ln(I / (w J)) = ln(2 I / J) (uniform jumps: ln(E / J); with the default
   I = 6 inputs and |Theta| = 21, ln 12 instead of ln 126: 2.35 nats less a switch; K = 10
   with inputs (ops, oms), |Theta| = 123: 4.1 nats less).

Together with OPS's own O(d log n) regret against the best fixed Platt map (Hazan 2016,
Thm. 4.5), (2) gives L <= min_{a, b} L(Platt_{a, b}) + O(log n) + 1e-4 n + ln 36. The bounds are
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
[0.2, 0.699, 0.4]
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from calpipe import config
from calpipe.calibrators._params import Param, number_in
from calpipe.calibrators.base import (
    Calibrator,
    FlatState,
    MapTerms,
    RunOutput,
    check_mixture_weights,
    ragged_concat,
    ragged_take,
)
from calpipe.calibrators.batch import BATCH_METHODS
from calpipe.calibrators.decay import DecayBeta, DecayVennAbers
from calpipe.calibrators.gale import clip_probabilities, likelihood_gale_ends
from calpipe.calibrators.online_scaling import OBS, OMS, OPS, vector_as_matrix
from calpipe.calibrators.protected import JUMPING_RATES, PASSIVE_WEIGHT
from calpipe.calibrators.windowed import WindowedCalibrator
from calpipe.errors import ParameterError, StateError
from calpipe.families import Family, binary_family, multiclass_family
from calpipe.kernels import decay_beta as DB
from calpipe.kernels import expert_lanes as EL
from calpipe.kernels import expert_lanes_multiclass as EK
from calpipe.kernels import expert_mixture as EM
from calpipe.kernels import online_scaling as OS
from calpipe.kernels.mixture import serving_weights
from calpipe.kernels.ops import OP_FORECAST, with_forecast_copies

#: The calibrators that may serve as inputs: online Platt/beta/matrix scaling (no window),
#: beta calibration and Venn-ABERS on exponentially forgotten bins (``decay-beta``,
#: ``decay-venn-abers``: fixed-size states, learnt in the SIMD lanes) and the
#: windowed batch calibrators (a trailing window refitted every few labels, the practitioner's
#: nightly refit). Each forecasts an update-only op's copy from its state at that time.
INPUT_METHODS: dict[str, type[Calibrator]] = {
    cls.name: cls for cls in (OPS, OBS, OMS, DecayBeta, DecayVennAbers, *BATCH_METHODS)
}

_rate_ok = number_in(0.0, 1.0, lo_open=True, hi_open=False)


def _scalar(token: str):
    """A parameter value written in an input spec: none, an integer, a number or a string."""
    if token.strip().lower() == "none":
        return None
    for cast in (int, float):
        try:
            return cast(token)
        except ValueError:
            pass
    return token


def input_spec(v):
    """One input as ``(name, ((param, value), ...))`` (parameters sorted by name), from a method
    name (``"ops"``), the command-line form ``"beta:window=1000:refit_every=250"`` or a pair
    ``(name, {param: value})``; anything else is returned as it is (and fails the check).

    >>> input_spec("beta:window=1000:refit_every=250")
    ('beta', (('refit_every', 250), ('window', 1000)))
    >>> input_spec(("ops", {}))
    ('ops', ())
    """
    if isinstance(v, str):
        name, *tokens = v.split(":")
        pairs = [t.partition("=") for t in tokens]
        if any(not sep or not k.strip() for k, sep, _ in pairs):
            return v
        return name.strip(), tuple(sorted((k.strip(), _scalar(x)) for k, _, x in pairs))
    if isinstance(v, tuple | list) and len(v) == 2 and isinstance(v[0], str):
        params = v[1]
        if isinstance(params, dict):
            params = params.items()
        try:
            return v[0], tuple(sorted((str(k), x) for k, x in params))
        except (TypeError, ValueError):
            return v
    return v


def _inputs_ok(v) -> bool:
    if v is None:
        return True
    specs_ok = isinstance(v, tuple) and all(
        isinstance(x, tuple) and len(x) == 2 and x[0] in INPUT_METHODS for x in v
    )
    return specs_ok and len(set(v)) == len(v)


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


def _specs(v):
    if v is None:
        return None
    if isinstance(v, str):
        v = (v,)
    if isinstance(v, list | tuple):
        return tuple(input_spec(x) for x in v)
    return v


def make_input(spec, clip: float) -> Calibrator:
    """The calibrator of one (normalised) input spec; its ``clip`` is the mixture's unless the
    spec sets it. A windowed input does not warn about unfilled windows (its forecast then is
    the base's, which the mixture already holds)."""
    name, params = spec
    params = dict(params)
    params.setdefault("clip", clip)
    try:
        cal = INPUT_METHODS[name](**params)
    except ParameterError as e:
        raise ParameterError(f"method 'composite-experts': input {name!r}: {e}") from None
    if isinstance(cal, WindowedCalibrator):
        cal.warn_unfilled = False
    return cal


class CompositeExperts(Calibrator[FlatState]):
    """Composite Jumper over calibrating functions of the base and of online calibrators.

    State of a stream: ``[P, A (R x E), then per input [length, log10 S, state vector]]``
    (the length of a windowed input's part grows with its window). See the module docstring for the recursion's guarantees.
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
            f"None or distinct inputs among {', '.join(INPUT_METHODS)}, each a name, "
            "'name:param=value:...' or (name, {param: value})",
            "calibrators whose forecasts join the base as inputs; None = "
            "config.EXPERT_INPUTS_BINARY / _MULTICLASS",
            _specs,
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
        "restart": Param(
            config.EXPERT_JUMP_RESTART,
            number_in(0.0, 1.0, lo_open=False, hi_open=True),
            "a number in [0, 1)",
            "probability that a jump goes back to the start (each input's identity) instead of "
            "to a uniform expert; 0 = paper 001's uniform jumps (config.EXPERT_JUMP_RESTART)",
        ),
        "clip": Param(
            config.DEFAULT_CLIP_EPS,
            number_in(0.0, 0.5),
            "a number in (0, 0.5)",
            "every input is clipped to [clip, 1 - clip] (K classes: floored, renormalised)",
        ),
    }
    check_params = (
        {},
        {"inputs": ("ops",), "family_params": ((0.0, 1.0), (2.0, 0.5))},
        {"inputs": ("obs", "platt:window=4:refit_every=3")},
    )
    #: How a binary batch runs (every choice gives the same bits): "fused" -- inputs that are
    #: OPS, OBS, decay-beta or decay-venn-abers learnt inside the mixture's kernel, streams in
    #: SIMD lanes
    #: (:mod:`calpipe.kernels.expert_lanes`; other inputs: as "per-input"); "per-input" -- each
    #: input's own kernel, then the mixture in lanes; "per-stream" -- each input's own kernel,
    #: then the mixture one stream at a time (the kernels before lanes; tests and benchmarks).
    #: K >= 3 classes: "fused" -- inputs that are all ``ops`` or ``oms`` (online vector or
    #: matrix scaling) learnt inside the K-class lanes kernel
    #: (:mod:`calpipe.kernels.expert_lanes_multiclass`; other inputs: as "per-input");
    #: "per-input" and "per-stream" -- each input's own kernel, then the mixture one stream at
    #: a time (``expert_mixture.expert_mixture_multiclass``).
    engine: ClassVar[str] = "fused"

    # -- configuration -------------------------------------------------------------------------
    @property
    def rates(self) -> np.ndarray:
        return np.asarray(self.params["jumping_rates"], dtype=np.float64)

    def input_specs(self, n_classes: int) -> tuple:
        """The inputs (besides the base) as normalised specs: the parameter or the default.

        The default's online matrix scaling (``oms``) learns K^2 + K parameters and stops at
        ``config.OMS_MAX_CLASSES`` classes; beyond that the default runs without it (online
        vector scaling has no limit), so that the default method takes any K. Given inputs
        are kept as given (``oms`` then refuses K above its limit, naming it)."""
        v = self.params["inputs"]
        if v is not None:
            return v
        if n_classes == 2:
            return _specs(config.EXPERT_INPUTS_BINARY)
        specs = _specs(config.EXPERT_INPUTS_MULTICLASS)
        if n_classes > config.OMS_MAX_CLASSES:
            specs = tuple(x for x in specs if x[0] != "oms")
        return specs

    def _inputs(self, n_classes: int) -> list[Calibrator]:
        return [make_input(x, self.params["clip"]) for x in self.input_specs(n_classes)]

    def __init__(self, **params):
        super().__init__(**params)
        if self.params["inputs"] is not None:  # a binary-only input makes the mixture binary
            cals = [make_input(x, self.params["clip"]) for x in self.params["inputs"]]
            if any(c.classes == "binary" for c in cals):
                self.classes = "binary"

    def _cross_checked(self, params):
        if params["inputs"] is not None:  # each input's own table (errors name the input)
            for x in params["inputs"]:
                make_input(x, params["clip"])
        return params

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
        out = {
            "method": self.name,
            "n_classes": n_classes,
            "inputs": [c.config(n_classes) for c in self._inputs(n_classes)],
            "state_layout": 2,  # 2: [length, log10 S, vector] per input (1 had no lengths)
            "family": self.family(n_classes).to_dict(),
            "jumping_rates": self.rates.tolist(),
            "pi": float(self.params["pi"]),
            "clip": float(self.params["clip"]),
        }
        if self.params["restart"] != 0.0:  # restart 0 keeps the fingerprint of the states
            out["restart"] = float(self.params["restart"])  # written before it existed
        return out

    def restart_to(self, n_classes: int) -> np.ndarray:
        """The distribution a restarting jump draws from (E,): the mixture's start, each input's
        identity with probability 1 / I (:meth:`initial_state`'s active weights, per rate)."""
        fam = self.family(n_classes)
        n_in = 1 + len(self.input_specs(n_classes))
        to = np.zeros(n_in * fam.size)
        to[fam.identity_index :: fam.size] = 1.0 / n_in
        return to

    def _restart_kw(self, n_classes: int) -> dict[str, Any]:
        """The kernels' ``restart`` and ``restart_to`` arguments."""
        return {"restart": float(self.params["restart"]), "restart_to": self.restart_to(n_classes)}

    # -- state: [P, A (R*E), (length_i, log10 S_i, vector_i) per input] -------------------------
    def _head_size(self, n_classes: int) -> int:
        n_exp = (1 + len(self.input_specs(n_classes))) * self.family(n_classes).size
        return 1 + len(self.rates) * n_exp

    def state_size(self, n_classes: int) -> int | None:
        sizes = [c.state_size(n_classes) for c in self._inputs(n_classes)]
        if any(z is None for z in sizes):
            return None  # a windowed input's state grows with its window
        return self._head_size(n_classes) + sum(2 + z for z in sizes)

    def initial_state(self, n_streams: int, n_classes: int) -> FlatState:
        fam = self.family(n_classes)
        n_in = 1 + len(self.input_specs(n_classes))
        n_rates, ident = len(self.rates), fam.identity_index
        active = np.zeros((n_rates, n_in * fam.size))
        # start on every input's identity: (1 - pi) / (R I) each (paper 001 Alg. 1 line 2)
        active[:, ident :: fam.size] = (1.0 - self.params["pi"]) / (n_rates * n_in)
        head = np.concatenate([[self.params["pi"]], active.ravel()])
        if self.state_size(n_classes) is not None:  # fixed layout: one row, written S times
            subs = [c.initial_state(1, n_classes) for c in self._inputs(n_classes)]
            row = self._join(head[None, :], subs, np.zeros(1)).values
            values = np.empty((n_streams, row.shape[0]))
            values[:] = row  # one pass (np.tile's repeat took 0.8 s for 100,000 streams)
            offsets = np.arange(0, values.size + 1, row.shape[0], dtype=np.int64)
            return FlatState(values.ravel(), offsets, np.zeros(n_streams))
        subs = [c.initial_state(n_streams, n_classes) for c in self._inputs(n_classes)]
        return self._join(np.tile(head, (n_streams, 1)), subs, np.zeros(n_streams))

    @staticmethod
    def _join(head: np.ndarray, subs: list[FlatState], log10m: np.ndarray) -> FlatState:
        """One vector per stream: the (S, h) head, then per input [length, log10 S, vector]."""
        n = head.shape[0]
        pairs = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
        parts = [(np.ascontiguousarray(head).ravel(), np.arange(0, head.size + 1, head.shape[1]))]
        for sub in subs:
            prefix = np.column_stack([np.diff(sub.offsets), sub.log10m]).ravel()
            parts += [(prefix.astype(np.float64), pairs), (sub.values, sub.offsets)]
        values, offsets = ragged_concat(parts)
        return FlatState(values, offsets, np.asarray(log10m, dtype=np.float64))

    def _split(self, st: FlatState, n_classes: int) -> tuple[np.ndarray, list[FlatState]]:
        """The (S, h) head and each input's state (validated by the input), or StateError."""
        h = self._head_size(n_classes)
        start, end = st.offsets[:-1], st.offsets[1:]

        def bad(s, what):
            raise StateError(
                f"method {self.name!r}: state vector {int(s)} {what}: the layout is [P, A "
                f"({h - 1}), then per input [length, log10 S, vector]] for inputs "
                f"{[x[0] for x in self.input_specs(n_classes)]} (K = {n_classes})",
                stream=int(s),
            )

        short = np.flatnonzero(end - start < h)
        if short.size:
            bad(short[0], f"is shorter than its head ({h})")
        head = ragged_take(st.values, start, np.full(start.shape[0], h))[0].reshape(-1, h)
        check_mixture_weights(self.name, head[:, 0], head[:, 1:])
        at = start + h
        subs = []
        for cal in self._inputs(n_classes):
            cut = np.flatnonzero(at + 2 > end)
            if cut.size:
                bad(cut[0], f"ends before input {cal.name!r}")
            length = st.values[at]
            wrong = np.flatnonzero(
                (length < 0) | (length != np.floor(length)) | (at + 2 + length > end)
            )
            if wrong.size:
                bad(wrong[0], f"has input {cal.name!r} of impossible length {length[wrong[0]]}")
            length = length.astype(np.int64)
            values, offsets = ragged_take(st.values, at + 2, length)
            subs.append(cal.state_from_flat(values, offsets, st.values[at + 1].copy(), n_classes))
            at = at + 2 + length
        extra = np.flatnonzero(at != end)
        if extra.size:
            bad(extra[0], f"has {int(end[extra[0]] - at[extra[0]])} values after the last input")
        return head, subs

    def _uniform(self, st: FlatState, n_classes: int) -> tuple[np.ndarray, list[int]] | None:
        """The state as an (S, L) view of its values and each input's first column (its length
        field; then its log10 S, then its vector), when every stream has the fixed layout that
        :meth:`_split` accepts: every input of a fixed size, each length field that size, the
        mixture weights valid (StateError otherwise, as :meth:`_split`). None when the layout
        is not fixed or a stream departs from it: :meth:`_split` then validates and names it.
        No copy: a run reads the state in place and writes its new state once."""
        sizes = [c.state_size(n_classes) for c in self._inputs(n_classes)]
        if any(z is None for z in sizes) or st.n_streams == 0:
            return None
        h = self._head_size(n_classes)
        width = h + sum(2 + z for z in sizes)
        n = st.n_streams
        if st.values.shape[0] != n * width or not np.array_equal(
            st.offsets, np.arange(0, n * width + 1, width)
        ):
            return None
        m = st.values.reshape(n, width)
        starts, at = [], h
        for z in sizes:
            if not np.all(m[:, at] == z):
                return None
            starts.append(at)
            at += 2 + z
        check_mixture_weights(self.name, m[:, 0], m[:, 1:h])
        for cal, at, z in zip(self._inputs(n_classes), starts, sizes, strict=True):
            # each input's own checks (:meth:`_split` runs them through its state_from_flat)
            cal.check_state_vectors(m[:, at + 2 : at + 2 + z], n_classes)
        return m, starts

    def state_from_flat(self, values, offsets, log10m, n_classes: int) -> FlatState:
        st = super().state_from_flat(values, offsets, log10m, n_classes)
        if self._uniform(st, n_classes) is None:  # the fixed layout checks without copies
            self._split(st, n_classes)  # validates the layout and every input's part, naming it
        return st

    # -- the serving map's SQL form -------------------------------------------------------------
    def map_terms(self, state: FlatState, n_classes: int = 2) -> MapTerms:
        """Each stream's serving map as weighted terms: P on the clipped base, then
        W_{i, theta} (summed over the rates after jump-mixing, as the next forecast mixes them)
        on the Cox function theta of input i, each input written as its current logistic map
        (``ops``, ``obs``, windowed ``platt``/``beta``; an unfitted window: the base), for K
        classes as its vector scaling map (``ops``: online vector scaling). A binary input
        without a logistic map (isotonic, Venn-ABERS, ...: a step or linear table, see
        :meth:`table_inputs`) is named in ``in_table``. K classes: each input's
        ``k_input_map``, ``[a, b, eps]`` (2K + 1) when every input is vector scaling, else
        ``[W row-major, b, eps]`` (K^2 + K + 1), vector maps written with W = diag(a) (``oms``:
        online matrix scaling). Raises ParameterError for a K-class input without such a map."""
        k = n_classes
        fam = self.family(k)
        head, subs = self._split(state, k)
        n, t = head.shape[0], fam.size
        n_rates = len(self.rates)
        active = np.ascontiguousarray(head[:, 1:]).reshape(n, n_rates, -1)
        weight = np.column_stack(
            [head[:, 0], serving_weights(active, self.rates, **self._restart_kw(k))]
        )
        matrix = k > 2 and any(c.sql_form(k) == "matrix" for c in self._inputs(k))
        width = 4 if k == 2 else (k * k + k + 1 if matrix else 2 * k + 1)
        inputs = np.full((n, weight.shape[1], width), np.nan)
        in_table = np.full(weight.shape[1], -1, dtype=np.int64)
        tables = self.table_input_indices() if k == 2 else []
        for i, (cal, sub) in enumerate(zip(self._inputs(k), subs, strict=True)):
            lo = 1 + (i + 1) * t  # input 0 is the base itself: its terms keep NaN
            if i in tables:
                in_table[lo : lo + t] = tables.index(i)
                continue
            if not hasattr(cal, "logistic_map" if k == 2 else "k_input_map"):
                raise ParameterError(f"input {cal.name!r} of {self.name!r} has no SQL form")
            if k == 2:
                m = cal.logistic_map(sub)
            else:
                m = cal.k_input_map(sub, k)
                if matrix and m.shape[1] == 2 * k + 1:
                    m = vector_as_matrix(m, k)
            inputs[:, lo : lo + t] = m[:, None, :]
        n_in = 1 + len(subs)
        alphas = None
        if k > 2:
            alphas = np.vstack([np.zeros((1, k)), np.tile(fam.alphas, (n_in, 1))])
        return MapTerms(
            family=np.array(["identity"] + ["cox"] * (n_in * t)),
            a=np.concatenate([[0.0], np.tile(fam.params[:, 0], n_in)]),
            b=np.concatenate([[0.0], np.tile(fam.params[:, 1], n_in)]),
            weight=weight,
            inputs=inputs if k == 2 else None,
            alphas=alphas,
            inputs_k=inputs if k > 2 else None,
            in_table=in_table if k == 2 else None,
        )

    def sql_form(self, n_classes: int = 2) -> str | None:
        """The mixture's terms when every input's map can be a term's input: binary, a logistic
        map or a step table of its own (:meth:`table_input_indices`); K classes, online vector
        or matrix scaling's map."""
        if n_classes > 2:
            ok = all(c.sql_form(n_classes) in ("vector", "matrix") for c in self._inputs(n_classes))
        else:
            ok = all(c.has_logistic_map() or c.sql_form(2) == "steps" for c in self._inputs(2))
        return "terms" if ok else None

    def table_input_indices(self) -> list[int]:
        """The binary inputs without a logistic map (their positions among the inputs, in
        order; ``MapTerms.in_table`` numbers them 0, 1, ...): their maps are tables of their
        own, which the SQL serving map evaluates before the terms, at the method's input
        clipped (the score; as a stack's top, its base's value)."""
        return [i for i, cal in enumerate(self._inputs(2)) if not cal.has_logistic_map()]

    def table_inputs(self, state: FlatState) -> list[tuple[Calibrator, FlatState]]:
        """:meth:`table_input_indices`' inputs, each with its part of ``state``."""
        _, subs = self._split(state, 2)
        cals = self._inputs(2)
        return [(cals[i], subs[i]) for i in self.table_input_indices()]

    # -- running -------------------------------------------------------------------------------
    def prepare_scores(self, scores: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(
            clip_probabilities(np.asarray(scores, dtype=np.float64), self.params["clip"])
        )

    def martingale_base(self, scores: np.ndarray) -> np.ndarray:
        return self.prepare_scores(scores)

    def lane_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The binary inputs as ``expert_lanes`` codes ``(kinds, par rows, bin edges)`` when
        every one is OPS, OBS, decay-beta or decay-venn-abers (learnt inside the kernel), else
        None."""
        kinds, pars, edges = [], [], []
        for cal in self._inputs(2):
            if type(cal) in (OPS, OBS):
                kinds.append(EL.IN_OPS if cal.model == OS.MODEL_PLATT else EL.IN_OBS)
                pars.append(EL.ons_row(*(float(cal.params[k]) for k in ("gamma", "radius",
                                                                       "score_clip"))))  # fmt: skip
                edges.append(np.zeros(1))
            elif type(cal) is DecayBeta:
                nb, eps = int(cal.params["n_bins"]), float(cal.params["score_clip"])
                kinds.append(EL.IN_DECAY)
                pars.append(EL.decay_row(
                    int(cal.params["memory"]), eps, float(cal.warmup), float(cal.refit_every),
                    float(config.DECAY_BETA_RIDGE), config.DECAY_BETA_MAX_ITER,
                    float(config.DECAY_BETA_TOL), nb,
                ))  # fmt: skip
                edges.append(DB.bin_edges(nb, eps))
            elif type(cal) is DecayVennAbers:
                nb, eps = int(cal.params["n_bins"]), float(cal.params["score_clip"])
                kinds.append(EL.IN_DECAY_VA)
                pars.append(EL.decay_va_row(int(cal.params["memory"]), eps, float(cal.warmup),
                                            float(cal.refit_every), nb))  # fmt: skip
                edges.append(DB.bin_edges(nb, eps))
            else:
                return None
        width = max((len(e) for e in edges), default=1)
        padded = np.zeros((len(edges), width))
        for i, e in enumerate(edges):
            padded[i, : len(e)] = e
        return np.array(kinds, np.int64), np.array(pars).reshape(len(kinds), EL.N_PAR), padded

    def _run_fused(self, x, labels, op_event, op_kind, op_offsets, state, codes):
        """The binary batch through :func:`~calpipe.kernels.expert_lanes.composite_experts_binary`:
        the inputs' states side by side, each input's test martingale from its forecast at
        every op (``likelihood_gale``'s operations, as the input computes it run alone).

        The state is read in place as an (S, L) matrix (:meth:`_uniform`) and copied once, by
        the kernel: the same values as :meth:`_split`, the kernel and :meth:`_join`, without
        their copies (with 100,000 streams of ~760 values, the copies took 3.5 times the
        kernel's time)."""
        uniform = self._uniform(state, 2)
        if uniform is None:  # _split names what departs from the layout; else no streams
            head, subs = self._split(state, 2)
            uniform = self._uniform(self._join(head, subs, state.log10m), 2)
            if uniform is None:
                return self._run_fused_empty(x, op_event, op_kind, op_offsets, state)
        m, starts = uniform
        kinds, par, edges = codes
        cals = self._inputs(2)
        # The kernel's state is the whole (S, L) matrix (packed: P, A, then each input's
        # vector at its column, after its length and log10 S): the kernel's one copy of it is
        # the new state, P, A and the inputs updated in place; the inputs' log10 S are written
        # into it after.
        cols = np.array([at + 2 for at in starts], dtype=np.int64)
        fam = self.family(2)
        p, lm, _, _, lm_end, new, fin = EL.composite_experts_binary(
            x[:, None], labels, op_event, op_kind, op_offsets, kinds, cols, par, edges,
            fam.params, self.rates, self.params["clip"], None, None, state.log10m, m,
            packed=True, **self._restart_kw(2),
        )  # fmt: skip
        # each input's own test martingale, from its forecast at every op; inputs sharing a
        # clip in one pass (base term once)
        base = x[op_event]
        lab = labels[op_event]
        is_update = op_kind != OP_FORECAST
        for clip in {float(c.params["clip"]) for c in cals}:
            idx = [i for i, c in enumerate(cals) if float(c.params["clip"]) == clip]
            got = likelihood_gale_ends(
                fin[idx], base, lab, is_update, op_offsets,
                np.ascontiguousarray(m[:, [starts[i] + 1 for i in idx]].T), clip,
            )  # fmt: skip
            for row, i in enumerate(idx):
                new[:, starts[i] + 1] = got[row]
        return RunOutput(p, lm), FlatState(new.ravel(), state.offsets.copy(), lm_end)

    def lane_inputs_multiclass(self, n_classes: int) -> np.ndarray | None:
        """The K-class inputs as ``expert_lanes_multiclass`` rows ``par`` (I, N_PAR) when every
        one is ``ops`` (online vector scaling, K <= NP_BLOCK) or ``oms`` (online matrix scaling,
        K <= config.OMS_MAX_CLASSES), learnt inside the kernel; else None."""
        if n_classes > EK.NP_BLOCK:
            return None
        rows = []
        for cal in self._inputs(n_classes):
            if type(cal) is OPS:
                row = EK.ops_row
            elif type(cal) is OMS and n_classes <= config.OMS_MAX_CLASSES:
                row = EK.oms_row
            else:
                return None
            rows.append(row(*(float(cal.params[k]) for k in ("gamma", "radius", "score_clip"))))
        return np.array(rows, dtype=np.float64).reshape(len(rows), EK.N_PAR)

    def _run_fused_multiclass(self, x, labels, op_event, op_kind, op_offsets, state, par):
        """The K-class batch through
        :func:`~calpipe.kernels.expert_lanes_multiclass.composite_experts_multiclass` on the
        state read in place (as :meth:`_run_fused`); each input's test martingale from its
        forecast at every op (``likelihood_gale``, as the input computes it run alone)."""
        k = x.shape[1]
        uniform = self._uniform(state, k)
        if uniform is None:  # _split names what departs from the layout; else no streams
            head, subs = self._split(state, k)
            uniform = self._uniform(self._join(head, subs, state.log10m), k)
            if uniform is None:
                return RunOutput(np.full(x.shape, np.nan), np.full(x.shape[0], np.nan)), state
        m, starts = uniform
        fam = self.family(k)
        cols = np.array([at + 2 for at in starts], dtype=np.int64)
        p, lm, new, lm_end, fin = EK.composite_experts_multiclass(
            x, labels, op_event, op_kind, op_offsets, cols, par, fam.betas, fam.alphas,
            self.rates, self.params["clip"], m, state.log10m, **self._restart_kw(k),
        )  # fmt: skip
        base = x[op_event]
        lab = labels[op_event]
        is_update = op_kind != OP_FORECAST
        cals = self._inputs(k)
        for i, cal in enumerate(cals):
            cal.check_forecasts(fin[i], op_event, op_offsets)  # as the input's own run
        # each input's own test martingale, from its forecast at every op; inputs sharing a
        # clip in one pass (base term once)
        for clip in {float(c.params["clip"]) for c in cals}:
            idx = [i for i, c in enumerate(cals) if float(c.params["clip"]) == clip]
            got = likelihood_gale_ends(
                fin[idx], cals[idx[0]].martingale_base(base), lab, is_update, op_offsets,
                np.ascontiguousarray(m[:, [starts[i] + 1 for i in idx]].T), clip,
            )  # fmt: skip
            for row, i in enumerate(idx):
                new[:, starts[i] + 1] = got[row]
        return RunOutput(p, lm), FlatState(new.ravel(), state.offsets.copy(), lm_end)

    def _run_fused_empty(self, x, op_event, op_kind, op_offsets, state):
        """A batch of no streams (nothing to run; its operations must be none)."""
        return RunOutput(np.full(x.shape[0], np.nan), np.full(x.shape[0], np.nan)), state

    def run_unchecked(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        n = scores.shape[0]
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        fam = self.family(n_classes)
        n_rates = len(self.rates)
        if n_classes == 2 and self.engine == "fused":
            codes = self.lane_inputs()
            if codes is not None:
                return self._run_fused(
                    np.ascontiguousarray(scores, dtype=np.float64), np.asarray(labels),
                    op_event, op_kind, op_offsets, state, codes,
                )  # fmt: skip
        if n_classes > 2 and self.engine == "fused":
            par = self.lane_inputs_multiclass(n_classes)
            if par is not None:
                return self._run_fused_multiclass(
                    np.ascontiguousarray(scores, dtype=np.float64), np.asarray(labels),
                    op_event, op_kind, op_offsets, state, par,
                )  # fmt: skip
        head, subs = self._split(state, n_classes)
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
        # Inputs: the base, then each calibrator run over the same operations.
        cols = [x]
        new_subs = []
        for cal, sub in zip(self._inputs(n_classes), subs, strict=True):
            out, new_sub = cal.run_unchecked(
                cal.prepare_scores(x), y, ext_event, ext_kind, ext_offsets, sub
            )
            cols.append(self.prepare_scores(out.protected))
            new_subs.append(new_sub)
        q = np.ascontiguousarray(np.stack(cols, axis=1))
        passive = np.ascontiguousarray(head[:, 0])
        active = np.ascontiguousarray(head[:, 1:]).reshape(head.shape[0], n_rates, -1)
        if n_classes == 2:
            p, lm, pw, a, lm_end = EM.expert_mixture_binary(
                q, y, ext_event, ext_kind, ext_offsets, fam.params, self.rates, passive, active,
                state.log10m, lanes=None if self.engine != "per-stream" else False,
                **self._restart_kw(2),
            )  # fmt: skip
        else:
            p, lm, pw, a, lm_end = EM.expert_mixture_multiclass(
                q, y, ext_event, ext_kind, ext_offsets, fam.betas, fam.alphas, self.rates,
                passive, active, state.log10m, **self._restart_kw(n_classes),
            )  # fmt: skip
        new_head = np.concatenate([pw[:, None], a.reshape(head.shape[0], -1)], axis=1)
        new = self._join(new_head, new_subs, lm_end)
        return RunOutput(p[:n], lm[:n]), new


EXPERT_METHODS = (CompositeExperts,)


def _check_defaults() -> None:
    """The configured default grid must contain the identity (the active weights start on it)."""
    grid = [(a, b) for a in config.EXPERT_COX_ALPHAS for b in config.EXPERT_COX_BETAS]
    if not _grid_ok(grid):
        raise ParameterError("config.EXPERT_COX_ALPHAS x EXPERT_COX_BETAS lacks the identity")


_check_defaults()

__all__ = ["EXPERT_METHODS", "INPUT_METHODS", "CompositeExperts", "input_spec", "make_input"]
