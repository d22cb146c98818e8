"""Configured calibrators around the kernels (docs/ARCHITECTURE.md §2), and the registry of methods.

Every method implements the protocol of :mod:`calpipe.calibrators.base`; :data:`METHODS` maps the
name users give (``--method NAME``) to its class.
"""

from calpipe.calibrators.base import Calibrator, FlatState, RunOutput, StreamState
from calpipe.calibrators.protected import (
    PROTECTED_METHODS,
    BatchState,
    CompositeJumper,
    Jumper,
    MeanJumper,
    ProtectedCalibrator,
)
from calpipe.calibrators.registry import METHODS, make_calibrator

__all__ = [
    "METHODS",
    "PROTECTED_METHODS",
    "BatchState",
    "Calibrator",
    "CompositeJumper",
    "FlatState",
    "Jumper",
    "MeanJumper",
    "ProtectedCalibrator",
    "RunOutput",
    "StreamState",
    "make_calibrator",
]
