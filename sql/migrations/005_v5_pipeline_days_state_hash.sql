-- Migration 005, schema version 5: pipeline_days records a hash chain of the state
-- (calpipe/pipeline/inputs.py), so that corrected, late and stale days are replayed:
-- state_hash = SHA-256 of the previous day's state_hash and the day's calibrator_state rows;
-- prev_state_hash = the state_hash the day started from. Day d is stale if its prev_state_hash
-- is not d - 1's state_hash any more (NULL: computed before calpipe recorded it). A new database
-- gets the columns here too (sql/001_tables.sql does not create them).
-- It runs before 006 (version 4), as the statements stood in sql/001_tables.sql: a database
-- older than version 4 gains state_hash and prev_state_hash before n_state_rows, as it always
-- did (calpipe writes by column name, so only the order of its columns differs from a new one).
ALTER TABLE pipeline_days ADD COLUMN IF NOT EXISTS state_hash VARCHAR;
ALTER TABLE pipeline_days ADD COLUMN IF NOT EXISTS prev_state_hash VARCHAR;
