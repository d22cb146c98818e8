"""``calpipe demo``: the bank stream and seeded synthetic streams, landed and run day by day.

Owns the demo's data (the shipped bank file and its stream and score column, the generated
synthetic set, the demo's first and last day) and :func:`demo`, which lands the events as
daily Parquet folders and runs every partition with :func:`calpipe.pipeline.nightly.run_range`.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from calpipe import generate, paths, storage
from calpipe.errors import StateError
from calpipe.night.settings import Settings
from calpipe.pipeline.chain import chain_first_day
from calpipe.pipeline.nightly import DayProgress, RunSummary, record_run_facts, run_range
from calpipe.pipeline.reports import stream_summary
from calpipe.storage import EventSource

#: The bank demo: stream name, the base score column, and the shipped file (docs/ARCHITECTURE.md §3 columns).
BANK_STREAM = "bank-telemarketing"
BANK_SCORE = "score_rf1000"
DATA_DIR = paths.shipped("data")
BANK_FILE = DATA_DIR / "bank_marketing_scored.parquet"
#: The generated synthetic set: ``data/generated/`` (git-ignored) in a checkout, else beside the
#: demo database (an installed package's data folder is not the place for it).
GENERATED_FILE = (
    (DATA_DIR if paths.CHECKOUT else paths.DATA_HOME) / "generated" / "synthetic_streams.parquet"
)

#: The demo's daily partitions: the bank stream's first and last contact dates (docs/REFERENCE_DATA.md:
#: 2008-06-09 .. 2010-11-17); the synthetic streams end on the same day.
DEMO_FIRST_DAY = dt.date(2008, 6, 9)
DEMO_LAST_DAY = dt.date(2010, 11, 17)


def bank_events(path: Path = BANK_FILE) -> pl.DataFrame:
    """The bank stream in the data contract: ``event_time = event_date``, ``score = score_rf1000``."""
    bank = pl.read_parquet(path)
    return bank.select(
        pl.lit(BANK_STREAM).alias("stream"),
        "event_id",
        pl.col("event_date").cast(pl.Datetime("us")).alias("event_time"),
        pl.col(BANK_SCORE).alias("score"),
        pl.col("label").cast(pl.Int32),
    )


def demo_events(
    *, seed: int = generate.DEFAULT_SEED, generated: Path = GENERATED_FILE
) -> pl.DataFrame:
    """The demo set: the bank stream and the seeded synthetic streams (the synthetic set is also
    written to ``generated``, by default ``data/generated/`` in a checkout, git-ignored)."""
    synthetic = generate.generate(seed=seed)
    generated.parent.mkdir(parents=True, exist_ok=True)
    tmp = generated.with_suffix(".parquet.tmp")
    synthetic.write_parquet(tmp)
    tmp.replace(generated)
    return pl.concat([bank_events(), synthetic], how="vertical_relaxed")


@dataclass
class DemoResult:
    db: Path
    landing: Path
    run: RunSummary
    summary: pl.DataFrame


def demo(
    db: str | Path | None = None,
    *,
    generated: Path = GENERATED_FILE,
    log: Callable[[str], None] | None = None,
    progress: DayProgress | None = None,
) -> DemoResult:
    """``calpipe demo``: land the demo events (bank + synthetic) as daily Parquet folders in
    ``landing/`` next to the database, then run every daily partition in order from the first
    day (re-running the demo on the same database replaces every partition with identical rows).
    """
    db_path = Path(db or paths.DEFAULT_DB).expanduser().resolve()
    landing = db_path.parent / "landing"
    events = demo_events(generated=generated)
    storage.write_landing(events, landing)
    con = storage.connect(db_path)
    try:
        source = EventSource("landing", str(landing))
        first, last = source.date_range(con)  # type: ignore[misc]
        recorded = chain_first_day(con)
        if recorded is not None and recorded != first:
            raise StateError(
                f"{db_path} holds a chain starting on {recorded}, not the demo's {first}"
            )
        t0 = time.perf_counter()
        run = run_range(
            con, source, first, last, Settings(), first_day=first, log=log, progress=progress
        )
        storage.set_meta(con, last_day=last.isoformat())  # the rest: run_range's record
        record_run_facts(db_path, run, Settings().method, time.perf_counter() - t0, "calpipe demo")
        truth = generate.drift_table().select("stream", "drift_date")
        summary = stream_summary(con).join(truth, on="stream", how="left")
    finally:
        con.close()
    return DemoResult(db_path, landing, run, summary)
