-- Macros that apply a stored serving map to fresh scores in plain SQL (docs/ARCHITECTURE.md §4).
-- They evaluate the calibrating functions exactly, so they equal calpipe's polars serving map
-- (calpipe.pipeline.serving_map) to rounding.

-- The clip of the engine's log-loss mode: p -> min(max(p, eps), 1 - eps).
CREATE OR REPLACE MACRO calpipe_clip(p, eps) AS
    least(greatest(CAST(p AS DOUBLE), CAST(eps AS DOUBLE)), 1 - CAST(eps AS DOUBLE));

-- One calibrating function f(p) of a map term.
CREATE OR REPLACE MACRO calpipe_term(family, a, b, p) AS
    CASE family
        WHEN 'identity'  THEN p
        WHEN 'quadratic' THEN p + a * p * (1 - p)
        WHEN 'cubic'     THEN p + a * p * (p - b) * (p - 1)
        WHEN 'cox'       THEN exp(a) * pow(p, b) / (exp(a) * pow(p, b) + pow(1 - p, b))
    END;

-- Protected probability of `score` under the latest map of stream `s` (NULL: no map yet).
--   SELECT calibrate_score('bank-telemarketing', 0.3);
CREATE OR REPLACE MACRO calibrate_score(s, score) AS (
    SELECT sum(m.weight * calpipe_term(m.family, m.a, m.b, calpipe_clip(score, m.clip)))
    FROM v_latest_calibration_map m
    WHERE m.stream = s
);

-- The same under the map in force at the end of day `as_of` (the latest map on or before it).
CREATE OR REPLACE MACRO calibrate_score_as_of(s, score, as_of) AS (
    SELECT sum(m.weight * calpipe_term(m.family, m.a, m.b, calpipe_clip(score, m.clip)))
    FROM calibration_map m
    WHERE m.stream = s
      AND m.date = (SELECT max(date) FROM calibration_map
                    WHERE stream = s AND date <= CAST(as_of AS DATE))
);

-- The latest map of stream `s` tabulated on n + 1 equally spaced points of [0, 1] (for plots).
--   SELECT * FROM calibration_curve('bank-telemarketing', 10);
CREATE OR REPLACE MACRO calibration_curve(s, n) AS TABLE
    SELECT g.i / n AS p,
           sum(m.weight * calpipe_term(m.family, m.a, m.b, calpipe_clip(g.i / n, m.clip))) AS protected_p
    FROM range(0, n + 1) AS g(i), v_latest_calibration_map m
    WHERE m.stream = s
    GROUP BY g.i
    ORDER BY g.i;
