"""The built wheel works outside the repository (issue #14).

A wheel used to ship no ``sql/*.sql`` and no demo data (``calpipe sql`` and ``calpipe demo`` failed
once installed) and installed a top-level package called ``dagster_project``. Here the wheel is
built from a copy of the tracked sources, installed into a fresh venv in a temporary folder, and
run from another folder with a fresh HOME: ``calpipe demo``, ``calpipe sql``, the code location,
and the numba cache in the user's cache directory (not inside the installed package).

The fresh venv borrows the dev venv's third-party packages through a ``.pth`` line (the locked
versions the wheel declares; no download in CI). A path added by a ``.pth`` line has its own
``.pth`` files ignored, so the checkout's editable calpipe cannot leak in: the test asserts
that ``calpipe`` is imported from the fresh venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from calpipe import pipeline

ROOT = Path(__file__).resolve().parents[2]
#: What the wheel is built from: pyproject.toml maps these into the package.
SOURCES = ("pyproject.toml", "README.md", "calpipe", "dagster_project", "sql", "data")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "generated", "*.nbi", "*.nbc")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}\n{out.stdout}\n{out.stderr}"
    return out


def test_every_calpipe_package_folder_is_in_the_wheel_list():
    """pyproject.toml lists the packages (the package-dir mapping rules out ``find``): a new
    subpackage missing from the list would be missing from the wheel."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "calpipe").rglob("__init__.py")
    } | {"calpipe.dagster_project"}
    assert on_disk <= listed, f"missing from [tool.setuptools] packages: {on_disk - listed}"


@pytest.mark.slow
def test_the_wheel_runs_the_demo_and_sql_from_a_fresh_venv(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORE)
        else:
            shutil.copy2(path, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)])
    (wheel,) = dist.glob("calpipe-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--quiet",
            "--no-deps",
            str(wheel),
        ]
    )
    site = Path(
        _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    (site / "_calpipe_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    home, work = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    work.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NUMBA_", "DAGSTER_", "PYTHON", "XDG_"))
    }
    env |= {"HOME": str(home), "DAGSTER_DISABLE_TELEMETRY": "1"}

    where = _run(
        [str(py), "-c", "import calpipe; print(calpipe.__file__)"], cwd=work, env=env
    ).stdout
    assert where.strip().startswith(str(site)), where
    top = _run(
        [str(py), "-c", "import importlib.util as u; print(u.find_spec('dagster_project'))"],
        cwd=work,
        env=env,
    )
    assert top.stdout.strip() == "None"  # no generic top-level package

    # every file of sql/ (tables, views, migrations/, macros/) is in the package, in its place
    shipped = site / "calpipe" / "_sql"
    assert sorted(f.relative_to(shipped).as_posix() for f in shipped.rglob("*.sql")) == sorted(
        f.relative_to(ROOT / "sql").as_posix() for f in (ROOT / "sql").rglob("*.sql")
    )

    calpipe = str(venv / "bin" / "calpipe")
    demo = _run([calpipe, "demo"], cwd=work, env=env).stdout
    db = home / ".local" / "share" / "calpipe" / "demo.duckdb"
    assert db.is_file(), demo
    assert str(db) in demo
    count = "SELECT count(*) AS n FROM scored_events WHERE stream = 'bank-telemarketing'"
    assert _run([calpipe, "sql", "--csv", count], cwd=work, env=env).stdout.split() == [
        "n",
        "35211",
    ]
    query = "SELECT calibrate_score('bank-telemarketing', 0.3) AS p"
    served = _run([calpipe, "sql", "--csv", query], cwd=work, env=env).stdout
    assert 0.0 < float(served.split()[-1]) < 1.0

    # the code location, as `calpipe ui` loads it, from the installed package
    defs = _run([str(py), "-c", "from calpipe.dagster_project.definitions import defs; "
                 "print(len(list(defs.resolve_asset_graph().get_all_asset_keys())))"], cwd=work, env=env)  # fmt: skip
    assert int(defs.stdout.strip()) == len(pipeline.ASSET_TABLES)  # one asset per table

    # compiled kernels went to the user's cache directory, none into the installed package
    assert list((home / ".cache" / "calpipe" / "numba").rglob("*.nbi"))
    assert not list((site / "calpipe").rglob("*.nbi"))
