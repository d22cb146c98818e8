"""The nightly step on Spark as dagster assets (``calpipe[spark]`` + ``dagster-pyspark``).

``spark_scores``, ``spark_state`` and ``spark_daily``: Parquet tables under one output folder,
partitioned by day, written by :func:`calpipe.spark.run_days` through dagster-pyspark's
``PySparkResource`` (the cluster's session: its ``spark_config`` is where a deployment sets its
master, executors and ``spark.executorEnv.NUMBA_CACHE_DIR``). One multi-asset, thin: it calls
``run_days`` for the run's partition range (a backfill runs its days in order in one run, each
from the state of the day before). Loaded by the code location only when ``CALPIPE_SPARK_OUT``
is set (``definitions.py``), so that a deployment without Spark never imports it.
"""

import datetime as dt
import os
import sys
from pathlib import Path

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    DailyPartitionsDefinition,
    MaterializeResult,
    TimeWindowPartitionMapping,
    multi_asset,
)
from dagster_pyspark import PySparkResource

from calpipe import spark as calpipe_spark

from .partitions import first_day_of, partition_range

GROUP = "calpipe_spark"


def spark_resource(master: str = "local[*]") -> PySparkResource:
    """The session of the Spark assets, set up as :func:`calpipe.spark.session` sets one up
    (UTC, dynamic partition overwrite, workers on this interpreter, the numba cache shared)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {
        "spark.master": master,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.ui.enabled": "false",
    }
    conf.update(calpipe_spark.executor_env())
    return PySparkResource(spark_config=conf)


def build_spark_assets(
    partitions_def: DailyPartitionsDefinition, events: str, out: str, params: dict
) -> list:
    """The Spark multi-asset over the landing folder ``events``, writing under ``out``;
    ``params``: :func:`calpipe.spark.protect_day`'s (method and its parameters)."""
    first_day = first_day_of(partitions_def)
    previous = TimeWindowPartitionMapping(start_offset=-1, end_offset=-1)

    @multi_asset(
        specs=[
            AssetSpec("spark_scores", group_name=GROUP, kinds={"spark", "parquet"},
                      description="Scored events with the protected probability and the running "
                      "log10 martingale (Parquet, partitioned by date)."),
            AssetSpec("spark_state", group_name=GROUP, kinds={"spark", "parquet"},
                      deps=[AssetDep("spark_state", partition_mapping=previous)],
                      description="Calibrator state of every stream at the end of the day."),
            AssetSpec("spark_daily", group_name=GROUP, kinds={"spark", "parquet"},
                      deps=["spark_scores"],
                      description="Per-stream forecast quality of the day (calibration_daily)."),
        ],
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
    )  # fmt: skip
    def spark_night(context: AssetExecutionContext, pyspark: PySparkResource):
        start, end = partition_range(context)
        session = pyspark.spark_session
        present = set(calpipe_spark.landing_days(events))

        def read(d: dt.date):
            path = f"{events}/date={d.isoformat()}"
            if d in present:
                return session.read.parquet(path)
            schema = session.read.parquet(f"{events}/date={min(present).isoformat()}").schema
            return session.createDataFrame([], schema)

        days = calpipe_spark.run_days(
            session, read, out, start, end, first_day=first_day, log=context.log.info, **params
        )
        for key in ("spark_scores", "spark_state", "spark_daily"):
            yield MaterializeResult(
                asset_key=key,
                metadata={"days": len(days), "path": str(Path(out) / key.removeprefix("spark_"))},
            )

    return [spark_night]
