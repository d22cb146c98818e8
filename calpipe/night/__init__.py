"""The night, pure and in memory: a night's events, labels and prior state -> the rows of every table.

Layer 4 of docs/ARCHITECTURE.md §2, beside :mod:`calpipe.storage` and below the runners: it
imports the engine, the calibrators and the metrics, never DuckDB nor the storage
(``tests/test_architecture.py`` checks it). One home per table's rows:

======================  ====================================================
table                   rows
======================  ====================================================
``scored_events``       :func:`calpipe.night.events.stored_events`
``protected_scores``    :func:`calpipe.night.chain.protected_rows`
``calibrator_state``    :func:`calpipe.night.chain.state_rows`
``pipeline_days``       :meth:`calpipe.night.chain.Chain.day_row`
``calibration_daily``   :func:`calpipe.night.monitoring.daily_rows`
``calibration_arrivals`` :func:`calpipe.night.monitoring.arrival_rows`
``performance_estimates`` :func:`calpipe.night.performance.estimate_rows`
``martingale_alarms``   :func:`calpipe.night.alarms.first_crossings`
``change_points``       :func:`calpipe.night.changes.detect`
``event_labels``        :func:`calpipe.night.arrivals.label_rows`
``quarantined_labels``  :func:`calpipe.night.arrivals.quarantine_rows`
``calibration_map``     :func:`calpipe.night.mapping.map_rows`
``pipeline_inputs``     :func:`calpipe.night.phases.day_inputs`
======================  ====================================================

The night function every runner calls, a part of whole streams in phases (the local run's
night or part, a Spark bucket), is :func:`calpipe.night.phases.night_part`, then
:func:`calpipe.night.phases.night_day`.

"""

from calpipe.night.arrivals import Arrivals
from calpipe.night.chain import Chain
from calpipe.night.settings import Settings

__all__ = ["Arrivals", "Chain", "Settings"]
