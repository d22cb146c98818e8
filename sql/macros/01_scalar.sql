-- Serving-map macros (docs/ARCHITECTURE.md §4): sql/macros/, installed after the tables,
-- migrations and views, file by file in name order (calpipe.storage.schema.SQL_LAYOUT); a file
-- uses only the macros of the files before it and its own, each defined before its use.
-- They apply a stored serving map to fresh scores in plain SQL: they evaluate the map's terms
-- (calibrating functions, logistic and temperature maps) and its step/linear tables exactly,
-- so they equal calpipe's polars serving map (calpipe.pipeline.serving_map) to rounding
-- (tests/pipeline/test_mapping.py: 1e-12).
--
-- 01, scalar helpers of one binary score, for every later file: the engine's clip, a score
-- checked as the maps read it, the logistic function, an equal-width bin, and the refusal of a
-- binary form on a K-class database.

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

-- Equal-width bin of q among n of [0, 1], as the calibeating kernel computes it.
CREATE OR REPLACE MACRO calpipe_bin(q, n) AS least(CAST(floor(q * n) AS INTEGER), CAST(n AS INTEGER) - 1);
