"""Numerical constants and defaults, each with the one-line reason it has this value.

Everything that is a tolerance, a clip or a default grid lives here, so that a reader can see
in one place what calpipe assumes about numbers. Sections follow the layers (docs/ARCHITECTURE.md
§2): the data contract, the methods (kernels and calibrators), then the store, pipeline and
monitoring.
"""

from __future__ import annotations

# --- The data contract ---
#: Default clip of the base probability in log-loss mode, p -> min(max(p, eps), 1 - eps).
#: A base forecast of exactly 0 for the label that occurs zeroes every Cox calibrator's capital
#: (f(0) = 0 for all of them), so the martingale could never recover; 1e-3 bounds the log loss of
#: one such event at ln(1000) = 6.9 nats and is the clip of the reference run on ``score_rf1000``
#: (mean ln loss 0.5169 -> 0.2793, docs/REFERENCE_DATA.md).
DEFAULT_CLIP_EPS: float = 1e-3

#: Multiclass score vectors must sum to 1 within this absolute tolerance. Float32 softmax outputs
#: routinely miss 1 by ~1e-7; anything further off is a different vector, not a rounding error.
SCORES_SUM_TOL: float = 1e-6
#: How far a carried mixture state's weights (passive + active) may sum from 1. The kernels
#: renormalise them after every step (rounding: ~1e-15 a step, and each step renormalises
#: again), so a state off by more was not written by them: 1e308 overflows the next sum to inf
#: and 1e-320 (subnormal) divides into inf/NaN (issue 36 item 8).
STATE_WEIGHTS_SUM_TOL: float = 1e-6

#: Empty state frames remembered by key and order column types (calpipe.engine.state.empty_state):
#: a process sees a handful of schemas; the bound keeps odd callers from growing it.
EMPTY_STATE_CACHE_SIZE: int = 64


# --- Big calls in pieces (engine/pieces.py) and their progress (calpipe protect's bar) ---
#: Events from which a call runs its operation list in pieces with the kernel state carried
#: (the same bits): each piece gathers its rows contiguously, so the kernels read them in
#: order instead of jumping through the whole call's arrays. Measured side by side on 2M
#: events: the default method's kernel 1.5-1.6x faster with 1,000 or 10,000 streams,
#: composite-jumper within noise; no gain (and no loss) measured at 0.5-1M events. From 1M, so
#: that the nightly run's batches (1.4-1.6M events, PROTECT_BATCH_ROWS) run in pieces: at
#: 1.5M its 10M-event night with the default took 11.7 s instead of 11.0 (BENCHMARKS.md §29).
PIECES_MIN_EVENTS: int = 1_000_000
#: Events from which ``calpipe protect`` on a terminal draws a bar over them (its pieces tell
#: progress): the default method protects 0.3-0.9 M events/s on this 2-core machine
#: (BENCHMARKS §9), so 2M events are seconds of waiting; a smaller call keeps its status line.
PROGRESS_MIN_EVENTS: int = 2_000_000
#: Operations per piece: ~0.3-0.8 s of the default method's kernel, a bar that moves several
#: times a second for composite-jumper, and 40 pieces on 10M events (each piece's own cost,
#: a few gathers and one kernel call's setup, is repaid by the kernels' contiguous reads:
#: BENCHMARKS §23).
PIECE_OPS: int = 250_000
#: Fewest operations per stream and piece (on average) for cutting every stream at the same
#: fractions: each piece returns every stream's state anew (the default's ~760 floats, about
#: one event's work), so 64 operations keep that copy near 1 % of the piece; streams shorter
#: than that run whole, in groups of streams (engine/pieces.py).
PIECE_MIN_STREAM_OPS: int = 64

#: Rows per chunk where per-row terms are formed by numpy and summed per stream or group (the
#: inputs' test martingales, calibrators/gale.likelihood_gale_ends; the night's estimates,
#: estimates.grouped_estimates): a few terms x this x 8 bytes stay in cache, where a night's
#: whole-length temporaries were gigabytes of first-touch page faults (BENCHMARKS.md §28).
CHUNK_ROWS: int = 1 << 15


# --- Protected predictors and their families (calibrators/protected.py, families.py, kernels/mixture.py) ---
#: Default passive weight pi of the Composite Jumper (paper 001 Alg. 1; docs/ARCHITECTURE.md §4). The
#: protected log loss is at most ln(1/pi) = ln 2 above the base's: cheap insurance.
DEFAULT_PI: float = 0.5

#: Default jumping rates J of the Composite Jumper (paper 001 §4; the package's defaults).
DEFAULT_JUMPING_RATES: tuple[float, ...] = (1e-2, 1e-3, 1e-4)

#: Default jumping rate of the single-rate Jumper (paper 000 §5: "the value J = 0.01 is the one
#: that has been used most commonly").
DEFAULT_JUMPER_RATE: float = 1e-2

#: Default jumping rates of the Mean Jumper: must include J = 1 (paper 000 §5, [16, §3]), which
#: makes the mixture cheap insurance when the base forecasts are already ideal.
DEFAULT_MEAN_JUMPER_RATES: tuple[float, ...] = (1.0, 1e-1, 1e-2, 1e-3)

#: Cox exponents beta (paper 001 §3: "mainly interested in beta in {1, 0.5, 2}"); 1 first, so that
#: the identity is the first calibrating function of every Cox grid.
DEFAULT_COX_BETAS: tuple[float, ...] = (1.0, 0.5, 2.0)

#: Cox shifts alpha on one class (paper 001 §3: alpha(y) in {0, 1, -1}); 0 first for the identity.
DEFAULT_COX_ALPHAS: tuple[float, ...] = (0.0, 1.0, -1.0)

#: Quadratic family f_eps(p) = p + eps p (1 - p) (paper 000 eq. 1 and §2: E = {-1, -0.5, 0, 0.5, 1}),
#: listed identity first.
DEFAULT_QUADRATIC_EPS: tuple[float, ...] = (0.0, -1.0, -0.5, 0.5, 1.0)

#: Cubic family f_{a,b}(p) = p + a p (p - b)(p - 1) (paper 000 eq. 3), (a, b) in [0, 1]^2: no
#: correction, then mild and full corrections of overconfidence around three neutral points.
DEFAULT_CUBIC_AB: tuple[tuple[float, float], ...] = (
    (0.0, 0.5),
    (0.5, 0.25),
    (0.5, 0.5),
    (0.5, 0.75),
    (1.0, 0.25),
    (1.0, 0.5),
    (1.0, 0.75),
)

#: Two calibrating functions are "the same" (and the duplicate is dropped from a grid) when they
#: agree to this tolerance on a fine grid of probabilities; exact duplicates differ by ~1e-16.
FAMILY_DEDUP_TOL: float = 1e-12

#: Families whose identity slot is remembered (:attr:`calpipe.families.Family.identity_index`):
#: a run uses one or two; the bound only keeps a loop over many custom grids from growing it.
FAMILY_CACHE_SIZE: int = 64


# --- The alarm (every method's test martingale) ---
#: Threshold of the alarm: log10 S >= 2 means S >= 100, which by Ville's inequality has
#: probability <= 1 % under calibrated base forecasts (docs/ARCHITECTURE.md §1).
ALARM_LOG10_THRESHOLD: float = 2.0

# --- Change points (kernels/change_points.py, night/changes.py) ---
#: Threshold of the change-point detector (a CUSUM e-detector, Shin, Ramdas & Rinaldo 2023):
#: log10 A = 4. Under its null the mean number of labelled events to a false change point is
#: >= A = 10,000 (a bound: measured far longer on calibrated streams, tests/night/
#: test_changes.py); the one-shot alarm's 100 has no run-length bound once it restarts.
CHANGE_LOG10_THRESHOLD: float = 4.0

#: Labels a stream learns after a change point before its protected map is frozen as the next
#: reference (not counted by the detector): a map frozen at once, from the few labels since the
#: change, is an early estimate the still-learning forecaster soon beats (a "change" that is
#: only its learning); 1,000 labels put a frozen probability's error near 1/sqrt(1000) = 3 %.
#: The price: a change within them is found only after them.
CHANGE_SETTLE_LABELS: int = 1_000

#: Knots of the reference map frozen at a change point: the protected map's values at this many
#: raw scores, equally spaced in logit over [CHANGE_REFERENCE_EPS, 1 - CHANGE_REFERENCE_EPS]
#: (0.14 logit apart: the maps are smooth in logit, so linear interpolation between knots
#: moves a probability by far less than its estimation error).
CHANGE_REFERENCE_KNOTS: int = 97

#: The reference map's range and floor: scores are clipped to it before the map (as the log-loss
#: engine clips the base: DEFAULT_CLIP_EPS), and its values too, so a factor is always finite.
CHANGE_REFERENCE_EPS: float = 1e-3


# --- Venn predictors (kernels/venn.py) ---
#: Default number of equal-mass score bins of the Venn taxonomy (paper 002 §4: groups "as large as
#: possible" yet homogeneous; 10 bins of a few hundred events give intervals of width < 1 %).
VENN_DEFAULT_N_BINS: int = 10


# --- Venn-ABERS (kernels/venn_abers.py) ---
#: Default number of folds of the cross Venn-ABERS predictor (CVAP): 5, the documented default
#: n_splits of the reference package venn-abers 1.5.4 (so results compare with it as shipped).
VENN_ABERS_N_FOLDS: int = 5

#: Default merge of the Venn-ABERS multiprobabilities [p0, p1] into one p: "log" is the log-loss
#: optimal p1 / (1 - p0 + p1) of Vovk, Petej & Fedorova (2015, Section 4), the package's default.
VENN_ABERS_MERGE: str = "log"

#: Default multiclass reduction: "ovo" (pairwise coupling, Manokhin 2017) is what the package's
#: estimator path (VennAbersMultiClass) always does and its manual path's default.
VENN_ABERS_MULTICLASS: str = "ovo"


# --- Calibrated regression (kernels/calibrated_regression.py) ---
#: Bisection stops when the bracket of the fixed point y = clip(theta . f(y)) (paper 004 Alg. 2,
#: step 2) is this narrow: 1e-12 is far below any meaningful probability difference, yet 40 halvings.
CALREG_BISECTION_TOL: float = 1e-12

#: Hard cap on bisection halvings (2^-60 < 1e-18 < any tolerance above, so it never binds first).
CALREG_BISECTION_MAX_ITER: int = 60

#: Default highest power of the forecast among the test functions y, y^2, ..., y^m (paper 004 §I:
#: "low order polynomials"); 1 = only f_0(y) = y, the linear case solved in closed form (§IV).
CALREG_DEFAULT_POWERS: int = 1

#: Calibrated regression with nonlinear test functions: theta . f(y) - y is scanned on this many
#: equal cells of [0, 1] and the first sign change is bisected, so the chosen fixed point (paper
#: 004 allows "any") is the smallest interior one, deterministically; 64 cells separate the roots
#: of low powers and tents with a few knots at the cost of 65 cheap evaluations per forecast.
CALREG_ROOT_GRID: int = 64


# --- Platt and beta calibration: the ridge-regularised Newton fit (kernels/parametric.py) ---
#: Platt scaling clips p to [eps, 1 - eps] before z = logit(p): only to keep z finite at exactly
#: 0 or 1 (|z| <= 27.6); it moves no score a float32 model emits, and on the bank data's
#: score_rf100 (half exact zeros) it fits better than clipping at 1e-3 or 1e-6.
PLATT_CLIP_EPS: float = 1e-12

#: Beta calibration clips p to [eps, 1 - eps] with float64 machine epsilon, the clip of the
#: betacal package (Kull et al. 2017's reference code), so that both fit the same features.
BETA_CLIP_EPS: float = 2.220446049250313e-16

#: The Platt and beta Newton fits add lambda / 2 * ||theta||^2 (centred intercept included) to the *mean* log loss. This keeps the
#: Hessian invertible and theta finite on separable, single-class or tied data (forecasts then
#: within ~1e-10 of 0/1 where the MLE is infinite), makes the fit invariant to duplicating the
#: data, and moves ordinary fits by ~lambda / (mean curvature) ~ 1e-8 relative (betacal's
#: C = 1e11 is a weaker penalty, which does not keep single-class fits finite).
LOGREG_RIDGE_MEAN: float = 1e-10

#: Newton stops when the full step is below this times (1 + max |theta|): quadratic convergence
#: reaches it from ~1e-6 in one more step, and it sits above float64 rounding of the gradient.
LOGREG_NEWTON_TOL: float = 1e-12

#: Newton also stops when half the Newton decrement (the predicted decrease of the objective) is
#: below this times (1 + |F|): near float64 rounding of F; needed on degenerate sets where a
#: direction of curvature ~LOGREG_RIDGE_MEAN leaves the step at gradient-rounding / ridge forever.
LOGREG_DECREMENT_TOL: float = 1e-14

#: Newton iteration cap: ordinary data converge in < 10; separable data (theta growing like
#: log(n / lambda) / margin) in < 60.
LOGREG_MAX_ITER: int = 200

#: Step halvings before a Newton step is declared numerically unimprovable (2^-60 ~ 1e-18).
LOGREG_MAX_HALVINGS: int = 60

#: If Cholesky of the (ridge-regularised) Newton Hessian fails by rounding on nearly collinear
#: features, the diagonal is shifted by this times its largest entry, doubling until it succeeds.
LOGREG_CHOLESKY_SHIFT: float = 1e-14


# --- Temperature scaling (kernels/parametric.py) ---
#: Temperature scaling clips each class probability at eps before the log (p_c = 0 would make
#: log p_c = -inf); same reasoning as PLATT_CLIP_EPS.
TEMPERATURE_CLIP_EPS: float = 1e-12

#: Largest inverse temperature 1/T (smallest T = 1e-3): the log-loss minimiser is infinite when
#: the calibration argmax is always right; p^1000 is already an argmax for any practical use.
TEMPERATURE_MAX_INV_T: float = 1e3

#: Smallest inverse temperature 1/T (largest T = 100): at 1/T = 0 every forecast is uniform and
#: argmax ties go to class 0, so temperature scaling would no longer keep the base's argmax (its
#: defining property, Guo et al. 2017). At 1/T = 1e-2 forecasts are nearly flat for
#: anti-informative scores yet classes whose log-probabilities differ by > 1e-13 stay ordered.
TEMPERATURE_MIN_INV_T: float = 1e-2

#: Safeguarded Newton on d/d(1/T) log loss = 0 stops at this relative width of 1/T.
TEMPERATURE_TOL: float = 1e-12

#: Temperature scaling stops when |dL/d(1/T)| <= this times sum_i |terms| (the rounding level of
#: that sum): Newton steps below it are rounding noise and would only jitter inside the bracket.
TEMPERATURE_DERIV_ROUNDING: float = 1e-14

#: Iteration cap of that Newton-bisection (bisection alone needs ~50 for 1e3 -> 1e-12).
TEMPERATURE_MAX_ITER: int = 200


# --- Histogram binning (kernels/histogram.py) ---
#: Default number of equal-mass bins of histogram binning (Zadrozny & Elkan 2001 use 10).
HISTOGRAM_N_BINS: int = 10

#: Default m of the m-estimate (k + m b) / (n + m) of each bin (Zadrozny & Elkan 2001 §3);
#: 0 = the plain mean label of the bin.
HISTOGRAM_PRIOR_STRENGTH: float = 0.0


# --- The default method: Composite Jumper over experts (calibrators/experts.py) ---
#: The method run when none is named (calpipe.protect, ``calpipe protect/run``, the pipeline):
#: the Composite Jumper over the base and online calibrators, which keeps paper 001's insurance
#: (loss <= base + ln 2) and follows drift (docs/ARCHITECTURE.md §5; QUALITY.md).
DEFAULT_METHOD: str = "composite-experts"

#: The nightly pipeline's default (``calpipe run``, dagster, the demo): the same method. Its SQL
#: serving map exists (each calibration_map term carries its input's logistic map) and its state
#: is fixed-size (~760 floats a stream with decay-beta inputs); ``--method composite-jumper``
#: runs paper 001's method, ~2x faster nightly with a 28-float state.
PIPELINE_DEFAULT_METHOD: str = DEFAULT_METHOD

# --- decay-beta (calibrators/decay.py): beta calibration on exponentially forgotten bins ---
#: Bins of the base log-odds over [logit(eps), logit(1 - eps)]: 100 bins of width 0.18 in
#: log-odds, far below the resolution a 1,000-label fit has, at 200 floats of state.
DECAY_BETA_N_BINS: int = 100
#: Scores are clipped to [eps, 1 - eps] for the bins and the map (log-odds +-9.2).
DECAY_BETA_EPS: float = 1e-4
#: Ridge (in labels) pulling (a, b, c) to the identity (1, 1, 0): keeps a fit on one class
#: finite, and is negligible against hundreds of labels.
DECAY_BETA_RIDGE: float = 1e-3
#: Newton iterations and step tolerance of a refit (3 parameters; converges in < 10 from a warm
#: start).
DECAY_BETA_MAX_ITER: int = 50
DECAY_BETA_TOL: float = 1e-12
#: The counts are kept multiplied by a common factor g = lambda^-(labels since the last
#: rescale); they are divided by g once it passes this, long before a double overflows.
DECAY_BETA_RESCALE: float = 1e100
#: decay-venn-abers (calibrators/decay.py): Venn-ABERS on decay-beta's forgotten bins. Memory W
#: of its counts, as decay-beta's longer memory: 2000 was worse on bank-nb and 8000 no better
#: (docs/studies/nonparametric-input.md).
DECAY_VENN_ABERS_MEMORY: int = 4000

#: Calibrators whose forecasts join the base as inputs of the default method (binary), written
#: as ``calpipe --inputs`` takes them. Platt and beta scaling learnt online (Gupta & Ramdas 2023)
#: follow drift of any size without a window but weigh all the past; beta calibration refitted on
#: exponentially forgotten counts (decay-beta, the practitioner's trailing-window refit with a
#: fixed-size state) forgets it: memories of 1000 labels (the batch methods' default window) and
#: 4000 (where a 1000-label fit is too noisy). Venn-ABERS on the same forgotten bins
#: (decay-venn-abers) is the nonparametric input for monotone maps no logistic family holds
#: (extreme naive-Bayes scores: docs/studies/nonparametric-input.md). The forgotten-bin inputs
#: refit every W/4 labels, the windowed batch methods' cadence (window 2000, refit 500), not
#: their method's W/10: the same log loss within 0.0003 on every binary stream and 16 % less of
#: the kernel's time (docs/studies/refit-cadence.md). The mixture tracks the best of them.
EXPERT_INPUTS_BINARY: tuple[str, ...] = (
    "ops",
    "obs",
    "decay-beta:memory=1000:refit_every=250",
    "decay-beta:memory=4000:refit_every=1000",
    "decay-venn-abers:memory=4000:refit_every=1000",
)

#: Streams the default's binary kernel runs at a time in SIMD lanes
#: (calpipe/kernels/expert_lanes.py): its (R, E) = 3 x 105 weights per stream make 64 lanes
#: (the Composite Jumper's, 27 weights) spill past L2; 16 lanes keep 4 independent chains of
#: sums per AVX2 vector and fastest measured (8 / 32 / 64: slower). A compile-time constant of
#: the numba kernel: after changing it, clear the numba cache.
EXPERT_LANES: int = 16
#: The lanes kernel's weights (R rates x E experts) and experts per lane that its scratch holds
#: on the stack (where LLVM vectorises its loops without run-time overlap checks): the default
#: has 3 x 105 and 105; larger mixtures run the same kernel with heap scratch, slower. Stack:
#: EXPERT_LANES x (WEIGHTS + 2 EXPERTS + RATES) x 8 bytes = 145 KiB. Compile-time constants.
EXPERT_LANE_WEIGHTS: int = 640
EXPERT_LANE_EXPERTS: int = 256
#: ... and jumping rates R (the default has 3; the Composite Jumper's papers use a handful).
EXPERT_LANE_RATES: int = 8
#: K classes (calpipe/kernels/expert_lanes_multiclass.py): the Cox terms of every class
#: (K x E) and the classes K its stack scratch holds: the default K = 3 has 3 x 78 = 234 and
#: K = 4 4 x 102 = 408 (64 KiB more stack); larger K run the same kernel with heap scratch.
EXPERT_LANE_CLASS_TERMS: int = 512
EXPERT_LANE_CLASSES: int = 16
#: ... and the parameters d (vector scaling ``ops`` 2K, matrix scaling ``oms`` K^2 + K) up to
#: which its ONS step's scratch for every lane (theta, A and its Cholesky factor: EXPERT_LANES x
#: (4 d + 2 d^2) doubles, 18 KiB at d = 8) is on the stack: ops K <= 4. Not grown for oms (d = 12
#: at K = 3, 20 at K = 4): on the stack it measured no faster than the heap (BENCHMARKS.md §25).
EXPERT_LANE_ONS_DIM: int = 8
#: ... and the inputs' states (theta, A: I (d + d^2) values, 42 for ops at K = 3, 72 at K = 4)
#: each lane keeps on the stack while it runs a stream: EXPERT_LANES x this x 8 bytes. (ops,
#: oms) at K = 3 (198) runs on the heap: 200 on the stack measured no faster (BENCHMARKS.md §25).
EXPERT_LANE_INPUT_STATE: int = 160

#: K classes: online vector scaling (``ops``, the per-class slope and prior shift) and online
#: matrix scaling (``oms``, the full K x K + K map that matrix scaling refitted on a window
#: wins with on feature-ordered streams: issue #34, QUALITY.md).
EXPERT_INPUTS_MULTICLASS: tuple[str, ...] = ("ops", "oms")

#: Log-odds shifts alpha of the default method's Cox grid: paper 001's {0, +-1} doubled out to
#: +-4 (a factor e^4 ~ 55 on the odds), each switch to a wider grid costing only ln(size) nats.
EXPERT_COX_ALPHAS: tuple[float, ...] = (0.0, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0)

#: Slopes beta of that grid: paper 001's {1, 1/2, 2} (identity first).
EXPERT_COX_BETAS: tuple[float, ...] = (1.0, 0.5, 2.0)

#: Probability w that a jump of the default's mixture goes back to its start (each input's
#: identity, uniform over the inputs) instead of to a uniform expert (paper 001 Alg. 1 line 5):
#: the equal mixture of the two jump distributions, so a switch to any expert costs at most ln 2
#: more than under either alone, and a switch to an input's identity ln(2 I / J) instead of
#: ln(I |Theta| / J) nats (docs/quality.md, docs/studies/short-streams.md; 0: paper 001's jumps).
EXPERT_JUMP_RESTART: float = 0.5

#: K classes: shifts +-a e_k of one class's log-probability for a in this set (paper 001's 1,
#: and 2 for the larger changes of class priors).
EXPERT_CLASS_SHIFTS: tuple[float, ...] = (1.0, 2.0)


# --- Online scaling with calibeating (kernels/online_scaling.py; Gupta & Ramdas 2023) ---
#: Online Newton Step scale gamma: the step is A^{-1} g / gamma (Gupta & Ramdas 2023, Alg. 1).
OPS_GAMMA: float = 0.1

#: Radius B of the ball ||theta|| <= B the ONS iterates are projected on (G&R Alg. 1): far from
#: any useful Platt/beta map (|a|, |b| of a few units), so it binds only on degenerate streams.
OPS_RADIUS: float = 100.0

#: A_0 = rho I, the ONS curvature before any label (G&R Alg. 1's rho = 100, as it is read by
#: public implementations). Hazan's A_0 = (gamma B)^-2 I = 0.01 I makes the first steps ~100 units
#: long: on the bank stream its mean log loss is 1.80 against 0.268 with rho = 100.
OPS_RHO: float = 100.0

#: The largest magnitude a stored ONS curvature entry may have (a state check): A grows by
#: g g^T, |g|^2 of a few tens a label, so no stream reaches it, while the 3x3 adjugate's
#: products of three entries stay finite below it (1e300 entries overflowed to NaN forecasts).
OPS_CURVATURE_MAX: float = 1e100

#: OPS clips the base forecast to [0.01, 0.99] before the features (G&R §2 assume f(x) in that
#: range): it bounds the gradients, hence the ONS regret constant (|logit 0.99| = 4.6).
OPS_SCORE_CLIP: float = 0.01

#: Calibeating bins of the expert's forecast: equal-width of [0, 1] (G&R §3 use 10: epsilon = 0.1).
CALIBEATING_N_BINS: int = 10

#: Online matrix scaling (``oms``) learns d = K^2 + K parameters with a d x d ONS matrix: per
#: label O(d^3 / 3) flops and d + d^2 doubles of state per stream, so K is capped where that is
#: still ~5 ms a label and 0.6 MB a stream (K = 16: d = 272); vector scaling (``ops``) has none.
OMS_MAX_CLASSES: int = 16


# --- Isotonic and ROC-regularized isotonic regression (kernels/isotonic.py) ---
#: Sorted scores within this distance of the first score of their run are one tie group (pooled
#: before PAV): scikit-learn's ``_make_unique`` rule (np.finfo(float64).resolution), so that
#: isotonic_fit reproduces ``IsotonicRegression`` exactly, near-ties included.
ISOTONIC_TIE_RESOLUTION: float = 1e-15

#: Default interpolation of binary isotonic regression between thresholds: "linear" is
#: scikit-learn's ``IsotonicRegression`` (the reference users compare with); "step" is paper 003's map.
DEFAULT_ISOTONIC_INTERPOLATION: str = "linear"

#: Default cap on the number of regions of ROC-regularized isotonic regression: None = no cap
#: (paper 003 Algorithm 2 runs until no admissible split is left; binary: = isotonic regression).
DEFAULT_RRIR_MAX_REGIONS: int | None = None

#: Default minimum calibration points per region of ROC-regularized isotonic regression: 1 =
#: no constraint beyond non-empty (the unregularised algorithm of paper 003).
DEFAULT_RRIR_MIN_REGION_SIZE: int = 1

#: Thresholds tried per multiclass split (evenly spaced subset of the region's points above it):
#: exact for regions of <= 512 points, and a split costs O(512 n_R K) instead of O(n_R^2 K).
DEFAULT_RRIR_MAX_CANDIDATES: int = 512


# --- The stored data (night/events.py; the nightly run's sizes are its own: pipeline/) ---
#: Longest stream name the pipeline stores (UTF-8 bytes): a stream key is repeated in every
#: row of every table and grouped on by the checks; a 1 MB name committed its day and then ran
#: the post-commit checks out of DuckDB memory.
MAX_STREAM_NAME_BYTES: int = 1024


# --- Monitoring and plots (metrics.py, night/monitoring.py, plots.py) ---
#: Equal-width bins on [0, 1] of the ECE, the reliability tables and the reliability diagrams:
#: the usual 10 (Naeini et al. 2015; the monitoring tables' documented ECE), coarse enough that a
#: day of a small stream still has several labelled events per occupied bin.
ECE_BINS: int = 10

#: Performance estimated from the forecasts alone (estimates.py, #35): the two-sided level of
#: a night's interval for its expected log loss, Brier score and accuracy (the issue's 90 %).
ESTIMATE_LEVEL: float = 0.90

#: Fewest events of a group (a stream's night) given an interval: the normal approximation of
#: a mean of 20 bounded terms covered 0.87-0.93 in simulation (uniform, U-shaped and
#: three-point forecasts, 2,000 nights each); fewer events get the expected values only.
ESTIMATE_MIN_EVENTS: int = 20

#: Smooth ECE (metrics.smooth_ece, Błasiok & Nakkiran 2024): grid points per kernel bandwidth
#: sigma. Linear deposit and the trapezoid rule err by O((h / sigma)^2): 8 points keep the value
#: within 1e-3 relative of the exact integral (tested), far below its sampling noise, at a cost
#: ~ points^2 / sigma per evaluation (16 points: 4x the time for ~4x less error).
SMOOTH_ECE_POINTS_PER_SIGMA: float = 8.0

#: Smallest bandwidth searched for the smooth ECE's fixed point sigma* = smECE_sigma*: relplot's
#: floor (eps = 0.001); a forecast this well calibrated reports a value in [0, 1e-3].
SMOOTH_ECE_MIN_SIGMA: float = 1e-3

#: The fixed point's bracket in log sigma is closed to this width (sigma* to ~1e-5 relative,
#: finer than the grid's error).
SMOOTH_ECE_RTOL: float = 1e-5

#: Resamples of the smooth ECE's block bootstrap (metrics.smooth_ece_interval): the 2.5 % and
#: 97.5 % quantiles of a percentile interval rest on ~25 resamples each at 1,000 (Efron &
#: Tibshirani 1993 ask ~1,000 for percentile intervals, 200 being enough only for a standard
#: error); their Monte Carlo error is then a few per cent of the interval's width.
#: The cost is 1,000 smooth ECEs of the stream (~3 s at 36,000 events).
SMOOTH_ECE_BOOTSTRAP_RESAMPLES: int = 1000

#: Two-sided level of the smooth ECE's bootstrap interval (issue #34: a 95 % interval).
SMOOTH_ECE_BOOTSTRAP_LEVEL: float = 0.95

#: Seed of the smooth ECE's bootstrap: the same forecasts, outcomes and seed give the same
#: interval to the bit (a report regenerated from unchanged forecasts does not move).
SMOOTH_ECE_BOOTSTRAP_SEED: int = 0

#: Reliability diagrams in the materialization metadata pool the last 30 days: one day of a
#: small stream has too few events per bin to show anything.
RELIABILITY_WINDOW_DAYS: int = 30

#: At most this many streams get a panel of the reliability diagram (the busiest ones): beyond a
#: dozen panels a PNG in the UI is unreadable.
MAX_RELIABILITY_PANELS: int = 12

#: Panels per row of the reliability diagram: four 3.2-inch panels fit a laptop-wide UI column.
RELIABILITY_PANELS_PER_ROW: int = 4

#: Panels of the trajectory figure (one per stream, each its own y range): the streams with
#: the highest log10 S are shown (the alarmed ones first), the rest counted in the title.
MAX_TRAJECTORY_PANELS: int = 12

#: Panels per row of the trajectory figure: three 3.6-inch panels fit a laptop-wide UI column.
TRAJECTORY_PANELS_PER_ROW: int = 3

#: The reliability panels' axes reach this far beyond [0, 1], so that a bin's marker at a mean
#: forecast or frequency of exactly 0 or 1 is drawn whole, not cut by the frame.
RELIABILITY_MARGIN: float = 0.03

#: Figure resolution: sharp in the dagster UI, small enough (~50-150 kB) to embed in metadata.
PLOT_DPI: int = 100

#: The trajectory plot's legend: at most this many entries (50 streams made it taller than the
#: plot; the rest are counted in the last entry), in columns of this many rows, beside the axes.
MAX_LEGEND_ENTRIES: int = 24
LEGEND_ROWS: int = 12
