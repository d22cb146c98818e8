"""Configured calibrators around the kernels (DESIGN §2)."""

from calpipe.calibrators.protected import (
    METHODS,
    BatchState,
    CompositeJumper,
    Jumper,
    MeanJumper,
    ProtectedCalibrator,
    RunOutput,
    StreamState,
    make_calibrator,
)

__all__ = [
    "METHODS",
    "BatchState",
    "CompositeJumper",
    "Jumper",
    "MeanJumper",
    "ProtectedCalibrator",
    "RunOutput",
    "StreamState",
    "make_calibrator",
]
