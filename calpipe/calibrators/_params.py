"""Parameter constraint tables (one per calibrator) and the one function that checks them.

Like scikit-learn's ``_parameter_constraints``: each calibrator declares its parameters once, with
default, rule and help, so every error message and the ``calpipe methods`` listing come from the
same table and are right.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from calpipe.errors import ParameterError


@dataclass(frozen=True)
class Param:
    """One parameter: its default, a predicate on a (normalised) value, the rule in words."""

    default: Any
    check: Callable[[Any], bool]
    rule: str
    help: str
    normalise: Callable[[Any], Any] = lambda v: v


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def number_in(lo: float, hi: float, lo_open: bool = True, hi_open: bool = True) -> Callable:
    def check(v) -> bool:
        if not _is_number(v):
            return False
        ok_lo = v > lo if lo_open else v >= lo
        ok_hi = v < hi if hi_open else v <= hi
        return ok_lo and ok_hi

    return check


def int_at_least(lo: int) -> Callable:
    """An integer (Python or numpy, not bool) >= ``lo``."""

    def check(v) -> bool:
        return isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= lo

    return check


def as_float_tuple(v) -> Any:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (float(v),)
    try:
        return tuple(float(x) if _is_number(x) else x for x in v)
    except TypeError:
        return v


def tuple_of(check_one: Callable, nonempty: bool = True) -> Callable:
    def check(v) -> bool:
        return (
            isinstance(v, tuple) and (len(v) > 0 or not nonempty) and all(check_one(x) for x in v)
        )

    return check


def one_of(*choices) -> Callable:
    return lambda v: v in choices


def validate(method: str, table: Mapping[str, Param], given: Mapping[str, Any]) -> dict:
    """Return the full parameter dict (defaults filled in), or raise ParameterError."""
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise ParameterError(
            f"method {method!r}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(sorted(table))}"
        )
    out = {}
    for name, spec in table.items():
        raw = given.get(name, spec.default)
        value = spec.normalise(raw)
        if not spec.check(value):
            raise ParameterError(f"method {method!r}: {name}={raw!r} is invalid: {spec.rule}")
        out[name] = value
    return out
