-- Serving-map macros 04 (sql/macros/, installed in name order: calpipe.storage.schema.SQL_LAYOUT),
-- the Brier compatibility mode's forecast (families brier, brier_cox), binary and K-class. Uses
-- calpipe_kterm (02).

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
