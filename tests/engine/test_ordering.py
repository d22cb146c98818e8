"""calpipe.engine.ordering: the fast sort equals polars' stable sort, row for row."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe.engine.ordering import duplicated, group_order, key_order, lex_order, sort_by_keys

_KEYS = st.lists(st.sampled_from(["s", "i", "t", "f", "b"]), min_size=1, max_size=3, unique=True)


@st.composite
def _frames(draw):
    n = draw(st.integers(0, 40))
    strings = st.sampled_from(["", "a", "b", "ab", "ä", "B", "zz"])
    nulls = draw(st.booleans())
    opt = (lambda s: st.none() | s) if nulls else (lambda s: s)
    t0 = dt.datetime(2024, 1, 1)
    return pl.DataFrame(
        {
            "s": draw(st.lists(opt(strings), min_size=n, max_size=n)),
            "i": draw(st.lists(opt(st.integers(-3, 3)), min_size=n, max_size=n)),
            "t": [t0 + dt.timedelta(seconds=x) for x in draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))],
            "f": draw(st.lists(opt(st.sampled_from([0.0, -1.5, 2.0, float("nan")])), min_size=n, max_size=n)),
            "b": draw(st.lists(st.booleans(), min_size=n, max_size=n)),
            "row": list(range(n)),
        },
        schema={"s": pl.String, "i": pl.Int64, "t": pl.Datetime("us"), "f": pl.Float64,
                "b": pl.Boolean, "row": pl.Int64},
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_frames(), _KEYS)
def test_sort_by_keys_equals_polars_stable_sort(frame, keys):
    expected = frame.sort(keys, maintain_order=True)
    assert sort_by_keys(frame, keys).equals(expected)
    assert key_order(frame, keys).tolist() == expected["row"].to_list()


@settings(max_examples=300, deadline=None)
@given(_frames(), _KEYS, st.data())
def test_group_order_equals_polars_stable_sort_by_group_then_keys(frame, keys, data):
    ids = data.draw(st.lists(st.integers(0, 3), min_size=frame.height, max_size=frame.height))
    keyed = frame.with_columns(pl.Series("__id", ids, dtype=pl.Int64))
    expected = keyed.sort(["__id", *keys], maintain_order=True)["row"].to_list()
    assert group_order(np.array(ids, dtype=np.int64), 4, frame, keys).tolist() == expected


def test_group_order_of_keys_too_wide_to_pack_ties_and_no_ties():
    """Event times in microseconds over a month and ids of a wide range do not pack into one
    int64: the first key decides where it has no ties in a group, a global sort otherwise."""
    t = np.array([3, 1, 2, 1], dtype=np.int64) * 10**15
    f = pl.DataFrame({"t": t, "i": np.array([2, 9, 7, 1], dtype=np.int64) * 10**6})
    assert group_order(np.array([0, 0, 1, 1]), 2, f, ["t", "i"]).tolist() == [1, 0, 3, 2]
    tie = f.with_columns(pl.Series("t", t[[0, 0, 0, 0]]))  # all tied: by i
    assert group_order(np.array([0, 0, 0, 0]), 1, tie, ["t", "i"]).tolist() == [3, 0, 2, 1]


@settings(max_examples=300, deadline=None)
@given(_frames(), _KEYS)
def test_duplicated_equals_polars_is_duplicated_of_the_struct(frame, keys):
    expected = frame.select(pl.struct(keys).is_duplicated()).to_series().to_list()
    assert duplicated(frame, keys).tolist() == expected


@pytest.mark.parametrize("id_type", [pl.Int64, pl.String])
def test_duplicated_of_big_frame_of_streams_and_ids_matches_polars(id_type):
    """Integer event ids by their order, string ones by one hash of the keys."""
    rng = np.random.default_rng(1)
    n = 200_000
    f = pl.DataFrame({
        "stream": pl.Series(rng.integers(0, 3000, n)).cast(pl.String),
        "event_id": pl.Series(rng.integers(0, 10 * n, n)).cast(id_type),  # some repeat
    })  # fmt: skip
    got = duplicated(f, ["stream", "event_id"])
    assert got.any()
    assert got.tolist() == f.select(pl.struct("stream", "event_id").is_duplicated())[:, 0].to_list()


def test_duplicated_needs_a_key():
    with pytest.raises(ValueError, match="at least one key"):
        duplicated(pl.DataFrame({"s": ["a"]}), [])


def test_string_key_orders_as_polars_not_by_first_appearance():
    f = pl.DataFrame({"s": ["s10", "s2", "s1", "s2"], "i": [0, 5, 7, 1]})
    assert sort_by_keys(f, ["s", "i"]).rows() == [("s1", 7), ("s10", 0), ("s2", 1), ("s2", 5)]


def test_big_frame_of_streams_and_ids_matches_polars():
    rng = np.random.default_rng(0)
    n = 200_000
    f = pl.DataFrame({
        "stream": pl.Series(rng.integers(0, 3000, n)).cast(pl.String),
        "event_id": rng.permutation(n),
    })  # fmt: skip
    assert sort_by_keys(f, ["stream", "event_id"]).equals(f.sort("stream", "event_id"))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-(2**62), 2**62), st.integers(-5, 5), st.booleans()), max_size=30
    )
)
def test_lex_order_packed_or_not_equals_lexsort(rows):
    keys = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(2)]
    keys.append(np.array([r[2] for r in rows], dtype=bool))
    for ks in (keys, keys[1:], [keys[1], keys[2], keys[1]]):
        assert lex_order(ks).tolist() == np.lexsort(ks[::-1]).tolist()
