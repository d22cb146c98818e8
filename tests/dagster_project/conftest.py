"""Shared fixtures of the code location's tests."""

from __future__ import annotations

import pytest

from calpipe import cli, generate, storage
from calpipe.generate import StreamSpec

from .location import forget, load_fresh

#: Two small streams over four days: what a `calpipe run` outside dagster computed.
CLI_STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", events_per_day=20))


@pytest.fixture
def cli_chain(tmp_path):
    """``(events, database)`` of a 4-day `calpipe run` over a landing folder in ``tmp_path``
    (``tmp_path / "landing"``)."""
    events = generate.generate(n_days=4, streams=CLI_STREAMS, seed=9)
    storage.write_landing(events, tmp_path / "landing")
    db = tmp_path / "c.duckdb"
    argv = ["run", "--events", str(tmp_path / "landing"), "--db", str(db), "--no-progress"]
    assert cli.main(argv) == 0
    return events, db


@pytest.fixture
def load_location():
    """:func:`tests.dagster_project.location.load_fresh`: the location under the test's
    environment (monkeypatch it first); its modules are forgotten after the test."""
    yield load_fresh
    forget()
