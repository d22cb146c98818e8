"""The code location: ``defs``, configured from the environment (what ``calpipe ui`` sets).

============================  ===============================================================
variable                      meaning (default)
============================  ===============================================================
``CALPIPE_DB``                the DuckDB file (``<repo>/.calpipe/demo.duckdb``)
``CALPIPE_EVENTS``            landing folder / Parquet / table (``landing/`` next to the DB)
``CALPIPE_START_DATE``        the chain's first day (the demo's, 2008-06-09)
``CALPIPE_END_DATE``          last partition, or ``none`` for "up to yesterday" (the demo's)
``CALPIPE_SETTINGS``          calibrator as JSON (default: config.PIPELINE_DEFAULT_METHOD)
``CALPIPE_LABELS``            the label feed (none)
``CALPIPE_SPARK_OUT``         output folder of the Spark assets (none: no Spark assets)
``CALPIPE_SPARK_MASTER``      Spark master of their session (``local[*]``)
============================  ===============================================================
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from dagster import Definitions, in_process_executor
from dagster_duckdb import DuckDBResource

from calpipe import paths, pipeline, storage

from .assets import build_assets
from .partitions import daily_partitions
from .resources import CalpipeResource
from .schedules import build_nightly
from .sensors import build_landing_sensor, build_range_metadata_sensor


def build_definitions(
    db: str | Path,
    events: str,
    first_day: dt.date,
    last_day: dt.date | None = None,
    settings: pipeline.Settings | None = None,
    plots_dir: str = "",
    labels: str = "",
    spark_out: str = "",
    spark_master: str = "local[*]",
    columns: storage.ColumnMap | None = None,
) -> Definitions:
    """Definitions over one DuckDB file and one event source (tests build their own); with
    ``spark_out``, also the Spark assets (``dagster_project/spark_assets.py``) over the same
    landing folder, writing Parquet under ``spark_out``."""
    settings = settings or pipeline.Settings()
    partitions_def = daily_partitions(first_day, last_day)
    job, schedule = build_nightly()
    assets = build_assets(partitions_def)
    resources = {
        "duckdb": DuckDBResource(database=str(Path(db).expanduser().resolve())),
        "calpipe": CalpipeResource(
            events=events,
            settings_json=settings.to_json(),
            plots_dir=plots_dir,
            labels=labels,
            columns_json=(columns or storage.ColumnMap()).to_json(),
        ),
    }
    if spark_out:
        from .spark_assets import build_spark_assets, spark_resource

        params = {"method": settings.method, **settings.kwargs}
        assets += build_spark_assets(partitions_def, events, spark_out, params)
        resources["pyspark"] = spark_resource(spark_master)
    return Definitions(
        assets=assets,
        jobs=[job],
        schedules=[schedule],
        sensors=[build_landing_sensor(job, partitions_def), build_range_metadata_sensor()],
        resources=resources,
        # DuckDB allows one writing process per file: run the steps of a run in one process.
        executor=in_process_executor,
    )


def _env_date(name: str, default: dt.date | None) -> dt.date | None:
    value = os.environ.get(name)
    if value is None:
        return default
    return None if value.lower() == "none" else dt.date.fromisoformat(value)


def defs_from_env() -> Definitions:
    db = Path(os.environ.get("CALPIPE_DB", str(paths.DEFAULT_DB)))
    events = os.environ.get("CALPIPE_EVENTS", str(db.expanduser().resolve().parent / "landing"))
    first = _env_date("CALPIPE_START_DATE", pipeline.DEMO_FIRST_DAY)
    last = _env_date("CALPIPE_END_DATE", pipeline.DEMO_LAST_DAY)
    settings_json = os.environ.get("CALPIPE_SETTINGS")
    settings = (
        pipeline.Settings.from_json(settings_json, source="CALPIPE_SETTINGS")
        if settings_json
        else None
    )
    if first is None:
        raise ValueError("CALPIPE_START_DATE must be a date (the chain's first day), not none")
    labels = os.environ.get("CALPIPE_LABELS", "")
    columns_json = os.environ.get("CALPIPE_COLUMNS")
    columns = storage.ColumnMap.from_json(columns_json) if columns_json else None
    return build_definitions(
        db, events, first, last, settings, labels=labels, columns=columns,
        spark_out=os.environ.get("CALPIPE_SPARK_OUT", ""),
        spark_master=os.environ.get("CALPIPE_SPARK_MASTER", "local[*]"),
    )  # fmt: skip


defs = defs_from_env()
