"""The checks of what a calibrator is given: the arrays of :meth:`Calibrator.run`
(:func:`check_arrays`), the batch of the low-level protocol :meth:`Calibrator.run_batch`
(:func:`check_batch`: offsets, indexes, kinds, labels, scores), the scores of
:meth:`Calibrator.serving_map` (:func:`check_serving_scores`) and a carried mixture state
(:func:`check_mixture_weights`). Each raises calpipe's error naming the argument (or column),
the first offending position and the rule; each is vectorized numpy, O(n + m), so cheap beside
any kernel (issue 36 items 8 and 12: before them a bad index segfaulted a kernel).
"""

from __future__ import annotations

import numpy as np

from calpipe import config
from calpipe.errors import InputError, StateError
from calpipe.kernels.ops import OP_FORECAST, OP_UPDATE


def check_arrays(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, labels)`` of :meth:`Calibrator.run` as float64 / int64 arrays, or InputError
    naming the first offending row: the rules of the data contract (docs/ARCHITECTURE.md §3) in
    array form. ``scores`` (n,) in [0, 1] or (n, K >= 2) rows summing to 1; ``labels`` (n,)
    integers in 0..K-1, or -1 for "not known yet"."""
    try:
        scores = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        got = np.asarray(scores, dtype=object).ravel()
        bad = next(
            (i for i, v in enumerate(got[: 1 << 16]) if not isinstance(v, int | float | np.number)),
            None,
        )  # (a bounded scan for the message only: the error path)
        value = repr(got[bad])[:40] if bad is not None else "?"
        raise InputError(
            "scores", bad, f"scores must be numbers (probabilities); got {value}"
        ) from None
    raw = np.asarray(labels)
    if scores.ndim not in (1, 2) or (scores.ndim == 2 and scores.shape[1] < 2):
        raise InputError("scores", None, f"scores must be (n,) or (n, K >= 2); got {scores.shape}")
    if raw.ndim != 1 or raw.shape[0] != scores.shape[0]:
        raise InputError(
            "labels", None, f"labels must be (n,) with n = {scores.shape[0]} (the scores' rows); "
            f"got shape {raw.shape}"
        )  # fmt: skip
    if raw.size and not np.issubdtype(raw.dtype, np.integer) and raw.dtype != np.bool_:
        frac = np.flatnonzero(~np.isfinite(raw.astype(float)) | (raw != np.round(raw)))
        if frac.size:
            raise InputError(
                "labels", int(frac[0]), f"label {raw[frac[0]].item()!r} is not an integer"
            )
    k = 2 if scores.ndim == 1 else scores.shape[1]
    if raw.size and raw.dtype.kind == "u":  # 2**64 - 1 would wrap to -1 ("not known yet")
        big = np.flatnonzero(raw >= k)
        if big.size:
            raise InputError(
                "labels", int(big[0]), f"label {raw[big[0]].item()} outside the classes "
                f"0..{k - 1} (or -1: not known yet)"
            )  # fmt: skip
    labels = raw.astype(np.int64)
    bad = np.flatnonzero((labels < -1) | (labels >= k))
    if bad.size:
        raise InputError(
            "labels", int(bad[0]), f"label {labels[bad[0]]} outside the classes 0..{k - 1} "
            "(or -1: not known yet)"
        )  # fmt: skip
    finite = np.isfinite(scores)
    bad = np.flatnonzero(~(finite if scores.ndim == 1 else finite.all(axis=1)))
    if bad.size:
        raise InputError("scores", int(bad[0]), "score is NaN or infinite")
    rows = scores if scores.ndim == 1 else scores.min(axis=1)
    top = scores if scores.ndim == 1 else scores.max(axis=1)
    bad = np.flatnonzero((rows < 0) | (top > 1))
    if bad.size:
        raise InputError("scores", int(bad[0]), "score outside [0, 1]")
    if scores.ndim == 2:
        bad = np.flatnonzero(np.abs(scores.sum(axis=1) - 1.0) > config.SCORES_SUM_TOL)
        if bad.size:
            raise InputError(
                "scores", int(bad[0]), f"scores do not sum to 1 (tolerance {config.SCORES_SUM_TOL:g})"
            )  # fmt: skip
    return np.ascontiguousarray(scores), np.ascontiguousarray(labels)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _integer_array(name: str, values, ndim: int = 1) -> np.ndarray:
    """``values`` as an integer numpy array of ``ndim`` dimensions, or InputError."""
    arr = np.asarray(values)
    if arr.ndim != ndim or (arr.size and arr.dtype.kind not in "iu"):
        raise InputError(
            name, None, f"must be a {ndim}-d integer array (got {arr.dtype} of shape {arr.shape})"
        )
    return arr


def check_batch(cal, scores, labels, op_event, op_kind, op_offsets, state, inputs=None) -> None:
    """InputError unless the arguments of :meth:`Calibrator.run_batch` are a valid batch,
    naming the argument, the first offending position and the rule; vectorized numpy, O(n + m)
    (a few passes over the arrays, no loop per event), so cheap beside any kernel:

    * ``scores``: float (n,) or (n, K >= 3) (K = 2 vectors: give p1 as (n,)), finite, in [0, 1],
      K-class rows summing to 1 (within :data:`calpipe.config.SCORES_SUM_TOL`);
    * ``labels``: integers (n,); at every update operation a class 0..K-1;
    * ``op_event``: integers in 0..n-1; ``op_kind``: 0, 1 or 2 (:mod:`calpipe.kernels.ops`);
    * ``op_offsets``: S + 1 integers for the S streams of ``state``, from 0 to the number of
      operations, never decreasing;
    * ``inputs``: each :meth:`Calibrator.input_columns` key, (n,) integers (categories in
      0..n_categories - 1).
    """
    scores = np.asarray(scores)
    if scores.dtype.kind != "f" or scores.ndim not in (1, 2):
        raise InputError(
            "scores", None, f"must be a float array (n,) or (n, K); got {scores.dtype} of "
            f"shape {scores.shape}"
        )  # fmt: skip
    if scores.ndim == 2 and scores.shape[1] < 3:
        raise InputError(
            "scores", None, f"(n, {scores.shape[1]}) score vectors: run_batch takes binary "
            "scores as (n,) p1 (K = 2 vectors are the binary p1: calpipe.protect and run() "
            "convert them) and K-class vectors with K >= 3"
        )  # fmt: skip
    n = scores.shape[0]
    k = 2 if scores.ndim == 1 else scores.shape[1]
    if n:
        lo, hi = scores.min(), scores.max()  # NaN propagates: not (NaN >= 0)
        if not (lo >= 0.0 and hi <= 1.0):
            flat = scores if scores.ndim == 1 else scores.min(axis=1)
            top = scores if scores.ndim == 1 else scores.max(axis=1)
            bad = _first(~((flat >= 0.0) & (top <= 1.0)))
            raise InputError("scores", bad, f"score {scores[bad].tolist()} is not a "
                             "probability in [0, 1]")  # fmt: skip
        if scores.ndim == 2:
            total = scores.sum(axis=1)
            off = np.abs(total - 1.0) > config.SCORES_SUM_TOL
            if off.any():
                bad = _first(off)
                raise InputError(
                    "scores", bad, f"score vector {scores[bad].tolist()} sums to "
                    f"{float(total[bad])!r}, not 1 (tolerance {config.SCORES_SUM_TOL:g})"
                )  # fmt: skip
    labels = _integer_array("labels", labels)
    if labels.shape[0] != n:
        raise InputError("labels", None, f"must be (n,) with n = {n} (the scores' rows); "
                         f"got {labels.shape}")  # fmt: skip
    op_event = _integer_array("op_event", op_event)
    op_kind = _integer_array("op_kind", op_kind)
    op_offsets = _integer_array("op_offsets", op_offsets)
    m = op_event.shape[0]
    if op_kind.shape[0] != m:
        raise InputError("op_kind", None, f"must have one kind per operation ({m}); "
                         f"got {op_kind.shape[0]}")  # fmt: skip
    if m:
        if op_event.min() < 0 or op_event.max() >= n:
            bad = _first((op_event < 0) | (op_event >= n))
            raise InputError("op_event", bad, f"event {op_event[bad]} outside the events "
                             f"0..{n - 1}")  # fmt: skip
        if op_kind.min() < 0 or op_kind.max() > OP_UPDATE:
            bad = _first((op_kind < 0) | (op_kind > OP_UPDATE))
            raise InputError("op_kind", bad, f"kind {op_kind[bad]} is not OP_STEP (0), "
                             "OP_FORECAST (1) or OP_UPDATE (2)")  # fmt: skip
    n_streams = state.n_streams
    if op_offsets.shape[0] != n_streams + 1:
        raise InputError(
            "op_offsets", None, f"{op_offsets.shape[0]} offsets for a state of {n_streams} "
            f"stream(s): one more than the streams ({n_streams + 1}) is needed"
        )  # fmt: skip
    if op_offsets[0] != 0 or op_offsets[-1] != m:
        raise InputError("op_offsets", None, f"must run from 0 to the number of operations "
                         f"({m}); got {op_offsets[0]} .. {op_offsets[-1]}")  # fmt: skip
    if n_streams and bool(np.any(op_offsets[1:] < op_offsets[:-1])):
        bad = _first(op_offsets[1:] < op_offsets[:-1]) + 1
        raise InputError("op_offsets", bad, "offsets must never decrease (stream s's "
                         "operations are op_offsets[s]:op_offsets[s + 1])")  # fmt: skip
    if m and (labels.min() < 0 or labels.max() >= k):  # only update operations read labels
        learnt = op_event[op_kind != OP_FORECAST]
        y = labels[learnt]
        if y.size and (y.min() < 0 or y.max() >= k):
            e = int(learnt[_first((y < 0) | (y >= k))])
            raise InputError("labels", e, f"label {labels[e]} of a learnt event outside the "
                             f"classes 0..{k - 1}")  # fmt: skip
    n_cat = cal.n_categories_input()
    for key in cal.input_columns():
        arr = _integer_array(key, (inputs or {}).get(key))
        if arr.shape[0] != n:
            raise InputError(key, None, f"must be (n,) with n = {n}; got {arr.shape}")
        if n_cat is not None and n and (arr.min() < 0 or arr.max() >= n_cat):
            bad = _first((arr < 0) | (arr >= n_cat))
            raise InputError(key, bad, f"category {arr[bad]} outside 0..{n_cat - 1}")


def check_serving_scores(scores, state) -> np.ndarray:
    """``scores`` of :meth:`Calibrator.serving_map` as a float64 array, or InputError naming
    the first offending stream row and position: (S, n) binary or (S, n, K) with S the
    streams of ``state``, finite probabilities, K-class vectors summing to 1 (within
    :data:`calpipe.config.SCORES_SUM_TOL`): the scores :func:`calpipe.serving_map` accepts,
    never clipped or renormalised silently."""
    try:
        x = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError("scores", None, f"serving scores must be numbers: {exc}") from None
    if x.ndim not in (2, 3) or x.shape[0] != state.n_streams:
        raise InputError(
            "scores", None, f"serving scores must be (S, n) or (S, n, K) with S = "
            f"{state.n_streams} (the state's streams); got shape {x.shape}"
        )  # fmt: skip
    if x.size:
        ok = np.isfinite(x) & (x >= 0.0) & (x <= 1.0)
        if x.ndim == 3:
            ok = ok.all(axis=2) & (np.abs(x.sum(axis=2) - 1.0) <= config.SCORES_SUM_TOL)
        if not ok.all():
            s, j = np.argwhere(~ok)[0]
            raise InputError(
                "scores", int(s), f"serving score {x[s, j].tolist()} at position {int(j)} of "
                "stream row " + f"{int(s)} is not a probability" + (
                    f" vector summing to 1 (tolerance {config.SCORES_SUM_TOL:g})"
                    if x.ndim == 3 else " in [0, 1]")
            )  # fmt: skip
    return np.ascontiguousarray(x)


def check_mixture_weights(method: str, passive: np.ndarray, active: np.ndarray) -> None:
    """StateError unless every stream's mixture weights (passive (S,), active (S, ...)) are
    >= 0 with a positive total: the kernels divide by the total and bet with the weights."""
    if passive.shape[0] == 0:  # no streams (reshape(0, -1) is ambiguous)
        return
    act = active.reshape(passive.shape[0], -1)
    total = passive + act.sum(axis=1)
    off = np.abs(total - 1.0) > config.STATE_WEIGHTS_SUM_TOL
    bad = np.flatnonzero((passive < 0) | (act < 0).any(axis=1) | off)
    if bad.size:
        s = int(bad[0])
        raise StateError(
            f"method {method!r}: state vector {s} has mixture weights (passive {passive[s]}, "
            f"smallest active {act[s].min() if act.shape[1] else 'none'}, total {total[s]}); "
            f"they must be >= 0 and sum to 1 (tolerance {config.STATE_WEIGHTS_SUM_TOL:g}: "
            "the kernels renormalise them after every step, so 1e308 or 1e-320 is not a state)",
            stream=s,
        )
