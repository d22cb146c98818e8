-- Migration 012, schema version 10 (added within it, after 011): a K-class partition tree in
-- calibration_map (ROC-isotonic): family ksplit, node term, its thresholds gamma in y_k and its
-- children's node ids in kids (p goes to child argmax_c (p_c - gamma_c)); family kleaf, node
-- term, its forecast in y_k. A new database gets the column here too.
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS kids DOUBLE[];
