"""How the assets describe what they wrote: dagster metadata from calpipe's frames and counts.

Not definitions (``defs/`` holds those): the helpers the assets share, formatting only.
"""

from __future__ import annotations

import base64
from pathlib import Path

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

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
