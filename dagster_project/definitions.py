"""The code location: ``defs``, every definition of the ``defs/`` folder.

:func:`dagster.load_from_defs_folder` imports each module under ``defs/`` and merges what they
define at module level (assets, checks, jobs, schedules, sensors, and the ``Definitions`` of
the resources and the executor). It finds the project through ``dg.toml`` beside this file,
which names the package as the wheel installs it, ``calpipe.dagster_project``: the same modules
whether ``calpipe ui``, ``dagster-webserver -m calpipe.dagster_project.definitions`` or ``dg``
loads the location. The location is configured by the environment (``CALPIPE_*``, what
``calpipe ui`` sets): ``defs/resources.py``, ``defs/partitions.py`` and ``defs/spark.py`` say
which variables.
"""

from pathlib import Path

from dagster import load_from_defs_folder

defs = load_from_defs_folder(path_within_project=Path(__file__).parent)
