"""Screenshots of the dagster UI over a calpipe database, for the README (``docs/img/``).

    python docs/screenshots.py [--db PATH] [--out docs/img]

Starts ``calpipe ui`` on the database (default: the demo's), waits until the days computed by
``calpipe run`` / ``calpipe demo`` show as materialized, materializes the last day through the
GraphQL API (so its plots are in its metadata), and drives headless Chromium (playwright over
the system's ``chromium``) to three pages: the lineage, the partitions of ``protected_scores``
with the last day's metadata, and the last day's martingale trajectory as the UI shows it.
Then stops the UI as Ctrl-C does. ``tests/test_screenshots.py`` runs it where Chromium is
installed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from calpipe import paths, pipeline, storage

# the UI driver is a test helper of the repository (tests/ui_client.py), not of the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.ui_client import RunningUI, wait_for

SHOTS = ("lineage", "partition", "plot")


def take(db: Path, out: Path, *, timeout: float = 600) -> dict[str, Path]:
    """The three screenshots of ``db``'s UI written into ``out``; their paths by name."""
    from playwright.sync_api import sync_playwright

    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser_path is None:
        raise RuntimeError("Chromium is not installed (Debian: apt-get install chromium)")
    con = storage.connect(db, read_only=True)
    try:
        days = pipeline.stored_days(con)["date"]
    finally:
        con.close()
    if days.len() == 0:
        raise RuntimeError(f"{db}: no day has been run yet")
    last = days.max().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    shots = {name: out / f"ui_{name}.png" for name in SHOTS}
    with RunningUI(db) as ui:
        ui.wait_ready()
        wait_for(
            "the days computed outside dagster",
            lambda: ui.materialized("protected_scores") >= days.len(),
            timeout,
        )
        _, status = ui.materialize(last)
        if status != "SUCCESS":
            raise RuntimeError(f"the run of {last} ended {status}:\n{ui.stop()[-4000:]}")
        base = ui.base
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/asset-groups/calpipe/lineage")
            page.get_by_text("calibration_map").first.wait_for(timeout=60_000)
            page.wait_for_timeout(2000)  # the graph's layout settles
            page.screenshot(path=shots["lineage"])
            page.goto(f"{base}/assets/protected_scores?view=partitions&partition={last}")
            page.get_by_text("config_fingerprint").first.wait_for(timeout=60_000)
            page.screenshot(path=shots["partition"])
            page.goto(f"{base}/assets/calibration_daily?view=partitions&partition={last}")
            page.get_by_text("Show Markdown").first.click(timeout=60_000)  # the trajectory
            page.get_by_text("Close").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=shots["plot"])
            browser.close()
    return shots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--db", default=str(paths.DEFAULT_DB), help="calpipe database (default: the demo's)"
    )
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "img"))
    args = ap.parse_args(argv)
    for name, path in take(Path(args.db).resolve(), Path(args.out)).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
