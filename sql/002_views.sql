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

-- Performance estimated from the forecasts (performance_estimates) beside the performance
-- realized on the labels known now: the label in the event's row or the one the label feed
-- brought later (event_labels), so the realized columns fill in as labels arrive, night after
-- night; `labelled` counts them. A realized value inside [low, high] is what calibrated forecasts
-- give on 90 % of nights; a base estimate far from its realized value is a miscalibrated base.
CREATE OR REPLACE VIEW v_performance_estimates AS
WITH judged AS (  -- each labelled event, once per forecast (who: protected 'p', base 'b')
    SELECT p.event_date AS date, p.stream, p.event_id, f.who, f.q, f.v,
           coalesce(p.label, l.label) AS y
    FROM protected_scores p
    LEFT JOIN event_labels l
           ON l.event_date = p.event_date AND l.stream = p.stream AND l.event_id = p.event_id,
    LATERAL (VALUES ('p', p.protected_score, p.protected_scores),
                    ('b', p.base_score, p.base_scores)) AS f(who, q, v)
    WHERE coalesce(p.label, l.label) IS NOT NULL
), losses AS (  -- calpipe.metrics' losses (log loss floored at 1e-15; K classes: the vectors)
    SELECT date, stream, event_id, who,
           -ln(greatest(CASE WHEN v IS NULL THEN (CASE y WHEN 1 THEN q ELSE 1 - q END)
                             ELSE v[y + 1] END, 1e-15)) AS log_loss,
           CASE WHEN v IS NULL THEN (q - y) ^ 2
                ELSE list_sum(list_transform(v, lambda c, i: (c - (i = y + 1)::INT) ^ 2)) END
               AS brier,
           CASE WHEN v IS NULL THEN ((q >= 0.5)::INT = y)::INT
                ELSE (list_position(v, list_max(v)) - 1 = y)::INT END AS accuracy
    FROM judged
), realized AS (  -- sums in event id order: the same bits whatever DuckDB's threads do
    SELECT date, stream,
           count(*) FILTER (WHERE who = 'p') AS labelled,
           avg(log_loss ORDER BY event_id) FILTER (WHERE who = 'p') AS realized_log_loss,
           avg(brier ORDER BY event_id) FILTER (WHERE who = 'p') AS realized_brier,
           avg(accuracy ORDER BY event_id) FILTER (WHERE who = 'p') AS realized_accuracy,
           avg(log_loss ORDER BY event_id) FILTER (WHERE who = 'b') AS base_realized_log_loss,
           avg(brier ORDER BY event_id) FILTER (WHERE who = 'b') AS base_realized_brier,
           avg(accuracy ORDER BY event_id) FILTER (WHERE who = 'b') AS base_realized_accuracy
    FROM losses
    GROUP BY date, stream
)
SELECT
    e.*,
    coalesce(r.labelled, 0) AS labelled,
    r.realized_log_loss, r.realized_brier, r.realized_accuracy,
    r.base_realized_log_loss, r.base_realized_brier, r.base_realized_accuracy,
    r.realized_log_loss BETWEEN e.expected_log_loss_low AND e.expected_log_loss_high
        AS log_loss_within,
    r.base_realized_log_loss BETWEEN e.base_expected_log_loss_low AND e.base_expected_log_loss_high
        AS base_log_loss_within
FROM performance_estimates e
LEFT JOIN realized r USING (date, stream);

-- Change points (calpipe/night/changes.py), one row each, in order per stream: how long after
-- its estimated start each change was detected, and what it was tested against (the base until
-- the stream's first change point, then the protected map served after the last one).
CREATE OR REPLACE VIEW v_change_points AS
SELECT
    stream,
    change_number,
    estimated_change_date,
    detected_date,
    date_diff('day', estimated_change_date, detected_date) AS days_to_detect,
    CASE WHEN reference_date IS NULL THEN 'base'
         ELSE 'map of ' || strftime(reference_date, '%Y-%m-%d') END AS tested_against,
    log10_statistic,
    threshold,
    labels_in_run,
    estimated_change_time,
    detected_time,
    detected_event_id
FROM change_points;
