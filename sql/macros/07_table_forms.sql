-- Serving-map macros 07 (sql/macros/, installed in name order: calpipe.storage.schema.SQL_LAYOUT),
-- the set forms, which calibrate every row of a table at once: calibrate_table_as_of and
-- calibrate_table (binary: each layer by calpipe_layer_value, 05), calibrate_scores_table_as_of
-- and calibrate_scores_table (K-class: each layer's families as in 06), and the map rows in
-- force they read. Uses 01 to 06.

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

-- The term layers of the maps in force (the relation named `maps`: calibration_map's rows, layer
-- NULL read as 0) compiled for the set form: one row per (stream, layer) whose rows are all terms
-- (calpipe_term's families: a mixture, a logistic or temperature map), the layer's rows as lists
-- that calpipe_terms_value reads for a whole table of scores with no join per term. `inputs`:
-- the layer's distinct input maps (struct w1, w2, w0, eps, in_pos, clip; in_pos: the input
-- table's position among the layer's own tables, k for the k-th of -(o + 1), -(o + 2), ...,
-- a stack's top numbering its tables on from its base's), numbered i = 1, 2, ... in their
-- order; the Cox terms grouped by (input, beta):
-- `g_in` each group's input, `g_b` its beta, `g_terms` its terms (struct w = the weight, eia =
-- e^{-alpha}); `id_in`/`id_w` the identity terms' inputs and weights; `others` the other terms
-- (struct i, family, a, b, w: quadratic, cubic, temperature, each evaluated by calpipe_term).
-- Why: a score joined with the layer's ~106 rows, each row evaluating its term and its input's
-- logistic map through nested one-element-list lambdas, then summed by a GROUP BY over the
-- score, cost ~0.5 us a (score, term) row, 20,000 scores/s under the default's maps (BENCHMARKS
-- §15); as lists, each input map is evaluated once per score, each Cox group's power once, and
-- a term costs one multiply-add and one division.
CREATE OR REPLACE MACRO calpipe_term_layers(maps) AS TABLE
    WITH tl_m AS (
        SELECT stream, layer, term, family, a, b, weight, in_w1, in_w2, in_w0, in_eps, in_layer,
               clip,
               dense_rank() OVER (PARTITION BY stream, layer
                                  ORDER BY in_layer, in_w1, in_w2, in_w0, in_eps, clip) AS i,
               -- (a layer's tables are contiguous, mapping.py: the first is its largest)
               max(in_layer) OVER (PARTITION BY stream, layer) - in_layer + 1 AS in_pos
        FROM query_table(maps)
        QUALIFY bool_and(family IN ('identity', 'quadratic', 'cubic', 'cox', 'temperature'))
                    OVER (PARTITION BY stream, layer)
    ),
    tl_layers AS (
        SELECT stream, layer, list(s ORDER BY i) AS inputs
        FROM (SELECT stream, layer, i,
                     any_value({'w1': in_w1, 'w2': in_w2, 'w0': in_w0, 'eps': in_eps,
                                'in_pos': in_pos, 'clip': clip}) AS s
              FROM tl_m GROUP BY stream, layer, i)
        GROUP BY stream, layer
    ),
    tl_groups AS (
        SELECT stream, layer, list(i ORDER BY i, b) AS g_in, list(b ORDER BY i, b) AS g_b,
               list(terms ORDER BY i, b) AS g_terms
        FROM (SELECT stream, layer, i, b,
                     list({'w': weight, 'eia': exp(-a)} ORDER BY term) AS terms
              FROM tl_m WHERE family = 'cox' GROUP BY stream, layer, i, b)
        GROUP BY stream, layer
    ),
    tl_identity AS (
        SELECT stream, layer, list(i ORDER BY term) AS id_in, list(weight ORDER BY term) AS id_w
        FROM tl_m WHERE family = 'identity' GROUP BY stream, layer
    ),
    tl_others AS (
        SELECT stream, layer,
               list({'i': i, 'family': family, 'a': a, 'b': b, 'w': weight} ORDER BY term)
                   AS others
        FROM tl_m WHERE family IN ('quadratic', 'cubic', 'temperature') GROUP BY stream, layer
    )
    SELECT l.stream, l.layer, l.inputs,
           coalesce(g.g_in, []) AS g_in, coalesce(g.g_b, []) AS g_b,
           coalesce(g.g_terms, []) AS g_terms,
           coalesce(d.id_in, []) AS id_in, coalesce(d.id_w, []) AS id_w,
           coalesce(o.others, []) AS others
    FROM tl_layers l
    LEFT JOIN tl_groups g ON g.stream = l.stream AND g.layer = l.layer
    LEFT JOIN tl_identity d ON d.stream = l.stream AND d.layer = l.layer
    LEFT JOIN tl_others o ON o.stream = l.stream AND o.layer = l.layer;

-- A compiled term layer's inputs at score p: the list of each input's q (calpipe_term_layers'
-- `inputs`, in order), clip(q(clip(p))) as calpipe_map_term computes it, or the clipped value
-- ins[k] of the layer's k-th input table (ins: the values of the layer's own tables, in their
-- order, calibrate_table_as_of). (The logistic is 1 / (1 + e^{-z}) for every z, z bound once;
-- calpipe_sigmoid's other branch, e^z / (1 + e^z) for z < 0, agrees to a few ulps, and both
-- are 0 or 1 where they overflow.)
CREATE OR REPLACE MACRO calpipe_term_inputs(inputs, p, ins) AS
    list_transform(inputs, lambda ti_i: calpipe_clip(
        CASE WHEN ti_i.in_pos IS NOT NULL THEN ins[ti_i.in_pos]
             WHEN ti_i.w1 IS NULL THEN calpipe_clip(p, ti_i.clip)
             ELSE 1 / (1 + exp(-(ti_i.w1 * ln(calpipe_clip(calpipe_clip(p, ti_i.clip), ti_i.eps))
                                 - ti_i.w2 * ln(1 - calpipe_clip(calpipe_clip(p, ti_i.clip),
                                                                 ti_i.eps))
                                 + ti_i.w0)))
        END, ti_i.clip));

-- Each Cox group's ((1 - q) / q)^beta at its input's q (qs: calpipe_term_inputs' list).
CREATE OR REPLACE MACRO calpipe_term_ratios(g_in, g_b, qs) AS
    list_transform(list_zip(list_select(qs, g_in), g_b),
                   lambda tr_z: pow((1 - tr_z[1]) / tr_z[1], tr_z[2]));

-- A compiled term layer's value (the sum of its weighted terms, calpipe_layer_value's last
-- branch) from its inputs' values qs and its Cox groups' ratios ys: a Cox term
-- e^a q^b / (e^a q^b + (1 - q)^b) is 1 / (1 + ((1 - q) / q)^b e^{-a}) (0 at q = 0, 1 at q = 1,
-- as the quotient; a few ulps from it elsewhere), the identity q, the others calpipe_term.
CREATE OR REPLACE MACRO calpipe_terms_value(c, qs, ys) AS
    list_sum([
        list_sum(list_transform(list_zip(ys, c.g_terms), lambda tv_z:
            list_sum(list_transform(tv_z[2], lambda tv_t: tv_t.w / (1 + tv_z[1] * tv_t.eia))))),
        list_sum(list_transform(list_zip(list_select(qs, c.id_in), c.id_w),
                                lambda tv_d: tv_d[1] * tv_d[2])),
        list_sum(list_transform(c.others, lambda tv_o:
            tv_o.w * calpipe_term(tv_o.family, tv_o.a, tv_o.b, qs[tv_o.i])))
    ]);

-- The set form (calibrate_table): one layer of the maps in force evaluated at every point of
-- the relation named `points` (r, stream, layer, q, ins: a point's key, its stream, the layer,
-- the value to evaluate it at, the values of the layer's input tables) under the map rows of
-- the relation
-- named `maps` (calibration_map's rows in force, layer NULL read as 0) and their term layers
-- compiled, the relation named `terms` (calpipe_term_layers of `maps`: compiled once per
-- query, not once per layer, which would bind its macros again): (r, layer, v), one row per
-- point whose stream has rows in that layer. A layer of terms is evaluated compiled (one join
-- of a point with its layer's lists, each input's map once per point, the terms as list
-- arithmetic); a step/linear table (a layer of pieces only) by the point's own piece, found by
-- an ASOF join on x <= q (the piece that calpipe_layer_value's arg_max picks): a table of
-- thousands of pieces is not evaluated thousands of times per score; a point of another layer
-- (bins, the Brier mode, calibrated regression) joins every row of its layer, summed up by
-- calpipe_layer_value.
CREATE OR REPLACE MACRO calpipe_points_layer(points, maps, terms) AS TABLE
    WITH calpipe_pl_terms AS (SELECT * FROM query_table(terms)),
    calpipe_pl_rows AS (
        SELECT m.* FROM query_table(maps) m
        ANTI JOIN calpipe_pl_terms t ON t.stream = m.stream AND t.layer = m.layer
    ),
    -- the step/linear tables: layers whose rows are all pieces (mapping.py writes a table's
    -- pieces, every one with its values, and nothing beside them in its layer)
    calpipe_pl_tables AS (
        SELECT stream, layer FROM calpipe_pl_rows GROUP BY stream, layer
        HAVING bool_and(family IN ('step', 'linear'))
    ),
    calpipe_candidates AS (
        SELECT pt.r, pt.layer, pt.q, pt.ins, m
        FROM query_table(points) pt
        JOIN (SELECT * FROM calpipe_pl_rows m
              ANTI JOIN calpipe_pl_tables t ON t.stream = m.stream AND t.layer = m.layer) m
          ON m.stream = pt.stream AND m.layer = pt.layer
    ),
    -- (three projections: each input's value, then each Cox group's ratio, are computed once
    -- per point, as columns the next reads)
    calpipe_pl_qs AS (
        SELECT pt.r, pt.layer, c, calpipe_term_inputs(c.inputs, pt.q, pt.ins) AS qs
        FROM query_table(points) pt
        JOIN calpipe_pl_terms c ON c.stream = pt.stream AND c.layer = pt.layer
    ),
    calpipe_pl_ys AS (
        SELECT r, layer, c, qs, calpipe_term_ratios(c.g_in, c.g_b, qs) AS ys FROM calpipe_pl_qs
    )
    SELECT r, layer, calpipe_layer_value(m, q, ins) AS v
    FROM calpipe_candidates GROUP BY r, layer
    UNION ALL
    -- a table's point: its piece, one row, with no GROUP BY over the points (it took 0.3 s a
    -- million points, a fifth of a step table's time; BENCHMARKS §29). Only the points of a
    -- table's layer: the ASOF join sorts every point it is given, 0.4 s a million with no
    -- table at all.
    SELECT pt.r, pt.layer,
           calpipe_piece(m.family, m.x, m.y_at, m.y_right, m.x_next, m.y_next, pt.q) AS v
    FROM (SELECT * FROM query_table(points) pt
          SEMI JOIN calpipe_pl_tables s ON s.stream = pt.stream AND s.layer = pt.layer) pt
    ASOF JOIN (SELECT * FROM calpipe_pl_rows WHERE family IN ('step', 'linear')) m
      ON m.stream = pt.stream AND m.layer = pt.layer AND m.x <= pt.q
    UNION ALL
    SELECT r, layer, calpipe_terms_value(c, qs, ys) AS v FROM calpipe_pl_ys;

-- The values of input tables at points (the relation named `points`: r, stream, layer, q, the
-- table's layer and the value to evaluate it at, clipped) under the map rows of the relation
-- named `maps`: (r, ins), ins the point's tables' values by layer -1, -2, ... An input table is
-- a step/linear table (its piece by an ASOF join on x <= q, the one calpipe_layer_value's
-- arg_max picks) or, not fitted yet, one identity term (q itself: q is clipped already, and
-- calpipe_map_term clips it again to the same value). Why not calpipe_points_layer: binding
-- it costs ~0.03 s a use, and calibrate_table_as_of evaluates input tables for each of its
-- three layers (a stack's top reads them at its base's value).
CREATE OR REPLACE MACRO calpipe_in_table_values(points, maps) AS TABLE
    SELECT pt.r,
           list(CASE WHEN m.family = 'identity' THEN pt.q
                     ELSE calpipe_piece(m.family, m.x, m.y_at, m.y_right, m.x_next, m.y_next, pt.q)
                END ORDER BY pt.layer DESC) AS ins
    FROM query_table(points) pt
    ASOF JOIN (SELECT * REPLACE (coalesce(x, -'infinity'::DOUBLE) AS x) FROM query_table(maps)
               WHERE layer < 0) m
      ON m.stream = pt.stream AND m.layer = pt.layer AND m.x <= pt.q
    GROUP BY pt.r;

-- Calibrated probabilities of a whole table: every row of the table, view or CTE named `tbl`
-- (columns `stream` and `score`, a binary base probability), in its order and with all its
-- columns, plus `protected_score` under its stream's map in force at the end of day `as_of`
-- (NULL: no map yet, or a NULL or NaN score). Equal row by row to calibrate_score_as_of to a
-- few ulps (the same layers; a layer of terms compiled, calpipe_term_layers), but set-based:
-- the scores are joined with the maps' rows once, where calibrate_score evaluates each score's
-- map on its own (400x the scores per second under the default's maps on the demo database,
-- BENCHMARKS.md §15). Binary maps (K classes: calibrate_scores_table).
--   SELECT * FROM calibrate_table_as_of('fresh_scores', DATE '2010-11-01');
CREATE OR REPLACE MACRO calibrate_table_as_of(tbl, as_of) AS TABLE
    -- (materialized: every reference reads the same row numbers, which pair each row with its
    -- value; the numbers follow the table's scan order, which the result keeps.) Every row's
    -- score is checked here, also of a stream without a map (as calibrate_score): calpipe_p,
    -- which the result reads beside the row's own columns (a join of the rows with their
    -- checked scores took ~0.15 s a million rows). The form's own columns come before the
    -- table's: a column of the table under the same name is then DuckDB's name_1, and kept.
    WITH calpipe_rows AS MATERIALIZED (
        SELECT calpipe_score(score, calpipe_where_row('calibrate_table', calpipe_row, stream))
                   AS calpipe_p, *
        FROM (SELECT row_number() OVER () AS calpipe_row, * FROM query_table(tbl))
    ),
    calpipe_maps AS (SELECT * FROM calpipe_maps_in_force('calpipe_rows', as_of)),
    -- each stream's top layer (0; 1 or 2: a stack's top, a calibeating table), and whether its
    -- map is `plain`: one layer and no input tables, all its rows at layer 0
    calpipe_tops AS (
        SELECT stream, max(layer) AS top, bool_and(layer = 0) AS plain
        FROM calpipe_maps GROUP BY stream
    ),
    calpipe_terms AS (SELECT * FROM calpipe_term_layers('calpipe_maps')),
    calpipe_points AS (
        SELECT e.calpipe_row AS r, t.stream, e.calpipe_p AS p, t.plain
        FROM calpipe_rows e JOIN calpipe_tops t ON t.stream = CAST(e.stream AS VARCHAR)
        WHERE e.calpipe_p IS NOT NULL AND calpipe_require_binary('calibrate_table') IS NULL
    ),
    -- The points of the maps with a stack or input tables: only these go through the stack and
    -- input-table CTEs below; a plain map's points are layer 0's values at their scores
    -- (calpipe_p0). Why: those CTEs joined every point (with its tables' values; with layer 0's
    -- values, to find a next layer's input), with or without a stack or tables, and a step
    -- table's million points ran at 0.9x the rate of the form before #33 (BENCHMARKS §29). A
    -- query cannot choose its plan by the data, so the points are split by their stream's map.
    calpipe_layered AS (SELECT r, stream, p FROM calpipe_points WHERE NOT plain),
    -- a composite-experts input whose map is a table (layer -1, -2, ...), with its clip and the
    -- layer whose terms read it (`lay`: 0, or a stack's top, 1 or 2), which evaluates it at
    -- its own input, clipped (the score, or the base's value)
    calpipe_in_tables AS (
        SELECT t.stream, t.layer, t.clip, r.lay
        FROM (SELECT DISTINCT stream, layer, clip FROM calpipe_maps WHERE layer < 0) t
        JOIN (SELECT DISTINCT stream, in_layer, layer AS lay FROM calpipe_maps
              WHERE in_layer IS NOT NULL) r
          ON r.stream = t.stream AND r.in_layer = t.layer
    ),
    calpipe_in_points0 AS (
        SELECT pt.r, pt.stream, it.layer, calpipe_clip(pt.p, it.clip) AS q
        FROM calpipe_layered pt JOIN calpipe_in_tables it ON it.stream = pt.stream AND it.lay = 0
    ),
    -- (a layer's tables' values in their order: the k-th is its terms' in_pos k)
    calpipe_ins0 AS (SELECT * FROM calpipe_in_table_values('calpipe_in_points0', 'calpipe_maps')),
    -- (one calpipe_points_layer for both kinds of points: each use is bound and planned again,
    -- ~0.05 s a query)
    calpipe_p0 AS (
        SELECT r, stream, 0 AS layer, p AS q, CAST(NULL AS DOUBLE[]) AS ins
        FROM calpipe_points WHERE plain
        UNION ALL
        SELECT pt.r, pt.stream, 0 AS layer, pt.p AS q, i.ins
        FROM calpipe_layered pt LEFT JOIN calpipe_ins0 i ON i.r = pt.r
    ),
    calpipe_v0 AS (
        SELECT r, v FROM calpipe_points_layer('calpipe_p0', 'calpipe_maps', 'calpipe_terms')
    ),
    -- a stack's top or a calibeating table at layer 0's value (its input tables too); a third
    -- layer at layer 1's. (calpipe_q1, the stack's points at layer 0's value, is where the
    -- input tables' points come from: taken from the points and their tables directly, they
    -- made DuckDB hash every point's layer-0 value, 0.04 s a million, even with no stack.)
    calpipe_q1 AS (
        SELECT pt.r, pt.stream, v.v AS q
        FROM calpipe_layered pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 1
        JOIN calpipe_v0 v ON v.r = pt.r
    ),
    calpipe_in_points1 AS (
        SELECT q.r, q.stream, it.layer, calpipe_clip(q.q, it.clip) AS q
        FROM calpipe_q1 q JOIN calpipe_in_tables it ON it.stream = q.stream AND it.lay = 1
    ),
    calpipe_ins1 AS (SELECT * FROM calpipe_in_table_values('calpipe_in_points1', 'calpipe_maps')),
    calpipe_p1 AS (
        SELECT pt.r, pt.stream, 1 AS layer, v.v AS q, i.ins
        FROM calpipe_layered pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 1
        LEFT JOIN calpipe_v0 v ON v.r = pt.r
        LEFT JOIN calpipe_ins1 i ON i.r = pt.r
    ),
    calpipe_v1 AS (
        SELECT r, v FROM calpipe_points_layer('calpipe_p1', 'calpipe_maps', 'calpipe_terms')
    ),
    calpipe_q2 AS (
        SELECT pt.r, pt.stream, v.v AS q
        FROM calpipe_layered pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 2
        JOIN calpipe_v1 v ON v.r = pt.r
    ),
    calpipe_in_points2 AS (
        SELECT q.r, q.stream, it.layer, calpipe_clip(q.q, it.clip) AS q
        FROM calpipe_q2 q JOIN calpipe_in_tables it ON it.stream = q.stream AND it.lay = 2
    ),
    calpipe_ins2 AS (SELECT * FROM calpipe_in_table_values('calpipe_in_points2', 'calpipe_maps')),
    calpipe_p2 AS (
        SELECT pt.r, pt.stream, 2 AS layer, v.v AS q, i.ins
        FROM calpipe_layered pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 2
        LEFT JOIN calpipe_v1 v ON v.r = pt.r
        LEFT JOIN calpipe_ins2 i ON i.r = pt.r
    ),
    calpipe_v2 AS (
        SELECT r, v FROM calpipe_points_layer('calpipe_p2', 'calpipe_maps', 'calpipe_terms')
    ),
    -- (calpipe_value before the table's columns, as calpipe_row and calpipe_p: after them, a
    -- column of the table named calpipe_value came out as protected_score)
    calpipe_out AS (
        SELECT CASE WHEN e.calpipe_p IS NULL THEN NULL
                    WHEN t.top >= 2 THEN v2.v WHEN t.top >= 1 THEN v1.v ELSE v0.v END
                   AS calpipe_value,
               e.*
        FROM calpipe_rows e
        LEFT JOIN calpipe_tops t ON t.stream = CAST(e.stream AS VARCHAR)
        LEFT JOIN calpipe_v0 v0 ON v0.r = e.calpipe_row
        LEFT JOIN calpipe_v1 v1 ON v1.r = e.calpipe_row
        LEFT JOIN calpipe_v2 v2 ON v2.r = e.calpipe_row
    )
    -- (the table's own protected_score, e.g. of an earlier run, is replaced: kept, it came out
    -- beside the new one as DuckDB's protected_score_1, the stale one under the expected name)
    SELECT COLUMNS(lambda col_name: lower(col_name) NOT IN ('calpipe_row', 'calpipe_p',
                                                           'calpipe_value', 'protected_score')),
           calpipe_value AS protected_score
    FROM calpipe_out ORDER BY calpipe_row;

-- The same under each stream's latest map.
--   SELECT * FROM calibrate_table('fresh_scores');
CREATE OR REPLACE MACRO calibrate_table(tbl) AS TABLE
    SELECT * FROM calibrate_table_as_of(tbl, DATE '9999-12-31');

-- The K-class term layers of the maps in force (the relation named `maps`), compiled for the
-- K-class set form as calpipe_term_layers compiles the binary ones: one row per (stream, layer)
-- whose rows are all terms (calpipe_kterm's families); `inputs` the distinct input maps (struct
-- ka, kb, eps, clip: vector scaling, or ka NULL for the clipped score), numbered i = 1, 2, ...;
-- the Cox terms grouped by (input, beta): `g_in`, `g_b`, `g_terms` (struct w = the weight, ea =
-- e^{alphas}, the class shifts' exponentials) and `g_ea` (per group, per class c the list of
-- its terms' ea[c], for the classes' dot products); `id_in`/`id_w` the identity terms; `others`
-- the other terms (struct i, family, a, b, alphas, w: temperature, by calpipe_kterm). Why: the
-- K-class terms cost ~0.3 ms a vector under the default's maps joined row by row (a K-list per
-- (vector, term), then unnested and summed by class), 3,500 vectors/s before #33 (BENCHMARKS §15).
CREATE OR REPLACE MACRO calpipe_kterm_layers(maps) AS TABLE
    WITH kl_m AS (
        SELECT stream, layer, term, family, a, b, weight, alphas, in_ka, in_kb, in_eps, clip,
               dense_rank() OVER (PARTITION BY stream, layer
                                  ORDER BY in_ka, in_kb, in_eps, clip) AS i
        FROM query_table(maps)
        QUALIFY bool_and(family IN ('identity', 'cox', 'temperature'))
                    OVER (PARTITION BY stream, layer)
    ),
    kl_layers AS (
        SELECT stream, layer, list(s ORDER BY i) AS inputs
        FROM (SELECT stream, layer, i,
                     any_value({'ka': in_ka, 'kb': in_kb, 'eps': in_eps, 'clip': clip}) AS s
              FROM kl_m GROUP BY stream, layer, i)
        GROUP BY stream, layer
    ),
    kl_cox AS (
        SELECT stream, layer, i, b,
               list({'w': weight, 'ea': list_transform(alphas, lambda kl_x: exp(kl_x))}
                    ORDER BY term) AS terms
        FROM kl_m WHERE family = 'cox' GROUP BY stream, layer, i, b
    ),
    kl_groups AS (
        SELECT stream, layer, list(i ORDER BY i, b) AS g_in, list(b ORDER BY i, b) AS g_b,
               list(terms ORDER BY i, b) AS g_terms,
               list(list_transform(range(1, len(terms[1].ea) + 1), lambda kl_c:
                        list_transform(terms, lambda kl_t: kl_t.ea[kl_c])) ORDER BY i, b) AS g_ea
        FROM kl_cox GROUP BY stream, layer
    ),
    kl_identity AS (
        SELECT stream, layer, list(i ORDER BY term) AS id_in, list(weight ORDER BY term) AS id_w
        FROM kl_m WHERE family = 'identity' GROUP BY stream, layer
    ),
    kl_others AS (
        SELECT stream, layer,
               list({'i': i, 'family': family, 'a': a, 'b': b, 'alphas': alphas, 'w': weight}
                    ORDER BY term) AS others
        FROM kl_m WHERE family = 'temperature' GROUP BY stream, layer
    )
    SELECT l.stream, l.layer, l.inputs,
           coalesce(g.g_in, []) AS g_in, coalesce(g.g_b, []) AS g_b,
           coalesce(g.g_terms, []) AS g_terms, coalesce(g.g_ea, []) AS g_ea,
           coalesce(d.id_in, []) AS id_in, coalesce(d.id_w, []) AS id_w,
           coalesce(o.others, []) AS others
    FROM kl_layers l
    LEFT JOIN kl_groups g ON g.stream = l.stream AND g.layer = l.layer
    LEFT JOIN kl_identity d ON d.stream = l.stream AND d.layer = l.layer
    LEFT JOIN kl_others o ON o.stream = l.stream AND o.layer = l.layer;

-- A compiled K-class term layer's inputs at the vector q: each input's vector, kclip(q) or
-- kclip(kinput(kclip(q))) as calpipe_kpoints_layer's terms compute it.
CREATE OR REPLACE MACRO calpipe_kterm_inputs(inputs, q) AS
    list_transform(inputs, lambda ki_i:
        CASE WHEN ki_i.ka IS NULL THEN calpipe_kclip(q, ki_i.clip)
             ELSE calpipe_kclip(calpipe_kinput(calpipe_kclip(q, ki_i.clip), ki_i.ka, ki_i.kb,
                                               ki_i.eps), ki_i.clip)
        END);

-- Each Cox group's powers q_c^beta at its input's vector (qs: calpipe_kterm_inputs' list).
CREATE OR REPLACE MACRO calpipe_kterm_powers(g_in, g_b, qs) AS
    list_transform(list_zip(list_select(qs, g_in), g_b),
                   lambda kp_z: list_transform(kp_z[1], lambda kp_x: pow(kp_x, kp_z[2])));

-- Each Cox term's weight over its normaliser, w / sum_c q_c^beta e^{alpha_c}, by group (pws:
-- calpipe_kterm_powers' list).
CREATE OR REPLACE MACRO calpipe_kterm_scales(g_terms, pws) AS
    list_transform(list_zip(pws, g_terms), lambda ks_z:
        list_transform(ks_z[2], lambda ks_t: ks_t.w / list_dot_product(ks_z[1], ks_t.ea)));

-- A compiled K-class term layer's vector (the sum over its terms of weight * f, class by class):
-- a group's Cox terms add q_c^beta sum_t (w_t / S_t) e^{alpha_t,c} to class c (the terms'
-- q_c^beta e^{alpha_c} / S_t, S_t the term's normaliser, summed in another order: a few ulps
-- from it), the identity terms w q_c, the others w calpipe_kterm(...)_c.
CREATE OR REPLACE MACRO calpipe_kterms_value(c, qs, pws, scs) AS
    list_transform(range(1, len(qs[1]) + 1), lambda kv_c: list_sum([
        list_sum(list_transform(list_zip(pws, scs, c.g_ea), lambda kv_z:
            kv_z[1][kv_c] * list_dot_product(kv_z[2], kv_z[3][kv_c]))),
        list_sum(list_transform(list_zip(c.id_in, c.id_w),
                                lambda kv_d: kv_d[2] * qs[kv_d[1]][kv_c])),
        list_sum(list_transform(c.others, lambda kv_o:
            kv_o.w * calpipe_kterm(kv_o.family, kv_o.a, kv_o.b, kv_o.alphas, qs[kv_o.i])[kv_c]))
    ]));

-- The K-class set form (calibrate_scores_table): one layer of the maps in force evaluated at every
-- point of the relation named `points` (r, stream, layer, q: a point's key, its stream, the
-- layer, the score vector to evaluate it at) under the map rows of the relation named `maps`
-- (calibration_map's rows in force, layer NULL read as 0) and their term layers compiled, the
-- relation named `terms` (calpipe_kterm_layers of `maps`, once per query): (r, layer, v), v the
-- layer's vector, one row per point whose stream has rows in that layer. A layer of terms is
-- evaluated compiled (each input's vector once per point, the terms by dot products); each
-- other family as calpipe_klayer evaluates it for one score (the same macros): the coupled step
-- tables of the sub-problems (each sub-problem's piece by an ASOF join), the table of
-- categories, the partition tree (a recursive walk of every point at once), the Brier mode,
-- the terms' sum class by class of a layer mixing terms with them.
CREATE OR REPLACE MACRO calpipe_kpoints_layer(points, maps, terms) AS TABLE
    WITH RECURSIVE kq_pt AS (SELECT r, stream, layer, q FROM query_table(points)),
    -- a layer of terms compiled (calpipe_kterm_layers), the others' rows
    kq_compiled AS (SELECT * FROM query_table(terms)),
    kq_m AS (
        SELECT m.* FROM query_table(maps) m
        ANTI JOIN kq_compiled c ON c.stream = m.stream AND c.layer = m.layer
    ),
    -- (each input's vector, then each Cox group's powers and its terms' scales, computed once
    -- per point, as columns the next projection reads)
    kq_c_qs AS (
        SELECT pt.r, pt.layer, c, calpipe_kterm_inputs(c.inputs, pt.q) AS qs
        FROM kq_pt pt JOIN kq_compiled c ON c.stream = pt.stream AND c.layer = pt.layer
    ),
    kq_c_pws AS (
        SELECT r, layer, c, qs, calpipe_kterm_powers(c.g_in, c.g_b, qs) AS pws FROM kq_c_qs
    ),
    kq_c_scs AS (
        SELECT r, layer, c, qs, pws, calpipe_kterm_scales(c.g_terms, pws) AS scs FROM kq_c_pws
    ),
    kq_compiled_v AS (
        SELECT r, layer, calpipe_kterms_value(c, qs, pws, scs) AS v FROM kq_c_scs
    ),
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
        UNION ALL SELECT r, layer, v, 4 FROM kq_compiled_v
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
    -- (the rows numbered and their vectors checked, calpipe_q, as calibrate_table's)
    WITH calpipe_rows AS MATERIALIZED (
        SELECT calpipe_kscores(e.scores, k.n, calpipe_where_row('calibrate_scores_table',
                                                                e.calpipe_row, e.stream))
                   AS calpipe_q, e.*
        FROM (SELECT row_number() OVER () AS calpipe_row, * FROM query_table(tbl)) e,
             (SELECT max(n_classes) AS n FROM calibrator_state) k
    ),
    calpipe_maps AS (SELECT * FROM calpipe_maps_in_force('calpipe_rows', as_of)),
    calpipe_tops AS (SELECT stream, max(layer) AS top FROM calpipe_maps GROUP BY stream),
    calpipe_terms AS (SELECT * FROM calpipe_kterm_layers('calpipe_maps')),
    calpipe_p0 AS (
        SELECT e.calpipe_row AS r, t.stream, 0 AS layer, e.calpipe_q AS q
        FROM calpipe_rows e JOIN calpipe_tops t ON t.stream = CAST(e.stream AS VARCHAR)
        WHERE e.calpipe_q IS NOT NULL
    ),
    calpipe_v0 AS (
        SELECT r, v FROM calpipe_kpoints_layer('calpipe_p0', 'calpipe_maps', 'calpipe_terms')
    ),
    calpipe_p1 AS (
        SELECT pt.r, pt.stream, 1 AS layer, v.v AS q
        FROM calpipe_p0 pt JOIN calpipe_tops t ON t.stream = pt.stream AND t.top >= 1
        LEFT JOIN calpipe_v0 v ON v.r = pt.r
    ),
    calpipe_v1 AS (
        SELECT r, v FROM calpipe_kpoints_layer('calpipe_p1', 'calpipe_maps', 'calpipe_terms')
    ),
    calpipe_out AS (
        SELECT CASE WHEN e.calpipe_q IS NULL THEN NULL WHEN t.top >= 1 THEN v1.v ELSE v0.v END
                   AS calpipe_value,
               e.*
        FROM calpipe_rows e
        LEFT JOIN calpipe_tops t ON t.stream = CAST(e.stream AS VARCHAR)
        LEFT JOIN calpipe_v0 v0 ON v0.r = e.calpipe_row
        LEFT JOIN calpipe_v1 v1 ON v1.r = e.calpipe_row
    )
    -- (the table's own protected_scores is replaced, as calibrate_table's protected_score)
    SELECT COLUMNS(lambda col_name: lower(col_name) NOT IN ('calpipe_row', 'calpipe_q',
                                                           'calpipe_value', 'protected_scores')),
           calpipe_value AS protected_scores
    FROM calpipe_out ORDER BY calpipe_row;

-- The same under each stream's latest map.
--   SELECT * FROM calibrate_scores_table('fresh_scores');
CREATE OR REPLACE MACRO calibrate_scores_table(tbl) AS TABLE
    SELECT * FROM calibrate_scores_table_as_of(tbl, DATE '9999-12-31');
