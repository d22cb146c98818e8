"""The code location loads: definitions, schedule, policies, and ``dg check defs`` itself."""

from __future__ import annotations

import ast
import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, BackfillPolicy, build_schedule_context

from calpipe import paths, pipeline
from calpipe.dagster_project import definitions
from calpipe.errors import ParameterError

from .location import DEFS, location

#: dagster's own notices (backfill_policy is "beta"; its schedule helper calls a deprecated API).
pytestmark = [
    pytest.mark.filterwarnings("ignore::dagster.BetaWarning"),
    pytest.mark.filterwarnings(
        "ignore:Function `JobDefinition.run_request_for_partition`:DeprecationWarning"
    ),
]

ASSETS = {"scored_events", "event_labels", "protected_scores", "calibrator_state", "calibration_daily", "calibration_arrivals",
          "performance_estimates", "martingale_alarms", "change_points",
          "calibration_map"}  # fmt: skip
CHECKS = {("protected_scores", "probabilities_valid"), ("protected_scores", "rows_in_equal_rows_out"),
          ("calibrator_state", "state_continuity"), ("performance_estimates", "estimates_valid"),
          ("change_points", "change_points_valid"),
          ("martingale_alarms", "no_martingale_alarm")}  # fmt: skip


def test_the_asset_tables_are_in_lineage_order_upstream_first():
    """The days computed outside a dagster run (the sync, the range metadata sensor) are
    reported asset by asset in ``pipeline.ASSET_TABLES``' order: a downstream asset reported
    before an upstream one shows "Unsynced" in the UI (the sensor once reported them
    alphabetically, and every day of a backfill said so)."""
    graph = definitions.defs.resolve_asset_graph()
    position = {a: i for i, a in enumerate(pipeline.ASSET_TABLES)}
    for key in graph.get_all_asset_keys():
        for parent in graph.get(key).parent_keys:
            if parent != key:  # calibrator_state depends on its own day before
                up, down = parent.to_user_string(), key.to_user_string()
                assert position[up] < position[down], (up, down)


def test_module_definitions_load_with_the_default_database():
    """Without variables: the default database (the demo's), its partitions the days of that
    database and its landing folder (none before ``calpipe demo``: no partition)."""
    from calpipe.dagster_project.defs.partitions import span

    expected = span(paths.DEFAULT_DB)
    defs = definitions.defs
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == ASSETS
    assert {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys} == CHECKS
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.backfill_policy == BackfillPolicy.single_run()
        keys = node.partitions_def.get_partition_keys()
        if expected is None:
            assert keys == []
        else:
            assert (keys[0], keys[-1]) == tuple(d.isoformat() for d in expected)
    state = graph.get(AssetKey("calibrator_state"))
    assert state.has_self_dependency
    mapping = graph.get_partition_mapping(
        AssetKey("calibrator_state"), AssetKey("calibrator_state")
    )
    assert (mapping.start_offset, mapping.end_offset) == (-1, -1)
    for child in ("protected_scores", "calibrator_state"):  # the state learns from both too
        parents = graph.get(AssetKey(child)).parent_keys
        assert {AssetKey("scored_events"), AssetKey("event_labels")} <= parents, child
    db = defs.resources["duckdb"].database
    assert Path(db).is_absolute() and Path(db) == paths.DEFAULT_DB


def test_definitions_from_the_environment(monkeypatch, tmp_path, load_location):
    monkeypatch.setenv("CALPIPE_DB", str(tmp_path / "x.duckdb"))
    monkeypatch.setenv("CALPIPE_EVENTS", "raw_events")
    monkeypatch.setenv("CALPIPE_START_DATE", "2024-01-01")
    monkeypatch.setenv("CALPIPE_END_DATE", "none")
    monkeypatch.setenv("CALPIPE_SETTINGS", pipeline.Settings.make(pi=0.3).to_json())
    defs = load_location()
    assert defs.resources["duckdb"].database == str(tmp_path / "x.duckdb")
    assert defs.resources["calpipe"].settings().kwargs == {"pi": 0.3}
    assert defs.resources["calpipe"].source().kind == "table"
    pd = defs.resolve_asset_graph().get(AssetKey("calibration_map")).partitions_def
    assert pd.end is None and pd.start.date() == dt.date(2024, 1, 1)


def test_nightly_schedule_runs_yesterday():
    defs = location("/tmp/unused.duckdb", "raw", dt.date(2024, 1, 1))
    sched = defs.resolve_schedule_def("nightly_schedule")
    assert sched.cron_schedule == "30 1 * * *"
    ctx = build_schedule_context(
        scheduled_execution_time=dt.datetime(2024, 3, 5, 1, 30, tzinfo=dt.UTC)
    )
    requests = sched.evaluate_tick(ctx).run_requests
    assert [r.partition_key for r in requests] == ["2024-03-04"]
    assert defs.resolve_job_def("nightly").partitions_def is not None


def test_calpipe_never_imports_dagster():
    code = (
        "import sys, calpipe, calpipe.pipeline, calpipe.storage, calpipe.plots, calpipe.generate, "
        "calpipe.cli, calpipe.cli.pipeline; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0].startswith('dagster')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dg_check_defs(tmp_path):
    dg = Path(sys.executable).parent / "dg"
    env = os.environ | {"DAGSTER_HOME": str(tmp_path), "DAGSTER_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run(
        [str(dg), "check", "defs"], cwd=paths.PROJECT_ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All definitions loaded successfully" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("value", "match"),
    [("{not json", "CALPIPE_SETTINGS: not valid JSON"), ("[1, 2]", "CALPIPE_SETTINGS: expected"),
     ('{"method": "nope"}', "unknown method 'nope'")],
)  # fmt: skip
def test_a_malformed_calpipe_settings_was_a_traceback(monkeypatch, load_location, value, match):
    monkeypatch.setenv("CALPIPE_SETTINGS", value)
    with pytest.raises(ParameterError, match=match):
        load_location()


def test_every_asset_carries_its_table_s_column_schema():
    """The UI's Columns panel shows each table's columns and types, read from sql/."""
    graph = definitions.defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        schema = node.metadata["dagster/column_schema"]
        table = key.to_user_string()
        assert node.metadata["duckdb_table"] == table
        assert [(c.name, c.type) for c in schema.columns] == list(pipeline.table_schemas()[table])
    cols = {
        c.name
        for c in graph.get(AssetKey("protected_scores")).metadata["dagster/column_schema"].columns
    }
    assert {"protected_score", "protected_scores", "log10_martingale", "event_date"} <= cols


def test_no_private_dagster_module_is_imported():
    """The location and its tests use dagster's public API only: a private module changes
    without notice (the range run's tag names came from ``dagster._core.storage.tags``). The
    exceptions: the UI's process, which builds dagster's webserver app without a TCP port of
    dagster's own, and the check results aimed at a materialization (their reasons:
    ``tests/test_architecture.py::ALLOWED_PRIVATE``)."""
    from tests.test_architecture import ALLOWED_PRIVATE

    root = Path(__file__).resolve().parents[2]
    bad = []
    for path in sorted(
        [*(root / "dagster_project").rglob("*.py"), *(root / "tests").rglob("*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            bad += [
                f"{path.relative_to(root)}:{node.lineno} imports {name}"
                for name in names
                if name.split(".")[0].startswith("dagster")
                and any(part.startswith("_") for part in name.split(".")[1:])
                and (module, name) not in ALLOWED_PRIVATE
            ]
    assert not bad, "\n".join(bad)


def test_every_definition_is_a_module_level_name_of_the_defs_folder(load_location):
    """``definitions.py`` loads ``defs/`` through ``dg.toml`` as ``calpipe.dagster_project.defs``
    (one copy of each module, whoever loads the location), and each asset, sensor, schedule and
    job is defined at module level in one of its modules (no factory builds them)."""
    defs = load_location()
    defs_modules = [m for name, m in sys.modules.items() if name.startswith(DEFS + ".")]
    assert {m.__name__ for m in defs_modules} >= {f"{DEFS}.assets.night", f"{DEFS}.sensors"}
    assert "dagster_project" not in sys.modules  # the folder's other name: never imported
    where = {id(v): f"{m.__name__}.{k}" for m in defs_modules for k, v in vars(m).items()}
    found = {where.get(id(d)) for d in [*defs.assets, *defs.sensors, *defs.schedules, *defs.jobs]}
    assert found == {f"{DEFS}.{name}" for name in (
        "assets.night.night", "schedules.nightly",
        "schedules.nightly_schedule", "sensors.landing_sensor", "sensors.range_metadata_sensor",
    )}  # fmt: skip


def test_every_data_check_of_the_run_has_its_asset_check_spec():
    """The night asset reports run_range's checks by name: each needs a spec (dagster refuses a
    result without one), and a check without a spec is an error naming it."""
    from calpipe.dagster_project.defs.checks import check_asset

    assert check_asset("state_continuity") == "calibrator_state"
    assert check_asset("no_martingale_alarm") == "martingale_alarms"
    with pytest.raises(KeyError, match="'calibration_weekly' has no AssetCheckSpec"):
        check_asset("calibration_weekly")
