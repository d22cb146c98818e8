-- Serving-map macros 05 (sql/macros/, installed in name order: calpipe.storage.schema.SQL_LAYOUT),
-- the binary map of one stream: one layer's value at a score (calpipe_layer_value, the one home
-- of both forms' evaluation; calpipe_layer) and the scalar forms calibrate_score_as_of,
-- calibrate_score and calibration_curve. Uses 01 to 04.

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
-- value ins[j + 1] (the stream's input tables' values, those of this layer at its input
-- clipped, the others' NULL) for q. One home for
-- calpipe_layer (one score) and for calpipe_points_layer (a table of scores) but its layers of
-- terms, which the set form evaluates compiled (calpipe_term_layers, 07: the same sums in
-- another order, a few ulps apart), and its step/linear tables, whose value it takes from the
-- one row an ASOF join finds (calpipe_piece of the row arg_max picks: the same value).
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

-- The values of stream `s`'s input tables (layers -1, -2, ... of its map of day `d`) for the
-- terms of layer `lay`, whose input is q: a list of them all by layer -1, -2, ... (the index
-- the terms' in_layer gives), those read by layer `lay`'s terms at q clipped (as their
-- method clips its input: the table rows' `clip`), the others NULL (evaluated at NULL: no
-- piece). One row, NULL without input tables, also per row of an outer query (a scalar
-- subquery). Which layer reads a table is named by its terms' in_layer, not by a column.
CREATE OR REPLACE MACRO calpipe_in_tables(s, d, lay, q) AS (
    SELECT list(l.v ORDER BY it.layer DESC)
    FROM (SELECT t.layer, t.clip, r.in_layer IS NOT NULL AS mine
          FROM (SELECT layer, any_value(clip) AS clip FROM calibration_map
                WHERE stream = CAST(s AS VARCHAR) AND date = d AND layer < 0
                GROUP BY layer) t
          LEFT JOIN (SELECT DISTINCT in_layer FROM calibration_map
                     WHERE stream = CAST(s AS VARCHAR) AND date = d
                       AND coalesce(layer, 0) = lay AND in_layer IS NOT NULL) r
            ON r.in_layer = t.layer) it,
         calpipe_layer(s, d, it.layer, CASE WHEN it.mine THEN calpipe_clip(q, it.clip) END,
                       NULL) AS l
);

-- Calibrated probability of `score` under stream `s`'s map in force at the end of day `as_of`
-- (its latest map on or before; NULL: no map yet, or a NULL or NaN score), for every method
-- with a SQL form (calpipe.night.mapping.has_sql_map): layer 0 at the score; layer 1 (a
-- stack's top, a calibeating table), where there is one, at layer 0's value; layer 2 (the top
-- of a stack with a calibeating layer) at layer 1's. A composite-experts input whose map is a
-- table of its own (layer -1, -2, ...) is evaluated first, for the terms that read it, at the
-- value their layer receives (the score, or a stack's base's value), clipped.
CREATE OR REPLACE MACRO calibrate_score_as_of(s, score, as_of) AS (
    WITH d AS (
        SELECT max(date) AS d FROM calibration_map
        WHERE stream = CAST(s AS VARCHAR) AND date <= CAST(as_of AS DATE)
    ),
    -- (each layer's input tables in a CTE of their own: a column the layer's aggregate reads)
    ins0 AS (
        SELECT calpipe_in_tables(s, d.d, 0, calpipe_score(score, calpipe_where_score(s))) AS v
        FROM d
    ),
    l0 AS (
        SELECT l.v
        FROM d, ins0,
             calpipe_layer(s, d.d, 0, calpipe_score(score, calpipe_where_score(s)), ins0.v) AS l
    ),
    ins1 AS (SELECT calpipe_in_tables(s, d.d, 1, l0.v) AS v FROM d, l0),
    l1 AS (SELECT l.v, l.n FROM d, l0, ins1, calpipe_layer(s, d.d, 1, l0.v, ins1.v) AS l),
    ins2 AS (SELECT calpipe_in_tables(s, d.d, 2, l1.v) AS v FROM d, l1),
    l2 AS (SELECT l.v, l.n FROM d, l1, ins2, calpipe_layer(s, d.d, 2, l1.v, ins2.v) AS l)
    SELECT coalesce(calpipe_require_binary('calibrate_score'),
                    CASE WHEN calpipe_score(score, calpipe_where_score(s)) IS NULL THEN NULL
                         WHEN l2.n > 0 THEN l2.v WHEN l1.n > 0 THEN l1.v ELSE l0.v END)
    FROM l0, l1, l2
);

-- The same under the latest map of stream `s`.
--   SELECT calibrate_score('bank-telemarketing', 0.3);
CREATE OR REPLACE MACRO calibrate_score(s, score) AS
    calibrate_score_as_of(s, score, DATE '9999-12-31');

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
