"""How the assets describe what they wrote: dagster metadata from calpipe's frames and counts.

Not definitions (``defs/`` holds those): the helpers the assets, the sensors and the sync share
(formatting, and the check results of a day aimed at its materializations).
"""

from __future__ import annotations

import base64
from pathlib import Path

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

# private: dagster exports no other way to aim a reported check result at a materialization
# (the reason: tests/test_architecture.py::ALLOWED_PRIVATE)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from calpipe import pipeline, plots

#: Plots are embedded in the metadata only when a run covers at most this many days: dagster
#: copies a range run's metadata onto every partition, and a 900-day backfill would store 900
#: copies of each PNG in the event log. Longer runs get the file paths only.
EMBED_PLOTS_MAX_DAYS: int = 1


def table(df) -> MetadataValue:
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


def columns(table_name: str) -> dict:
    """The table's columns and types as the asset's ``dagster/column_schema`` (the UI's
    Columns panel), read from the SQL layer (:func:`calpipe.pipeline.table_schemas`)."""
    cols = [TableColumn(name, dtype) for name, dtype in pipeline.table_schemas()[table_name]]
    return {"dagster/column_schema": TableSchema(cols), "duckdb_table": table_name}


def row_metadata(rows: int, start, end) -> dict:
    """Row counts: ``dagster/row_count`` when the run is one partition (the UI shows it as the
    partition's size); a range run says its total is the run's, since dagster copies a range
    run's metadata onto every partition of the range."""
    if start == end:
        return {"dagster/row_count": rows}
    return {"rows_in_run": rows, "partitions_in_run": (end - start).days + 1}


def _png_md(png: bytes, alt: str) -> MetadataValue:
    """A PNG embedded in markdown metadata (the dagster UI renders data: images)."""
    return MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


def plot_metadata(con, folder: Path, start, end) -> dict:
    """Martingale trajectory and reliability diagram up to ``end``: PNG files under ``folder``,
    embedded in the metadata for a single-day run."""
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


#: The asset of each data check of :func:`calpipe.pipeline.data_checks` (its spec is in
#: ``defs/checks.py``; the sync reports its results without loading the definitions).
CHECK_ASSETS: dict[str, str] = {
    "probabilities_valid": "protected_scores",
    "rows_in_equal_rows_out": "protected_scores",
    "estimates_valid": "performance_estimates",
    "change_points_valid": "change_points",
    "state_continuity": "calibrator_state",
    "no_martingale_alarm": "martingale_alarms",
}


def check_metadata(outcome: pipeline.CheckOutcome) -> dict:
    """A check outcome's numbers, its summary and its first offending rows, as metadata."""
    metadata = {"summary": MetadataValue.text(outcome.description)}
    metadata.update({k: MetadataValue.int(int(v)) if float(v).is_integer()
                     else MetadataValue.float(float(v)) for k, v in outcome.values.items()})  # fmt: skip
    if outcome.details is not None and outcome.details.height:
        metadata["details"] = MetadataValue.md(pipeline.markdown_table(outcome.details.head(20)))
    return metadata


def check_severity(outcome: pipeline.CheckOutcome) -> AssetCheckSeverity:
    return AssetCheckSeverity.WARN if outcome.warning else AssetCheckSeverity.ERROR


#: Materializations read back per request when finding each partition's latest one.
PAGE = 10_000


def latest_materializations(instance: DagsterInstance, assets) -> dict[tuple[str, str], object]:
    """(asset, partition) -> the record of the partition's latest materialization, for every
    partition of ``assets`` (a few paged reads instead of one query per day and check)."""
    out: dict[tuple[str, str], object] = {}
    for asset in assets:
        cursor = None
        while True:
            res = instance.fetch_materializations(AssetKey(asset), limit=PAGE, cursor=cursor)
            for rec in res.records:  # newest first: the first seen of a partition is its latest
                key = (asset, rec.partition_key)
                if rec.partition_key is not None and key not in out:
                    out[key] = rec
            if not res.has_more:
                break
            cursor = res.cursor
    return out


def day_check_evaluations(
    instance: DagsterInstance, day: str, outcomes: list[pipeline.CheckOutcome], latest=None
) -> list[AssetCheckEvaluation]:
    """The evaluations of the checks of partition ``day`` (``outcomes``: :func:`calpipe.pipeline
    .data_checks` of that day alone), each aimed at its asset's latest materialization of the
    day (from ``latest``, :func:`latest_materializations`, or read here): dagster shows a
    partition's check result only while it targets the partition's latest materialization (a
    result without a partition, as a range run's, shows on no partition)."""
    out = []
    for outcome in outcomes:
        asset = CHECK_ASSETS[outcome.name]
        if latest is not None:
            rec = latest.get((asset, day))
        else:
            recs = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[day]), limit=1
            ).records
            rec = recs[0] if recs else None
        target = None
        if rec is not None:
            target = AssetCheckEvaluationTargetMaterializationData(
                storage_id=rec.storage_id, run_id=rec.run_id, timestamp=rec.timestamp
            )
        out.append(AssetCheckEvaluation(
            asset_key=AssetKey(asset), check_name=outcome.name, passed=outcome.passed,
            metadata=check_metadata(outcome), target_materialization_data=target,
            severity=check_severity(outcome), description=outcome.description, partition=day,
        ))  # fmt: skip
    return out
