"""Every table of the nightly pipeline, materialized together by one night computation.

The ``night`` multi-asset runs :func:`calpipe.pipeline.run_range` over its partition range, the
function behind ``calpipe run``: it reads the days' events (and the label feed's arrivals) from
the source, computes the rows of every table from memory and writes them in transactions of
whole days, then runs the data checks. So a partition materialized here and a day of
``calpipe run`` are the same computation, not two paths kept equal (``tests/test_golden_
tables.py`` holds the rows; ``tests/dagster_project/test_materialize.py`` the equality).

The specs keep the lineage a reader expects: ``scored_events`` + ``event_labels`` ->
``protected_scores`` + ``calibrator_state`` (the state of day d depends on its own day d - 1)
-> ``calibration_daily``, ``calibration_arrivals``, ``performance_estimates``,
``martingale_alarms``, ``change_points``, ``calibration_map``.
Each asset gets its own metadata (its rows, and what it is about), and each check its
partition's result (``../checks.py``): a range run's checks run over the range (a failure
names its day) and again on each day alone, reported on each partition.
"""

from dagster import AssetDep, AssetExecutionContext, AssetSpec, MaterializeResult, multi_asset
from dagster_duckdb import DuckDBResource

from calpipe import pipeline, storage

from ...metadata import columns, day_check_evaluations, plot_metadata, row_metadata, table
from ..checks import CHECKS, check_asset, to_result
from ..partitions import FIRST_DAY, PREVIOUS_DAY, daily, partition_range
from ..resources import CalpipeResource, calpipe_connection
from . import GROUP, POLICY


def _spec(name: str, deps: list, description: str) -> AssetSpec:
    return AssetSpec(
        name, deps=deps, description=description, metadata=columns(name), group_name=GROUP,
        kinds={"duckdb"},
    )  # fmt: skip


def _specs() -> list[AssetSpec]:
    """The tables the night writes, as assets, with their lineage (built in a function: the
    defs folder's loader would take a module-level spec for a second definition)."""
    return [
        _spec("scored_events", [], "Scored events of the day from the landing folder or table, "
              "validated against the data contract (docs/ARCHITECTURE.md §3) and stored in DuckDB."),
        _spec("event_labels", [], "Labels of the label feed that arrived that day (for the day's "
              "events or earlier ones), checked against the stored events."),
        _spec("protected_scores", ["scored_events", "event_labels"], "Scored events with the "
              "protected probability and the running log10 test martingale of their stream."),
        _spec("calibrator_state",
              [AssetDep("calibrator_state", partition_mapping=PREVIOUS_DAY), "scored_events",
               "event_labels"],
              "Calibrator state of every stream whose state changed that day; day d resumes from "
              "the state at the end of day d - 1."),
        _spec("calibration_daily", ["protected_scores", "calibrator_state"], "Monitoring per "
              "stream and day: counts, base vs protected log loss, Brier, ECE (10 bins), means, "
              "end-of-day and maximum log10 martingale, alarm flag."),
        _spec("calibration_arrivals", ["protected_scores", "calibrator_state", "event_labels"],
              "Monitoring by arrival: per stream and night, the forecasts whose labels were learnt "
              "that night (however old), judged by them."),
        _spec("performance_estimates", ["protected_scores"], "Performance per stream and night "
              "estimated from the forecasts alone, before any label: expected log loss, Brier "
              "score and accuracy if calibrated, with 90 % intervals, protected and base; the view "
              "v_performance_estimates sets the realized values beside them as labels arrive."),
        _spec("martingale_alarms", ["protected_scores", "calibrator_state"], "First crossing of "
              "log10 S >= 2 (S >= 100) per stream, with its date, event and value."),
        _spec("change_points", ["protected_scores", "calibrator_state", "event_labels"],
              "Change points per stream: a CUSUM e-detector over the labels in the order they "
              "are learnt (the protected forecast against the base, then against the map served "
              "after the last change point), restarted after each; mean labels to a false one "
              ">= 10^4. The view v_change_points adds the days each took to detect."),
        _spec("calibration_map", ["calibrator_state"], "Serving map of every stream at the end of "
              "the day (docs/ARCHITECTURE.md §4), as exact terms or step/linear tables (a stack in "
              "two layers); apply it in SQL with calibrate_score(stream, score)."),
    ]  # fmt: skip


@multi_asset(specs=_specs(), partitions_def=daily, backfill_policy=POLICY, check_specs=CHECKS)
def night(context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource):
    start, end = partition_range(context)
    settings, source, feed = calpipe.settings(), calpipe.source(), calpipe.label_feed()
    with calpipe_connection(duckdb) as con:
        run = pipeline.run_range(
            con, source, start, end, settings, first_day=FIRST_DAY, log=context.log.info,
            labels=feed, on_unknown_label=calpipe.on_unknown_label, raise_on_failed_check=False,
        )  # fmt: skip
        report = table(pipeline.day_report(con, start, end))
        alarms = storage.read_partitions(con, "martingale_alarms", start, end)
        plots = plot_metadata(con, calpipe.plots_folder(duckdb.database), start, end)
        # a range run's check results have no partition (dagster shows "Skipped" on each): each
        # day gets the same checks computed on that day alone
        per_day = {} if start == end else {
            d: pipeline.data_checks(con, d, d) for d in pipeline.stored_days(con, start, end)["date"]
        }  # fmt: skip
    rows = run.rows
    context.log.info(
        f"{start}..{end}: {rows['scored_events']:,} events protected by {settings.method} "
        f"({run.fingerprint}); {rows['martingale_alarms']} new alarm(s)"
        + (f": {', '.join(alarms['stream'].to_list()[:20])}" if alarms.height else "")
    )
    empty = [d.isoformat() for d in run.empty_days]
    extra = {
        # a nightly run on a day without events usually means a late landing
        "scored_events": {"days_without_events": len(empty),
                          "first_days_without_events": ", ".join(empty[:10]),
                          "source": source.describe()},
        "event_labels": {"quarantined": rows["quarantined_labels"],
                         "feed": feed.describe() if feed is not None else "none"},
        "protected_scores": {"method": settings.method, "config_fingerprint": run.fingerprint,
                             "metrics": report},
        "calibrator_state": {"first_day": FIRST_DAY.isoformat()},
        "calibration_daily": {"metrics": report, **plots},
        "martingale_alarms": {"new_alarms": rows["martingale_alarms"], "alarms": table(alarms)},
        "change_points": {"new_change_points": rows["change_points"]},
    }  # fmt: skip
    for name in pipeline.ASSET_TABLES:
        yield MaterializeResult(
            asset_key=name,
            metadata={**row_metadata(rows[name], start, end), **extra.get(name, {})},
        )
    for outcome in run.checks:  # (dagster requires a result of each check's output)
        yield to_result(outcome, check_asset(outcome.name))
    for d, outcomes in per_day.items():
        yield from day_check_evaluations(context.instance, d.isoformat(), outcomes)
