-- Migration 007, schema version 6: the label feed (event_labels, quarantined_labels and
-- calibration_arrivals are created by sql/001_tables.sql); pipeline_days counts the labels that
-- arrived on each day (the feed's rows of the day, event_labels). A new database gets the column
-- here too; a day written before the feed existed had none (0).
ALTER TABLE pipeline_days ADD COLUMN IF NOT EXISTS n_label_arrivals BIGINT;
UPDATE pipeline_days SET n_label_arrivals = 0 WHERE n_label_arrivals IS NULL;
