"""The serving map: each stream's map p -> p' at the end of a day (``calibration_map``).

Owns the map's SQL form (:func:`has_sql_map`, :func:`map_terms`: per stream and layer, the
weighted terms of a mixture, a logistic or temperature map as one term, or a step/linear table
tabulated from the calibrator's own serving map at its breakpoints; the ``calibrate_score``
macros of ``sql/macros/`` evaluate them), the table's rows (:func:`map_rows`, written by
:func:`calpipe.pipeline.run_range` for each transaction's state rows) and :func:`serving_map`, the map applied to
fresh scores in polars for every method.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from calpipe.calibrators.stacked import Stacked
from calpipe.engine import state_from_rows
from calpipe.kernels import mixture
from calpipe.night.settings import Settings
from calpipe.serving import apply_serving_map


def map_weights(state: pl.DataFrame, settings: Settings) -> tuple[np.ndarray, np.ndarray]:
    """The serving map's weights of each state row: ``(P (n,), W (n, T))``, from the calibrator
    (:meth:`calpipe.calibrators.protected.ProtectedCalibrator.map_weights`)."""
    cal = settings.calibrator()
    return cal.map_weights(state_from_rows(cal, state, 2))


def has_sql_map(cal, n_classes: int = 2) -> bool:
    """Whether ``cal``'s serving map has a SQL form in ``calibration_map``: a mixture of
    calibrating functions (the log-loss protected methods; ``composite-experts`` over inputs
    with a logistic map or a step/linear table of their own, the tables as layers -1, -2, ...
    evaluated at the value the terms that read them receive, clipped: the score, or under a
    stack's top its base's value), a logistic map (Platt, beta,
    OPS/OBS, decay-beta), temperature scaling (family ``temperature``), a step or linear table (isotonic, ROC-isotonic,
    histogram, Venn, Venn-ABERS, the Venn predictor on score bins), calibrated regression in
    paper 004 §IV's closed form (family ``calreg``) or, with powers of or tents on the
    forecast, by the kernel's scan and bisection (family ``calreg_fp``), calibeating (the expert's logistic map,
    then a table of its forecast's bins: two layers), or a stack of two of these
    (``base_method``: its layers then the top's).

    K >= 3 classes (``calibrate_scores`` on a list): the log-loss protected mixtures and
    ``composite-experts`` over online vector scaling (Cox functions of the K-class family,
    paper 001 eq. (1)), ``ops`` (online vector scaling), temperature scaling, the maps made
    of binary step tables coupled across classes: histogram binning (one-vs-rest) and
    Venn-ABERS (one-vs-rest or one-vs-one pairwise coupling), the Venn taxonomies (a table of
    categories) and ROC-isotonic regression (a partition tree of the simplex, paper 003
    Algorithm 2). The Brier compatibility mode (binary and K classes): the weights of its
    next forecast, which the macros aggregate as its substitution shortcut does.

    Each calibrator declares its form (:meth:`calpipe.calibrators.Calibrator.sql_form`); this
    module writes the rows of each form."""
    return cal.sql_form(n_classes) is not None


def map_terms(state: pl.DataFrame, settings: Settings) -> pl.DataFrame:
    """``calibration_map`` rows of state rows (columns ``date``/``stream`` kept): each stream's
    map in its SQL form (:func:`has_sql_map`), one row per term (a mixture's terms; one term for
    a logistic map, with the map as the term's input ``in_*``) or per piece of a step/linear
    table (family ``step``/``linear``: ``x``, ``y_at``, ``y_right``, ``x_next``, ``y_next``),
    ``layer`` 0; each next layer is applied to the previous one's value: a calibeating method's
    bin table (family ``bins``: value ``y_at`` per equal-width bin ``term``) after its expert, a
    stack's top after its base (three layers when one of them is a calibeating method). A
    ``composite-experts`` input's table is a negative layer, numbered on from the base's to the
    top's (the base's -1 .. -a, the top's -(a + 1) ..): the terms that read one (``in_layer``)
    name the layer it is evaluated for, which the macros read, so no column says it."""
    cal = settings.calibrator()
    k = int(state["n_classes"][0]) if state.height else 2
    st = state_from_rows(cal, state, k)
    keys = state.select("date", "stream")
    if isinstance(cal, Stacked):
        rows, layer, n_tables = [], 0, 0
        for c, part in zip((cal.base, cal.top), cal.split_state(st, k), strict=True):
            more = _cal_rows(c, part, keys, layer, k, n_tables)
            rows += more
            layer += len(more)
            n_tables += len(c.table_input_indices()) if k == 2 else 0
    else:
        rows = _cal_rows(cal, st, keys, 0, k)
    out = pl.concat(rows, how="diagonal_relaxed").with_columns(
        pl.lit(cal.name).alias("method"), pl.lit(cal.fingerprint(k)).alias("config_fingerprint")
    )
    absent = [
        pl.lit(None, _TYPES.get(c, pl.Float64)).alias(c) for c in _COLUMNS if c not in out.columns
    ]
    return out.with_columns(absent).select(_COLUMNS)


def _cal_rows(
    cal, st, keys: pl.DataFrame, layer: int, k: int, tables_before: int = 0
) -> list[pl.DataFrame]:
    """The rows of one (non-stacked) calibrator's map from ``layer`` on, one frame per layer: a
    calibeating method takes two (its expert's map, then its forecast's bin), others one; its
    input tables, if any, from layer -(tables_before + 1) down (a stack's base's come first)."""
    if k == 2 and cal.sql_form() == "calibeat":
        expert, table = cal.calibeat_map(st)
        n = keys.height
        first = _term_frame(
            keys, 1, np.full(n, "identity"), np.zeros(n), np.zeros(n), np.ones(n),
            expert if expert is not None else np.full((n, 4), np.nan), 0.0, layer,
        )  # fmt: skip
        return [first, _bin_rows(table, keys, layer + 1)]
    return [_layer_rows(cal, st, keys, layer, k, tables_before)]


#: ``calibration_map``'s columns, in the table's order.
_COLUMNS = (
    "date", "stream", "term", "family", "a", "b", "weight", "clip", "method",
    "config_fingerprint", "in_w1", "in_w2", "in_w0", "in_eps", "layer", "x", "y_at", "y_right",
    "x_next", "y_next", "alphas", "in_ka", "in_kb", "y_k", "kids", "in_layer",
)  # fmt: skip
#: Columns of a term's input map in ``calibration_map`` (NULL: the clipped base).
_INPUT_COLUMNS = ("in_w1", "in_w2", "in_w0", "in_eps")
#: K-class columns (DOUBLE[]): a Cox term's class shifts, a term's vector scaling input.
_LIST_COLUMNS = ("alphas", "in_ka", "in_kb", "y_k", "kids")
#: The types of the columns a map may lack (the others are DOUBLE).
_TYPES = {c: pl.List(pl.Float64) for c in _LIST_COLUMNS} | {"in_layer": pl.Int32}


def _layer_rows(
    cal, st, keys: pl.DataFrame, layer: int, k: int = 2, tables_before: int = 0
) -> pl.DataFrame:
    """The rows of one calibrator's map (one layer) for the streams of ``st`` (``keys``); its
    input tables are layers -(tables_before + 1), -(tables_before + 2), ..."""
    form = cal.sql_form(k)
    if form == "brier":
        return _brier_rows(cal, st, keys, k, layer)
    if k > 2:
        return _k_rows(cal, st, keys, form, k, layer)
    if form == "terms":
        mt = cal.map_terms(st)
        n, t = mt.weight.shape
        inputs = mt.inputs if mt.inputs is not None else np.full((n, t, 4), np.nan)
        clip = float(cal.params["clip"])
        terms = _term_frame(
            keys, t, np.tile(mt.family, n), np.tile(mt.a, n), np.tile(mt.b, n),
            mt.weight.ravel(), inputs.reshape(n * t, 4), clip, layer,
        )  # fmt: skip
        if mt.in_table is None or not (mt.in_table >= 0).any():
            return terms
        # the input tables (layer -(tables_before + j + 1), evaluated at this layer's input
        # clipped, `clip` = the method's), and the terms that read one (`in_layer`): a stack's
        # base and top number theirs apart, and each layer's are contiguous (the set form
        # finds table j of a layer at its position among them, calpipe_term_layers)
        in_layer = np.where(mt.in_table >= 0, -(tables_before + mt.in_table + 1), 0)
        terms = terms.with_columns(
            pl.Series("in_layer", np.tile(in_layer, n), dtype=pl.Int32)
        ).with_columns(pl.when(pl.col("in_layer") != 0).then(pl.col("in_layer")).alias("in_layer"))
        tables = [
            _step_rows(c, sub, keys, -(tables_before + j + 1)).with_columns(
                pl.lit(clip).alias("clip")
            )
            for j, (c, sub) in enumerate(cal.table_inputs(st))
        ]
        return pl.concat([terms, *tables], how="diagonal_relaxed")
    if form == "logistic":  # one identity term whose input is the map (NaN: the base)
        n = keys.height
        return _term_frame(
            keys, 1, np.full(n, "identity"), np.zeros(n), np.zeros(n), np.ones(n),
            cal.logistic_map(st), 0.0, layer,
        )  # fmt: skip
    if form == "calreg":  # calibrated regression's closed form: theta_0 in a, the rest in y_k
        m = cal.linear_map(st)
        n = keys.height
        frame = _term_frame(
            keys, 1, np.full(n, "calreg"), m[:, 0], np.full(n, float(m.shape[1] - 3)),
            np.ones(n), np.full((n, 4), np.nan), 0.0, layer,
        )  # fmt: skip
        y_k = pl.Series("y_k", m[:, 1:], dtype=pl.Array(pl.Float64, m.shape[1] - 1))
        return frame.with_columns(y_k.cast(pl.List(pl.Float64)))
    if form == "calreg_fp":  # the fixed point by a scan and bisection: powers in a, tents in b
        powers, tents, m = cal.fixed_point_map(st)
        n = keys.height
        frame = _term_frame(
            keys, 1, np.full(n, "calreg_fp"), np.full(n, float(powers)),
            np.full(n, float(tents)), np.ones(n), np.full((n, 4), np.nan), 0.0, layer,
        )  # fmt: skip
        y_k = pl.Series("y_k", m, dtype=pl.Array(pl.Float64, m.shape[1]))
        return frame.with_columns(y_k.cast(pl.List(pl.Float64)))
    if form == "temperature":  # one term: family temperature (a = 1/T, b = eps), or identity
        n = keys.height
        te = cal.binary_temperature(st)
        fitted = ~np.isnan(te[:, 0])
        return _term_frame(
            keys, 1, np.where(fitted, "temperature", "identity"), np.nan_to_num(te[:, 0]),
            np.nan_to_num(te[:, 1]), np.ones(n), np.full((n, 4), np.nan), 0.0, layer,
        )  # fmt: skip
    return _step_rows(cal, st, keys, layer)


def _k_rows(cal, st, keys: pl.DataFrame, form: str, k: int, layer: int = 0) -> pl.DataFrame:
    """The rows of a K-class map (``calibrate_scores``): weighted terms whose Cox functions carry
    their class shifts (``alphas``) and whose inputs are vector scaling maps (``in_ka``,
    ``in_kb``, ``in_eps``), or one identity term whose input is ``ops``' map, or temperature."""
    n = keys.height
    if form == "tables":
        return _k_table_rows(cal, st, keys, k, layer)
    if form == "categories":
        return _k_category_rows(cal, st, keys, k, layer)
    if form == "tree":
        return _k_tree_rows(cal, st, keys, k, layer)
    if form == "terms":
        mt = cal.map_terms(st, k)
        t = mt.weight.shape[1]
        inputs = mt.inputs_k if mt.inputs_k is not None else np.full((n, t, 2 * k + 1), np.nan)
        frame = _term_frame(
            keys, t, np.tile(mt.family, n), np.tile(mt.a, n), np.tile(mt.b, n), mt.weight.ravel(),
            np.full((n * t, 4), np.nan), float(cal.params["clip"]), layer,
        )  # fmt: skip
        alphas = np.tile(mt.alphas, (n, 1))
        return frame.with_columns(_k_inputs(inputs.reshape(n * t, -1), k, alphas))
    if form in ("vector", "matrix"):  # one identity term whose input is the scaling map
        frame = _term_frame(
            keys, 1, np.full(n, "identity"), np.zeros(n), np.zeros(n), np.ones(n),
            np.full((n, 4), np.nan), 0.0, layer,
        )  # fmt: skip
        return frame.with_columns(_k_inputs(cal.k_input_map(st, k), k, np.zeros((n, k))))
    te = cal.temperature_map(st, k)  # a = 1/T, b = eps; identity until fitted
    fitted = ~np.isnan(te[:, 0])
    frame = _term_frame(
        keys, 1, np.where(fitted, "temperature", "identity"), np.nan_to_num(te[:, 0]),
        np.nan_to_num(te[:, 1]), np.ones(n), np.full((n, 4), np.nan), 0.0, layer,
    )  # fmt: skip
    return frame.with_columns(_k_inputs(np.full((n, 2 * k + 1), np.nan), k, np.zeros((n, k))))


def _brier_rows(cal, st, keys: pl.DataFrame, k: int, layer: int) -> pl.DataFrame:
    """The Brier compatibility mode's map (binary and K classes): the weights its next forecast
    aggregates (family ``brier``: the passive weight P on p itself; family ``brier_cox``: the
    jump-mixed weight W_t of Cox function t, ``b`` its beta and ``alphas`` its class shifts), which
    ``calpipe_layer`` / ``calpipe_klayer`` turn into the forecast of the Brier-loss aggregating
    algorithm (:func:`calpipe.kernels.brier_compat.brier_compat`)."""
    fam = cal.family(k)
    n, t = keys.height, fam.size
    weight = np.column_stack([st.passive, mixture.serving_weights(st.active, cal.rates)])
    frame = _term_frame(
        keys, t + 1, np.tile(np.array(["brier"] + ["brier_cox"] * t), n), np.zeros(n * (t + 1)),
        np.tile(np.concatenate([[0.0], fam.params[:, 1]]), n), weight.ravel(),
        np.full((n * (t + 1), 4), np.nan), 0.0, layer,
    )  # fmt: skip
    alphas = np.tile(np.vstack([np.zeros((1, k)), fam.alphas]), (n, 1))
    base = pl.Series(np.tile(np.r_[True, np.zeros(t, bool)], n))
    col = pl.Series("alphas", alphas, dtype=pl.Array(pl.Float64, k)).cast(pl.List(pl.Float64))
    return frame.with_columns(pl.when(base).then(None).otherwise(col).alias("alphas"))


def _k_identity_rows(keys: pl.DataFrame, maps: list, k: int, layer: int) -> list[pl.DataFrame]:
    """One identity term (the base passes through) for each stream whose map is None (not
    fitted yet), as a list of at most one frame."""
    unfitted = [s for s, t in enumerate(maps) if t is None]
    if not unfitted:
        return []
    u = len(unfitted)
    frame = _term_frame(
        keys[unfitted], 1, np.full(u, "identity"), np.zeros(u), np.zeros(u), np.ones(u),
        np.full((u, 4), np.nan), 0.0, layer,
    )  # fmt: skip
    return [frame.with_columns(_k_inputs(np.full((u, 2 * k + 1), np.nan), k, np.zeros((u, k))))]


def _k_table_rows(cal, st, keys: pl.DataFrame, k: int, layer: int) -> pl.DataFrame:
    """A K-class map of binary step tables per stream (:meth:`k_tables`): one row per piece,
    family = the coupling (``ovr``, ``ovr_base``, ``ovo``), ``a``/``b`` = the sub-problem's
    classes (i, j; i = -1: column j alone), ``x``/``y_at``/``y_right`` as a binary step table;
    a stream not fitted yet: one identity term (the base passes through)."""
    tables = cal.k_tables(st, k)
    parts = _k_identity_rows(keys, tables, k, layer)
    cols: dict[str, list] = {c: [] for c in ("owner", "family", "a", "b", "x", "y_at", "y_right")}
    for s, t in enumerate(tables):
        if t is None:
            continue
        coupling, subs = t
        for i, j, xs, ya, yr in subs:
            m = xs.size
            for c, v in (("owner", s), ("family", coupling), ("a", float(i)), ("b", float(j))):
                cols[c].append(np.full(m, v))
            for c, v in (("x", xs), ("y_at", ya), ("y_right", yr)):
                cols[c].append(np.asarray(v, dtype=np.float64))
    if cols["owner"]:
        owner = np.concatenate(cols["owner"])
        n = owner.size
        starts = np.r_[0, np.flatnonzero(np.diff(owner)) + 1]
        term = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
        parts.append(pl.concat([keys[owner], pl.DataFrame({
            "term": pl.Series(term, dtype=pl.Int32),
            "family": np.concatenate(cols["family"]),
            "a": np.concatenate(cols["a"]), "b": np.concatenate(cols["b"]),
            "weight": np.zeros(n), "clip": np.zeros(n),
            "layer": pl.Series(np.full(n, layer), dtype=pl.Int32),
            **{c: np.concatenate(cols[c]) for c in ("x", "y_at", "y_right")},
        })], how="horizontal"))  # fmt: skip
    return pl.concat(parts, how="diagonal_relaxed")


def _k_category_rows(cal, st, keys: pl.DataFrame, k: int, layer: int) -> pl.DataFrame:
    """A K-class map that is a table of categories (the Venn taxonomies: predicted class x
    confidence bin, :meth:`k_categories`): per stream its bins' edges (family ``kedge``, ``x``)
    and each category's forecast (family ``kcat``, ``term`` = the category, ``y_k``); a stream
    not fitted yet: one identity term."""
    tables = cal.k_categories(st, k)
    parts = _k_identity_rows(keys, tables, k, layer)
    owner, family, term, x, y = [], [], [], [], []
    for s, t in enumerate(tables):
        if t is None:
            continue
        edges, outputs = t
        n_e, n_c = edges.size, outputs.shape[0]
        owner.append(np.full(n_e + n_c, s))
        family += ["kedge"] * n_e + ["kcat"] * n_c
        term.append(np.r_[np.arange(n_e), np.arange(n_c)])
        x.append(np.r_[edges, np.full(n_c, np.nan)])
        y.append(np.vstack([np.full((n_e, k), np.nan), outputs]))
    if owner:
        rows = np.concatenate(owner)
        n = rows.size
        yk = pl.Series("y_k", np.vstack(y), dtype=pl.Array(pl.Float64, k)).cast(pl.List(pl.Float64))
        is_cat = pl.Series(np.array(family) == "kcat")
        parts.append(pl.concat([keys[rows], pl.DataFrame({
            "term": pl.Series(np.concatenate(term), dtype=pl.Int32), "family": family,
            "a": np.zeros(n), "b": np.zeros(n), "weight": np.zeros(n), "clip": np.zeros(n),
            "layer": pl.Series(np.full(n, layer), dtype=pl.Int32),
            "x": np.concatenate(x),
        }).with_columns(pl.col("x").fill_nan(None),
                        pl.when(is_cat).then(yk).otherwise(None).alias("y_k"))],
            how="horizontal"))  # fmt: skip
    return pl.concat(parts, how="diagonal_relaxed")


def _k_tree_rows(cal, st, keys: pl.DataFrame, k: int, layer: int) -> pl.DataFrame:
    """A K-class partition tree per stream (:meth:`k_tree`, ROC-isotonic): one row per node
    (``term`` = its id, the root 0): family ``ksplit`` with its thresholds gamma in ``y_k`` and
    its children in ``kids``, family ``kleaf`` with its forecast in ``y_k``; a stream not
    fitted yet: one identity term."""
    trees = cal.k_tree(st, k)
    parts = _k_identity_rows(keys, trees, k, layer)
    fitted = [(s, t) for s, t in enumerate(trees) if t is not None]
    if fitted:
        rows = np.concatenate([np.full(t.shape[0], s) for s, t in fitted])
        rec = np.vstack([t for _, t in fitted])
        n = rows.size
        split = rec[:, 0] == 1.0

        def lists(block: np.ndarray, name: str, keep: np.ndarray) -> pl.Series:
            col = pl.Series(name, block, dtype=pl.Array(pl.Float64, k)).cast(pl.List(pl.Float64))
            return pl.select(
                pl.when(pl.Series(keep)).then(col).otherwise(None).alias(name)
            ).to_series()

        parts.append(pl.concat([keys[rows], pl.DataFrame({
            "term": pl.Series(np.concatenate([np.arange(t.shape[0]) for _, t in fitted]),
                              dtype=pl.Int32),
            "family": np.where(split, "ksplit", "kleaf"),
            "a": np.zeros(n), "b": np.zeros(n), "weight": np.zeros(n), "clip": np.zeros(n),
            "layer": pl.Series(np.full(n, layer), dtype=pl.Int32),
        }).with_columns(lists(rec[:, 1 : 1 + k], "y_k", np.ones(n, bool)),
                        lists(rec[:, 1 + k : 1 + 2 * k], "kids", split))],
            how="horizontal"))  # fmt: skip
    return pl.concat(parts, how="diagonal_relaxed")


def _k_inputs(inputs: np.ndarray, k: int, alphas: np.ndarray) -> list[pl.Series]:
    """The K-class columns of term rows: ``alphas`` (rows, K); ``inputs`` (rows, 2K + 1) =
    [a_1..a_K, b_1..b_K, eps] of a vector scaling input, or (rows, K^2 + K + 1) = [W row-major,
    b_1..b_K, eps] of a matrix scaling input (``in_ka`` then holds K^2 values: the SQL input
    map tells them apart by its length), NaN rows for the clipped base."""
    base = np.isnan(inputs[:, 0])
    wide = k * k if inputs.shape[1] == k * k + k + 1 else k

    def lists(block: np.ndarray, name: str) -> pl.Series:
        s = pl.Series(name, block, dtype=pl.Array(pl.Float64, block.shape[1]))
        s = s.cast(pl.List(pl.Float64))
        return pl.select(pl.when(pl.Series(~base)).then(s).otherwise(None).alias(name)).to_series()

    eps = pl.Series("in_eps", np.where(base, np.nan, inputs[:, -1])).fill_nan(None)
    return [
        pl.Series("alphas", alphas, dtype=pl.Array(pl.Float64, k)).cast(pl.List(pl.Float64)),
        lists(inputs[:, :wide], "in_ka"), lists(inputs[:, wide : wide + k], "in_kb"), eps,
    ]  # fmt: skip


def _term_frame(keys, t, family, a, b, weight, inputs, clip, layer) -> pl.DataFrame:
    terms = pl.DataFrame(
        {
            "term": pl.Series(np.tile(np.arange(t), keys.height), dtype=pl.Int32),
            "family": family, "a": a, "b": b, "weight": weight,
            **{c: inputs[:, j] for j, c in enumerate(_INPUT_COLUMNS)},
        }
    ).with_columns(pl.col(c).fill_nan(None) for c in _INPUT_COLUMNS)  # fmt: skip
    rep = keys.select(pl.all().repeat_by(t).explode())
    return pl.concat([rep, terms], how="horizontal").with_columns(
        pl.lit(clip).alias("clip"), pl.lit(layer, pl.Int32).alias("layer")
    )


def _bin_rows(table: np.ndarray, keys: pl.DataFrame, layer: int) -> pl.DataFrame:
    """Family ``bins``: value ``y_at`` of equal-width bin ``term`` of [0, 1] (``a`` = the bin
    count; a score q is in bin min(floor(q a), a - 1)); NULL: q itself."""
    s, nb = table.shape
    rep = keys.select(pl.all().repeat_by(nb).explode())
    return pl.concat(
        [rep, pl.DataFrame({
            "term": pl.Series(np.tile(np.arange(nb), s), dtype=pl.Int32),
            "family": ["bins"] * (s * nb), "a": np.full(s * nb, float(nb)),
            "b": np.zeros(s * nb), "weight": np.zeros(s * nb), "clip": np.zeros(s * nb),
            "layer": pl.Series([layer] * (s * nb), dtype=pl.Int32), "y_at": table.ravel(),
        }).with_columns(pl.col("y_at").fill_nan(None))],
        how="horizontal",
    )  # fmt: skip


def _step_rows(cal, st, keys: pl.DataFrame, layer: int) -> pl.DataFrame:
    """A step/linear table per stream: the calibrator's own serving map evaluated at each
    breakpoint (``y_at``) and inside each interval after it (``y_right``: the map is constant
    there, or linear to the next point), plus a first row at x = -inf for the scores below the
    first point. Points where a step map does not change are dropped (exactly the same map)."""
    bps = cal.map_breakpoints(st)
    pts, spans = [], []
    for bp in bps:
        x = np.unique(bp[0]) if bp is not None else np.zeros(0)
        left = x[0] / 2 if x.size and x[0] > 0 else (x[0] if x.size else 0.5)
        right = (x[-1] + 1) / 2 if x.size and x[-1] < 1 else (x[-1] if x.size else 0.5)
        mids = (x[:-1] + x[1:]) / 2
        pts.append(np.concatenate([[left], x, mids, [right]]))
        spans.append(x)
    width = max(p.size for p in pts)
    grid = np.stack([np.pad(p, (0, width - p.size), mode="edge") for p in pts])
    vals = cal.serving_map(st, np.ascontiguousarray(grid))
    cols: dict[str, list[np.ndarray]] = {
        c: [] for c in ("x", "y_at", "y_right", "x_next", "y_next")
    }
    owner, linear_of, unfitted = [], [], []
    for s, (bp, x) in enumerate(zip(bps, spans, strict=True)):
        if bp is None:  # not fitted yet: the base passes through (one identity term)
            unfitted.append(s)
            continue
        m, v = x.size, vals[s]
        y_left, y_at, y_mid, y_end = v[0], v[1 : 1 + m], v[1 + m : 2 * m], v[2 * m]
        linear = bool(bp[1])
        xs = np.concatenate([[-np.inf], x])
        ya = np.concatenate([[y_left], y_at])
        if linear:  # y_right only below the first point and after the last
            yr = np.concatenate([[y_left], y_at[:-1], [y_end]])
        else:
            yr = np.concatenate([[y_left], y_mid, [y_end]])
            # a point where the value does not change adds nothing (the same map)
            keep = np.concatenate([[True], (ya[1:] != yr[:-1]) | (yr[1:] != yr[:-1])])
            xs, ya, yr = xs[keep], ya[keep], yr[keep]
        nan = np.full(xs.size, np.nan)
        xn = np.concatenate([[np.nan], xs[2:], [np.nan]])[: xs.size] if linear else nan
        yn = np.concatenate([[np.nan], ya[2:], [np.nan]])[: xs.size] if linear else nan
        for c, arr in zip(cols, (xs, ya, yr, xn, yn), strict=True):
            cols[c].append(arr)
        owner.append(np.full(xs.size, s))
        linear_of.append(np.full(xs.size, linear))
    parts = []
    if unfitted:
        parts.append(_term_frame(
            keys[unfitted], 1, np.full(len(unfitted), "identity"), np.zeros(len(unfitted)),
            np.zeros(len(unfitted)), np.ones(len(unfitted)), np.full((len(unfitted), 4), np.nan),
            0.0, layer,
        ))  # fmt: skip
    if owner:
        rows = np.concatenate(owner)
        k = rows.size
        starts = np.r_[0, np.flatnonzero(np.diff(rows)) + 1]
        term = np.arange(k) - np.repeat(starts, np.diff(np.r_[starts, k]))
        parts.append(
            pl.concat([keys[rows], pl.DataFrame({
                "term": pl.Series(term, dtype=pl.Int32),
                "family": np.where(np.concatenate(linear_of), "linear", "step"),
                "a": np.zeros(k), "b": np.zeros(k), "weight": np.zeros(k), "clip": np.zeros(k),
                "layer": pl.Series(np.full(k, layer), dtype=pl.Int32),
                **{c: np.concatenate(v) for c, v in cols.items()},
            })], how="horizontal").with_columns(pl.col("x_next", "y_next").fill_nan(None))
        )  # fmt: skip
    return pl.concat(parts, how="diagonal_relaxed") if parts else keys.clear()


def map_rows(state: pl.DataFrame, settings: Settings) -> pl.DataFrame:
    """``calibration_map`` rows of state rows: :func:`map_terms` for the chains of the methods
    whose map has a SQL form (:func:`has_sql_map`); none for the others (serve them with
    serving_map(): composite-experts over a windowed temperature input, K-class
    composite-experts over inputs without a vector or matrix scaling map; a method reading a
    user column has no map of the score alone)."""
    k = int(state["n_classes"][0]) if state.height else 2
    if state.height and has_sql_map(settings.calibrator(), k):
        return map_terms(state, settings)
    return pl.DataFrame(schema={"date": pl.Date, "stream": pl.String, "term": pl.Int32})


def serving_map(
    state: pl.DataFrame,
    scores: pl.DataFrame,
    settings: Settings | None = None,
    *,
    score: str = "score",
    stream: str = "stream",
) -> pl.DataFrame:
    """:func:`calpipe.serving_map` with the calibrator of ``settings`` (a chain's settings;
    default :class:`Settings`): each stream's map at the end of its state, applied to fresh
    scores (docs/ARCHITECTURE.md §4)."""
    cal = (settings or Settings()).calibrator()
    return apply_serving_map(state, scores, cal, score=score, stream=stream)
