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

-- The logistic function, without overflow for large |z|.
CREATE OR REPLACE MACRO calpipe_sigmoid(z) AS
    CASE WHEN z >= 0 THEN 1 / (1 + exp(-z)) ELSE exp(z) / (1 + exp(z)) END;

-- A term's input q(p): p itself (w1 NULL), or the logistic map of a composite-experts input
-- (online Platt/beta scaling, a windowed Platt/beta fit): sigmoid(w1 ln c - w2 ln(1 - c) + w0).
CREATE OR REPLACE MACRO calpipe_input(p, w1, w2, w0, eps) AS
    CASE WHEN w1 IS NULL THEN p
         ELSE calpipe_sigmoid(w1 * ln(calpipe_clip(p, eps)) - w2 * ln(1 - calpipe_clip(p, eps)) + w0)
    END;

-- One term of a map row `m` evaluated at score p: f(clip(q(clip(p)))).
CREATE OR REPLACE MACRO calpipe_map_term(family, a, b, clip, w1, w2, w0, eps, p) AS
    calpipe_term(family, a, b,
                 calpipe_clip(calpipe_input(calpipe_clip(p, clip), w1, w2, w0, eps), clip));

-- Protected probability of `score` under the latest map of stream `s` (NULL: no map yet).
--   SELECT calibrate_score('bank-telemarketing', 0.3);
CREATE OR REPLACE MACRO calibrate_score(s, score) AS (
    SELECT sum(m.weight * calpipe_map_term(m.family, m.a, m.b, m.clip, m.in_w1, m.in_w2, m.in_w0, m.in_eps, score))
    FROM v_latest_calibration_map m
    WHERE m.stream = s
);

-- The same under the map in force at the end of day `as_of` (the latest map on or before it).
CREATE OR REPLACE MACRO calibrate_score_as_of(s, score, as_of) AS (
    SELECT sum(m.weight * calpipe_map_term(m.family, m.a, m.b, m.clip, m.in_w1, m.in_w2, m.in_w0, m.in_eps, score))
    FROM calibration_map m
    WHERE m.stream = s
      AND m.date = (SELECT max(date) FROM calibration_map
                    WHERE stream = s AND date <= CAST(as_of AS DATE))
);

-- The latest map of stream `s` tabulated on n + 1 equally spaced points of [0, 1] (for plots).
--   SELECT * FROM calibration_curve('bank-telemarketing', 10);
CREATE OR REPLACE MACRO calibration_curve(s, n) AS TABLE
    SELECT g.i / n AS p,
           sum(m.weight * calpipe_map_term(m.family, m.a, m.b, m.clip, m.in_w1, m.in_w2, m.in_w0,
                                          m.in_eps, g.i / n)) AS protected_p
    FROM range(0, n + 1) AS g(i), v_latest_calibration_map m
    WHERE m.stream = s
    GROUP BY g.i
    ORDER BY g.i;
