"""The engine: scored events through a calibrator, per stream in replay order, with carried state.

Layer 3 of docs/ARCHITECTURE.md §2, over the calibrators: the data contract of an input frame
(:mod:`~calpipe.engine.contract`), the fast orderings of big frames
(:mod:`~calpipe.engine.ordering`), the state frame and the kernels' state arrays
(:mod:`~calpipe.engine.state`), the operation list with delayed labels
(:mod:`~calpipe.engine.operations`), the label feed's step (:mod:`~calpipe.engine.arrivals`),
and the one driver (:mod:`~calpipe.engine.driver`): :func:`protect`,
:func:`protect_with_state` and :func:`protect_by_day`.
"""

from calpipe.engine.arrivals import arrive_labels
from calpipe.engine.driver import (
    DaysResult,
    ProtectResult,
    protect,
    protect_by_day,
    protect_with_state,
)
from calpipe.engine.state import STATE_FIXED_COLUMNS, empty_state, state_from_rows

__all__ = [
    "STATE_FIXED_COLUMNS",
    "DaysResult",
    "ProtectResult",
    "arrive_labels",
    "empty_state",
    "protect",
    "protect_by_day",
    "protect_with_state",
    "state_from_rows",
]
