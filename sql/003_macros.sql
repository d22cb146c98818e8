-- Macros that apply a stored serving map to fresh scores in plain SQL (docs/ARCHITECTURE.md §4).
-- They evaluate the map's terms (calibrating functions, logistic and temperature maps) and its
-- step/linear tables exactly, so they equal calpipe's polars serving map
-- (calpipe.pipeline.serving_map) to rounding (tests/pipeline/test_mapping.py: 1e-12).

-- The clip of the engine's log-loss mode: p -> min(max(p, eps), 1 - eps).
CREATE OR REPLACE MACRO calpipe_clip(p, eps) AS
    least(greatest(CAST(p AS DOUBLE), CAST(eps AS DOUBLE)), 1 - CAST(eps AS DOUBLE));

-- A score as the maps read it: a DOUBLE, NULL for NULL and NaN (no forecast without a score;
-- calpipe_clip would read NULL as eps, as greatest() skips NULLs, and NaN has no bin); an error
-- naming `what` (where the score is) for a score outside [0, 1], infinities included: the
-- engine refuses such a base probability (calpipe.contract), and the clip would silently
-- answer the map at eps or 1 - eps.
CREATE OR REPLACE MACRO calpipe_score(p, what) AS
    list_transform([CAST(p AS DOUBLE)], lambda cs_p:
        CASE WHEN isnan(cs_p) THEN NULL
             WHEN cs_p < 0 OR cs_p > 1
             THEN error(concat(what, ': score ', cs_p,
                               ' is outside [0, 1] (scores are base probabilities)'))
             ELSE cs_p END)[1];

-- Where calibrate_score's score is, for calpipe_score's error.
CREATE OR REPLACE MACRO calpipe_where_score(s) AS concat('calibrate_score: stream ''', s, '''');

-- A macro's argument is copied wherever its parameter appears, so a parameter used n times
-- inside a macro used m times inside another is bound n * m times: the term of a map, spelled
-- directly, expanded into thousands of nodes and took DuckDB 0.3 s to bind per layer (1.5 s a
-- calibrate_score query). The macros below that use an argument more than once bind it once, as
-- the single element of a list that a lambda reads (list_transform([x], lambda v: ...)[1]).

-- NULL, or an error naming `what` when the database holds K-class forecasts: a binary macro
-- would read the rows of a K-class map (a Cox term's class shifts, the tables of sub-problems)
-- as a binary map's and answer a number that is no forecast.
CREATE OR REPLACE MACRO calpipe_require_binary(what) AS
    CASE WHEN coalesce((SELECT scores IS NOT NULL FROM scored_events LIMIT 1),
                       (SELECT n_classes > 2 FROM calibrator_state LIMIT 1))
         THEN error(what || ' calibrates binary scores, and this database holds K-class '
                    || 'forecasts: use calibrate_scores(stream, [p_1, ..., p_K])')
    END;

-- The logistic function, without overflow for large |z|.
CREATE OR REPLACE MACRO calpipe_sigmoid(z) AS
    list_transform([CAST(z AS DOUBLE)], lambda sg_z:
        CASE WHEN sg_z >= 0 THEN 1 / (1 + exp(-sg_z)) ELSE exp(sg_z) / (1 + exp(sg_z)) END)[1];

-- One calibrating function f(p) of a map term.
CREATE OR REPLACE MACRO calpipe_term(family, a, b, p) AS
    list_transform([CAST(p AS DOUBLE)], lambda tm_p: CASE family
        WHEN 'identity'  THEN tm_p
        WHEN 'quadratic' THEN tm_p + a * tm_p * (1 - tm_p)
        WHEN 'cubic'     THEN tm_p + a * tm_p * (tm_p - b) * (tm_p - 1)
        WHEN 'cox'       THEN exp(a) * pow(tm_p, b) / (exp(a) * pow(tm_p, b) + pow(1 - tm_p, b))
        -- temperature scaling, a = 1/T, b = eps: the two-class softmax of ln max(p, eps) / T
        WHEN 'temperature'
        THEN calpipe_sigmoid(a * ln(greatest(tm_p, b)) - a * ln(greatest(1 - tm_p, b)))
    END)[1];

-- A term's input q(p): p itself (w1 NULL), or the logistic map of a composite-experts input
-- (online Platt/beta scaling, a windowed Platt/beta fit): sigmoid(w1 ln c - w2 ln(1 - c) + w0).
CREATE OR REPLACE MACRO calpipe_input(p, w1, w2, w0, eps) AS
    list_transform([CAST(p AS DOUBLE)], lambda in_p: CASE WHEN w1 IS NULL THEN in_p
        ELSE calpipe_sigmoid(w1 * ln(calpipe_clip(in_p, eps)) - w2 * ln(1 - calpipe_clip(in_p, eps))
                             + w0)
    END)[1];

-- One term of a map row `m` evaluated at score p: f(clip(q(clip(p)))).
CREATE OR REPLACE MACRO calpipe_map_term(family, a, b, clip, w1, w2, w0, eps, p) AS
    calpipe_term(family, a, b,
                 calpipe_clip(calpipe_input(calpipe_clip(p, clip), w1, w2, w0, eps), clip));

-- A step/linear table's piece (row `x` <= p of the table) evaluated at p.
CREATE OR REPLACE MACRO calpipe_piece(family, x, y_at, y_right, x_next, y_next, p) AS
    CASE WHEN x = p THEN y_at
         WHEN family = 'linear' AND x_next IS NOT NULL
             THEN (y_next - y_at) / (x_next - x) * (p - x) + y_at
         ELSE y_right
    END;

-- Calibrated regression's forecast in its closed form (paper 004 §IV): with w = [theta of the
-- intercept, of the base score, of each of nt score tents] the static part c = w . f(p), and
-- g(u) = c + (t0 - 1) u; y^ = clip(c / (1 - t0)) when g changes sign on [0, 1], else 0 if
-- c <= 0, else 1 (calpipe.kernels.calibrated_regression._fixed_point).
CREATE OR REPLACE MACRO calpipe_calreg_c(w, nt, p) AS
    w[1] * 1.0 + w[2] * p + coalesce(list_sum(list_transform(range(CAST(nt AS INTEGER)),
        lambda j: w[3 + j] * greatest(0.0, 1.0 - abs(p * (nt - 1) - j)))), 0.0);
CREATE OR REPLACE MACRO calpipe_calreg_y(t0, c) AS
    CASE WHEN (c < 0.0 AND c + t0 - 1.0 > 0.0) OR (c > 0.0 AND c + t0 - 1.0 < 0.0)
         THEN least(greatest(c / (1.0 - t0), 0.0), 1.0)
         WHEN c <= 0.0 THEN 0.0
         ELSE 1.0
    END;

-- Calibrated regression with powers of or tents on the forecast (paper 004 Alg. 2 step 2, no
-- closed form), as calpipe.kernels.calibrated_regression._fixed_point finds it: with th the
-- thetas of u, u^2, .., u^pw and of nt tents on u, and c the static part,
-- g(u) = c + th . f(u) - u; 0 if g(0) = 0; else g is scanned on 64 equal cells of [0, 1]
-- (config.CALREG_ROOT_GRID) and the first sign change bisected to width 1e-12
-- (config.CALREG_BISECTION_TOL, at most 60 halvings: CALREG_BISECTION_MAX_ITER; a test checks
-- these constants against the config); no sign change: 0 if g(0) < 0, else 1.
-- (Macros are expanded by substitution: the lambdas' variables have names of their own, so that
-- an argument naming another lambda's variable is not captured.)
CREATE OR REPLACE MACRO calpipe_calreg_g(th, pw, nt, c, u) AS
    c + coalesce(list_sum(list_transform(range(CAST(pw AS INTEGER)),
                                         lambda g_pow: th[g_pow + 1] * pow(u, g_pow + 1))), 0.0)
      + coalesce(list_sum(list_transform(range(CAST(nt AS INTEGER)),
            lambda g_tent: th[CAST(pw AS INTEGER) + 1 + g_tent]
                           * greatest(0.0, 1.0 - abs(u * (nt - 1) - g_tent)))), 0.0)
      - u;
-- (A value used several times is bound once by a one-element list_transform: a macro argument
-- is substituted wherever it appears, and these expressions nest.)
-- one cell of the scan: acc.j the cell whose end is the first sign change (0: none yet), acc.glo
-- g at the last grid point, acc.z whether g is 0 at that end
CREATE OR REPLACE MACRO calpipe_calreg_scan(acc, j, gu) AS
    CASE WHEN acc.j > 0 THEN acc
         WHEN gu = 0.0 THEN {'j': j, 'glo': acc.glo, 'z': true}
         WHEN (gu > 0.0) != (acc.glo > 0.0) THEN {'j': j, 'glo': acc.glo, 'z': false}
         ELSE {'j': CAST(0 AS BIGINT), 'glo': gu, 'z': false}
    END;
-- one halving of [lo, hi] (g(lo) = glo), gm = g at its midpoint; done with the root in r
CREATE OR REPLACE MACRO calpipe_calreg_half(acc, gm) AS
    CASE WHEN acc.done THEN acc
         WHEN acc.hi - acc.lo <= 1e-12
             THEN {'lo': acc.lo, 'hi': acc.hi, 'glo': acc.glo, 'done': true, 'r': 0.5 * (acc.lo + acc.hi)}
         WHEN gm = 0.0
             THEN {'lo': acc.lo, 'hi': acc.hi, 'glo': acc.glo, 'done': true, 'r': 0.5 * (acc.lo + acc.hi)}
         WHEN (gm > 0.0) = (acc.glo > 0.0)
             THEN {'lo': 0.5 * (acc.lo + acc.hi), 'hi': acc.hi, 'glo': gm, 'done': false, 'r': acc.r}
         ELSE {'lo': acc.lo, 'hi': 0.5 * (acc.lo + acc.hi), 'glo': acc.glo, 'done': false, 'r': acc.r}
    END;
CREATE OR REPLACE MACRO calpipe_calreg_root(th, pw, nt, c, g0, s) AS
    CASE WHEN g0 = 0.0 THEN 0.0
         WHEN s.j = 0 THEN CASE WHEN g0 < 0.0 THEN 0.0 ELSE 1.0 END
         WHEN s.z THEN s.j / 64.0
         ELSE list_transform([list_reduce(range(60), lambda b_acc, b_step:
                  list_transform([calpipe_calreg_g(th, pw, nt, c, 0.5 * (b_acc.lo + b_acc.hi))],
                                 lambda b_gm: calpipe_calreg_half(b_acc, b_gm))[1],
                  {'lo': (s.j - 1) / 64.0, 'hi': s.j / 64.0, 'glo': s.glo, 'done': false,
                   'r': CAST(NULL AS DOUBLE)})],
              lambda r_end: coalesce(r_end.r, 0.5 * (r_end.lo + r_end.hi)))[1]
    END;
CREATE OR REPLACE MACRO calpipe_calreg_fp(th, pw, nt, c) AS
    list_transform([calpipe_calreg_g(th, pw, nt, c, 0.0)], lambda f_g0:
        list_transform([list_reduce(range(1, 65), lambda s_acc, s_cell:
                            list_transform([calpipe_calreg_g(th, pw, nt, c, s_cell / 64.0)],
                                           lambda s_g: calpipe_calreg_scan(s_acc, s_cell, s_g))[1],
                            {'j': CAST(0 AS BIGINT), 'glo': f_g0, 'z': false})],
            lambda f_scan: calpipe_calreg_root(th, pw, nt, c, f_g0, f_scan))[1])[1];
-- family calreg_fp: a = powers, b = tents, y_k = [their thetas, then the static ones]
CREATE OR REPLACE MACRO calpipe_calreg_fp_row(a, b, y, p) AS
    list_transform([calpipe_calreg_c(list_slice(y, CAST(a + b AS INTEGER) + 1, len(y)),
                                     len(y) - a - b - 2, p)],
        lambda f_c: calpipe_calreg_fp(list_slice(y, 1, CAST(a + b AS INTEGER)), a, b, f_c))[1];

-- Equal-width bin of q among n of [0, 1], as the calibeating kernel computes it.
CREATE OR REPLACE MACRO calpipe_bin(q, n) AS least(CAST(floor(q * n) AS INTEGER), CAST(n AS INTEGER) - 1);

-- K classes: the row floored at eps and renormalised (the engine's clip in log-loss mode). The
-- K-class macros bind their list argument, and each sum or maximum, once (one-element lists
-- and lambdas, as calpipe_term): spelled directly, the argument (for a term, the input map of the
-- clipped score) was computed again for every class and inside every sum, and a K = 3 vector
-- under the default method's ~80 terms took 16 ms.
CREATE OR REPLACE MACRO calpipe_kclip(p, eps) AS
    list_transform([list_transform(p, lambda x: greatest(CAST(x AS DOUBLE), CAST(eps AS DOUBLE)))],
        lambda kc_g: list_transform([list_sum(kc_g)],
            lambda kc_s: list_transform(kc_g, lambda x: x / kc_s))[1])[1];

-- The softmax of a list, shifted by its maximum (no overflow).
CREATE OR REPLACE MACRO calpipe_softmax(z) AS
    list_transform([z], lambda sm_z: list_transform([list_max(sm_z)],
        lambda sm_m: list_transform([list_transform(sm_z, lambda x: exp(x - sm_m))],
            lambda sm_e: list_transform([list_sum(sm_e)],
                lambda sm_s: list_transform(sm_e, lambda x: x / sm_s))[1])[1])[1])[1];

-- A K-class term's input q(p): p itself (ka NULL), or vector scaling (online vector scaling, an
-- input of composite-experts or ops itself): softmax(ka[c] ln kclip(p, eps)[c] + kb[c]).
CREATE OR REPLACE MACRO calpipe_kinput(p, ka, kb, eps) AS
    CASE WHEN ka IS NULL THEN p
         ELSE calpipe_softmax(list_transform(calpipe_kclip(p, eps),
                                             lambda x, i: ka[i] * ln(x) + kb[i]))
    END;

-- One K-class calibrating function of a term at q: the identity, the Cox function of paper 001
-- eq. (1) (q_c^b e^{alphas[c]} / sum), or temperature scaling (a = 1/T, b = eps).
CREATE OR REPLACE MACRO calpipe_kterm(family, a, b, alphas, q) AS
    list_transform([q], lambda kt_q: CASE family
        WHEN 'identity' THEN kt_q
        WHEN 'cox' THEN list_transform(
            [list_transform(kt_q, lambda x, i: pow(x, b) * exp(alphas[i]))],
            lambda kt_w: list_transform([list_sum(kt_w)],
                lambda kt_s: list_transform(kt_w, lambda x: x / kt_s))[1])[1]
        WHEN 'temperature' THEN calpipe_softmax(list_transform(kt_q, lambda x: a * ln(greatest(x, b))))
    END)[1];

-- The Brier compatibility mode (paper 001's reference package's Brier-loss aggregating
-- algorithm, calpipe.kernels.brier_compat): a term's forecast f at the class vector q (family
-- brier: q itself; brier_cox: the Cox function with beta b and class shifts alphas), the
-- Brier loss of f for class c (0-based), and the forecast from the sums a_c = sum_terms weight *
-- e^{-Brier(c, f)}: g_c = -ln a_c, s = (2 + sum_c g_c) / K, p'_c = clip((s - g_c) / 2, 0, 1)
-- renormalised (the package's substitution shortcut).
CREATE OR REPLACE MACRO calpipe_brier_f(family, b, alphas, q) AS
    CASE WHEN family = 'brier' THEN q ELSE calpipe_kterm('cox', 0.0, b, alphas, q) END;
CREATE OR REPLACE MACRO calpipe_brier_loss(c, f) AS
    list_sum(list_transform(f, lambda x, i: (CASE WHEN i - 1 = c THEN 1.0 ELSE 0.0 END - x)
                                          * (CASE WHEN i - 1 = c THEN 1.0 ELSE 0.0 END - x)));
CREATE OR REPLACE MACRO calpipe_brier_v(g) AS
    list_transform(g, lambda x: least(greatest(((2.0 + list_sum(g)) / len(g) - x) / 2.0, 0.0), 1.0));
CREATE OR REPLACE MACRO calpipe_normalise(v) AS list_transform(v, lambda x: x / list_sum(v));
CREATE OR REPLACE MACRO calpipe_brier_merge(a) AS
    calpipe_normalise(calpipe_brier_v(list_transform(a, lambda x: -ln(x))));
-- binary (without lambdas, so that the sums over terms may be its arguments): p'_1
CREATE OR REPLACE MACRO calpipe_brier_v2(g, g0, g1) AS
    least(greatest(((2.0 + (g0 + g1)) / 2.0 - g) / 2.0, 0.0), 1.0);
CREATE OR REPLACE MACRO calpipe_brier_binary(a0, a1) AS
    calpipe_brier_v2(-ln(a1), -ln(a0), -ln(a1))
    / (calpipe_brier_v2(-ln(a0), -ln(a0), -ln(a1)) + calpipe_brier_v2(-ln(a1), -ln(a0), -ln(a1)));

-- `value` on the map rows `m` of the families `families`, NULL on the others (which the
-- aggregates skip). Why: an aggregate computes its argument on every row of the group, whatever
-- branch of calpipe_layer_value is taken, and CASE computes a branch only for its own rows (the
-- calibrated-regression scan, 64 steps of list lambdas, on every term of a Jumper's map made a
-- score cost milliseconds).
CREATE OR REPLACE MACRO calpipe_rows_of(m, families, value) AS
    CASE WHEN list_contains(families, m.family) THEN value END;

-- The value at p of one layer of a map, an aggregate over the layer's rows `m` (a row of
-- calibration_map as a struct): the Brier compatibility mode's forecast, a step/linear table
-- (the piece with the largest x <= p), a bin table (family bins: the value of p's bin, p where
-- NULL) or a weighted sum of terms; a term with an input table (in_layer -(j + 1)) reads its
-- value ins[j + 1] (the input tables' values at the clipped score) for q. One home for both
-- forms: calpipe_layer (one score) and calpipe_points_layer (a table of scores).
CREATE OR REPLACE MACRO calpipe_layer_value(m, p, ins) AS
    CASE WHEN bool_or(m.family IN ('brier', 'brier_cox'))
         THEN calpipe_brier_binary(
             sum(calpipe_rows_of(m, ['brier', 'brier_cox'], m.weight * exp(-calpipe_brier_loss(
                 0, calpipe_brier_f(m.family, m.b, m.alphas, [1.0 - p, p]))))),
             sum(calpipe_rows_of(m, ['brier', 'brier_cox'], m.weight * exp(-calpipe_brier_loss(
                 1, calpipe_brier_f(m.family, m.b, m.alphas, [1.0 - p, p]))))))
         WHEN bool_or(m.family = 'calreg')
         THEN max(calpipe_rows_of(m, ['calreg'], calpipe_calreg_y(m.a,
                                                                 calpipe_calreg_c(m.y_k, m.b, p))))
         WHEN bool_or(m.family = 'calreg_fp')
         THEN max(calpipe_rows_of(m, ['calreg_fp'], calpipe_calreg_fp_row(m.a, m.b, m.y_k, p)))
         WHEN bool_or(m.family IN ('step', 'linear'))
         THEN arg_max(calpipe_piece(m.family, m.x, m.y_at, m.y_right, m.x_next, m.y_next, p),
                      m.x) FILTER (WHERE m.x <= p)
         WHEN bool_or(m.family = 'bins')
         THEN max(coalesce(m.y_at, p)) FILTER (WHERE m.term = calpipe_bin(p, m.a))
         -- (the families of calpipe_term)
         ELSE sum(calpipe_rows_of(m, ['identity', 'quadratic', 'cubic', 'cox', 'temperature'],
             m.weight * CASE
             WHEN m.in_layer IS NULL
             THEN calpipe_map_term(m.family, m.a, m.b, m.clip, m.in_w1, m.in_w2, m.in_w0,
                                   m.in_eps, p)
             ELSE calpipe_term(m.family, m.a, m.b, calpipe_clip(ins[-m.in_layer], m.clip))
             END))
    END;

-- One layer of stream `s`'s map of day `d` evaluated at p: `v` (NULL: the layer has no rows) and
-- its row count `n` (calpipe_layer_value).
CREATE OR REPLACE MACRO calpipe_layer(s, d, lay, p, ins) AS TABLE
    SELECT calpipe_layer_value(m, p, ins) AS v, count(*) AS n
    FROM calibration_map m
    WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay;

-- Calibrated probability of `score` under stream `s`'s map in force at the end of day `as_of`
-- (its latest map on or before; NULL: no map yet, or a NULL or NaN score), for every method
-- with a SQL form (calpipe.pipeline.mapping.has_sql_map): layer 0 at the score; layer 1 (a
-- stack's top, a calibeating table), where there is one, at layer 0's value; layer 2 (the top
-- of a stack with a calibeating layer) at layer 1's. A composite-experts input whose map is a
-- table of its own (layer -1, -2, ...) is evaluated first, at the clipped score, for the terms
-- that read it.
CREATE OR REPLACE MACRO calibrate_score_as_of(s, score, as_of) AS (
    WITH d AS (
        SELECT max(date) AS d FROM calibration_map
        WHERE stream = CAST(s AS VARCHAR) AND date <= CAST(as_of AS DATE)
    ),
    in_tables AS (
        SELECT DISTINCT m.layer, m.clip FROM d, calibration_map m
        WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d.d AND m.layer < 0
    ),
    -- (a scalar subquery: one row, NULL without input tables, also per row of an outer query)
    ins AS (
        SELECT (SELECT list(l.v ORDER BY it.layer DESC)
                FROM d, in_tables it,
                     calpipe_layer(s, d.d, it.layer,
                                   calpipe_clip(calpipe_score(score, calpipe_where_score(s)),
                                                it.clip),
                                   NULL) AS l) AS v
    ),
    l0 AS (
        SELECT l.v
        FROM d, ins,
             calpipe_layer(s, d.d, 0, calpipe_score(score, calpipe_where_score(s)), ins.v) AS l
    ),
    l1 AS (SELECT l.v, l.n FROM d, l0, calpipe_layer(s, d.d, 1, l0.v, NULL) AS l),
    l2 AS (SELECT l.v, l.n FROM d, l1, calpipe_layer(s, d.d, 2, l1.v, NULL) AS l)
    SELECT coalesce(calpipe_require_binary('calibrate_score'),
                    CASE WHEN calpipe_score(score, calpipe_where_score(s)) IS NULL THEN NULL
                         WHEN l2.n > 0 THEN l2.v WHEN l1.n > 0 THEN l1.v ELSE l0.v END)
    FROM l0, l1, l2
);

-- K classes: a score vector as the maps read it (DOUBLE[]), NULL for NULL and for a vector with
-- a NULL or NaN inside (no forecast without a score, as calpipe_score); an error naming `what`
-- on a database of binary forecasts (k = 2: the K-class macros read a binary map's terms as
-- a K-class map's and answered a vector of no meaning) and for a vector the engine refuses
-- (calpipe.contract): another number of classes than `k` (the database's: the maps answered a
-- vector of the given length), a class probability outside [0, 1], or a sum off 1 by more than
-- config.SCORES_SUM_TOL, 1e-06 (the maps renormalised it).
CREATE OR REPLACE MACRO calpipe_kscores(p, k, what) AS
    list_transform([CAST(p AS DOUBLE[])], lambda kp:
        CASE WHEN k = 2
             THEN error(concat(what, ': this database holds binary forecasts: use ',
                               'calibrate_score(stream, p) with the probability of class 1'))
             WHEN kp IS NULL OR list_bool_or(list_transform(kp, lambda x: x IS NULL OR isnan(x)))
             THEN NULL
             WHEN len(kp) <> k
             THEN error(concat(what, ': scores ', CAST(kp AS VARCHAR), ' hold ', len(kp),
                               ' classes, and the forecasts of this database ', k))
             WHEN list_bool_or(list_transform(kp, lambda x: x < 0 OR x > 1))
             THEN error(concat(what, ': scores ', CAST(kp AS VARCHAR), ' hold a class ',
                               'probability outside [0, 1] (scores are base probabilities)'))
             WHEN abs(list_sum(kp) - 1) > 1e-06
             THEN error(concat(what, ': scores ', CAST(kp AS VARCHAR), ' do not sum to 1 ',
                               '(tolerance 1e-06)'))
             ELSE kp END)[1];

-- The test score of the K-class sub-problem (i, j) at p (0-based classes): p[j] when i < 0
-- (one-vs-rest), else the pair score p[j] / (p[i] + p[j]), 1/2 when both are 0 (one-vs-one).
CREATE OR REPLACE MACRO calpipe_subscore(p, i, j) AS
    CASE WHEN i < 0 THEN p[CAST(j AS INTEGER) + 1]
         WHEN p[CAST(i AS INTEGER) + 1] + p[CAST(j AS INTEGER) + 1] = 0 THEN 0.5
         ELSE p[CAST(j AS INTEGER) + 1] / (p[CAST(i AS INTEGER) + 1] + p[CAST(j AS INTEGER) + 1])
    END;

-- A K-class map of binary step tables (families ovr, ovr_base, ovo: histogram binning and
-- Venn-ABERS) of stream `s` on day `d` at p (DOUBLE[]): each sub-problem's step table at its
-- score, then one-vs-rest, u_c = the value of class c's table, or one-vs-one pairwise coupling,
-- u_c = 1 / (sum_{o > c} 1 / (1 - q_{o|co}) + sum_{o < c} 1 / q_{c|oc} - (K - 2)); then
-- renormalised (ovr_base: a row of zeros keeps p). NULL when the layer has no such rows.
CREATE OR REPLACE MACRO calpipe_ktables(s, d, lay, p) AS TABLE
    -- each piece with its sub-problem's score (aggregates over the macro's arguments directly
    -- are not allowed where the macro is joined laterally)
    WITH pieces AS (
        SELECT m.family, m.a AS i, m.b AS j, m.x, m.y_at, m.y_right, len(p) AS k,
               calpipe_subscore(p, m.a, m.b) AS sc
        FROM calibration_map m
        WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay
          AND m.family IN ('ovr', 'ovr_base', 'ovo')
    ),
    q AS (
        SELECT family, i, j, any_value(k) AS k,
               arg_max(CASE WHEN x = sc THEN y_at ELSE y_right END, x) FILTER (WHERE x <= sc) AS v
        FROM pieces
        GROUP BY family, i, j
    ),
    u AS (
        SELECT family, j AS c, v AS u FROM q WHERE family <> 'ovo'
        UNION ALL
        SELECT family, c, 1.0 / (sum(t) - (any_value(k) - 2)) AS u
        FROM (SELECT family, k, i AS c, 1.0 / (1.0 - v) AS t FROM q WHERE family = 'ovo'
              UNION ALL
              SELECT family, k, j AS c, 1.0 / v AS t FROM q WHERE family = 'ovo')
        GROUP BY family, c
    ),
    r AS (SELECT any_value(family) AS family, sum(u) AS tot, list(u ORDER BY c) AS raw FROM u)
    SELECT CASE WHEN r.family IS NULL THEN NULL
                WHEN r.family = 'ovr_base' AND r.tot <= 0 THEN p
                ELSE list_transform(r.raw, lambda x: x / r.tot)
           END AS v
    FROM r;

-- The Brier compatibility mode's K-class forecast of stream `s` on day `d` at p (families brier /
-- brier_cox): a_c = sum over the terms of weight * e^{-Brier(c, f(p))}, then calpipe_brier_merge.
-- NULL: no such rows.
CREATE OR REPLACE MACRO calpipe_kbrier(s, d, lay, p) AS TABLE
    WITH t AS (
        SELECT m.weight, calpipe_brier_f(m.family, m.b, m.alphas, CAST(p AS DOUBLE[])) AS f,
               len(p) AS k
        FROM calibration_map m
        WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay
          AND m.family IN ('brier', 'brier_cox')
    ),
    e AS (
        SELECT t.weight, list_transform(range(t.k), lambda c: exp(-calpipe_brier_loss(c, t.f))) AS e
        FROM t
    ),
    a AS (
        SELECT u.i, sum(e.weight * u.v) AS a
        FROM e, unnest(e.e) WITH ORDINALITY AS u(v, i)
        GROUP BY u.i
    ),
    al AS (SELECT list(a.a ORDER BY a.i) AS a FROM a)
    SELECT calpipe_brier_merge(al.a) AS v FROM al;

-- A K-class map that is a table of categories (the Venn taxonomies, families kcat / kedge) of
-- stream `s` on day `d` at p: the forecast y_k of p's category k = argmax_c p_c * (B + 1) +
-- #{edges <= max_c p_c} (B edges; ties in the argmax: the lowest class). NULL: no such rows.
CREATE OR REPLACE MACRO calpipe_kcats(s, d, lay, p) AS TABLE
    WITH pieces AS (
        SELECT m.family, m.term, m.y_k,
               CASE WHEN m.family = 'kedge' AND m.x <= list_max(p) THEN 1 ELSE 0 END AS below,
               CASE WHEN m.family = 'kedge' THEN 1 ELSE 0 END AS edge,
               list_position(p, list_max(p)) - 1 AS top
        FROM calibration_map m
        WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay
          AND m.family IN ('kcat', 'kedge')
    ),
    cat AS (SELECT any_value(top) * (sum(edge) + 1) + sum(below) AS k FROM pieces)
    SELECT (SELECT p.y_k FROM pieces p, cat WHERE p.family = 'kcat' AND p.term = cat.k) AS v;

-- The child a split node sends the score vector q to: kids[argmax_c (q_c - gamma_c)] (ties:
-- the lowest class; paper 003 Algorithm 2), for both forms' tree walks.
CREATE OR REPLACE MACRO calpipe_tree_child(q, gamma, kids) AS
    list_transform([list_transform(q, lambda tc_x, tc_i: tc_x - gamma[tc_i])],
        lambda tc_d: CAST(kids[list_position(tc_d, list_max(tc_d))] AS INTEGER))[1];

-- A K-class partition tree (ROC-isotonic, paper 003 Algorithm 2; families ksplit / kleaf) of
-- stream `s` on day `d` at p: from the root (node 0), each split sends p to its child
-- argmax_c (p_c - gamma_c) (ties: the lowest class), until a leaf, whose forecast it is. NULL:
-- no such rows.
CREATE OR REPLACE MACRO calpipe_ktree(s, d, lay, p) AS TABLE
    WITH RECURSIVE nodes AS (
        SELECT m.term, m.family, m.y_k, m.kids, CAST(p AS DOUBLE[]) AS q
        FROM calibration_map m
        WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay
          AND m.family IN ('ksplit', 'kleaf')
    ),
    walk(node) AS (
        SELECT 0 FROM (SELECT 1) WHERE EXISTS (SELECT 1 FROM nodes)
        UNION ALL
        SELECT calpipe_tree_child(n.q, n.y_k, n.kids)
        FROM walk JOIN nodes n ON n.term = walk.node
        WHERE n.family = 'ksplit'
    )
    SELECT (SELECT n.y_k FROM walk JOIN nodes n ON n.term = walk.node WHERE n.family = 'kleaf') AS v;

-- One layer of a K-class map of stream `s` on day `d` at the score vector p: `v` = the sum over
-- its terms of weight * f(kclip(p)), or weight * f(kclip(q(kclip(p)))) for a term with an input
-- map q, class by class, or its coupled step tables (calpipe_ktables), its table of categories
-- (calpipe_kcats) or its partition tree (calpipe_ktree) (NULL: no rows), and its
-- row count `n`. K-class clipping is not idempotent (it renormalises): the base is clipped
-- once, an input's forecast again, as the engine does.
CREATE OR REPLACE MACRO calpipe_klayer(s, d, lay, p) AS TABLE
    WITH t AS (
        SELECT m.weight,
               calpipe_kterm(m.family, m.a, m.b, m.alphas,
                             CASE WHEN m.in_ka IS NULL
                                  THEN calpipe_kclip(CAST(p AS DOUBLE[]), m.clip)
                                  ELSE calpipe_kclip(calpipe_kinput(
                                           calpipe_kclip(CAST(p AS DOUBLE[]), m.clip),
                                           m.in_ka, m.in_kb, m.in_eps), m.clip)
                             END) AS f
        FROM calibration_map m
        WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay
          AND m.family NOT IN ('ovr', 'ovr_base', 'ovo', 'kcat', 'kedge', 'ksplit', 'kleaf',
                               'brier', 'brier_cox')
    ),
    c AS (
        SELECT u.i, sum(t.weight * u.v) AS v
        FROM t, unnest(t.f) WITH ORDINALITY AS u(v, i)
        GROUP BY u.i
    ),
    k AS (SELECT k.v FROM calpipe_ktables(s, d, lay, CAST(p AS DOUBLE[])) AS k),
    g AS (SELECT g.v FROM calpipe_kcats(s, d, lay, CAST(p AS DOUBLE[])) AS g),
    r AS (SELECT r.v FROM calpipe_ktree(s, d, lay, CAST(p AS DOUBLE[])) AS r),
    b AS (SELECT b.v FROM calpipe_kbrier(s, d, lay, CAST(p AS DOUBLE[])) AS b)
    SELECT coalesce((SELECT k.v FROM k), (SELECT g.v FROM g), (SELECT r.v FROM r), (SELECT b.v FROM b),
                    (SELECT list(c.v ORDER BY c.i) FROM c)) AS v,
           (SELECT count(*) FROM calibration_map m
            WHERE m.stream = CAST(s AS VARCHAR) AND m.date = d AND coalesce(m.layer, 0) = lay) AS n;

-- Calibrated class probabilities (a list) of the K-class `scores` under stream `s`'s map in force
-- at the end of day `as_of` (NULL: no map yet): layer 0 at the scores, layer 1 (a stack's top)
-- at layer 0's vector.
CREATE OR REPLACE MACRO calibrate_scores_as_of(s, scores, as_of) AS (
    WITH d AS (
        SELECT max(date) AS d FROM calibration_map
        WHERE stream = CAST(s AS VARCHAR) AND date <= CAST(as_of AS DATE)
    ),
    -- (a CTE, not an argument: the layer macros copy their argument wherever they read it)
    -- (names no lambda of the layer macros uses: their parameter x would capture x.p)
    calpipe_k AS (SELECT max(n_classes) AS n FROM calibrator_state),
    calpipe_x AS (
        SELECT calpipe_kscores(scores, calpipe_k.n,
                               concat('calibrate_scores: stream ''', s, '''')) AS kscores
        FROM calpipe_k
    ),
    l0 AS (SELECT l.v FROM d, calpipe_x, calpipe_klayer(s, d.d, 0, calpipe_x.kscores) AS l),
    l1 AS (SELECT l.v, l.n FROM d, l0, calpipe_klayer(s, d.d, 1, l0.v) AS l)
    SELECT CASE WHEN calpipe_x.kscores IS NULL THEN NULL WHEN l1.n > 0 THEN l1.v ELSE l0.v END
    FROM calpipe_x, l0, l1
);

-- The same under the latest map of stream `s`.
--   SELECT calibrate_scores('iris', [0.2, 0.3, 0.5]);
CREATE OR REPLACE MACRO calibrate_scores(s, scores) AS
    calibrate_scores_as_of(s, scores, DATE '9999-12-31');

-- Where a set form's score is (the table's row r, from 1, and its stream), for calpipe_score's
-- and calpipe_kscores' errors; `form` names the macro.
CREATE OR REPLACE MACRO calpipe_where_row(form, r, s) AS
    concat(form, ': row ', r, ' (stream ''', s, ''')');

-- The map rows in force at the end of day `as_of` (each stream's latest day on or before it,
-- layer NULL read as 0) of the streams of the relation named `rows` (its `stream` column, a
-- number compared as its text), for the set forms: only the table's streams, as a long
-- history's calibration_map holds every stream's days.
CREATE OR REPLACE MACRO calpipe_maps_in_force(rows, as_of) AS TABLE
    WITH calpipe_latest AS (
        SELECT stream, max(date) AS d FROM calibration_map
        WHERE date <= CAST(as_of AS DATE)
          AND stream IN (SELECT CAST(stream AS VARCHAR) FROM query_table(rows))
        GROUP BY stream
    )
    SELECT m.* REPLACE (coalesce(m.layer, 0) AS layer)
    FROM calibration_map m JOIN calpipe_latest l ON m.stream = l.stream AND m.date = l.d;

-- The K-class set form (calibrate_scores_table): one layer of the maps in force evaluated at every
-- point of the relation named `points` (r, stream, layer, q: a point's key, its stream, the
-- layer, the score vector to evaluate it at) under the map rows of the relation named `maps`
-- (calibration_map's rows in force, layer NULL read as 0): (r, layer, v), v the layer's vector,
-- one row per point whose stream has rows in that layer. Each family as calpipe_klayer
-- evaluates it for one score (the same macros): the terms' sum class by class, the coupled step
-- tables of the sub-problems (each sub-problem's piece by an ASOF join), the table of
-- categories, the partition tree (a recursive walk of every point at once), the Brier mode.
CREATE OR REPLACE MACRO calpipe_kpoints_layer(points, maps) AS TABLE
    WITH RECURSIVE kq_pt AS (SELECT r, stream, layer, q FROM query_table(points)),
    kq_m AS (SELECT * FROM query_table(maps)),
    -- terms: sum over the terms of weight * f(kclip(q)) (or of the term's input map), by class
    kq_terms AS (
        SELECT pt.r, pt.layer, m.weight,
               calpipe_kterm(m.family, m.a, m.b, m.alphas,
                             CASE WHEN m.in_ka IS NULL THEN calpipe_kclip(pt.q, m.clip)
                                  ELSE calpipe_kclip(calpipe_kinput(calpipe_kclip(pt.q, m.clip),
                                                                    m.in_ka, m.in_kb, m.in_eps),
                                                     m.clip)
                             END) AS f
        FROM kq_pt pt JOIN kq_m m ON m.stream = pt.stream AND m.layer = pt.layer
        WHERE m.family NOT IN ('ovr', 'ovr_base', 'ovo', 'kcat', 'kedge', 'ksplit', 'kleaf',
                               'brier', 'brier_cox')
    ),
    kq_term_c AS (
        SELECT t.r, t.layer, u.i, sum(t.weight * u.v) AS v
        FROM kq_terms t, unnest(t.f) WITH ORDINALITY AS u(v, i)
        GROUP BY t.r, t.layer, u.i
    ),
    kq_term_v AS (
        SELECT r, layer, list(v ORDER BY i) AS v FROM kq_term_c GROUP BY r, layer
    ),
    -- step tables of the sub-problems: each (point, sub-problem) at its score, its piece
    kq_subs AS (
        SELECT DISTINCT stream, layer, family, a, b FROM kq_m
        WHERE family IN ('ovr', 'ovr_base', 'ovo')
    ),
    kq_sub_pts AS (
        SELECT pt.r, pt.layer, pt.stream, s.family, s.a, s.b, len(pt.q) AS k,
               calpipe_subscore(pt.q, s.a, s.b) AS sc
        FROM kq_pt pt JOIN kq_subs s ON s.stream = pt.stream AND s.layer = pt.layer
    ),
    kq_sub_v AS (
        SELECT sp.r, sp.layer, sp.family, sp.a AS i, sp.b AS j, sp.k,
               CASE WHEN m.x = sp.sc THEN m.y_at ELSE m.y_right END AS v
        FROM kq_sub_pts sp
        ASOF JOIN (SELECT * FROM kq_m WHERE family IN ('ovr', 'ovr_base', 'ovo')) m
          ON m.stream = sp.stream AND m.layer = sp.layer AND m.family = sp.family
         AND m.a = sp.a AND m.b = sp.b AND m.x <= sp.sc
    ),
    kq_sub_u AS (
        SELECT r, layer, family, j AS cls, v AS u FROM kq_sub_v WHERE family <> 'ovo'
        UNION ALL
        SELECT r, layer, family, cls, 1.0 / (sum(t) - (any_value(k) - 2)) AS u
        FROM (SELECT r, layer, family, k, i AS cls, 1.0 / (1.0 - v) AS t FROM kq_sub_v
              WHERE family = 'ovo'
              UNION ALL
              SELECT r, layer, family, k, j AS cls, 1.0 / v AS t FROM kq_sub_v
              WHERE family = 'ovo')
        GROUP BY r, layer, family, cls
    ),
    kq_sub_tot AS (
        SELECT u.r, u.layer, any_value(u.family) AS family, sum(u.u) AS tot,
               list(u.u ORDER BY u.cls) AS raw
        FROM kq_sub_u u GROUP BY u.r, u.layer
    ),
    kq_tables_v AS (
        SELECT st.r, st.layer,
               CASE WHEN st.family = 'ovr_base' AND st.tot <= 0 THEN pt.q
                    ELSE list_transform(st.raw, lambda kq_x: kq_x / st.tot) END AS v
        FROM kq_sub_tot st JOIN kq_pt pt ON pt.r = st.r AND pt.layer = st.layer
    ),
    -- the table of categories: argmax class x (edges + 1) + edges at or below the max
    kq_cat_k AS (
        SELECT pt.r, pt.layer, any_value(pt.stream) AS stream,
               (any_value(list_position(pt.q, list_max(pt.q))) - 1)
                   * (count(*) FILTER (WHERE m.family = 'kedge') + 1)
                   + count(*) FILTER (WHERE m.family = 'kedge' AND m.x <= list_max(pt.q)) AS k
        FROM kq_pt pt JOIN kq_m m ON m.stream = pt.stream AND m.layer = pt.layer
        WHERE m.family IN ('kcat', 'kedge')
        GROUP BY pt.r, pt.layer
    ),
    kq_cats_v AS (
        SELECT ck.r, ck.layer, m.y_k AS v
        FROM kq_cat_k ck
        LEFT JOIN kq_m m ON m.stream = ck.stream AND m.layer = ck.layer AND m.family = 'kcat'
                        AND m.term = ck.k
    ),
    -- the partition tree: every point from the root to its leaf
    kq_nodes AS (
        SELECT stream, layer, term, family, y_k, kids FROM kq_m
        WHERE family IN ('ksplit', 'kleaf')
    ),
    kq_walk(r, layer, stream, q, node) AS (
        SELECT pt.r, pt.layer, pt.stream, pt.q, 0 FROM kq_pt pt
        SEMI JOIN (SELECT DISTINCT stream, layer FROM kq_nodes) n
          ON n.stream = pt.stream AND n.layer = pt.layer
        UNION ALL
        SELECT w.r, w.layer, w.stream, w.q, calpipe_tree_child(w.q, n.y_k, n.kids)
        FROM kq_walk w JOIN kq_nodes n
          ON n.stream = w.stream AND n.layer = w.layer AND n.term = w.node
        WHERE n.family = 'ksplit'
    ),
    kq_tree_v AS (
        SELECT w.r, w.layer, n.y_k AS v
        FROM kq_walk w JOIN kq_nodes n
          ON n.stream = w.stream AND n.layer = w.layer AND n.term = w.node
        WHERE n.family = 'kleaf'
    ),
    -- the Brier mode: a_c = sum over the terms of weight * e^{-Brier(c, f(q))}, merged
    kq_brier_f AS (
        SELECT pt.r, pt.layer, m.weight, calpipe_brier_f(m.family, m.b, m.alphas, pt.q) AS f
        FROM kq_pt pt JOIN kq_m m ON m.stream = pt.stream AND m.layer = pt.layer
        WHERE m.family IN ('brier', 'brier_cox')
    ),
    kq_brier_e AS (
        SELECT bf.r, bf.layer, bf.weight,
               list_transform(range(len(bf.f)), lambda kq_c: exp(-calpipe_brier_loss(kq_c, bf.f)))
                   AS e
        FROM kq_brier_f bf
    ),
    kq_brier_a AS (
        SELECT be.r, be.layer, u.i, sum(be.weight * u.v) AS a
        FROM kq_brier_e be, unnest(be.e) WITH ORDINALITY AS u(v, i)
        GROUP BY be.r, be.layer, u.i
    ),
    kq_brier_v AS (
        SELECT r, layer, calpipe_brier_merge(list(a ORDER BY i)) AS v
        FROM kq_brier_a GROUP BY r, layer
    ),
    kq_all AS (
        SELECT r, layer, v, 0 AS kind FROM kq_tables_v
        UNION ALL SELECT r, layer, v, 1 FROM kq_cats_v
        UNION ALL SELECT r, layer, v, 2 FROM kq_tree_v
        UNION ALL SELECT r, layer, v, 3 FROM kq_brier_v
        UNION ALL SELECT r, layer, v, 4 FROM kq_term_v
    )
    -- calpipe_klayer's coalesce: the first kind with a value
    SELECT r, layer, arg_min(v, kind) FILTER (WHERE v IS NOT NULL) AS v
    FROM kq_all GROUP BY r, layer;

-- Calibrated class probabilities of a whole table: every row of the table, view or CTE named
-- `tbl` (columns `stream` and `scores`, a K-class base probability vector), in its order and
-- with all its columns, plus `protected_scores` under its stream's map in force at the end of
-- day `as_of` (NULL: no map yet, or a NULL vector or one with a NULL or NaN inside; a vector the
-- engine refuses is an error naming its row). Equal row by row to calibrate_scores_as_of (layer
-- 0 at the vector, layer 1, a stack's top, at layer 0's), but set-based (calpipe_kpoints_layer).
--   SELECT * FROM calibrate_scores_table_as_of('fresh_scores', DATE '2010-11-01');
CREATE OR REPLACE MACRO calibrate_scores_table_as_of(tbl, as_of) AS TABLE
    WITH calpipe_rows AS MATERIALIZED (
        SELECT row_number() OVER () AS calpipe_row, * FROM query_table(tbl)
    ),
    calpipe_k AS (SELECT max(n_classes) AS n FROM calibrator_state),
    calpipe_maps AS (SELECT * FROM calpipe_maps_in_force('calpipe_rows', as_of)),
    calpipe_tops AS (SELECT stream, max(layer) AS top FROM calpipe_maps GROUP BY stream),
    calpipe_checked AS (
        SELECT e.calpipe_row AS r, CAST(e.stream AS VARCHAR) AS stream,
               calpipe_kscores(e.scores, k.n, calpipe_where_row('calibrate_scores_table',
                                                                e.calpipe_row, e.stream)) AS q
        FROM calpipe_rows e, calpipe_k k
    ),
    calpipe_p0 AS (
        SELECT c.r, c.stream, 0 AS layer, c.q
        FROM calpipe_checked c SEMI JOIN calpipe_tops t ON t.stream = c.stream
        WHERE c.q IS NOT NULL
    ),
    calpipe_v0 AS (SELECT r, v FROM calpipe_kpoints_layer('calpipe_p0', 'calpipe_maps')),
    calpipe_p1 AS (
        SELECT pt.r, pt.stream, 1 AS layer, v.v AS q
        FROM calpipe_p0 pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 1
        LEFT JOIN calpipe_v0 v ON v.r = pt.r
    ),
    calpipe_v1 AS (SELECT r, v FROM calpipe_kpoints_layer('calpipe_p1', 'calpipe_maps')),
    calpipe_out AS (
        SELECT e.*,
               CASE WHEN c.q IS NULL THEN NULL WHEN t.top >= 1 THEN v1.v ELSE v0.v END
                   AS calpipe_value
        FROM calpipe_rows e
        JOIN calpipe_checked c ON c.r = e.calpipe_row
        LEFT JOIN calpipe_tops t ON t.stream = c.stream
        LEFT JOIN calpipe_v0 v0 ON v0.r = e.calpipe_row
        LEFT JOIN calpipe_v1 v1 ON v1.r = e.calpipe_row
    )
    -- (the table's own protected_scores is replaced, as calibrate_table's protected_score)
    SELECT COLUMNS(lambda col_name: lower(col_name) NOT IN ('calpipe_row', 'calpipe_value',
                                                           'protected_scores')),
           calpipe_value AS protected_scores
    FROM calpipe_out ORDER BY calpipe_row;

-- The same under each stream's latest map.
--   SELECT * FROM calibrate_scores_table('fresh_scores');
CREATE OR REPLACE MACRO calibrate_scores_table(tbl) AS TABLE
    SELECT * FROM calibrate_scores_table_as_of(tbl, DATE '9999-12-31');

-- The same under the latest map of stream `s`.
--   SELECT calibrate_score('bank-telemarketing', 0.3);
CREATE OR REPLACE MACRO calibrate_score(s, score) AS
    calibrate_score_as_of(s, score, DATE '9999-12-31');

-- The set form (calibrate_table): one layer of the maps in force evaluated at every point of
-- the relation named `points` (r, stream, layer, q, ins: a point's key, its stream, the layer,
-- the value to evaluate it at, the input tables' values) under the map rows of the relation
-- named `maps` (calibration_map's rows in force, layer NULL read as 0): (r, layer, v), one row
-- per point whose stream has rows in that layer. A point joins every row of a term or bin
-- layer, but only its own piece of a step/linear table (an ASOF join on x <= q, the piece that
-- calpipe_layer_value's arg_max picks): a table of thousands of pieces is not evaluated
-- thousands of times per score.
CREATE OR REPLACE MACRO calpipe_points_layer(points, maps) AS TABLE
    WITH calpipe_candidates AS (
        SELECT pt.r, pt.layer, pt.q, pt.ins, m
        FROM query_table(points) pt
        JOIN (SELECT * FROM query_table(maps) WHERE family NOT IN ('step', 'linear')) m
          ON m.stream = pt.stream AND m.layer = pt.layer
        UNION ALL
        SELECT pt.r, pt.layer, pt.q, pt.ins, m
        FROM query_table(points) pt
        ASOF JOIN (SELECT * FROM query_table(maps) WHERE family IN ('step', 'linear')) m
          ON m.stream = pt.stream AND m.layer = pt.layer AND m.x <= pt.q
    )
    SELECT r, layer, calpipe_layer_value(m, q, ins) AS v
    FROM calpipe_candidates GROUP BY r, layer;

-- Calibrated probabilities of a whole table: every row of the table, view or CTE named `tbl`
-- (columns `stream` and `score`, a binary base probability), in its order and with all its
-- columns, plus `protected_score` under its stream's map in force at the end of day `as_of`
-- (NULL: no map yet, or a NULL or NaN score). Equal row by row to calibrate_score_as_of (the
-- same layers, the same calpipe_layer_value), but set-based: the scores are joined with the
-- maps' rows once, where calibrate_score evaluates each score's map on its own (20x to 190x
-- the scores per second on the demo database, BENCHMARKS.md §15). Binary maps (K classes:
-- calibrate_scores_table).
--   SELECT * FROM calibrate_table_as_of('fresh_scores', DATE '2010-11-01');
CREATE OR REPLACE MACRO calibrate_table_as_of(tbl, as_of) AS TABLE
    -- (materialized: every reference reads the same row numbers, which pair each row with its
    -- value; the numbers follow the table's scan order, which the result keeps)
    WITH calpipe_rows AS MATERIALIZED (
        SELECT row_number() OVER () AS calpipe_row, * FROM query_table(tbl)
    ),
    calpipe_maps AS (SELECT * FROM calpipe_maps_in_force('calpipe_rows', as_of)),
    calpipe_tops AS (SELECT stream, max(layer) AS top FROM calpipe_maps GROUP BY stream),
    -- every row's score checked, also of a stream without a map (as calibrate_score)
    calpipe_checked AS (
        SELECT e.calpipe_row AS r, CAST(e.stream AS VARCHAR) AS stream,
               calpipe_score(e.score,
                             calpipe_where_row('calibrate_table', e.calpipe_row, e.stream)) AS p
        FROM calpipe_rows e
    ),
    calpipe_points AS (
        SELECT c.r, c.stream, c.p
        FROM calpipe_checked c SEMI JOIN calpipe_tops t ON t.stream = c.stream
        WHERE c.p IS NOT NULL AND calpipe_require_binary('calibrate_table') IS NULL
    ),
    -- a composite-experts input whose map is a table (layer -1, -2, ...), at the clipped score
    calpipe_in_points AS (
        SELECT pt.r, pt.stream, it.layer, calpipe_clip(pt.p, it.clip) AS q,
               CAST(NULL AS DOUBLE[]) AS ins
        FROM calpipe_points pt
        JOIN (SELECT DISTINCT stream, layer, clip FROM calpipe_maps WHERE layer < 0) it
          ON it.stream = pt.stream
    ),
    calpipe_ins AS (
        SELECT r, list(v ORDER BY layer DESC) AS ins
        FROM calpipe_points_layer('calpipe_in_points', 'calpipe_maps') GROUP BY r
    ),
    calpipe_p0 AS (
        SELECT pt.r, pt.stream, 0 AS layer, pt.p AS q, i.ins
        FROM calpipe_points pt LEFT JOIN calpipe_ins i ON i.r = pt.r
    ),
    calpipe_v0 AS (SELECT r, v FROM calpipe_points_layer('calpipe_p0', 'calpipe_maps')),
    -- a stack's top or a calibeating table at layer 0's value; a third layer at layer 1's
    calpipe_p1 AS (
        SELECT pt.r, pt.stream, 1 AS layer, v.v AS q, CAST(NULL AS DOUBLE[]) AS ins
        FROM calpipe_points pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 1
        LEFT JOIN calpipe_v0 v ON v.r = pt.r
    ),
    calpipe_v1 AS (SELECT r, v FROM calpipe_points_layer('calpipe_p1', 'calpipe_maps')),
    calpipe_p2 AS (
        SELECT pt.r, pt.stream, 2 AS layer, v.v AS q, CAST(NULL AS DOUBLE[]) AS ins
        FROM calpipe_points pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 2
        LEFT JOIN calpipe_v1 v ON v.r = pt.r
    ),
    calpipe_v2 AS (SELECT r, v FROM calpipe_points_layer('calpipe_p2', 'calpipe_maps')),
    calpipe_out AS (
        SELECT e.*,
               CASE WHEN c.p IS NULL THEN NULL
                    WHEN t.top >= 2 THEN v2.v WHEN t.top >= 1 THEN v1.v ELSE v0.v END
                   AS calpipe_value
        FROM calpipe_rows e
        JOIN calpipe_checked c ON c.r = e.calpipe_row
        LEFT JOIN calpipe_tops t ON t.stream = c.stream
        LEFT JOIN calpipe_v0 v0 ON v0.r = e.calpipe_row
        LEFT JOIN calpipe_v1 v1 ON v1.r = e.calpipe_row
        LEFT JOIN calpipe_v2 v2 ON v2.r = e.calpipe_row
    )
    -- (the table's own protected_score, e.g. of an earlier run, is replaced: kept, it came out
    -- beside the new one as DuckDB's protected_score_1, the stale one under the expected name)
    SELECT COLUMNS(lambda col_name: lower(col_name) NOT IN ('calpipe_row', 'calpipe_value',
                                                           'protected_score')),
           calpipe_value AS protected_score
    FROM calpipe_out ORDER BY calpipe_row;

-- The same under each stream's latest map.
--   SELECT * FROM calibrate_table('fresh_scores');
CREATE OR REPLACE MACRO calibrate_table(tbl) AS TABLE
    SELECT * FROM calibrate_table_as_of(tbl, DATE '9999-12-31');

-- The latest map of stream `s` tabulated on n + 1 equally spaced points of [0, 1] (for plots).
--   SELECT * FROM calibration_curve('bank-telemarketing', 10);
CREATE OR REPLACE MACRO calibration_curve(s, n) AS TABLE
    SELECT g.i / n AS p, calibrate_score(s, g.i / n) AS protected_p
    -- (n = 0 gave one point, 0 / 0)
    FROM range(0, CASE WHEN n >= 1 THEN n + 1
                       ELSE error(concat('calibration_curve: n must be >= 1, got ', n)) END)
         AS g(i)
    WHERE EXISTS (SELECT 1 FROM calibration_map WHERE stream = CAST(s AS VARCHAR))
    ORDER BY g.i;
