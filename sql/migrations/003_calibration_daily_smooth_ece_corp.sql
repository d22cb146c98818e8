-- Migration 003 (before schema versions were recorded): calibration_daily gains the smooth ECE
-- and the CORP decomposition of each loss. Why: a database created before them lacks the
-- columns; they are NULL on the days written before: re-materialize those calibration_daily
-- partitions in dagster (the stage reads the stored scores) or re-run
-- `calpipe run --start .. --end ..` over them to fill them.
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS base_smooth_ece DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS protected_smooth_ece DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS base_log_loss_mcb DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS base_log_loss_dsc DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS protected_log_loss_mcb DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS protected_log_loss_dsc DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS log_loss_unc DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS base_brier_mcb DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS base_brier_dsc DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS protected_brier_mcb DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS protected_brier_dsc DOUBLE;
ALTER TABLE calibration_daily ADD COLUMN IF NOT EXISTS brier_unc DOUBLE;
