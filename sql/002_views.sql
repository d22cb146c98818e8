-- Views for analysts. Installed by calpipe.store.connect() (CREATE OR REPLACE).

-- Protected scores with their events' inputs, the day's method and configuration, and the
-- improvement of the protected forecast over the base one: one row per protected_scores row.
CREATE OR REPLACE VIEW v_protected_scores AS
SELECT
    p.event_date, p.stream, p.event_id, e.event_time, e.score, p.base_score, p.label,
    p.protected_score,
    p.protected_score - p.base_score AS adjustment,
    p.log10_martingale,
    p.log10_martingale >= 2 AS at_alarm_level,
    d.method, d.config_fingerprint,
    p.p_lower, p.p_upper,
    e.scores, p.base_scores, p.protected_scores          -- K classes (the binary columns NULL)
FROM protected_scores p
LEFT JOIN scored_events e
       ON e.event_date = p.event_date AND e.stream = p.stream AND e.event_id = p.event_id
LEFT JOIN pipeline_days d ON d.date = p.event_date;

-- Daily monitoring with the gains of protection (positive = protection helped).
CREATE OR REPLACE VIEW v_calibration_daily AS
SELECT
    *,
    base_log_loss - protected_log_loss AS log_loss_gain,
    base_brier - protected_brier       AS brier_gain,
    mean_score - mean_label            AS score_bias
FROM calibration_daily;

-- One row per stream that ever crossed the alarm level, with the day it was first crossed,
-- the events before it, and where the martingale stands now.
CREATE OR REPLACE VIEW v_alarms AS
WITH latest AS (
    SELECT stream, log10_martingale, log10_martingale_max, date
    FROM calibrator_state
    QUALIFY row_number() OVER (PARTITION BY stream ORDER BY date DESC) = 1
)
SELECT
    a.stream,
    a.date                  AS alarm_date,
    a.event_time            AS alarm_event_time,
    a.event_id              AS alarm_event_id,
    a.log10_martingale      AS log10_martingale_at_alarm,
    power(10, a.log10_martingale) AS martingale_at_alarm,
    l.date                  AS latest_date,
    l.log10_martingale      AS log10_martingale_latest,
    l.log10_martingale_max  AS log10_martingale_max
FROM martingale_alarms a
LEFT JOIN latest l USING (stream);

-- The latest serving map of each stream (the terms of its most recent day).
CREATE OR REPLACE VIEW v_latest_calibration_map AS
SELECT m.*
FROM calibration_map m
JOIN (SELECT stream, max(date) AS date FROM calibration_map GROUP BY stream) l
  USING (stream, date);
