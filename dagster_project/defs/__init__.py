"""The definitions of the code location, one concern per module (``definitions.py`` loads the
folder): ``partitions.py``, ``resources.py`` (and the executor), ``checks.py``, ``assets/``
(one module per stage of :mod:`calpipe.pipeline`), ``schedules.py`` (the ``nightly`` job and
its schedule), ``sensors.py``, ``spark.py`` (only with ``CALPIPE_SPARK_OUT``)."""
