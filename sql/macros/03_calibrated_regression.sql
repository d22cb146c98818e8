-- Serving-map macros 03 (sql/macros/, installed in name order: calpipe.storage.schema.SQL_LAYOUT),
-- calibrated regression's forecast: family calreg (its closed form) and family calreg_fp (the
-- fixed point, found by a scan and a bisection). Self-contained.

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
