"""The calibrator protocol every method implements, and the state containers it runs on.

A calibrator is a validated configuration (one parameter table per method, :mod:`._params`) around
one or more kernels. :func:`calpipe.protect` drives every method the same way:

1. ``prepare_scores(base)``: the base scores as the calibrator consumes them;
2. ``initial_state(S, K)`` or ``state_from_flat(...)`` for the carried state of each stream;
3. ``run_batch(scores, labels, op_event, op_kind, op_offsets, state)``: all streams of a batch in
   one call over the operation list of :mod:`calpipe.kernels.ops` (step / forecast /
   delayed update, grouped by stream), returning a :class:`RunOutput` and the new state;
4. ``state.flat()``: one float64 vector per stream, stored as the ``weights`` list column;
5. ``serving_map(state, scores)``: each stream's next forecast of fresh scores, learning nothing
   (:func:`calpipe.pipeline.serving_map`).

:func:`calpipe.calibrators.checks.check_calibrator` checks these steps' invariants on any method.

Every method reports ``log10_martingale``: the running log10 likelihood ratio
sum_i log10 p'_i(y_i) - log10 p_i(y_i) of its forecasts p' against the base forecasts p. For the
protected methods it is the test martingale of their papers; for every other method it is also a
test martingale of the base forecasts, because each p'_i is fixed before y_i is seen (a prequential
forecast's likelihood ratio against the null is a nonnegative martingale under the null with
initial value 1), so the same alarm applies to all methods. Non-protected methods compute it with
both forecasts clipped to [clip, 1 - clip] (their ``clip`` parameter), which keeps it finite when a
batch calibrator outputs exactly 0 or 1; their outputs themselves are not clipped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

from calpipe import config
from calpipe.calibrators._params import Param, number_in, validate
from calpipe.calibrators.gale import clip_probabilities
from calpipe.calibrators.inputs import (  # noqa: F401 (check_arrays, check_mixture_weights: here since before)
    check_arrays,
    check_batch,
    check_mixture_weights,
    check_serving_scores,
)
from calpipe.errors import ParameterError, StateError
from calpipe.kernels.ops import OP_FORECAST, OP_STEP


class EndOfCallWarning(UserWarning):
    """A warning a method gives once per :meth:`Calibrator.run_batch` call, from how the call
    ended (:meth:`Calibrator.end_warnings` gives it from an end state)."""


@dataclass
class RunOutput:
    """Outputs of a batch, one row per event of the batch's event arrays.

    ``protected`` (n,) binary or (n, K); ``log10_martingale`` (n,); ``extra``: further output
    columns of the method by name (``p_lower``/``p_upper`` of the Venn methods, the Brier mode's
    ``log10_martingale_by_rate``, a stack's ``base_method_score``), each (n,) or (n, K) / (n, R).
    """

    protected: np.ndarray
    log10_martingale: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class MapTerms:
    """A serving map as a weighted sum of terms, the form the SQL macros evaluate
    (``sql/macros/05_binary_layer.sql``): for a score p, clipped to [clip, 1 - clip],

        p' = sum_t weight[s, t] * f_t(clip(q_t(p)))

    with f_t of ``family[t]`` (identity, quadratic, cubic, cox) and parameters ``a[t]``,
    ``b[t]``, and q_t the term's input: p itself where ``inputs[s, t]`` is NaN, else the logistic
    map sigmoid(w1 ln c(p) - w2 ln(1 - c(p)) + w0) of ``inputs[s, t] = [w1, w2, w0, eps]``, c the
    clip to [eps, 1 - eps].
    """

    family: np.ndarray  # (T,) str
    a: np.ndarray  # (T,)
    b: np.ndarray  # (T,)
    weight: np.ndarray  # (S, T)
    inputs: np.ndarray | None = None  # (S, T, 4), NaN rows: the clipped base
    #: K classes: the Cox functions' class shifts alpha (T, K) (f_c = q_c^b e^{alpha_c} / sum),
    #: and each term's input as vector scaling ``[a_1..a_K, b_1..b_K, eps]`` (S, T, 2K + 1):
    #: q = softmax(a_c ln c_c(p) + b_c), c the floor at eps renormalised (NaN rows: the base).
    alphas: np.ndarray | None = None
    inputs_k: np.ndarray | None = None
    #: Binary: the input of each term (T,) that is a table of its own (a composite-experts
    #: input without a logistic map: isotonic, Venn-ABERS, ...): its number j >= 0 among those
    #: inputs, in order (q = that input's map at the method's clipped input, SQL layer
    #: -(j + 1), numbered on from a stack's base's tables); -1: none
    in_table: np.ndarray | None = None


@dataclass
class StreamState:
    """Serializable state of one stream: what a nightly job stores and the next night loads."""

    method: str
    config_fingerprint: str
    n_classes: int
    n_events: int = 0
    n_labelled: int = 0
    log10_martingale: float = 0.0
    log10_martingale_max: float = 0.0
    weights: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StreamState:
        """The state :meth:`to_json` wrote; StateError naming the field and the rule when the
        text is not one: not JSON, not an object, a missing or unknown field, a field of the
        wrong type, a count below 0, a non-finite number. (Whether the weights fit a method
        is checked when the state is loaded: :meth:`Calibrator.run`.)"""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise StateError(f"StreamState.from_json: not JSON text ({exc})") from None
        if not isinstance(data, dict):
            raise StateError(f"StreamState.from_json: a JSON object is needed, got "
                             f"{type(data).__name__}")  # fmt: skip
        fields = _STATE_FIELDS
        missing = sorted(
            set(fields)
            - set(data)
            - {"weights", "n_events", "n_labelled", "log10_martingale", "log10_martingale_max"}
        )
        unknown = sorted(set(data) - set(fields))
        if missing or unknown:
            raise StateError(f"StreamState.from_json: missing fields {missing}, unknown fields "
                             f"{unknown}; a state has {list(fields)}")  # fmt: skip
        for name, value in data.items():
            kind = fields[name]
            ok = (
                isinstance(value, str) if kind == "str"
                else isinstance(value, int) and not isinstance(value, bool) and value >= 0
                if kind == "count"
                else _finite_number(value) if kind == "float"
                else isinstance(value, list) and all(_finite_number(v) for v in value)
            )  # fmt: skip
            if not ok:
                rule = {"str": "a string", "count": "an integer >= 0",
                        "float": "a finite number",
                        "list": "a list of finite numbers"}[kind]  # fmt: skip
                raise StateError(
                    f"StreamState.from_json: field {name!r} must be {rule}, got {value!r:.60}"
                )
        if data["n_classes"] < 2:
            raise StateError("StreamState.from_json: field 'n_classes' must be >= 2")
        return cls(**data)


#: The fields of a StreamState's JSON form and their kinds (:meth:`StreamState.from_json`).
_STATE_FIELDS = {
    "method": "str", "config_fingerprint": "str", "n_classes": "count", "n_events": "count",
    "n_labelled": "count", "log10_martingale": "float", "log10_martingale_max": "float",
    "weights": "list",
}  # fmt: skip


def _finite_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)


@dataclass
class FlatState:
    """State of S streams as ragged float64 vectors: stream s is ``values[offsets[s]:offsets[s+1]]``.

    The container of every method whose state length varies by stream (a batch calibrator's
    window and fitted map) or that does not need a structured layout.
    """

    values: np.ndarray  # (sum of lengths,)
    offsets: np.ndarray  # (S + 1,) int64
    log10m: np.ndarray  # (S,)

    @property
    def n_streams(self) -> int:
        return int(self.log10m.shape[0])

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        return self.values, self.offsets

    def vector(self, s: int) -> np.ndarray:
        return self.values[self.offsets[s] : self.offsets[s + 1]]

    @classmethod
    def from_vectors(cls, vectors: list[np.ndarray], log10m: np.ndarray) -> FlatState:
        lengths = np.array([v.shape[0] for v in vectors], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = np.concatenate(vectors) if vectors else np.zeros(0)
        return cls(np.ascontiguousarray(values, dtype=np.float64), offsets, log10m)

    def scatter(self, idx: np.ndarray, loaded: FlatState) -> FlatState:
        """This state with streams ``idx`` (distinct) replaced by the streams of ``loaded`` (in
        order)."""
        # Two compiled ragged copies into the new values (the kept streams, the loaded ones),
        # no Python loop over streams and no index array of every value: a gather through one
        # took 2.4 s for 100,000 default-method streams resumed from their stored rows.
        n = self.n_streams
        idx = np.asarray(idx, dtype=np.int64)
        new_lengths = np.diff(loaded.offsets)
        log10m = self.log10m.copy()
        log10m[idx] = loaded.log10m
        if idx.shape[0] == n and np.array_equal(idx, np.arange(n)):  # every stream, in order
            return FlatState(np.ascontiguousarray(loaded.values, dtype=np.float64),
                             np.asarray(loaded.offsets, dtype=np.int64).copy(), log10m)  # fmt: skip
        lengths = np.diff(self.offsets)
        keep = np.ones(n, dtype=bool)
        keep[idx] = False
        kept = np.flatnonzero(keep)
        lengths[idx] = new_lengths
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = np.empty(int(offsets[-1]))
        _copy_segments(np.ascontiguousarray(self.values, dtype=np.float64),
                       self.offsets[kept], lengths[kept], values, offsets[kept])  # fmt: skip
        _copy_segments(np.ascontiguousarray(loaded.values, dtype=np.float64),
                       np.asarray(loaded.offsets[:-1], dtype=np.int64), new_lengths, values,
                       offsets[idx])  # fmt: skip
        return FlatState(values, offsets, log10m)


@njit(cache=True)
def _copy_segments(src, src_start, lengths, dst, dst_start):
    """dst[dst_start[s] + i] = src[src_start[s] + i] for i < lengths[s], every segment s (the
    callers check the bounds)."""
    for s in range(lengths.shape[0]):
        a = src_start[s]
        b = dst_start[s]
        for i in range(lengths[s]):
            dst[b + i] = src[a + i]


def ragged_take(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """Segments ``values[starts[s] : starts[s] + lengths[s]]`` of every stream s, concatenated:
    ``(segment values, offsets)``. One compiled pass, no Python loop over streams.

    >>> v, o = ragged_take(np.arange(10.0), np.array([1, 6]), np.array([2, 3]))
    >>> v.tolist(), o.tolist()
    ([1.0, 2.0, 6.0, 7.0, 8.0], [0, 2, 5])
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    if lengths.size and (
        lengths.min() < 0 or starts.min() < 0 or (starts + lengths).max() > values.size
    ):
        raise ValueError("ragged_take: a segment lies outside the values")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = lengths.shape[0]
    if n > 1 and lengths[0] > 0 and lengths.min() == lengths.max():
        step = int(starts[1] - starts[0])  # equal segments at a fixed stride (fixed-size states)
        if step >= lengths[0] and np.all(np.diff(starts) == step):
            rows = np.lib.stride_tricks.as_strided(
                values[starts[0] :],
                shape=(n, int(lengths[0])),
                strides=(step * 8, 8),
                writeable=False,
            )  # fmt: skip  (in bounds: checked above)
            return np.ascontiguousarray(rows).ravel(), offsets
    out = np.empty(int(offsets[-1]))
    _copy_segments(values, starts, lengths, out, offsets[:-1])
    return out, offsets


def ragged_concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per stream s, its segments of every ``(values, offsets)`` part one after the other:
    ``(values, offsets)``. One compiled pass per part, no Python loop over streams.

    >>> v, o = ragged_concat([(np.array([1.0, 2.0]), np.array([0, 1, 2])),
    ...                       (np.array([7.0, 8.0, 9.0]), np.array([0, 2, 3]))])
    >>> v.tolist(), o.tolist()
    ([1.0, 7.0, 8.0, 2.0, 9.0], [0, 3, 5])
    """
    lengths = [np.diff(np.asarray(off, dtype=np.int64)) for _, off in parts]
    for (vals, off), n in zip(parts, lengths, strict=True):
        if n.size != lengths[0].size or off[0] != 0 or off[-1] != np.asarray(vals).size:
            raise ValueError("ragged_concat: parts of different streams or malformed offsets")
    offsets = np.concatenate([[0], np.cumsum(sum(lengths))]).astype(np.int64)
    out = np.empty(int(offsets[-1]))
    at = offsets[:-1].copy()
    for (vals, off), n in zip(parts, lengths, strict=True):
        src = np.ascontiguousarray(vals, dtype=np.float64).ravel()
        _copy_segments(src, np.ascontiguousarray(off[:-1], dtype=np.int64), n, out, at)
        at += n
    return out, offsets


def tiled_state(vector: np.ndarray, n_streams: int) -> FlatState:
    """``n_streams`` fresh streams of a method with a fixed-length state: ``vector`` each."""
    v = np.tile(np.ascontiguousarray(vector, dtype=np.float64), n_streams)
    size = vector.shape[0]
    return FlatState(v, np.arange(0, v.size + 1, size, dtype=np.int64), np.zeros(n_streams))


def check_state_length(st: FlatState, size: int, method: str, n_classes: int) -> FlatState:
    """``st``, or StateError if a stream's vector is not ``size`` long (a fixed-length state)."""
    lengths = np.diff(st.offsets)
    if lengths.size and (lengths.min() != size or lengths.max() != size):
        raise StateError(
            f"method {method!r}: state weights have length {lengths.min()}..{lengths.max()}, "
            f"its state needs {size} (K = {n_classes})"
        )
    return st


def check_flat_layout(st: FlatState, size: int | None, method: str, n_classes: int) -> None:
    """StateError, naming the first offending stream, unless ``st``'s offsets frame its values
    (S + 1 of them, from 0 to the number of values, never decreasing) and, for a method with a
    fixed-length state (``size``), every stream's vector is ``size`` long. Vectorized, O(S)."""
    values = np.asarray(st.values)
    offsets = np.asarray(st.offsets)
    n = st.n_streams
    if values.ndim != 1 or offsets.ndim != 1 or offsets.shape[0] != n + 1:
        raise StateError(
            f"method {method!r}: a state of {n} stream(s) needs 1-d values and {n + 1} offsets; "
            f"got values of shape {values.shape} and offsets of shape {offsets.shape}"
        )
    if not n:
        return
    lengths = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != values.shape[0] or lengths.min() < 0:
        bad = np.flatnonzero((lengths < 0) | (offsets[1:] > values.shape[0]))
        s = int(bad[0]) if bad.size else (0 if offsets[0] != 0 else n - 1)
        raise StateError(
            f"method {method!r}: state vector {s} lies at offsets {int(offsets[s])}.."
            f"{int(offsets[s + 1])}, outside the {values.shape[0]} values (offsets must run "
            "from 0 to the number of values, never decreasing)",
            stream=s,
        )
    if size is not None and (lengths.min() != size or lengths.max() != size):
        s = int(np.flatnonzero(lengths != size)[0])
        raise StateError(
            f"method {method!r}: state vector {s} has length {int(lengths[s])}, its state "
            f"needs {size} (K = {n_classes})",
            stream=s,
        )


def output_column(name: str, multiclass: bool) -> str:
    """The column name of a per-event forecast output: plural for K classes, as the forecast
    itself (``protected_score`` / ``protected_scores``; a stack's ``base_method_score`` /
    ``base_method_scores``); other names (``p_lower``, ...) are unchanged.

    >>> output_column("base_method_score", True), output_column("p_lower", True)
    ('base_method_scores', 'p_lower')
    """
    return name + "s" if multiclass and name.endswith("_score") else name


def weights_series(values: np.ndarray, offsets: np.ndarray) -> pl.Series:
    """The ``weights`` list column of S state vectors, built without a Python loop."""
    lengths = np.diff(offsets)
    if lengths.size and lengths[0] > 0 and np.all(lengths == lengths[0]):
        # Equal lengths (every protected method): an (S, L) matrix, no Arrow round trip (polars'
        # Arrow import path loads pandas: +0.2 s and +35 MiB on a process's first call).
        matrix = values[offsets[0] : offsets[-1]].reshape(lengths.size, int(lengths[0]))
        return pl.Series("weights", matrix).cast(pl.List(pl.Float64))
    return list_series(values, offsets, pl.Float64).alias("weights")


def _arrow(values: np.ndarray) -> pa.Array:
    """A numeric numpy array as an Arrow array over its buffer (``pa.array`` of a numpy array
    imports pandas: 0.5-0.8 s of a night's process)."""
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":  # (Arrow's booleans are bits)
        raise TypeError(f"a 1-d integer or float array is needed, got {values.dtype}")
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(values.dtype), values.shape[0], [None, pa.py_buffer(values)]
    )


def list_series(values: np.ndarray, offsets: np.ndarray, inner: pl.DataType) -> pl.Series:
    """The list column whose row s is ``values[offsets[s]:offsets[s + 1]]`` (1-d numeric
    ``values``, int64 ``offsets``), built from Arrow buffers (no Python loop over rows).
    Datetime values are given as int64 microseconds.

    >>> list_series(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 2, 3]), pl.Float64).to_list()
    [[1.0, 2.0], [], [3.0]]
    """
    offsets = _arrow(np.asarray(offsets, dtype=np.int64))
    arr = pa.LargeListArray.from_arrays(offsets, _arrow(values))
    return pl.Series(pl.from_arrow(arr)).cast(pl.List(inner))


# Shared parameter of every non-protected method: the clip of the likelihood-ratio martingale.
CLIP_PARAM = Param(
    config.DEFAULT_CLIP_EPS,
    number_in(0.0, 0.5),
    "a number in (0, 0.5)",
    "clip of base and calibrated forecasts in log10_martingale only (outputs are not clipped)",
)


class CalibratorState(Protocol):
    """What the state of S streams provides, whatever its layout (:class:`FlatState`, the
    protected methods' :class:`~calpipe.calibrators.protected.BatchState`).

    A state is a value: :meth:`Calibrator.run_batch` never writes the state it is given (it
    returns a new one); only :meth:`scatter` may reuse ``self``.
    """

    #: (S,) log10 of each stream's test martingale after its last operation.
    log10m: np.ndarray

    @property
    def n_streams(self) -> int:
        """S, the number of streams."""
        ...

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets)``: stream s's float64 vector is ``values[offsets[s]:offsets[s+1]]``
        (the ``weights`` column of a state frame); :meth:`Calibrator.state_from_flat` inverts it."""
        ...

    def scatter(self, idx: np.ndarray, loaded: Any) -> Any:
        """This state with streams ``idx`` replaced by the streams of ``loaded`` (in order)."""
        ...


StateT = TypeVar("StateT", bound=CalibratorState)


class Calibrator(Generic[StateT]):
    """The protocol every method implements, with the parts all methods share.

    ``StateT`` is the method's state container (:class:`FlatState` unless it has its own).

    A method is a subclass that sets the class attributes below and implements
    :meth:`initial_state`, :meth:`state_from_flat` (if its state is not a plain
    :class:`FlatState`) and :meth:`run_unchecked` (what :meth:`run_batch` runs once it has
    checked the batch); everything else has a default that is right for most methods. :func:`calpipe.calibrators.checks.check_calibrator` verifies the invariants
    of the protocol on any method (prequential forecasts, chunks = one pass, streams independent,
    valid outputs, state round trips, the serving map).

    Capabilities that depend on the parameters (a stack's ``classes``, the Brier mode's extra
    output, a category column's refusal of delayed labels) are set on the instance by the
    subclass's ``__init__``: the class attributes are the defaults every instance starts from.
    """

    #: The method's name: ``--method NAME``, the registry key, the state frame's ``method``.
    name: str
    #: One line for ``calpipe methods``.
    summary: str
    #: The one table that validates the constructor's keywords and that ``calpipe methods``
    #: prints (:mod:`calpipe.calibrators._params`).
    parameters: ClassVar[dict[str, Param]]
    #: Keyword sets :func:`~calpipe.calibrators.checks.check_calibrator` builds the method with:
    #: small windows and bins, so that every fit, refit and branch happens in a short test stream.
    check_params: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    #: Which base scores the method takes: "binary" (a score) or "both" (a score or K classes).
    classes: Literal["binary", "both"] = "both"
    #: Extra output columns (besides the forecast and log10_martingale), by name.
    extra_outputs: tuple[str, ...] = ()
    #: Whether the method can take labels that arrive late (``label_time``) across batches:
    #: ``OP_UPDATE`` operations of events forecast earlier, maybe in an earlier batch.
    supports_label_time: bool = True

    def __init__(self, **params):
        #: The validated parameters (defaults filled in): everything :meth:`config` reads.
        self.params = self._cross_checked(validate(self.name, self.parameters, params))

    def _cross_checked(self, params: dict[str, Any]) -> dict[str, Any]:
        """Checks that involve several parameters: ``params``, or a copy with values derived
        from the others filled in. Raises ParameterError; never modifies ``params``."""
        return params

    def __repr__(self) -> str:
        """The class and the parameters that differ from their defaults."""
        changed = [
            f"{k}={v!r}"
            for k, v in self.params.items()
            if k not in self.parameters or v != self.parameters[k].default
        ]
        return f"{type(self).__name__}({', '.join(changed)})"

    # -- configuration -------------------------------------------------------------------------
    def check_classes(self, n_classes: int) -> None:
        """Raise ParameterError unless the method takes K = ``n_classes`` (2 = a binary score)."""
        if self.classes == "binary" and n_classes != 2:
            raise ParameterError(
                f"method {self.name!r} is binary-only; the frame has K = {n_classes} classes "
                "(give a binary `score` column, or use a multiclass method)"
            )

    def config(self, n_classes: int) -> dict[str, Any]:
        """Canonical configuration: everything that changes the outputs (and nothing else)."""
        return {"method": self.name, "n_classes": n_classes, "params": _jsonable(self.params)}

    def fingerprint(self, n_classes: int) -> str:
        """Hash of :meth:`config`: a stored state is loaded only under the same fingerprint."""
        blob = json.dumps(self.config(n_classes), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def check_state(self, fingerprint: str, method: str, n_classes: int) -> None:
        """Raise StateError unless a state written by ``method`` with ``fingerprint`` is ours."""
        expected = self.fingerprint(n_classes)
        if fingerprint != expected:
            raise StateError(
                f"state was written by method {method!r} with config fingerprint {fingerprint}, "
                f"but this run is {self.name!r} with fingerprint {expected} (K = {n_classes}); "
                "loading a state under another configuration is an error, never a silent reset"
            )

    # -- state ---------------------------------------------------------------------------------
    def state_size(self, n_classes: int) -> int | None:
        """Length of every stream's state vector, or None if it varies by stream."""
        return None

    def initial_state(self, n_streams: int, n_classes: int) -> StateT:
        """The state of ``n_streams`` streams that have seen nothing (log10 martingale 0)."""
        raise NotImplementedError

    def state_from_flat(
        self, values: np.ndarray, offsets: np.ndarray, log10m: np.ndarray, n_classes: int
    ) -> StateT:
        """Inverse of ``state.flat()`` (with each stream's log10 martingale); raises StateError
        on a vector that does not fit the method's layout. The default is a :class:`FlatState`."""
        return FlatState(
            np.ascontiguousarray(values, dtype=np.float64),
            np.ascontiguousarray(offsets, dtype=np.int64),
            np.ascontiguousarray(log10m, dtype=np.float64),
        )

    def check_state_layout(self, state: StateT, n_classes: int) -> None:
        """StateError naming the stream unless ``state`` (as :meth:`run_batch` is given it)
        has this method's layout: a :class:`FlatState`'s offsets frame its values and each
        vector has :meth:`state_size` (when fixed); O(S), not the contents (those are
        :meth:`state_from_flat`'s). A state of another type is the method's own to check."""
        if type(state) is FlatState:
            check_flat_layout(state, self.state_size(n_classes), self.name, n_classes)

    def check_state_vectors(self, vectors: np.ndarray, n_classes: int) -> None:
        """StateError unless the (S, L) fixed-length state vectors (row s: stream s) hold
        values this method's kernels can have written, naming the stream and the rule: what
        :meth:`state_from_flat` checks beyond the layout (a composite's fixed-layout inputs
        are checked through it in place). The default checks nothing."""

    def load_state(self, values, offsets, log10m, n_classes: int) -> StateT:
        """:meth:`state_from_flat` of a state that comes from outside (a stored row, a user's
        :class:`StreamState`): NaN or inf anywhere is refused first, naming the stream, since
        one would poison every later forecast of it."""
        values = np.asarray(values, dtype=np.float64)
        offsets = np.asarray(offsets, dtype=np.int64)
        log10m = np.asarray(log10m, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            s = int(np.searchsorted(offsets, bad[0], side="right") - 1)
            raise StateError(
                f"method {self.name!r}: state vector {s} holds {values[bad[0]]} at position "
                f"{int(bad[0] - offsets[s])}; state values must be finite",
                stream=s,
            )
        bad = np.flatnonzero(~np.isfinite(log10m))
        if bad.size:
            raise StateError(
                f"method {self.name!r}: stream {int(bad[0])} has log10_martingale "
                f"{log10m[bad[0]]}; it must be finite",
                stream=int(bad[0]),
            )
        return self.state_from_flat(values, offsets, log10m, n_classes)

    # -- running -------------------------------------------------------------------------------
    def prepare_scores(self, scores: np.ndarray) -> np.ndarray:
        """Base probabilities as the method consumes them (as given, by default): callers pass
        :meth:`run_batch` the prepared scores. (n,) binary or (n, K), float64, contiguous."""
        return np.ascontiguousarray(scores, dtype=np.float64)

    def martingale_base(self, scores: np.ndarray) -> np.ndarray:
        """The base forecasts ``log10_martingale`` bets against, as the method sees them."""
        return clip_probabilities(np.asarray(scores, dtype=np.float64), self.params["clip"])

    def input_columns(self) -> dict[str, str]:
        """Extra event columns the method reads: kernel argument -> column name (e.g. a user
        taxonomy ``categories`` column). :func:`calpipe.protect` validates and passes them."""
        return {}

    def n_categories_input(self) -> int | None:
        """Number of categories of the ``categories`` input column (its values: 0 .. n - 1)."""
        return None

    def run_batch(
        self,
        scores: np.ndarray,
        labels: np.ndarray,
        op_event: np.ndarray,
        op_kind: np.ndarray,
        op_offsets: np.ndarray,
        state: StateT,
        inputs: dict[str, np.ndarray] | None = None,
    ) -> tuple[RunOutput, StateT]:
        """All streams of a batch in one call: ``(RunOutput, new state)``.

        ``scores`` (n,) or (n, K >= 3) are prepared (:meth:`prepare_scores`); ``labels`` (n,)
        integer class indices, read only at update operations; the operations (``op_event``
        indexes the event arrays, ``op_kind`` is ``OP_STEP`` / ``OP_FORECAST`` / ``OP_UPDATE``
        of :mod:`calpipe.kernels.ops`) are grouped by stream, stream s's in
        ``op_offsets[s]:op_offsets[s + 1]`` in replay order, starting from stream s of
        ``state``; ``inputs`` maps :meth:`input_columns` keys to event arrays. Row i of each
        output belongs to event i, written by its forecast (``OP_STEP`` or ``OP_FORECAST``)
        operation: a forecast uses only labels of earlier updates; the log10 martingale is the
        one after that operation. ``state`` is not modified.

        The arguments are checked first (:func:`check_batch`, vectorized, O(n + m)): a
        violation is an :class:`~calpipe.errors.InputError` naming the argument, the first
        offending position and the rule, never a kernel reading out of bounds. K = 2 vectors
        are refused here: the public callers (:func:`calpipe.protect`, :meth:`run`) turn them
        into the binary p1. A method implements :meth:`run_unchecked`, which trusts its arguments
        (and is what a method calls for its inner calibrators).
        """
        check_batch(self, scores, labels, op_event, op_kind, op_offsets, state, inputs)
        self.check_state_layout(state, 2 if np.ndim(scores) == 1 else np.shape(scores)[1])
        return self.run_unchecked(scores, labels, op_event, op_kind, op_offsets, state, inputs)

    def run_unchecked(self, scores, labels, op_event, op_kind, op_offsets, state, inputs=None):
        """:meth:`run_batch` on checked arguments: what each method implements."""
        raise NotImplementedError

    def end_warnings(self, state: StateT, n_classes: int) -> None:
        """The :class:`EndOfCallWarning` s :meth:`run_batch` gives at the end of one call over
        every stream of ``state`` (each with operations in it) that ended in ``state``: a call
        run in pieces (:mod:`calpipe.engine.pieces`) silences them in each piece and gives them
        here, once. None by default."""

    def sql_form(self, n_classes: int = 2) -> str | None:
        """Which SQL form this method's serving map of ``n_classes``-class forecasts has in
        ``calibration_map`` (the rows :mod:`calpipe.night.mapping` writes and the macros of
        ``sql/`` evaluate), or None: served by :meth:`serving_map` in polars only.

        Binary: ``"logistic"`` (one logistic map, :meth:`logistic_map`), ``"steps"`` (a step or
        linear table at :meth:`map_breakpoints`), ``"terms"`` (a mixture of calibrating
        functions), ``"brier"`` (the Brier compatibility mode's weights), ``"temperature"``,
        ``"calreg"`` / ``"calreg_fp"`` (calibrated regression), ``"calibeat"`` (an expert's map,
        then a bin table), ``"stack"`` (a stack of two methods with forms). K classes:
        ``"terms"``, ``"brier"``, ``"vector"``, ``"matrix"`` (online matrix scaling),
        ``"temperature"``, ``"tables"`` (binary step tables coupled across classes),
        ``"categories"`` (Venn taxonomies), ``"tree"`` (ROC-isotonic's partition tree),
        ``"stack"``. Each method declares its own; this
        default is the binary logistic or step form, and none for K classes."""
        if n_classes > 2:
            return None
        if self.has_logistic_map():
            return "logistic"
        if self.map_breakpoints(self.initial_state(1, 2)) is not None:
            return "steps"
        return None

    def table_input_indices(self) -> list[int]:
        """Inputs of this method whose binary map is a table of its own (composite-experts:
        its inputs without a logistic map); none for a method without inputs. The SQL
        evaluates them at the method's input clipped (the score, or under a stack's top its
        base's value)."""
        return []

    def has_logistic_map(self) -> bool:
        """Whether ``logistic_map(state)`` gives each stream's binary map as sigmoid(w1 ln p -
        w2 ln(1 - p) + w0) (the SQL form of a ``composite-experts`` input)."""
        return False

    def map_breakpoints(self, state: StateT) -> list[tuple[np.ndarray, bool] | None] | None:
        """Where each stream's binary map may change value, for the methods whose map is
        piecewise constant (``(x, False)``: constant on each open interval between consecutive
        x, any value at an x) or piecewise linear between the x (``(x, True)``, constant outside
        [x_1, x_m]); None for a stream not fitted yet (the base passes through). None for a
        method without that form. The SQL serving map of ``calibration_map`` (family ``step`` /
        ``linear``) tabulates the map at and between these points, exactly."""
        return None

    def serving_map(self, state: StateT, scores: np.ndarray) -> np.ndarray:
        """The map p -> p' each stream's state applies to fresh scores: its next forecast.

        ``scores`` (S, n) binary or (S, n, K), raw (as :meth:`prepare_scores` takes them), row s
        for stream s of ``state``; returns the same shape: what an unlabelled event with that
        score would be forecast, learning nothing (``state`` is not modified). This default runs
        forecast-only operations through :meth:`run_batch`; a method may compute the same values
        more directly. A method that reads :meth:`input_columns` has no map of the score alone.

        ``scores`` are checked first (:func:`check_serving_scores`): one row per stream of
        ``state``, finite probabilities (K classes: summing to 1), as :func:`calpipe.serving_map`
        requires; two-class vectors (S, n, 2) are mapped as the binary p1 and given back as
        ``[1 - p', p']``. A method implements :meth:`serving_map_unchecked` on checked scores.
        """
        scores = check_serving_scores(scores, state)
        if scores.ndim == 3 and scores.shape[2] == 2:  # two-class vectors: the binary p1
            p = self.serving_map_unchecked(state, np.ascontiguousarray(scores[:, :, 1]))
            return np.stack([1.0 - p, p], axis=2)
        return self.serving_map_unchecked(state, scores)

    def serving_map_unchecked(self, state: StateT, scores: np.ndarray) -> np.ndarray:
        """:meth:`serving_map` on checked scores (the default: forecast-only operations)."""
        if self.input_columns():
            raise ParameterError(
                f"method {self.name!r} reads {sorted(self.input_columns().values())}: its "
                "serving map needs them too (it takes scores only)"
            )
        s, n = scores.shape[:2]
        flat = np.ascontiguousarray(scores.reshape((s * n, *scores.shape[2:])))
        out, _ = self.run_unchecked(
            self.prepare_scores(flat), np.zeros(s * n, dtype=np.int64),
            np.arange(s * n, dtype=np.int64), np.full(s * n, OP_FORECAST, dtype=np.int8),
            np.arange(0, s * n + 1, n, dtype=np.int64), state,
        )  # fmt: skip
        return out.protected.reshape(scores.shape)

    def run(self, scores, labels, *, state: StreamState | None = None):
        """Run one stream given as arrays; ``labels`` uses -1 for "not known yet".

        Returns ``(RunOutput, StreamState)``; pass the state back in to resume exactly where the
        stream stopped (k chunks with state carried = one pass).

        Two-class vectors ``[[p0, p1], ...]`` are the binary scores p1 (after the vectors'
        checks: values in [0, 1], sums 1): the run is the binary run of p1, bit for bit, its
        forecasts given back as vectors ``[1 - p', p']`` (:func:`two_class_output`) and its
        state a binary one (K = 2).
        """
        scores, labels = check_arrays(scores, labels)
        if scores.ndim == 2 and scores.shape[1] == 2:
            out, new_state = self.run(scores[:, 1].copy(), labels, state=state)
            return two_class_output(out), new_state
        n_classes = 2 if scores.ndim == 1 else scores.shape[1]
        self.check_classes(n_classes)
        if state is None:
            st = self.initial_state(1, n_classes)
            prior = StreamState(self.name, self.fingerprint(n_classes), n_classes)
        else:
            self.check_state(state.config_fingerprint, state.method, n_classes)
            w = np.asarray(state.weights, dtype=np.float64)
            st = self.load_state(
                w, np.array([0, w.shape[0]]), np.array([state.log10_martingale]), n_classes
            )
            prior = state
        n = scores.shape[0]
        op_kind = np.where(labels < 0, OP_FORECAST, OP_STEP).astype(np.int8)
        out, new = self.run_batch(
            self.prepare_scores(scores), np.maximum(labels, 0), np.arange(n, dtype=np.int64),
            op_kind, np.array([0, n], dtype=np.int64), st,
        )  # fmt: skip
        values, offsets = new.flat()
        peak = float(np.max(out.log10_martingale, initial=prior.log10_martingale_max))
        return out, StreamState(
            method=self.name,
            config_fingerprint=prior.config_fingerprint,
            n_classes=n_classes,
            n_events=prior.n_events + n,
            n_labelled=prior.n_labelled + int(np.sum(labels >= 0)),
            log10_martingale=float(new.log10m[0]),
            log10_martingale_max=peak,
            weights=values[offsets[0] : offsets[1]].tolist(),
        )


def two_class_output(out: RunOutput) -> RunOutput:
    """A binary run's outputs for two-class vector input: the forecast (and each ``*_score``
    extra output, a stack's ``base_method_score``) as rows ``[1 - p, p]``; ``p_lower`` /
    ``p_upper`` and the martingales unchanged. The one rule for K = 2 vectors: they are the
    binary p1 (docs/ARCHITECTURE.md §3), whoever runs them (:meth:`Calibrator.run`,
    :func:`calpipe.protect`, :func:`calpipe.serving_map`)."""

    def vec(p: np.ndarray) -> np.ndarray:
        return np.column_stack([1.0 - p, p])

    extra = {k: vec(v) if k.endswith("_score") else v for k, v in out.extra.items()}
    return RunOutput(vec(out.protected), out.log10_martingale, extra)


def _jsonable(v):
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v
