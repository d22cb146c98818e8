"""How Ctrl-C surfaces in a command, and how a command settles after it.

Each command ends an interruption with one line on standard error and exit code 130 (the
shell's code for SIGINT); :func:`calpipe.cli.main` does it for the commands without their own
message. While the command is still importing, :mod:`calpipe._starting` does it (its
:data:`STARTING_MESSAGE`, :func:`is_the_command` and :func:`hand_back` are here).
"""

from __future__ import annotations

import signal

import duckdb
from polars.exceptions import PanicException

from calpipe._starting import MESSAGE as STARTING_MESSAGE
from calpipe._starting import hand_back, is_the_command

#: How Ctrl-C surfaces: Python's KeyboardInterrupt, DuckDB's own when it lands mid-query
#: (duckdb.InterruptException, or a RuntimeError "Query interrupted" from a catalog query), or
#: a SystemError raised over a KeyboardInterrupt that landed inside a C extension's call
#: (numba's dispatcher: "CPUDispatcher(...) returned a result with an exception set"), or
#: polars' Rust panic over one that landed while its numpy bridge imported numpy ("access NumPy
#: array API capsule: PyErr { type: <class 'KeyboardInterrupt'> ... }": exit 1 in a CI run).
INTERRUPTS = (KeyboardInterrupt, duckdb.InterruptException, RuntimeError, SystemError,
              PanicException)  # fmt: skip


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` (one of :data:`INTERRUPTS`) is Ctrl-C. A ``SystemError`` is one when a
    KeyboardInterrupt is anywhere in its chain of causes and contexts: numba, loading a cached
    kernel when Ctrl-C landed, raised over an error that was itself raised over the
    KeyboardInterrupt (only the first link was looked at: exit 1 and a traceback). A Rust
    panic of polars is one when its message names the KeyboardInterrupt it was raised over."""
    if isinstance(exc, SystemError):
        return any(isinstance(e, KeyboardInterrupt) for e in _chain(exc))
    if isinstance(exc, PanicException):  # the KeyboardInterrupt is only named in its message
        return "KeyboardInterrupt" in str(exc)
    if isinstance(exc, RuntimeError) and not isinstance(exc, duckdb.InterruptException):
        return "interrupted" in str(exc).lower()
    return isinstance(exc, INTERRUPTS)


def _chain(exc: BaseException):
    """``exc`` and every exception it was raised from or during (each once: a chain can loop)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def settle() -> None:
    """After the first Ctrl-C, ignore SIGINT while the command looks up what is committed, says
    it and exits 130: a second Ctrl-C then cannot turn the one-line message into a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


__all__ = [
    "INTERRUPTS",
    "STARTING_MESSAGE",
    "hand_back",
    "is_interrupt",
    "is_the_command",
    "settle",
]
