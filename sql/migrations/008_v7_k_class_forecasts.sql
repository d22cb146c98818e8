-- Migration 008, schema version 7: K-class forecasts. A database stores binary forecasts (score)
-- or K-class ones (the scores vectors), set by its first events (calpipe/pipeline/classes.py);
-- the binary columns become nullable (NULL in a K-class database). Why: databases from before
-- K-class forecasts were stored lack the vectors and refuse a NULL score.
ALTER TABLE scored_events ADD COLUMN IF NOT EXISTS scores DOUBLE[];
ALTER TABLE scored_events ALTER score DROP NOT NULL;
ALTER TABLE protected_scores ADD COLUMN IF NOT EXISTS base_scores DOUBLE[];
ALTER TABLE protected_scores ADD COLUMN IF NOT EXISTS protected_scores DOUBLE[];
ALTER TABLE protected_scores ALTER base_score DROP NOT NULL;
ALTER TABLE protected_scores ALTER protected_score DROP NOT NULL;
ALTER TABLE event_labels ADD COLUMN IF NOT EXISTS scores DOUBLE[];
ALTER TABLE event_labels ALTER score DROP NOT NULL;
