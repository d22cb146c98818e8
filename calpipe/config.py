"""Numerical constants and defaults, each with the one-line reason it has this value.

Everything that is a tolerance, a clip or a default grid lives here, so that a reader can see
in one place what calpipe assumes about numbers.
"""

from __future__ import annotations

#: Default clip of the base probability in log-loss mode, p -> min(max(p, eps), 1 - eps).
#: A base forecast of exactly 0 for the label that occurs zeroes every Cox calibrator's capital
#: (f(0) = 0 for all of them), so the martingale could never recover; 1e-3 bounds the log loss of
#: one such event at ln(1000) = 6.9 nats and is the clip of data/PROVENANCE.md's reference run
#: on ``score_rf1000`` (mean ln loss 0.5169 -> 0.2793).
DEFAULT_CLIP_EPS: float = 1e-3

#: Multiclass score vectors must sum to 1 within this absolute tolerance. Float32 softmax outputs
#: routinely miss 1 by ~1e-7; anything further off is a different vector, not a rounding error.
SCORES_SUM_TOL: float = 1e-6

#: Default passive weight pi of the Composite Jumper (paper 001 Alg. 1; DESIGN §4). The
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

#: Threshold of the alarm: log10 S >= 2 means S >= 100, which by Ville's inequality has
#: probability <= 1 % under calibrated base forecasts (DESIGN §1).
ALARM_LOG10_THRESHOLD: float = 2.0
