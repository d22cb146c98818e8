"""The command line every size-driven benchmark shares: ``--size`` and ``--out``, and printing
the markdown table it measured (and writing it to ``--out``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def size_parser(sizes: dict) -> argparse.ArgumentParser:
    """A parser with ``--size`` (one of ``sizes``, default ``smoke``) and ``--out FILE``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=list(sizes), default="smoke")
    ap.add_argument("--out", help="also write the table to this file")
    return ap


def emit(table: str, out: str | None) -> int:
    """Print the table, write it to ``out`` if given; the exit code 0."""
    print(table)
    if out:
        Path(out).write_text(table + "\n")
    return 0
