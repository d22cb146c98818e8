"""``calibration_daily`` and ``calibration_arrivals``: monitoring of the run's days
(:func:`calpipe.pipeline.monitor_days`), with the day's metrics and plots as metadata."""

from dagster import AssetExecutionContext, AssetSpec, MaterializeResult, multi_asset
from dagster_duckdb import DuckDBResource

from calpipe import pipeline

from ...metadata import columns, plot_metadata, row_metadata, table
from ..partitions import daily, partition_range
from ..resources import CalpipeResource, calpipe_connection
from . import GROUP, POLICY


@multi_asset(
    specs=[
        AssetSpec("calibration_daily", metadata=columns("calibration_daily"), group_name=GROUP, kinds={"duckdb"},
                  deps=["protected_scores", "calibrator_state"],
                  description="Monitoring per stream and day: counts, base vs protected log "
                  "loss, Brier, ECE (10 bins), means, end-of-day and maximum log10 "
                  "martingale, alarm flag."),
        AssetSpec("calibration_arrivals", metadata=columns("calibration_arrivals"), group_name=GROUP, kinds={"duckdb"},
                  deps=["protected_scores", "calibrator_state", "event_labels"],
                  description="Monitoring by arrival: per stream and night, the forecasts "
                  "whose labels were learnt that night (however old), judged by them."),
    ],
    partitions_def=daily,
    backfill_policy=POLICY,
)  # fmt: skip
def calibration_daily(
    context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource
):
    start, end = partition_range(context)
    with calpipe_connection(duckdb) as con:
        res = pipeline.monitor_days(con, start, end)
        metadata = {
            **row_metadata(res.rows["calibration_daily"], start, end),
            "metrics": table(pipeline.day_report(con, start, end)),
        }
        metadata |= plot_metadata(con, calpipe.plots_folder(duckdb.database), start, end)
    context.log.info(
        f"calibration_daily {start}..{end}: {res.rows['calibration_daily']:,} stream-day rows; "
        f"calibration_arrivals: {res.rows['calibration_arrivals']:,}"
    )
    yield MaterializeResult(asset_key="calibration_daily", metadata=metadata)
    yield MaterializeResult(
        asset_key="calibration_arrivals",
        metadata=row_metadata(res.rows["calibration_arrivals"], start, end),
    )
