"""Golden tables (issue #32): every table of four pipeline scenarios equals, bit for bit, what
the nightly layer wrote before its redesign (``tests/data/golden/``, written by
``python -m tests.golden.make_golden`` at commit 26b40f3).

Each scenario is rebuilt with the code under test by the builder that wrote the golden data
(``tests/golden/make_golden.py``: ``calpipe demo``; 12 nights of ``calpipe run --labels`` with
a late day, quarantined labels and a corrected day; 5 nights of K = 4 classes with string ids;
the Spark transform ``calpipe.spark.protect_day`` on local[1], as ``calpipe spark-run`` ran it
before the redesign; the new ``spark-run`` writes ``calpipe run``'s tables, tested equal to
them in ``tests/spark/``) and every table and view is compared in canonical form
(``tests/golden/canonical.py``): column names, types and order, and the rows of every day, with
only the columns of :data:`tests.golden.canonical.NORMALIZED` normalized. A failure names the
scenario, table, day, row and column.
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest

from tests.golden import canonical, make_golden
from tests.golden.canonical import Captured, Golden, compare, encode, write_golden


def test_numpy_runs_the_simd_kernels_the_golden_tables_were_made_with():
    """numpy's AVX-512 kernels round differently in the last bit: tests/__init__.py turns them
    off before numpy is imported (this fails if something imported numpy first)."""
    from numpy.lib.introspect import opt_func_info

    current = {sig["current"] for sig in opt_func_info(func_name="^exp$")["exp"].values()}
    assert not {t for t in current if t.startswith(("X86_V4", "AVX512"))}, (
        "numpy runs its AVX-512 (X86_V4) kernels: set NPY_DISABLE_CPU_FEATURES='X86_V4 "
        "AVX512_ICL AVX512_SPR' before numpy is imported (tests/__init__.py does)"
    )


HINT = (
    "\nIf the change is intended, regenerate the golden data with `python -m "
    "tests.golden.make_golden` and say in the commit which tables changed and why."
)


def check(scenario: str, work) -> None:
    tables = make_golden.build(scenario, work)
    problems = compare(scenario, Golden.read(make_golden.GOLDEN / scenario), tables)
    assert not problems, (
        f"{len(problems)} difference(s) from the golden tables:\n" + "\n".join(problems) + HINT
    )


@pytest.mark.parametrize("scenario", ["demo", "labels12", "k4"])
def test_the_tables_equal_the_golden_ones(scenario, tmp_path):
    check(scenario, tmp_path)


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_spark_backfill_equals_the_golden_one(tmp_path):
    pytest.importorskip("pyspark")
    check("spark", tmp_path)


# ----------------------------------------------------------------------------------------------
# The comparison itself
# ----------------------------------------------------------------------------------------------
def _table(values: list[float | None], stream=("a", "b", "c")) -> Captured:
    n = len(values)
    data = pa.table(
        {
            "date": pa.array([dt.date(2010, 7, 21)] * n, pa.date32()),
            "stream": pa.array(list(stream)[:n]),
            "x": pa.array(values, pa.float64()),
            "v": pa.array([[v, 1.0] if v is not None else None for v in values]),
        }
    )
    cols = [("date", "DATE"), ("stream", "VARCHAR"), ("x", "DOUBLE"), ("v", "DOUBLE[]")]
    return Captured("t", cols, ("stream",), "date", data)


def test_the_canonical_form_tells_apart_what_an_equality_test_might_not():
    def digest(values):
        return encode(_table(values)).day_digests()

    assert digest([0.0, 1.0]) != digest([-0.0, 1.0])
    assert digest([math.nan, 1.0]) != digest([None, 1.0])
    assert digest([0.1, 1.0]) != digest([math.nextafter(0.1, 1), 1.0])
    assert digest([0.1, 1.0]) == digest([0.1, 1.0])
    # strings and lists are length-prefixed: no two rows read as one
    a = canonical.fields(pa.array(["ab", ""]))
    b = canonical.fields(pa.array(["a", "b"]))
    assert b"".join(a) != b"".join(b)
    assert canonical.fields(pa.array([[]], pa.list_(pa.float64()))) != canonical.fields(
        pa.array([None], pa.list_(pa.float64()))
    )
    # the row order of the data does not matter, the sort keys' order does
    t = _table([0.5, 0.25])
    flipped = Captured(t.name, t.columns, t.keys, t.day, t.data.take([1, 0]))
    assert encode(t).day_digests() == encode(flipped).day_digests()


def test_a_difference_is_named_by_scenario_table_day_row_and_column(tmp_path):
    write_golden(tmp_path, {"t": encode(_table([0.5, 0.25, 0.125]))}, lambda _e: None)
    changed = encode(_table([0.5, math.nextafter(0.25, 1), 0.125]))
    problems = compare("toy", Golden.read(tmp_path), {"t": changed})
    assert len(problems) == 2, problems
    assert problems[0] == "scenario 'toy': 1 table(s) differ; the earliest day is 2010-07-21, in t"
    msg = problems[1]
    assert "scenario 'toy', table 't', day 2010-07-21" in msg
    assert "row (stream='b')" in msg and "column 'x' differs" in msg
    assert "committed 0.25 (0x1.0000000000000p-2)" in msg
    assert "also v" in msg
    # a missing row and a new table are named too
    problems = compare(
        "toy", Golden.read(tmp_path), {"t": encode(_table([0.5, 0.25])), "u": changed}
    )
    assert any("1 committed row(s) missing now, first (stream='c')" in p for p in problems)
    assert any("table 'u' is new" in p for p in problems)


def test_the_readme_names_every_normalized_column():
    readme = (make_golden.GOLDEN / "README.md").read_text()
    for table, column in canonical.NORMALIZED:
        assert f"| `{table}` | `{column}` |" in readme, (table, column)
