"""Errors calpipe raises on bad input, bad parameters and mismatched state.

Every message names what is wrong and the rule it breaks; input errors also name the column and
the (0-based) row of the input frame, so a user can find the offending event in one step.
"""

from __future__ import annotations


class CalpipeError(ValueError):
    """Base of calpipe's errors (a ValueError, so generic handlers still catch it)."""


class InputError(CalpipeError):
    """A row of the input breaks the data contract (docs/ARCHITECTURE.md §3)."""

    def __init__(self, column: str | None, row: int | None, rule: str):
        self.column, self.row, self.rule = column, row, rule
        where = []
        if column is not None:
            where.append(f"column {column!r}")
        if row is not None:
            where.append(f"row {row}")
        super().__init__(f"{', '.join(where)}: {rule}" if where else rule)


class ParameterError(CalpipeError):
    """A calibrator parameter is unknown or outside its allowed range."""


class StateError(CalpipeError):
    """A carried calibrator state does not fit the configuration or the events.

    ``stream``: the position of the offending state vector in the batch, when one is to blame;
    :func:`calpipe.engine.state.state_from_rows` replaces it by the stream's key in the message."""

    def __init__(self, message: str, *, stream: int | None = None):
        self.stream = stream
        super().__init__(message)


class StoreError(CalpipeError):
    """The database or an event source cannot be used as asked."""
