"""calpipe/engine/operations.py ``merge_updates``: the operation order of delayed labels, by a merge of the
sorted updates into the (already sorted) events, equals the 4-key lexsort it replaced."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.engine.operations import merge_updates


def _lexsort(sid, te, a_sid, a_t, a_seq):
    n, n_a = sid.shape[0], a_sid.shape[0]
    return np.lexsort((
        np.concatenate([np.arange(n), a_seq]),
        np.concatenate([np.zeros(n, np.int64), np.ones(n_a, np.int64)]),
        np.concatenate([te, a_t]),
        np.concatenate([sid, a_sid]),
    ))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 40), n_a=st.integers(0, 40), n_streams=st.integers(1, 4),
    t_range=st.integers(1, 6), seed=st.integers(0, 2**32 - 1), unsorted=st.booleans(),
)  # fmt: skip
def test_merged_updates_equal_the_four_key_lexsort(n, n_a, n_streams, t_range, seed, unsorted):
    """Ties everywhere (few streams, few distinct times, pending updates with negative seq);
    unsorted events take the lexsort fallback and must agree too."""
    rng = np.random.default_rng(seed)
    sid = rng.integers(0, n_streams, n).astype(np.int64)
    te = rng.integers(-t_range, t_range, n).astype(np.int64)
    if not unsorted:
        o = np.lexsort((te, sid))
        sid, te = sid[o], te[o]
    a_sid = rng.integers(0, n_streams, n_a).astype(np.int64)
    a_t = rng.integers(-2 * t_range, 2 * t_range, n_a).astype(np.int64)
    a_seq = rng.permutation(np.arange(n_a, dtype=np.int64) - n_a // 2)
    got = merge_updates(sid, te, a_sid, a_t, a_seq)
    want = _lexsort(sid, te, a_sid, a_t, a_seq)
    np.testing.assert_array_equal(got, want)


def test_times_far_apart_fall_back_to_the_lexsort():
    """A packed (stream, time) key that would overflow int64 takes the lexsort path."""
    sid = np.array([0, 1, 2], dtype=np.int64)
    te = np.array([-(2**62), 0, 2**62], dtype=np.int64)
    a_sid = np.array([1, 0], dtype=np.int64)
    a_t = np.array([5, -(2**62)], dtype=np.int64)
    a_seq = np.array([1, 0], dtype=np.int64)
    np.testing.assert_array_equal(
        merge_updates(sid, te, a_sid, a_t, a_seq), _lexsort(sid, te, a_sid, a_t, a_seq)
    )
