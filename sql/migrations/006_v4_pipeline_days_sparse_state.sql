-- Migration 006, schema version 4: calibrator_state and calibration_map hold only the rows of
-- the streams whose state changed that day, and pipeline_days counts them (n_state_rows). Why:
-- a database from before the state was stored sparsely (schema version < 4) lacks the column
-- and holds a row for every stream on every day: its days' state row counts are their stream
-- counts. (Applied after 005: see there.)
ALTER TABLE pipeline_days ADD COLUMN IF NOT EXISTS n_state_rows INTEGER;
UPDATE pipeline_days SET n_state_rows = n_streams WHERE n_state_rows IS NULL;
