"""The nightly job: read a night's inputs, compute every table's rows, write them.

:func:`run_range` is the nightly job: ``calpipe run`` calls it, and so does the dagster
``night`` asset for a partition or a range of them (one computation, many runners). Over days
``[start, end]`` it reads each day's events from the source once (and the label feed's
arrivals), protects them from the state at the end of the day before (carried in memory from
day to day: :class:`calpipe.night.chain.Chain`, the calibrator built once per run), and writes
the rows of every table of the registry (:data:`TABLES`: one function of :mod:`calpipe.night`
per table) in transactions of whole days (:mod:`calpipe.storage`); then it runs the data checks.
The tables a night writes:

=========================  ===================================================================
table                      rows
=========================  ===================================================================
``scored_events``          the day's events, validated against the data contract
``event_labels``,          the labels the feed brought that night, and those of unknown
``quarantined_labels``     events (parked, not dropped)
``protected_scores``       each event's base and protected probability and log10 martingale
``calibrator_state``       the state of the streams whose state changed that day
``pipeline_days``          the day: counts, method, configuration, the state's hash chain
``calibration_daily``      per stream: base vs protected log loss, Brier, ECE, martingale
``calibration_arrivals``   per stream: the forecasts judged by the labels learnt that night
``performance_estimates``  per stream: performance expected if calibrated, before labels
``martingale_alarms``      the first crossing of the alarm level per stream
``change_points``          change points per stream, after the first alarm too
``calibration_map``        the serving map of every stream at the end of the day
``pipeline_inputs``        the files (or table) each day was computed from
=========================  ===================================================================

The state of day d is keyed by d and stored for the streams whose state changed that day (those
with events or labels): the state at the end of day d is each stream's latest row on or before d
(:func:`state_as_of`). Re-running day d reads the state at the end of d - 1 and replaces day d's
rows and state exactly. Running day d when d - 1 has no state (and d is not the chain's first
day) is a :class:`calpipe.errors.StateError`.

The modules, one concern each (every public name is re-exported here):

* ``nightly``: :func:`run_range`, what it runs next (:func:`default_range`,
  :func:`pending_range`), its parts and spans; ``tables``: the table registry;
  ``transactions``: transactions of whole days (:func:`~calpipe.pipeline.transactions.transaction_end`);
* ``events``: reading a source's events; ``labels``: reading and checking the label feed;
  ``chain``: the stored chain (where a run resumes, :func:`state_before`); ``inputs``: what
  each day was computed from and which days to replay; ``classes``, ``ids``: the number of
  classes and the event id type a database stores;
* ``mapping``: the serving map's rows and :func:`serving_map`; ``checks``: the data checks;
  ``reports``: metadata tables and plot frames; ``html_report``; ``demo_job``: ``calpipe demo``.

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
from calpipe.night.mapping import map_terms, map_weights, serving_map
from calpipe.night.monitoring import daily_metrics
from calpipe.night.settings import Settings
from calpipe.pipeline.chain import chain_first_day, state_as_of, state_before
from calpipe.pipeline.checks import (
    CheckOutcome,
    check_alarms,
    check_change_points,
    check_estimates,
    check_probabilities,
    check_row_counts,
    check_state_continuity,
    data_checks,
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
from calpipe.pipeline.html_report import html_report, write_report
from calpipe.pipeline.nightly import (
    RunSummary,
    data_span,
    default_range,
    pending_range,
    record_run_facts,
    run_facts,
    run_range,
)
from calpipe.pipeline.reports import (
    ASSET_TABLES,
    day_report,
    markdown_table,
    reliability_frame,
    stored_days,
    stream_summary,
    trajectory_frame,
)
from calpipe.pipeline.tables import TABLES, OutputTable, table_schemas

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
    "bank_events",
    "chain_first_day",
    "check_alarms",
    "check_change_points",
    "check_estimates",
    "check_probabilities",
    "check_row_counts",
    "check_state_continuity",
    "daily_metrics",
    "data_checks",
    "data_span",
    "day_report",
    "default_range",
    "demo",
    "demo_events",
    "html_report",
    "map_terms",
    "map_weights",
    "markdown_table",
    "pending_range",
    "record_run_facts",
    "reliability_frame",
    "run_facts",
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
