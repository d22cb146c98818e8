"""calpipe/_numba_cache.py: without NUMBA_CACHE_DIR the kernels are cached in the user's cache
directory (an installed package's folder may be read-only: #14's wheel found the caches inside
site-packages, or rebuilt them silently in every process); a set NUMBA_CACHE_DIR wins."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = (
    "import numba, calpipe, os; print(numba.config.CACHE_DIR); print(os.environ['NUMBA_CACHE_DIR'])"
)


def _run(env: dict[str, str], code: str = CODE) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return out.stdout.split()


def test_the_user_cache_directory_is_the_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    want = str(tmp_path / "calpipe" / "numba")
    # numba imported before calpipe (its configuration already read) gets it too
    assert _run(env) == [want, want]
    protect = "import calpipe, polars as pl; calpipe.protect(pl.DataFrame({'stream': ['a'], " \
              "'event_time': [1], 'event_id': [1], 'score': [0.5], 'label': [1]}))"  # fmt: skip
    subprocess.run([sys.executable, "-c", protect], env=env, check=True, capture_output=True)
    assert any((tmp_path / "calpipe" / "numba").rglob("*.nbi"))  # the index of a cached kernel


def test_a_set_numba_cache_dir_wins(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "mine")}
    assert _run(env) == [str(tmp_path / "mine")] * 2
