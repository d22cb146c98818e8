"""The nightly job: the functions that the dagster assets and the ``calpipe`` CLI both call.

A day ``d`` flows through five stages, each one function that reads its inputs from the DuckDB
file and replaces its output partitions in one transaction (:mod:`calpipe.storage`):

=====================  ===========================================  ================================
stage                  writes                                       reads
=====================  ===========================================  ================================
:func:`load_events`    ``scored_events``, ``event_labels``,         the event source, the label
                       ``quarantined_labels``, ``pipeline_inputs``  feed (labels of day d)
:func:`protect_days`   ``protected_scores``, ``calibrator_state``,  ``scored_events`` and
                       ``pipeline_days``                            ``event_labels`` of d, the
                                                                    state of d - 1
:func:`monitor_days`   ``calibration_daily``,                       protected scores, state,
                       ``calibration_arrivals``                     labels arrived
:func:`alarm_days`     ``martingale_alarms``                        protected scores (event times
                                                                    from scored events), state
:func:`map_days`       ``calibration_map``                          the state rows of d
=====================  ===========================================  ================================

Every stage takes a range of days ``[start, end]`` (a single dagster partition is a range of one
day; a backfill is a longer one). :func:`protect_days` runs the days in order, one
:func:`calpipe.protect_with_state` call per day over all streams, carrying the state in memory;
the stages that write event-sized tables hold one day at a time and commit whole days, as many
as fit in :data:`calpipe.config.TRANSACTION_ROWS` events (at most
:data:`calpipe.config.CHUNK_DAYS`); the other stages are vectorized over chunks of
:data:`calpipe.config.CHUNK_DAYS` days. :func:`run_range` (the CLI's ``calpipe run``) writes
the same rows as the five stages, each day once from memory, and :func:`demo` is
``calpipe demo``. The table registry (:data:`TABLES`) lists every table with its stage and the
fused writer ``calpipe run`` uses.

The state of day d is keyed by d and stored for the streams whose state changed that day (those
with events): the state at the end of day d is each stream's latest row on or before d
(:func:`state_as_of`). Re-running day d reads the state at the end of d - 1 and replaces day d's
rows and state exactly. Running day d when d - 1 has no state (and d is not the chain's first
day) is a :class:`calpipe.errors.StateError`.

The modules, one concern each (every public name is re-exported here):

* ``settings``: :class:`Settings` (the chain's calibrator) and :class:`StageResult`;
* ``transactions``: transactions of whole days (:func:`day_range`, :func:`~calpipe.pipeline.transactions.write_days`);
* ``events``, ``chain``, ``monitoring``, ``alarms``, ``mapping``: the five stages, each with
  the function that computes its table's rows from memory, shared with the fused run;
* ``inputs``: what each day was computed from and which days to replay; ``labels``: the label
  feed (labels that land after their events); ``ids``: the event id type a database stores;
* ``tables``: the table registry; ``nightly``: :func:`run_range`; ``checks``: the data checks;
  ``reports``: metadata tables and plot frames; ``demo_job``: ``calpipe demo``.

Example
-------
>>> import tempfile, calpipe.generate as gen, calpipe.storage as storage
>>> from pathlib import Path
>>> tmp = Path(tempfile.mkdtemp())
>>> events = gen.generate(n_days=3, seed=7)
>>> _ = storage.write_landing(events, tmp / "landing")
>>> con = storage.connect(tmp / "db.duckdb")
>>> summary = run_range(con, storage.EventSource.parse(str(tmp / "landing")))
>>> summary.days, summary.events == events.height
(3, True)
>>> con.close()
"""

from __future__ import annotations

from calpipe.config import ECE_BINS, RELIABILITY_WINDOW_DAYS
from calpipe.night.monitoring import daily_metrics
from calpipe.night.settings import Settings
from calpipe.pipeline.alarms import alarm_days
from calpipe.pipeline.chain import chain_first_day, protect_days, state_as_of, state_before
from calpipe.pipeline.checks import (
    CheckOutcome,
    check_alarms,
    check_probabilities,
    check_row_counts,
    check_state_continuity,
)
from calpipe.pipeline.classes import stored_n_classes
from calpipe.pipeline.demo_job import (
    BANK_FILE,
    BANK_SCORE,
    BANK_STREAM,
    DATA_DIR,
    DEMO_FIRST_DAY,
    DEMO_LAST_DAY,
    GENERATED_FILE,
    DemoResult,
    bank_events,
    demo,
    demo_events,
)
from calpipe.pipeline.events import load_events, read_source_days
from calpipe.pipeline.html_report import html_report, write_report
from calpipe.pipeline.mapping import map_days, map_terms, map_weights, serving_map
from calpipe.pipeline.monitoring import monitor_days
from calpipe.pipeline.nightly import RunSummary, default_range, pending_range, run_range
from calpipe.pipeline.reports import (
    ASSET_TABLES,
    day_report,
    markdown_table,
    reliability_frame,
    stored_days,
    stream_summary,
    trajectory_frame,
)
from calpipe.pipeline.settings import StageResult
from calpipe.pipeline.tables import TABLES, OutputTable, table_schemas
from calpipe.pipeline.transactions import day_range

__all__ = [
    "ASSET_TABLES",
    "BANK_FILE",
    "BANK_SCORE",
    "BANK_STREAM",
    "DATA_DIR",
    "DEMO_FIRST_DAY",
    "DEMO_LAST_DAY",
    "ECE_BINS",
    "GENERATED_FILE",
    "RELIABILITY_WINDOW_DAYS",
    "TABLES",
    "CheckOutcome",
    "DemoResult",
    "OutputTable",
    "RunSummary",
    "Settings",
    "StageResult",
    "alarm_days",
    "bank_events",
    "chain_first_day",
    "check_alarms",
    "check_probabilities",
    "check_row_counts",
    "check_state_continuity",
    "daily_metrics",
    "day_range",
    "day_report",
    "default_range",
    "demo",
    "demo_events",
    "html_report",
    "load_events",
    "map_days",
    "map_terms",
    "map_weights",
    "markdown_table",
    "monitor_days",
    "pending_range",
    "protect_days",
    "read_source_days",
    "reliability_frame",
    "run_range",
    "serving_map",
    "state_as_of",
    "state_before",
    "stored_days",
    "stored_n_classes",
    "stream_summary",
    "table_schemas",
    "trajectory_frame",
    "write_report",
]
