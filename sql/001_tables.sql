-- calpipe tables (docs/ARCHITECTURE.md §3, §5). Installed by calpipe.storage.connect() (the
-- order of sql/'s files: calpipe.storage.schema.SQL_LAYOUT); every statement is idempotent.
-- A table is created here with the columns it had when it came; each later change of its layout
-- is a numbered file of sql/migrations/, applied after this file on every install, to a new
-- database as to an old one (the comment after each table names its migrations). No primary keys: uniqueness is validated by calpipe before a write, and DuckDB's
-- constraint checks would only slow the DELETE + INSERT of a partition replace down.
-- Every table is partitioned by a DATE column (event_date or date); calpipe replaces partitions
-- in one transaction (BEGIN; DELETE ...; INSERT ...; COMMIT).

-- Scored events as loaded from the landing folder or table: one row per base forecast.
CREATE TABLE IF NOT EXISTS scored_events (
    event_date        DATE      NOT NULL,  -- partition: CAST(event_time AS DATE)
    stream            VARCHAR   NOT NULL,  -- independent calibration stream
    event_id          BIGINT    NOT NULL,  -- unique within a stream
    event_time        TIMESTAMP NOT NULL,  -- replay order is (event_time, event_id)
    score             DOUBLE,              -- base probability of label 1 (binary)
    label             INTEGER,             -- 0/1 (0..K-1); NULL = not known (forecast, no update)
    scores            DOUBLE[]             -- K classes: the base probabilities (score NULL)
);
-- A database stores binary forecasts (score) or K-class ones (scores), set by its first events
-- (calpipe/pipeline/classes.py). Migrations: 008 (scores, score nullable).

-- Protected scores: the outputs of the engine per scored event, keyed like scored_events by
-- (event_date, stream, event_id). The event's other inputs (event_time, score) and the day's
-- method and config fingerprint are not copied here (writing them again cost more than the
-- protection itself): the view v_protected_scores joins them back from scored_events and
-- pipeline_days. The martingale bets against base_score (score clipped to [eps, 1 - eps] in
-- log-loss mode, or a stack's base-method forecast), so base metrics are computed on base_score;
-- label is kept for the monitoring metrics.
CREATE TABLE IF NOT EXISTS protected_scores (
    event_date         DATE      NOT NULL,
    stream             VARCHAR   NOT NULL,
    event_id           BIGINT    NOT NULL,  -- with stream and event_date: the scored event
    base_score         DOUBLE,              -- the base as the engine used it (clipped in log loss)
    label              INTEGER,
    protected_score    DOUBLE,
    log10_martingale   DOUBLE    NOT NULL,  -- the stream's running log10 test martingale after it
    p_lower            DOUBLE,              -- Venn methods: the multiprobability [p_lower, p_upper]
    p_upper            DOUBLE,
    base_scores        DOUBLE[],            -- K classes: base_score and protected_score as
    protected_scores   DOUBLE[]             -- vectors (the binary columns NULL)
);
-- Migrations: 001 (p_lower, p_upper), 002 (the copied inputs dropped), 008 (base_scores,
-- protected_scores; base_score and protected_score nullable).

-- Calibrator state at the END of `date` of the streams whose state changed that day (those with
-- events). A stream's state at the end of day d is its latest row on or before d (idle streams
-- keep theirs and cost no rows); day d is computed from the state at the end of day d - 1.
CREATE TABLE IF NOT EXISTS calibrator_state (
    date                 DATE      NOT NULL,
    stream               VARCHAR   NOT NULL,
    method               VARCHAR   NOT NULL,
    config_fingerprint   VARCHAR   NOT NULL,
    n_classes            INTEGER   NOT NULL,
    n_events             BIGINT    NOT NULL,
    n_labelled           BIGINT    NOT NULL,
    last_event_time      TIMESTAMP,
    last_event_id        BIGINT,
    log10_martingale     DOUBLE    NOT NULL,
    log10_martingale_max DOUBLE    NOT NULL,
    weights              DOUBLE[]  NOT NULL,  -- the method's state vector (protected: [P, A])
    pending_label_time   TIMESTAMP[],
    pending_scores       DOUBLE[],
    pending_labels       BIGINT[]
);

-- The chain: one row per day whose state was written (also days without events), so that a
-- missing day d - 1 is told apart from a day on which no stream existed yet.
CREATE TABLE IF NOT EXISTS pipeline_days (
    date               DATE    NOT NULL,
    first_day          DATE    NOT NULL,  -- the first day of the chain (state starts empty)
    method             VARCHAR NOT NULL,
    config_fingerprint VARCHAR NOT NULL,
    config_json        VARCHAR NOT NULL,
    n_events           BIGINT  NOT NULL,
    n_streams          INTEGER NOT NULL,  -- streams in the state at the end of the day
    n_active_streams   INTEGER NOT NULL,  -- streams with events that day
    n_state_rows       INTEGER NOT NULL   -- calibrator_state rows of the day (changed streams)
);
-- Migrations: 005 (state_hash, prev_state_hash: the hash chain of the state), 006 (n_state_rows
-- of an older database), 007 (n_label_arrivals).

-- What each day was computed from (calpipe/pipeline/inputs.py): one row per landing file of the
-- day (path relative to the landing folder, size, modification time, SHA-256 of its bytes, rows
-- in its Parquet footer), or for a table or Parquet glob source one row per day (file '', its
-- row count and an order-independent hash of its rows). `calpipe run` replays from the first
-- stored day whose inputs differ from the source's.
CREATE TABLE IF NOT EXISTS pipeline_inputs (
    date          DATE    NOT NULL,
    kind          VARCHAR NOT NULL,  -- 'scores' or 'labels'
    file          VARCHAR NOT NULL,
    size_bytes    BIGINT,
    mtime_ns      BIGINT,
    content_hash  VARCHAR NOT NULL,
    n_rows        BIGINT  NOT NULL
);

-- The label feed (calpipe/pipeline/labels.py): labels that arrive after their events, one row per
-- label, partitioned by its arrival day `date` (the date of label_time; the landing folder's
-- date=). The event's base score and time are copied from scored_events (the night that learns
-- the label reads only its own partitions). Night d forecasts with the labels known before each
-- event and learns each label at its label_time.
CREATE TABLE IF NOT EXISTS event_labels (
    date          DATE      NOT NULL,  -- arrival day: CAST(label_time AS DATE)
    stream        VARCHAR   NOT NULL,
    event_id      BIGINT    NOT NULL,  -- with stream: an event of scored_events
    event_date    DATE      NOT NULL,  -- the event's day (<= date)
    event_time    TIMESTAMP NOT NULL,
    score         DOUBLE,              -- the event's base score (binary)
    label         INTEGER   NOT NULL,
    label_time    TIMESTAMP NOT NULL,  -- >= event_time
    file          VARCHAR   NOT NULL,  -- the landing file (relative path), or the table
    scores        DOUBLE[]             -- K classes: the event's base scores (score NULL)
);
-- Migrations: 008 (scores, score nullable).

-- Labels of the feed for events calpipe does not know, parked by `--on-unknown-label quarantine`
-- instead of failing the night (a later landing of their events replays them).
CREATE TABLE IF NOT EXISTS quarantined_labels (
    date          DATE      NOT NULL,  -- arrival day
    stream        VARCHAR   NOT NULL,
    event_id      BIGINT    NOT NULL,
    label         INTEGER,
    label_time    TIMESTAMP NOT NULL,
    file          VARCHAR   NOT NULL,
    reason        VARCHAR   NOT NULL
);

-- Monitoring by arrival: per stream and night, the forecasts whose labels were learnt that night
-- (the labels of the night's scores rows, known at their events, and the feed's arrivals of the
-- night), judged by those labels: the forecasts made at their events, however old. The alarm
-- tests, in the order labels are learnt, that each label follows its base forecast given the
-- labels learnt before it (docs/ARCHITECTURE.md §4).
CREATE TABLE IF NOT EXISTS calibration_arrivals (
    date                  DATE    NOT NULL,  -- the night the labels were learnt (arrival day)
    stream                VARCHAR NOT NULL,
    n_labels              BIGINT  NOT NULL,
    base_log_loss         DOUBLE,
    protected_log_loss    DOUBLE,
    base_brier            DOUBLE,
    protected_brier       DOUBLE,
    base_ece              DOUBLE,
    protected_ece         DOUBLE,
    base_smooth_ece       DOUBLE,
    protected_smooth_ece  DOUBLE,
    mean_delay_s          DOUBLE,  -- label_time - event_time (0: known at the event)
    max_delay_s           DOUBLE,
    log10_martingale      DOUBLE,  -- the stream's test martingale at the end of the night
    log10_martingale_max  DOUBLE,  -- its maximum to date
    alarm                 BOOLEAN  -- log10_martingale_max >= 2
);

-- Monitoring per stream and day (streams with events that day).
CREATE TABLE IF NOT EXISTS calibration_daily (
    date                         DATE    NOT NULL,
    stream                       VARCHAR NOT NULL,
    n_events                     BIGINT  NOT NULL,
    n_labelled                   BIGINT  NOT NULL,
    base_log_loss                DOUBLE,  -- mean natural log loss over labelled events
    protected_log_loss           DOUBLE,
    base_brier                   DOUBLE,
    protected_brier              DOUBLE,
    base_ece                     DOUBLE,  -- 10 equal-width bins
    protected_ece                DOUBLE,
    base_smooth_ece              DOUBLE,  -- Blasiok & Nakkiran 2024, bandwidth by fixed point
    protected_smooth_ece         DOUBLE,
    -- CORP decomposition (Dimitriadis, Gneiting & Jordan 2021) of each mean loss over labelled
    -- events: loss = mcb - dsc + unc (miscalibration, discrimination, uncertainty), from the
    -- PAV recalibration of the forecasts; unc depends on the labels only. K classes: the Brier
    -- columns sum the one-vs-rest decompositions of the classes; the log loss's are NULL.
    base_log_loss_mcb            DOUBLE,
    base_log_loss_dsc            DOUBLE,
    protected_log_loss_mcb       DOUBLE,
    protected_log_loss_dsc       DOUBLE,
    log_loss_unc                 DOUBLE,
    base_brier_mcb               DOUBLE,
    base_brier_dsc               DOUBLE,
    protected_brier_mcb          DOUBLE,
    protected_brier_dsc          DOUBLE,
    brier_unc                    DOUBLE,
    mean_score                   DOUBLE,  -- over all events of the day
    mean_protected               DOUBLE,
    mean_label                   DOUBLE,  -- over labelled events
    log10_martingale             DOUBLE  NOT NULL,  -- end of day
    log10_martingale_max         DOUBLE  NOT NULL,  -- maximum within the day
    log10_martingale_max_to_date DOUBLE  NOT NULL,  -- maximum since the stream began
    alarm                        BOOLEAN NOT NULL   -- log10_martingale_max >= 2 (S >= 100) that day
);
-- Migrations: 003 (the smooth ECE and CORP columns of an older database).

-- Performance per stream and night estimated from the forecasts alone, before any label
-- (issue #35; calpipe/estimates.py, calpipe/night/performance.py): the mean log loss, Brier
-- score and accuracy the night's forecasts would have if they were calibrated (each label drawn
-- from its forecast), with a 90 % normal interval (NULL below 20 events), for the protected
-- forecasts and for the base's (base_*). Only what the night knows: the realized values, which
-- later labels fill in, are the view v_performance_estimates.
CREATE TABLE IF NOT EXISTS performance_estimates (
    date                        DATE    NOT NULL,  -- the night of the forecasts
    stream                      VARCHAR NOT NULL,
    events                      BIGINT  NOT NULL,
    expected_log_loss           DOUBLE,  -- mean natural log loss (probabilities floored at 1e-15)
    expected_log_loss_low       DOUBLE,
    expected_log_loss_high      DOUBLE,
    expected_brier              DOUBLE,  -- K classes: the multiclass Brier score
    expected_brier_low          DOUBLE,
    expected_brier_high         DOUBLE,
    expected_accuracy           DOUBLE,  -- the top class (binary: p >= 0.5 guesses 1)
    expected_accuracy_low       DOUBLE,
    expected_accuracy_high      DOUBLE,
    base_expected_log_loss      DOUBLE,
    base_expected_log_loss_low  DOUBLE,
    base_expected_log_loss_high DOUBLE,
    base_expected_brier         DOUBLE,
    base_expected_brier_low     DOUBLE,
    base_expected_brier_high    DOUBLE,
    base_expected_accuracy      DOUBLE,
    base_expected_accuracy_low  DOUBLE,
    base_expected_accuracy_high DOUBLE
);

-- First crossing of log10 S >= threshold per stream: the row sits in the partition of its date.
CREATE TABLE IF NOT EXISTS martingale_alarms (
    date             DATE      NOT NULL,
    stream           VARCHAR   NOT NULL,
    event_time       TIMESTAMP NOT NULL,
    event_id         BIGINT    NOT NULL,
    log10_martingale DOUBLE    NOT NULL,  -- the value at the crossing
    threshold        DOUBLE    NOT NULL
);

-- Change points (calpipe/night/changes.py): a CUSUM e-detector over each stream's labels, in the
-- order they are learnt, restarted after each change point against the map served after it.
-- One row per change point, in the partition of the night that found it.
CREATE TABLE IF NOT EXISTS change_points (
    detected_date         DATE      NOT NULL,  -- the night whose labels crossed the threshold
    stream                VARCHAR   NOT NULL,
    change_number         INTEGER   NOT NULL,  -- 1, 2, 3 ... the stream's change points so far
    detected_time         TIMESTAMP NOT NULL,  -- when the crossing label was learnt
    detected_event_id     BIGINT    NOT NULL,  -- the event whose label crossed
    estimated_change_time TIMESTAMP NOT NULL,  -- the event time of the run's first label
    estimated_change_date DATE      NOT NULL,
    log10_statistic       DOUBLE    NOT NULL,  -- log10 of the CUSUM statistic at the crossing
    threshold             DOUBLE    NOT NULL,  -- log10 A: mean run length to a false one >= A
    labels_in_run         BIGINT    NOT NULL,  -- labels from the run's start to the crossing
    reference_date        DATE                 -- the night whose map was the reference (NULL: the base)
);
-- The detector's state is carried in calibrator_state (migration 014).

-- Serving map at the end of `date` (docs/ARCHITECTURE.md §4), exactly, as a weighted sum of terms:
--   p' = sum_term weight * f_term(clip(q_term(clip(p)))),  q = p unless the term has an input
--   map (in_* below), f = p for 'identity' (the passive weight P),
--   'quadratic' p + a p (1 - p), 'cubic' p + a p (p - b)(p - 1),
--   'cox' e^a p^b / (e^a p^b + (1 - p)^b);
-- weight = P for the identity term, sum_J of the jump-mixed active weights A^J_theta otherwise.
CREATE TABLE IF NOT EXISTS calibration_map (
    date               DATE    NOT NULL,
    stream             VARCHAR NOT NULL,
    term               INTEGER NOT NULL,  -- 0 = passive (the base forecast), t + 1 = function t; a table's piece
    family             VARCHAR NOT NULL,  -- identity | quadratic | cubic | cox | temperature | step | linear | bins | ovr | ovr_base | ovo | kcat | kedge | ksplit | kleaf
    a                  DOUBLE  NOT NULL,  -- eps (quadratic), a (cubic), alpha (cox)
    b                  DOUBLE  NOT NULL,  -- 0 (quadratic), b (cubic), beta (cox)
    weight             DOUBLE  NOT NULL,
    clip               DOUBLE  NOT NULL,  -- p is clipped to [clip, 1 - clip] first
    method             VARCHAR NOT NULL,
    config_fingerprint VARCHAR NOT NULL,
    -- the term's input (composite-experts): q = sigmoid(in_w1 ln c(p) - in_w2 ln(1 - c(p)) + in_w0),
    -- c = clip to [in_eps, 1 - in_eps], then clipped to [clip, 1 - clip]; NULL: the clipped p
    in_w1              DOUBLE,
    in_w2              DOUBLE,
    in_w0              DOUBLE,
    in_eps             DOUBLE,
    -- 0, or 1 for the top of a stack (applied to layer 0's output)
    layer              INTEGER DEFAULT 0,
    -- family step / linear: one piece of a table (term = its index; the first at x = -inf):
    -- p' = y_at at p = x, else on x < p (< the next x): y_right (step), or the line from
    -- (x, y_at) to (x_next, y_next) (linear; y_right where x_next is NULL)
    -- K classes, family ovr / ovr_base / ovo: a piece of the step table of the binary
    -- sub-problem (a, b) (its score p[b], or the pair score p[b] / (p[a] + p[b]) for a >= 0;
    -- 0-based classes), the sub-problems coupled one-vs-rest (renormalised; ovr_base: a row
    -- of zeros keeps p) or one-vs-one (pairwise coupling)
    x                  DOUBLE,
    y_at               DOUBLE,
    y_right            DOUBLE,
    x_next             DOUBLE,
    y_next             DOUBLE
);
-- Migrations: 004 (the input columns of an older database), 009 (layer, x, y_at, y_right,
-- x_next, y_next of an older database), 010 (alphas, in_ka, in_kb), 011 (y_k), 012 (kids),
-- 013 (in_layer).

-- Key-value facts about this database (SQL layer version, the chain's configuration).
CREATE TABLE IF NOT EXISTS calpipe_meta (
    key   VARCHAR NOT NULL,
    value VARCHAR NOT NULL
);
