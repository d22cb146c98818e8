"""The partitions span the data (#37): the database's days and its landing folder's, read each
time the code location loads; not a last day frozen in ``calpipe_meta``, not the calendar."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time

from dagster import AssetKey

from calpipe import cli, generate, storage
from calpipe.dagster_project.defs import partitions

from .conftest import CLI_STREAMS
from .location import location


def keys(defs) -> list[str]:
    pd = defs.resolve_asset_graph().get(AssetKey("protected_scores")).partitions_def
    return pd.get_partition_keys()


def days(start: dt.date, n: int) -> list[str]:
    return [(start + dt.timedelta(days=i)).isoformat() for i in range(n)]


def test_days_added_by_calpipe_run_appear_once_the_location_reloads(tmp_path):
    """Regression: `calpipe ui` handed the location calpipe_meta.last_day, frozen at the demo's
    last day, so days a later `calpipe run` added never became partitions."""
    events = generate.generate(n_days=6, streams=CLI_STREAMS, seed=9)
    first = generate.DEFAULT_START
    landing, db = tmp_path / "landing", tmp_path / "c.duckdb"
    storage.write_landing(events.filter(events["event_time"].dt.date() < first + dt.timedelta(4)),
                          landing)  # fmt: skip
    argv = ["run", "--events", str(landing), "--db", str(db), "--no-progress"]
    assert cli.main(argv) == 0
    assert keys(location(db, str(landing), None)) == days(first, 4)
    # two days land: partitions at once (materializable from the UI), before any run
    storage.write_landing(events.filter(events["event_time"].dt.date() >= first + dt.timedelta(4)),
                          landing)  # fmt: skip
    assert keys(location(db, str(landing), None)) == days(first, 6)
    assert cli.main(argv) == 0
    assert keys(location(db, str(landing), None)) == days(first, 6)
    # the landing folder emptied (archived): the stored days stay partitions
    for sub in landing.iterdir():
        for f in sub.iterdir():
            f.unlink()
        sub.rmdir()
    assert keys(location(db, str(landing), None)) == days(first, 6)


def test_a_three_day_database_has_three_partitions_not_one_per_day_to_today(cli_chain, tmp_path):
    """Regression: a database made by `calpipe run` got partitions up to yesterday (5,974 for
    three days of 2010, "0 % filled")."""
    _events, db = cli_chain
    (tmp_path / "landing").rename(tmp_path / "elsewhere")  # the stored days alone
    assert keys(location(db, str(tmp_path / "landing"), None)) == days(generate.DEFAULT_START, 4)


def test_a_missing_database_without_landed_days_loads_with_no_partition(tmp_path):
    defs = location(tmp_path / "new.duckdb", str(tmp_path / "landing"), None)
    assert keys(defs) == []
    assert not (tmp_path / "new.duckdb").exists()  # loading created nothing


def test_a_missing_database_has_its_landed_days_as_partitions(tmp_path):
    events = generate.generate(n_days=3, streams=CLI_STREAMS, seed=9)
    storage.write_landing(events, tmp_path / "landing")
    defs = location(tmp_path / "new.duckdb", str(tmp_path / "landing"), None)
    assert keys(defs) == days(generate.DEFAULT_START, 3)
    assert not (tmp_path / "new.duckdb").exists()


def test_the_variables_still_override_the_data(cli_chain, tmp_path):
    _events, db = cli_chain
    defs = location(db, str(tmp_path / "landing"), dt.date(2010, 7, 22), dt.date(2010, 7, 23))
    assert keys(defs) == ["2010-07-22", "2010-07-23"]


def test_a_database_another_process_writes_gives_the_landed_days(cli_chain, tmp_path):
    """Loading waits a few seconds for a writer (a `calpipe run` in progress), then counts the
    landed days alone, instead of failing the whole code location."""
    _events, db = cli_chain
    hold = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(120)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert hold.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        defs = location(db, str(tmp_path / "landing"), None)
        assert keys(defs) == days(generate.DEFAULT_START, 4)
        assert time.monotonic() - t0 >= partitions.SPAN_LOCK_WAIT_SECONDS / 2  # it waited
    finally:
        hold.kill()
        hold.wait()
