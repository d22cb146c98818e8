"""The assets of the nightly pipeline. Each one calls one function of :mod:`calpipe.pipeline`.

Lineage: ``scored_events`` + ``event_labels`` (the label feed's arrivals, loaded with the events)
-> ``protected_scores`` + ``calibrator_state`` (one engine call; the
state of day d depends on its own day d - 1) -> ``calibration_daily``, ``martingale_alarms``,
``calibration_map``. All are daily-partitioned and use ``BackfillPolicy.single_run()``: a backfill
over a range is one run, whose days the pipeline replays in order.
"""

import base64
import warnings
from pathlib import Path

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    TimeWindowPartitionMapping,
    asset,
    multi_asset,
)
from dagster_duckdb import DuckDBResource

from calpipe import config, pipeline, plots, storage

from .checks import alarm_checks, protect_checks, to_result
from .partitions import first_day_of, partition_range
from .resources import CalpipeResource, calpipe_connection

GROUP = "calpipe"

#: The state of day d is computed from the state of day d - 1 (and only that day).
PREVIOUS_DAY = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)


def _table(df) -> MetadataValue:
    """A polars frame as dagster table metadata (typed columns the UI shows whole, unlike a
    markdown table cut at the panel's width); floats rounded to 6 digits for reading."""
    kinds = {"Int": "int", "UInt": "int", "Float": "float", "Boolean": "bool"}

    def kind(dtype) -> str:
        name = type(dtype).__name__
        return next((v for k, v in kinds.items() if name.startswith(k)), "string")

    cols = [TableColumn(c, kind(t)) for c, t in df.schema.items()]

    def value(v):
        if isinstance(v, float):
            return round(v, 6)
        return v if isinstance(v, int | bool | str) or v is None else str(v)

    records = [
        TableRecord({k: value(v) for k, v in row.items()}) for row in df.iter_rows(named=True)
    ]
    return MetadataValue.table(records, TableSchema(cols))


def _columns(table: str) -> dict:
    """The table's columns and types as the asset's ``dagster/column_schema`` (the UI's
    Columns panel), read from the SQL layer (:func:`calpipe.pipeline.table_schemas`)."""
    cols = [TableColumn(name, dtype) for name, dtype in pipeline.table_schemas()[table]]
    return {"dagster/column_schema": TableSchema(cols), "duckdb_table": table}


def _row_metadata(rows: int, start, end) -> dict:
    """Row counts: ``dagster/row_count`` when the run is one partition (the UI shows it as the
    partition's size); a range run says its total is the run's, since dagster copies a range
    run's metadata onto every partition of the range."""
    if start == end:
        return {"dagster/row_count": rows}
    return {"rows_in_run": rows, "partitions_in_run": (end - start).days + 1}


def _png_md(png: bytes, alt: str) -> MetadataValue:
    """A PNG embedded in markdown metadata (the dagster UI renders data: images)."""
    return MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


EMBED_PLOTS_MAX_DAYS = config.EMBED_PLOTS_MAX_DAYS  # why: see calpipe/config.py


def _plot_metadata(con, duckdb: DuckDBResource, calpipe: CalpipeResource, start, end) -> dict:
    """Martingale trajectory and reliability diagram up to ``end``: PNG files, embedded in the
    metadata for a single-day run."""
    folder = (
        Path(calpipe.plots_dir) if calpipe.plots_dir else Path(duckdb.database).parent / "plots"
    )
    out = {}
    figures = {
        "martingale_trajectory": plots.martingale_trajectory(pipeline.trajectory_frame(con, end)),
        "reliability_diagram": plots.reliability_diagram(
            pipeline.reliability_frame(con, end),
            title=f"Reliability, {pipeline.RELIABILITY_WINDOW_DAYS} days to {end}",
        ),
    }
    for name, fig in figures.items():
        png = plots.to_png(fig)
        path = folder / name / f"{end.isoformat()}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        if (end - start).days + 1 <= EMBED_PLOTS_MAX_DAYS:
            out[name] = _png_md(png, name)
        out[f"{name}_file"] = MetadataValue.path(str(path))
    return out


def build_assets(partitions_def: DailyPartitionsDefinition) -> list:
    """The asset definitions over ``partitions_def`` (its first day starts the chain)."""
    # backfill_policy is flagged beta; single-run backfills are what we want, so say it once here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=BetaWarning, message=".*backfill_policy")
        return _build_assets(partitions_def)


def _build_assets(partitions_def: DailyPartitionsDefinition) -> list:
    policy = BackfillPolicy.single_run()
    first_day = first_day_of(partitions_def)

    @multi_asset(
        specs=[
            AssetSpec("scored_events", metadata=_columns("scored_events"), group_name=GROUP, kinds={"duckdb"},
                      description="Scored events of the day from the landing folder or table, "
                      "validated against the data contract (docs/ARCHITECTURE.md §3) and stored "
                      "in DuckDB."),
            AssetSpec("event_labels", metadata=_columns("event_labels"), group_name=GROUP, kinds={"duckdb"},
                      description="Labels of the label feed that arrived that day (for the "
                      "day's events or earlier ones), checked against the stored events."),
        ],
        partitions_def=partitions_def,
        backfill_policy=policy,
    )  # fmt: skip
    def scored_events(
        context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource
    ):
        start, end = partition_range(context)
        feed = calpipe.label_feed()
        with calpipe_connection(duckdb) as con:
            res = pipeline.load_events(
                con, calpipe.source(), start, end, feed,
                on_unknown_label=calpipe.on_unknown_label,
            )  # fmt: skip
        context.log.info(
            f"scored_events {start}..{end}: {res.rows['scored_events']:,} events from "
            f"{calpipe.source().describe()}; {res.rows['event_labels']:,} labels arrived"
            + (f", {len(res.notes)} day(s) without events" if res.notes else "")
        )
        yield MaterializeResult(
            asset_key="scored_events",
            metadata={
                **_row_metadata(res.rows["scored_events"], start, end),
                # a nightly run on a day without events usually means a late landing
                "days_without_events": len(res.notes),
                "first_days_without_events": ", ".join(res.notes[:10]),
                "source": calpipe.source().describe(),
            },
        )
        yield MaterializeResult(
            asset_key="event_labels",
            metadata={
                **_row_metadata(res.rows["event_labels"], start, end),
                "quarantined": res.rows["quarantined_labels"],
                "feed": feed.describe() if feed is not None else "none",
            },
        )

    @multi_asset(
        specs=[
            AssetSpec("protected_scores", metadata=_columns("protected_scores"), deps=["scored_events", "event_labels"], group_name=GROUP,
                      kinds={"duckdb"},
                      description="Scored events with the protected probability and the running "
                      "log10 test martingale of their stream."),
            AssetSpec("calibrator_state", metadata=_columns("calibrator_state"), group_name=GROUP, kinds={"duckdb"},
                      deps=[AssetDep("calibrator_state", partition_mapping=PREVIOUS_DAY),
                            "scored_events", "event_labels"],
                      description="Calibrator state of every stream at the end of the day; day d "
                      "resumes from day d - 1."),
        ],
        partitions_def=partitions_def,
        backfill_policy=policy,
        check_specs=protect_checks(partitions_def),
    )  # fmt: skip
    def protect(context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource):
        start, end = partition_range(context)
        settings = calpipe.settings()
        with calpipe_connection(duckdb) as con:
            res = pipeline.protect_days(con, start, end, settings, first_day=first_day)
            fingerprint = settings.fingerprint_for(pipeline.stored_n_classes(con) or 2)
            report = pipeline.day_report(con, start, end)
            outcomes = [
                (pipeline.check_probabilities(con, start, end), "protected_scores"),
                (pipeline.check_row_counts(con, start, end), "protected_scores"),
                (pipeline.check_state_continuity(con, start, end), "calibrator_state"),
            ]
        context.log.info(
            f"protected_scores {start}..{end}: {res.rows['protected_scores']:,} events protected "
            f"by {settings.method} ({fingerprint}); calibrator_state: "
            f"{res.rows['calibrator_state']:,} stream-day rows"
        )
        yield MaterializeResult(
            asset_key="protected_scores",
            metadata={
                **_row_metadata(res.rows["protected_scores"], start, end),
                "method": settings.method,
                "config_fingerprint": fingerprint,
                "metrics": _table(report),
            },
        )
        yield MaterializeResult(
            asset_key="calibrator_state",
            metadata={
                **_row_metadata(res.rows["calibrator_state"], start, end),
                "first_day": first_day.isoformat(),
            },
        )
        for outcome, key in outcomes:
            yield to_result(outcome, key)

    @multi_asset(
        specs=[
            AssetSpec("calibration_daily", metadata=_columns("calibration_daily"), group_name=GROUP, kinds={"duckdb"},
                      deps=["protected_scores", "calibrator_state"],
                      description="Monitoring per stream and day: counts, base vs protected log "
                      "loss, Brier, ECE (10 bins), means, end-of-day and maximum log10 "
                      "martingale, alarm flag."),
            AssetSpec("calibration_arrivals", metadata=_columns("calibration_arrivals"), group_name=GROUP, kinds={"duckdb"},
                      deps=["protected_scores", "calibrator_state", "event_labels"],
                      description="Monitoring by arrival: per stream and night, the forecasts "
                      "whose labels were learnt that night (however old), judged by them."),
        ],
        partitions_def=partitions_def,
        backfill_policy=policy,
    )  # fmt: skip
    def calibration_daily(
        context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource
    ):
        start, end = partition_range(context)
        with calpipe_connection(duckdb) as con:
            res = pipeline.monitor_days(con, start, end)
            metadata = {
                **_row_metadata(res.rows["calibration_daily"], start, end),
                "metrics": _table(pipeline.day_report(con, start, end)),
            }
            metadata |= _plot_metadata(con, duckdb, calpipe, start, end)
        context.log.info(
            f"calibration_daily {start}..{end}: {res.rows['calibration_daily']:,} stream-day rows; "
            f"calibration_arrivals: {res.rows['calibration_arrivals']:,}"
        )
        yield MaterializeResult(asset_key="calibration_daily", metadata=metadata)
        yield MaterializeResult(
            asset_key="calibration_arrivals",
            metadata=_row_metadata(res.rows["calibration_arrivals"], start, end),
        )

    @asset(
        partitions_def=partitions_def, backfill_policy=policy, group_name=GROUP, kinds={"duckdb"},
        metadata=_columns("martingale_alarms"),
        deps=["protected_scores", "calibrator_state"], check_specs=alarm_checks(partitions_def),
        description="First crossing of log10 S >= 2 (S >= 100) per stream, with its date, event "
        "and value.",
    )  # fmt: skip
    def martingale_alarms(
        context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource
    ):
        start, end = partition_range(context)
        with calpipe_connection(duckdb) as con:
            res = pipeline.alarm_days(con, start, end)
            new = storage.read_partitions(con, "martingale_alarms", start, end)
            outcome = pipeline.check_alarms(con, start, end)
        context.log.info(
            f"martingale_alarms {start}..{end}: {res.rows['martingale_alarms']} new alarm(s)"
            + (f": {', '.join(new['stream'].to_list()[:20])}" if new.height else "")
        )
        yield MaterializeResult(
            asset_key="martingale_alarms",
            metadata={
                **_row_metadata(res.rows["martingale_alarms"], start, end),
                "new_alarms": res.rows["martingale_alarms"],
                "alarms": _table(new),
            },
        )
        yield to_result(outcome, "martingale_alarms")

    @asset(
        partitions_def=partitions_def, backfill_policy=policy, group_name=GROUP, kinds={"duckdb"},
        metadata=_columns("calibration_map"), deps=["calibrator_state"],
        description="Serving map of every stream at the end of the day (docs/ARCHITECTURE.md §4), as exact "
        "terms or step/linear tables (a stack in two layers); apply it in SQL with "
        "calibrate_score(stream, score).",
    )  # fmt: skip
    def calibration_map(
        context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource
    ) -> MaterializeResult:
        start, end = partition_range(context)
        with calpipe_connection(duckdb) as con:
            res = pipeline.map_days(con, start, end, calpipe.settings())
        context.log.info(
            f"calibration_map {start}..{end}: {res.rows['calibration_map']:,} rows "
            "(calibrate_score(stream, score) serves them in SQL)"
        )
        return MaterializeResult(metadata=_row_metadata(res.rows["calibration_map"], start, end))

    return [scored_events, protect, calibration_daily, martingale_alarms, calibration_map]
