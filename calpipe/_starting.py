"""Ctrl-C while the ``calpipe`` command is still starting: one line and exit 130.

Before a command runs, ``calpipe`` imports polars, numba, DuckDB and its kernels (a few
seconds). A Ctrl-C then printed a KeyboardInterrupt traceback from deep inside an import, and
once, landing inside numba's dispatcher, ``SystemError: CPUDispatcher(...) returned a result
with an exception set`` (exit 1). ``calpipe/__init__.py`` imports this module first; in the
``calpipe`` command's own process only (the console script, ``python -m calpipe`` or
``python -m calpipe.cli``; never when a program or a notebook imports calpipe, and not when
SIGINT is ignored, as in a background job) it makes SIGINT print :data:`MESSAGE` and end the
process with exit code 130 at once: nothing was opened yet, so nothing can be half-written. :func:`calpipe.cli.main`
hands Ctrl-C back to Python (:func:`hand_back`) once everything is imported; each command
then says what its interruption left.
"""

from __future__ import annotations

import os
import signal
import sys

#: What the command says when Ctrl-C lands while it starts.
MESSAGE = "calpipe: interrupted while starting (Ctrl-C): nothing was read or written"


def is_the_command(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> bool:
    """Whether this process is the ``calpipe`` command: ``python -m calpipe.cli ...``,
    ``python -m calpipe ...`` or the ``calpipe`` console script."""
    orig = list(sys.orig_argv if orig_argv is None else orig_argv)
    argv = list(sys.argv if argv is None else argv)
    if "-m" in orig[:-1]:
        return orig[orig.index("-m") + 1] in ("calpipe", "calpipe.cli")
    return bool(argv) and os.path.basename(argv[0]) in ("calpipe", "calpipe.exe")


def _interrupted(signum, frame) -> None:
    try:
        os.write(2, (MESSAGE + "\n").encode())
    finally:
        os._exit(130)  # no exception to unwind through half-imported modules or numba


def install() -> bool:
    """Install the starting handler if this is the command and SIGINT has Python's default
    handler (left alone when ignored); True if installed."""
    if not is_the_command() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    try:
        signal.signal(signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread: no handler can be installed, none is
        return False
    return True


def hand_back() -> None:
    """Ctrl-C raises KeyboardInterrupt again (the commands handle it), if :func:`install` had
    taken it."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)


install()
