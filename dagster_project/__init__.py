"""Dagster code location of calpipe: orchestration only (docs/ARCHITECTURE.md §2).

Each asset is a thin wrapper around one function of :mod:`calpipe.pipeline`; all maths and I/O
live in calpipe, which never imports dagster.
"""
