-- Serving-map macros 02 (sql/macros/, installed in name order: calpipe.storage.schema.SQL_LAYOUT),
-- one term of a map (a row of calibration_map): its calibrating function f and its input map q,
-- binary (calpipe_term, calpipe_input, calpipe_map_term) and K-class (calpipe_kterm,
-- calpipe_kinput, with the vector clip and softmax they use); a piece of a step/linear table
-- (calpipe_piece). Uses 01.

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

-- A K-class term's input q(p): p itself (ka NULL), vector scaling (online vector scaling, an
-- input of composite-experts or ops itself; ka and kb of K values): softmax(ka[c] ln
-- kclip(p, eps)[c] + kb[c]), or matrix scaling (online matrix scaling, oms; ka the K^2 entries
-- of W row by row, kb the K intercepts): softmax(sum_j W[c, j] ln kclip(p, eps)[j] + kb[c]),
-- the sum over j in order then kb[c] added, as the kernel's _matrix_forecast.
CREATE OR REPLACE MACRO calpipe_kinput(p, ka, kb, eps) AS
    CASE WHEN ka IS NULL THEN p
         WHEN len(ka) = len(kb)
         THEN calpipe_softmax(list_transform(calpipe_kclip(p, eps),
                                             lambda x, i: ka[i] * ln(x) + kb[i]))
         ELSE calpipe_softmax(list_transform(
                  [list_transform(calpipe_kclip(p, eps), lambda km_x: ln(km_x))],
                  lambda km_l: list_transform(kb, lambda km_b, km_c:
                      list_sum(list_transform(km_l, lambda km_v, km_j:
                          ka[(km_c - 1) * len(kb) + km_j] * km_v)) + km_b))[1])
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
