"""Where numba keeps calpipe's compiled kernels, set before any kernel is compiled or loaded.

Imported first by ``calpipe/__init__.py``. A set ``NUMBA_CACHE_DIR`` wins (Spark executors get
theirs from the session). Otherwise the kernels are cached in the ``numba_cache`` folder of the
virtual environment calpipe runs from, when it has one (``make setup`` creates it in
``.venv``: ``make demo``, ``make test`` and the ``.venv/bin/calpipe`` commands the demo
suggests then share one cache; with two caches, the first ``calpipe protect`` after ``make
demo`` compiled every kernel again, 13.3 s instead of 1.8 s), else in the user's cache
directory: an installed package's folder may be read-only or shared, and without a writable
cache every process compiles them again (10-50 s).
"""

from __future__ import annotations

import os
import sys

from calpipe.paths import user_dir

#: The folder of a virtual environment that holds its own kernel cache (``make setup``).
VENV_FOLDER = "numba_cache"


def numba_cache_dir(prefix: str | None = None, base_prefix: str | None = None) -> str:
    """The kernel cache when ``NUMBA_CACHE_DIR`` is not set: the virtual environment's
    :data:`VENV_FOLDER` (``prefix``, default ``sys.prefix``; a venv: ``prefix`` differs from
    ``base_prefix``) when it exists and is writable, else the user's cache directory
    (:func:`calpipe.paths.user_dir`)."""
    prefix = sys.prefix if prefix is None else prefix
    base_prefix = sys.base_prefix if base_prefix is None else base_prefix
    own = os.path.join(prefix, VENV_FOLDER)
    if prefix != base_prefix and os.path.isdir(own) and os.access(own, os.W_OK):
        return own
    return str(user_dir("cache") / "numba")


_CHOSEN = not os.environ.get("NUMBA_CACHE_DIR")  # the user did not set it
if _CHOSEN:
    os.environ["NUMBA_CACHE_DIR"] = numba_cache_dir()
    if "numba" in sys.modules:  # numba read its configuration when it was imported
        sys.modules["numba"].config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]

#: Whether calpipe chose the user's cache directory (the user set no folder and the venv has
#: none of its own): then there is nothing to hand on to other machines' processes (a Spark
#: executor importing calpipe chooses its own user's). A folder the user set, or the venv's
#: own (the executors run this interpreter, so its path exists for them), is handed on.
DEFAULTED = _CHOSEN and os.environ["NUMBA_CACHE_DIR"] == str(user_dir("cache") / "numba")
