"""The assets of the nightly pipeline, one module per stage of :mod:`calpipe.pipeline`.

Lineage: ``scored_events`` + ``event_labels`` (the label feed's arrivals, loaded with the events:
``events.py``) -> ``protected_scores`` + ``calibrator_state`` (one engine call; the state of day
d depends on its own day d - 1: ``chain.py``) -> ``calibration_daily`` + ``calibration_arrivals``
(``monitoring.py``), ``martingale_alarms`` (``alarms.py``), ``calibration_map``
(``mapping.py``). All are daily-partitioned (``../partitions.py``) and use
``BackfillPolicy.single_run()``: a backfill over a range is one run, whose days the pipeline
replays in order. Each asset is thin: it calls calpipe's public functions and describes what
they wrote.
"""

import warnings

from dagster import BackfillPolicy, BetaWarning

#: The group of every nightly asset (the ``nightly`` job selects it).
GROUP = "calpipe"

#: A backfill over a range is one run (the days of a chain run in order, each from the day
#: before).
POLICY = BackfillPolicy.single_run()

# ``backfill_policy`` of ``@asset`` is flagged beta; single-run backfills are what we want, so
# say it once here (this exact warning only).
warnings.filterwarnings("ignore", category=BetaWarning, message="Parameter `backfill_policy`")
