"""Row orders by keys: :func:`key_order` and :func:`sort_by_keys`, the fast form of
``DataFrame.sort(keys)`` for the pipeline's big frames, and :func:`duplicated` (rows whose keys
repeat) by the same machinery.

Why: polars sorts a frame by a string key and an integer key through its row encoding, which on
the 2-core machines this runs on took 0.6-0.7 s for 2M rows (a night's labels sorted by
(stream, event_id)) and 3.5 s for 10M (side measurements on an AMD EPYC, not a benchmark).
Here each key becomes an int64 rank first (a string key: a dense id per distinct string by
hashing, :func:`calpipe.engine.contract.stream_ids`, then the rank of the distinct strings, a sort of
a few thousand streams). Rows keyed by a string first (the
stream) are then grouped by a counting sort and each group sorted by the other keys packed into
one int64 (:func:`calpipe.kernels.grouping.group_key_order`: linear for the groups already in
order, as a night's labels of one stream usually are); other keys by one sort of the packed
keys, or numpy's ``lexsort``. The order is the same as ``sort(keys)``'s, which is stable
(``maintain_order=True``): equal keys keep their rows' order. Keys with nulls, NaN or other
types go to polars.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from calpipe.engine.contract import stream_ids
from calpipe.kernels.grouping import duplicated_pairs, group_key_order


def _rank(s: pl.Series) -> np.ndarray | None:
    """An int64 (or float64) array that orders as ``s`` does, or None if numpy cannot order it
    like polars (nulls, NaN, or a type without an order-preserving number)."""
    if s.null_count():
        return None
    if s.dtype == pl.String:
        ids, first = stream_ids(s.to_frame(), [s.name])
        rank = np.empty(first.shape[0], dtype=np.int64)
        rank[s.gather(first).arg_sort().to_numpy()] = np.arange(first.shape[0], dtype=np.int64)
        return rank[ids]
    if s.dtype.is_integer() or s.dtype.is_temporal() or s.dtype == pl.Boolean:
        return s.to_physical().to_numpy()
    if s.dtype.is_float() and not s.is_nan().any():
        return s.to_numpy()
    return None


def key_order(frame: pl.DataFrame, keys: Sequence[str]) -> np.ndarray:
    """The row order (int64 indices) that sorts ``frame`` by ``keys`` ascending, stably: the
    order of ``frame.sort(keys, maintain_order=True)``.

    >>> f = pl.DataFrame({"s": ["b", "a", "b", "a"], "i": [2, 9, 1, 9]})
    >>> key_order(f, ["s", "i"]).tolist()
    [1, 3, 2, 0]
    """
    ranks = _ranks(frame, keys)
    if ranks is None:
        return (
            frame.select(pl.arg_sort_by(list(keys), maintain_order=True))
            .to_series()
            .to_numpy()
            .astype(np.int64)
        )
    return _ranked_order(frame, keys, ranks)


def _ranks(frame: pl.DataFrame, keys: Sequence[str]) -> list[np.ndarray] | None:
    """Each key's :func:`_rank`, or None if one of them has none."""
    ranks = []
    for k in keys:
        r = _rank(frame[k])
        if r is None:
            return None
        ranks.append(r)
    return ranks


def _ranked_order(frame: pl.DataFrame, keys: Sequence[str], ranks: list[np.ndarray]) -> np.ndarray:
    """:func:`key_order` from the keys' ranks."""
    if not ranks or frame.height < 2:
        return np.arange(frame.height, dtype=np.int64)
    if frame[keys[0]].dtype == pl.String:  # streams: a counting sort, then within each stream
        rest = _packed(ranks[1:]) if len(ranks) > 1 else None
        if len(ranks) == 1 or rest is not None:
            return group_key_order(ranks[0], int(ranks[0].max()) + 1, rest)
    return lex_order(ranks)


def group_order(
    ids: np.ndarray, n_ids: int, frame: pl.DataFrame, keys: Sequence[str]
) -> np.ndarray:
    """The stable order of ``frame``'s rows by group (``ids``: ints in [0, n_ids)), then by
    ``keys`` within each group: the order of ``frame.sort(["__id", *keys], maintain_order=True)``
    with ``__id = ids``. A counting sort by group and a sort of each group
    (:func:`calpipe.kernels.grouping.group_key_order`) by the keys packed into one int64, or by
    the first key alone where no two rows of a group tie on it (then it decides the order); a
    global sort only otherwise. Why: a stream's late labels are ordered by their events; over a
    10M-label night in 5 parts (py-spy, BENCHMARKS.md §18) the global sort by (event time,
    event id) took 4.3 s, this 2.3 s.

    >>> f = pl.DataFrame({"t": [5, 1, 3, 2], "i": [0, 0, 1, 1]})
    >>> group_order(np.array([1, 1, 0, 0]), 2, f, ["t", "i"]).tolist()
    [3, 2, 1, 0]
    """
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    ranks = _ranks(frame, keys)
    if ranks is None:  # nulls, NaN or other types: polars
        keyed = frame.select(keys).with_columns(pl.Series("__id", ids))
        order = keyed.select(pl.arg_sort_by(["__id", *keys], maintain_order=True)).to_series()
        return order.to_numpy().astype(np.int64)
    packed = _packed(ranks)  # (one integer key: itself, as int64)
    if packed is not None:
        return group_key_order(ids, n_ids, packed)
    first = _packed(ranks[:1])
    if first is not None:
        order = group_key_order(ids, n_ids, first)
        g, k = ids[order], first[order]
        if not np.any((g[1:] == g[:-1]) & (k[1:] == k[:-1])):
            return order
    return lex_order([ids, *ranks])


def duplicated(frame: pl.DataFrame, keys: Sequence[str]) -> np.ndarray:
    """Which rows share their ``keys`` with another row (a bool array): the value of
    ``pl.struct(keys).is_duplicated()``, by an order of the rows that makes equal keys
    neighbours (as :func:`key_order`'s, with each string key numbered by a hash,
    :func:`calpipe.engine.contract.stream_ids`, rather than ranked: only equality matters here) and a
    comparison of neighbours.

    Why: polars' ``is_duplicated`` of the struct of a string and an integer key took 1.2 s and
    2 GB for a night's 10M labels by (stream, event_id) (a side measurement); the ids and the
    order take a few int64 arrays.

    >>> duplicated(pl.DataFrame({"s": ["a", "b", "a"], "i": [1, 1, 1]}), ["s", "i"]).tolist()
    [True, False, True]
    """
    if not keys:
        raise ValueError("duplicated needs at least one key")
    nulls = any(frame[k].null_count() for k in keys)
    if not nulls and any(frame[k].dtype == pl.String for k in keys[1:]):
        # string event ids: one hash of the keys (ranking 10M distinct strings, a sort, cost
        # more than polars' own struct hash; this takes 2/3 of its memory)
        ids, _ = stream_ids(frame, list(keys))
        return np.bincount(ids)[ids] > 1
    ranks = None if nulls else _ranks(frame, keys)
    if ranks is None:  # nulls, NaN or other types: polars
        return frame.select(pl.struct(list(keys)).is_duplicated()).to_series().to_numpy()
    n = frame.height
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    ints = [_packed([r]) for r in ranks]  # (each key alone as int64, or None)
    if len(keys) <= 2 and all(r is not None for r in ints):
        # (stream, event id): a hash of the pairs, O(n); the order below took 2.7 s of a
        # night's 10M labels, mostly sorting each stream's ids
        return duplicated_pairs(ints[0], ints[1] if len(ints) == 2 else np.zeros(n, np.int64))
    order = _ranked_order(frame, keys, ranks)
    same = np.ones(n - 1, dtype=bool)
    for r in ranks:
        sorted_r = r[order]
        same &= sorted_r[1:] == sorted_r[:-1]
    out[order[1:][same]] = True
    out[order[:-1][same]] = True
    return out


def _packed(keys: Sequence[np.ndarray]) -> np.ndarray | None:
    """The integer ``keys`` packed into one int64 that orders rows as the keys do
    lexicographically, or None if they are not all integers or their ranges multiply to 2**63
    or more."""
    packable = [
        k.dtype.kind in "ib" or (k.dtype.kind == "u" and k.dtype.itemsize < 8) for k in keys
    ]
    if not keys or not keys[0].shape[0] or not all(packable):
        return None
    lows = [int(k.min()) for k in keys]
    spans = [int(k.max()) - lo + 1 for k, lo in zip(keys, lows, strict=True)]
    if np.prod(spans, dtype=object) >= 2**63:  # Python ints: exact
        return None
    packed = np.zeros(keys[0].shape[0], dtype=np.int64)
    for k, lo, s in zip(keys, lows, spans, strict=True):
        packed = packed * s + (k.astype(np.int64) - lo)
    return packed


def lex_order(keys: Sequence[np.ndarray]) -> np.ndarray:
    """The stable order of rows by the arrays ``keys`` (first key first), as
    ``np.lexsort(keys[::-1])``. Integer keys whose ranges multiply to less than 2**63 are packed
    into one int64 and sorted once (a 2-key lexsort of 2M random rows took 0.5 s, the packed
    sort 0.2 s).

    >>> lex_order([np.array([1, 0, 1]), np.array([5, 7, 2])]).tolist()
    [1, 2, 0]
    """
    packed = _packed(keys)
    if packed is not None:
        return np.argsort(packed, kind="stable").astype(np.int64, copy=False)
    return np.lexsort(keys[::-1]).astype(np.int64, copy=False)


def sort_by_keys(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """``frame.sort(keys, maintain_order=True)`` by :func:`key_order` (the same rows in the same
    order, faster for big frames keyed by strings).

    >>> sort_by_keys(pl.DataFrame({"s": ["b", "a"], "i": [1, 2]}), ["s"]).rows()
    [('a', 2), ('b', 1)]
    """
    order = key_order(frame, keys)
    if frame.height < 2 or bool(np.all(order[1:] > order[:-1])):
        return frame
    # one contiguous chunk first: a random gather across the many chunks of a frame read from
    # DuckDB cost 0.5 s for 2M rows of 12 columns, the copy and the gather 0.1 s; column by
    # column, so that at most one column's contiguous copy is held beside the sorted frame
    at = pl.Series(order)
    return pl.DataFrame([c.rechunk().gather(at) for c in frame.get_columns()])
