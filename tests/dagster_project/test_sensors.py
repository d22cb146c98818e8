"""calpipe/dagster_project/sensors.py: the landing sensor requests what calpipe run would run."""

from __future__ import annotations

import datetime as dt

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context, materialize

from calpipe import generate, storage
from calpipe.dagster_project.defs.partitions import RANGE_END_TAG, RANGE_START_TAG
from calpipe.generate import StreamSpec

from .location import location

pytestmark = pytest.mark.filterwarnings("ignore::dagster.BetaWarning")

START = generate.DEFAULT_START
STREAMS = (StreamSpec("a", events_per_day=30), StreamSpec("b", events_per_day=20))


def _tick(defs, instance):
    sensor = defs.resolve_sensor_def("landing_sensor")
    with build_sensor_context(instance=instance, resources=defs.resources) as ctx:
        return sensor(ctx)


def test_the_sensor_requests_new_days_then_nothing_then_a_corrected_day_onwards(tmp_path):
    events = generate.generate(n_days=4, streams=STREAMS, seed=3)
    landing = tmp_path / "landing"
    storage.write_landing(
        events.filter(events["event_time"].dt.date() < START + dt.timedelta(days=3)), landing
    )
    db = tmp_path / "s.duckdb"
    day = [(START + dt.timedelta(days=i)).isoformat() for i in range(4)]
    defs = location(db, str(landing), START, START + dt.timedelta(days=5))
    with DagsterInstance.ephemeral() as instance:
        req = _tick(defs, instance)  # an empty database: every landed day
        assert isinstance(req, RunRequest)
        assert (
            req.tags[RANGE_START_TAG],
            req.tags[RANGE_END_TAG],
        ) == (day[0], day[2])
        assert req.run_key == f"{day[0]}..{day[2]}: new days landed"
        assert materialize(
            list(defs.assets), resources=defs.resources, instance=instance, tags=req.tags
        ).success
        assert isinstance(_tick(defs, instance), SkipReason)  # up to date

        storage.write_landing(
            events.filter(events["event_time"].dt.date() == START + dt.timedelta(days=3)), landing
        )
        req = _tick(defs, instance)  # the next night lands
        assert (
            req.tags[RANGE_START_TAG],
            req.tags[RANGE_END_TAG],
        ) == (day[3], day[3])
        assert materialize(
            list(defs.assets), resources=defs.resources, instance=instance, tags=req.tags
        ).success

        fixed = events.filter(events["event_time"].dt.date() == START + dt.timedelta(days=1)).head(
            7
        )
        storage.write_landing(fixed, landing)  # a corrected file for day 1: day 1 onwards again
        req = _tick(defs, instance)
        assert (
            req.tags[RANGE_START_TAG],
            req.tags[RANGE_END_TAG],
        ) == (day[1], day[3])
        assert "changed" in req.run_key or "differ" in req.run_key, req.run_key


def test_the_sensor_skips_a_tick_while_another_process_writes_the_database(tmp_path):
    """A run writing the database (another process) is the next tick's business: a skip that
    says so, not an error and not a wait."""
    from tests.test_faults import hold_database

    events = generate.generate(n_days=2, streams=STREAMS, seed=4)
    storage.write_landing(events, tmp_path / "landing")
    db = tmp_path / "busy.duckdb"
    storage.connect(db).close()
    defs = location(db, str(tmp_path / "landing"), START, START + dt.timedelta(days=3))
    holder = hold_database(db, 60)
    try:
        with DagsterInstance.ephemeral() as instance:
            tick = _tick(defs, instance)
    finally:
        holder.kill()
        holder.wait()
    assert isinstance(tick, SkipReason), tick
    assert tick.skip_message.startswith("database busy:") and str(db) in tick.skip_message
