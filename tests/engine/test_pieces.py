"""calpipe.engine.pieces: a call given a ``progress`` runs its operation list in pieces with the
kernel state carried, and gives the one call's rows and state, bit for bit (``calpipe
protect``'s bar, issue #33).

The thresholds of :mod:`calpipe.config` are lowered here so that small frames run in many
pieces: streams cut at fractions (long streams, one piece a few operations of each, many a
stream with none), streams in groups (short ones), with the binary kernels' SIMD lanes (from
128 streams), every method, binary and K = 3, delayed labels carried and pending, forecast-only
rows, a stored state resumed.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import calpipe
from calpipe import config
from calpipe.calibrators import METHODS, PROTECTED_METHODS
from calpipe.calibrators.windowed import UnfilledWindowWarning
from calpipe.engine import driver, pieces
from calpipe.engine.pieces import plan_pieces
from tests.conftest import make_events
from tests.engine.test_driver_methods import CASES as OTHER_CASES

FAST = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)

#: name -> (method, params, classes): every method (the non-protected ones with the small
#: windows of test_driver_methods, so that their fits happen), and the protected ones.
CASES = {
    **OTHER_CASES,
    "composite-jumper": ("composite-jumper", {}, (2, 3)),
    "composite-jumper-brier": ("composite-jumper", {"loss": "brier", "clip": None}, (2, 3)),
    "jumper": ("jumper", {}, (2, 3)),
    "mean-jumper": ("mean-jumper", {}, (2, 3)),
}
PARAMS = [
    pytest.param(name, k, id=f"{name}-K{k}") for name, (_, _, ks) in CASES.items() for k in ks
]


@contextmanager
def small_pieces(piece_ops: int, min_stream_ops: int):
    """Pieces from the first event on, of ``piece_ops`` operations."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config, "PIECES_MIN_EVENTS", 1)
        mp.setattr(config, "PIECE_OPS", piece_ops)
        mp.setattr(config, "PIECE_MIN_STREAM_OPS", min_stream_ops)
        yield


def _both(df: pl.DataFrame, name: str, k: int, **kw):
    """(one call, the call in pieces, what the pieces told), each call's warnings the same."""
    method, params, _ = CASES[name]
    cols = {"scores": "scores"} if k > 2 else {}
    told: list[int] = []
    said = []
    for progress in (None, told.append):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            said.append(calpipe.protect_with_state(df, method=method, **cols, **params, **kw,
                                                   progress=progress))  # fmt: skip
        said.append([(w.category, str(w.message)) for w in caught])
    one, one_warned, cut, cut_warned = said
    assert cut_warned == one_warned  # a once-a-call warning: once, not once a piece
    return one, cut, told


def _same(one, cut) -> None:
    assert_frame_equal(cut.scores, one.scores, check_exact=True)
    assert_frame_equal(cut.state, one.state, check_exact=True)


def test_every_method_is_cut_here():
    assert set(METHODS) - set(PROTECTED_METHODS) <= {m for m, _, _ in CASES.values()} | {
        p["base_method"] for _, p, _ in CASES.values() if "base_method" in p
    }
    assert set(PROTECTED_METHODS) <= {m for m, _, _ in CASES.values()}


@pytest.mark.parametrize(("name", "k"), PARAMS)
@pytest.mark.parametrize(
    ("n_streams", "piece_ops", "min_stream_ops"),
    [(3, 17, 2), (3, 40, 1000), (150, 60, 1)],
    ids=["fractions", "groups", "lanes"],
)
def test_pieces_equal_one_call_for_every_method(name, k, n_streams, piece_ops, min_stream_ops):
    """3 streams cut at fractions or run whole in groups; 150 streams (the SIMD lanes of the
    binary kernels) each cut at fractions, most with no operation in most pieces."""
    df = make_events(5, n_events=300 if n_streams > 3 else 90, n_streams=n_streams, n_classes=k)
    with small_pieces(piece_ops, min_stream_ops):
        one, cut, told = _both(df, name, k)
    _same(one, cut)
    assert sum(told) == df.height and len(told) > 1


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("name", ["composite-experts", "composite-jumper", "venn-abers", "ops"])
@FAST
@given(seed=st.integers(0, 10_000), piece_ops=st.integers(1, 60), min_ops=st.integers(1, 30),
       mixed=st.booleans())  # fmt: skip
# regression: venn-abers (K = 3) raised IndexError for a fitted stream with no operation in a
# piece (windowed.py read the first map of its empty run)
@example(seed=1, piece_ops=1, min_ops=1, mixed=False)
def test_delayed_labels_in_pieces_equal_one_call(name, k, seed, piece_ops, min_ops, mixed):
    """Labels at their label_time (late, within the piece or pieces later; some at their
    event, some unknown: forecast-only rows): the operation list is cut, never rebuilt, so the
    pending labels at the end and the rows are the one call's; then a second call resumes from
    that state (its carried labels are pseudo-events of the pieces)."""
    if k not in CASES[name][2]:
        pytest.skip("binary-only method")
    df = make_events(seed, n_events=120, n_classes=k, label_time="mixed" if mixed else True)
    cut_at = df["event_time"].sort()[df.height // 2]
    first = df.filter(pl.col("event_time") <= cut_at)
    second = df.filter(pl.col("event_time") > cut_at)
    with small_pieces(piece_ops, min_ops):
        one, cut, told = _both(first, name, k, label_time="label_time")
        _same(one, cut)
        assert sum(told) == first.height
        assert one.state["pending_labels"].list.len().sum() > 0  # labels carried to the next call
        one2, cut2, _ = _both(second, name, k, label_time="label_time", state=one.state)
        _same(one2, cut2)


def test_a_call_below_the_threshold_runs_whole_and_tells_once(monkeypatch):
    monkeypatch.setattr(config, "PIECES_MIN_EVENTS", 10_000)
    df = make_events(1, n_events=500)
    told: list[int] = []
    out = calpipe.protect_with_state(df, progress=told.append)
    assert told == [500]
    assert_frame_equal(out.scores, calpipe.protect_with_state(df).scores, check_exact=True)


def test_the_plan_cuts_long_streams_at_fractions_and_groups_short_ones():
    long = plan_pieces(np.array([0, 1_000_000, 3_000_000]), 250_000, 64)
    assert long.groups.tolist() == [0, 2] and long.fractions == 12
    short = plan_pieces(np.arange(0, 10_000_001, 100), 250_000, 64)  # 100,000 streams of 100
    assert short.fractions == 1 and short.n_pieces == 40
    assert np.all(np.diff(short.groups) == 2_500)
    one = plan_pieces(np.array([0, 10]), 250_000, 64)
    assert one.n_pieces == 1


@pytest.mark.parametrize("name", ["venn", "cj+platt"])
def test_a_windowed_method_warns_once_in_pieces_as_in_one_call(name):
    """Streams that end the call with an unfilled window: one warning for the call (windowed
    methods say so once, not once a stream), and not one a piece."""
    df = make_events(2, n_events=300, n_streams=150)
    with small_pieces(40, 1):
        _, _, told = _both(df, name, 2)  # the warnings compared there
        assert len(told) > 3
        method, params, _ = CASES[name]
        with pytest.warns(UnfilledWindowWarning) as caught:
            calpipe.protect_with_state(df, method=method, **params, progress=told.append)
    streams = df["stream"].n_unique()
    assert len(caught) == 1
    assert f"of {streams} streams have fewer than window" in str(caught[0].message)


@pytest.mark.parametrize("name", ["composite-experts", "composite-jumper"])
def test_a_big_call_without_progress_runs_in_pieces_with_the_one_call_s_bits(monkeypatch, name):
    """From ``config.PIECES_MIN_EVENTS`` events a call runs in pieces whether or not it was
    given a ``progress`` (the nightly run's batches are such calls: pieces read their rows in
    order, 1.5-1.6x faster for the default method at 2M events): the rows and the state are the
    one kernel call's."""
    df = make_events(150, n_events=6_000)
    one = calpipe.protect_with_state(df, method=name)  # 6,000 < the threshold: one call
    calls: list[int] = []
    real = pieces.run_pieces

    def spy(*a, **kw):
        calls.append(kw["plan"].n_pieces)
        return real(*a, **kw)

    monkeypatch.setattr(config, "PIECES_MIN_EVENTS", 1_000)
    monkeypatch.setattr(config, "PIECE_OPS", 500)
    monkeypatch.setattr(driver, "run_pieces", spy)
    cut = calpipe.protect_with_state(df, method=name)
    assert calls and calls[0] > 1  # it did run in pieces
    assert_frame_equal(cut.scores, one.scores, check_exact=True)
    assert_frame_equal(cut.state, one.state, check_exact=True)


def test_a_bar_is_drawn_only_over_calls_that_run_in_pieces():
    """``calpipe protect`` draws its bar from ``PROGRESS_MIN_EVENTS``; a call runs in pieces
    (and tells progress more than once) from ``PIECES_MIN_EVENTS``: a bar below the pieces'
    threshold would sit at 0 until the one kernel call returned."""
    assert config.PROGRESS_MIN_EVENTS >= config.PIECES_MIN_EVENTS
