"""Resources: the DuckDB file (``dagster_duckdb.DuckDBResource``) and calpipe's job settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource
from dagster_duckdb import DuckDBResource
from pydantic import Field

from calpipe import storage
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

    def source(self) -> storage.EventSource:
        return storage.EventSource.parse(
            self.events, storage.ColumnMap.from_json(self.columns_json)
        )

    def label_feed(self) -> storage.EventSource | None:
        return label_source(self.labels) if self.labels else None

    def settings(self) -> Settings:
        return Settings.from_json(self.settings_json)


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
