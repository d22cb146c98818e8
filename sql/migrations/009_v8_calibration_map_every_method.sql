-- Migration 009, schema version 8: every method's map in calibration_map: the layer of a stack
-- and the pieces of step and linear tables (x, y_at, y_right, x_next, y_next; their meaning:
-- sql/001_tables.sql). Why: a database of version <= 7 lacks them (sql/001_tables.sql creates
-- them in a new database).
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS layer INTEGER DEFAULT 0;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS x DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS y_at DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS y_right DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS x_next DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS y_next DOUBLE;
