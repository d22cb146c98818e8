"""Regression tests of calpipe.frame, each named after what broke."""

import numpy as np
import polars as pl

import calpipe


def test_single_stream_state_join_key_dtype_mismatch():
    """by=() with a carried state joined a UInt32 stream index to an Int64 one and raised."""
    rng = np.random.default_rng(3)
    n = 200
    events = pl.DataFrame(
        {
            "event_time": np.arange(n),
            "event_id": np.arange(n),
            "score": rng.uniform(0.05, 0.95, n),
            "label": rng.integers(0, 2, n),
        }
    )
    one = calpipe.protect(events, by=())
    first = calpipe.protect_with_state(events.head(120), by=())
    rest = calpipe.protect_with_state(events.tail(n - 120), by=(), state=first.state)
    chunked = pl.concat([first.scores, rest.scores])
    assert chunked["protected_score"].to_list() == one["protected_score"].to_list()
    assert rest.state["n_events"].item() == n
