"""The real ``calpipe ui`` read in headless Chromium, over a database ``calpipe run`` made (#37).

What a user sees, not what GraphQL answers: as many partitions as stored days, all materialized;
each day's page with its row count and the facts of the run that computed it; each check's
execution history with its result on each day (it once said "Skipped" or "Not evaluated" for
days computed outside dagster); then the same after a backfill of three days launched in the
UI (each day once said "Unsynced"). Runs wherever Chromium is installed (``.ci/run`` installs it);
skipped with the reason elsewhere. ``make test-ui`` walks the longer story (demo, days added,
a backfill, a missing database) through GraphQL and these same pages.
"""

from __future__ import annotations

import pytest

from calpipe.dagster_project.metadata import CHECK_ASSETS
from tests.ui_client import UI_RESULT, BrowserPages, RunningUI, browser_missing, wait_for

from .test_ui_data import (
    check_statuses,
    expected_checks,
    latest_metadata,
    partition_keys,
    rows_per_day,
)

pytestmark = pytest.mark.slow


def test_a_calpipe_run_database_as_the_browser_shows_it(cli_chain, tmp_path):
    reason = browser_missing()
    if reason:
        pytest.skip(f"{reason}: the UI's pages are not read in a browser")
    events, db = cli_chain
    per_day = rows_per_day(db)
    want = expected_checks(db)
    with RunningUI(db, cwd=tmp_path) as ui:
        ui.wait_ready()
        days = partition_keys(ui)
        assert days == sorted(per_day)  # partitions = the stored days, not the calendar
        wait_for("the sync", lambda: ui.materialized("protected_scores") == len(days), 300)
        wait_for("the check results", lambda: check_statuses(ui) == want, 120)
        with BrowserPages(ui.base) as pages:
            counts = pages.partition_counts("protected_scores")
            assert counts == {
                "Failed": 0,
                "Materialized": len(days),
                "Materializing": 0,
                "Missing": 0,
            }
            for day in days:
                meta = pages.partition_metadata("protected_scores", day)
                assert meta["status"] == "Materialized"
                assert int(meta["dagster/row_count"]) == per_day[day] > 0
                assert meta["runner"] == "calpipe run"
                assert meta["run_days"] == f"{days[0]}..{days[-1]} ({len(days)} day(s))"
                assert int(meta["run_events"]) == events.height
            for check, asset in CHECK_ASSETS.items():
                shown = pages.check_results(asset, check)
                assert shown == {d: UI_RESULT[want[check, d]] for d in days}, check

        # a backfill of the last three days launched in the UI (one run): each day's page its
        # own rows and the run, "Materialized" and not "Unsynced" (the days were reported
        # downstream first), each check's result on each day
        three = days[1:]
        run_id, status = ui.materialize(three[0], timeout=600, last=three[-1])
        assert status == "SUCCESS"
        wait_for("the range metadata sensor",
                 lambda: all(latest_metadata(ui, d).get("run", {}).get("text") == run_id
                             for d in three), 300)  # fmt: skip
        wait_for("the backfill's check results",
                 lambda: {k: check_statuses(ui).get(k) for k in want} == want, 120)  # fmt: skip
        with BrowserPages(ui.base) as pages:
            for day in three:
                meta = pages.partition_metadata("protected_scores", day)
                assert meta["status"] == "Materialized", (day, meta)
                assert (int(meta["dagster/row_count"]), meta["run"]) == (per_day[day], run_id)
            for check, asset in CHECK_ASSETS.items():
                shown = pages.check_results(asset, check)
                assert {d: shown.get(d) for d in three} == {
                    d: UI_RESULT[want[check, d]] for d in three
                }, check
