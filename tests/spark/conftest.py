"""Fixtures of the Spark tests: ``spark_cluster``, a standalone cluster on 127.0.0.1
(:mod:`tests.spark.cluster`), one per test module that asks for it (stopped when the module's
tests are done: no idle JVMs through the rest of the suite)."""

from __future__ import annotations

import pytest

from tests.spark.cluster import Cluster, standalone_cluster


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory) -> Cluster:
    """A master and two workers (1 core, 1 GB of executor memory each) on 127.0.0.1; the stop
    leaves none of their processes (executors, Python workers, marked drivers) behind."""
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster
    left = cluster.survivors()
    assert not left, f"processes of the Spark cluster left running: {left}"
