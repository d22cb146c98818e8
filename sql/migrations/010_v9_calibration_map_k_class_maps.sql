-- Migration 010, schema version 9: K-class maps in calibration_map (calibrate_scores). A Cox
-- term's class shifts alpha (family cox: f_c(q) = q_c^b e^{alphas[c]} / sum_j q_j^b e^{alphas[j]})
-- and a term's vector scaling input q = softmax(in_ka[c] ln c_c(p) + in_kb[c]), c = p floored at
-- in_eps and renormalised (NULL: p). A new database gets the columns here too.
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS alphas DOUBLE[];
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_ka DOUBLE[];
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_kb DOUBLE[];
