-- Migration 013, schema version 11: a composite-experts input whose map is a table of its own
-- (isotonic, ROC-isotonic, histogram, Venn, Venn-ABERS): its rows are layer -(j + 1) (the j-th
-- such input, from 0), evaluated at the clipped score (clip = the method's); a term reading one
-- has in_layer = that layer: q = the table's value, then clipped to [clip, 1 - clip]. A new
-- database gets the column here too.
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_layer INTEGER;
