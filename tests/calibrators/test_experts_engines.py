"""The default method's engines give the same bits (calpipe.calibrators.experts,
``CompositeExperts.engine``): "fused" (OPS / OBS / decay-beta learnt inside the lanes kernel,
:mod:`calpipe.kernels.expert_lanes`), "per-input" (each input's kernel, then the mixture in
lanes) and "per-stream" (each input's kernel, then the mixture one stream at a time: the path
before lanes). Forecasts, martingales and the whole state -- the inputs' own test martingales
included -- are equal to the bit, so QUALITY.md cannot change."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import calpipe
from calpipe import config
from calpipe.calibrators import make_calibrator
from calpipe.calibrators.experts import CompositeExperts
from calpipe.calibrators.gale import likelihood_gale, likelihood_gale_ends
from calpipe.kernels.ops import OP_FORECAST
from tests.kernels.ops import make_ops

ENGINES = ("fused", "per-input", "per-stream")
SMALL = ("ops", "obs", "decay-beta:memory=12", "decay-beta:memory=30")
EDGES = ("ops:radius=1.5", "obs:radius=1.5:score_clip=0.05",
         "decay-beta:memory=4:warmup=2:refit_every=1:n_bins=7")  # fmt: skip
#: decay-venn-abers in the lanes (IN_DECAY_VA): beside a decay-beta of the same bins (their bin
#: of a log-odds shared), alone with its own bins, and refitting at every label
DECAY_VA = ("ops", "decay-beta:memory=12", "decay-venn-abers:memory=12",
            "decay-venn-abers:memory=4:warmup=2:refit_every=1:n_bins=7")  # fmt: skip


@pytest.fixture
def engine(monkeypatch):
    def use(name):
        monkeypatch.setattr(CompositeExperts, "engine", name)

    return use


def _batch(seed, n, n_streams):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    edge = rng.random(n) < 0.05
    x[edge] = rng.choice([0.0, 1.0, 1e-5, 0.995], size=int(edge.sum()))
    y = (rng.uniform(size=n) < x**1.4).astype(np.int64)
    return x, y, make_ops(rng, n, n_streams, p_unlabelled=0.1, p_delayed=0.2)


def _runs(engine, cal, x, y, ops, state):
    out = {}
    for name in ENGINES:
        engine(name)
        out[name] = cal.run_batch(cal.prepare_scores(x), y, ops.op_event, ops.op_kind,
                                  ops.op_offsets, state)  # fmt: skip
    return out


def _assert_same(a, b):
    (oa, sa), (ob, sb) = a, b
    np.testing.assert_array_equal(oa.protected, ob.protected)
    np.testing.assert_array_equal(oa.log10_martingale, ob.log10_martingale)
    np.testing.assert_array_equal(sa.values, sb.values)
    np.testing.assert_array_equal(sa.offsets, sb.offsets)
    np.testing.assert_array_equal(sa.log10m, sb.log10m)


@pytest.mark.parametrize("n_streams", [1, 65, 200])
@pytest.mark.parametrize(
    "inputs",
    [SMALL, EDGES, (), DECAY_VA],
    ids=["small-memories", "projections", "base-only", "decay-venn-abers"],
)
def test_engines_give_the_same_bits(engine, n_streams, inputs):
    cal = make_calibrator("composite-experts", inputs=inputs)
    x, y, ops = _batch(n_streams, 40 * n_streams, n_streams)
    state = cal.initial_state(n_streams, 2)
    runs = _runs(engine, cal, x, y, ops, state)
    _assert_same(runs["fused"], runs["per-stream"])
    _assert_same(runs["per-input"], runs["per-stream"])
    # a second batch from the carried state (pending copies and refits included)
    x2, y2, ops2 = _batch(n_streams + 1, 30 * n_streams, n_streams)
    again = _runs(engine, cal, x2, y2, ops2, runs["per-stream"][1])
    _assert_same(again["fused"], again["per-stream"])


def test_a_windowed_input_takes_the_per_input_path_with_the_same_bits(engine):
    cal = make_calibrator("composite-experts", inputs=("ops", "beta:window=20:refit_every=5"))
    assert cal.lane_inputs() is None
    x, y, ops = _batch(3, 4000, 130)
    runs = _runs(engine, cal, x, y, ops, cal.initial_state(130, 2))
    _assert_same(runs["fused"], runs["per-stream"])
    _assert_same(runs["per-input"], runs["per-stream"])


def test_the_default_through_protect_with_label_time_is_the_same_frame(engine):
    """End to end: calpipe.protect with delayed labels (label_time), the default inputs."""
    rng = np.random.default_rng(8)
    n = 6000
    t0 = pl.datetime(2026, 1, 1)
    df = pl.DataFrame({
        "stream": rng.integers(0, 90, n).astype(str), "event_id": np.arange(n),
        "score": rng.uniform(0, 1, n), "label": rng.integers(0, 2, n),
        "lag": rng.integers(0, 400, n),
    }).with_columns(
        (t0 + pl.duration(seconds=pl.col("event_id"))).alias("event_time"),
    ).with_columns(
        (pl.col("event_time") + pl.duration(seconds=pl.col("lag"))).alias("label_time")
    )  # fmt: skip
    frames = {}
    for name in ("fused", "per-stream"):
        engine(name)
        res = calpipe.protect_with_state(df, label_time="label_time")
        frames[name] = (res.scores, res.state)
    assert frames["fused"][0].equals(frames["per-stream"][0])
    assert frames["fused"][1].equals(frames["per-stream"][1])


#: chunks of the ops (config.CHUNK_ROWS) that cut every stream, some, or none
CHUNKS = [1, 13, 1 << 15]


def with_empty_streams(op_offsets: np.ndarray) -> np.ndarray:
    """The ops' offsets with a stream of no ops first, third and last."""
    o = op_offsets
    return np.concatenate([[0], o[:2], o[1:], [o[-1]]]).astype(np.int64)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_likelihood_gale_ends_equals_likelihood_gale_row_by_row(chunk, monkeypatch):
    monkeypatch.setattr(config, "CHUNK_ROWS", chunk)
    rng = np.random.default_rng(4)
    ops = make_ops(rng, 500, 7)
    ops.op_offsets = with_empty_streams(ops.op_offsets)
    m = ops.op_event.shape[0]
    f = rng.uniform(0, 1, (3, m))
    f[:, ::17] = 0.0
    base = rng.uniform(0, 1, m)
    y = rng.integers(-1, 2, m)
    upd = ops.op_kind != OP_FORECAST
    m0 = rng.normal(0, 1, (3, 10))
    ends = likelihood_gale_ends(f, base, y, upd, ops.op_offsets, m0, config.DEFAULT_CLIP_EPS)
    for i in range(3):
        _, want = likelihood_gale(f[i], base, y, upd, ops.op_offsets, m0[i],
                                  config.DEFAULT_CLIP_EPS)  # fmt: skip
        np.testing.assert_array_equal(ends[i], want)


# ----------------------------------------------------------------------------------------------
# K classes: "fused" (online vector scaling learnt inside the K-class lanes kernel,
# :mod:`calpipe.kernels.expert_lanes_multiclass`) against "per-input" and "per-stream"
# ----------------------------------------------------------------------------------------------
K_INPUTS = (None, ("ops:radius=1.5:score_clip=0.05",), ("ops", "ops:gamma=0.5:radius=2"), (),
            ("ops", "oms"), ("oms:radius=1.5:score_clip=0.05",))  # fmt: skip


def _batch_k(seed, n, n_streams, k):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, 0.5), n)
    p[rng.random(n) < 0.05, 0] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) < rng.random(n)[:, None]).sum(axis=1).clip(0, k - 1)
    return p, y.astype(np.int64), make_ops(rng, n, n_streams, p_unlabelled=0.1, p_delayed=0.2)


@pytest.mark.parametrize("n_streams", [1, 65, 200])
@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize(
    "inputs", K_INPUTS, ids=["default", "projections", "two-ops", "base", "ops-oms", "oms-proj"]
)
def test_k_class_engines_give_the_same_bits(engine, n_streams, k, inputs):
    kw = {} if inputs is None else {"inputs": inputs}
    cal = make_calibrator("composite-experts", **kw)
    assert cal.lane_inputs_multiclass(k) is not None  # the fused path runs
    x, y, ops = _batch_k(n_streams + k, 30 * n_streams, n_streams, k)
    state = cal.initial_state(n_streams, k)
    runs = _runs(engine, cal, x, y, ops, state)
    _assert_same(runs["fused"], runs["per-stream"])
    _assert_same(runs["per-input"], runs["per-stream"])
    # a second batch from the carried state (labels of the first batch's events pending)
    x2, y2, ops2 = _batch_k(n_streams + 1, 20 * n_streams, n_streams, k)
    again = _runs(engine, cal, x2, y2, ops2, runs["per-stream"][1])
    _assert_same(again["fused"], again["per-stream"])


def test_k_class_input_without_a_lane_kernel_takes_the_per_input_path(engine):
    cal = make_calibrator(
        "composite-experts", inputs=("ops", "temperature:window=20:refit_every=5")
    )
    assert cal.lane_inputs_multiclass(3) is None
    x, y, ops = _batch_k(3, 3000, 70, 3)
    runs = _runs(engine, cal, x, y, ops, cal.initial_state(70, 3))
    _assert_same(runs["fused"], runs["per-stream"])


def test_k_class_oms_beyond_its_class_limit_is_refused_not_laned():
    """oms runs in the lanes up to config.OMS_MAX_CLASSES (its own limit; ops: NP_BLOCK)."""
    cal = make_calibrator("composite-experts", inputs=("ops", "oms"))
    assert cal.lane_inputs_multiclass(config.OMS_MAX_CLASSES) is not None
    assert cal.lane_inputs_multiclass(config.OMS_MAX_CLASSES + 1) is None
    assert make_calibrator("composite-experts", inputs=("ops",)).lane_inputs_multiclass(
        config.OMS_MAX_CLASSES + 1
    ) is not None  # fmt: skip


def test_the_k_class_default_through_protect_with_label_time_is_the_same_frame(engine):
    """End to end: calpipe.protect on K = 3 scores with delayed labels (label_time)."""
    rng = np.random.default_rng(9)
    n = 5000
    t0 = pl.datetime(2026, 1, 1)
    p = rng.dirichlet(np.full(3, 0.7), n)
    df = pl.DataFrame({
        "stream": rng.integers(0, 80, n).astype(str), "event_id": np.arange(n),
        "scores": p.tolist(), "label": rng.integers(0, 3, n), "lag": rng.integers(0, 400, n),
    }).with_columns(
        (t0 + pl.duration(seconds=pl.col("event_id"))).alias("event_time"),
    ).with_columns(
        (pl.col("event_time") + pl.duration(seconds=pl.col("lag"))).alias("label_time")
    )  # fmt: skip
    frames = {}
    for name in ("fused", "per-input"):
        engine(name)
        res = calpipe.protect_with_state(df, scores="scores", label_time="label_time")
        frames[name] = (res.scores, res.state)
    assert frames["fused"][0].equals(frames["per-input"][0])
    assert frames["fused"][1].equals(frames["per-input"][1])


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("k", [3, 4, 9])
def test_likelihood_gale_ends_of_k_classes_equals_likelihood_gale_row_by_row(k, chunk, monkeypatch):
    monkeypatch.setattr(config, "CHUNK_ROWS", chunk)
    rng = np.random.default_rng(k)
    ops = make_ops(rng, 500, 7)
    ops.op_offsets = with_empty_streams(ops.op_offsets)
    m = ops.op_event.shape[0]
    f = rng.dirichlet(np.full(k, 0.5), (3, m))
    f[:, ::17, 0] = 0.0
    base = rng.dirichlet(np.full(k, 0.5), m)
    y = rng.integers(-1, k, m)
    upd = ops.op_kind != OP_FORECAST
    m0 = rng.normal(0, 1, (3, 10))
    ends = likelihood_gale_ends(f, base, y, upd, ops.op_offsets, m0, 1e-3)
    for i in range(3):
        _, want = likelihood_gale(f[i], base, y, upd, ops.op_offsets, m0[i], 1e-3)
        np.testing.assert_array_equal(ends[i], want)
