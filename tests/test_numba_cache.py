"""calpipe/_numba_cache.py: without NUMBA_CACHE_DIR the kernels are cached in the venv's own
``numba_cache`` folder when it has one (``make setup``'s ``.venv``), else in the user's cache
directory (an installed package's folder may be read-only: #14's wheel found the caches inside
site-packages, or rebuilt them silently in every process); a set NUMBA_CACHE_DIR wins."""

from __future__ import annotations

import os
import subprocess
import sys

from calpipe.numba_cache import VENV_FOLDER, numba_cache_dir

CODE = (
    "import numba, calpipe, os; print(numba.config.CACHE_DIR); print(os.environ['NUMBA_CACHE_DIR'])"
)


def _run(env: dict[str, str], code: str = CODE) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return out.stdout.split()


#: Run as if from no virtual environment (the rule reads sys.prefix against sys.base_prefix).
NO_VENV = "import sys; sys.prefix = sys.base_prefix; "


def test_the_user_cache_directory_is_the_default_outside_a_venv_with_its_own(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    want = str(tmp_path / "calpipe" / "numba")
    # numba imported before calpipe (its configuration already read) gets it too
    assert _run(env, NO_VENV + CODE) == [want, want]
    protect = NO_VENV + "import calpipe, polars as pl; calpipe.protect(pl.DataFrame({'stream': " \
              "['a'], 'event_time': [1], 'event_id': [1], 'score': [0.5], 'label': [1]}))"  # fmt: skip
    subprocess.run([sys.executable, "-c", protect], env=env, check=True, capture_output=True)
    assert any((tmp_path / "calpipe" / "numba").rglob("*.nbi"))  # the index of a cached kernel


def test_a_set_numba_cache_dir_wins(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "mine")}
    assert _run(env) == [str(tmp_path / "mine")] * 2


def test_make_demo_s_cache_was_not_the_one_venv_calpipe_used(tmp_path):
    """make exported NUMBA_CACHE_DIR=.venv/numba_cache, while .venv/bin/calpipe run by the user
    (no such variable) used the user's cache: the demo's suggested commands compiled every
    kernel again (13.3 s for a first calpipe protect). A venv with a numba_cache folder now
    caches there whoever runs it."""
    venv = tmp_path / "venv"
    assert numba_cache_dir(str(venv), "/usr").endswith(os.path.join("calpipe", "numba"))
    (venv / VENV_FOLDER).mkdir(parents=True)
    assert numba_cache_dir(str(venv), "/usr") == str(venv / VENV_FOLDER)
    assert numba_cache_dir(str(venv), str(venv)).endswith("numba")  # not a venv: the user's
    assert numba_cache_dir(str(venv), str(venv)) != str(venv / VENV_FOLDER)
    (venv / VENV_FOLDER).rmdir()
    (venv / VENV_FOLDER).write_text("")  # a file of that name is no cache folder
    assert numba_cache_dir(str(venv), "/usr").endswith(os.path.join("calpipe", "numba"))
    if sys.prefix != sys.base_prefix and os.path.isdir(os.path.join(sys.prefix, VENV_FOLDER)):
        # this very venv (make setup's): a fresh process without the variable uses its folder
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        want = os.path.join(sys.prefix, VENV_FOLDER)
        assert _run(env) == [want, want]


def test_the_venv_s_cache_is_handed_on_to_spark_executors_and_the_user_s_is_not(tmp_path):
    """The standalone-cluster test saw executors without the driver's cache once make stopped
    exporting NUMBA_CACHE_DIR: a venv's own folder is handed on (the executors run this
    interpreter, whose venv it is), the user's cache directory is not (each machine has its
    own), a folder the user set is."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = "import calpipe.spark as s, calpipe.numba_cache as n; print(n.DEFAULTED, " \
           "bool(s.executor_env()))"  # fmt: skip
    assert _run(env, NO_VENV + code) == ["True", "False"]
    if sys.prefix != sys.base_prefix and os.path.isdir(os.path.join(sys.prefix, VENV_FOLDER)):
        assert _run(env, code) == ["False", "True"]
    assert _run({**env, "NUMBA_CACHE_DIR": str(tmp_path / "mine")}, code) == ["False", "True"]
