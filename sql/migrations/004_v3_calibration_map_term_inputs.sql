-- Migration 004, schema version 3: a calibration_map term carries its input's logistic map
-- (composite-experts), in_w1, in_w2, in_w0, in_eps (their meaning: sql/001_tables.sql). Why: a
-- database of version <= 2 lacks them (sql/001_tables.sql creates them in a new database).
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_w1 DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_w2 DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_w0 DOUBLE;
ALTER TABLE calibration_map ADD COLUMN IF NOT EXISTS in_eps DOUBLE;
