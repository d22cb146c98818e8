"""``martingale_alarms``: the first crossings of the run's days
(:func:`calpipe.pipeline.alarm_days`), and the alarm check (a warning)."""

from dagster import AssetExecutionContext, MaterializeResult, asset
from dagster_duckdb import DuckDBResource

from calpipe import pipeline, storage

from ...metadata import columns, row_metadata, table
from ..checks import ALARM_CHECKS, to_result
from ..partitions import daily, partition_range
from ..resources import CalpipeResource, calpipe_connection
from . import GROUP, POLICY


@asset(
    partitions_def=daily, backfill_policy=POLICY, group_name=GROUP, kinds={"duckdb"},
    metadata=columns("martingale_alarms"),
    deps=["protected_scores", "calibrator_state"], check_specs=ALARM_CHECKS,
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
            **row_metadata(res.rows["martingale_alarms"], start, end),
            "new_alarms": res.rows["martingale_alarms"],
            "alarms": table(new),
        },
    )
    yield to_result(outcome, "martingale_alarms")
