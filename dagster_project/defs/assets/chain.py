"""``protected_scores`` and ``calibrator_state``: the chain of the run's days
(:func:`calpipe.pipeline.protect_days`), each day from the state of the day before, checked
right after the write (``../checks.py``)."""

from dagster import AssetDep, AssetExecutionContext, AssetSpec, MaterializeResult, multi_asset
from dagster_duckdb import DuckDBResource

from calpipe import pipeline

from ...metadata import columns, row_metadata, table
from ..checks import PROTECT_CHECKS, to_result
from ..partitions import FIRST_DAY, PREVIOUS_DAY, daily, partition_range
from ..resources import CalpipeResource, calpipe_connection
from . import GROUP, POLICY


@multi_asset(
    specs=[
        AssetSpec("protected_scores", metadata=columns("protected_scores"), deps=["scored_events", "event_labels"], group_name=GROUP,
                  kinds={"duckdb"},
                  description="Scored events with the protected probability and the running "
                  "log10 test martingale of their stream."),
        AssetSpec("calibrator_state", metadata=columns("calibrator_state"), group_name=GROUP, kinds={"duckdb"},
                  deps=[AssetDep("calibrator_state", partition_mapping=PREVIOUS_DAY),
                        "scored_events", "event_labels"],
                  description="Calibrator state of every stream at the end of the day; day d "
                  "resumes from day d - 1."),
    ],
    partitions_def=daily,
    backfill_policy=POLICY,
    check_specs=PROTECT_CHECKS,
)  # fmt: skip
def protect(context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource):
    start, end = partition_range(context)
    settings = calpipe.settings()
    with calpipe_connection(duckdb) as con:
        res = pipeline.protect_days(con, start, end, settings, first_day=FIRST_DAY)
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
            **row_metadata(res.rows["protected_scores"], start, end),
            "method": settings.method,
            "config_fingerprint": fingerprint,
            "metrics": table(report),
        },
    )
    yield MaterializeResult(
        asset_key="calibrator_state",
        metadata={
            **row_metadata(res.rows["calibrator_state"], start, end),
            "first_day": FIRST_DAY.isoformat(),
        },
    )
    for outcome, key in outcomes:
        yield to_result(outcome, key)
