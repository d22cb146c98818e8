"""Asset checks: their specs, and the conversion of calpipe's check outcomes into results.

The checks are :func:`calpipe.pipeline.run_range`'s data checks, run once the night's days are
committed (so a single-run backfill checks its whole range at once) and reported by the ``night``
multi-asset (``assets/night.py``): probabilities valid and rows in = rows out on
``protected_scores``, state continuity on ``calibrator_state``, and the martingale alarm (a
warning) on ``martingale_alarms``. Each spec is partitioned like its asset: the UI shows each
day's result on that day (a range run's result on each day of its range).
"""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSpec

from calpipe.pipeline import CheckOutcome

from ..metadata import CHECK_ASSETS, check_metadata, check_severity
from .partitions import daily

#: Every check, each on its asset (the names are :class:`calpipe.pipeline.CheckOutcome`'s).
CHECKS = (
    AssetCheckSpec("probabilities_valid", asset=CHECK_ASSETS["probabilities_valid"], partitions_def=daily,
                   description="every protected score is a finite probability in [0, 1]"),
    AssetCheckSpec("rows_in_equal_rows_out", asset=CHECK_ASSETS["rows_in_equal_rows_out"],
                   partitions_def=daily,
                   description="one protected row per scored event, per day and stream"),
    AssetCheckSpec("state_continuity", asset=CHECK_ASSETS["state_continuity"], partitions_def=daily,
                   description="no gap in the chain of daily states; counts follow the events"),
    AssetCheckSpec("estimates_valid", asset=CHECK_ASSETS["estimates_valid"], partitions_def=daily,
                   description="every day and stream with protected rows has one valid "
                   "performance estimate (in range, inside its interval)"),
    AssetCheckSpec("change_points_valid", asset=CHECK_ASSETS["change_points_valid"],
                   partitions_def=daily,
                   description="each change point crossed its threshold, its estimate is not after "
                   "its detection, numbered in order and counted by its stream's state; the "
                   "metadata counts the day's change points"),
    AssetCheckSpec("no_martingale_alarm", asset=CHECK_ASSETS["no_martingale_alarm"],
                   partitions_def=daily,
                   description="warns for the streams whose test martingale first reached 100 "
                   "on the run's days (earlier alarms are counted in its metadata)"),
)  # fmt: skip


def check_asset(name: str) -> str:
    """The asset whose check is named ``name``; KeyError for a data check of the pipeline that
    has no spec in :data:`CHECKS` (a new check needs one, or dagster would refuse its result)."""
    assets = {c.name: c.asset_key.to_user_string() for c in CHECKS}
    if name not in assets:
        raise KeyError(f"the data check {name!r} has no AssetCheckSpec in CHECKS")
    return assets[name]


def to_result(outcome: CheckOutcome, asset_key: str) -> AssetCheckResult:
    """A dagster check result from a calpipe :class:`~calpipe.pipeline.CheckOutcome` (a
    one-partition run: dagster gives it the run's partition)."""
    return AssetCheckResult(
        check_name=outcome.name,
        asset_key=asset_key,
        passed=outcome.passed,
        severity=check_severity(outcome),
        description=outcome.description,
        metadata=check_metadata(outcome),
    )
