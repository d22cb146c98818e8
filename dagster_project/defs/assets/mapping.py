"""``calibration_map``: the serving map of every stream at the end of each of the run's days
(:func:`calpipe.pipeline.map_days`)."""

from dagster import AssetExecutionContext, MaterializeResult, asset
from dagster_duckdb import DuckDBResource

from calpipe import pipeline

from ...metadata import columns, row_metadata
from ..partitions import daily, partition_range
from ..resources import CalpipeResource, calpipe_connection
from . import GROUP, POLICY


@asset(
    partitions_def=daily, backfill_policy=POLICY, group_name=GROUP, kinds={"duckdb"},
    metadata=columns("calibration_map"), deps=["calibrator_state"],
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
    return MaterializeResult(metadata=row_metadata(res.rows["calibration_map"], start, end))
