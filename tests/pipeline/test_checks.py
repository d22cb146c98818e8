"""calpipe/pipeline/checks.py: the data checks' messages stay readable at scale."""

from __future__ import annotations

import datetime as dt

from calpipe import pipeline, storage
from calpipe.pipeline.checks import ALARM_NAMES_SHOWN

D = dt.date(2024, 3, 1)


def test_the_alarm_warning_listed_every_alarmed_stream_on_one_line(tmp_path):
    """1,000 streams alarming on one night printed 1,000 names on one line. Now the first few
    are named and the rest counted (martingale_alarms holds them all)."""
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        con.execute(
            "INSERT INTO martingale_alarms SELECT ?, 'stream-' || lpad(i::VARCHAR, 4, '0'), "
            "TIMESTAMP '2024-03-01 12:00', i, 2.5, 2.0 FROM range(1000) t(i)",
            [D],
        )
        outcome = pipeline.check_alarms(con, D, D)
    finally:
        con.close()
    assert outcome.warning and not outcome.passed
    desc = outcome.description
    assert desc.startswith(f"1000 stream(s) reached the alarm level (S >= 100) on {D}: ")
    assert "stream-0000, stream-0001" in desc and "stream-0010" not in desc
    assert f"and {1000 - ALARM_NAMES_SHOWN} more (all in martingale_alarms)" in desc
    assert len(desc) < 400
    assert outcome.values["new_alarms"] == 1000 and outcome.details.height == 1000


def test_a_few_alarms_are_all_named(tmp_path):
    con = storage.connect(tmp_path / "db.duckdb")
    try:
        con.execute(
            "INSERT INTO martingale_alarms VALUES (?, 'a', TIMESTAMP '2024-03-01 12:00', 1, 2.5, "
            "2.0), (?, 'b', TIMESTAMP '2024-03-01 13:00', 2, 2.1, 2.0)",
            [D, D],
        )
        outcome = pipeline.check_alarms(con, D, D)
    finally:
        con.close()
    assert outcome.description.endswith(": a, b") and "more" not in outcome.description
