"""calpipe.kernels.grouping against plain loops: dense ids, counting sort, group max."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe import config
from calpipe.kernels import grouping as G

VALUES = st.lists(st.integers(0, 2**64 - 1), max_size=300)
# Few distinct values, many repeats: the usual shape of stream keys.
REPEATS = st.lists(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1, 1024, 2048, 3 * 1024]), max_size=300)


def naive_dense_ids(values):
    seen: dict[int, int] = {}
    first = []
    ids = []
    for i, v in enumerate(values):
        if v not in seen:
            seen[v] = len(seen)
            first.append(i)
        ids.append(seen[v])
    return ids, first


@settings(max_examples=60, deadline=None)
@given(st.one_of(VALUES, REPEATS))
def test_dense_ids_number_values_by_first_appearance(values):
    ids, first = G.dense_ids(np.array(values, dtype=np.uint64))
    want_ids, want_first = naive_dense_ids(values)
    assert ids.tolist() == want_ids
    assert first.tolist() == want_first


def test_dense_ids_survive_table_growth_and_structured_keys():
    # 5,000 distinct multiples of 4096 (identical low bits: a table indexed by raw low bits would
    # put them all in one slot), each repeated, in an interleaved order; the table doubles 3 times.
    rng = np.random.default_rng(3)
    keys = (np.arange(5000, dtype=np.uint64) * np.uint64(4096))[rng.integers(0, 5000, 40_000)]
    ids, first = G.dense_ids(keys)
    want_ids, want_first = naive_dense_ids(keys.tolist())
    assert np.array_equal(ids, want_ids)
    assert np.array_equal(first, want_first)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=200))
def test_counting_sort_is_the_stable_sort_by_id(ids):
    a = np.array(ids, dtype=np.int64)
    n_ids = 7
    order, counts = G.counting_sort(a, n_ids)
    assert order.tolist() == sorted(range(len(ids)), key=lambda i: ids[i])  # Python sort: stable
    assert counts.tolist() == [ids.count(k) for k in range(n_ids)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))),
        max_size=100,
    ),
    st.lists(st.floats(-1e6, 1e6), min_size=5, max_size=5),
)
def test_group_max_is_the_running_max_per_group_ignoring_nan(rows, init):
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    values = np.array([r[1] for r in rows], dtype=np.float64)
    out = G.group_max(values, ids, np.array(init))
    for k in range(5):
        want = max([init[k]] + [v for i, v in rows if i == k and not np.isnan(v)])
        assert out[k] == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-3, 3)), max_size=40))
def test_increasing_in_groups_equals_a_check_of_each_group(rows):
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    values = np.array([r[1] for r in rows], dtype=np.int64)
    want = True
    for k in range(4):
        seq = [v for i, v in rows if i == k]
        want = want and all(a < b for a, b in itertools.pairwise(seq))
    assert G.increasing_in_groups(values, ids, 4) is want


def test_increasing_in_groups_refuses_ids_out_of_range():
    import pytest

    with pytest.raises(ValueError, match=r"ids must lie in \[0, 2\)"):
        G.increasing_in_groups(np.array([1, 2]), np.array([0, 2]), 2)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3)), max_size=40), st.booleans())
def test_group_key_order_equals_a_stable_two_key_sort(rows, presorted):
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    key = np.array([r[1] for r in rows], dtype=np.int64)
    if presorted:  # every group already in key order: the check's path
        key = np.sort(key)
    expected = np.lexsort((key, ids))
    assert G.group_key_order(ids, 5, key).tolist() == expected.tolist()
    assert G.group_key_order(ids, 5).tolist() == np.argsort(ids, kind="stable").tolist()


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 3000), n_ids=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["spread", "ties", "clustered", "extremes"]),
)  # fmt: skip
def test_group_key_order_of_long_groups_is_the_stable_sort(n, n_ids, seed, kind):
    """Groups long enough for the bucket sort of their keys: spread keys (times), many ties
    (buckets past 32 rows: their merge sort), a cluster with outliers (most rows in a few
    buckets), and int64's extremes (the buckets' float scale)."""
    rng = np.random.default_rng(seed)
    if kind == "spread":
        key = rng.integers(0, 86_400_000_000, n) + 1_700_000_000_000_000
    elif kind == "ties":
        key = rng.integers(0, 5, n)
    elif kind == "clustered":
        key = np.where(rng.random(n) < 0.05, rng.integers(-(10**15), 10**15, n),
                       rng.integers(0, 100, n))  # fmt: skip
    else:
        key = rng.choice(np.array([-(2**63), 2**63 - 1, 0, 1, -1], dtype=np.int64), n)
    ids = rng.integers(0, n_ids, n)
    want = np.lexsort((np.arange(n), key, ids))
    assert G.group_key_order(ids, n_ids, key).tolist() == want.tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.floats(0, 1),
            st.sampled_from([0.0, -0.0, 0.5, 5e-324, 1.0]),
        ),
        max_size=300,
    )
)
def test_sort_values_kernel_equals_numpy_sort(values):
    a = np.array(values, dtype=np.float64)
    want = np.sort(a)
    G.sort_values_kernel(a)
    np.testing.assert_array_equal(a, want)  # (NaN = NaN; -0.0 = 0.0)


def test_sort_values_kernel_on_spread_narrow_and_tied_forecasts():
    rng = np.random.default_rng(5)
    for a in (
        rng.beta(2, 3, 5000),
        0.5 + rng.normal(0, 1e-9, 5000),
        np.round(rng.random(5000), 2),
        np.concatenate([np.full(3000, 0.2), rng.random(100)]),
        np.geomspace(1e-300, 1, 5000),
    ):
        got = a.copy()
        G.sort_values_kernel(got)
        assert np.array_equal(got, np.sort(a))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-2, 2), st.sampled_from([0, 1, -(2**63), 2**63 - 1])), max_size=60
    )
)
def test_duplicated_pairs_equals_a_count_of_each_pair(rows):
    a = np.array([r[0] for r in rows], dtype=np.int64)
    b = np.array([r[1] for r in rows], dtype=np.int64)
    want = [rows.count(r) > 1 for r in rows]
    assert G.duplicated_pairs(a, b).tolist() == want


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 300), n_ids=st.integers(1, 9), chunk=st.sampled_from([1, 2, 7, 64, 1 << 15]),
    seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_chunked_group_sums_are_bincount_s_sums_bit_for_bit(n, n_ids, chunk, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, n) * 10.0 ** rng.integers(-8, 9, n)  # magnitudes that round apart
    ids = rng.integers(0, n_ids, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config, "CHUNK_ROWS", chunk)
        got = G.chunked_group_sums(lambda z: [x[z], np.exp(-(x[z] ** 2))], n, ids, n_ids, 2)
    assert got.shape == (2, n_ids)
    np.testing.assert_array_equal(got[0], np.bincount(ids, weights=x, minlength=n_ids))
    np.testing.assert_array_equal(
        got[1], np.bincount(ids, weights=np.exp(-(x**2)), minlength=n_ids)
    )


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 60), n_ids=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
    nan=st.booleans(),
)  # fmt: skip
def test_lex_increasing_in_groups_is_the_check_on_the_grouped_rows(n, n_ids, seed, nan):
    """Oracle: group the rows (stable counting sort), then compare each row with the previous
    one of its group, key by key (the night's change detector's check before it was a kernel)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_ids, n)
    a, b = np.sort(rng.integers(0, 4, n)), rng.integers(0, 3, n)  # often in order, many ties
    c = rng.integers(0, 3, n).astype(np.float64)
    if nan and n:
        c[rng.integers(0, n)] = np.nan
    order, _ = G.counting_sort(ids, n_ids)
    g, x, y, z = ids[order], a[order], b[order], c[order]
    after = (x[1:] > x[:-1]) | ((x[1:] == x[:-1]) & ((y[1:] > y[:-1])
                                                     | ((y[1:] == y[:-1]) & (z[1:] > z[:-1]))))  # fmt: skip
    want = bool(np.all(after | (g[1:] != g[:-1])))
    assert G.lex_increasing_in_groups(a, b, c, ids, n_ids) == want


def test_lex_increasing_in_groups_refuses_keys_of_other_lengths_and_ids_out_of_range():
    one = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="the keys and ids must have one length"):
        G.lex_increasing_in_groups(one, one, np.zeros(2, np.int64), one, 1)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 2\)"):
        G.lex_increasing_in_groups(one, one, one, np.array([0, 2, 1]), 2)
