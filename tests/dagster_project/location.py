"""The code location loaded as a deployment loads it, under an environment a test chooses.

The location reads its configuration (``CALPIPE_*``) when its ``defs/`` modules are imported:
the partitions are the graph's shape, the resources are built from the environment. A test that
needs another database, landing folder, chain or method sets the environment and loads the
modules afresh: :func:`load_fresh` drops them from ``sys.modules`` first, and :func:`location`
does it for a whole configuration, forgetting the modules again once loaded (so the next
import of the location sees the environment of its own time, not this test's).
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest
from dagster import Definitions, load_from_defs_folder

from calpipe import pipeline, storage
from calpipe.dagster_project import definitions

#: The package of the location's definitions (definitions.py loads the folder).
DEFS = "calpipe.dagster_project.defs"

#: Every variable the location reads (``defs/resources.py``, ``partitions.py``, ``spark.py``).
VARIABLES = ("CALPIPE_DB", "CALPIPE_EVENTS", "CALPIPE_START_DATE", "CALPIPE_END_DATE",
             "CALPIPE_SETTINGS", "CALPIPE_LABELS", "CALPIPE_COLUMNS", "CALPIPE_SPARK_OUT",
             "CALPIPE_SPARK_MASTER")  # fmt: skip


def forget() -> None:
    """Drop the ``defs/`` modules from ``sys.modules`` (the next load imports them again)."""
    for name in [m for m in sys.modules if m == DEFS or m.startswith(DEFS + ".")]:
        del sys.modules[name]


def load_fresh() -> Definitions:
    """The location's definitions under the current environment, its modules imported anew."""
    forget()
    return load_from_defs_folder(path_within_project=Path(definitions.__file__).parent)


def location(
    db: str | Path,
    events: str,
    first_day: dt.date | None,
    last_day: dt.date | None = None,
    settings: pipeline.Settings | None = None,
    labels: str = "",
    columns: storage.ColumnMap | None = None,
    spark_out: str = "",
    spark_master: str = "local[*]",
) -> Definitions:
    """The location over one DuckDB file and one event source, from ``first_day`` through
    ``last_day`` (None: up to yesterday; ``first_day`` None: the days of the data, as ``calpipe
    ui`` loads it, neither variable set); with ``spark_out``, the Spark assets too. Only this
    configuration counts (the caller's ``CALPIPE_*`` variables are set aside while loading);
    the modules are forgotten once loaded (the definitions keep what they need)."""
    env = {
        "CALPIPE_DB": str(db),
        "CALPIPE_EVENTS": events,
        "CALPIPE_START_DATE": None if first_day is None else first_day.isoformat(),
        "CALPIPE_END_DATE": (
            None if first_day is None else "none" if last_day is None else last_day.isoformat()
        ),
        "CALPIPE_SETTINGS": settings.to_json() if settings else None,
        "CALPIPE_LABELS": labels or None,
        "CALPIPE_COLUMNS": columns.to_json() if columns else None,
        "CALPIPE_SPARK_OUT": spark_out or None,
        "CALPIPE_SPARK_MASTER": spark_master,
    }
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in VARIABLES:
                if env[name] is None:
                    mp.delenv(name, raising=False)
                else:
                    mp.setenv(name, env[name])
            return load_fresh()
    finally:
        forget()
