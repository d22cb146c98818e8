"""Where numba keeps calpipe's compiled kernels, set before any kernel is compiled or loaded.

Imported first by ``calpipe/__init__.py``. Unless ``NUMBA_CACHE_DIR`` is set (the Makefile sets
the repository's ``.venv/numba_cache``; Spark executors get theirs from the session), the
kernels are cached in the user's cache directory: an installed package's folder may be
read-only or shared, and without a writable cache every process compiles them again (10-50 s).
"""

from __future__ import annotations

import os
import sys

from calpipe.paths import user_dir


def numba_cache_dir() -> str:
    """The user's cache directory for calpipe's kernels (:func:`calpipe.paths.user_dir`)."""
    return str(user_dir("cache") / "numba")


#: Whether calpipe chose the directory (the user did not): then there is nothing to hand on to
#: other machines' processes (a Spark executor importing calpipe chooses its own).
DEFAULTED = not os.environ.get("NUMBA_CACHE_DIR")

if DEFAULTED:
    os.environ["NUMBA_CACHE_DIR"] = numba_cache_dir()
    if "numba" in sys.modules:  # numba read its configuration when it was imported
        sys.modules["numba"].config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
