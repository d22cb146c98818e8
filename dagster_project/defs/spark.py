"""The nightly run on Spark as dagster assets (``calpipe[spark]`` + ``dagster-pyspark``).

``spark_<table>`` for every table ``calpipe spark-run`` writes (``calpipe run``'s but
``pipeline_inputs``) and ``spark_state``: Parquet tables under one output folder, partitioned
by night, written by :func:`calpipe.spark_run.run_days` through dagster-pyspark's
``PySparkResource`` (the cluster's session: its ``spark_config`` is where a deployment sets its
master, executors and ``spark.executorEnv.NUMBA_CACHE_DIR``). One multi-asset, thin: it calls
``run_days`` for the run's partition range (a backfill runs its nights in order in one run, each
from the state of the night before) over the ``calpipe`` resource's landing folder and label
feed, with its method, writing under the ``spark_output`` resource's folder.

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
from calpipe import spark_run as calpipe_spark_run

from .partitions import FIRST_DAY, PREVIOUS_DAY, daily, partition_range
from .resources import CalpipeResource

GROUP = "calpipe_spark"


class SparkOutputResource(ConfigurableResource):
    """Where the Spark assets write (``CALPIPE_SPARK_OUT``)."""

    folder: str = Field(
        description="output folder of the Spark assets: a folder per table and state/ "
        "(Parquet, partitioned by night)"
    )


def _specs() -> list[AssetSpec]:
    """One spec per table of the Spark night, and the state carried from night to night."""
    specs = [
        AssetSpec(f"spark_{t}", group_name=GROUP, kinds={"spark", "parquet"},
                  deps=["spark_state"], description=f"calpipe run's {t}, computed on Spark "
                  "(Parquet, partitioned by night).")
        for t in calpipe_spark_run.SPARK_TABLES
    ]  # fmt: skip
    state = AssetSpec(
        "spark_state", group_name=GROUP, kinds={"spark", "parquet"},
        deps=[AssetDep("spark_state", partition_mapping=PREVIOUS_DAY)],
        description="Calibrator state of every stream at the end of the night.",
    )  # fmt: skip
    return [state, *specs]


@multi_asset(specs=_specs(), partitions_def=daily, backfill_policy=BackfillPolicy.single_run())
def spark_night(
    context: AssetExecutionContext,
    calpipe: CalpipeResource,
    spark_output: SparkOutputResource,
    pyspark: ResourceParam[Any],  # dagster_pyspark.PySparkResource (imported only when on)
):
    start, end = partition_range(context)
    session = pyspark.spark_session
    events, out = calpipe.events, spark_output.folder
    present = set(calpipe_spark_run.landing_days(events))

    def read(d: dt.date):
        path = f"{events}/date={d.isoformat()}"
        if d in present:
            return session.read.parquet(path)
        schema = session.read.parquet(f"{events}/date={min(present).isoformat()}").schema
        return session.createDataFrame([], schema)

    days = calpipe_spark_run.run_days(
        session, read, out, start, end, settings=calpipe.settings(),
        labels=calpipe.labels or None, on_unknown_label=calpipe.on_unknown_label,
        first_day=FIRST_DAY, source=events, log=context.log.info,
    )  # fmt: skip
    for spec in _specs():
        name = spec.key.path[-1]
        yield MaterializeResult(
            asset_key=name,
            metadata={"days": len(days), "path": str(Path(out) / name.removeprefix("spark_"))},
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
