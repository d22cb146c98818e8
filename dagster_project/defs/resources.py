"""Resources: the DuckDB file (``dagster_duckdb.DuckDBResource``) and calpipe's job settings,
both configured from the environment (what ``calpipe ui`` sets), and the executor.

============================  ===============================================================
variable                      meaning (default)
============================  ===============================================================
``CALPIPE_DB``                the DuckDB file (``<repo>/.calpipe/demo.duckdb``)
``CALPIPE_EVENTS``            landing folder / Parquet / table (``landing/`` next to the DB)
``CALPIPE_SETTINGS``          calibrator as JSON (default: config.PIPELINE_DEFAULT_METHOD)
``CALPIPE_LABELS``            the label feed (none)
``CALPIPE_COLUMNS``           the data-contract columns' names in the source, as JSON
============================  ===============================================================

(The partitions span the days of this database and its sources, unless ``CALPIPE_START_DATE``
and ``CALPIPE_END_DATE`` say otherwise: ``partitions.py``; the Spark assets read
``CALPIPE_SPARK_OUT`` and ``CALPIPE_SPARK_MASTER``: ``spark.py``.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource, Definitions, in_process_executor
from dagster_duckdb import DuckDBResource
from pydantic import Field

from calpipe import paths, storage
from calpipe.pipeline import Settings
from calpipe.pipeline.labels import label_source


class CalpipeResource(ConfigurableResource):
    """Where the scored events land and which calibrator the chain runs."""

    events: str = Field(
        description="Parquet landing folder (date=YYYY-MM-DD/ sub-folders), Parquet file/glob, "
        "or a DuckDB table name in the calpipe database"
    )
    settings_json: str = Field(
        default=Settings().to_json(),
        description='calibrator as JSON: {"method": ..., "params": {...}} (calpipe methods)',
    )
    plots_dir: str = Field(default="", description="folder for the PNG plots ('' = next to the DB)")
    labels: str = Field(
        default="",
        description="label feed: labels that land after their events (landing folder with "
        "date=YYYY-MM-DD/ = the arrival day, Parquet file/glob, or table); '' = none",
    )
    on_unknown_label: str = Field(
        default="error",
        description="a label of an unknown event: 'error' (fail the partition) or 'quarantine' "
        "(park it in quarantined_labels)",
    )

    columns_json: str = Field(
        default=storage.ColumnMap().to_json(),
        description="names of the data-contract columns in the source, as JSON: stream "
        "(null = one stream), event_id, event_time, score, label (calpipe run --stream-col ...)",
    )

    @classmethod
    def from_env(cls, db: Path) -> CalpipeResource:
        """The resource of the chain the environment describes over the database ``db``
        (the events default to ``landing/`` beside it); a malformed ``CALPIPE_SETTINGS`` or
        ``CALPIPE_COLUMNS`` is an error naming the variable."""
        settings_json = os.environ.get("CALPIPE_SETTINGS")
        settings = (
            Settings.from_json(settings_json, source="CALPIPE_SETTINGS")
            if settings_json
            else Settings()
        )
        columns_json = os.environ.get("CALPIPE_COLUMNS")
        columns = storage.ColumnMap.from_json(columns_json) if columns_json else storage.ColumnMap()
        return cls(
            events=os.environ.get("CALPIPE_EVENTS", str(db.parent / "landing")),
            settings_json=settings.to_json(),
            labels=os.environ.get("CALPIPE_LABELS", ""),
            columns_json=columns.to_json(),
        )

    def source(self) -> storage.EventSource:
        return storage.EventSource.parse(
            self.events, storage.ColumnMap.from_json(self.columns_json)
        )

    def label_feed(self) -> storage.EventSource | None:
        return label_source(self.labels) if self.labels else None

    def settings(self) -> Settings:
        return Settings.from_json(self.settings_json)

    def plots_folder(self, db: str) -> Path:
        """Where the PNG plots go: ``plots_dir``, or ``plots/`` beside the database ``db``."""
        return Path(self.plots_dir) if self.plots_dir else Path(db).parent / "plots"


@contextmanager
def calpipe_connection(duckdb: DuckDBResource) -> Iterator:
    """A connection of the DuckDB resource with calpipe's SQL layer installed.

    Closed here even when the step fails: ``DuckDBResource.get_connection`` closes only on
    success, and a connection left open keeps the file locked for the rest of the process.
    """
    with duckdb.get_connection() as con:
        try:
            storage.configure_session(con)
            storage.install_sql(con)
            yield con
        finally:
            con.close()


#: The calpipe database (absolute: the code server's working directory is not the user's).
DB = Path(os.environ.get("CALPIPE_DB", str(paths.DEFAULT_DB))).expanduser().resolve()

defs = Definitions(
    resources={"duckdb": DuckDBResource(database=str(DB)), "calpipe": CalpipeResource.from_env(DB)},
    # DuckDB allows one writing process per file: run the steps of a run in one process.
    executor=in_process_executor,
)
