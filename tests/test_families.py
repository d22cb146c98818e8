"""Calibrating families: default grids (docs/ARCHITECTURE.md §4), numpy ``evaluate`` against the naive formulas of
paper 000 eqs. (1), (3)-(5) and paper 001 eq. (1) (tests/naive.py), and ``identity_index``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calpipe import families
from tests import naive

GRID = np.linspace(0.0, 1.0, 201)


def _simplex_points(k: int, n: int = 50, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(k, 0.7), size=n)


def _binary_values(fam: families.Family) -> np.ndarray:
    """(n_grid, T) values of the naive closures of ``fam`` on GRID."""
    fs = naive.binary_functions(fam.name, fam.params)
    return np.array([[f(float(p)) for f in fs] for p in GRID])


def _multiclass_values(fam: families.Family, pts: np.ndarray) -> np.ndarray:
    fs = naive.multiclass_functions(fam.alphas, fam.betas)
    return np.array([[f(q) for f in fs] for q in pts])


def _n_distinct(values: np.ndarray, axis_fun: int = 1, tol: float = 1e-9) -> int:
    """Number of distinct functions among the columns (axis ``axis_fun``) of ``values``."""
    funcs = np.moveaxis(values, axis_fun, 0).reshape(values.shape[axis_fun], -1)
    kept: list[np.ndarray] = []
    for f in funcs:
        if all(np.abs(f - g).max() > tol for g in kept):
            kept.append(f)
    return len(kept)


# ----------------------------------------------------------------------------------------------
# Default grids
# ----------------------------------------------------------------------------------------------
def test_binary_cox2_default_grid_has_nine_distinct_functions_identity_first():
    fam = families.binary_family("cox2")
    assert fam.size == 9
    assert fam.n_classes == 2 and not fam.multiclass
    assert {(a, b) for a, b in fam.params.tolist()} == {
        (a, b) for a in (0.0, 1.0, -1.0) for b in (1.0, 0.5, 2.0)
    }
    assert tuple(fam.params[0]) == (0.0, 1.0)  # alpha = 0, beta = 1: the identity
    assert fam.identity_index == 0
    assert _n_distinct(_binary_values(fam)) == 9


@pytest.mark.parametrize("k", [3, 4, 5, 10])
def test_multiclass_cox2_default_grid_has_3_times_2k_plus_1_distinct_functions(k):
    fam = families.multiclass_family(k)
    assert fam.size == 3 * (2 * k + 1)
    assert fam.multiclass and fam.alphas.shape == (fam.size, k)
    assert fam.identity_index == 0
    assert np.all(fam.alphas[0] == 0.0) and fam.betas[0] == 1.0
    # every alpha row is 0 or +-e_c, each of the 2K + 1 rows crossed with beta in {1, 0.5, 2}
    rows = {tuple(r) for r in fam.alphas.tolist()}
    assert len(rows) == 2 * k + 1
    assert all(sum(abs(v) for v in r) in (0.0, 1.0) for r in rows)
    vals = _multiclass_values(fam, _simplex_points(k))
    assert _n_distinct(vals) == fam.size


def test_package_grid_for_two_classes_has_15_slots_with_6_duplicates():
    fam = families.package_grid(2)
    assert fam.size == 15
    vals = _multiclass_values(fam, np.column_stack([1.0 - GRID[1:-1], GRID[1:-1]]))
    assert _n_distinct(vals) == 9
    # +e_0 (slots 3-5) coincides with -e_1 (slots 12-14), -e_0 (6-8) with +e_1 (9-11)
    np.testing.assert_allclose(vals[:, 3:6], vals[:, 12:15], atol=1e-15)
    np.testing.assert_allclose(vals[:, 6:9], vals[:, 9:12], atol=1e-15)
    # and its 9 distinct functions are the binary cox2 grid's (as functions of P(y = 1))
    binary = _binary_values(families.binary_family("cox2"))[1:-1]
    for t in range(15):
        assert np.abs(binary - vals[:, t, 1][:, None]).max(axis=0).min() < 1e-14


@pytest.mark.parametrize("k", [2, 3, 5])
def test_package_grid_matches_protected_classification_generate_protected_params(k):
    from protected_classification.protected_classification import generate_protected_params

    _, n_cal, _, cal_list = generate_protected_params([1, 0.5, 2], k)
    fam = families.package_grid(k)
    assert fam.size == n_cal == 3 * (2 * k + 1)
    np.testing.assert_array_equal(fam.alphas, np.array([c[0] for c in cal_list], float))
    np.testing.assert_array_equal(fam.betas, np.array([c[1] for c in cal_list], float))
    alphas, betas = naive.package_grid(k)
    np.testing.assert_array_equal(fam.alphas, np.array(alphas))
    np.testing.assert_array_equal(fam.betas, np.array(betas))


def test_default_quadratic_grid_is_paper_000_set_E_identity_first():
    fam = families.binary_family("quadratic")
    assert sorted(fam.params[:, 0].tolist()) == [-1.0, -0.5, 0.0, 0.5, 1.0]  # paper 000 §2
    assert fam.params[0, 0] == 0.0 and fam.identity_index == 0


def test_default_cubic_and_cox_grids_stay_inside_their_paper_ranges():
    cubic = families.binary_family("cubic")
    assert np.all((cubic.params >= 0.0) & (cubic.params <= 1.0))  # (a, b) in [0, 1]^2, eq. (3)
    cox = families.binary_family("cox")
    assert np.all(cox.params[:, 0] == 0.0) and cox.params[0, 1] == 1.0  # eq. (4), identity first


def test_family_codes_select_the_kernel_branch():
    assert families.binary_family("quadratic").code == families.QUADRATIC
    assert families.binary_family("cubic").code == families.CUBIC
    assert families.binary_family("cox").code == families.COX
    assert families.binary_family("cox2").code == families.COX


# ----------------------------------------------------------------------------------------------
# evaluate vs the naive formulas
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["quadratic", "cubic", "cox", "cox2"])
def test_evaluate_default_binary_grid_equals_naive_formulas(name):
    fam = families.binary_family(name)
    got = families.evaluate(fam, GRID)
    assert got.shape == (GRID.size, fam.size)
    np.testing.assert_allclose(got, _binary_values(fam), rtol=0, atol=1e-14)
    assert np.all((got >= 0.0) & (got <= 1.0))


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["quadratic", "cubic", "cox", "cox2"]),
    data=st.data(),
)
def test_evaluate_random_binary_grid_equals_naive_formulas(name, data):
    unit = st.floats(0.0, 1.0)
    if name == "quadratic":
        params = data.draw(st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=6))
    elif name == "cubic":
        params = data.draw(st.lists(st.tuples(unit, unit), min_size=1, max_size=6))
    elif name == "cox":
        params = data.draw(st.lists(st.floats(0.05, 5.0), min_size=1, max_size=6))
    else:
        params = data.draw(
            st.lists(st.tuples(st.floats(-3.0, 3.0), st.floats(0.05, 5.0)), min_size=1, max_size=6)
        )
    p = np.array(data.draw(st.lists(st.floats(1e-9, 1.0 - 1e-9), min_size=1, max_size=20)))
    fam = families.binary_family(name, params)
    fs = naive.binary_functions(name, fam.params)
    expected = np.array([[f(float(q)) for f in fs] for q in p])
    np.testing.assert_allclose(families.evaluate(fam, p), expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("k", [2, 3, 5, 10])
def test_evaluate_multiclass_grid_equals_naive_eq1_and_stays_on_simplex(k):
    fam = families.multiclass_family(k)
    pts = _simplex_points(k, seed=k)
    got = families.evaluate(fam, pts)
    assert got.shape == (pts.shape[0], fam.size, k)
    np.testing.assert_allclose(got, _multiclass_values(fam, pts), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(got.sum(axis=2), 1.0, atol=1e-13)
    assert np.all(got >= 0.0)


def test_evaluate_multiclass_with_k2_alpha_on_class_1_equals_binary_cox2():
    """Paper 001 eq. (1) with K = 2 and alpha = (0, a) is paper 000 eq. (5) on P(y = 1)."""
    binary = families.binary_family("cox2")
    multi = families.Family(
        "cox2",
        2,
        np.column_stack([np.zeros(binary.size), binary.betas]),
        np.column_stack([np.zeros(binary.size), binary.params[:, 0]]),
    )
    p = GRID[1:-1]
    got = families.evaluate(multi, np.column_stack([1.0 - p, p]))[:, :, 1]
    np.testing.assert_allclose(got, families.evaluate(binary, p), atol=1e-15)


# ----------------------------------------------------------------------------------------------
# identity_index
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("quadratic", (-1.0, 0.5, 0.0, 1.0), 2),
        ("quadratic", (-1.0, -0.5, 0.5, 1.0), None),
        ("cubic", ((0.5, 0.5), (0.0, 0.3)), 1),
        ("cubic", ((1.0, 0.5),), None),
        ("cox", (0.5, 2.0, 1.0), 2),
        ("cox", (0.5, 2.0), None),
        ("cox2", ((1.0, 1.0), (0.0, 0.5), (0.0, 1.0), (0.0, 1.0)), 2),
        ("cox2", ((1.0, 1.0), (-1.0, 1.0)), None),
    ],
)
def test_identity_index_finds_the_first_identity_or_none(name, params, expected):
    assert families.binary_family(name, params).identity_index == expected


def test_identity_index_multiclass():
    assert families.multiclass_family(4, "cox", betas=(2.0, 0.5, 1.0)).identity_index == 2
    assert families.multiclass_family(4, "cox", betas=(2.0, 0.5)).identity_index is None
