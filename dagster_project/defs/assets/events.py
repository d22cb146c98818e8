"""``scored_events`` and ``event_labels``: the day's scored events and the labels that arrived,
loaded together by :func:`calpipe.pipeline.load_events`."""

from dagster import AssetExecutionContext, AssetSpec, MaterializeResult, multi_asset
from dagster_duckdb import DuckDBResource

from calpipe import pipeline

from ...metadata import columns, row_metadata
from ..partitions import daily, partition_range
from ..resources import CalpipeResource, calpipe_connection
from . import GROUP, POLICY


@multi_asset(
    specs=[
        AssetSpec("scored_events", metadata=columns("scored_events"), group_name=GROUP, kinds={"duckdb"},
                  description="Scored events of the day from the landing folder or table, "
                  "validated against the data contract (docs/ARCHITECTURE.md §3) and stored "
                  "in DuckDB."),
        AssetSpec("event_labels", metadata=columns("event_labels"), group_name=GROUP, kinds={"duckdb"},
                  description="Labels of the label feed that arrived that day (for the "
                  "day's events or earlier ones), checked against the stored events."),
    ],
    partitions_def=daily,
    backfill_policy=POLICY,
)  # fmt: skip
def scored_events(context: AssetExecutionContext, duckdb: DuckDBResource, calpipe: CalpipeResource):
    start, end = partition_range(context)
    feed = calpipe.label_feed()
    with calpipe_connection(duckdb) as con:
        res = pipeline.load_events(
            con, calpipe.source(), start, end, feed, on_unknown_label=calpipe.on_unknown_label
        )
    context.log.info(
        f"scored_events {start}..{end}: {res.rows['scored_events']:,} events from "
        f"{calpipe.source().describe()}; {res.rows['event_labels']:,} labels arrived"
        + (f", {len(res.notes)} day(s) without events" if res.notes else "")
    )
    yield MaterializeResult(
        asset_key="scored_events",
        metadata={
            **row_metadata(res.rows["scored_events"], start, end),
            # a nightly run on a day without events usually means a late landing
            "days_without_events": len(res.notes),
            "first_days_without_events": ", ".join(res.notes[:10]),
            "source": calpipe.source().describe(),
        },
    )
    yield MaterializeResult(
        asset_key="event_labels",
        metadata={
            **row_metadata(res.rows["event_labels"], start, end),
            "quarantined": res.rows["quarantined_labels"],
            "feed": feed.describe() if feed is not None else "none",
        },
    )
