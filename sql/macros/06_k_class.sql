-- Serving-map macros 06 (sql/macros/, installed in name order: calpipe.storage.schema.SQL_LAYOUT),
-- the K-class map of one stream at a score vector: the vector checked, each family of a layer
-- (coupled step tables, categories, partition tree, Brier mode, terms: calpipe_klayer) and the
-- forms calibrate_scores_as_of and calibrate_scores. Uses 01, 02 and 04.

-- K classes: a score vector as the maps read it (DOUBLE[]), NULL for NULL and for a vector with
-- a NULL or NaN inside (no forecast without a score, as calpipe_score); an error naming `what`
-- on a database of binary forecasts (k = 2: the K-class macros read a binary map's terms as
-- a K-class map's and answered a vector of no meaning) and for a vector the engine refuses
-- (calpipe.contract): another number of classes than `k` (the database's: the maps answered a
-- vector of the given length), a class probability outside [0, 1], or a sum off 1 by more than
-- config.SCORES_SUM_TOL, 1e-06 (the maps renormalised it).
-- A score vector as an error message shows it: the whole vector up to 8 values, else its first
-- 8 and its length (a 100,000-value list was echoed whole: 700 KB in one message).
CREATE OR REPLACE MACRO calpipe_kshow(kp) AS
    CASE WHEN len(kp) <= 8 THEN CAST(kp AS VARCHAR)
         ELSE concat(rtrim(CAST(kp[1:8] AS VARCHAR), ']'), ', ... (', len(kp), ' values)]') END;

CREATE OR REPLACE MACRO calpipe_kscores(p, k, what) AS
    list_transform([CAST(p AS DOUBLE[])], lambda kp:
        CASE WHEN k = 2
             THEN error(concat(what, ': this database holds binary forecasts: use ',
                               'calibrate_score(stream, p) with the probability of class 1'))
             WHEN kp IS NULL OR list_bool_or(list_transform(kp, lambda x: x IS NULL OR isnan(x)))
             THEN NULL
             WHEN len(kp) <> k
             THEN error(concat(what, ': scores ', calpipe_kshow(kp), ' hold ', len(kp),
                               ' classes, and the forecasts of this database ', k))
             WHEN list_bool_or(list_transform(kp, lambda x: x < 0 OR x > 1))
             THEN error(concat(what, ': scores ', calpipe_kshow(kp), ' hold a class ',
                               'probability outside [0, 1] (scores are base probabilities)'))
             WHEN abs(list_sum(kp) - 1) > 1e-06
             THEN error(concat(what, ': scores ', calpipe_kshow(kp), ' do not sum to 1 ',
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
