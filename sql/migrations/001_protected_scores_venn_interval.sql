-- Migration 001 (before schema versions were recorded: a version-1 database may lack it):
-- protected_scores gains the Venn methods' multiprobability [p_lower, p_upper], NULL for the
-- other methods. Why: the Venn methods came after the first databases were written; a database
-- created before them gains the interval columns. (Every migration runs on every install, after
-- sql/001_tables.sql and before the views, in number order: calpipe.storage.schema.SQL_LAYOUT.)
ALTER TABLE protected_scores ADD COLUMN IF NOT EXISTS p_lower DOUBLE;
ALTER TABLE protected_scores ADD COLUMN IF NOT EXISTS p_upper DOUBLE;
