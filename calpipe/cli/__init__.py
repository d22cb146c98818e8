"""The ``calpipe`` command (console script ``calpipe = calpipe.cli:main``).

One module per group of sub-commands, each with a ``register(sub)`` that adds its commands:
:mod:`.protect` (``protect``, ``methods``), :mod:`.pipeline` (``demo``, ``run``, ``ui``,
``sql``) and :mod:`.spark` (``spark-run``); :mod:`.options` holds the method options they share. This module only assembles the
parser and runs a command; nothing here is imported back by the command modules.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import suppress

from calpipe.cli import pipeline, protect, spark
from calpipe.cli.interrupts import INTERRUPTS, hand_back, is_interrupt, is_the_command, settle
from calpipe.cli.options import Parser, add_method_options, method_params, parse_value
from calpipe.cli.protect import stream_summary
from calpipe.errors import CalpipeError


def build_parser() -> argparse.ArgumentParser:
    """The ``calpipe`` argument parser with every sub-command."""
    parser = Parser(
        prog="calpipe",
        description="Protected probabilistic classification as a batch data pipeline.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    protect.register(sub)
    pipeline.register(sub)
    spark.register(sub)
    return parser


class _PipeSafe:
    """stdout that goes quiet when its reader goes away (``calpipe run | head``): a
    BrokenPipeError in a progress line used to abort the run after its commit, before the data
    checks. Output after that point is discarded; the command runs to its end."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        with suppress(OSError):  # the interpreter's final flush must not fail either
            os.dup2(devnull, self._stream.fileno())
        self._stream = open(os.devnull, "w")  # lives as long as the process

    def __getattr__(self, name):
        return getattr(self._stream, name)


def interrupted(args: argparse.Namespace) -> str:
    """The line for Ctrl-C in a command without its own (``run``, ``demo`` and ``ui`` say what
    is committed or stopped): what it did not write."""
    if args.command == "protect":
        done = f"{args.output} was not written"
    elif args.command == "report":
        done = "the report was not written"
    elif args.command == "sql" and getattr(args, "write", False):
        done = "the statement in progress was rolled back"
    elif args.command == "spark-run":  # Parquet has no transaction across tables (docs/spark.md)
        return (f"calpipe spark-run: interrupted (Ctrl-C): the nights written before it stay "
                f"under {args.out}; re-run the night in progress, whose tables may be partly "
                "replaced")  # fmt: skip
    else:
        done = "nothing was written"
    return f"calpipe {args.command}: interrupted (Ctrl-C): {done}"


def main(argv: list[str] | None = None) -> int:
    """Run ``calpipe ARGV``; a calpipe error or a missing file is a message and exit code 2,
    Ctrl-C one line and exit code 130."""
    code = _main(argv)
    if code == 130 and is_the_command():
        # The calpipe command's process ends here: after main returned 130, CPython's exit
        # sometimes ended the process by SIGINT instead (a death by signal, not 130: about one
        # Ctrl-C of `protect` in two, one of `demo` in six; why was not pinned down, CPython
        # does so when it believes a KeyboardInterrupt went unhandled). Everything is closed
        # and said: exit 130 now, without the interpreter's exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


def _main(argv: list[str] | None) -> int:
    hand_back()  # imported: Ctrl-C is a KeyboardInterrupt the commands handle
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        settle()
        print("calpipe: interrupted (Ctrl-C): nothing was written", file=sys.stderr)
        return 130
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for hints that repeat the command
    stdout = sys.stdout
    sys.stdout = _PipeSafe(stdout)  # for this command only
    try:
        return int(args.func(args) or 0)
    except CalpipeError as exc:
        print(f"calpipe: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"calpipe: error: {exc}", file=sys.stderr)
        return 2
    except INTERRUPTS as exc:
        if not is_interrupt(exc):
            raise
        settle()
        print(interrupted(args), file=sys.stderr)
        return 130
    finally:
        sys.stdout = stdout


__all__ = [
    "add_method_options",
    "build_parser",
    "main",
    "method_params",
    "parse_value",
    "stream_summary",
]
