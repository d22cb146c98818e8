"""Where calpipe's files live: the repository or the installed package, the SQL layer, the demo
data and database, and the user's data and cache directories.

In a checkout (an editable install) the defaults sit in the repository (``sql/``, ``data/``, the
git-ignored ``.calpipe/``); an installed wheel carries ``sql/`` and ``data/`` inside the package
(``calpipe/_sql``, ``calpipe/_data``: pyproject.toml maps them) and keeps what it writes in the
user's directories, since an installed package's folder may be read-only or shared.
Standard library only: :mod:`calpipe.numba_cache` reads it before anything else is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The folder holding the ``calpipe`` package: the repository in a checkout, ``site-packages``
#: in an installed wheel.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: Whether calpipe runs from its repository (an editable install) rather than an installed wheel.
CHECKOUT = (PROJECT_ROOT / "pyproject.toml").is_file() and (PROJECT_ROOT / "sql").is_dir()


def shipped(folder: str) -> Path:
    """A top-level folder of the repository that the wheel carries inside the package
    (``sql`` -> ``calpipe/_sql``, ``data`` -> ``calpipe/_data``)."""
    inside = Path(__file__).resolve().parent / f"_{folder}"
    return inside if inside.is_dir() else PROJECT_ROOT / folder


def user_dir(kind: str) -> Path:
    """The user's ``"data"`` or ``"cache"`` directory for calpipe: XDG on Linux
    (``~/.local/share``, ``~/.cache``), ``~/Library/{Application Support,Caches}`` on macOS,
    ``%LOCALAPPDATA%`` on Windows."""
    home = Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(home / "Library" / ("Application Support" if kind == "data" else "Caches"))
    elif kind == "data":
        base = os.environ.get("XDG_DATA_HOME") or str(home / ".local" / "share")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(home / ".cache")
    return Path(base) / "calpipe"


#: DDL, views and macros installed on connect, run in file-name order.
SQL_DIR = shipped("sql")

#: Where the demo's database, landing folders and generated data live: the git-ignored
#: ``.calpipe/`` of a checkout (a demo never writes into tracked files), else the user's data
#: directory.
DATA_HOME = PROJECT_ROOT / ".calpipe" if CHECKOUT else user_dir("data")

#: Default database of ``calpipe demo`` (and of ``calpipe ui`` / ``sql`` / ``report``): absolute.
DEFAULT_DB = DATA_HOME / "demo.duckdb"
