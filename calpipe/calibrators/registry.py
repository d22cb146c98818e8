"""The registry of methods: name -> calibrator class, and the one constructor that validates."""

from __future__ import annotations

from calpipe.calibrators.base import Calibrator
from calpipe.calibrators.batch import BATCH_METHODS
from calpipe.calibrators.decay import DECAY_METHODS
from calpipe.calibrators.experts import EXPERT_METHODS
from calpipe.calibrators.online import ONLINE_METHODS
from calpipe.calibrators.online_scaling import ONLINE_SCALING_METHODS
from calpipe.calibrators.protected import PROTECTED_METHODS
from calpipe.calibrators.stacked import Stacked
from calpipe.errors import ParameterError

METHODS: dict[str, type[Calibrator]] = {
    **PROTECTED_METHODS,
    **{
        cls.name: cls
        for cls in (
            *EXPERT_METHODS,
            *BATCH_METHODS,
            *ONLINE_METHODS,
            *ONLINE_SCALING_METHODS,
            *DECAY_METHODS,
        )
    },
}


def make_calibrator(
    method: str, *, base_method: str | None = None, base_params: dict | None = None, **params
) -> Calibrator:
    """The calibrator called ``method`` with ``params`` validated against its table.

    With ``base_method``, the result is a :class:`~calpipe.calibrators.stacked.Stacked`
    calibrator: ``method`` applied to the forecasts of ``base_method`` (with ``base_params``).

    >>> make_calibrator("composite-jumper", base_method="platt").name
    'composite-jumper+platt'
    """
    top = _make(method, params)
    if base_method is None:
        if base_params:
            raise ParameterError("base_params given without base_method")
        return top
    return Stacked(_make(base_method, dict(base_params or {})), top)


def _make(method: str, params: dict) -> Calibrator:
    try:
        cls = METHODS[method]
    except KeyError:
        raise ParameterError(
            f"unknown method {method!r}; expected one of {', '.join(METHODS)}"
        ) from None
    return cls(**params)
