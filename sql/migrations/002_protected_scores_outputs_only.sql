-- Migration 002 (before schema versions were recorded): protected_scores holds only the engine's
-- outputs. Why: writing the event's inputs and the day's method again cost more than the
-- protection itself; a database created before loses the copied inputs (the view
-- v_protected_scores still shows them, joined from scored_events and pipeline_days).
ALTER TABLE protected_scores DROP COLUMN IF EXISTS event_time;
ALTER TABLE protected_scores DROP COLUMN IF EXISTS score;
ALTER TABLE protected_scores DROP COLUMN IF EXISTS method;
ALTER TABLE protected_scores DROP COLUMN IF EXISTS config_fingerprint;
