"""The nightly step on Spark as dagster assets (``calpipe[spark]`` + ``dagster-pyspark``).

``spark_scores``, ``spark_state`` and ``spark_daily``: Parquet tables under one output folder,
partitioned by day, written by :func:`calpipe.spark.run_days` through dagster-pyspark's
``PySparkResource`` (the cluster's session: its ``spark_config`` is where a deployment sets its
master, executors and ``spark.executorEnv.NUMBA_CACHE_DIR``). One multi-asset, thin: it calls
``run_days`` for the run's partition range (a backfill runs its days in order in one run, each
from the state of the day before) over the ``calpipe`` resource's landing folder, with its
method, writing under the ``spark_output`` resource's folder.

Present only when ``CALPIPE_SPARK_OUT`` names that folder (``CALPIPE_SPARK_MASTER``: the
session's master, ``local[*]``): this module's definitions are then the ``defs`` below, and
otherwise empty, so that a deployment without Spark never imports pyspark or dagster-pyspark.
"""

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    ConfigurableResource,
    Definitions,
    MaterializeResult,
    ResourceParam,
    multi_asset,
)
from pydantic import Field

from calpipe import spark as calpipe_spark

from .partitions import FIRST_DAY, PREVIOUS_DAY, daily, partition_range
from .resources import CalpipeResource

GROUP = "calpipe_spark"


class SparkOutputResource(ConfigurableResource):
    """Where the Spark assets write (``CALPIPE_SPARK_OUT``)."""

    folder: str = Field(
        description="output folder of the Spark assets: out/scores, out/state, out/daily "
        "(Parquet, partitioned by date)"
    )


@multi_asset(
    specs=[
        AssetSpec("spark_scores", group_name=GROUP, kinds={"spark", "parquet"},
                  description="Scored events with the protected probability and the running "
                  "log10 martingale (Parquet, partitioned by date)."),
        AssetSpec("spark_state", group_name=GROUP, kinds={"spark", "parquet"},
                  deps=[AssetDep("spark_state", partition_mapping=PREVIOUS_DAY)],
                  description="Calibrator state of every stream at the end of the day."),
        AssetSpec("spark_daily", group_name=GROUP, kinds={"spark", "parquet"},
                  deps=["spark_scores"],
                  description="Per-stream forecast quality of the day (calibration_daily)."),
    ],
    partitions_def=daily,
    backfill_policy=BackfillPolicy.single_run(),
)  # fmt: skip
def spark_night(
    context: AssetExecutionContext,
    calpipe: CalpipeResource,
    spark_output: SparkOutputResource,
    pyspark: ResourceParam[Any],  # dagster_pyspark.PySparkResource (imported only when on)
):
    start, end = partition_range(context)
    session = pyspark.spark_session
    events, out = calpipe.events, spark_output.folder
    settings = calpipe.settings()
    present = set(calpipe_spark.landing_days(events))

    def read(d: dt.date):
        path = f"{events}/date={d.isoformat()}"
        if d in present:
            return session.read.parquet(path)
        schema = session.read.parquet(f"{events}/date={min(present).isoformat()}").schema
        return session.createDataFrame([], schema)

    days = calpipe_spark.run_days(
        session, read, out, start, end, first_day=FIRST_DAY, log=context.log.info,
        method=settings.method, **settings.kwargs,
    )  # fmt: skip
    for key in ("spark_scores", "spark_state", "spark_daily"):
        yield MaterializeResult(
            asset_key=key,
            metadata={"days": len(days), "path": str(Path(out) / key.removeprefix("spark_"))},
        )


def pyspark_resource(master: str = "local[*]"):
    """The session of the Spark assets, set up as :func:`calpipe.spark.session` sets one up
    (UTC, dynamic partition overwrite, workers on this interpreter, the numba cache shared)."""
    from dagster_pyspark import PySparkResource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {
        "spark.master": master,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.ui.enabled": "false",
    }
    conf.update(calpipe_spark.executor_env())
    return PySparkResource(spark_config=conf)


#: The Spark output folder; the Spark assets exist only when it is set.
SPARK_OUT = os.environ.get("CALPIPE_SPARK_OUT", "")

defs = (
    Definitions(
        assets=[spark_night],
        resources={
            "spark_output": SparkOutputResource(folder=SPARK_OUT),
            "pyspark": pyspark_resource(os.environ.get("CALPIPE_SPARK_MASTER", "local[*]")),
        },
    )
    if SPARK_OUT
    else Definitions()
)
