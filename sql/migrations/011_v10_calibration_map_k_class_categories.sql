-- Migration 011, schema version 10: a K-class category's forecast in calibration_map (family
-- kcat: the Venn taxonomy of the predicted class x confidence bin, term = the category, whose
-- bins are the family kedge rows' x); the map of p is the y_k of p's category. A new database
-- gets the column here too.
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS y_k DOUBLE[];
