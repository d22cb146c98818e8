"""Reproducible performance measurements of calpipe (``python -m benchmarks.run``)."""
