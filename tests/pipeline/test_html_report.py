"""calpipe/pipeline/html_report.py: ``calpipe report``, one self-contained HTML page (#14)."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import polars as pl
import pytest

from calpipe import cli, generate, pipeline, storage
from calpipe.errors import StoreError
from calpipe.generate import StreamSpec

STREAMS = (
    StreamSpec("calm", events_per_day=80),
    StreamSpec("drifts", events_per_day=80, drift="shift", drift_day=2, strength=3.0),
    StreamSpec("quiet", events_per_day=30),
)


class _Page(HTMLParser):
    """What a browser would fetch (src/href/url(...)) and the ids and tags of the page."""

    def __init__(self):
        super().__init__()
        self.fetches, self.ids, self.tags = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "xlink:href") and v and not v.startswith("#"):
                self.fetches.append(v)
            if k == "id":
                self.ids.append(v)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    events = generate.generate(n_days=8, streams=STREAMS, seed=4)
    storage.write_landing(events, root / "landing")
    path = root / "r.duckdb"
    con = storage.connect(path)
    pipeline.run_range(
        con, storage.EventSource.parse(str(root / "landing")), settings=pipeline.Settings()
    )
    con.close()
    return path


def test_report_is_one_self_contained_page_with_every_stream(db, capsys):
    assert cli.main(["report", "--db", str(db)]) == 0
    out = db.with_name("r.report.html")
    assert f"calpipe report: {out}" in capsys.readouterr().out
    text = out.read_text()
    page = _Page()
    page.feed(text)
    assert page.fetches == []  # nothing is loaded from anywhere: inline SVG, inline styles
    assert "script" not in page.tags
    assert {"summary", "alarms", "change-points", "performance", "s-calm", "s-drifts",
            "s-quiet"} <= set(page.ids)  # fmt: skip
    # trajectory + reliability + performance expected vs realized + change detector (#35)
    assert text.count("<svg") == 4 * len(STREAMS)
    assert text.count("Log loss expected vs realized") == len(STREAMS)
    assert text.count("Change detector (CUSUM)") == len(STREAMS)
    con = storage.connect(db, read_only=True)
    summary = pipeline.stream_summary(con)
    alarms = storage.query(con, "SELECT stream, date FROM martingale_alarms")
    con.close()
    for row in summary.iter_rows(named=True):  # the summary's numbers, as stored
        assert f"<td>{row['prot_LL']:.4f}</td>" in text and f"<td>{row['events']}</td>" in text
    assert alarms.height >= 1  # the drifting stream alarms, and the page says so
    for s, d in alarms.iter_rows():
        assert re.search(rf"<tr><td class=s>{s}</td><td class=s>{d}</td>", text)
        assert f"alarm since {d}" in text


def test_report_shows_each_stream_s_estimates_and_their_coverage(db):
    """#35: the performance section's numbers are the view's: per stream the nights judged
    (>= 20 labelled events), the share whose realized log loss fell in the protected and base
    intervals, and the last night's estimate."""
    text = pipeline.write_report(db).read_text()
    section = text[text.index("id=performance>") : text.index("<section")]
    con = storage.connect(db, read_only=True)
    view = storage.query(con, "SELECT * FROM v_performance_estimates ORDER BY stream, date")
    con.close()
    for (s,), rows in view.partition_by("stream", as_dict=True).items():
        judged = rows.filter(pl.col("labelled") >= 20)
        last = rows.row(-1, named=True)
        cells = [f"<td class=s>{s}</td>", f"<td>{judged.height}</td>"]
        if judged.height:
            cells += [f"<td>{judged['log_loss_within'].mean():.4f}</td>",
                      f"<td>{judged['base_log_loss_within'].mean():.4f}</td>"]  # fmt: skip
        cells += [f"<td class=s>{last['date']}</td>", f"<td>{last['events']}</td>",
                  f"<td>{last['expected_log_loss']:.4f}</td>"]  # fmt: skip
        row = re.search(rf"<tr><td class=s>{s}</td>.*?</tr>", section)[0]
        pos = 0
        for c in cells:  # in this order
            pos = row.index(c, pos) + len(c)


def test_report_caps_the_stream_sections_and_writes_where_asked(db, tmp_path):
    out = pipeline.write_report(db, tmp_path / "x.html", max_streams=1)
    text = out.read_text()
    assert text.count("<section") == 1 and "id='s-drifts'" in text  # the alarmed stream first
    assert "2 more stream(s) are in the summary but have no section" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_report_refuses_a_missing_or_empty_database(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        pipeline.write_report(tmp_path / "nope.duckdb")
    assert not (tmp_path / "nope.duckdb").exists() and not list(tmp_path.iterdir())
    storage.connect(tmp_path / "empty.duckdb").close()
    with pytest.raises(StoreError, match="no day has been run yet"):
        pipeline.write_report(tmp_path / "empty.duckdb")
    assert not (tmp_path / "empty.report.html").exists()


def test_report_renders_in_headless_chromium(db, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install chromium): the rendered page is not checked"
        )
    out = pipeline.write_report(db, tmp_path / "page.html")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    # every plot of the page is in the rendered DOM (four a stream today: martingale,
    # reliability, performance before labels, change points); counted off the page itself so
    # that a new plot does not make this test stale, as "2 a stream" once did
    svgs = out.read_text().count("<svg")
    assert svgs >= 2 * len(STREAMS) and svgs % len(STREAMS) == 0
    assert dom.stdout.count("<svg") == svgs and "Summary per stream" in dom.stdout
    png = tmp_path / "page.png"
    shot = subprocess.run([*flags, "--window-size=1200,1500", f"--screenshot={png}", out.as_uri()],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shot.returncode == 0 and png.stat().st_size > 20_000  # a page with plots, not blank
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png.read_bytes()[16:20], "big") == 1200  # rendered at the asked width
