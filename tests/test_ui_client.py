"""tests/ui_client.py: a ``calpipe ui`` that cannot start says why at once.

Before, :meth:`RunningUI.wait_ready` polled a UI that had already exited for
``config.UI_START_SECONDS`` (6 minutes) and then said only that it timed out; the README's
screenshot test once failed so in CI with nothing to go on."""

from __future__ import annotations

import time

import pytest

from tests.ui_client import RunningUI


def test_a_ui_that_exits_is_reported_at_once_with_its_log(tmp_path):
    t0 = time.monotonic()
    with RunningUI(tmp_path) as ui:  # a folder, not a database: calpipe ui exits with code 2
        with pytest.raises(
            RuntimeError, match=r"(?s)calpipe ui exited with code 2 .*Is a directory"
        ):
            ui.wait_ready(timeout=300)
    assert time.monotonic() - t0 < 120  # not the timeout


def test_a_ui_that_does_not_answer_in_time_is_reported_with_its_log(tmp_path):
    with RunningUI(tmp_path / "x.duckdb") as ui:
        with pytest.raises(TimeoutError, match=r"(?s)timed out after 0 s .*its log:"):
            ui.wait_ready(timeout=0.0)
        log = ui.stop()  # (the UI writes its log as it runs: compare once it stopped)
        assert ui.log_tail(10) == log.encode()[-10:].decode(errors="replace")
