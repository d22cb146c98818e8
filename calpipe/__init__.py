"""calpipe: protected probabilistic classification as a batch data pipeline.

The public surface: :func:`protect` and :func:`protect_with_state` (polars transforms),
:func:`serving_map` (a state's maps applied to fresh scores), :mod:`calpipe.metrics` (log loss,
Brier, ECE, smooth ECE, CORP as polars expressions), the calibrator objects
(:mod:`calpipe.calibrators`), and :func:`methods` (what can be run).
"""

# first: Ctrl-C while the calpipe command imports is one line and exit 130
from calpipe import _starting  # noqa: F401

# isort: split
from calpipe import numba_cache  # noqa: F401 (first: sets NUMBA_CACHE_DIR before numba loads)

# isort: split
from calpipe import metrics
from calpipe.calibrators import (
    METHODS,
    CompositeJumper,
    Jumper,
    MeanJumper,
    StreamState,
    make_calibrator,
)
from calpipe.engine import ProtectResult, protect, protect_with_state
from calpipe.errors import CalpipeError, InputError, ParameterError, StateError
from calpipe.serving import serving_map

__version__ = "0.1.0"


def methods() -> dict[str, dict]:
    """Every method with its summary and parameters (default, rule, help): the same table that
    validates them."""
    return {
        name: {
            "summary": cls.summary,
            "parameters": {
                p: {"default": spec.default, "rule": spec.rule, "help": spec.help}
                for p, spec in cls.parameters.items()
            },
        }
        for name, cls in METHODS.items()
    }


__all__ = [
    "CalpipeError",
    "CompositeJumper",
    "InputError",
    "Jumper",
    "MeanJumper",
    "ParameterError",
    "ProtectResult",
    "StateError",
    "StreamState",
    "__version__",
    "make_calibrator",
    "methods",
    "metrics",
    "protect",
    "protect_with_state",
    "serving_map",
]
