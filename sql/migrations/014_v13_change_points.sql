-- Migration 014, schema version 13: the change detector's state (calpipe/night/changes.py),
-- carried beside the calibrator's in each stream's state row. NULL (an older database's rows, and
-- a stream whose detector has not started): statistic 0, no run, no change point, the base as
-- reference, nothing to learn before a map is frozen. A new database gets the columns here too.
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_log10_cusum DOUBLE;
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_run_start TIMESTAMP;
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_run_labels BIGINT;
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_count INTEGER;
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_settle_labels BIGINT;
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_reference_date DATE;
ALTER TABLE calibrator_state ADD COLUMN IF NOT EXISTS change_reference DOUBLE[];
