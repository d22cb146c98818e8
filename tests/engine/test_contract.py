"""How :func:`calpipe.engine.contract.replay_order` groups and orders rows: every path (presorted, a time-
ordered event log, per-stream clocks, shuffled rows, event ids that do not follow time) gives
the forecasts of running each stream alone in (event_time, event_id) order; a hash collision of
stream keys cannot merge streams; duplicates are caught on every path."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe.calibrators import make_calibrator
from calpipe.engine import contract
from calpipe.errors import InputError

T0 = dt.datetime(2024, 1, 1)


def events(n: int = 400, n_streams: int = 7, seed: int = 0) -> pl.DataFrame:
    """A time-ordered event log: streams interleaved, ids increasing with time."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame(
        {
            "stream": [f"s{k}" for k in rng.integers(0, n_streams, n)],
            "event_time": [
                T0 + dt.timedelta(seconds=int(s)) for s in np.sort(rng.integers(0, 500, n))
            ],
            "event_id": np.arange(n, dtype=np.int64),
            "score": rng.uniform(0.02, 0.98, n),
            "label": rng.integers(0, 2, n),
        }
    )


def per_stream_reference(df: pl.DataFrame) -> dict[int, tuple[float, float]]:
    """event_id -> (protected, log10 martingale), each stream run alone through the calibrator."""
    cal = make_calibrator("composite-jumper")
    out = {}
    for _, g in df.sort("event_time", "event_id").group_by("stream", maintain_order=True):
        res, _ = cal.run(cal.prepare_scores(g["score"].to_numpy()), g["label"].to_numpy())
        for eid, p, m in zip(g["event_id"], res.protected, res.log10_martingale, strict=True):
            out[eid] = (p, m)
    return out


def assert_matches_reference(df: pl.DataFrame) -> None:
    out = calpipe.protect(df, method="composite-jumper")
    ref = per_stream_reference(df)
    got = {
        e: (p, m)
        for e, p, m in out.select("event_id", "protected_score", "log10_martingale").iter_rows()
    }
    assert got == ref  # bit for bit


def test_time_ordered_log():
    df = events()
    replay = contract.replay_order(df, _cols(df))
    assert replay.order is not None  # streams interleaved: a counting sort groups them
    assert_matches_reference(df)


def test_presorted_frame_needs_no_permutation():
    df = events().sort("stream", "event_time", "event_id")
    assert contract.replay_order(df, _cols(df)).order is None
    assert_matches_reference(df)


def test_streams_grouped_in_any_order_need_no_permutation():
    df = events().sort("stream", "event_time", "event_id", descending=[True, False, False])
    assert contract.replay_order(df, _cols(df)).order is None
    assert_matches_reference(df)


def test_per_stream_clocks_not_globally_ordered():
    # Each stream in time order, but the streams' rows interleaved out of global time order.
    df = (
        events()
        .sort("stream", "event_time")
        .with_columns(pl.int_range(pl.len()).over("stream").alias("k"))
        .sort("k", "stream")
        .drop("k")
    )
    assert_matches_reference(df)


def test_shuffled_rows_and_ids_against_time():
    df = events()
    rng = np.random.default_rng(1)
    df = df.with_columns(pl.Series("event_id", rng.permutation(df.height)))  # ids not in time order
    df = df[rng.permutation(df.height)]
    assert_matches_reference(df)


def test_a_hash_collision_cannot_merge_streams(monkeypatch):
    df = events()[np.random.default_rng(2).permutation(400)]
    want = calpipe.protect(df)
    assert df["stream"].n_unique() > 1
    # Every key hashes to one id: the row-by-row key check must see it and fall back to a sort
    # (without the fallback every stream would run as one, and the output could not be equal).
    monkeypatch.setattr(
        contract.G, "dense_ids", lambda h: (np.zeros(h.shape[0], np.int64), np.zeros(1, np.int64))
    )
    got = calpipe.protect(df)
    assert got.equals(want)


def test_stream_ids_after_a_hash_collision_number_streams_by_first_appearance(monkeypatch):
    # The fallback used to number streams by the keys' sort rank: the nightly monitoring,
    # which reuses the engine's grouping (ProtectResult.groups), needs first appearance.
    df = pl.DataFrame({"s": ["b", "a", "b", "c", "a"]})
    want = contract.stream_ids(df, ("s",))
    monkeypatch.setattr(
        contract.G, "dense_ids", lambda h: (np.zeros(h.shape[0], np.int64), np.zeros(1, np.int64))
    )
    ids, first = contract.stream_ids(df, ("s",))
    assert ids.tolist() == want[0].tolist() == [0, 1, 0, 2, 1]
    assert first.tolist() == want[1].tolist() == [0, 1, 3]


def test_stream_ids_number_streams_by_first_appearance_with_several_keys():
    df = pl.DataFrame({"a": ["x", "y", "x", "x", None], "b": [1, 1, 1, 2, 1]})
    ids, first = contract.stream_ids(df, ("a", "b"))
    assert ids.tolist() == [0, 1, 0, 2, 3]
    assert first.tolist() == [0, 1, 3, 4]


@pytest.mark.parametrize("shuffle", [False, True])
def test_duplicate_event_id_is_caught_on_every_path(shuffle):
    df = events(n=50, n_streams=2)
    # Row 30 takes the id of the earlier row 10 of the same stream, later in time.
    s10 = df["stream"][10]
    row = next(i for i in range(30, 50) if df["stream"][i] == s10)
    df = df.with_columns(
        pl.when(pl.int_range(pl.len()) == row)
        .then(10)
        .otherwise(pl.col("event_id"))
        .alias("event_id")
    )
    if shuffle:
        df = df.reverse()
    with pytest.raises(InputError) as e:
        calpipe.protect(df)
    assert e.value.column == "event_id"
    assert e.value.row == (df.height - 1 - 10 if shuffle else row)
    assert "duplicate" in str(e.value)


def _cols(df):
    return contract.resolve_columns(
        df.columns, score=None, scores=None, label="label", label_time=None, by=None,
        order_by=("event_time", "event_id"),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_replay_order_same_for_integer_keys_as_for_polars_compared_ones(seed):
    # Integer and time keys are compared in numpy, other types by a polars query: the same
    # frame with float order keys and categorical streams (the polars paths) must replay the
    # same. Ties in time; ids in row order or not; times in order or not; one stream or several.
    rng = np.random.default_rng(seed)
    n, n_streams = 300, [1, 3, 8, 1, 3, 8, 3, 8][seed]
    time = rng.integers(0, 40, n)
    df = pl.DataFrame(
        {
            "stream": [f"s{k}" for k in rng.integers(0, n_streams, n)],
            "event_time": np.sort(time) if seed < 3 else time,
            "event_id": rng.permutation(n) if seed >= 6 else np.arange(n),
            "score": rng.uniform(0.02, 0.98, n),
            "label": rng.integers(0, 2, n),
        }
    )
    other = df.with_columns(
        pl.col("event_time", "event_id").cast(pl.Float64), pl.col("stream").cast(pl.Categorical)
    )
    a, b = contract.replay_order(df, _cols(df)), contract.replay_order(other, _cols(other))
    assert (a.order is None) == (b.order is None)
    if a.order is not None:
        assert np.array_equal(a.order, b.order)
    assert np.array_equal(a.counts, b.counts) and np.array_equal(a.ids, b.ids)


@pytest.mark.parametrize("seed", range(20))
def test_a_rules_clean_proof_never_hides_a_broken_row(seed):
    # check_rules leaves out a rule whose `clean` holds: that must mean no row breaks it, for
    # the edge values of every column type the proofs accept or refuse (NaN, nulls, bounds).
    rng = np.random.default_rng(seed)
    pool = [0.0, 1.0, -0.0, 0.5, -1e-300, 1.0000000000000002, float("nan"), None, 2.0]
    n = int(rng.integers(1, 6))
    floats = [pool[i] for i in rng.integers(0, len(pool), n)]
    ints = [[0, 1, 2, -1, None][i] for i in rng.integers(0, 5, n)]
    df = pl.DataFrame(
        {
            "f": pl.Series(floats, dtype=pl.Float64),
            "f32": pl.Series(floats, dtype=pl.Float32),
            "i": pl.Series(ints, dtype=pl.Int64),
            "u": pl.Series([None if v is None else abs(v) for v in ints], dtype=pl.UInt8),
        }
    )
    for c in df.columns:
        col = pl.col(c)
        proofs = [
            (contract.no_null(c), col.is_null()),
            (contract.no_nan(c), col.cast(pl.Float64).is_nan()),
            (contract.within(c, 0, 1), (col < 0) | (col > 1)),
        ]
        for clean, bad in proofs:
            if clean(df):
                assert not df.select(bad.fill_null(False).any()).item(), (c, df[c].to_list())
