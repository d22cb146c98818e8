"""docs/screenshots.py: the README's UI screenshots, taken in headless Chromium (#14).

Runs where Chromium is installed (Debian: ``apt-get install chromium``) and is skipped with that
message elsewhere (CI machines have no browser)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from calpipe import cli, generate, storage
from calpipe.generate import StreamSpec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_screenshots_of_the_lineage_a_partition_and_its_plot(tmp_path):
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install chromium): no UI screenshots"
        )
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed (requirements/dev.lock): no UI screenshots")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import screenshots
    finally:
        sys.path.pop(0)
    events = generate.generate(n_days=3, streams=(StreamSpec("a", events_per_day=40),), seed=2)
    storage.write_landing(events, tmp_path / "landing")
    db = tmp_path / "s.duckdb"
    assert (
        cli.main(["run", "--events", str(tmp_path / "landing"), "--db", str(db), "--no-progress"])
        == 0
    )
    shots = screenshots.take(db, tmp_path / "img", timeout=180)
    assert set(shots) == {"lineage", "partition", "plot"}
    for path in shots.values():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a rendered page
        assert int.from_bytes(data[16:20], "big") == 1400
