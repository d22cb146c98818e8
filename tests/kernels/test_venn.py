"""The Venn predictor kernels of calpipe.kernels.venn against paper 002's definition.

The oracle is the Venn probability machine of paper 002 §3 read literally: complete the new object
with each postulated label y, take the group G of the examples seen so far with the new object's
category, and output the empirical label distribution p_y of G. The bounds are min_y / max_y of
p_y(c); the point forecast is checked against the Venn-ABERS merge p1 / (1 - p0 + p1) (binary) and,
for K classes, against a linear program (minimax log-loss regret over the convex hull of {p_y})
and against its optimality conditions. Invariants: prequential, chunked = one pass bit for bit,
streams independent, lower <= p <= upper, rows summing to 1, and validity on i.i.d. data
(Theorem 1 of paper 002).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from calpipe.kernels import venn as V
from tests.kernels.ops import Ops, make_ops, step_ops

SEEDS = st.integers(0, 2**32 - 1)
FEW = settings(max_examples=30, deadline=None)
ATOL = 1e-12


# ----------------------------------------------------------------------------------------------
# Random operation lists
# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# Oracles straight from paper 002 §3
# ----------------------------------------------------------------------------------------------
def venn_multiprobability(bag_labels: list[int], k: int) -> np.ndarray:
    """Row y = p_y: the label distribution of the group G = bag + (new object, y)."""
    rows = np.empty((k, k))
    for y in range(k):
        group = [*bag_labels, y]
        for c in range(k):
            rows[y, c] = sum(1 for lab in group if lab == c) / len(group)
    return rows


def minimax_hull_lp(rows: np.ndarray) -> np.ndarray:
    """max s s.t. sum_y w_y p_y(c) >= s * max_y p_y(c) for all c, w in the simplex; q = w @ rows.

    Maximising min_c q_c / upper_c = minimising max_c ln(upper_c / q_c) (log-loss regret against
    the calibrated member p_c when class c occurs), over the convex hull of the multiprobability."""
    k = rows.shape[0]
    upper = rows.max(axis=0)
    cost = np.zeros(k + 1)
    cost[-1] = -1.0
    a_ub = np.hstack([-rows.T, upper[:, None]])  # s * upper_c - q_c <= 0
    a_eq = np.hstack([np.ones((1, k)), np.zeros((1, 1))])
    bounds = [(0, None)] * k + [(None, None)]
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=[1.0], bounds=bounds)
    assert res.success
    return res.x[:k] @ rows


def oracle_online(cat, y, ops: Ops, k: int, bags0=None):
    """Per-op loop: each stream keeps its bag of (category, label) examples."""
    n = cat.shape[0]
    p, lo, hi = (np.full((n, k), np.nan) for _ in range(3))
    n_streams = ops.op_offsets.shape[0] - 1
    for s in range(n_streams):
        bag: list[tuple[int, int]] = [] if bags0 is None else list(bags0[s])
        for e, kind in ops.stream(s):
            if kind != V.OP_UPDATE:
                rows = venn_multiprobability([lab for c, lab in bag if c == cat[e]], k)
                lo[e], hi[e] = rows.min(axis=0), rows.max(axis=0)
                if k == 2:
                    p0, p1 = rows[0, 1], rows[1, 1]  # Venn-ABERS notation: P(label 1)
                    p[e, 1] = p1 / (1.0 - p0 + p1)
                    p[e, 0] = 1.0 - p[e, 1]
                else:
                    p[e] = minimax_hull_lp(rows)
            if kind != V.OP_FORECAST:
                bag.append((int(cat[e]), int(y[e])))
    return p, lo, hi


def random_problem(seed: int, k: int | None = None):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5)) if k is None else k
    n_cat = int(rng.integers(1, 5))
    n = int(rng.integers(1, 120))
    n_streams = int(rng.integers(1, 4))
    cat = rng.integers(0, n_cat, n)
    # Skewed labels so some groups get dominant classes (the water-filling branch of the merge).
    probs = rng.dirichlet(np.full(k, 0.3), size=n_cat)
    y = np.array([rng.choice(k, p=probs[c]) for c in cat], dtype=np.int64)
    ops = make_ops(rng, n, n_streams)
    return rng, k, n_cat, cat, y, ops


def run(cat, y, ops: Ops, counts, scores=None):
    return V.venn_online(scores, cat, y, ops.op_event, ops.op_kind, ops.op_offsets, counts)


# ----------------------------------------------------------------------------------------------
# Online kernel against the paper
# ----------------------------------------------------------------------------------------------
@FEW
@given(SEEDS)
def test_online_matches_paper_oracle(seed):
    _rng, k, n_cat, cat, y, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    p, lo, hi, counts = run(cat, y, ops, V.venn_initial_counts(n_streams, n_cat, k))
    op, olo, ohi = oracle_online(cat, y, ops, k)
    if k == 2:  # binary output: the probability of label 1
        op, olo, ohi = op[:, 1], olo[:, 1], ohi[:, 1]
    np.testing.assert_allclose(lo, olo, atol=ATOL, rtol=0)
    np.testing.assert_allclose(hi, ohi, atol=ATOL, rtol=0)
    # Binary: the closed-form Venn-ABERS merge (1e-12). K classes: an LP solver (its tolerance).
    np.testing.assert_allclose(p, op, atol=ATOL if k == 2 else 1e-7, rtol=0)
    assert np.array_equal(np.isnan(p), np.isnan(op))
    # The counts: one per update, in the event's (category, label) cell.
    upd = ops.op_event[ops.op_kind != V.OP_FORECAST]
    assert counts.sum() == upd.size
    for s in range(n_streams):
        ev = [e for e, kind in ops.stream(s) if kind != V.OP_FORECAST]
        want = np.zeros((n_cat, k))
        np.add.at(want, (cat[ev], y[ev]), 1.0)
        assert np.array_equal(counts[s], want)


@FEW
@given(SEEDS)
def test_initial_counts_act_as_earlier_examples(seed):
    """A non-zero state in equals the bag of examples it counts (state carried across calls)."""
    rng, k, n_cat, cat, y, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    counts0 = rng.integers(0, 6, (n_streams, n_cat, k)).astype(np.float64)
    bags = [
        [(c, lab) for c in range(n_cat) for lab in range(k) for _ in range(int(counts0[s, c, lab]))]
        for s in range(n_streams)
    ]
    p, lo, hi, _ = run(cat, y, ops, counts0)
    op, olo, ohi = oracle_online(cat, y, ops, k, bags)
    if k == 2:
        op, olo, ohi = op[:, 1], olo[:, 1], ohi[:, 1]
    np.testing.assert_allclose(lo, olo, atol=ATOL, rtol=0)
    np.testing.assert_allclose(hi, ohi, atol=ATOL, rtol=0)
    np.testing.assert_allclose(p, op, atol=ATOL if k == 2 else 1e-7, rtol=0)


# ----------------------------------------------------------------------------------------------
# The merge: minimax log-loss regret in the hull, lower <= p <= upper, sum 1
# ----------------------------------------------------------------------------------------------
count_vectors = st.lists(
    st.one_of(st.integers(0, 3), st.integers(0, 10_000)), min_size=2, max_size=7
)


@settings(max_examples=60, deadline=None)
@given(count_vectors)
def test_merge_optimality_conditions(cnt):
    """KKT conditions of min_{q in hull} max_c upper_c / q_c, which prove optimality: with
    q_c = (n_c + w_c) / (n + 1), w in the simplex, the ratio upper_c / q_c equals a common r on
    the classes with w_c > 0 and is <= r where w_c = 0 (any other q' in the hull has
    w'_c <= w_c for some active c, hence a ratio >= r there)."""
    cnt = np.array(cnt, dtype=np.float64)
    k = cnt.size
    counts = cnt.reshape(1, 1, k)
    p, lo, hi, _ = V.venn_online(
        np.full((1, k), 1.0 / k), np.zeros(1, np.int64), np.zeros(1, np.int64),
        np.zeros(1, np.int64), np.full(1, V.OP_FORECAST, np.int8), np.array([0, 1]), counts,
    )  # fmt: skip
    p, lo, hi = p[0], lo[0], hi[0]
    n = cnt.sum()
    np.testing.assert_allclose(lo, cnt / (n + 1), rtol=1e-15, atol=0)
    np.testing.assert_allclose(hi, (cnt + 1) / (n + 1), rtol=1e-15, atol=0)
    assert abs(p.sum() - 1.0) <= 1e-12
    assert np.all(lo - 1e-15 <= p) and np.all(p <= hi + 1e-15)
    w = p * (n + 1) - cnt
    assert np.all(w >= -1e-9 * (n + 1)) and abs(w.sum() - 1.0) <= 1e-9 * (n + 1)
    ratio = hi / p
    active = w > 1e-9 * (n + 1)
    r = ratio[active].max()
    np.testing.assert_allclose(ratio[active], r, rtol=1e-12)
    assert np.all(ratio[~active] <= r * (1 + 1e-12))
    if (k - 1) * cnt.max() <= n + 1:  # Laplace's rule of succession in the group
        np.testing.assert_allclose(p, (cnt + 1) / (n + k), rtol=1e-15)


def test_merge_example_outside_laplace():
    """K = 3, counts (10, 0, 0): normalised upper (11/13, 1/13, 1/13) would fall below lower_0 =
    10/11; the hull merge keeps class 0 at 10/11 and splits the rest: (10/11, 1/22, 1/22)."""
    p, lo, hi, _ = V.venn_online(
        None, np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64),
        np.full(1, V.OP_FORECAST, np.int8), np.array([0, 1]),
        np.array([[[10.0, 0.0, 0.0]]]),
    )  # fmt: skip
    np.testing.assert_allclose(p[0], [10 / 11, 1 / 22, 1 / 22], rtol=1e-15)
    np.testing.assert_allclose(lo[0], [10 / 11, 0, 0], rtol=1e-15)
    np.testing.assert_allclose(hi[0], [1, 1 / 11, 1 / 11], rtol=1e-15)


# ----------------------------------------------------------------------------------------------
# Invariants of the online kernel
# ----------------------------------------------------------------------------------------------
@FEW
@given(SEEDS)
def test_prequential(seed):
    """Changing a label never changes its own forecast or any earlier one."""
    rng, k, n_cat, cat, y, _ = random_problem(seed)
    n = cat.size
    ops = step_ops(n)
    counts = V.venn_initial_counts(1, n_cat, k)
    base = run(cat, y, ops, counts)
    j = int(rng.integers(0, n))
    y2 = y.copy()
    y2[j] = (y[j] + 1 + int(rng.integers(0, k - 1))) % k
    other = run(cat, y2, ops, counts)
    for a, b in zip(base[:3], other[:3], strict=True):
        assert np.array_equal(a[: j + 1], b[: j + 1])
    if j + 1 < n:  # and the change is seen later (in the same category)
        later = np.flatnonzero(cat[j + 1 :] == cat[j])
        if later.size:
            assert not np.array_equal(base[1][j + 1 + later[0]], other[1][j + 1 + later[0]])


@FEW
@given(SEEDS)
def test_chunked_equals_one_pass(seed):
    """Running the op list in chunks with the counts carried over = one pass, bit for bit."""
    rng, k, n_cat, cat, y, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    counts0 = V.venn_initial_counts(n_streams, n_cat, k)
    full = run(cat, y, ops, counts0)
    n_chunks = int(rng.integers(1, 5))
    cuts = [
        np.sort(rng.integers(0, len(ops.stream(s)) + 1, n_chunks - 1)) for s in range(n_streams)
    ]
    counts = counts0
    outs = [np.full_like(a, np.nan) for a in full[:3]]
    for c in range(n_chunks):
        ev, kind, off = [], [], [0]
        for s in range(n_streams):
            bounds = [0, *cuts[s].tolist(), len(ops.stream(s))]
            part = ops.stream(s)[bounds[c] : bounds[c + 1]]
            ev += [e for e, _ in part]
            kind += [kk for _, kk in part]
            off.append(len(ev))
        chunk = Ops(np.array(ev, np.int64), np.array(kind, np.int8), np.array(off, np.int64))
        *res, counts = run(cat, y, chunk, counts)
        for out, r in zip(outs, res, strict=True):
            done = ~np.isnan(r)
            out[done] = r[done]
    for a, b in zip(full[:3], outs, strict=True):
        assert np.array_equal(a, b, equal_nan=True)
    assert np.array_equal(full[3], counts)


@FEW
@given(SEEDS)
def test_streams_independent(seed):
    _rng, k, n_cat, cat, y, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    full = run(cat, y, ops, V.venn_initial_counts(n_streams, n_cat, k))
    for s in range(n_streams):
        lo, hi = ops.op_offsets[s], ops.op_offsets[s + 1]
        alone = Ops(ops.op_event[lo:hi], ops.op_kind[lo:hi], np.array([0, hi - lo]))
        res = run(cat, y, alone, V.venn_initial_counts(1, n_cat, k))
        mine = np.unique(ops.op_event[lo:hi])
        for a, b in zip(full[:3], res[:3], strict=True):
            assert np.array_equal(a[mine], b[mine], equal_nan=True)
        assert np.array_equal(full[3][s], res[3][0])


@FEW
@given(SEEDS)
def test_bounds_and_rows(seed):
    _rng, k, n_cat, cat, y, ops = random_problem(seed)
    n_streams = ops.op_offsets.shape[0] - 1
    p, lo, hi, _ = run(cat, y, ops, V.venn_initial_counts(n_streams, n_cat, k))
    seen = ~np.isnan(p) if p.ndim == 1 else ~np.isnan(p[:, 0])
    assert np.all(lo[seen] <= p[seen]) and np.all(p[seen] <= hi[seen])
    assert np.all(lo[seen] >= 0) and np.all(hi[seen] <= 1)
    if k == 2:
        assert p.ndim == 1
    else:
        np.testing.assert_allclose(p[seen].sum(axis=1), 1.0, atol=1e-12)


def test_inputs_not_written():
    rng = np.random.default_rng(3)
    cat = rng.integers(0, 3, 50)
    y = rng.integers(0, 2, 50)
    ops = make_ops(rng, 50, 2)
    counts = V.venn_initial_counts(2, 3, 2)
    copies = [a.copy() for a in (cat, y, ops.op_event, ops.op_kind, ops.op_offsets, counts)]
    run(cat, y, ops, counts)
    for a, b in zip(
        (cat, y, ops.op_event, ops.op_kind, ops.op_offsets, counts), copies, strict=True
    ):
        assert np.array_equal(a, b)


def test_wrapper_validates_shapes():
    ops = step_ops(3)
    with pytest.raises(ValueError, match="categories"):
        run(np.array([0, 5, 1]), np.array([0, 1, 0]), ops, V.venn_initial_counts(1, 2))
    with pytest.raises(ValueError, match="labels"):
        run(np.array([0, 1, 1]), np.array([0, 2, 0]), ops, V.venn_initial_counts(1, 2))
    with pytest.raises(ValueError, match="edges"):
        V.venn_online(np.zeros(3), None, np.zeros(3), *ops.__dict__.values(), np.zeros((1, 1, 2)))


# ----------------------------------------------------------------------------------------------
# Validity (paper 002 Theorem 1) on i.i.d. data
# ----------------------------------------------------------------------------------------------
def test_validity_on_iid_data():
    """i.i.d. events whose base score is miscalibrated (true P(y=1 | s) = s^2), taxonomy = score
    bins from a separate calibration window. The calibrated member p_{y_n} (postulated label =
    true label) has E[y_n - p_{y_n}(1)] = 0 by exchangeability within each group (the new example
    is a uniformly random member of its group), so its running error is O(sqrt(N)); hence
    mean(lower) <= frequency <= mean(upper) up to the same sampling error, overall and per bin."""
    rng = np.random.default_rng(20240601)
    window = rng.random(2000)
    edges = V.equal_mass_edges(window, 8)
    n = 20_000
    s = rng.random(n)
    y = (rng.random(n) < s**2).astype(np.int64)
    cat = V.category_of(s, edges)
    ops = step_ops(n)
    p, lo, hi, _ = V.venn_online(
        s, None, y, ops.op_event, ops.op_kind, ops.op_offsets,
        V.venn_initial_counts(1, edges.size + 1), edges=edges,
    )  # fmt: skip
    true_member = np.where(y == 1, hi, lo)
    se = np.sqrt(np.mean(true_member * (1 - true_member)) / n)
    assert abs(np.mean(y - true_member)) <= 4 * se
    freq = y.mean()
    assert lo.mean() - 4 * se <= freq <= hi.mean() + 4 * se
    for b in range(edges.size + 1):
        m = cat == b
        se_b = np.sqrt(0.25 / m.sum())
        assert lo[m].mean() - 4 * se_b <= y[m].mean() <= hi[m].mean() + 4 * se_b
        # The merge is within upper - lower = 1/(n_k + 1) of the calibrated member, and
        # sum_{n_k < m} 1/(n_k + 1) <= 1 + ln m: calibrated in each bin where the base is not.
        assert abs(p[m].mean() - y[m].mean()) <= 4 * se_b + (1 + np.log(m.sum())) / m.sum()
    base_gap = np.abs([s[cat == b].mean() - y[cat == b].mean() for b in range(edges.size + 1)])
    assert base_gap.max() > 0.1  # the base is visibly miscalibrated, so the test can fail


# ----------------------------------------------------------------------------------------------
# Taxonomy helpers
# ----------------------------------------------------------------------------------------------
@FEW
@given(SEEDS, st.integers(1, 12))
def test_equal_mass_edges_distinct_scores(seed, n_bins):
    """Distinct scores: bin k holds exactly round((k+1) n / B) - round(k n / B) calibration points
    (dropping the empty targets when n < B)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    s = rng.permutation(np.unique(rng.random(n)))
    n = s.size
    edges = V.equal_mass_edges(s, n_bins)
    assert np.all(np.diff(edges) > 0)
    sizes = np.bincount(V.category_of(s, edges), minlength=edges.size + 1)
    targets = [int(np.floor(j * n / n_bins + 0.5)) for j in range(n_bins + 1)]
    want = np.diff(np.unique(targets))
    assert sizes.tolist() == want.tolist()


@FEW
@given(SEEDS, st.integers(1, 12))
def test_equal_mass_edges_ties(seed, n_bins):
    """Heavy ties: edges strictly increasing, each strictly between two distinct consecutive
    calibration values (so no tie block is split and no bin of the window is empty), at most
    B - 1 of them."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    s = rng.choice(rng.random(int(rng.integers(1, 6))), n)
    edges = V.equal_mass_edges(s, n_bins)
    assert edges.size <= max(n_bins - 1, 0)
    assert np.all(np.diff(edges) > 0)
    v = np.unique(s)
    for e in edges:
        i = np.searchsorted(v, e, side="left")
        assert 0 < i < v.size and v[i - 1] < e <= v[i]
    assert np.all(np.bincount(V.category_of(s, edges)) > 0)


def test_equal_mass_edges_degenerate():
    assert V.equal_mass_edges(np.array([0.3]), 10).size == 0
    assert V.equal_mass_edges(np.full(50, 0.7), 10).size == 0
    assert V.equal_mass_edges(np.array([]), 10).size == 0


@FEW
@given(SEEDS)
def test_category_of_multiclass(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    s = rng.dirichlet(np.ones(k), 30)
    edges = np.sort(rng.random(int(rng.integers(0, 4))))
    got = V.category_of(s, edges)
    for i in range(30):
        top = int(np.argmax(s[i]))
        assert got[i] == top * (edges.size + 1) + sum(e <= s[i, top] for e in edges)


# ----------------------------------------------------------------------------------------------
# Batch fit / predict
# ----------------------------------------------------------------------------------------------
@FEW
@given(SEEDS, st.sampled_from(["binary", "multiclass", "categories"]))
def test_batch_equals_online_and_oracle(seed, kind):
    """predict after fit = the online kernel with every calibration label learned (OP_UPDATE) and
    the test events forecast (OP_FORECAST), and = the paper oracle on the window's groups."""
    rng = np.random.default_rng(seed)
    k = 2 if kind == "binary" else int(rng.integers(2, 5))
    n_cal, n_test = int(rng.integers(1, 150)), int(rng.integers(1, 40))
    n = n_cal + n_test
    if kind == "binary":
        s = rng.random(n)
        s[rng.random(n) < 0.3] = 0.5  # ties
        s[-1] = 1.2  # outside the calibration range (uncapped by contract)
    else:
        s = rng.dirichlet(np.ones(k), n)
    y = rng.integers(0, k, n)
    n_bins = int(rng.integers(1, 8))
    categories = rng.integers(0, 4, n) if kind == "categories" else None
    fitted = V.fit(
        s[:n_cal], y[:n_cal], n_bins=n_bins,
        categories=None if categories is None else categories[:n_cal], n_categories=4,
    )  # fmt: skip
    assert fitted.ndim == 1 and fitted.dtype == np.float64 and np.all(np.isfinite(fitted))
    pred = V.predict(fitted, s[n_cal:], None if categories is None else categories[n_cal:])
    if categories is None:
        edges = V.equal_mass_edges(s[:n_cal] if s.ndim == 1 else s[:n_cal].max(axis=1), n_bins)
        cat = V.category_of(s, edges)
        n_cat = V.n_categories_of(edges, k, s.ndim == 2)
    else:
        cat, n_cat = categories, 4
    ops = Ops(
        np.arange(n, dtype=np.int64),
        np.array([V.OP_UPDATE] * n_cal + [V.OP_FORECAST] * n_test, np.int8),
        np.array([0, n], np.int64),
    )
    p, lo, hi, _ = V.venn_online(
        s, cat, y, ops.op_event, ops.op_kind, ops.op_offsets, V.venn_initial_counts(1, n_cat, k)
    )
    assert np.array_equal(pred.p, p[n_cal:])
    assert np.array_equal(pred.p_lower, lo[n_cal:])
    assert np.array_equal(pred.p_upper, hi[n_cal:])
    for i in range(n_cal, n):
        rows = venn_multiprobability([int(y[j]) for j in range(n_cal) if cat[j] == cat[i]], k)
        lo_i, hi_i = rows.min(axis=0), rows.max(axis=0)
        if kind == "binary":
            lo_i, hi_i = lo_i[1], hi_i[1]
        np.testing.assert_allclose(pred.p_lower[i - n_cal], lo_i, atol=ATOL, rtol=0)
        np.testing.assert_allclose(pred.p_upper[i - n_cal], hi_i, atol=ATOL, rtol=0)
    # Deterministic: the same window gives the same vector bit for bit.
    again = V.fit(
        s[:n_cal], y[:n_cal], n_bins=n_bins,
        categories=None if categories is None else categories[:n_cal], n_categories=4,
    )  # fmt: skip
    assert np.array_equal(fitted, again)


@pytest.mark.parametrize(
    ("scores", "labels"),
    [
        (np.array([0.4]), np.array([1])),  # one point
        (np.full(20, 0.3), np.arange(20) % 2),  # all tied
        (np.linspace(0, 1, 20), np.zeros(20, np.int64)),  # one class
    ],
)
def test_fit_degenerate(scores, labels):
    fitted = V.fit(scores, labels, n_bins=10)
    assert np.all(np.isfinite(fitted))
    pred = V.predict(fitted, np.array([-0.1, 0.0, 0.3, 0.5, 1.0, 2.0]))
    assert np.all(pred.p_lower <= pred.p) and np.all(pred.p <= pred.p_upper)
    n1, n = labels.sum(), labels.size
    if np.unique(scores).size == 1:  # one bin holds the whole window
        np.testing.assert_allclose(pred.p, (n1 + 1) / (n + 2), rtol=1e-15)


def test_predict_unseen_category_is_empty_group():
    fitted = V.fit(np.zeros((4, 3)) + 1 / 3, np.array([0, 1, 2, 2]), categories=np.zeros(4))
    pred = V.predict(fitted, np.zeros((3, 3)) + 1 / 3, categories=np.array([0, 1, -1]))
    np.testing.assert_allclose(pred.p[1:], 1 / 3, rtol=1e-15)
    np.testing.assert_allclose(pred.p_lower[1:], 0.0)
    np.testing.assert_allclose(pred.p_upper[1:], 1.0)
    np.testing.assert_allclose(pred.p_lower[0], [1 / 5, 1 / 5, 2 / 5], rtol=1e-15)


def test_water_filling_merge_stays_inside_the_bounds_at_the_last_ulp():
    """Regression: seed 7107 gave an active class 5.6e-17 below its lower bound (K = 4)."""
    _rng, k, n_cat, cat, y, ops = random_problem(7107)
    p, lo, hi, _ = run(cat, y, ops, V.venn_initial_counts(ops.op_offsets.shape[0] - 1, n_cat, k))
    seen = ~np.isnan(p[:, 0])
    assert np.all(lo[seen] <= p[seen]) and np.all(p[seen] <= hi[seen])
